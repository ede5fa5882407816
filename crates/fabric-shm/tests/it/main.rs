#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.
mod channels;
mod private_root;
mod rights;
mod ring_processes;
mod rings;
mod shm;
mod transfers;
