//! The run: checks the configuration ([`crate::config`]), starts the load
//! (closed-loop workers or the open-loop dispatcher, [`crate::loops`], each
//! request sent and counted by [`crate::client`]) and the updater
//! ([`crate::updater`]), stops them at the deadline or on shutdown, and
//! assembles the report from their tallies and the online checker
//! ([`crate::tally`]).

use crate::client::Client;
use crate::config::{LoadConfig, Plan};
use crate::loops::{closed_loop, OpenLoopDriver};
use crate::record::RecordLog;
use crate::report::{
    IncarnationSeen, LoadReport, LoadShape, OpenLoopSummary, SecondPoint, StaleExample, TargetCounts, UpdateSummary,
};
use crate::staleness;
use crate::tally::{CheckState, LiveStats, Shared, WorkerTally};
use crate::updater::{UpdateTally, Updater, UPDATER_SEED_SALT};
use crate::LoadError;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::{Clock, SystemClock};
use tierstack_stats::percentile;
use tokio::sync::watch;
use tokio::time::Instant;

/// Runs a load to completion (duration or request count).
pub async fn run(config: LoadConfig) -> Result<LoadReport, LoadError> {
    run_with(config, Arc::new(LiveStats::default()), std::future::pending()).await
}

/// Runs a load, publishing progress to `live`, and stopping early when
/// `shutdown` completes (e.g. on Ctrl-C). Requests in flight at the stop are
/// abandoned and not counted (see [`LoadReport::abandoned`]); an update in
/// flight is finished.
pub async fn run_with<F>(config: LoadConfig, live: Arc<LiveStats>, shutdown: F) -> Result<LoadReport, LoadError>
where
    F: Future<Output = ()> + Send,
{
    let plan = Plan::validate(&config)?;
    let clock = SystemClock;
    // The open loop keeps its schedule on `started` and measures latencies
    // from `run_start_ns`; reading the clock first keeps every request's
    // send time at or after its scheduled time on both.
    let run_start_ns = clock.now_ns();
    let started = Instant::now();
    let shared = Arc::new(Shared {
        state: Mutex::new(CheckState::default()),
        live,
        records_taken: AtomicU64::new(0),
        budget_used: AtomicU64::new(0),
        run_start_ns,
    });
    // `stop` ends the requests in flight (deadline or shutdown); `halt` only
    // stops the open loop's dispatching early (shutdown), so that a run with a
    // duration dispatches exactly the points scheduled before its deadline.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (halt_tx, halt_rx) = watch::channel(false);
    let client = Arc::new(Client::new(&config, &plan, shared.clone()));

    let mut load = match config.open_loop {
        None => tokio::spawn(closed_loop(client.clone(), stop_rx.clone())),
        Some(open) => {
            let driver = OpenLoopDriver { client: client.clone(), open, started, stop: stop_rx.clone(), halt: halt_rx };
            tokio::spawn(driver.run())
        }
    };
    let updater = match &plan.update_target {
        Some(endpoint) if config.update_interval_ms > 0 && !config.trace.documents().is_empty() => {
            let u = Updater {
                endpoint: endpoint.clone(),
                trace: config.trace.clone(),
                shared: shared.clone(),
                stop: stop_rx.clone(),
                interval: Duration::from_millis(config.update_interval_ms),
                timeout: Duration::from_millis(config.request_timeout_ms),
                seed: config.seed ^ UPDATER_SEED_SALT,
            };
            Some(tokio::spawn(u.run()))
        }
        _ => None,
    };

    // Stop at the deadline or on shutdown, whichever comes first; the load
    // also ends by itself when the request budget is spent.
    let deadline = config.duration_ms.map(|ms| started + Duration::from_millis(ms));
    tokio::pin!(shutdown);
    let stop_timer = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop_timer);
    let joined = tokio::select! {
        joined = &mut load => joined,
        _ = &mut stop_timer => { let _ = stop_tx.send(true); (&mut load).await }
        _ = &mut shutdown => {
            let _ = halt_tx.send(true);
            let _ = stop_tx.send(true);
            (&mut load).await
        }
    };
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    let update_tally = match updater {
        Some(handle) => Some(handle.await.map_err(|_| LoadError::TaskFailed("updater"))?),
        None => None,
    };
    let total = joined.map_err(|_| LoadError::TaskFailed("load"))??;
    Ok(assemble(&config, &plan, &shared, total, update_tally, elapsed))
}

fn assemble(
    config: &LoadConfig,
    plan: &Plan,
    shared: &Shared,
    mut total: WorkerTally,
    updates: Option<UpdateTally>,
    elapsed: Duration,
) -> LoadReport {
    let elapsed_s = elapsed.as_secs_f64();
    let mut st = shared.lock();
    let state = std::mem::take(&mut *st);
    drop(st);
    let summary = state.checker.finish();
    shared.live.stale.store(summary.stale, Ordering::Relaxed);
    let paths: Vec<String> = config.trace.documents().iter().map(|d| d.path()).collect();
    let incarnations = state
        .incarnations
        .iter()
        .map(|(&(node, epoch), &(responses_checked, updates))| IncarnationSeen {
            node,
            incarnation: format!("{:016x}", state.keys.incarnation(node, epoch).unwrap_or_default()),
            epoch,
            responses_checked,
            updates,
        })
        .collect();
    let stale_examples = summary
        .examples
        .iter()
        .map(|f| StaleExample {
            path: paths.get(f.doc as usize).cloned().unwrap_or_default(),
            key: state.keys.name(f.key).to_string(),
            served_version: f.served.version,
            served_epoch: f.served.epoch,
            newer_version: f.newer.version,
            newer_epoch: f.newer.epoch,
            response_start_ns: f.response_start_ns,
            update_end_ns: f.update_end_ns,
        })
        .collect();

    let hit_rate = |hits: u64, misses: u64| (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64);
    let last = total.seconds.len().saturating_sub(1);
    let series = total
        .seconds
        .iter()
        .enumerate()
        .map(|(s, t)| {
            let span_s = if s == last { (elapsed_s - s as f64).clamp(1e-3, 1.0) } else { 1.0 };
            SecondPoint {
                second: s as u32,
                ok: t.ok,
                hits: t.hits,
                misses: t.misses,
                errors: t.errors,
                throughput_rps: t.ok as f64 / span_s,
                hit_rate: hit_rate(t.hits, t.misses),
            }
        })
        .collect();

    let update_summary = match updates {
        Some(mut u) => {
            u.latencies_ns.sort_unstable();
            UpdateSummary {
                target: plan.update_target.as_ref().map(|e| e.url.clone()),
                interval_ms: config.update_interval_ms,
                attempted: u.attempted,
                done: u.done,
                errors: u.errors,
                p50_ns: percentile(&u.latencies_ns, 50.0),
                p99_ns: percentile(&u.latencies_ns, 99.0),
            }
        }
        None => UpdateSummary::default(),
    };

    let records_kept = total.records.len() as u64;
    let records_dropped = total.records_dropped;
    let (records, stale_offline) = if config.keep_records {
        total.records.sort_by_key(|r| r.start_ns);
        let offline =
            (records_dropped == 0).then(|| staleness::find_stale(&total.records, &state.updates).len() as u64);
        let log = RecordLog {
            documents: paths,
            keys: state.keys,
            responses: std::mem::take(&mut total.records),
            updates: state.updates,
            responses_dropped: records_dropped,
        };
        (Some(log), offline)
    } else {
        (None, None)
    };

    let per_target: Vec<TargetCounts> = plan
        .targets
        .iter()
        .enumerate()
        .map(|(i, e)| TargetCounts {
            target: e.url.clone(),
            requests: total.target_requests.get(i).copied().unwrap_or(0),
            connections_opened: total.target_connections.get(i).copied().unwrap_or(0),
        })
        .collect();
    let shape = LoadShape {
        target_choice: config.target_choice,
        new_connection_per_request: config.new_connection_per_request,
        static_content: config.static_content,
        open_loop: config.open_loop.map(|o| OpenLoopSummary {
            rate_rps: o.rate_rps,
            arrivals: o.arrivals,
            streams: config.connections,
            max_in_flight: o.max_in_flight,
            max_dispatch_lag_ns: total.max_dispatch_lag_ns,
        }),
    };

    LoadReport {
        trace: config.trace.summary(),
        targets: plan.targets.iter().map(|e| e.url.clone()).collect(),
        connections: config.connections,
        seed: config.seed,
        shape,
        start_ns: shared.run_start_ns,
        elapsed_s,
        requests: total.requests,
        issued: total.issued,
        abandoned: total.abandoned,
        connections_opened: total.target_connections.iter().sum(),
        per_target,
        checked_ok: total.checked_ok,
        bodies_checked: total.bodies_checked,
        ok: total.ok,
        throughput_rps: if elapsed_s > 0.0 { total.ok as f64 / elapsed_s } else { 0.0 },
        latency: total.latency.summary(),
        bytes: total.bytes,
        cache_hits: total.hits,
        cache_misses: total.misses,
        hit_rate: hit_rate(total.hits, total.misses),
        errors: total.errors,
        updates: update_summary,
        checked_responses: summary.checked,
        stale_responses: summary.stale,
        stale_responses_offline: stale_offline,
        stale_examples,
        check_error_examples: std::mem::take(&mut total.check_error_examples),
        incarnations,
        series,
        records_kept,
        records_dropped,
        records,
    }
}
