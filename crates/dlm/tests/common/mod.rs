//! Test clusters: N nodes in one process, each with its own fabric.

#![allow(dead_code)]

use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_dlm::{DlmConfig, LockManager, Scheme};
use tierstack_fabric::Fabric;
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_fabric_tcp::TcpConfig;
use tierstack_fabric_ucx::UcxConfig;
use tierstack_testkit::nodes::{tcp, ucx};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Shm,
    Tcp,
    /// UCX over its shared-memory transports (`sysv,self`).
    Ucx,
}

/// False (saying why) when this build has no UCX; under
/// `TIERSTACK_REQUIRE_UCX=1` (CI) that fails the test instead.
pub(crate) use tierstack_testkit::nodes::ucx::ucx_or_skip;

pub(crate) struct Cluster {
    // Keeps the shm root alive; dropped after the fabrics.
    pub fabrics: Vec<Option<Arc<dyn Fabric>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Cluster {
    pub(crate) fn new(backend: Backend, n: u32) -> Cluster {
        match backend {
            Backend::Shm => {
                let dir = tempfile::tempdir().unwrap();
                let fabrics = (0..n)
                    .map(|i| {
                        let fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(i))).unwrap();
                        Some(fabric)
                    })
                    .collect();
                Cluster { fabrics, _dir: Some(dir) }
            }
            Backend::Tcp => {
                let nodes = tcp::cluster(0, n, TcpConfig::OP_TIMEOUT_DEFAULT);
                let fabrics = nodes.into_iter().map(|f| Some(f as Arc<dyn Fabric>)).collect();
                Cluster { fabrics, _dir: None }
            }
            Backend::Ucx => {
                let nodes = ucx::cluster(0, n, ucx::SHM, UcxConfig::OP_TIMEOUT_DEFAULT);
                let fabrics = nodes.into_iter().map(|f| Some(f as Arc<dyn Fabric>)).collect();
                Cluster { fabrics, _dir: None }
            }
        }
    }

    pub(crate) fn fabric(&self, i: usize) -> Arc<dyn Fabric> {
        self.fabrics[i].clone().expect("node is alive")
    }

    /// Starts a lock manager on every node; `servers` keep lock tables.
    pub(crate) fn managers(&self, scheme: Scheme, servers: &[u32]) -> Vec<LockManager> {
        self.managers_with(scheme, servers, |c| c)
    }

    pub(crate) fn managers_with(
        &self,
        scheme: Scheme,
        servers: &[u32],
        tweak: impl Fn(DlmConfig) -> DlmConfig,
    ) -> Vec<LockManager> {
        let nodes: Vec<NodeId> = (0..self.fabrics.len() as u32).map(NodeId).collect();
        let servers: Vec<NodeId> = servers.iter().map(|&s| NodeId(s)).collect();
        (0..self.fabrics.len())
            .map(|i| {
                LockManager::start(self.fabric(i), tweak(DlmConfig::new(scheme, servers.clone(), nodes.clone())))
                    .unwrap()
            })
            .collect()
    }

    /// Kills node `i`: the caller must have dropped its lock manager.
    pub(crate) fn kill(&mut self, i: usize) {
        let fabric = self.fabrics[i].take().expect("node is alive");
        assert_eq!(Arc::strong_count(&fabric), 1, "something still holds node {i}'s fabric");
        drop(fabric);
    }

    /// Starts node `i` again after [`Cluster::kill`] (shm only): a new
    /// incarnation of the same node id.
    pub(crate) fn restart(&mut self, i: usize) {
        let dir = self._dir.as_ref().expect("restart needs shm");
        assert!(self.fabrics[i].is_none(), "node {i} still runs");
        let fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(i as u32))).unwrap();
        self.fabrics[i] = Some(fabric);
    }

    /// Starts a lock manager on node `i` alone (after a restart).
    pub(crate) fn manager(
        &self,
        i: usize,
        scheme: Scheme,
        servers: &[u32],
        tweak: impl Fn(DlmConfig) -> DlmConfig,
    ) -> LockManager {
        let nodes: Vec<NodeId> = (0..self.fabrics.len() as u32).map(NodeId).collect();
        let servers: Vec<NodeId> = servers.iter().map(|&s| NodeId(s)).collect();
        LockManager::start(self.fabric(i), tweak(DlmConfig::new(scheme, servers, nodes))).unwrap()
    }
}
