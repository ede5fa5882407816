//! `tierstack origin`: a static web server with an emulated disk (glue over
//! `tierstack-origin`). Prints `ready` once it serves, serves as a service
//! (`crate::service`: until SIGTERM or SIGINT, or its standard input's end
//! with `--stop-on-stdin-eof`), then prints its counters as one JSON line.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::time::SystemTime;
use tierstack_cluster::pin_to_cpu;
pub(crate) use tierstack_origin::OriginArgs;
use tierstack_origin::{DiskModel, FileSet, Origin, OriginConfig, StorageConfig, SyntheticSet};
use tierstack_tier_http::Stop;
use tierstack_workload::TraceSpec;

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
    config.limits = args.limits.serve_options();
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
