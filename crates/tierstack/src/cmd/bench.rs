//! `tierstack bench …`: the experiments.

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;
use tierstack_bench::fabric::{run as run_fabric, FabricBenchConfig};
use tierstack_cluster::Backend;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Cooperative caching (coop seed Fig. 5/6 and Table 2) on `tierstack sim`: AC, BCC, CCWR,
    /// MTACC, HYBCC and a groupcache baseline on 2 and 8 proxies + 2 web servers, 8k-64k traces.
    Coop {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/coop")]
        out: PathBuf,
        /// Scale 0.05, 10 requests per file.
        #[arg(long)]
        quick: bool,
        /// Working set and cache scale (1.0 = the seed's 10,000 files and 64 MiB per node).
        #[arg(long)]
        scale: Option<f64>,
        /// Requests per document of the trace.
        #[arg(long)]
        requests_per_file: Option<u64>,
        /// The web servers' disk seek (the miss cost), microseconds.
        #[arg(long)]
        disk_seek_us: Option<f64>,
        /// Replica search cost per page table, nanoseconds.
        #[arg(long)]
        lookup_ns: Option<u64>,
        /// Proxy CPU per miss, microseconds (the calibration knob).
        #[arg(long)]
        miss_cpu_us: Option<u64>,
        /// Proxy counts to run (default 2,8; with --http: 2).
        #[arg(long, value_delimiter = ',')]
        proxies: Option<Vec<usize>>,
        /// Real processes instead: `tierstack origin` web servers, `proxy --coop` proxies and
        /// `coop-node` passive nodes under `tierstack load`'s closed loop, the simulator beside.
        #[arg(long)]
        http: bool,
        /// --http: the traces (default 8k,32k with --quick, else all four).
        #[arg(long, value_delimiter = ',', requires = "http")]
        traces: Option<Vec<String>>,
        /// --http: fabric backend (shm or tcp).
        #[arg(long, requires = "http")]
        backend: Option<tierstack_cluster::Backend>,
        /// --http: measured seconds per run (after a warm-up).
        #[arg(long, requires = "http")]
        duration_s: Option<f64>,
    },
    /// Strongly coherent caching (coherency paper Fig. 9-11): response time and throughput vs
    /// compute threads, response-time breakdown, traces; no-cache, poll/tcp, poll/shm and ttl.
    Coherence {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/coherence")]
        out: PathBuf,
        /// Compute threads 0 and 200 only, 3 s per run.
        #[arg(long)]
        quick: bool,
        /// Compute-thread counts (default 0,25,50,100,200).
        #[arg(long, value_delimiter = ',')]
        compute_threads: Option<Vec<usize>>,
        /// Seconds per run.
        #[arg(long)]
        duration_s: Option<u64>,
        /// Placements of the module for poll/tcp and poll/shm: `shared` (in the compute
        /// threads' scheduling group, the paper's node) and/or `own` (module and server
        /// each in a session, so an autogroup, of its own).
        #[arg(long, value_delimiter = ',', default_value = "shared,own")]
        placements: Vec<String>,
        /// The hot-document experiment instead (issue 16): ttl, poll/shm, poll/shm with
        /// write-through push and poll/shm with proxy-side refresh at 200 compute threads and
        /// 32 connections, single/zipf/worldcup.
        #[arg(long)]
        hot: bool,
        /// Connections of the load client (default 16; 32 with --hot).
        #[arg(long)]
        connections: Option<usize>,
        /// With --hot: compute threads of the Zipf and WorldCup-like runs (default: the last
        /// of --compute-threads, 200).
        #[arg(long, requires = "hot")]
        trace_threads: Option<usize>,
        /// Write-through's bound on an update's wait for its pushes.
        #[arg(long, default_value_t = 500)]
        write_through_bound_ms: u64,
    },
    /// Fabric micro-benchmarks (coherency paper Fig. 8) and owner-load sensitivity.
    Fabric {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/fabric")]
        out: PathBuf,
        /// Shorter measurements (for smoke runs).
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Busy threads in the owner, one run each.
        #[arg(long, value_delimiter = ',', default_value = "0,16,64,200")]
        loads: Vec<usize>,
    },
    /// Distributed lock manager (services paper Fig. 5): lock cascading latency, uncontended
    /// latency and contended throughput of N-CoShED, SRSL and DQNL; each node is a process.
    Dlm {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/dlm")]
        out: PathBuf,
        /// Fewer rounds and waiter counts 1,4,16 (for smoke runs).
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Lock schemes to compare.
        #[arg(long, value_delimiter = ',', default_value = "ncoshed,srsl,dqnl")]
        schemes: Vec<tierstack_bench::dlm::Scheme>,
        /// Waiter counts of the cascade sweep (default 1,2,4,8,16; 1,4,16 with --quick).
        #[arg(long, value_delimiter = ',')]
        waiters: Option<Vec<usize>>,
        /// Cascades per cell, spread over 3 passes (default 90; 5 in one pass with --quick).
        #[arg(long)]
        rounds: Option<usize>,
        /// Run the nodes as threads of this process (each with its own fabric) instead of processes.
        #[arg(long)]
        threads: bool,
        /// Rounds of the recovery-after-a-kill measurement per scheme and backend (default 15; 3 with
        /// --quick; 0 skips it; processes only).
        #[arg(long)]
        recovery_rounds: Option<usize>,
    },
    /// Distributed data sharing substrate (services paper Fig. 3a): put latency by coherence model and value
    /// size, get latency, and Redis on loopback for comparison; the home node is a `ddss-daemon` process.
    Ddss {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/ddss")]
        out: PathBuf,
        /// Fewer operations per cell (300 instead of 5000).
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Measured operations per cell (overrides the --quick choice).
        #[arg(long)]
        iterations: Option<usize>,
        /// Value sizes in bytes.
        #[arg(long, value_delimiter = ',', default_value = "1,64,1024,4096,16384,65536")]
        sizes: Vec<usize>,
        /// Run the home node inside this process instead of a separate `ddss-daemon` process.
        #[arg(long)]
        in_process: bool,
        /// Skip the Redis comparison.
        #[arg(long)]
        no_redis: bool,
    },
    /// Fine-grained resource monitoring (services paper Fig. 8): 8a, |reported - actual| load of the four
    /// schemes (socket-async, socket-sync, rdma-async, rdma-sync) vs compute threads on the back end;
    /// 8b, throughput of a proxy balancing by hash, round-robin and least-loaded by each scheme.
    Monitor {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/monitor")]
        out: PathBuf,
        /// Compute threads 0, 50, 200 and 1 s per run.
        #[arg(long)]
        quick: bool,
        /// Compute-thread counts (default 0,25,50,100,200).
        #[arg(long, value_delimiter = ',')]
        compute_threads: Option<Vec<usize>>,
        /// Seconds of sampling per run.
        #[arg(long)]
        duration_s: Option<u64>,
        /// The back end's monitor interval (RDMA-Async, Socket-Async), ms.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// Which figure: 8a (accuracy), 8b (throughput of balancing), both,
        /// or reconfig (two sites, load shifting, with and without the agent).
        #[arg(long, default_value = "both", value_parser = ["8a", "8b", "both", "reconfig"])]
        figure: String,
        /// Fig. 8b: Zipf exponents (default 0.25,0.5,0.75,0.9; 0.5,0.9 with --quick).
        #[arg(long, value_delimiter = ',')]
        alphas: Option<Vec<f64>>,
        /// Fig. 8b: per-read CPU cost of the application servers (`app-server --cpu-cost`).
        #[arg(long, default_value = "rubis")]
        cpu_cost: String,
        /// Fig. 8b: closed-loop clients.
        #[arg(long, default_value_t = 16)]
        connections: usize,
    },
    /// PRESS (Carrera and Bianchini): Fig. 3 (TCP vs Base), Table 2 (messages and bytes per type per
    /// 1,000 requests), Fig. 5 (throughput vs nodes) and PRESS vs traditional, on press-node processes.
    Press {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/press")]
        out: PathBuf,
        /// Clarknet only, 1 and 2 nodes, 2 s per run.
        #[arg(long)]
        quick: bool,
        /// Traces (clarknet, nasa, rutgers, usask, wc98).
        #[arg(long, value_delimiter = ',')]
        traces: Option<Vec<String>>,
        /// Node counts of Fig. 5 (the largest is used for the per-trace runs).
        #[arg(long, value_delimiter = ',')]
        nodes: Option<Vec<usize>>,
        /// Scale of the synthesized traces (files and per-node caches).
        #[arg(long)]
        scale: Option<f64>,
        /// Seconds measured per run.
        #[arg(long)]
        duration_s: Option<u64>,
        /// Closed-loop client connections.
        #[arg(long)]
        connections: Option<usize>,
        /// Systems run per trace (press-tcp, press-base, press-rdma-1c, press-rdma, press-zero, traditional,
        /// distrib-ho, dispatch-ho, haproxy); default all (haproxy skipped when not installed).
        #[arg(long, value_delimiter = ',')]
        systems: Option<Vec<String>>,
        /// Rounds: each point run this many times, the systems alternated; the tables show means and the
        /// versions' order per round.
        #[arg(long, default_value_t = 1)]
        repeats: usize,
        /// Skip Fig. 5's node-count sweep.
        #[arg(long)]
        skip_fig5: bool,
    },
    /// Adaptive push-pull (coherency paper Fig. 12-14): wasted updates, cache misses and response
    /// time of pull, push and the shared-cache-state hybrid at several fractions, per backend.
    PushPull {
        /// Output folder for JSON and plots.
        #[arg(long, default_value = "report/pushpull")]
        out: PathBuf,
        /// 3 s per run instead of 10.
        #[arg(long)]
        quick: bool,
        /// Backends to measure.
        #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
        backends: Vec<Backend>,
        /// Push policies (pull, push, hybrid:<fraction>, useful:<probability>).
        #[arg(long, value_delimiter = ',')]
        policies: Option<Vec<String>>,
        /// Each proxy's cache size: small enough that pushes evict.
        #[arg(long, default_value_t = tierstack_bench::pushpull::CACHE_BYTES_DEFAULT)]
        cache_bytes: usize,
        /// Zipf documents (sizes 200 B to 1 MiB).
        #[arg(long, default_value_t = tierstack_bench::pushpull::DOCS_DEFAULT)]
        docs: usize,
        /// Zipf exponent of the requests.
        #[arg(long, default_value_t = tierstack_bench::pushpull::ALPHA_DEFAULT)]
        alpha: f64,
        /// One update of a uniformly chosen document every this many ms.
        #[arg(long, default_value_t = tierstack_bench::pushpull::UPDATE_INTERVAL_MS_DEFAULT)]
        update_interval_ms: u64,
        /// Seconds per run (overrides the --quick choice).
        #[arg(long)]
        duration_s: Option<u64>,
        /// Load client connections.
        #[arg(long, default_value_t = tierstack_bench::pushpull::CONNECTIONS_DEFAULT)]
        connections: usize,
    },
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Coop {
            out,
            quick,
            scale,
            requests_per_file,
            disk_seek_us,
            lookup_ns,
            miss_cpu_us,
            proxies,
            http,
            traces,
            backend,
            duration_s,
        } => {
            if http {
                let mut config = tierstack_bench::coop_http::CoopHttpConfig::new(std::env::current_exe()?, out, quick);
                config.scale = scale.unwrap_or(config.scale);
                config.traces = traces.unwrap_or(config.traces);
                config.backend = backend.unwrap_or(config.backend);
                config.proxies = proxies.and_then(|p| p.first().copied()).unwrap_or(config.proxies);
                config.duration_ms = duration_s.map_or(config.duration_ms, |s| (s * 1000.0) as u64);
                config.disk_seek_us = disk_seek_us.map_or(config.disk_seek_us, |us| us as u64);
                tierstack_bench::coop_http::run_http(&config)?;
                return Ok(());
            }
            let mut config = tierstack_bench::coop::CoopBenchConfig::new(out, quick);
            config.scale = scale.unwrap_or(config.scale);
            config.requests_per_file = requests_per_file.unwrap_or(config.requests_per_file);
            config.disk_seek_us = disk_seek_us.unwrap_or(config.disk_seek_us);
            config.lookup_ns = lookup_ns.unwrap_or(config.lookup_ns);
            config.miss_cpu_ns = miss_cpu_us.map_or(config.miss_cpu_ns, |us| us * 1000);
            config.proxies = proxies.unwrap_or(config.proxies);
            tierstack_bench::coop::run_bench(&config)?;
            Ok(())
        }
        BenchCommand::Press {
            out,
            quick,
            traces,
            nodes,
            scale,
            duration_s,
            connections,
            systems,
            repeats,
            skip_fig5,
        } => {
            let mut config = tierstack_bench::press::PressBenchConfig::new(std::env::current_exe()?, out, quick);
            if let Some(traces) = traces {
                config.traces = traces;
            }
            if let Some(nodes) = nodes {
                config.nodes = nodes;
            }
            if let Some(scale) = scale {
                config.scale = scale;
            }
            if let Some(duration_s) = duration_s {
                config.duration_s = duration_s;
            }
            if let Some(connections) = connections {
                config.connections = connections;
            }
            if let Some(systems) = systems {
                if let Some(bad) = systems.iter().find(|s| !tierstack_bench::press::SYSTEMS.contains(&s.as_str())) {
                    anyhow::bail!("unknown system {bad:?} (expected one of {:?})", tierstack_bench::press::SYSTEMS);
                }
                config.systems = systems;
            }
            config.repeats = repeats.max(1);
            config.skip_fig5 = skip_fig5;
            tierstack_bench::press::run(&config)?;
            Ok(())
        }
        BenchCommand::Monitor {
            out,
            quick,
            compute_threads,
            duration_s,
            interval_ms,
            figure,
            alphas,
            cpu_cost,
            connections,
        } => {
            use tierstack_bench::monitor::{run, run_throughput, MonitorBenchConfig, ThroughputConfig};
            let interval = std::time::Duration::from_millis(interval_ms.max(1));
            if figure == "reconfig" {
                use tierstack_bench::monitor::{run_reconfig, ReconfigBenchConfig};
                let mut config = ReconfigBenchConfig::new(std::env::current_exe()?, out, quick);
                if let Some(seconds) = duration_s {
                    config.phase = std::time::Duration::from_secs(seconds);
                }
                run_reconfig(&config)?;
                return Ok(());
            }
            if figure != "8b" {
                let mut config = MonitorBenchConfig::new(std::env::current_exe()?, out.clone(), quick);
                if let Some(threads) = compute_threads {
                    config.compute_threads = threads;
                }
                if let Some(seconds) = duration_s {
                    config.duration = std::time::Duration::from_secs(seconds);
                }
                config.interval = interval;
                run(&config)?;
            }
            if figure != "8a" {
                let mut config = ThroughputConfig::new(std::env::current_exe()?, out, quick);
                if let Some(alphas) = alphas {
                    config.alphas = alphas;
                }
                if let Some(seconds) = duration_s {
                    config.duration = std::time::Duration::from_secs(seconds);
                }
                config.interval = interval;
                config.cpu_cost = cpu_cost;
                config.connections = connections;
                run_throughput(&config)?;
            }
            Ok(())
        }
        BenchCommand::Coherence {
            out,
            quick,
            compute_threads,
            duration_s,
            placements,
            hot,
            connections,
            trace_threads,
            write_through_bound_ms,
        } => {
            use tierstack_bench::coherence::{CoherenceBenchConfig, Placement};
            let exe = std::env::current_exe()?;
            let mut config = if hot {
                CoherenceBenchConfig::hot(exe, out, quick)
            } else {
                CoherenceBenchConfig::new(exe, out, quick)
            };
            config.placements = placements.iter().map(|p| Placement::parse(p)).collect::<Result<_>>()?;
            if let Some(connections) = connections {
                config.connections = connections;
            }
            config.trace_threads = trace_threads;
            config.write_through_bound = std::time::Duration::from_millis(write_through_bound_ms);
            if let Some(threads) = compute_threads {
                config.compute_threads = threads;
            }
            if let Some(seconds) = duration_s {
                config.duration = std::time::Duration::from_secs(seconds);
            }
            if hot {
                tierstack_bench::coherence::run_hot(&config)?;
            } else {
                tierstack_bench::coherence::run(&config)?;
            }
            Ok(())
        }
        BenchCommand::Fabric { out, quick, backends, loads } => {
            let mut config = FabricBenchConfig::new(std::env::current_exe()?, out, quick);
            config.backends = backends;
            config.loads = loads;
            run_fabric(&config)?;
            Ok(())
        }
        BenchCommand::Dlm { out, quick, backends, schemes, waiters, rounds, threads, recovery_rounds } => {
            use tierstack_bench::dlm::NodeKind;
            let nodes = if threads { NodeKind::Threads } else { NodeKind::Processes { exe: std::env::current_exe()? } };
            let mut config = tierstack_bench::dlm::DlmBenchConfig::new(out, nodes, quick);
            config.backends = backends;
            config.schemes = schemes;
            if let Some(waiters) = waiters {
                config.waiters = waiters;
            }
            if let Some(rounds) = rounds {
                config.rounds = rounds;
            }
            if let Some(recovery_rounds) = recovery_rounds {
                config.recovery_rounds = recovery_rounds;
            }
            tierstack_bench::dlm::run(&config)?;
            Ok(())
        }
        BenchCommand::Ddss { out, quick, backends, iterations, sizes, in_process, no_redis } => {
            use tierstack_bench::ddss::{DdssBenchConfig, Home};
            let home = if in_process { Home::InProcess } else { Home::Process(std::env::current_exe()?) };
            let mut config = DdssBenchConfig::new(out, home, quick);
            config.backends = backends;
            config.sizes = sizes;
            if let Some(iterations) = iterations {
                config.iterations = iterations;
                config.warmup = iterations / 10;
            }
            config.redis = !no_redis;
            tierstack_bench::ddss::run(&config)?;
            Ok(())
        }
        BenchCommand::PushPull {
            out,
            quick,
            backends,
            policies,
            cache_bytes,
            docs,
            alpha,
            update_interval_ms,
            duration_s,
            connections,
        } => {
            use tierstack_bench::pushpull::{run, PushPullBenchConfig};
            let mut config = PushPullBenchConfig::new(std::env::current_exe()?, out, quick);
            config.backends = backends;
            if let Some(policies) = policies {
                config.policies = policies;
            }
            config.cache_bytes = cache_bytes;
            config.docs = docs;
            config.alpha = alpha;
            config.update_interval_ms = update_interval_ms;
            config.connections = connections;
            if let Some(seconds) = duration_s {
                config.duration = std::time::Duration::from_secs(seconds);
            }
            run(&config)?;
            Ok(())
        }
    }
}
