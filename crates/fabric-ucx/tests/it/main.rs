mod channels;
mod common;
mod lifecycle;
mod processes;
mod transfers;
