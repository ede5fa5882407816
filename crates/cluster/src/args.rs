//! `--topology FILE --node ID`: which node of which cluster a process is.
//! Every command that attaches to a fabric flattens [`NodeArgs`]; a
//! launcher spells them with [`NodeArgs::to_args`].

use crate::{open_fabric, pin_to_cpu, OpenError, Topology, TopologyError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;

/// `--topology FILE --node ID`: which node of which cluster this process is.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct NodeArgs {
    /// Cluster topology file (TOML).
    #[arg(long)]
    pub topology: PathBuf,
    /// This process's node id in the topology.
    #[arg(long)]
    pub node: u32,
}

/// Why [`open_node`] failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeOpenError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("pinning {node} to cpu {cpu}")]
    Pin { node: NodeId, cpu: usize, source: std::io::Error },
    #[error("attaching {node} to the fabric")]
    Attach { node: NodeId, source: OpenError },
}

impl NodeArgs {
    pub fn id(&self) -> NodeId {
        NodeId(self.node)
    }

    /// Loads the topology, pins this process as it says, opens the fabric.
    pub fn open(&self) -> Result<(Topology, Arc<dyn Fabric>), NodeOpenError> {
        open_node(&self.topology, self.id())
    }

    /// The command-line words that parse back into these arguments.
    pub fn to_args(&self) -> Vec<String> {
        vec!["--topology".into(), self.topology.display().to_string(), "--node".into(), self.node.to_string()]
    }
}

/// Loads the topology, pins this process if its node names a CPU, and opens its fabric.
pub fn open_node(topology_path: &Path, node: NodeId) -> Result<(Topology, Arc<dyn Fabric>), NodeOpenError> {
    let topology = Topology::load(topology_path)?;
    if let Some(cpu) = topology.node(node)?.cpu {
        pin_to_cpu(cpu).map_err(|source| NodeOpenError::Pin { node, cpu, source })?;
    }
    let fabric = open_fabric(&topology, node).map_err(|source| NodeOpenError::Attach { node, source })?;
    Ok((topology, fabric))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards "spelled once": every field survives `to_args` and parsing.
    #[test]
    fn node_args_round_trip_through_their_words() {
        let at = NodeArgs { topology: PathBuf::from("/etc/tierstack/a cluster.toml"), node: 7 };
        let words = std::iter::once("node".to_string()).chain(at.to_args());
        assert_eq!(tierstack_testkit::args::parse::<NodeArgs, _, _>(words).unwrap(), at);
    }
}
