//! The tierstack crate's integration tests as one test binary: one module
//! per suite (each module's `//!` says what it proves). One binary links the
//! whole workspace once instead of once per suite, which is most of these
//! tests' build time and disk.
//!
//! `sim_agreement` stays a binary of its own: it measures throughput and
//! runs with no other test beside it (see its `//!` and
//! `.config/nextest.toml`).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::path::PathBuf;
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};

mod cluster_e2e;
mod coherence_e2e;
mod coop_bench;
mod coop_http;
mod ddss_processes;
mod demo;
mod deploy_files;
mod dlm_bench_processes;
mod dlm_chaos;
mod dlm_processes;
mod dlm_rehome_processes;
mod edge_tls;
mod fabric_processes;
mod http2_bench;
mod layering;
mod metrics_nodes;
mod metrics_tiers;
mod monitor_e2e;
mod monitor_liveness;
mod monitor_truth;
mod origin_process;
mod press_bench;
mod press_processes;
mod press_server;
mod publish_e2e;
mod pushpull_e2e;
mod reconfig_e2e;
mod refresh_e2e;
mod service_e2e;
mod stale_e2e;
mod table1_e2e;
mod test_script;

/// True if the ucx backend can run here; otherwise says why the calling
/// test is skipped (and fails it where `TIERSTACK_REQUIRE_UCX=1`, as in CI).
fn ucx_or_skip() -> bool {
    if tierstack_cluster::ucx_available() {
        return true;
    }
    let reason = tierstack_cluster::ucx_unavailable_reason();
    assert!(std::env::var("TIERSTACK_REQUIRE_UCX").as_deref() != Ok("1"), "{reason}");
    eprintln!("skipped: {reason}");
    false
}

/// Waits (at most a minute) until a running load's live counters satisfy `done`.
fn wait_live(
    live: &tierstack_loadgen::LiveStats,
    what: &str,
    done: impl Fn(&tierstack_loadgen::LiveSnapshot) -> bool,
) -> tierstack_loadgen::LiveSnapshot {
    let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(60);
    loop {
        let now = live.snapshot();
        if done(&now) {
            return now;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "timed out waiting for {what}: {now:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The `tierstack` binary these tests run.
fn exe() -> PathBuf {
    tierstack_testkit::exe!()
}

/// Starts a deployment, retrying a failed start twice: ports are picked free
/// and bound later by the children, so a test running alongside may take
/// one first.
fn start_deployment(config: &DeploymentConfig, options: &DeploymentOptions, extra: &ExtraArgs) -> Deployment {
    let mut attempts = 0;
    loop {
        match Deployment::start_with_args(config, options, extra) {
            Ok(deployment) => return deployment,
            Err(e) if attempts < 2 => {
                attempts += 1;
                eprintln!("deployment did not start ({e:#}); retrying");
            }
            Err(e) => panic!("deployment did not start: {e:#}"),
        }
    }
}
