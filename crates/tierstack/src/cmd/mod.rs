pub mod bench;
pub mod fabric;
pub mod load;
