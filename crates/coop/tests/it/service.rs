//! The service over real fabrics (in-process clusters, shm and tcp): the
//! same request script through the service and through the model must give
//! the same service kinds, the same bytes and the same Table 2 counts.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_cluster::{local_cluster, Backend, LocalCluster};
use tierstack_coop::service::{CoopConfig, CoopNode, Lookup};
use tierstack_coop::{Model, ModelConfig, Primitive, Scheme, Served, Tally, PAGE_BYTES};
use tierstack_fabric::NodeId;

const PAGES: u32 = 8;

/// The body of `key` at `version`: self-describing, so any mix-up shows.
fn body(key: u64, version: u64, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (tierstack_coop::key::mix(key ^ (version << 32) ^ (i / 8)) >> (8 * (i % 8))) as u8).collect()
}

/// A body's checksum (FNV-1a).
fn sum(b: &[u8]) -> u64 {
    tierstack_coop::fingerprint(b)
}

struct Cluster {
    _fabrics: LocalCluster,
    nodes: Vec<CoopNode>,
}

fn start(backend: Backend, scheme: Scheme, active: usize, passive: usize) -> Cluster {
    let fabrics = local_cluster(backend, (active + passive) as u32).unwrap();
    let ids: Vec<NodeId> = (0..(active + passive) as u32).map(NodeId).collect();
    let config = CoopConfig::new(scheme, ids[..active].to_vec(), ids[active..].to_vec(), u64::from(PAGES) * PAGE_BYTES);
    let nodes = fabrics.fabrics().iter().map(|f| CoopNode::start(Arc::clone(f), config.clone()).unwrap()).collect();
    Cluster { _fabrics: fabrics, nodes }
}

impl Cluster {
    /// Waits until every message sent has been handled (bounded): two
    /// snapshots in a row, equal to each other, with as many handled as
    /// sent (the counts are read node by node, so one snapshot taken while
    /// messages still flow could balance by accident; two identical ones
    /// cannot, as nothing moved between them).
    fn settle(&self) {
        let deadline = instant_now() + Duration::from_secs(10);
        let mut previous = None;
        loop {
            let now = self.nodes.iter().map(CoopNode::message_counts).fold((0, 0), |(a, b), (s, h)| (a + s, b + h));
            if now.0 == now.1 && previous == Some(now) {
                return;
            }
            previous = Some(now);
            assert!(instant_now() < deadline, "the cluster never settled: {} sent, {} handled", now.0, now.1);
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for n in &self.nodes {
            t.merge(&n.stats().tally);
        }
        t
    }
}

/// Compares counts, not bytes (the service reads whole key-table windows).
fn counts(t: &Tally) -> Vec<(Primitive, u64, u64, u64, u32, u32)> {
    t.primitives.iter().map(|(p, x)| (*p, x.calls, x.control_total, x.data_total, x.control_max, x.data_max)).collect()
}

fn script(n: usize, docs: u64, active: usize) -> Vec<(usize, u64)> {
    (0..n as u64)
        .map(|i| {
            let x = tierstack_coop::key::mix(i ^ 0xc0);
            ((x % active as u64) as usize, tierstack_coop::key::mix(x) % docs + 1)
        })
        .collect()
}

fn differential(backend: Backend, name: &str, bytes: u64) {
    let scheme: Scheme = name.parse().unwrap();
    let (active, passive) = (2, if scheme.uses_passive() { 2 } else { 0 });
    let cluster = start(backend, scheme, active, passive);
    let mut model =
        Model::new(ModelConfig { scheme, active, passive, pages_per_node: PAGES }).unwrap().with_last_copy_guard(true);
    let mut kinds = [0u32; 3];
    for (step, (node, key)) in script(160, 14, active).into_iter().enumerate() {
        let expected = model.request(node, key, bytes).unwrap();
        let version = model.version(key);
        let got = cluster.nodes[node].get(key).unwrap();
        let served = match &got {
            Lookup::Local { body: b, version: v } => {
                assert_eq!((sum(b), *v), (sum(&body(key, version, bytes)), version), "{name} step {step}: local bytes");
                kinds[0] += 1;
                Served::LocalHit
            }
            Lookup::Remote { body: b, version: v, holder } => {
                assert_eq!(
                    (sum(b), *v),
                    (sum(&body(key, version, bytes)), version),
                    "{name} step {step}: remote bytes"
                );
                kinds[1] += 1;
                Served::RemoteHit { holder: holder.0 as usize }
            }
            Lookup::Miss => {
                kinds[2] += 1;
                cluster.nodes[node].put(key, version, &body(key, version, bytes)).unwrap();
                Served::Miss { by: node }
            }
        };
        assert_eq!(served, expected.served, "{name} on {backend:?}, step {step}: node {node} key {key}");
        if step % 11 == 5 {
            // A home's versions count from its own base (item 3 of issue 34).
            let home = tierstack_coop::Homes::new(active).unwrap().home(key);
            let base = cluster.nodes[home].version_base().unwrap();
            assert_eq!(cluster.nodes[node].validate(key), Some(base + model.version(key)));
            model.validate(node, key).unwrap();
        }
        // AC has no cluster metadata, hence nothing to invalidate through.
        if step % 37 == 36 && name != "ac" {
            cluster.nodes[node].invalidate(key);
            model.invalidate(node, key).unwrap();
        }
        cluster.settle();
    }
    let mut held: Vec<Vec<u64>> = cluster.nodes.iter().map(|n| n.held()).collect();
    for (i, h) in held.iter_mut().enumerate() {
        h.sort_unstable();
        let mut m: Vec<u64> = model.node(i).unwrap().keys().collect();
        m.sort_unstable();
        assert_eq!(*h, m, "{name}: node {i} holds what the model's node holds");
    }
    assert_eq!(counts(&cluster.tally()), counts(model.tally()), "{name} on {backend:?}: Table 2 counts");
    assert_eq!(cluster.tally().consequential, model.tally().consequential, "{name}: consequential messages");
    if name != "ac" {
        assert!(kinds.iter().all(|&k| k > 0), "{name}: every kind of service seen: {kinds:?}");
    }
    if matches!(name, "ccwr" | "mtacc") {
        // Redundant copies were evicted, each asked at its home (a.7 #7).
        let grants = cluster.tally().messages.get(&tierstack_coop::MsgKind::RemoveGrant).copied().unwrap_or(0);
        let guarded: u64 = cluster.nodes.iter().map(|n| n.stats().guarded_evictions).sum();
        assert!(grants > 0 && guarded >= grants, "{name}: {grants} grants, {guarded} guarded evictions");
        let refusals: u64 = cluster.nodes.iter().map(|n| n.stats().last_copy_refusals).sum();
        assert_eq!(refusals, 0, "{name}: a settled cluster's homes never refuse");
    }
}

#[test]
fn the_service_matches_the_model_on_shm() {
    for name in ["ac", "bcc", "ccwr", "mtacc", "hybcc"] {
        differential(Backend::Shm, name, 8 << 10);
    }
    differential(Backend::Shm, "hybcc", 16 << 10);
}

#[test]
fn the_service_matches_the_model_on_tcp() {
    for name in ["bcc", "ccwr", "mtacc"] {
        differential(Backend::Tcp, name, 8 << 10);
    }
}

/// Three proxies hammer a small pool from three threads each with no
/// settling: evictions, swaps and STOREs race remote reads. Every body
/// served must be the right one (checksummed); a read of a slot reused
/// meanwhile must be refused (counted as stale), never served.
fn concurrent(backend: Backend, name: &str) {
    let cluster = Arc::new(start(backend, name.parse().unwrap(), 3, 0));
    let bytes = 8u64 << 10;
    let threads: Vec<_> = (0..9u64)
        .map(|t| {
            let cluster = Arc::clone(&cluster);
            std::thread::spawn(move || {
                let node = (t % 3) as usize;
                let mut served = 0u32;
                for i in 0..300u64 {
                    let key = tierstack_coop::key::mix(t * 1000 + i) % 24 + 1;
                    match cluster.nodes[node].get(key).unwrap() {
                        Lookup::Local { body: b, .. } | Lookup::Remote { body: b, .. } => {
                            assert_eq!(sum(&b), sum(&body(key, 0, bytes)), "wrong bytes for {key}");
                            served += 1;
                        }
                        Lookup::Miss => cluster.nodes[node].put(key, 0, &body(key, 0, bytes)).unwrap(),
                    }
                }
                served
            })
        })
        .collect();
    let served: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(served > 500, "{served}");
    let remote: u64 = cluster.nodes.iter().map(|n| n.stats().remote_hits).sum();
    assert!(remote > 0);
    if name == "ccwr" {
        // Racing nodes do evict copies the home knows as last ones: refused.
        let refused: u64 = cluster.nodes.iter().map(|n| n.stats().last_copy_refusals).sum();
        assert!(refused > 0, "{backend:?}: no refusal in a race");
    }
}

#[test]
fn concurrent_requests_never_serve_wrong_bytes_on_shm() {
    concurrent(Backend::Shm, "bcc");
    concurrent(Backend::Shm, "ccwr");
}

#[test]
fn concurrent_requests_never_serve_wrong_bytes_on_tcp() {
    concurrent(Backend::Tcp, "ccwr");
}

/// Groupcache in the service: one copy per key, at its owner on the
/// consistent-hashing ring, fetched two-sidedly. Request by request the
/// service serves the kind the model does (a miss at the owner or at the
/// requester is a miss), with the right bytes; the owners hold what the
/// model's do; no one-sided operation is ever issued.
fn groupcache(backend: Backend) {
    let active = 3;
    let cluster = start(backend, Scheme::Groupcache, active, 0);
    let mut model =
        Model::new(ModelConfig { scheme: Scheme::Groupcache, active, passive: 0, pages_per_node: PAGES }).unwrap();
    let ring = tierstack_coop::HashRing::new(active).unwrap();
    let bytes = 8u64 << 10;
    let mut kinds = [0u32; 3];
    for (step, (node, key)) in script(300, 30, active).into_iter().enumerate() {
        let expected = model.request(node, key, bytes).unwrap();
        let got = cluster.nodes[node].get(key).unwrap();
        let served = match &got {
            Lookup::Local { body: b, .. } => {
                assert_eq!(sum(b), sum(&body(key, 0, bytes)), "step {step}: local bytes");
                kinds[0] += 1;
                Served::LocalHit
            }
            Lookup::Remote { body: b, holder, .. } => {
                assert_eq!(sum(b), sum(&body(key, 0, bytes)), "step {step}: remote bytes");
                assert_eq!(holder.0 as usize, ring.owner(key), "served by the owner");
                kinds[1] += 1;
                Served::RemoteHit { holder: holder.0 as usize }
            }
            Lookup::Miss => {
                kinds[2] += 1;
                cluster.nodes[node].put(key, 0, &body(key, 0, bytes)).unwrap();
                Served::Miss { by: ring.owner(key) }
            }
        };
        let expected = match expected.served {
            Served::Miss { .. } => Served::Miss { by: ring.owner(key) },
            other => other,
        };
        assert_eq!(served, expected, "{backend:?} step {step}: node {node} key {key}");
        cluster.settle();
    }
    assert!(kinds.iter().all(|&k| k > 0), "every kind of service seen: {kinds:?}");
    for (i, n) in cluster.nodes.iter().enumerate() {
        let mut h = n.held();
        h.sort_unstable();
        let mut m: Vec<u64> = model.node(i).unwrap().keys().collect();
        m.sort_unstable();
        assert_eq!(h, m, "node {i} holds what the model's owner holds");
        assert!(h.iter().all(|&k| ring.owner(k) == i), "only owners hold");
    }
    let t = cluster.tally();
    assert!(t.messages.keys().all(|k| !k.is_one_sided()), "{:?}", t.messages);
    let gets = t.messages.get(&tierstack_coop::MsgKind::GroupGet).copied().unwrap_or(0);
    assert_eq!(gets, t.messages.get(&tierstack_coop::MsgKind::GroupReply).copied().unwrap_or(0));
    assert_eq!(t.of(Primitive::Fetch).calls, gets, "every remote lookup is one GET and its reply");
    // Invalidation is the owner dropping its copy: the next request misses.
    let (node, key) = (0..30u64).map(|k| (0usize, k + 1)).find(|&(_, k)| ring.owner(k) != 0).unwrap();
    if matches!(cluster.nodes[node].get(key).unwrap(), Lookup::Miss) {
        cluster.nodes[node].put(key, 0, &body(key, 0, bytes)).unwrap();
        cluster.settle();
    }
    assert!(matches!(cluster.nodes[node].get(key).unwrap(), Lookup::Remote { .. }));
    cluster.nodes[node].invalidate(key);
    cluster.settle();
    assert_eq!(cluster.nodes[node].get(key).unwrap(), Lookup::Miss);
}

#[test]
fn groupcache_matches_the_model_on_shm_and_tcp() {
    groupcache(Backend::Shm);
    groupcache(Backend::Tcp);
}

/// A dead groupcache owner costs misses, never errors.
#[test]
fn groupcache_with_a_silent_owner_misses() {
    let cluster = start(Backend::Shm, Scheme::Groupcache, 2, 0);
    let ring = tierstack_coop::HashRing::new(2).unwrap();
    let key = (1..).find(|&k| ring.owner(k) == 1).unwrap();
    let mut nodes = cluster.nodes;
    let survivor = nodes.remove(0);
    drop(nodes);
    let started = instant_now();
    assert_eq!(survivor.get(key).unwrap(), Lookup::Miss);
    assert!(started.elapsed() < Duration::from_secs(10));
    survivor.put(key, 0, &body(key, 0, 4096)).unwrap();
    assert!(survivor.stats().peer_failures > 0);
}

/// Seed-notes a.7 #7, made deterministic: node 0 believes its copy of K is
/// redundant (its replica still lists node 1), but K's home (node 2) knows
/// node 0 as K's only holder (node 1's remove-holder reached the home; its
/// announce has not reached node 0 — here the remove-holder is sent by hand
/// and node 1 keeps its bytes). Node 0 must make room for a remote hit: it
/// asks the home to drop its "redundant" K, the home refuses (last copy),
/// and node 0 keeps K and swaps out its next victim instead.
fn last_copy_refusal(guard: bool) -> (bool, Option<u64>, u64) {
    let fabrics = local_cluster(Backend::Shm, 3).unwrap();
    let ids: Vec<NodeId> = (0..3).map(NodeId).collect();
    let mut config = CoopConfig::new(Scheme::Ccwr, ids.clone(), Vec::new(), u64::from(PAGES) * PAGE_BYTES);
    config.last_copy_guard = guard;
    let nodes: Vec<CoopNode> =
        fabrics.fabrics().iter().map(|f| CoopNode::start(Arc::clone(f), config.clone()).unwrap()).collect();
    let homes = tierstack_coop::Homes::new(3).unwrap();
    let k = (1u64..).find(|&k| homes.home(k) == 2).unwrap();
    let bytes = PAGE_BYTES;
    // Waits until every message sent (plus `extra` sent by hand) is handled.
    let settle = |extra: u64| {
        let deadline = instant_now() + Duration::from_secs(10);
        let mut previous = None;
        loop {
            let now = nodes.iter().map(CoopNode::message_counts).fold((extra, 0), |(a, b), (s, h)| (a + s, b + h));
            if now.0 == now.1 && previous == Some(now) {
                return;
            }
            previous = Some(now);
            assert!(instant_now() < deadline, "never settled: {now:?}");
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    nodes[0].put(k, 0, &body(k, 0, bytes)).unwrap();
    settle(0);
    assert!(matches!(nodes[1].get(k).unwrap(), Lookup::Remote { .. }), "node 1 keeps a duplicate");
    settle(0);
    // Fill node 0 (its own free space comes first), then give node 1 a key Z.
    for f in (1000u64..).take(PAGES as usize - 1) {
        nodes[0].put(f, 0, &body(f, 0, bytes)).unwrap();
        settle(0);
    }
    let z = 5000;
    nodes[1].put(z, 0, &body(z, 0, bytes)).unwrap();
    settle(0);
    assert!(matches!(nodes[0].get(k).unwrap(), Lookup::Local { .. }), "K is node 0's most recent entry");
    assert_eq!(nodes[2].holders_at_home(k), Some(0b011));
    // Node 1's remove-holder reaches the home; node 0 is not told.
    let remove = tierstack_coop::service::wire::Msg::RemoveHolder { key: k }.encode();
    fabrics.fabrics()[1].send(NodeId(2), tierstack_fabric::Channel::COOP_CACHE, &remove).unwrap();
    settle(1);
    assert_eq!(nodes[2].holders_at_home(k), Some(0b001));
    // A remote hit at a full node 0: room from its "redundant" K first.
    let got = nodes[0].get(z).unwrap();
    assert!(matches!(got, Lookup::Remote { .. }), "{got:?}");
    settle(1);
    let kept = nodes[0].held().contains(&k);
    (kept, nodes[2].holders_at_home(k), nodes[0].stats().last_copy_refusals)
}

#[test]
fn the_home_refuses_to_let_a_redundant_eviction_drop_the_last_copy() {
    let (kept, holders, refusals) = last_copy_refusal(true);
    assert!(kept, "node 0 kept the last copy");
    assert_eq!(holders, Some(0b001), "the home still lists it");
    assert_eq!(refusals, 1);
    // Without the rule the last copy is gone and no holder is listed.
    let (kept, holders, refusals) = last_copy_refusal(false);
    // (An entry without holders is freed: issue 34 item 1.)
    assert!(!kept && holders.is_none() && refusals == 0, "{kept} {holders:?} {refusals}");
}

/// The home's side of the rule under a race: two holders ask at the same
/// moment to drop their copies; the home grants exactly one.
#[test]
fn two_racing_redundant_evictions_leave_one_copy() {
    for round in 0..20u64 {
        let fabrics = local_cluster(Backend::Shm, 3).unwrap();
        let ids: Vec<NodeId> = (0..3).map(NodeId).collect();
        let config = CoopConfig::new(Scheme::Ccwr, ids, Vec::new(), u64::from(PAGES) * PAGE_BYTES);
        let nodes: Vec<CoopNode> =
            fabrics.fabrics().iter().map(|f| CoopNode::start(Arc::clone(f), config.clone()).unwrap()).collect();
        let homes = tierstack_coop::Homes::new(3).unwrap();
        let k = (1u64 + round * 100..).find(|&k| homes.home(k) == 2).unwrap();
        nodes[0].put(k, 0, &body(k, 0, PAGE_BYTES)).unwrap();
        let deadline = instant_now() + Duration::from_secs(10);
        while nodes[1].get(k).unwrap() == Lookup::Miss {
            assert!(instant_now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        while nodes[2].holders_at_home(k) != Some(0b011) {
            assert!(instant_now() < deadline, "{:?}", nodes[2].holders_at_home(k));
            std::thread::sleep(Duration::from_millis(1));
        }
        // Both ask at once (raw requests, as two evicting nodes send them).
        let before = nodes[2].message_counts().1;
        let ask = |from: usize, id: u64| {
            let msg = tierstack_coop::service::wire::Msg::RemoveIfShared { id, key: k }.encode();
            fabrics.fabrics()[from].send(NodeId(2), tierstack_fabric::Channel::COOP_CACHE, &msg).unwrap();
        };
        std::thread::scope(|s| {
            s.spawn(|| ask(0, 1 << 40));
            s.spawn(|| ask(1, 1 << 41));
        });
        while nodes[2].message_counts().1 < before + 2 {
            assert!(instant_now() < deadline, "the home never handled both requests");
            std::thread::sleep(Duration::from_millis(1));
        }
        let h_after = nodes[2].holders_at_home(k).unwrap();
        assert_eq!(h_after.count_ones(), 1, "round {round}: exactly one copy stays listed ({h_after:#b})");
    }
}

/// A peer whose inbox stays full (its service stopped reading; its fabric
/// still there) costs the node's stores at most a few send timeouts:
/// announces to it are skipped for a back-off after one fails (soft state),
/// not waited for under the state lock each time. Without the back-off
/// each of these stores (of keys homed elsewhere) would wait the fabric's
/// send timeout once the peer's ring is full, and the test would reach its
/// bound.
#[test]
fn announces_to_a_peer_that_stopped_reading_are_skipped_not_waited_for() {
    let fabrics = local_cluster(Backend::Shm, 3).unwrap();
    let ids: Vec<NodeId> = (0..3).map(NodeId).collect();
    let config = CoopConfig::new(Scheme::Bcc, ids, Vec::new(), u64::from(PAGES) * PAGE_BYTES);
    let mut nodes: Vec<CoopNode> =
        fabrics.fabrics().iter().map(|f| CoopNode::start(Arc::clone(f), config.clone()).unwrap()).collect();
    drop(nodes.pop());
    // Keys homed elsewhere: their holder updates do not need node 2.
    let homes = tierstack_coop::Homes::new(3).unwrap();
    let keys: Vec<u64> = (1..).filter(|&k| homes.home(k) != 2).take(20_000).collect();
    let stores = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for &k in &keys {
                nodes[0].put(k, 0, &body(k, 0, PAGE_BYTES)).unwrap();
                stores.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        // A bound only a hung test reaches.
        let deadline = instant_now() + Duration::from_secs(300);
        while stores.load(std::sync::atomic::Ordering::SeqCst) < 20_000 {
            assert!(instant_now() < deadline, "stores stuck behind a full peer");
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let stats = nodes[0].stats();
    assert!(stats.announces_skipped > 0, "{stats:?}");
}
