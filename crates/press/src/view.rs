//! A node's view of the cluster: which nodes cache each file (`Servers[]` of
//! Fig. 1) and every node's load (open connections).
//!
//! The view changes only through what PRESS disseminates: the node's own
//! exact load ([`ClusterView::set_load`] on itself), the load piggy-backed
//! on every message from another node ([`ClusterView::set_load`] on the
//! sender), caching broadcasts ([`ClusterView::on_caching`]), Fig. 1's own
//! additions ([`crate::decide`]) and the runtime's verdict that a node died
//! ([`ClusterView::mark_dead`]). It performs no I/O.
//!
//! Invariants (property-tested in `tests/view_props.rs`): a server set never
//! holds a dead node and is never stored empty; [`ClusterView::least_loaded`]
//! is a live node of minimal load, the lowest index among equals; the node
//! itself is always alive.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// Most nodes a view holds (node indices are `u16`).
pub const MEMBERS_MAX: usize = 4096;

/// A cluster member by its dense index `0..nodes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member(pub u16);

impl Member {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "member{}", self.0)
    }
}

/// A caching broadcast: the sender started or stopped caching a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachingEvent {
    Start,
    Stop,
}

/// A view that cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ViewError {
    #[error("a cluster has 1 to {MEMBERS_MAX} nodes, not {0}")]
    NodeCount(usize),
    #[error("node index {me} is not below the node count {nodes}")]
    SelfOutOfRange { me: u16, nodes: usize },
}

static EMPTY: BTreeSet<Member> = BTreeSet::new();

/// One node's view of the cluster. `F` names a file (a path in the server,
/// a document index in the simulator).
#[derive(Clone, Debug)]
pub struct ClusterView<F: Hash + Eq> {
    me: Member,
    loads: Vec<u32>,
    alive: Vec<bool>,
    servers: HashMap<F, BTreeSet<Member>>,
}

impl<F: Hash + Eq + Clone> ClusterView<F> {
    /// A view of `nodes` nodes, all alive with load 0, caching nothing.
    pub fn new(nodes: usize, me: Member) -> Result<Self, ViewError> {
        if nodes == 0 || nodes > MEMBERS_MAX {
            return Err(ViewError::NodeCount(nodes));
        }
        if me.index() >= nodes {
            return Err(ViewError::SelfOutOfRange { me: me.0, nodes });
        }
        Ok(ClusterView { me, loads: vec![0; nodes], alive: vec![true; nodes], servers: HashMap::new() })
    }

    /// The node this view belongs to (the initial node of its requests).
    pub fn me(&self) -> Member {
        self.me
    }

    pub fn nodes(&self) -> usize {
        self.loads.len()
    }

    /// `Some(member)` if `index` names a node of this cluster.
    pub fn member(&self, index: usize) -> Option<Member> {
        (index < self.nodes()).then_some(Member(index as u16))
    }

    /// The load last known for `node` (`u32::MAX` for an index outside the
    /// cluster, which never wins a least-loaded choice).
    pub fn load(&self, node: Member) -> u32 {
        self.loads.get(node.index()).copied().unwrap_or(u32::MAX)
    }

    /// Records `node`'s load: the node's own exact count, or the value
    /// piggy-backed on a message from `node`. Ignored outside the cluster.
    pub fn set_load(&mut self, node: Member, load: u32) {
        if let Some(slot) = self.loads.get_mut(node.index()) {
            *slot = load;
        }
    }

    pub fn is_alive(&self, node: Member) -> bool {
        self.alive.get(node.index()).copied().unwrap_or(false)
    }

    /// `Servers[file]`: the live nodes believed to cache `file`.
    pub fn servers(&self, file: &F) -> &BTreeSet<Member> {
        self.servers.get(file).unwrap_or(&EMPTY)
    }

    /// Adds `node` to `Servers[file]` (a dead or unknown node is ignored).
    pub fn add_server(&mut self, file: &F, node: Member) {
        if self.is_alive(node) {
            self.servers.entry(file.clone()).or_default().insert(node);
        }
    }

    /// Removes `node` from `Servers[file]`.
    pub fn remove_server(&mut self, file: &F, node: Member) {
        if let Some(set) = self.servers.get_mut(file) {
            set.remove(&node);
            if set.is_empty() {
                self.servers.remove(file);
            }
        }
    }

    /// Applies a caching broadcast from `from` (or the node's own change).
    pub fn on_caching(&mut self, from: Member, file: &F, event: CachingEvent) {
        match event {
            CachingEvent::Start => self.add_server(file, from),
            CachingEvent::Stop => self.remove_server(file, from),
        }
    }

    /// The runtime found `node` dead: it leaves every server set and is never
    /// chosen again until [`ClusterView::mark_alive`]. The view's own node
    /// cannot be marked dead.
    pub fn mark_dead(&mut self, node: Member) {
        if node == self.me || node.index() >= self.nodes() {
            return;
        }
        self.alive[node.index()] = false;
        self.servers.retain(|_, set| {
            set.remove(&node);
            !set.is_empty()
        });
    }

    /// `node` is back (a restarted process caches nothing yet; its load is
    /// unknown until its first message, so it starts at 0).
    pub fn mark_alive(&mut self, node: Member) {
        if let Some(slot) = self.alive.get_mut(node.index()) {
            *slot = true;
            self.loads[node.index()] = 0;
        }
    }

    /// Line 19: the least loaded live node, the lowest index among equals.
    pub fn least_loaded(&self) -> Member {
        let mut best = self.me;
        for (i, (&load, &alive)) in self.loads.iter().zip(&self.alive).enumerate() {
            let candidate = Member(i as u16);
            if alive && (load < self.load(best) || (load == self.load(best) && candidate < best)) {
                best = candidate;
            }
        }
        best
    }

    /// Number of files with a non-empty server set.
    pub fn files(&self) -> usize {
        self.servers.len()
    }

    /// Files `node` is believed to cache.
    pub fn cached_by(&self, node: Member) -> usize {
        self.servers.values().filter(|set| set.contains(&node)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn construction_is_checked() {
        assert_eq!(ClusterView::<u32>::new(0, Member(0)).unwrap_err(), ViewError::NodeCount(0));
        assert_eq!(ClusterView::<u32>::new(2, Member(2)).unwrap_err(), ViewError::SelfOutOfRange { me: 2, nodes: 2 });
        assert!(ClusterView::<u32>::new(MEMBERS_MAX + 1, Member(0)).is_err());
    }

    #[test]
    fn caching_broadcasts_and_death() {
        let mut v = ClusterView::new(3, Member(0)).unwrap();
        v.on_caching(Member(1), &7u32, CachingEvent::Start);
        v.on_caching(Member(2), &7u32, CachingEvent::Start);
        assert_eq!(v.servers(&7).len(), 2);
        v.on_caching(Member(2), &7u32, CachingEvent::Stop);
        assert_eq!(v.servers(&7).iter().copied().collect::<Vec<_>>(), vec![Member(1)]);
        v.mark_dead(Member(1));
        assert!(v.servers(&7).is_empty());
        assert_eq!(v.files(), 0);
        v.on_caching(Member(1), &7u32, CachingEvent::Start);
        assert!(v.servers(&7).is_empty(), "a dead node's broadcast is ignored");
        v.mark_dead(Member(0));
        assert!(v.is_alive(Member(0)), "the node itself never dies in its own view");
        v.mark_alive(Member(1));
        v.on_caching(Member(1), &7u32, CachingEvent::Start);
        assert_eq!(v.cached_by(Member(1)), 1);
    }

    #[test]
    fn least_loaded_prefers_low_index_and_skips_dead() {
        let mut v = ClusterView::<u32>::new(4, Member(3)).unwrap();
        for (i, l) in [5, 2, 2, 9].into_iter().enumerate() {
            v.set_load(Member(i as u16), l);
        }
        assert_eq!(v.least_loaded(), Member(1));
        v.mark_dead(Member(1));
        assert_eq!(v.least_loaded(), Member(2));
        v.set_load(Member(9), 0);
        assert_eq!(v.load(Member(9)), u32::MAX);
    }
}
