pub mod bench;
pub mod ddss;
pub mod fabric;
pub mod load;
pub mod tiers;
