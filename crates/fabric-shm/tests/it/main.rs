mod channels;
mod ring_processes;
mod rings;
mod shm;
mod transfers;
