//! `tierstack bench …`: the experiments. Each experiment's flags are its
//! `…Args` struct in `tierstack_bench`, flattened here, so a flag is spelled
//! once, beside the configuration it sets.

use anyhow::Result;
use clap::Subcommand;
use tierstack_bench::{coherence, coop, ddss, dlm, fabric, http2, monitor, press, pushpull};

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// Cooperative caching (coop seed Fig. 5/6 and Table 2) on `tierstack sim`: AC, BCC, CCWR,
    /// MTACC, HYBCC and a groupcache baseline on 2 and 8 proxies + 2 web servers, 8k-64k traces.
    Coop(coop::CoopArgs),
    /// Strongly coherent caching (coherency paper Fig. 9-11): response time and throughput vs
    /// compute threads, response-time breakdown, traces; no-cache, poll/tcp, poll/shm and ttl.
    /// `--hot` (issues 16, 31): a hot document updated every second beside busy compute threads,
    /// with page costs: ttl, poll/shm, write-through, refresh and published pages, alternated rounds.
    Coherence(coherence::CoherenceArgs),
    /// Fabric micro-benchmarks (coherency paper Fig. 8) and owner-load sensitivity.
    Fabric(fabric::FabricArgs),
    /// Distributed lock manager (services paper Fig. 5): lock cascading latency, uncontended
    /// latency and contended throughput of N-CoShED, SRSL and DQNL; each node is a process.
    Dlm(dlm::DlmArgs),
    /// Distributed data sharing substrate (services paper Fig. 3a): put latency by coherence model and value
    /// size, get latency, and Redis on loopback for comparison; the home node is a `ddss-daemon` process.
    Ddss(ddss::DdssArgs),
    /// The proxy at the edge (issue 32): HTTP/2 hits over TLS and TLS handshakes per second, with CPU
    /// per request, beside nginx caching the same object, with h2load; skipped where either is absent.
    Http2(http2::Http2Args),
    /// Fine-grained resource monitoring (services paper Fig. 8): 8a, |reported - actual| load of the four
    /// schemes (socket-async, socket-sync, rdma-async, rdma-sync) vs compute threads on the back end;
    /// 8b, throughput of a proxy balancing by hash, round-robin and least-loaded by each scheme.
    Monitor(monitor::MonitorArgs),
    /// PRESS (Carrera and Bianchini): Fig. 3 (TCP vs Base), Table 2 (messages and bytes per type per
    /// 1,000 requests), Fig. 5 (throughput vs nodes) and PRESS vs traditional, on press-node processes.
    Press(press::PressArgs),
    /// Adaptive push-pull (coherency paper Fig. 12-14): wasted updates, cache misses and response
    /// time of pull, push and the shared-cache-state hybrid at several fractions, per backend.
    PushPull(pushpull::PushPullArgs),
}

/// Runs the chosen experiment; the processes it starts are this executable.
pub(crate) fn run(command: BenchCommand) -> Result<()> {
    let exe = std::env::current_exe;
    match command {
        BenchCommand::Coop(args) => args.run(exe),
        BenchCommand::Coherence(args) => args.run(exe),
        BenchCommand::Fabric(args) => args.run(exe),
        BenchCommand::Dlm(args) => args.run(exe),
        BenchCommand::Ddss(args) => args.run(exe),
        BenchCommand::Http2(args) => args.run(exe),
        BenchCommand::Monitor(args) => args.run(exe),
        BenchCommand::Press(args) => args.run(exe),
        BenchCommand::PushPull(args) => args.run(exe),
    }
}
