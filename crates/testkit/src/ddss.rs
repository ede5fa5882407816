//! DDSS substrates in one process, one fabric node each: the fixture of the
//! ddss crate's tests and of the bench crate's DDSS measurement tests.

use std::sync::Arc;
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_cluster::{local_cluster, Backend, LocalCluster};
use tierstack_ddss::{Coherence, Ddss, DdssConfig};

/// The backends every build has.
pub const BACKENDS: [Backend; 2] = [Backend::Shm, Backend::Tcp];

/// [`BACKENDS`] and ucx (over UCX shared memory) when this build has UCX;
/// without it, says why (and fails under `TIERSTACK_REQUIRE_UCX=1`, as CI sets).
pub fn backends_with_ucx() -> Vec<Backend> {
    let mut backends = BACKENDS.to_vec();
    if tierstack_cluster::ucx_available() {
        backends.push(Backend::Ucx);
    } else {
        let reason = tierstack_cluster::ucx_unavailable_reason();
        assert!(std::env::var("TIERSTACK_REQUIRE_UCX").as_deref() != Ok("1"), "{reason}");
        eprintln!("ucx left out: {reason}");
    }
    backends
}

/// The six coherence models in their order, `temporal` and `delta` with
/// the given bounds.
pub fn every_model(max_age_ms: u64, versions: u64) -> [Coherence; 6] {
    [
        Coherence::Null,
        Coherence::Temporal { max_age_ms },
        Coherence::Delta { versions },
        Coherence::Read,
        Coherence::Write,
        Coherence::Strict,
    ]
}

/// A small region: 16 slots of 8 B, 8 of 64 B, 4 of 1 KiB, 2 of 64 KiB,
/// members `0..nodes`.
pub fn small_config(nodes: u32) -> DdssConfig {
    DdssConfig::empty()
        .with_slots(8, 16)
        .with_slots(64, 8)
        .with_slots(1024, 4)
        .with_slots(64 * 1024, 2)
        .with_members((0..nodes).map(NodeId).collect())
}

/// `n` nodes on one backend, each with its own fabric and started substrate.
pub struct Nodes {
    pub cluster: LocalCluster,
    pub ddss: Vec<Arc<Ddss>>,
}

/// `n` nodes on `backend` with `config`, on the system clock.
pub fn start(backend: Backend, n: u32, config: DdssConfig) -> Nodes {
    start_with_clock(backend, n, config, Arc::new(SystemClock))
}

/// `n` nodes on `backend` with `config`, every substrate reading `clock`.
pub fn start_with_clock(backend: Backend, n: u32, config: DdssConfig, clock: Arc<dyn Clock>) -> Nodes {
    let cluster = local_cluster(backend, n).expect("cluster");
    let ddss = cluster
        .fabrics()
        .iter()
        .map(|fabric| Arc::new(Ddss::start_with_clock(fabric.clone(), config.clone(), clock.clone()).expect("start")))
        .collect();
    Nodes { cluster, ddss }
}
