//! The updater: one random document changed every `update_interval_ms`,
//! each update registered with the online checker before it is sent.

use crate::http::{Connection, Endpoint};
use crate::record::{DepsState, UpdateRecord};
use crate::report::ErrorCounts;
use crate::tally::{classify_deps, Shared};
use http::Method;
use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::{seeded_rng, Clock, SystemClock};
use tierstack_workload::Trace;
use tokio::sync::watch;
use tokio::time::Instant;

/// Salt separating the updater's random stream from the workers'.
pub(crate) const UPDATER_SEED_SALT: u64 = 0x7570_6461_7465_7221; // "updater!"

pub(crate) struct Updater {
    pub(crate) endpoint: Endpoint,
    pub(crate) trace: Trace,
    pub(crate) shared: Arc<Shared>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) seed: u64,
}

#[derive(Default)]
pub(crate) struct UpdateTally {
    pub(crate) attempted: u64,
    pub(crate) done: u64,
    pub(crate) errors: ErrorCounts,
    pub(crate) latencies_ns: Vec<u64>,
}

impl Updater {
    pub(crate) async fn run(mut self) -> UpdateTally {
        let mut tally = UpdateTally::default();
        let clock = SystemClock;
        let mut rng = seeded_rng(self.seed);
        let paths: Vec<String> = self.trace.documents().iter().map(|d| d.path()).collect();
        let mut conn: Option<Connection> = None;
        let mut next = Instant::now() + self.interval;
        loop {
            tokio::select! {
                _ = self.stop.changed() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            // One update per interval; if one ran long, do not burst to catch up.
            next = (next + self.interval).max(Instant::now());
            let doc = rng.gen_range(0..paths.len());
            tally.attempted += 1;
            if conn.is_none() {
                match tokio::time::timeout(self.timeout, Connection::open(&self.endpoint)).await {
                    Ok(Ok(c)) => conn = Some(c),
                    _ => {
                        tally.errors.connect += 1;
                        continue;
                    }
                }
            }
            let Some(connection) = conn.as_mut() else { continue };
            if !matches!(tokio::time::timeout(self.timeout, connection.ready()).await, Ok(Ok(()))) {
                conn = None;
                tally.errors.io += 1;
                continue;
            }
            // Register before sending (see the staleness module), then send;
            // the exchange is not raced with `stop`: an update in flight is
            // finished so the checker learns its outcome.
            let start_ns = clock.now_ns();
            let ticket = self.shared.lock().checker.update_started(start_ns);
            let result =
                tokio::time::timeout(self.timeout, connection.exchange(Method::PUT, &paths[doc], false, false)).await;
            let end_ns = clock.now_ns();
            let exchange = match result {
                Ok(Ok(ex)) => ex,
                Ok(Err(_)) | Err(_) => {
                    conn = None;
                    match result {
                        Err(_) => tally.errors.timeout += 1,
                        _ => tally.errors.io += 1,
                    }
                    self.shared.lock().checker.update_finished(ticket, None);
                    continue;
                }
            };
            if exchange.close {
                conn = None;
            }
            if !exchange.status.is_success() {
                match exchange.status.as_u16() {
                    400..=499 => tally.errors.status_4xx += 1,
                    500..=599 => tally.errors.status_5xx += 1,
                    _ => tally.errors.status_other += 1,
                }
                self.shared.lock().checker.update_finished(ticket, None);
                continue;
            }
            let (state, parsed) = classify_deps(exchange.deps.as_deref());
            let mut st = self.shared.lock();
            match parsed {
                Some(parsed) => {
                    let deps = st.update_done(&parsed);
                    st.checker.update_finished(ticket, Some((end_ns, &deps)));
                    self.shared.live.stale.store(st.checker.summary().stale, Ordering::Relaxed);
                    st.updates.push(UpdateRecord {
                        start_ns,
                        end_ns,
                        doc: doc as u32,
                        status: exchange.status.as_u16(),
                        deps,
                    });
                    drop(st);
                    tally.done += 1;
                    tally.latencies_ns.push(end_ns.saturating_sub(start_ns));
                    self.shared.live.updates.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    st.checker.update_finished(ticket, None);
                    drop(st);
                    if state == DepsState::Missing {
                        tally.errors.missing_deps += 1;
                    } else {
                        tally.errors.malformed_deps += 1;
                    }
                }
            }
        }
        tally
    }
}
