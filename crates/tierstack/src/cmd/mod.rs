pub(crate) mod bench;
pub(crate) mod cluster;
pub(crate) mod coop;
pub(crate) mod ddss;
pub(crate) mod demo;
pub(crate) mod dlm;
pub(crate) mod fabric;
pub(crate) mod load;
pub(crate) mod monitor;
pub(crate) mod origin;
pub(crate) mod press;
pub(crate) mod proxy_config;
pub(crate) mod reconfig;
pub(crate) mod sim;
pub(crate) mod tiers;
pub(crate) mod top;
pub(crate) mod trace;

pub(crate) use tierstack_cluster::{open_node, NodeArgs};
