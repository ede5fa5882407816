pub mod bench;
pub mod ddss;
pub mod demo;
pub mod fabric;
pub mod load;
pub mod tiers;
