//! Which upstream a forward goes to: by the path's hash, or by the
//! balancer fed with the upstreams' load (and, with a site, their roles),
//! with the guards that tell the balancer when a forward ended.

use crate::state::State;
use crate::stats::elapsed_ns;
use hyper::{Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tierstack_base::host_monotonic_ns;
use tierstack_monitor::balance::fnv1a;
use tierstack_monitor::reconfig::{read_role, RoleStamp};
use tierstack_monitor::{Balancer, Decision, LoadSource, Scheme};
use tierstack_tier_http::{text, Body};

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
    /// Chooses the upstream for `key`, never one in `avoid` (upstreams
    /// that refused this request's connection), or the response refusing it.
    pub(crate) async fn route(&self, key: &str, avoid: &[usize]) -> Result<Routed<'_>, Response<Body>> {
        let upstreams = self.upstreams.len();
        let Some(balancing) = self.balancing.get() else {
            // FNV-1a: stable across runs, so a document keeps its upstream;
            // past an avoided one, the next in order.
            let first = (fnv1a(key) % upstreams as u64) as usize;
            let Some(index) = (0..upstreams).map(|k| (first + k) % upstreams).find(|i| !avoid.contains(i)) else {
                return Err(text(StatusCode::BAD_GATEWAY, "every application server refused the connection\n"));
            };
            return Ok(self.routed(Routed { index, balancer: None, stamp: None }));
        };
        if let Some(source) = &balancing.source {
            let started = tierstack_base::time::instant_now();
            let readings = read_loads(source).await;
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
        let decision = match balancer.choose(key) {
            // The balancer's choice refused this request's connection: the
            // next upstream in order that is eligible (of this site, if any).
            Decision::Route(chosen) if avoid.contains(&chosen) => {
                let eligible = |i: &usize| {
                    !avoid.contains(i)
                        && self.site.get().is_none_or(|site| {
                            stamps.get(*i).copied().flatten().is_some_and(|stamp| stamp.site == site.site)
                        })
                };
                match (1..upstreams).map(|k| (chosen + k) % upstreams).find(eligible) {
                    Some(index) => Decision::Route(index),
                    None => {
                        return Err(text(StatusCode::BAD_GATEWAY, "every application server refused the connection\n"))
                    }
                }
            }
            decision => decision,
        };
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
            Decision::NoBackend => {
                self.counters.refused_no_backend.fetch_add(1, Ordering::Relaxed);
                Err(text(StatusCode::SERVICE_UNAVAILABLE, "no application server is alive\n"))
            }
        }
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

/// Every upstream's load as `source` reads it. Socket-Sync asks each back
/// end over TCP and waits for its answer: on a blocking thread, so the
/// proxy's other requests go on. The other schemes return at once (the
/// latest pushed frame, or a one-sided read of registered memory).
async fn read_loads(source: &Arc<dyn LoadSource>) -> Vec<tierstack_monitor::Reading> {
    let read_all = |source: &dyn LoadSource| (0..source.len()).map(|i| source.read(i)).collect::<Vec<_>>();
    if source.scheme() == Scheme::SocketSync {
        let source = source.clone();
        let readings: Result<Vec<_>, _> = tokio::task::spawn_blocking(move || read_all(source.as_ref())).await;
        readings.unwrap_or_default()
    } else {
        read_all(source.as_ref())
    }
}
