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

use anyhow::{Context, Result};
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_cluster::{open_fabric, pin_to_cpu, Topology};
use tierstack_fabric::Fabric;

/// Loads the topology, pins this process if its node names a CPU, and opens its fabric.
/// `--topology FILE --node ID`: which node of which cluster this process is.
#[derive(clap::Args)]
pub struct NodeArgs {
    /// Cluster topology file (TOML).
    #[arg(long)]
    pub topology: std::path::PathBuf,
    /// This process's node id in the topology.
    #[arg(long)]
    pub node: u32,
}

impl NodeArgs {
    pub fn id(&self) -> NodeId {
        NodeId(self.node)
    }

    /// Loads the topology, pins this process as it says, opens the fabric.
    pub fn open(&self) -> Result<(Topology, Arc<dyn Fabric>)> {
        open_node(&self.topology, self.id())
    }
}

pub fn open_node(topology_path: &std::path::Path, node: NodeId) -> Result<(Topology, Arc<dyn Fabric>)> {
    let topology = Topology::load(topology_path)?;
    if let Some(cpu) = topology.node(node)?.cpu {
        pin_to_cpu(cpu).with_context(|| format!("pinning {node} to cpu {cpu}"))?;
    }
    let fabric = open_fabric(&topology, node).with_context(|| format!("attaching {node} to the fabric"))?;
    Ok((topology, fabric))
}
