pub mod bench;
pub mod cluster;
pub mod coop;
pub mod ddss;
pub mod demo;
pub mod dlm;
pub mod fabric;
pub mod load;
pub mod monitor;
pub mod origin;
pub mod press;
pub mod proxy_config;
pub mod reconfig;
pub mod sim;
pub mod tiers;
pub mod top;
pub mod trace;

pub use tierstack_cluster::{open_node, NodeArgs};
