//! Each scheme's placement decisions against the seed's rules (coop §3,
//! seed-notes a.2), on tiny clusters where every state is spelled out.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use tierstack_coop::{Charge, Model, ModelConfig, MsgKind, Primitive, Scheme, Served, PAGE_BYTES};

const ONE_PAGE: u64 = PAGE_BYTES;

fn model(scheme: Scheme, active: usize, passive: usize, pages: u32) -> Model {
    Model::new(ModelConfig { scheme, active, passive, pages_per_node: pages }).unwrap()
}

fn scheme(name: &str) -> Scheme {
    name.parse().unwrap()
}

/// `n` distinct keys whose home is `home` (so message counts are predictable).
fn keys_homed_at(m: &Model, home: usize, n: usize) -> Vec<u64> {
    (1u64..).filter(|&k| m.home(k) == home).take(n).collect()
}

fn charge_of(outcome: &tierstack_coop::Outcome, p: Primitive) -> Charge {
    outcome.charges.iter().find(|(q, _)| *q == p).map(|(_, c)| *c).expect("primitive called")
}

fn request(m: &mut Model, node: usize, key: u64) -> tierstack_coop::Outcome {
    let out = m.request(node, key, ONE_PAGE).unwrap();
    m.check().unwrap();
    out
}

#[test]
fn ac_nodes_cache_on_their_own_and_send_nothing() {
    let mut m = model(scheme("ac"), 2, 0, 2);
    let k = keys_homed_at(&m, 1, 3);
    assert_eq!(request(&mut m, 0, k[0]).served, Served::Miss { by: 0 });
    // Another node's copy is never used.
    assert_eq!(request(&mut m, 1, k[0]).served, Served::Miss { by: 1 });
    assert_eq!(request(&mut m, 0, k[0]).served, Served::LocalHit);
    request(&mut m, 0, k[1]);
    let out = request(&mut m, 0, k[2]); // evicts the LRU, k[0]
    assert!(out.steps.is_empty() && out.charges.is_empty());
    assert!(!m.node(0).unwrap().contains(k[0]) && m.node(1).unwrap().contains(k[0]));
    assert!(m.tally().messages.is_empty());
}

#[test]
fn bcc_remote_hit_reads_one_sidedly_and_keeps_a_duplicate() {
    let mut m = model(scheme("bcc"), 2, 0, 4);
    let k = keys_homed_at(&m, 0, 1)[0];
    let miss = request(&mut m, 0, k);
    assert_eq!(miss.served, Served::Miss { by: 0 });
    // Stored locally; the home is the node itself: no message.
    assert_eq!(charge_of(&miss, Primitive::Store), Charge { control: 0, data: 0 });
    let hit = request(&mut m, 1, k);
    assert_eq!(hit.served, Served::RemoteHit { holder: 0 });
    assert_eq!(m.holders(k), vec![0, 1], "BCC keeps the duplicate");
    let kinds: Vec<MsgKind> = hit.steps.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, vec![MsgKind::DataRead, MsgKind::AddHolder]);
    assert_eq!(charge_of(&hit, Primitive::Fetch), Charge { control: 1, data: 1 });
}

#[test]
fn bcc_store_goes_local_then_remote_free_space_then_replaces_locally() {
    let mut m = model(scheme("bcc"), 2, 0, 2);
    let k = keys_homed_at(&m, 1, 5);
    request(&mut m, 0, k[0]);
    request(&mut m, 0, k[1]);
    // Node 0 is full; node 1 has free pages: STORE there, node 1 reads it.
    let out = request(&mut m, 0, k[2]);
    assert_eq!(m.holders(k[2]), vec![1]);
    let kinds: Vec<MsgKind> = out.steps.iter().filter(|s| s.charged).map(|s| s.kind).collect();
    assert_eq!(kinds, vec![MsgKind::Store, MsgKind::DataRead, MsgKind::StoreAck]);
    assert_eq!(charge_of(&out, Primitive::Store), Charge { control: 2, data: 1 });
    // Node 1's own record of holding it is consequential (not charged).
    assert!(out.steps.iter().any(|s| s.kind == MsgKind::Transfer && !s.charged) || m.home(k[2]) == 1);
    request(&mut m, 0, k[3]); // fills node 1
                              // No free space system-wide: replace node 0's LRU (k[0]).
    let out = request(&mut m, 0, k[4]);
    assert_eq!(m.holders(k[4]), vec![0]);
    assert!(m.holders(k[0]).is_empty());
    assert_eq!(out.lost, 1);
    assert_eq!(charge_of(&out, Primitive::Store), Charge { control: 2, data: 0 });
}

#[test]
fn ccwr_store_follows_the_five_step_priority() {
    // Two proxies of 2 pages each; one-page entities.
    let mut m = model(scheme("ccwr"), 2, 0, 2);
    let k = keys_homed_at(&m, 1, 8);
    // (i) local free space.
    request(&mut m, 0, k[0]);
    assert_eq!(m.holders(k[0]), vec![0]);
    // A remote hit with local free space keeps a copy: k[0] is now redundant.
    request(&mut m, 1, k[0]);
    assert_eq!(m.holders(k[0]), vec![0, 1]);
    // (ii) node 0 has a free page left, use it; then node 0 is full and
    // node 1 has one free page: remote free space beats local duplicates.
    request(&mut m, 0, k[1]);
    let out = request(&mut m, 0, k[2]);
    assert_eq!(m.holders(k[2]), vec![1], "(ii) remote free space first");
    assert_eq!(charge_of(&out, Primitive::Store), Charge { control: 2, data: 1 });
    // Now both are full; node 0 holds the redundant k[0]: (iii) replace it.
    let out = request(&mut m, 0, k[3]);
    assert_eq!(m.holders(k[3]), vec![0]);
    assert_eq!(m.holders(k[0]), vec![1], "(iii) the local duplicate went first");
    assert_eq!(out.lost, 0);
    // Node 0 holds sole copies k1, k3; node 1 sole copies k0, k2: no free
    // space, no duplicate anywhere, so (v) replaces node 0's LRU sole copy.
    // ((iv), a peer's duplicate, has its own test below.)
    let out = request(&mut m, 0, k[4]);
    assert_eq!(out.lost, 1);
    assert_eq!(m.holders(k[4]), vec![0]);
    assert!(m.holders(k[1]).is_empty(), "(v) the LRU sole copy was replaced");
}

#[test]
fn ccwr_fetch_swaps_when_there_is_no_free_space_or_duplicate() {
    // Three one-page proxies, each full of a sole copy.
    let mut m = model(scheme("ccwr"), 3, 0, 1);
    let k = keys_homed_at(&m, 1, 4);
    request(&mut m, 2, k[0]);
    request(&mut m, 0, k[1]);
    request(&mut m, 1, k[2]);
    // Node 0 fetches k2: no free space, no local duplicate, so it swaps
    // (coop Fig. 3): k1 goes to node 1 in k2's place.
    let out = request(&mut m, 0, k[2]);
    assert_eq!(out.served, Served::RemoteHit { holder: 1 });
    assert_eq!(m.holders(k[2]), vec![0]);
    assert_eq!(m.holders(k[1]), vec![1]);
    let charged: Vec<MsgKind> = out.steps.iter().filter(|s| s.charged).map(|s| s.kind).collect();
    assert_eq!(charged, vec![MsgKind::DataRead, MsgKind::Store, MsgKind::DataRead, MsgKind::StoreAck]);
    assert_eq!(charge_of(&out, Primitive::Fetch), Charge { control: 2, data: 2 });
    // The holder reports both transfers to the homes: consequential.
    assert!(out.steps.iter().filter(|s| !s.charged).all(|s| s.kind == MsgKind::Transfer));
    assert_eq!(out.lost, 0, "a swap loses nothing");
    assert_eq!(m.stats().swaps, 1);
    // No node has free space or duplicates now: a store replaces locally (v).
    let out = request(&mut m, 0, k[3]);
    assert_eq!(out.lost, 1);
    assert_eq!(m.holders(k[3]), vec![0]);
    assert!(m.holders(k[2]).is_empty());
}

#[test]
fn ccwr_remote_redundant_copies_come_before_replacement() {
    let mut m = model(scheme("ccwr"), 3, 0, 2);
    let k = keys_homed_at(&m, 2, 8);
    request(&mut m, 2, k[0]);
    request(&mut m, 2, k[1]); // node 2 full: k0 k1 (sole)
    request(&mut m, 1, k[0]); // node 1: k0 (dup)
    request(&mut m, 1, k[2]); // node 1 full: k0(dup) k2
                              // Node 2's k0 is redundant too; drop that by node 2 storing something
                              // would use (iii). Node 0 instead: fill it with sole copies first.
    request(&mut m, 0, k[3]);
    request(&mut m, 0, k[4]); // node 0 full: k3 k4
    let out = request(&mut m, 0, k[5]);
    // (iv): node 1 (or 2) drops its duplicate of k0 and takes k5.
    // Nodes 1 and 2 both hold a duplicate of k0; the lower id wins the tie.
    assert_eq!(m.holders(k[5]), vec![1]);
    assert_eq!(out.lost, 0, "no sole copy replaced while a duplicate existed");
    assert_eq!(m.holders(k[0]).len(), 1);
    assert_eq!(charge_of(&out, Primitive::Store), Charge { control: 2, data: 1 });
}

#[test]
fn ccwr_fetch_lands_in_local_free_space_or_a_local_duplicate() {
    let mut m = model(scheme("ccwr"), 2, 0, 2);
    let k = keys_homed_at(&m, 0, 4);
    request(&mut m, 0, k[0]);
    request(&mut m, 0, k[1]);
    let out = request(&mut m, 1, k[0]); // free space at node 1
    assert_eq!(charge_of(&out, Primitive::Fetch), Charge { control: 1, data: 1 });
    request(&mut m, 1, k[1]); // node 1 full: k0 k1, both redundant
    request(&mut m, 0, k[2]); // node 0 replaces its duplicate k0 (iii)
    assert_eq!(m.holders(k[0]), vec![1]);
    // Node 0 fetches k0 back: its duplicate k1 is replaced, no swap.
    let out = request(&mut m, 0, k[0]);
    assert_eq!(m.stats().swaps, 0);
    assert_eq!(m.holders(k[1]), vec![1]);
    // Node 0 is the home of both k0 and k1: its updates are applied locally.
    assert_eq!(charge_of(&out, Primitive::Fetch), Charge { control: 0, data: 1 });
}

#[test]
fn mtacc_uses_passive_memory_and_passive_nodes_are_never_homes() {
    let mut m = model(scheme("mtacc"), 2, 2, 1);
    for k in 0..10_000u64 {
        assert!(m.home(k) < 2);
    }
    assert!(matches!(m.request(2, 7, ONE_PAGE), Err(tierstack_coop::CoopError::NotActive { node: 2 })));
    let k = keys_homed_at(&m, 0, 4);
    for &key in &k {
        request(&mut m, 0, key);
    }
    // Four entities, four one-page nodes: all of them held, two on passive nodes.
    assert_eq!(m.distinct_entities(), 4);
    assert!(m.node(2).unwrap().len() + m.node(3).unwrap().len() == 2);
    // A back end may invalidate (coop §3.3): one message to the home.
    let out = m.invalidate(3, k[0]).unwrap();
    assert_eq!(charge_of(&out, Primitive::Invalidate), Charge { control: 1, data: 0 });
    assert!(m.holders(k[0]).is_empty());
    m.check().unwrap();
    // CCWR ignores the passive nodes.
    let mut c = model(scheme("ccwr"), 2, 2, 1);
    for &key in &k {
        request(&mut c, 0, key);
    }
    assert_eq!(c.distinct_entities(), 2);
}

#[test]
fn hybcc_duplicates_small_entities_on_proxies_and_spreads_large_ones() {
    let mut m = model(scheme("hybcc"), 2, 2, 8);
    let small = 8 << 10;
    let large = 16 << 10;
    let k = keys_homed_at(&m, 0, 12);
    // Small: BCC on the proxies, never on a passive node.
    for &key in &k[..6] {
        m.request(0, key, small).unwrap();
    }
    m.request(1, k[0], small).unwrap();
    assert_eq!(m.holders(k[0]), vec![0, 1], "small entities are duplicated");
    // Large: MTACC, so once proxies are full they go to passive nodes.
    for &key in &k[6..] {
        m.request(0, key, large).unwrap();
        m.check().unwrap();
    }
    let on_passive: usize = (2..4).map(|n| m.node(n).unwrap().len()).sum();
    assert!(on_passive > 0);
    for n in 2..4 {
        let cache = m.node(n).unwrap();
        assert!(cache.keys().all(|key| cache.get(key).unwrap().bytes == large));
    }
}

#[test]
fn groupcache_keeps_one_copy_at_the_owner_fetched_two_sidedly() {
    let mut m = model(Scheme::Groupcache, 4, 0, 16);
    let mut twosided = 0;
    for key in 0..40u64 {
        for node in 0..4 {
            let out = m.request(node, key, ONE_PAGE).unwrap();
            m.check().unwrap();
            assert!(out.steps.iter().all(|s| !s.kind.is_one_sided()));
            twosided += out.steps.len();
        }
        assert_eq!(m.holders(key).len(), 1, "one copy");
    }
    assert_eq!(twosided as u64, m.tally().messages.values().sum::<u64>());
    assert_eq!(m.tally().of(Primitive::Fetch).max(), Charge { control: 1, data: 1 });
}

#[test]
fn validate_reads_the_home_and_invalidate_drops_every_copy() {
    let mut m = model(scheme("bcc"), 3, 0, 4);
    let k = keys_homed_at(&m, 2, 1)[0];
    request(&mut m, 0, k);
    request(&mut m, 1, k);
    let v = m.validate(0, k).unwrap();
    assert_eq!(charge_of(&v, Primitive::Validate), Charge { control: 1, data: 0 });
    assert_eq!(v.steps[0].kind, MsgKind::HomeRead);
    assert_eq!(v.version, 0);
    let out = m.invalidate(0, k).unwrap();
    assert_eq!(charge_of(&out, Primitive::Invalidate), Charge { control: 1, data: 0 });
    // The home tells both holders (consequential).
    assert_eq!(out.steps.iter().filter(|s| s.kind == MsgKind::DropCopy && !s.charged).count(), 2);
    assert!(m.holders(k).is_empty());
    assert_eq!(m.version(k), 1);
    // The next request is a miss and caches the new version.
    assert_eq!(request(&mut m, 1, k).served, Served::Miss { by: 1 });
    assert_eq!(m.node(1).unwrap().get(k).unwrap().version, 1);
}
