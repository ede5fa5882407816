//! Shared helpers of the ucx backend's tests: loopback clusters over a
//! chosen UCX transport set, and the skip rule for builds without UCX.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric_ucx::{UcxConfig, UcxFabric};

/// UCX over shared memory (one-sided: the owner's CPU never runs).
pub(crate) const SHM: &str = "sysv,self";
/// UCX over TCP (one-sided operations emulated with the owner's progress).
pub(crate) const TCP: &str = "tcp,self";

/// False (with the reason printed) when this build has no UCX and the test
/// should skip; panics instead when `TIERSTACK_REQUIRE_UCX=1`.
pub(crate) fn ucx_or_skip() -> bool {
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
pub(crate) fn cluster(first: u32, n: u32, transports: &str, op_timeout: Duration) -> Vec<Arc<UcxFabric>> {
    let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let nodes: Vec<Arc<UcxFabric>> = (first..first + n)
        .map(|id| {
            let config = UcxConfig::new(NodeId(id), loopback).with_op_timeout(op_timeout).with_transports(transports);
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
