//! `tierstack load`: the load client with its updater and staleness checker
//! (glue over `tierstack-loadgen`).

use anyhow::{Context, Result};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use tierstack_loadgen::{Arrivals, LoadConfig, OpenLoop, MAX_IN_FLIGHT_DEFAULT};
use tierstack_workload::{TargetChoice, TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

#[derive(Args)]
pub(crate) struct LoadArgs {
    /// Base URL to load, e.g. http://127.0.0.1:8080 (repeat or comma-separate
    /// for several, e.g. the proxies; --target-choice says which request goes where).
    #[arg(long, value_delimiter = ',', required = true)]
    target: Vec<String>,
    /// Which target each request goes to: fixed (connection/stream w always
    /// uses target w mod n), round-robin (each worker moves to the next
    /// target after every request) or random (uniform, seeded per worker).
    #[arg(long, default_value = "fixed", value_name = "fixed|round-robin|random")]
    target_choice: TargetChoice,
    /// Open a new TCP connection for every request and close it after the
    /// response (as PRESS's clients do); otherwise connections are persistent.
    #[arg(long)]
    new_connection_per_request: bool,
    /// Open loop: send this many requests per second over the whole client,
    /// each at its scheduled time whatever the state of earlier ones, with
    /// latency measured from that time. Without it, the closed loop.
    #[arg(long, value_name = "REQ_PER_S")]
    rate: Option<f64>,
    /// Open loop: spacing of the scheduled times.
    #[arg(long, default_value = "poisson", value_name = "constant|poisson", requires = "rate")]
    arrivals: Arrivals,
    /// Open loop: a request due while this many are in flight is not sent
    /// and counts as an "over max in flight" error.
    #[arg(long, default_value_t = MAX_IN_FLIGHT_DEFAULT, requires = "rate")]
    max_in_flight: usize,
    /// Where updates go: the application server's URL (default: the first target).
    #[arg(long)]
    update_target: Option<String>,
    /// single | zipf | worldcup | clf:PATH | press:NAME[@SCALE] | coop:NAME[@SCALE]
    /// (PRESS Table 1's clarknet, nasa, rutgers, usask, wc98; coop's 8k, 16k,
    /// 32k, 64k; SCALE in (0, 1] shrinks files and cache; see `tierstack trace show`)
    #[arg(long, default_value = "single")]
    trace: String,
    /// Zipf exponent (zipf trace).
    #[arg(long, default_value_t = ZIPF_ALPHA_DEFAULT)]
    alpha: f64,
    /// Number of documents (zipf trace).
    #[arg(long, default_value_t = ZIPF_DOCS_DEFAULT)]
    docs: usize,
    /// Closed loop: concurrent connections, each with one request in flight.
    /// Open loop (--rate): request streams, dealt to the scheduled requests
    /// in turn (request k takes stream k mod connections).
    #[arg(long, default_value_t = tierstack_loadgen::CONNECTIONS_DEFAULT)]
    connections: usize,
    /// Run length in seconds (default 20, unless --requests is given).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Stop after this many requests.
    #[arg(long)]
    requests: Option<u64>,
    /// One update every this many milliseconds; 0 disables updates
    /// [default: 1000, or 0 with --static-content].
    #[arg(long)]
    update_interval_ms: Option<u64>,
    /// Per-request timeout.
    #[arg(long, default_value_t = tierstack_loadgen::REQUEST_TIMEOUT_MS_DEFAULT)]
    request_timeout_ms: u64,
    /// Seed of the request streams, the target choices, the arrivals, the
    /// updater and the trace synthesis.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every response and update here, one JSON object per line.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Write the report here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Exit with failure if any response was stale.
    #[arg(long)]
    fail_on_stale: bool,
    /// Verify self-checking bodies (`doc=<name> version=<v> fnv1a64=<hash>`,
    /// docs/coherence-protocol.md) and that each header names the requested
    /// document's key: for tierstack's own application server. Without it,
    /// any service that emits X-Tierstack-Deps can be loaded.
    #[arg(long)]
    check_bodies: bool,
    /// The targets serve static files without X-Tierstack-Deps (e.g.
    /// `tierstack origin`): a 2xx without the header is not an error, and
    /// there are no updates.
    #[arg(long, conflicts_with = "check_bodies")]
    static_content: bool,
}

pub(crate) fn run(args: LoadArgs) -> Result<()> {
    let spec = TraceSpec::parse(&args.trace, args.alpha, args.docs)?;
    let trace = spec.build(args.seed).with_context(|| format!("building trace {}", args.trace))?;
    let duration_s = args.duration_s.or(if args.requests.is_none() { Some(20.0) } else { None });
    let mut config = LoadConfig::new(args.target[0].clone(), trace);
    config.targets = args.target.clone();
    config.update_target = args.update_target.clone();
    config.connections = args.connections;
    config.duration_ms = duration_s.map(|s| (s.max(0.0) * 1000.0) as u64);
    config.requests_max = args.requests;
    let update_default = if args.static_content { 0 } else { tierstack_loadgen::UPDATE_INTERVAL_MS_DEFAULT };
    config.update_interval_ms = args.update_interval_ms.unwrap_or(update_default);
    config.static_content = args.static_content;
    config.request_timeout_ms = args.request_timeout_ms;
    config.seed = args.seed;
    config.keep_records = args.records.is_some();
    config.check_bodies = args.check_bodies;
    config.target_choice = args.target_choice;
    config.new_connection_per_request = args.new_connection_per_request;
    config.open_loop =
        args.rate.map(|rate_rps| OpenLoop { rate_rps, arrivals: args.arrivals, max_in_flight: args.max_in_flight });

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let progress = std::io::stderr().is_terminal();
    let report = runtime.block_on(tierstack_loadgen::console::run_until_interrupted(config, progress))?;

    if let Some(path) = &args.records {
        if let Some(log) = &report.records {
            let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
            log.write_jsonl(std::io::BufWriter::new(file)).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", report.summary_table())?;
    if report.records_dropped > 0 && args.records.is_some() {
        writeln!(out, "note: {} responses were checked but not kept in the record log", report.records_dropped)?;
    }
    if args.fail_on_stale && report.stale_responses > 0 {
        anyhow::bail!("{} stale responses", report.stale_responses);
    }
    Ok(())
}
