//! Issue 34 items 2 and 3 across OS processes (shm): a stopped peer costs
//! only the requests that need it; a killed home is taken over by its ring
//! successor under load with purges going on, with no stale copy served and
//! no error.
//!
//! The children are this test binary run again on `load_entry` (or
//! `processes::child_entry`); each exits when its standard input closes.
//! They share an "origin" with the parent: a file of one version word per
//! document, bumped by the parent before each purge, so a body says which
//! version of its document it is.

use crate::common::Kid;
use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_coop::service::{CoopConfig, CoopNode, Lookup};
use tierstack_coop::{HashRing, Homes, Key, Scheme, PAGE_BYTES};
use tierstack_fabric::{Fabric, NodeId};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};

const LOAD_ENTRY: &str = "failures::load_entry";
const ROOT: &str = "TIERSTACK_COOP_FAIL_ROOT";
const NODE: &str = "TIERSTACK_COOP_FAIL_NODE";
/// The children's document count and key-table size (the churn test's).
const DOCS_ENV: &str = "TIERSTACK_COOP_FAIL_DOCS";
const TABLE_ENV: &str = "TIERSTACK_COOP_FAIL_TABLE";
const NODES: u32 = 3;
const DOCS: u64 = 60;
const BYTES: usize = 4096;
/// A bound on waits that only a hung test reaches.
const BOUND: Duration = Duration::from_secs(60);

fn temp_root(tag: &str) -> TempDir {
    let nanos = tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!("tierstack-coop-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn node(root: &Path, id: u32, scheme: Scheme, ack_timeout: Duration) -> (Arc<ShmFabric>, CoopNode) {
    node_with_table(root, id, scheme, ack_timeout, 1 << 16)
}

fn node_with_table(
    root: &Path,
    id: u32,
    scheme: Scheme,
    ack_timeout: Duration,
    table: u64,
) -> (Arc<ShmFabric>, CoopNode) {
    let ids: Vec<NodeId> = (0..NODES).map(NodeId).collect();
    let fabric = ShmFabric::open(ShmConfig::new(root, NodeId(id)).with_nodes(ids.clone())).unwrap();
    let mut config = CoopConfig::new(scheme, ids, Vec::new(), 24 * PAGE_BYTES);
    config.ack_timeout = ack_timeout;
    config.liveness_interval = Duration::from_millis(20);
    config.key_table_entries = table;
    let coop = CoopNode::start(fabric.clone() as Arc<dyn Fabric>, config).unwrap();
    (fabric, coop)
}

/// Document `key` at origin version `version`: it names both, then a
/// pattern they determine.
fn body(key: Key, version: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(BYTES);
    b.extend_from_slice(&key.to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend(
        (16..BYTES as u64).map(|i| (tierstack_coop::key::mix(key ^ (version << 32) ^ (i / 8)) >> (8 * (i % 8))) as u8),
    );
    b
}

/// The (key, version) a body claims, if it is a well-formed body.
fn parse(b: &[u8]) -> Option<(Key, u64)> {
    let key = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
    let version = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    (body(key, version) == b).then_some((key, version))
}

/// The shared origin: one version word per document.
struct Origin {
    file: std::fs::File,
    docs: u64,
}

impl Origin {
    fn open(root: &Path) -> Origin {
        Origin::with_docs(root, DOCS)
    }
    fn with_docs(root: &Path, docs: u64) -> Origin {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(root.join("origin"))
            .unwrap();
        file.set_len(docs * 8 + 8).unwrap();
        Origin { file, docs }
    }
    fn version(&self, key: Key) -> u64 {
        let mut w = [0u8; 8];
        self.file.read_exact_at(&mut w, key % self.docs * 8).unwrap();
        u64::from_le_bytes(w)
    }
    fn bump(&self, key: Key) -> u64 {
        let v = self.version(key) + 1;
        self.file.write_all_at(&v.to_le_bytes(), key % self.docs * 8).unwrap();
        v
    }
}

#[derive(Default, Debug)]
struct Tally {
    served: u64,
    /// Malformed bodies, or another document's.
    wrong: u64,
    /// Hits older than the origin's version when the request began (only
    /// meaningful where the purges are made: the parent).
    stale: u64,
    errors: u64,
}

/// One request as a proxy makes it: a hit is served only if its home
/// validates its version; a miss reads a ticket (the home's version), loads
/// the origin and stores at the ticket's version.
fn request(coop: &CoopNode, origin: &Origin, key: Key, t: &mut Tally) {
    let current = origin.version(key);
    match coop.get(key) {
        Err(_) => t.errors += 1,
        Ok(Lookup::Local { body: b, version } | Lookup::Remote { body: b, version, .. })
            if coop.validate(key) == Some(version) =>
        {
            t.served += 1;
            match parse(&b) {
                Some((k, v)) if k == key => t.stale += u64::from(v < current),
                _ => t.wrong += 1,
            }
        }
        Ok(_) => {
            if let Some(ticket) = coop.validate(key) {
                let v = origin.version(key);
                if coop.put(key, ticket, &body(key, v)).is_err() {
                    t.errors += 1;
                }
            }
        }
    }
}

fn doc(seed: u64, i: u64) -> Key {
    doc_of(seed, i, DOCS)
}

fn doc_of(seed: u64, i: u64, docs: u64) -> Key {
    tierstack_coop::key::mix(seed.wrapping_mul(7919) ^ i) % docs + 1
}

#[test]
fn load_entry() {
    let Ok(root) = std::env::var(ROOT) else { return };
    let id: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    let docs = std::env::var(DOCS_ENV).map_or(DOCS, |d| d.parse().unwrap());
    let table = std::env::var(TABLE_ENV).map_or(1 << 16, |t| t.parse().unwrap());
    let (_fabric, coop) = node_with_table(Path::new(&root), id, Scheme::Bcc, Duration::from_millis(500), table);
    let origin = Origin::with_docs(Path::new(&root), docs);
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<u64> = line.split_whitespace().skip(1).map(|w| w.parse().unwrap()).collect();
        if line.starts_with("run ") {
            let mut t = Tally::default();
            for i in 0..words[1] {
                request(&coop, &origin, doc_of(words[0], i, docs), &mut t);
            }
            println!("done {} {} {}", t.served, t.wrong, t.errors);
        }
    }
}

fn spawn_loaders(root: &Path) -> Vec<Kid> {
    (1..NODES).map(|id| Kid::spawn(LOAD_ENTRY, &[(ROOT, root.display().to_string()), (NODE, id.to_string())])).collect()
}

/// Polls `done` until it holds, failing the test after [`BOUND`].
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = instant_now() + BOUND;
    while !done() {
        assert!(instant_now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Item 3: node 2 is SIGKILLed while every node serves and the parent
/// purges. Its keys go to their ring successors: no request errs, the
/// parent never serves a copy older than a purge it finished, no body is
/// wrong anywhere, and its keys are pooled again at the successor.
#[test]
fn a_killed_home_is_taken_over_with_no_stale_copy_and_no_error() {
    let root = temp_root("takeover");
    let origin = Origin::open(&root.0);
    let (_fabric, coop) = node(&root.0, 0, Scheme::Bcc, Duration::from_millis(500));
    let mut kids = spawn_loaders(&root.0);
    let mut t = Tally::default();
    let mut purges = 0;
    let mut step = |coop: &CoopNode, t: &mut Tally, i: u64| {
        let key = doc(99, i);
        if i % 5 == 4 {
            origin.bump(key);
            coop.invalidate(key);
            purges += 1;
        }
        request(coop, &origin, key, t);
    };
    for (n, kid) in kids.iter_mut().enumerate() {
        kid.start_run(n as u64 + 1, 3000);
    }
    for i in 0..400 {
        step(&coop, &mut t, i);
    }
    let mut dead = kids.pop().unwrap();
    dead.child.kill();
    for i in 400..1400 {
        step(&coop, &mut t, i);
    }
    let (served, wrong, errors) = kids[0].finish_run();
    assert_eq!((wrong, errors), (0, 0), "the surviving child");
    assert!(served > 0);
    assert_eq!((t.wrong, t.stale, t.errors), (0, 0, 0), "the parent: {t:?} after {purges} purges");
    assert!(t.served > 0, "{t:?}");
    wait_for("the parent took node 2's keys over", || coop.stats().takeovers > 0);
    // Node 2's keys whose successor is this node are pooled here again:
    // the surviving child's stores of them are listed in this node's table.
    let homes = Homes::new(NODES as usize).unwrap();
    let taken: Vec<Key> = (1..=DOCS).filter(|&k| homes.home(k) == 2 && homes.home_among(k, 0b011) == 0).collect();
    assert!(!taken.is_empty());
    let mut seed = 100;
    wait_for("the survivor's copies of node 2's keys are listed at their successor", || {
        kids[0].start_run(seed, 300);
        seed += 1;
        assert_eq!(kids[0].finish_run().1, 0);
        taken.iter().any(|&k| coop.holders_at_home(k).is_some_and(|h| h & 0b010 != 0))
    });
    // Node 2 restarts (an empty key table): it takes its keys back, the
    // others drop their copies of them, and the purges go on, 0 stale.
    let takeovers = coop.stats().takeovers;
    let mut back = Kid::spawn(LOAD_ENTRY, &[(ROOT, root.0.display().to_string()), (NODE, "2".to_string())]);
    wait_for("the parent saw node 2 back", || coop.stats().takeovers > takeovers);
    back.start_run(7, 1000);
    kids[0].start_run(8, 1000);
    let mut t = Tally::default();
    for i in 1400..2400 {
        step(&coop, &mut t, i);
    }
    for kid in [&mut back, &mut kids[0]] {
        let (_, wrong, errors) = kid.finish_run();
        assert_eq!((wrong, errors), (0, 0));
    }
    assert_eq!((t.wrong, t.stale, t.errors), (0, 0, 0), "the parent after the restart: {t:?}");
    assert!(t.served > 0, "{t:?}");
    // Its keys are no longer listed here.
    assert!(taken.iter().all(|&k| coop.holders_at_home(k).is_none()));
}

/// Item 1 across processes: three BCC nodes whose key tables hold 16
/// entries each (capacity 1, one probe window) stream thousands of mostly
/// distinct keys, far more than the tables hold, while the parent purges
/// every third key it stored and requests it again. Homes refuse to list
/// what they cannot hold (the copies are dropped), and the parent never
/// serves a copy older than a purge it finished.
#[test]
fn churning_distinct_keys_through_full_key_tables_leaves_no_stale_copy() {
    const CHURN_DOCS: u64 = 20_000;
    const TABLE: u64 = 1;
    let root = temp_root("churn");
    let origin = Origin::with_docs(&root.0, CHURN_DOCS);
    let (_fabric, coop) = node_with_table(&root.0, 0, Scheme::Bcc, Duration::from_millis(500), TABLE);
    let mut kids: Vec<Kid> = (1..NODES)
        .map(|id| {
            Kid::spawn(
                LOAD_ENTRY,
                &[
                    (ROOT, root.0.display().to_string()),
                    (NODE, id.to_string()),
                    (DOCS_ENV, CHURN_DOCS.to_string()),
                    (TABLE_ENV, TABLE.to_string()),
                ],
            )
        })
        .collect();
    for (n, kid) in kids.iter_mut().enumerate() {
        kid.start_run(n as u64 + 1, 3000);
    }
    let mut t = Tally::default();
    for i in 0..2000 {
        let key = doc_of(99, i, CHURN_DOCS);
        request(&coop, &origin, key, &mut t);
        request(&coop, &origin, key, &mut t);
        if i % 3 == 0 {
            origin.bump(key);
            coop.invalidate(key);
            request(&coop, &origin, key, &mut t);
        }
    }
    for kid in &mut kids {
        let (_, wrong, errors) = kid.finish_run();
        assert_eq!((wrong, errors), (0, 0));
    }
    assert_eq!((t.wrong, t.stale, t.errors), (0, 0, 0), "{t:?}");
    assert!(t.served > 0, "{t:?}");
    let stats = coop.stats();
    assert!(stats.key_table_full > 0, "the parent's table never filled: {stats:?}");
    let occupancy = coop.occupancy();
    assert!(occupancy.home_keys <= 16, "{occupancy:?}");
}

/// Item 2: with peer 2 SIGSTOPped, one request that needs it waits (its
/// answer bounded by a long `ack_timeout`), while many requests for keys
/// that do not involve it complete, before that one does.
fn stopped_peer(scheme: Scheme, involves_2: impl Fn(Key) -> bool, stalled: impl Fn(&CoopNode, Key) + Sync) {
    let root = temp_root("stopped");
    let (_fabric, coop) = node(&root.0, 0, scheme, Duration::from_secs(30));
    let kids: Vec<Kid> = (1..NODES)
        .map(|id| {
            Kid::spawn(
                "processes::child_entry",
                &[
                    ("TIERSTACK_COOP_CHILD_ROOT", root.0.display().to_string()),
                    ("TIERSTACK_COOP_CHILD_NODE", id.to_string()),
                    ("TIERSTACK_COOP_CHILD_SCHEME", scheme.name().to_string()),
                ],
            )
        })
        .collect();
    // Few enough to fit this node's pool: none of their stores needs a peer.
    let others: Vec<Key> = (1..400u64).filter(|&k| !involves_2(k)).take(20).collect();
    let needs_2 = (1..400u64).find(|&k| involves_2(k)).unwrap();
    // Node 1 pools the other keys, so some of the requests below are remote.
    for &k in &others {
        if coop.get(k).unwrap() == Lookup::Miss {
            coop.put(k, 0, &body(k, 0)).unwrap();
        }
    }
    kids[1].child.stop();
    let finished = AtomicBool::new(false);
    let sent_before = coop.message_counts().0;
    std::thread::scope(|s| {
        s.spawn(|| {
            stalled(&coop, needs_2);
            finished.store(true, Ordering::SeqCst);
        });
        // The stalled request has sent its message to node 2.
        wait_for("the request to the stopped peer went out", || coop.message_counts().0 > sent_before);
        let mut done = 0;
        for round in 0..10 {
            for &k in &others {
                if coop.get(k).unwrap() == Lookup::Miss {
                    coop.put(k, round, &body(k, round)).unwrap();
                }
                done += 1;
            }
        }
        // Both say the stalled request has not ended: its flag, and no wait
        // has run out (the flag alone could race with its end).
        let pending = !finished.load(Ordering::SeqCst);
        let timeouts = coop.stats().stall_timeouts;
        kids[1].child.cont();
        assert!(pending, "{scheme:?}: the {done} other requests waited for the stalled one");
        assert_eq!(timeouts, 0, "{scheme:?}: the other requests ran after the stalled one timed out");
        assert_eq!(done, 200);
    });
    assert!(finished.load(Ordering::SeqCst));
    drop(kids);
}

#[test]
fn a_stopped_groupcache_owner_stalls_only_its_own_keys() {
    let ring = HashRing::new(NODES as usize).unwrap();
    stopped_peer(
        Scheme::Groupcache,
        |k| ring.owner(k) == 2,
        |coop, k| {
            let _ = coop.get(k).unwrap();
        },
    );
}

#[test]
fn a_stopped_home_stalls_only_purges_of_its_own_keys() {
    let homes = Homes::new(NODES as usize).unwrap();
    stopped_peer(Scheme::Bcc, |k| homes.home(k) == 2, |coop, k| coop.invalidate(k));
}
