//! The two ways requests are issued: the closed loop (`connections`
//! workers, one request in flight each) and the open loop's dispatcher
//! (requests at the schedule's times, on pooled or new connections, at most
//! `max_in_flight` at once).

use crate::arrival::{stream_of, ArrivalSchedule};
use crate::client::{Client, Outcome, Request};
use crate::config::{OpenLoop, CONNECT_BACKOFF_MS_MAX, CONNECT_BACKOFF_MS_MIN};
use crate::http::Connection;
use crate::tally::WorkerTally;
use crate::LoadError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tierstack_workload::{RequestStream, TargetChooser};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The closed loop: `connections` workers, each with one request in flight.
pub(crate) async fn closed_loop(client: Arc<Client>, stop: watch::Receiver<bool>) -> Result<WorkerTally, LoadError> {
    let workers: Vec<_> = (0..client.config.connections)
        .map(|w| {
            let (requests, targets) = client.streams(w);
            let worker = Worker { client: client.clone(), index: w, requests, targets, stop: stop.clone() };
            tokio::spawn(worker.run())
        })
        .collect();
    let mut total = WorkerTally::default();
    for handle in workers {
        total.merge(handle.await.map_err(|_| LoadError::TaskFailed("worker"))?);
    }
    Ok(total)
}

/// A closed-loop worker.
pub(crate) struct Worker {
    pub(crate) client: Arc<Client>,
    pub(crate) index: usize,
    pub(crate) requests: RequestStream,
    pub(crate) targets: TargetChooser,
    pub(crate) stop: watch::Receiver<bool>,
}

impl Worker {
    pub(crate) async fn run(mut self) -> WorkerTally {
        let client = self.client.clone();
        let mut tally = WorkerTally::default();
        // At most one persistent connection per target.
        let mut connections: Vec<Option<Connection>> = client.targets.iter().map(|_| None).collect();
        let mut backoff_ms = CONNECT_BACKOFF_MS_MIN;
        let mut position = 0u64;
        loop {
            if *self.stop.borrow() {
                break;
            }
            if let Some(max) = client.config.requests_max {
                if client.shared.budget_used.fetch_add(1, Ordering::Relaxed) >= max {
                    break;
                }
            }
            // Exactly one document and one target per request.
            let (Some(doc), Some(target)) = (self.requests.next(), self.targets.next()) else { break };
            let request = Request { doc, target, stream: self.index, position, scheduled_ns: None };
            position += 1;
            tally.issued += 1;
            let Some(slot) = connections.get_mut(target) else {
                // Unreachable: the chooser yields indices below the target count.
                tally.abandoned += 1;
                break;
            };
            let (attempt, reusable) = tokio::select! {
                _ = self.stop.changed() => {
                    tally.abandoned += 1;
                    break;
                }
                r = client.attempt(slot.take(), &request) => r,
            };
            *slot = reusable;
            let connect_failed = matches!(attempt.outcome, Outcome::ConnectFailed { .. });
            client.settle(&mut tally, &request, attempt);
            if connect_failed {
                tokio::select! {
                    _ = self.stop.changed() => break,
                    _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                }
                backoff_ms = (backoff_ms * 2).min(CONNECT_BACKOFF_MS_MAX);
            } else {
                backoff_ms = CONNECT_BACKOFF_MS_MIN;
            }
        }
        tally
    }
}

/// Idle persistent connections of the open loop, per target.
struct Pool {
    pub(crate) idle: Mutex<Vec<Vec<Connection>>>,
}

impl Pool {
    pub(crate) fn new(targets: usize) -> Self {
        Self { idle: Mutex::new((0..targets).map(|_| Vec::new()).collect()) }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Vec<Connection>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn take(&self, target: usize) -> Option<Connection> {
        self.lock().get_mut(target)?.pop()
    }

    pub(crate) fn put(&self, target: usize, conn: Connection) {
        if let Some(idle) = self.lock().get_mut(target) {
            idle.push(conn);
        }
    }
}

/// Decrements the in-flight count when a request task ends, however it ends.
struct InFlight(pub(crate) Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open loop's dispatcher.
pub(crate) struct OpenLoopDriver {
    pub(crate) client: Arc<Client>,
    pub(crate) open: OpenLoop,
    /// The instant the schedule counts from.
    pub(crate) started: Instant,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) halt: watch::Receiver<bool>,
}

impl OpenLoopDriver {
    pub(crate) async fn run(mut self) -> Result<WorkerTally, LoadError> {
        let client = self.client.clone();
        let config = &client.config;
        let run_start_ns = client.shared.run_start_ns;
        let streams = config.connections;
        let mut sources: Vec<(RequestStream, TargetChooser, u64)> = (0..streams)
            .map(|w| {
                let (requests, targets) = client.streams(w);
                (requests, targets, 0)
            })
            .collect();
        let tally = Arc::new(Mutex::new(WorkerTally::default()));
        let pool = Arc::new(Pool::new(client.targets.len()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let mut panicked = false;
        let (mut issued, mut max_lag_ns) = (0u64, 0u64);
        let duration_ns = config.duration_ms.map(|ms| ms.saturating_mul(1_000_000));
        let schedule = ArrivalSchedule::new(self.open.arrivals, self.open.rate_rps, config.seed);
        for (k, offset_ns) in (0u64..).zip(schedule) {
            if duration_ns.is_some_and(|d| offset_ns >= d) || config.requests_max.is_some_and(|max| k >= max) {
                break;
            }
            let due = self.started + Duration::from_nanos(offset_ns);
            if due > Instant::now() {
                tokio::select! {
                    _ = self.halt.changed() => break,
                    _ = tokio::time::sleep_until(due) => {}
                }
            } else if *self.halt.borrow() {
                break;
            }
            max_lag_ns = max_lag_ns.max(Instant::now().saturating_duration_since(due).as_nanos() as u64);
            let w = stream_of(k, streams);
            let Some((requests, targets, position)) = sources.get_mut(w) else { break };
            let (Some(doc), Some(target)) = (requests.next(), targets.next()) else { break };
            let scheduled_ns = run_start_ns + offset_ns;
            let request = Request { doc, target, stream: w, position: *position, scheduled_ns: Some(scheduled_ns) };
            *position += 1;
            issued += 1;
            while let Some(joined) = tasks.try_join_next() {
                panicked |= joined.is_err();
            }
            if in_flight.load(Ordering::Relaxed) >= self.open.max_in_flight {
                let mut t = lock_tally(&tally);
                t.errors.over_max_in_flight += 1;
                client.error_at(&mut t, target, scheduled_ns);
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            let guard = InFlight(in_flight.clone());
            let task = (client.clone(), pool.clone(), tally.clone(), self.stop.clone());
            tasks.spawn(open_loop_request(task, request, guard));
        }
        // A run with a duration lasts until its deadline (the `stop`), so
        // that its throughput is over the whole duration.
        if duration_ns.is_some() {
            let _ = self.stop.wait_for(|stopped| *stopped).await;
        }
        while let Some(joined) = tasks.join_next().await {
            panicked |= joined.is_err();
        }
        if panicked {
            return Err(LoadError::TaskFailed("request"));
        }
        let mut total = std::mem::take(&mut *lock_tally(&tally));
        total.issued = issued;
        total.max_dispatch_lag_ns = max_lag_ns;
        Ok(total)
    }
}

fn lock_tally(tally: &Mutex<WorkerTally>) -> MutexGuard<'_, WorkerTally> {
    tally.lock().unwrap_or_else(|p| p.into_inner())
}

/// One open-loop request, on an idle pooled connection or a new one.
async fn open_loop_request(
    (client, pool, tally, mut stop): (Arc<Client>, Arc<Pool>, Arc<Mutex<WorkerTally>>, watch::Receiver<bool>),
    request: Request,
    _in_flight: InFlight,
) {
    let conn = if client.config.new_connection_per_request { None } else { pool.take(request.target) };
    let attempt = tokio::select! {
        _ = stop.wait_for(|stopped| *stopped) => None,
        r = client.attempt(conn, &request) => Some(r),
    };
    let mut t = lock_tally(&tally);
    match attempt {
        None => t.abandoned += 1,
        Some((attempt, reusable)) => {
            client.settle(&mut t, &request, attempt);
            drop(t);
            if let Some(conn) = reusable {
                pool.put(request.target, conn);
            }
        }
    }
}
