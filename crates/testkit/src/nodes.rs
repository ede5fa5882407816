//! Sets of fabric nodes in one process, per backend, that all know each
//! other: the fixtures of the backends' conformance and stress tests.

/// `shm` nodes: one directory shared by every node, ids `0..n`.
pub mod shm {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;
    use tierstack_base::NodeId;
    use tierstack_fabric_shm::{ShmConfig, ShmFabric};

    /// Nodes `0..n` under `root`, every send bounded by `send_timeout`.
    pub fn nodes(root: &Path, n: u32, send_timeout: Duration) -> Vec<Arc<ShmFabric>> {
        let ids: Vec<NodeId> = (0..n).map(NodeId).collect();
        ids.iter()
            .map(|&id| {
                let config = ShmConfig::new(root, id).with_nodes(ids.clone()).with_send_timeout(send_timeout);
                ShmFabric::open(config).unwrap()
            })
            .collect()
    }

    /// Nodes 0 and 1 under `root` with the default configuration.
    pub fn pair(root: &Path) -> (Arc<ShmFabric>, Arc<ShmFabric>) {
        let nodes = vec![NodeId(0), NodeId(1)];
        let owner = ShmFabric::open(ShmConfig::new(root, NodeId(0)).with_nodes(nodes.clone())).unwrap();
        let peer = ShmFabric::open(ShmConfig::new(root, NodeId(1)).with_nodes(nodes)).unwrap();
        (owner, peer)
    }
}

/// `tcp` nodes on 127.0.0.1, each on a free port.
pub mod tcp {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;
    use tierstack_base::NodeId;
    use tierstack_fabric::Fabric;
    use tierstack_fabric_tcp::{ClusterKey, TcpConfig, TcpFabric};

    /// 127.0.0.1 on a port the system picks.
    pub fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// One node on 127.0.0.1 with a free port.
    pub fn node(id: u32, op_timeout: Duration) -> Arc<TcpFabric> {
        TcpFabric::open(TcpConfig::new(NodeId(id), loopback()).with_op_timeout(op_timeout)).unwrap()
    }

    /// `n` nodes (ids `first..first + n`) that all know each other.
    pub fn cluster(first: u32, n: u32, op_timeout: Duration) -> Vec<Arc<TcpFabric>> {
        introduce((first..first + n).map(|id| node(id, op_timeout)).collect())
    }

    /// One node on 127.0.0.1 that authenticates every connection with `key`.
    pub fn keyed_node(id: u32, op_timeout: Duration, key: &ClusterKey) -> Arc<TcpFabric> {
        TcpFabric::open(TcpConfig::new(NodeId(id), loopback()).with_op_timeout(op_timeout).with_key(key)).unwrap()
    }

    /// `n` nodes sharing the cluster key `key`.
    pub fn keyed_cluster(first: u32, n: u32, op_timeout: Duration, key: &ClusterKey) -> Vec<Arc<TcpFabric>> {
        introduce((first..first + n).map(|id| keyed_node(id, op_timeout, key)).collect())
    }

    /// `n` nodes sharing `key`, every connection inside TLS.
    pub fn tls_cluster(first: u32, n: u32, op_timeout: Duration, key: &ClusterKey) -> Vec<Arc<TcpFabric>> {
        let open = |id| {
            let config = TcpConfig::new(NodeId(id), loopback()).with_op_timeout(op_timeout).with_key(key).with_tls();
            TcpFabric::open(config).unwrap()
        };
        introduce((first..first + n).map(open).collect())
    }

    fn introduce(nodes: Vec<Arc<TcpFabric>>) -> Vec<Arc<TcpFabric>> {
        for a in &nodes {
            for b in &nodes {
                a.add_peer(b.local_node(), b.local_addr());
            }
        }
        nodes
    }
}

/// `ucx` nodes on loopback over a chosen UCX transport set, and the skip
/// rule for builds without UCX.
pub mod ucx {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;
    use tierstack_base::NodeId;
    use tierstack_fabric_tcp::ClusterKey;
    use tierstack_fabric_ucx::{UcxConfig, UcxFabric};

    /// UCX over shared memory (one-sided: the owner's CPU never runs).
    pub const SHM: &str = "sysv,self";
    /// UCX over TCP (one-sided operations emulated with the owner's progress).
    pub const TCP: &str = "tcp,self";

    /// False (with the reason printed) when this build has no UCX and the
    /// test should skip; panics instead when `TIERSTACK_REQUIRE_UCX=1`.
    pub fn ucx_or_skip() -> bool {
        if tierstack_fabric_ucx::AVAILABLE {
            return true;
        }
        let reason = tierstack_fabric_ucx::unavailable_reason();
        assert!(std::env::var("TIERSTACK_REQUIRE_UCX").as_deref() != Ok("1"), "{reason}");
        eprintln!("skipped: {reason}");
        false
    }

    /// `n` nodes (ids from `first`) in this process over `transports`, each
    /// knowing every other's bootstrap address.
    pub fn cluster(first: u32, n: u32, transports: &str, op_timeout: Duration) -> Vec<Arc<UcxFabric>> {
        cluster_with(first, n, transports, op_timeout, None)
    }

    /// As [`cluster`], every node authenticating its bootstrap connections
    /// with `key` (a key per node: `keys[i]` for node `first + i`, so a test
    /// can give one node another key).
    pub fn keyed_cluster(
        first: u32,
        transports: &str,
        op_timeout: Duration,
        keys: &[Option<&ClusterKey>],
    ) -> Vec<Arc<UcxFabric>> {
        cluster_with(first, keys.len() as u32, transports, op_timeout, Some(keys))
    }

    fn cluster_with(
        first: u32,
        n: u32,
        transports: &str,
        op_timeout: Duration,
        keys: Option<&[Option<&ClusterKey>]>,
    ) -> Vec<Arc<UcxFabric>> {
        let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
        let nodes: Vec<Arc<UcxFabric>> = (first..first + n)
            .map(|id| {
                let mut config =
                    UcxConfig::new(NodeId(id), loopback).with_op_timeout(op_timeout).with_transports(transports);
                if let Some(key) = keys.and_then(|keys| keys[(id - first) as usize]) {
                    config = config.with_key(key);
                }
                UcxFabric::open(config).unwrap()
            })
            .collect();
        for a in &nodes {
            for (i, b) in nodes.iter().enumerate() {
                a.add_peer(NodeId(first + i as u32), b.local_addr());
            }
        }
        nodes
    }
}
