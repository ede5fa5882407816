//! `tierstack press-node`: one PRESS cluster node (glue over
//! `tierstack-press-node`). Prints `ready` once it serves, serves until its
//! standard input closes, Ctrl-C or SIGTERM, then prints its counters as one
//! JSON line.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tierstack_origin::{DiskModel, StorageConfig, SyntheticSet};
use tierstack_press::{LardConfig, Member, PolicyConfig};
use tierstack_press_node::dispatcher::{Dispatcher, DispatcherConfig};
pub(crate) use tierstack_press_node::{DispatcherArgs, PressNodeArgs};
use tierstack_press_node::{NodeConfig, PressNode};
use tierstack_tier_http::observe::ServingFlag;
use tierstack_workload::TraceSpec;

pub(crate) fn run_dispatcher(args: DispatcherArgs) -> Result<()> {
    let config = DispatcherConfig {
        listen: args.listen,
        admin: args.admin,
        backends: args.backends,
        dir: args.handoff_dir,
        lard: LardConfig { t_low: args.t_low, t_high: args.t_high },
    };
    serve_until_stopped(args.threads, &args.service, ServingFlag::new(), async {
        let dispatcher = Dispatcher::start(config).await?;
        eprintln!(
            "tierstack press-dispatcher: serving http://{}{}",
            dispatcher.local_addr(),
            stats_at(dispatcher.admin_addr())
        );
        Ok(move || dispatcher.stop())
    })
}

/// `, stats at http://…/stats` for a server with an admin listener.
fn stats_at(admin: Option<SocketAddr>) -> String {
    admin.map(|a| format!(", stats at http://{a}/stats")).unwrap_or_default()
}

/// Runs a PRESS server on `threads` runtime threads: `start` starts it and
/// returns how to stop it; once it serves, `ready` is printed and `serving`
/// set; at a stop signal it is stopped and its counters printed as one
/// JSON line.
fn serve_until_stopped<Stop, Stats>(
    threads: usize,
    service: &crate::service::ServiceArgs,
    serving: ServingFlag,
    start: impl std::future::Future<Output = Result<Stop>>,
) -> Result<()>
where
    Stop: FnOnce() -> Stats,
    Stats: serde::Serialize,
{
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all().build()?;
    runtime.block_on(async {
        let signals = service.stop_signals()?;
        let stop = start.await?;
        crate::service::announce_ready()?;
        serving.set(true);
        signals.wait().await;
        serving.set(false);
        println!("{}", serde_json::to_string(&stop())?);
        std::io::stdout().flush()?;
        Ok(())
    })
}

fn disk(args: &PressNodeArgs) -> Result<Option<DiskModel>> {
    let (Some(seek_us), Some(mb_per_s)) = (args.disk_seek_us, args.disk_mb_per_s) else { return Ok(None) };
    if !(mb_per_s.is_finite() && mb_per_s > 0.0 && mb_per_s * 1e6 < u64::MAX as f64) {
        bail!("--disk-mb-per-s must be a positive number (got {mb_per_s})");
    }
    let seek_ns = seek_us.checked_mul(1_000).context("--disk-seek-us is out of range")?;
    Ok(Some(DiskModel::new(seek_ns, (mb_per_s * 1e6).round().max(1.0) as u64)?))
}

/// The memory cache of a node serving a root (no trace) unless told otherwise.
const ROOT_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// The served directory: `--root`, with the trace's set written into it
/// if one is given; or, for a trace alone, a directory per trace under the
/// temporary directory (written once, kept for the next run).
fn root_dir(args: &PressNodeArgs, trace: Option<(&str, &tierstack_workload::Trace)>) -> Result<std::path::PathBuf> {
    let dir = match (&args.root, trace) {
        (Some(root), _) => root.clone(),
        (None, Some((spec, _))) => {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (spec, args.alpha.to_bits(), args.docs, args.seed).hash(&mut hasher);
            std::env::temp_dir().join(format!("tierstack-press-set-{:016x}", hasher.finish()))
        }
        (None, None) => bail!("press-node needs --root or --trace"),
    };
    if let Some((spec, trace)) = trace {
        let objects = trace.documents().iter().map(|document| (document.path(), document.size_bytes));
        // Checked as the origin checks a set (sizes, paths) before writing.
        SyntheticSet::new(objects.clone()).with_context(|| format!("trace {spec}'s documents"))?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mtime = tierstack_origin::synthetic_last_modified_default();
        let written = tierstack_press_node::files::write_set(&dir, objects, mtime, tierstack_origin::synthetic_body)
            .with_context(|| format!("writing trace {spec}'s files under {}", dir.display()))?;
        if written > 0 {
            eprintln!("tierstack press-node: wrote {written} files of {spec} under {}", dir.display());
        }
    }
    Ok(dir)
}

pub(crate) fn run(args: PressNodeArgs) -> Result<()> {
    let trace = match &args.trace {
        None => None,
        Some(spec) => Some(
            TraceSpec::parse(spec, args.alpha, args.docs)?
                .build(args.seed)
                .with_context(|| format!("building trace {spec}"))?,
        ),
    };
    let dir = root_dir(&args, args.trace.as_deref().zip(trace.as_ref()))?;
    let root = tierstack_press_node::files::Root::open(&dir).with_context(|| format!("serving {}", dir.display()))?;
    let cache_default = match &trace {
        Some(trace) => trace.cache_bytes_per_node().unwrap_or(0),
        None => ROOT_CACHE_BYTES_DEFAULT,
    };
    let (topology, fabric) = args.node.open()?;
    let nodes = topology.node_ids();
    let me = u16::try_from(args.node.node).context("node id too large for PRESS")?;
    if nodes.iter().enumerate().any(|(i, id)| id.0 as usize != i) {
        bail!("a PRESS topology names its nodes 0, 1, … in order");
    }
    let config = NodeConfig {
        listen: args.listen,
        admin: args.admin,
        me: Member(me),
        nodes: nodes.len(),
        mode: args.mode,
        transport: args.transport,
        policy: PolicyConfig { max_size_bytes: args.max_size_bytes, threshold: args.threshold },
        storage: StorageConfig {
            cache_bytes: args.cache_bytes.unwrap_or(cache_default),
            cache_max_object_bytes: None,
            disk: disk(&args)?,
        },
        root,
        forward_timeout: Duration::from_millis(args.forward_timeout_ms),
        breaker_cool_down: Duration::from_millis(args.breaker_cool_down_ms),
        window: args.window,
        send_inline: args.send_inline,
        handoff_dir: args.handoff_dir.clone(),
        limits: args.limits.serve_options(),
    };
    let serving = ServingFlag::new();
    serve_until_stopped(args.threads, &args.service, serving.clone(), async {
        let node = PressNode::start(config, fabric).await?;
        let observer = args.observe.start(node.observed(serving))?;
        eprintln!(
            "tierstack press-node: node {me} serving http://{}{}",
            node.local_addr(),
            stats_at(node.admin_addr())
        );
        Ok(move || {
            drop(observer);
            node.stop()
        })
    })
}
