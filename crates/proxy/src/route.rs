//! Which upstream a forward goes to: by the path's hash, or by the
//! balancer fed with the upstreams' load (and, with a site, their roles),
//! with the guards that tell the balancer when a forward ended, and the
//! passive health check ([`FailureGate`]: upstreams paused after failed
//! forwards, avoided while another is usable).

use crate::state::State;
use crate::stats::elapsed_ns;
use hyper::{Response, StatusCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_base::host_monotonic_ns;
use tierstack_monitor::balance::fnv1a;
use tierstack_monitor::reconfig::{read_role, RoleStamp};
use tierstack_monitor::{Balancer, Decision, FailureConfig, Failures, Health, LoadSource, Reading};
use tierstack_tier_http::{text, Body};

/// [`Failures`] behind a lock taken only when something failed: while no
/// upstream has a failure counted, a forward's success and the pause check
/// are a relaxed load each.
pub(crate) struct FailureGate {
    failures: Mutex<Failures>,
    /// Per upstream: a failure is counted (a success must clear it).
    counted: Vec<AtomicBool>,
    /// Per upstream: paused until this `host_monotonic_ns` (0: not paused).
    paused_until: Vec<AtomicU64>,
    timeout_ns: u64,
}

impl FailureGate {
    pub(crate) fn new(upstreams: usize, config: FailureConfig) -> Self {
        FailureGate {
            failures: Mutex::new(Failures::new(upstreams, config)),
            counted: (0..upstreams).map(|_| AtomicBool::new(false)).collect(),
            paused_until: (0..upstreams).map(|_| AtomicU64::new(0)).collect(),
            timeout_ns: u64::try_from(config.fail_timeout.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// A forward to `index` failed; true if that paused it.
    pub(crate) fn failed(&self, index: usize) -> bool {
        let now = host_monotonic_ns();
        let Ok(mut failures) = self.failures.lock() else { return false };
        let paused = failures.failed(index, now);
        if let Some(counted) = self.counted.get(index) {
            counted.store(true, Ordering::Relaxed);
        }
        if paused {
            if let Some(until) = self.paused_until.get(index) {
                until.store(now.saturating_add(self.timeout_ns), Ordering::Relaxed);
            }
        }
        paused
    }

    /// A forward to `index` got its response head.
    pub(crate) fn succeeded(&self, index: usize) {
        let Some(counted) = self.counted.get(index) else { return };
        if counted.swap(false, Ordering::Relaxed) {
            if let Ok(mut failures) = self.failures.lock() {
                failures.succeeded(index);
            }
        }
    }

    /// The upstreams paused now.
    pub(crate) fn paused(&self) -> Vec<usize> {
        let now = host_monotonic_ns();
        self.paused_until
            .iter()
            .enumerate()
            .filter(|(_, until)| until.load(Ordering::Relaxed) > now)
            .map(|(i, _)| i)
            .collect()
    }
}

/// The balancer and the load source feeding it
/// ([`crate::Proxy::set_balancing`]).
pub(crate) struct BalancingState {
    pub(crate) balancer: Mutex<Balancer>,
    pub(crate) source: Option<Arc<dyn LoadSource>>,
}

/// The upstream chosen for one request; tells the balancer the request
/// ended when dropped (also when the request's handling is cancelled).
pub(crate) struct Routed<'a> {
    pub(crate) index: usize,
    balancer: Option<&'a Mutex<Balancer>>,
    /// The upstream's role as read when routing (with a site).
    pub(crate) stamp: Option<RoleStamp>,
}

impl Drop for Routed<'_> {
    fn drop(&mut self) {
        if let Some(Ok(mut balancer)) = self.balancer.map(|b| b.lock()) {
            balancer.completed(self.index, host_monotonic_ns());
        }
    }
}

impl Routed<'_> {
    /// The same guard, owning its hold on the proxy (for a body relayed by
    /// a task of its own).
    pub(crate) fn detach(mut self, state: &Arc<State>) -> InFlight {
        let balanced = self.balancer.take().is_some();
        InFlight { index: self.index, state: balanced.then(|| state.clone()) }
    }
}

/// A [`Routed`] whose forward outlives the request's handler: tells the
/// balancer the forward ended when dropped.
pub(crate) struct InFlight {
    index: usize,
    /// Set only when the proxy balances.
    state: Option<Arc<State>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let balancer = self.state.as_ref().and_then(|state| state.balancing.get()).map(|b| b.balancer.lock());
        if let Some(Ok(mut balancer)) = balancer {
            balancer.completed(self.index, host_monotonic_ns());
        }
    }
}

impl State {
    /// Chooses the upstream for `key`, never one in `tried` (upstreams
    /// that already failed this request), and a paused one only when
    /// nothing else is left; or the response refusing the request.
    pub(crate) async fn route(&self, key: &str, tried: &[usize]) -> Result<Routed<'_>, Response<Body>> {
        let upstreams = self.upstreams.len();
        let paused = self.failures.paused();
        let mut avoid = tried.to_vec();
        avoid.extend(paused.iter().filter(|i| !tried.contains(i)));
        let every_upstream_failed = || text(StatusCode::BAD_GATEWAY, "every application server failed this request\n");
        let Some(balancing) = self.balancing.get() else {
            // FNV-1a: stable across runs, so a document keeps its upstream;
            // past an avoided one, the next in order.
            let first = (fnv1a(key) % upstreams as u64) as usize;
            let next_not_in =
                |avoid: &[usize]| (0..upstreams).map(|k| (first + k) % upstreams).find(|i| !avoid.contains(i));
            let Some(index) = next_not_in(&avoid).or_else(|| next_not_in(tried)) else {
                return Err(every_upstream_failed());
            };
            return Ok(self.routed(Routed { index, balancer: None, stamp: None }));
        };
        if let Some(source) = &balancing.source {
            let started = tierstack_base::time::instant_now();
            let readings = read_loads(source, None).await;
            self.counters.monitor_reads.fetch_add(readings.len() as u64, Ordering::Relaxed);
            self.counters.monitor_read_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
            let Ok(mut balancer) = balancing.balancer.lock() else { return Err(poisoned()) };
            for (index, reading) in readings.iter().enumerate() {
                balancer.observe(index, reading);
            }
        }
        // Each upstream's role, read one-sidedly: only this site's are
        // eligible, and the request carries the role it was routed by.
        let stamps: Vec<Option<RoleStamp>> = match self.site.get() {
            Some(site) => site
                .roles
                .iter()
                .map(|region| read_role(region.as_ref()).ok().map(|view| RoleStamp::of(view.role)))
                .collect(),
            None => Vec::new(),
        };
        let Ok(mut balancer) = balancing.balancer.lock() else { return Err(poisoned()) };
        if let Some(site) = self.site.get() {
            for (index, stamp) in stamps.iter().enumerate() {
                balancer.set_member(index, stamp.is_some_and(|s| s.site == site.site));
            }
        }
        let mut decision = balancer.choose_except(key, &avoid);
        if decision == Decision::NoBackend && avoid.len() > tried.len() {
            // Only paused upstreams are left: better than none.
            decision = balancer.choose_except(key, tried);
        }
        match decision {
            Decision::Route(index) => {
                balancer.dispatched(index, host_monotonic_ns());
                let stamp = stamps.get(index).copied().flatten();
                Ok(self.routed(Routed { index, balancer: Some(&balancing.balancer), stamp }))
            }
            Decision::Overloaded => {
                self.counters.refused_overloaded.fetch_add(1, Ordering::Relaxed);
                Err(text(StatusCode::SERVICE_UNAVAILABLE, "every application server is at its admission bound\n"))
            }
            Decision::NoBackend if !tried.is_empty() => Err(every_upstream_failed()),
            Decision::NoBackend => {
                self.counters.refused_no_backend.fetch_add(1, Ordering::Relaxed);
                Err(text(StatusCode::SERVICE_UNAVAILABLE, "no application server is alive\n"))
            }
        }
    }

    /// Whether upstream `index` is now known unable to answer (its load
    /// source says suspect or dead), for a forward waiting on it. `None`
    /// without a load source.
    pub(crate) async fn upstream_unresponsive(&self, index: usize) -> Option<bool> {
        let balancing = self.balancing.get()?;
        let source = balancing.source.as_ref()?;
        let reading = read_loads(source, Some(index)).await.into_iter().next()?;
        if let Ok(mut balancer) = balancing.balancer.lock() {
            balancer.observe(index, &reading);
        }
        Some(matches!(reading.health, Health::Suspect | Health::Dead))
    }

    fn routed<'a>(&self, routed: Routed<'a>) -> Routed<'a> {
        if let Some(count) = self.routed.get(routed.index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        routed
    }
}

fn poisoned() -> Response<Body> {
    text(StatusCode::INTERNAL_SERVER_ERROR, "the balancer's lock was poisoned\n")
}

/// Every upstream's load as `source` reads it (or only upstream `only`'s).
/// A read that may wait on the network (Socket-Sync asks each back end
/// over TCP; a fabric other than shm) runs on a blocking thread, so the
/// proxy's other requests go on; the others return at once (the latest
/// pushed frame, or a one-sided read of shared memory).
async fn read_loads(source: &Arc<dyn LoadSource>, only: Option<usize>) -> Vec<Reading> {
    let read = move |source: &dyn LoadSource| match only {
        Some(index) => vec![source.read(index)],
        None => (0..source.len()).map(|i| source.read(i)).collect::<Vec<_>>(),
    };
    if source.reads_wait_on_the_network() {
        let source = source.clone();
        let readings: Result<Vec<_>, _> = tokio::task::spawn_blocking(move || read(source.as_ref())).await;
        readings.unwrap_or_default()
    } else {
        read(source.as_ref())
    }
}
