pub mod bench;
pub mod fabric;
