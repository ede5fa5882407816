//! Fig. 1 of the PRESS paper, exactly, as a pure function over a node's view
//! of the cluster.
//!
//! ```text
//!  3. if (filesize(r.target) >= max_size) then serve r but do not cache; continue
//!  6. if (Servers[r.target] = ∅) then
//!  7.   add initial_node to Servers[r.target]; service_node <- initial_node
//!  9. else
//! 10.   if (initial_node ∈ Servers[r.target]) then service_node <- initial_node
//! 12.   else service_node <- {least loaded node in Servers[r.target]}
//! 14.   if (service_node.load > T) then
//! 15.     if (initial_node.load < T) then
//! 16.       add initial_node to Servers[r.target]; service_node <- initial_node
//! 18.     else
//! 19.       idle_node <- {least loaded node}
//! 20.       if (idle_node.load < T) then
//! 21.         add idle_node to Servers[r.target]; service_node <- idle_node
//! 23. if (service_node = initial_node) then serve r
//! 24. else forward r to service_node
//! ```
//!
//! Decisions (seed-notes c.1, c.7): lines 23–24 apply after both branches;
//! "overloaded" is `load > T` while the alternatives need `load < T` (the
//! paper's exact comparisons); ties go to the lowest node index; the
//! initial node's own load is exact, the others' are the last piggy-backed
//! values. Nodes the runtime declared dead are in no server set and are never
//! chosen as the idle node.

use crate::view::{ClusterView, Member};
use std::hash::Hash;

/// Files of this size or more are served by the initial node and never
/// cached ("size ≥ 256 KBytes in our prototype", §3.1).
pub const MAX_SIZE_BYTES: u64 = 256 * 1024;

/// The overload threshold `T` in open connections ("T = 256 in our
/// experiments", §3.1).
pub const THRESHOLD_DEFAULT: u32 = 256;

/// Fig. 1's two parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// `max_size`: files this large or larger bypass distribution and cache.
    pub max_size_bytes: u64,
    /// `T`: a node whose load is above it is overloaded.
    pub threshold: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig { max_size_bytes: MAX_SIZE_BYTES, threshold: THRESHOLD_DEFAULT }
    }
}

/// What the initial node does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Lines 3–5: serve locally and do not cache the file.
    ServeUncached,
    /// Line 23: serve locally (from the cache, or from the disk and cache it).
    ServeLocal,
    /// Line 24: forward to this node; its reply comes back later.
    Forward(Member),
}

/// Which line of Fig. 1 chose the service node: for tests, counters and the
/// simulator's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    /// Lines 3–5.
    Large,
    /// Lines 6–8: nobody caches the file.
    FirstRequest,
    /// Lines 10–11 (and not overloaded): the initial node caches it.
    InitialCaches,
    /// Line 13 (and not overloaded): the least loaded caching node.
    LeastLoadedServer,
    /// Lines 15–17: the service node is overloaded, the initial node is not.
    InitialTakesOver,
    /// Lines 19–22: both overloaded, the least loaded node is not.
    IdleTakesOver,
    /// Line 20 false: everyone is overloaded; the service node stays.
    AllOverloaded,
}

/// The outcome of [`decide`]: the decision, the line that made it, and the
/// node added to `Servers[file]` in the view (lines 7, 16, 21), if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub branch: Branch,
    pub added: Option<Member>,
}

/// Runs Fig. 1 for a request for `file` of `size_bytes` that arrived at the
/// view's own node (the initial node), updating the view's server set as
/// lines 7, 16 and 21 do.
pub fn decide<F: Hash + Eq + Clone>(
    config: &PolicyConfig,
    view: &mut ClusterView<F>,
    file: &F,
    size_bytes: u64,
) -> Outcome {
    let me = view.me();
    let t = config.threshold;
    if size_bytes >= config.max_size_bytes {
        return Outcome { decision: Decision::ServeUncached, branch: Branch::Large, added: None };
    }
    let servers = view.servers(file);
    if servers.is_empty() {
        view.add_server(file, me);
        return Outcome { decision: Decision::ServeLocal, branch: Branch::FirstRequest, added: Some(me) };
    }
    let (mut service, mut branch) = if servers.contains(&me) {
        (me, Branch::InitialCaches)
    } else {
        // Non-empty: `servers` was checked above; ties go to the lowest index
        // because the set iterates in ascending order and `min_by_key` keeps
        // the first minimum.
        let least = servers.iter().copied().min_by_key(|&n| view.load(n)).unwrap_or(me);
        (least, Branch::LeastLoadedServer)
    };
    let mut added = None;
    if view.load(service) > t {
        if view.load(me) < t {
            view.add_server(file, me);
            service = me;
            branch = Branch::InitialTakesOver;
            added = Some(me);
        } else {
            let idle = view.least_loaded();
            if view.load(idle) < t {
                view.add_server(file, idle);
                service = idle;
                branch = Branch::IdleTakesOver;
                added = Some(idle);
            } else {
                branch = Branch::AllOverloaded;
            }
        }
    }
    let decision = if service == me { Decision::ServeLocal } else { Decision::Forward(service) };
    Outcome { decision, branch, added }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(nodes: usize, me: usize, loads: &[u32]) -> ClusterView<&'static str> {
        let mut v = ClusterView::new(nodes, Member(me as u16)).unwrap();
        for (i, &l) in loads.iter().enumerate() {
            v.set_load(Member(i as u16), l);
        }
        v
    }

    const C: PolicyConfig = PolicyConfig { max_size_bytes: MAX_SIZE_BYTES, threshold: 10 };

    #[test]
    fn line3_large_file_served_uncached_and_view_untouched() {
        let mut v = view(3, 0, &[0, 0, 0]);
        v.add_server(&"f", Member(2));
        let o = decide(&C, &mut v, &"f", MAX_SIZE_BYTES);
        assert_eq!(o, Outcome { decision: Decision::ServeUncached, branch: Branch::Large, added: None });
        assert_eq!(v.servers(&"f").iter().copied().collect::<Vec<_>>(), vec![Member(2)]);
        // One byte less is distributed as usual.
        let o = decide(&C, &mut v, &"f", MAX_SIZE_BYTES - 1);
        assert_eq!(o.decision, Decision::Forward(Member(2)));
    }

    #[test]
    fn line6_first_request_adds_initial_node() {
        let mut v = view(3, 1, &[0, 50, 0]);
        let o = decide(&C, &mut v, &"f", 100);
        // Even an overloaded initial node serves a file nobody caches.
        assert_eq!(o, Outcome { decision: Decision::ServeLocal, branch: Branch::FirstRequest, added: Some(Member(1)) });
        assert!(v.servers(&"f").contains(&Member(1)));
    }

    #[test]
    fn line10_initial_node_caching_serves_locally() {
        let mut v = view(3, 1, &[0, 10, 0]);
        v.add_server(&"f", Member(0));
        v.add_server(&"f", Member(1));
        // load == T is not overloaded (line 14 is `> T`).
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(o, Outcome { decision: Decision::ServeLocal, branch: Branch::InitialCaches, added: None });
    }

    #[test]
    fn line13_least_loaded_server_with_lowest_index_on_ties() {
        let mut v = view(4, 0, &[0, 5, 3, 3]);
        for n in [1, 3, 2] {
            v.add_server(&"f", Member(n));
        }
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(
            o,
            Outcome { decision: Decision::Forward(Member(2)), branch: Branch::LeastLoadedServer, added: None }
        );
        assert!(!v.servers(&"f").contains(&Member(0)));
    }

    #[test]
    fn line15_overloaded_service_node_initial_takes_over() {
        let mut v = view(3, 0, &[9, 11, 0]);
        v.add_server(&"f", Member(1));
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(
            o,
            Outcome { decision: Decision::ServeLocal, branch: Branch::InitialTakesOver, added: Some(Member(0)) }
        );
        assert!(v.servers(&"f").contains(&Member(0)));
    }

    #[test]
    fn line14_overloaded_initial_node_forwards_even_its_own_hit() {
        // The initial node caches the file but is overloaded; so is it by
        // line 15 (load not < T); node 2 is idle: lines 19-22.
        let mut v = view(3, 0, &[11, 20, 4]);
        v.add_server(&"f", Member(0));
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(
            o,
            Outcome { decision: Decision::Forward(Member(2)), branch: Branch::IdleTakesOver, added: Some(Member(2)) }
        );
        assert!(v.servers(&"f").contains(&Member(2)));
    }

    #[test]
    fn line15_initial_at_exactly_t_is_not_eligible() {
        // initial.load == T fails line 15 (`< T`), so the idle node is tried.
        let mut v = view(3, 0, &[10, 11, 9]);
        v.add_server(&"f", Member(1));
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(o.branch, Branch::IdleTakesOver);
        assert_eq!(o.decision, Decision::Forward(Member(2)));
    }

    #[test]
    fn line20_everyone_overloaded_service_node_stays() {
        let mut v = view(3, 0, &[10, 12, 10]);
        v.add_server(&"f", Member(1));
        let before = v.servers(&"f").len();
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(o, Outcome { decision: Decision::Forward(Member(1)), branch: Branch::AllOverloaded, added: None });
        assert_eq!(v.servers(&"f").len(), before);
    }

    #[test]
    fn line20_idle_is_the_overloaded_initial_itself_when_it_is_least_loaded() {
        // All overloaded but the least loaded node is the initial one at T:
        // not < T, so nothing changes; the initial node's own copy serves.
        let mut v = view(2, 0, &[11, 12]);
        v.add_server(&"f", Member(0));
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(o, Outcome { decision: Decision::ServeLocal, branch: Branch::AllOverloaded, added: None });
    }

    #[test]
    fn dead_nodes_are_never_chosen() {
        let mut v = view(3, 0, &[11, 0, 0]);
        v.add_server(&"f", Member(1));
        v.mark_dead(Member(1));
        // Node 1 dropped out of Servers: the file looks uncached.
        let o = decide(&C, &mut v, &"f", 100);
        assert_eq!(o.branch, Branch::FirstRequest);
        // And it is not the idle node even at load 0.
        let mut v = view(3, 0, &[11, 0, 5]);
        v.add_server(&"g", Member(2));
        v.set_load(Member(2), 20);
        v.mark_dead(Member(1));
        let o = decide(&C, &mut v, &"g", 100);
        assert_eq!(o.branch, Branch::AllOverloaded);
        assert_eq!(o.decision, Decision::Forward(Member(2)));
    }
}
