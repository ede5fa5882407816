mod channels;
mod common;
mod fabric_tcp;
mod transfers;
