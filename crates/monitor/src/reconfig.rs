//! Reconfiguration between sites (svc §3, §6; seed-notes b.6): a node of an
//! under-loaded site is moved to an overloaded one.
//!
//! - **Concurrency control** [S]: each movable node owns a *role word* in
//!   registered memory (region [`ROLE_REGION`]); an agent claims the node with
//!   **one compare-and-swap** from the unclaimed word it read to the same word
//!   naming itself as holder, so of any number of agents exactly one wins; the
//!   losers back off. The holder then publishes the new site with the next
//!   epoch, again by CAS from its claimed word.
//! - **Epoch fencing**: the epoch rises with every move; a message stamped with
//!   an older epoch than the node's is from its old role and is refused
//!   ([`RoleWord::admits`]).
//! - **History** [S "history aware reconfiguration"]: a node moved less than
//!   `history` ago is not moved again (its last move time is in the role
//!   region, so every agent sees it).
//! - **Sensitivity** [S "tuning the reconfigurability module sensitivity"]: act
//!   only when the load ratio between the busiest and the idlest site reaches
//!   `ratio` for `windows` consecutive windows.
//!
//! The decision ([`ReconfigPolicy`]) is pure; the word operations are one
//! fabric call each.

use crate::MonitorError;
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, LocalRegion, RemoteRegion};

/// Name of the role region on every movable node.
pub const ROLE_REGION: &str = "reconfig.role";
/// `"tsrole01"`: the region's first word.
pub const ROLE_MAGIC: u64 = u64::from_le_bytes(*b"tsrole01");
pub const ROLE_WORD_OFFSET: u64 = 8;
/// When the node last moved (`CLOCK_MONOTONIC` ns; 0 = never).
pub const MOVED_AT_OFFSET: u64 = 16;
pub const ROLE_REGION_BYTES: u64 = 24;

/// A node's role: its site, the epoch of that assignment, and the agent
/// holding it for a move (if any). Packed in one word: site in bits 0–15,
/// epoch in bits 16–47, holder + 1 in bits 48–63 (0 = unclaimed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleWord {
    pub site: u16,
    pub epoch: u32,
    pub holder: Option<u16>,
}

/// Largest agent id (its id + 1 must fit 16 bits).
pub const AGENT_ID_MAX: u16 = u16::MAX - 1;

impl RoleWord {
    pub fn to_word(self) -> u64 {
        let holder = self.holder.map_or(0, |h| u64::from(h) + 1);
        u64::from(self.site) | u64::from(self.epoch) << 16 | holder << 48
    }

    pub fn from_word(word: u64) -> Self {
        let holder = (word >> 48) as u16;
        RoleWord { site: word as u16, epoch: (word >> 16) as u32, holder: holder.checked_sub(1) }
    }

    /// Whether a message stamped with `epoch` belongs to the current role.
    pub fn admits(self, epoch: u32) -> bool {
        epoch == self.epoch
    }
}

/// The owner's side: registers the role region with the node's first site.
pub fn register_role(fabric: &dyn Fabric, site: u16) -> Result<Arc<LocalRegion>, MonitorError> {
    let region = fabric.register(ROLE_REGION, ROLE_REGION_BYTES, tierstack_fabric::Access::all())?;
    let memory = region.memory();
    memory.store_u64(ROLE_WORD_OFFSET, RoleWord { site, epoch: 1, holder: None }.to_word())?;
    memory.store_u64(ROLE_MAGIC_OFFSET, ROLE_MAGIC)?;
    Ok(region)
}

const ROLE_MAGIC_OFFSET: u64 = 0;

/// A node's role and last move time, as an agent reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleView {
    pub role: RoleWord,
    pub moved_at_ns: u64,
}

/// Reads a node's role region (one batch).
pub fn read_role(region: &dyn RemoteRegion) -> Result<RoleView, MonitorError> {
    let mut bytes = [0u8; ROLE_REGION_BYTES as usize];
    region.read(0, &mut bytes)?;
    let word = |i: usize| {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(eight)
    };
    if word(0) != ROLE_MAGIC {
        return Err(MonitorError::NotARoleRegion { node: region.node() });
    }
    Ok(RoleView { role: RoleWord::from_word(word(1)), moved_at_ns: word(2) })
}

/// The outcome of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This agent holds the node; the word now reads as given.
    Won(RoleWord),
    /// Another agent claimed or moved it first; the word reads as given.
    Lost(RoleWord),
}

/// Claims the node for `agent` with one compare-and-swap from `seen` (which
/// must be unclaimed).
pub fn claim(region: &dyn RemoteRegion, seen: RoleWord, agent: u16) -> Result<Claim, MonitorError> {
    if agent > AGENT_ID_MAX {
        return Err(MonitorError::BadConfig(format!("agent id {agent} exceeds {AGENT_ID_MAX}")));
    }
    if seen.holder.is_some() {
        return Ok(Claim::Lost(seen));
    }
    let mine = RoleWord { holder: Some(agent), ..seen };
    let previous = region.compare_swap(ROLE_WORD_OFFSET, seen.to_word(), mine.to_word())?;
    Ok(if previous == seen.to_word() { Claim::Won(mine) } else { Claim::Lost(RoleWord::from_word(previous)) })
}

/// The holder publishes the node's new site with the next epoch and
/// releases it; records the move time. Fails with [`MonitorError::NotHolder`]
/// if the word is no longer `claimed`.
pub fn complete_move(
    region: &dyn RemoteRegion,
    claimed: RoleWord,
    to_site: u16,
    now_ns: u64,
) -> Result<RoleWord, MonitorError> {
    let moved = RoleWord { site: to_site, epoch: claimed.epoch.wrapping_add(1), holder: None };
    // The time first: an agent that sees the new word sees a recent move.
    region.write(MOVED_AT_OFFSET, &now_ns.to_ne_bytes())?;
    let previous = region.compare_swap(ROLE_WORD_OFFSET, claimed.to_word(), moved.to_word())?;
    if previous != claimed.to_word() {
        return Err(MonitorError::NotHolder { found: RoleWord::from_word(previous) });
    }
    Ok(moved)
}

/// The holder gives the node back unmoved.
pub fn release(region: &dyn RemoteRegion, claimed: RoleWord) -> Result<(), MonitorError> {
    let free = RoleWord { holder: None, ..claimed };
    let previous = region.compare_swap(ROLE_WORD_OFFSET, claimed.to_word(), free.to_word())?;
    if previous != claimed.to_word() {
        return Err(MonitorError::NotHolder { found: RoleWord::from_word(previous) });
    }
    Ok(())
}

/// The owner reads its own role word (plain local load, no fabric call).
pub fn local_role(region: &LocalRegion) -> Result<RoleWord, MonitorError> {
    Ok(RoleWord::from_word(region.memory().load_u64(ROLE_WORD_OFFSET)?))
}

/// The HTTP header a front end stamps on each request it forwards to a
/// node of its site: `<site>.<epoch>` of the role word it routed by. The
/// node refuses (421) a stamp that is not its current role: the fence
/// against messages from before a move.
pub const ROLE_HEADER: &str = "x-tierstack-role";

/// A request's role stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleStamp {
    pub site: u16,
    pub epoch: u32,
}

impl RoleStamp {
    pub fn of(role: RoleWord) -> Self {
        RoleStamp { site: role.site, epoch: role.epoch }
    }

    /// `<site>.<epoch>`, as in [`ROLE_HEADER`].
    pub fn to_header(self) -> String {
        format!("{}.{}", self.site, self.epoch)
    }

    pub fn parse(text: &str) -> Option<RoleStamp> {
        let (site, epoch) = text.trim().split_once('.')?;
        Some(RoleStamp { site: site.parse().ok()?, epoch: epoch.parse().ok()? })
    }

    /// Whether a node whose role is `role` serves this stamp: same site,
    /// same epoch (a claim in progress does not change either).
    pub fn admitted_by(self, role: RoleWord) -> bool {
        self.site == role.site && role.admits(self.epoch)
    }
}

/// Tuning of the agent's decisions.
#[derive(Clone, Copy, Debug)]
pub struct ReconfigConfig {
    /// Act when (busiest site's mean load + 1) / (idlest's + 1) reaches this.
    pub ratio: f64,
    /// … for this many consecutive windows.
    pub windows: u32,
    /// A node moved less than this long ago stays (ns).
    pub history_ns: u64,
    /// A site never shrinks below this many nodes.
    pub min_nodes_per_site: usize,
}

impl Default for ReconfigConfig {
    fn default() -> Self {
        ReconfigConfig { ratio: 2.0, windows: 3, history_ns: 5_000_000_000, min_nodes_per_site: 1 }
    }
}

/// One node as the policy sees it in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub site: u16,
    pub load: u32,
    /// 0 = never moved.
    pub moved_at_ns: u64,
    /// Claimed by some agent right now.
    pub claimed: bool,
}

/// A move the policy asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Index of the node in the window's list.
    pub node: usize,
    pub from_site: u16,
    pub to_site: u16,
}

/// The sensitivity and history rules: a pure state machine fed one window
/// of node loads at a time.
#[derive(Debug)]
pub struct ReconfigPolicy {
    config: ReconfigConfig,
    /// (busy site, idle site) of the current streak and its length.
    streak: Option<((u16, u16), u32)>,
}

impl ReconfigPolicy {
    pub fn new(config: ReconfigConfig) -> Self {
        ReconfigPolicy { config, streak: None }
    }

    /// One window: returns the move to make, if the rules call for one.
    pub fn window(&mut self, now_ns: u64, nodes: &[NodeView]) -> Option<Move> {
        let mut sites: Vec<(u16, u64, usize)> = Vec::new(); // (site, total load, nodes)
        for node in nodes {
            match sites.iter_mut().find(|(s, _, _)| *s == node.site) {
                Some(entry) => {
                    entry.1 += u64::from(node.load);
                    entry.2 += 1;
                }
                None => sites.push((node.site, u64::from(node.load), 1)),
            }
        }
        let mean = |(_, total, count): &(u16, u64, usize)| *total as f64 / *count as f64;
        let busy = sites.iter().max_by(|a, b| mean(a).total_cmp(&mean(b)).then(b.0.cmp(&a.0)))?;
        let idle = sites.iter().min_by(|a, b| mean(a).total_cmp(&mean(b)).then(a.0.cmp(&b.0)))?;
        let pair = (busy.0, idle.0);
        if pair.0 == pair.1 || (mean(busy) + 1.0) / (mean(idle) + 1.0) < self.config.ratio {
            self.streak = None;
            return None;
        }
        let length = match self.streak {
            Some((p, n)) if p == pair => n + 1,
            _ => 1,
        };
        self.streak = Some((pair, length));
        if length < self.config.windows || idle.2 <= self.config.min_nodes_per_site {
            return None;
        }
        let donor = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.site == idle.0 && !n.claimed)
            .filter(|(_, n)| n.moved_at_ns == 0 || now_ns.saturating_sub(n.moved_at_ns) >= self.config.history_ns)
            .min_by_key(|(i, n)| (n.load, *i))?;
        self.streak = None;
        Some(Move { node: donor.0, from_site: idle.0, to_site: busy.0 })
    }
}

// --------------------------------------------------------------- agent ----

/// What one step of a [`ReconfigAgent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum AgentEvent {
    /// This agent moved `node` from `from_site` to `to_site`; its role now
    /// carries `epoch`.
    Moved { node: NodeId, from_site: u16, to_site: u16, epoch: u32 },
    /// The policy asked for a move of `node` but another agent claimed or
    /// moved it first (the CAS failed).
    Lost { node: NodeId, found_site: u16, found_epoch: u32 },
}

/// The reconfiguration agent: every window it reads each node's role word
/// and RDMA-Sync load (one-sided, no process on the node involved), feeds
/// the pure [`ReconfigPolicy`], and carries out the move it asks for with
/// [`claim`] and [`complete_move`]. Any number of agents may run over the
/// same nodes: the CAS lets exactly one move a node.
pub struct ReconfigAgent {
    agent: u16,
    nodes: Vec<NodeId>,
    roles: Vec<Arc<dyn RemoteRegion>>,
    load: Arc<dyn crate::LoadSource>,
    policy: ReconfigPolicy,
    /// After a lost claim, no decision before this (`CLOCK_MONOTONIC` ns).
    backoff_until_ns: u64,
    /// Length of one window (the unit of the back-off), ns.
    window_ns: u64,
    rng: tierstack_base::SeededRng,
    metrics: Arc<crate::metrics::ReconfigMetrics>,
}

impl ReconfigAgent {
    /// Connects to the role region of every node in `nodes` (each must
    /// have registered it) and to their load records; `window` is the
    /// period at which the caller will call [`ReconfigAgent::step`].
    pub fn connect(
        fabric: Arc<dyn Fabric>,
        agent: u16,
        nodes: &[NodeId],
        config: ReconfigConfig,
        window: std::time::Duration,
    ) -> Result<ReconfigAgent, MonitorError> {
        if agent > AGENT_ID_MAX {
            return Err(MonitorError::BadConfig(format!("agent id {agent} exceeds {AGENT_ID_MAX}")));
        }
        let roles = nodes.iter().map(|node| fabric.connect(*node, ROLE_REGION)).collect::<Result<Vec<_>, _>>()?;
        let addresses: Vec<crate::BackendAddress> =
            nodes.iter().map(|node| crate::BackendAddress { node: Some(*node), socket: None }).collect();
        let source = crate::SourceConfig::for_interval(window);
        let load = crate::open_source(crate::Scheme::RdmaSync, Some(fabric), &addresses, source)?;
        Ok(ReconfigAgent {
            agent,
            nodes: nodes.to_vec(),
            roles,
            load,
            policy: ReconfigPolicy::new(config),
            backoff_until_ns: 0,
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1),
            rng: tierstack_base::seeded_rng(u64::from(agent)),
            metrics: Arc::new(crate::metrics::ReconfigMetrics::new(nodes)),
        })
    }

    /// What it saw and did, for a metrics listener.
    pub fn metrics(&self) -> Arc<crate::metrics::ReconfigMetrics> {
        self.metrics.clone()
    }

    /// One window at `now_ns` (`CLOCK_MONOTONIC`): read, decide, act. Nodes
    /// that are dead or never published are left out of the window.
    pub fn step(&mut self, now_ns: u64) -> Result<Option<AgentEvent>, MonitorError> {
        if now_ns < self.backoff_until_ns {
            return Ok(None);
        }
        let mut views = Vec::with_capacity(self.nodes.len());
        let mut seen = Vec::with_capacity(self.nodes.len());
        for (index, role) in self.roles.iter().enumerate() {
            let reading = self.load.read(index);
            if !matches!(reading.health, crate::Health::Fresh | crate::Health::Stale) {
                continue;
            }
            let view = match read_role(role.as_ref()) {
                Ok(view) => view,
                Err(MonitorError::Fabric(e)) if e.is_unreachable() => continue,
                Err(e) => return Err(e),
            };
            let load = reading.record.counters.load();
            self.metrics.seen(index, view.role.site, load);
            views.push(NodeView {
                site: view.role.site,
                load,
                moved_at_ns: view.moved_at_ns,
                claimed: view.role.holder.is_some(),
            });
            seen.push((index, view.role));
        }
        use crate::metrics::WindowOutcome;
        let Some(decided) = self.policy.window(now_ns, &views) else {
            self.metrics.window(views.len(), WindowOutcome::Stay);
            return Ok(None);
        };
        let (index, role) = seen[decided.node];
        let node = self.nodes[index];
        let region = self.roles[index].as_ref();
        match claim(region, role, self.agent)? {
            Claim::Won(mine) => {
                let moved = complete_move(region, mine, decided.to_site, now_ns)?;
                self.metrics.window(views.len(), WindowOutcome::Moved);
                Ok(Some(AgentEvent::Moved { node, from_site: role.site, to_site: moved.site, epoch: moved.epoch }))
            }
            Claim::Lost(found) => {
                // A randomized back-off (0 to 4 windows, seeded by the agent's
                // id), so agents that lost to each other do not keep
                // colliding in step (live-lock, seed-notes b.6).
                let windows = rand::Rng::gen_range(&mut self.rng, 0..=4u64);
                self.backoff_until_ns = now_ns.saturating_add(windows.saturating_mul(self.window_ns));
                self.metrics.window(views.len(), WindowOutcome::Lost);
                Ok(Some(AgentEvent::Lost { node, found_site: found.site, found_epoch: found.epoch }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(site: u16, load: u32) -> NodeView {
        NodeView { site, load, moved_at_ns: 0, claimed: false }
    }

    proptest! {
        #[test]
        fn role_words_round_trip(site in any::<u16>(), epoch in any::<u32>(), holder in proptest::option::of(0..=AGENT_ID_MAX)) {
            let word = RoleWord { site, epoch, holder };
            prop_assert_eq!(RoleWord::from_word(word.to_word()), word);
        }
    }

    #[test]
    fn the_epoch_fences_the_old_role() {
        let role = RoleWord { site: 1, epoch: 7, holder: None };
        assert!(role.admits(7));
        assert!(!role.admits(6));
    }

    #[test]
    fn sensitivity_waits_for_w_consecutive_windows_over_the_ratio() {
        let mut policy = ReconfigPolicy::new(ReconfigConfig { ratio: 2.0, windows: 3, ..ReconfigConfig::default() });
        let loaded = [node(0, 9), node(0, 9), node(1, 1), node(1, 2)];
        let calm = [node(0, 3), node(0, 3), node(1, 2), node(1, 2)];
        assert_eq!(policy.window(1, &loaded), None);
        assert_eq!(policy.window(2, &loaded), None);
        assert_eq!(policy.window(3, &calm), None, "a calm window breaks the streak");
        assert_eq!(policy.window(4, &loaded), None);
        assert_eq!(policy.window(5, &loaded), None);
        assert_eq!(policy.window(6, &loaded), Some(Move { node: 2, from_site: 1, to_site: 0 }), "least loaded donor");
        assert_eq!(policy.window(7, &loaded), None, "the streak starts again after a move");
    }

    #[test]
    fn a_ratio_just_under_the_threshold_never_moves() {
        let mut policy = ReconfigPolicy::new(ReconfigConfig { ratio: 2.0, windows: 1, ..ReconfigConfig::default() });
        // (3 + 1) / (1 + 1) = 2.0 moves; (2 + 1) / (1 + 1) = 1.5 does not.
        assert!(policy.window(1, &[node(0, 3), node(1, 1), node(1, 1)]).is_some());
        assert_eq!(policy.window(3, &[node(0, 2), node(1, 1), node(1, 1)]), None);
    }

    #[test]
    fn history_keeps_a_recently_moved_node_and_sites_keep_their_minimum() {
        let config = ReconfigConfig { ratio: 2.0, windows: 1, history_ns: 100, min_nodes_per_site: 1 };
        let mut policy = ReconfigPolicy::new(config);
        let recently = NodeView { moved_at_ns: 950, ..node(1, 0) };
        let nodes = [node(0, 10), recently, node(1, 1)];
        assert_eq!(policy.window(1000, &nodes), Some(Move { node: 2, from_site: 1, to_site: 0 }));
        let both_recent = [node(0, 10), recently, NodeView { moved_at_ns: 990, ..node(1, 1) }];
        assert_eq!(policy.window(1000, &both_recent), None, "no node may move twice within the window");
        assert_eq!(policy.window(1050, &both_recent).map(|m| m.node), Some(1), "after H it may");
        assert_eq!(policy.window(2000, &[node(0, 10), node(1, 0)]), None, "the idle site keeps its last node");
        let claimed = [node(0, 10), NodeView { claimed: true, ..node(1, 0) }, node(1, 0)];
        assert_eq!(policy.window(2000, &claimed).map(|m| m.node), Some(2), "a claimed node is not offered");
    }

    /// Alternating load between two sites never moves nodes back and forth
    /// faster than the history allows.
    #[test]
    fn shifting_load_moves_each_node_at_most_once_per_history() {
        let config = ReconfigConfig { ratio: 1.5, windows: 2, history_ns: 50, min_nodes_per_site: 1 };
        let mut policy = ReconfigPolicy::new(config);
        let mut nodes: Vec<NodeView> = (0..6).map(|i| node((i % 2) as u16, 0)).collect();
        let mut moves: Vec<(u64, usize)> = Vec::new();
        for t in 1..400u64 {
            let hot = ((t / 7) % 2) as u16; // load flips every 7 windows
            for n in nodes.iter_mut() {
                n.load = if n.site == hot { 20 } else { 1 };
            }
            if let Some(m) = policy.window(t, &nodes) {
                nodes[m.node].site = m.to_site;
                nodes[m.node].moved_at_ns = t;
                moves.push((t, m.node));
            }
        }
        assert!(!moves.is_empty());
        for (i, (t, n)) in moves.iter().enumerate() {
            if let Some((t2, _)) = moves[i + 1..].iter().find(|(_, n2)| n2 == n) {
                assert!(t2 - t >= 50, "node {n} moved at {t} and again at {t2}");
            }
        }
    }
}
