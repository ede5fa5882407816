//! `tierstack origin`: a static web server with an emulated disk (glue over
//! `tierstack-origin`). Prints `ready` once it serves, serves as a service
//! (`crate::service`: until SIGTERM or SIGINT, or its standard input's end
//! with `--stop-on-stdin-eof`), then prints its counters as one JSON line.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::SystemTime;
use tierstack_cluster::pin_to_cpu;
use tierstack_origin::{DiskModel, FileSet, Origin, OriginConfig, StorageConfig, SyntheticSet};
use tierstack_tier_http::Stop;
use tierstack_workload::{TraceSpec, ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};

#[derive(Args)]
#[command(group(clap::ArgGroup::new("content").required(true).args(["root", "files", "trace"])))]
pub(crate) struct OriginArgs {
    /// Where clients connect.
    #[arg(long)]
    listen: SocketAddr,
    /// Where `GET /stats` is served (keep it off the clients' network).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Serve the real files under this directory.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Serve a synthetic set: a text file of `path size` lines.
    #[arg(long)]
    files: Option<PathBuf>,
    /// Serve a trace's documents (`/doc/<name>`, their sizes) as a synthetic
    /// set: single | zipf | worldcup | clf:PATH | press:NAME[@SCALE] |
    /// coop:NAME[@SCALE] (as `tierstack load --trace`; see `tierstack trace show`).
    #[arg(long)]
    trace: Option<String>,
    /// Zipf exponent (zipf trace).
    #[arg(long, default_value_t = ZIPF_ALPHA_DEFAULT, requires = "trace")]
    alpha: f64,
    /// Number of documents (zipf trace).
    #[arg(long, default_value_t = ZIPF_DOCS_DEFAULT, requires = "trace")]
    docs: usize,
    /// Seed of the trace's document set (worldcup's depends on it).
    #[arg(long, default_value_t = 1, requires = "trace")]
    seed: u64,
    /// The Cache-Control header; "" sends none.
    #[arg(long, default_value = tierstack_origin::CACHE_CONTROL_DEFAULT)]
    cache_control: String,
    /// Last-Modified of synthetic objects: an HTTP-date, or `start` for the
    /// origin's start time. Default: a fixed date (Sat, 01 Jan 2000), so
    /// origins serving one set agree on validators across restarts.
    #[arg(long)]
    last_modified: Option<String>,
    /// Emulated disk: positioning time per read, in microseconds.
    #[arg(long, requires = "disk_mb_per_s")]
    disk_seek_us: Option<u64>,
    /// Emulated disk: transfer rate in MB/s (10^6 bytes per second).
    #[arg(long, requires = "disk_seek_us")]
    disk_mb_per_s: Option<f64>,
    /// Memory cache in bytes (LRU); 0: none, every GET reads the disk.
    /// Default: the trace's published per-node cache (--trace press:NAME or
    /// coop:NAME, scaled with the trace), else 0.
    #[arg(long)]
    cache_bytes: Option<u64>,
    /// Objects larger than this are not cached (default: the whole cache).
    #[arg(long)]
    cache_max_object_bytes: Option<u64>,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long)]
    cpu: Option<usize>,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
}

/// The content, and the per-node cache its trace publishes (if any).
fn file_set(args: &OriginArgs) -> Result<(FileSet, Option<u64>)> {
    if let Some(root) = &args.root {
        return Ok((FileSet::Root(root.clone()), None));
    }
    if let Some(list) = &args.files {
        return Ok((FileSet::Synthetic(SyntheticSet::from_list_file(list)?), None));
    }
    let Some(name) = &args.trace else { bail!("one of --root, --files or --trace is needed") };
    let trace = TraceSpec::parse(name, args.alpha, args.docs)?
        .build(args.seed)
        .with_context(|| format!("building trace {name}"))?;
    let objects = trace.documents().iter().map(|document| (document.path(), document.size_bytes));
    let files = SyntheticSet::new(objects).with_context(|| format!("trace {name}'s documents"))?;
    Ok((FileSet::Synthetic(files), trace.cache_bytes_per_node()))
}

fn disk(args: &OriginArgs) -> Result<Option<DiskModel>> {
    let (Some(seek_us), Some(mb_per_s)) = (args.disk_seek_us, args.disk_mb_per_s) else { return Ok(None) };
    if !(mb_per_s.is_finite() && mb_per_s > 0.0) {
        bail!("--disk-mb-per-s must be a positive number (got {mb_per_s})");
    }
    let bytes_per_s = (mb_per_s * 1e6).round();
    if bytes_per_s < 1.0 || bytes_per_s > u64::MAX as f64 {
        bail!("--disk-mb-per-s {mb_per_s} is out of range");
    }
    let seek_ns = seek_us.checked_mul(1_000).context("--disk-seek-us is out of range")?;
    Ok(Some(DiskModel::new(seek_ns, bytes_per_s as u64)?))
}

fn last_modified(text: Option<&str>) -> Result<SystemTime> {
    match text {
        None => Ok(tierstack_origin::synthetic_last_modified_default()),
        Some("start") => Ok(tierstack_base::time::system_now()),
        Some(date) => tierstack_origin::parse_http_date(date)
            .with_context(|| format!("--last-modified {date:?}: expected an HTTP-date or `start`")),
    }
}

pub(crate) fn run(args: OriginArgs) -> Result<()> {
    if let Some(cpu) = args.cpu {
        pin_to_cpu(cpu)?;
    }
    let (files, trace_cache_bytes) = file_set(&args)?;
    let mut config = OriginConfig::new(args.listen, files);
    config.admin_listen = args.admin;
    config.cache_control = Some(args.cache_control.clone());
    config.synthetic_last_modified = last_modified(args.last_modified.as_deref())?;
    config.storage = StorageConfig {
        cache_bytes: args.cache_bytes.or(trace_cache_bytes).unwrap_or(0),
        cache_max_object_bytes: args.cache_max_object_bytes,
        disk: disk(&args)?,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads.max(1)).enable_all().build()?;
    runtime.block_on(async {
        let origin = Origin::bind(config).await?;
        let stats = origin.stats();
        eprintln!(
            "tierstack origin: serving http://{}{}",
            origin.local_addr()?,
            origin.admin_addr().map(|admin| format!(", stats at http://{admin}/stats")).unwrap_or_default()
        );
        let stop = Stop::new();
        let signals = args.service.stop_signals()?;
        let serving = tokio::spawn(origin.run(stop.clone()));
        crate::service::announce_ready()?;
        signals.wait().await;
        stop.stop();
        crate::service::drain(serving, args.service.grace(), "origin").await?;
        println!("{}", serde_json::to_string(&stats.snapshot())?);
        std::io::stdout().flush()?;
        Ok(())
    })
}
