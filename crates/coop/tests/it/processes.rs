//! The service across OS processes (shm): three proxy processes run a
//! request mix concurrently with every body checksummed; then a holder and
//! home process is SIGKILLed and the survivors keep serving: misses, never
//! errors or wrong bytes.
//!
//! The children are this test binary run again on its `child_entry` test
//! with the node in an environment variable; each exits when its standard
//! input closes, so a failed test leaves no process behind.

use crate::common::Kid;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tierstack_coop::service::{CoopConfig, CoopNode, Lookup};
use tierstack_coop::{Scheme, PAGE_BYTES};
use tierstack_fabric::{Fabric, NodeId, PeerState};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};

/// The test the children run (its path in the crate's one test binary).
const CHILD_ENTRY: &str = "processes::child_entry";

const ROOT: &str = "TIERSTACK_COOP_CHILD_ROOT";
const NODE: &str = "TIERSTACK_COOP_CHILD_NODE";
const SCHEME: &str = "TIERSTACK_COOP_CHILD_SCHEME";
const NODES: u32 = 3;
const BYTES: u64 = 8 << 10;
const DOCS: u64 = 40;

fn body(key: u64) -> Vec<u8> {
    (0..BYTES).map(|i| (tierstack_coop::key::mix(key ^ (i / 8)) >> (8 * (i % 8))) as u8).collect()
}

fn node(root: &Path, id: u32, scheme: Scheme) -> (Arc<ShmFabric>, CoopNode) {
    let ids: Vec<NodeId> = (0..NODES).map(NodeId).collect();
    let fabric = ShmFabric::open(ShmConfig::new(root, NodeId(id)).with_nodes(ids.clone())).unwrap();
    let mut config = CoopConfig::new(scheme, ids, Vec::new(), 16 * PAGE_BYTES);
    config.ack_timeout = Duration::from_millis(500);
    let coop = CoopNode::start(fabric.clone() as Arc<dyn Fabric>, config).unwrap();
    (fabric, coop)
}

/// `n` requests from a seeded stream: a miss is fetched from "the origin"
/// (`body`) and stored. Returns (served from cache, wrong bodies).
fn run(coop: &CoopNode, seed: u64, n: u64) -> (u64, u64) {
    let (mut served, mut wrong) = (0, 0);
    for i in 0..n {
        let key = tierstack_coop::key::mix(seed.wrapping_mul(7919) ^ i) % DOCS + 1;
        match coop.get(key).expect("a request never errors") {
            Lookup::Local { body: b, .. } | Lookup::Remote { body: b, .. } => {
                served += 1;
                if b != body(key) {
                    wrong += 1;
                }
            }
            Lookup::Miss => coop.put(key, 0, &body(key)).expect("a store never errors"),
        }
    }
    (served, wrong)
}

#[test]
fn child_entry() {
    let Ok(root) = std::env::var(ROOT) else { return };
    let id: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    let scheme: Scheme = std::env::var(SCHEME).unwrap().parse().unwrap();
    let (_fabric, coop) = node(Path::new(&root), id, scheme);
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        if words.next() == Some("run") {
            let seed: u64 = words.next().unwrap().parse().unwrap();
            let n: u64 = words.next().unwrap().parse().unwrap();
            let (served, wrong) = run(&coop, seed, n);
            let s = coop.stats();
            println!("done {served} {wrong} {}", s.remote_hits);
        }
    }
}

fn processes(scheme: &str) {
    let root = tempfile_dir();
    let (fabric, coop) = node(root.path(), 0, scheme.parse().unwrap());
    let mut kids: Vec<Kid> = (1..NODES)
        .map(|id| {
            Kid::spawn(
                CHILD_ENTRY,
                &[(ROOT, root.path().display().to_string()), (NODE, id.to_string()), (SCHEME, scheme.to_string())],
            )
        })
        .collect();
    // Concurrent mixes in three processes.
    for (i, kid) in kids.iter_mut().enumerate() {
        kid.start_run(i as u64 + 1, 600);
    }
    let (served, wrong) = run(&coop, 99, 600);
    assert_eq!(wrong, 0, "{scheme}: the parent got wrong bytes");
    let mut remote = coop.stats().remote_hits;
    for kid in &mut kids {
        let (s, w, r) = kid.finish_run();
        assert_eq!(w, 0, "{scheme}: a child got wrong bytes");
        assert!(s > 0);
        remote += r;
    }
    assert!(served > 0 && remote > 0, "{scheme}: cooperation happened ({served} served, {remote} remote)");
    // Kill node 2 (a holder of some entities and the home of others).
    let mut dead = kids.pop().unwrap();
    dead.child.kill();
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(10);
    while fabric.peer_state(NodeId(2)) != PeerState::Gone {
        assert!(tierstack_base::time::instant_now() < deadline, "node 2 never reported gone");
        std::thread::sleep(Duration::from_millis(5));
    }
    kids[0].start_run(7, 400);
    let (_, wrong) = run(&coop, 8, 400);
    assert_eq!(wrong, 0, "{scheme}: wrong bytes after a kill");
    let (_, w, _) = kids[0].finish_run();
    assert_eq!(w, 0);
    // The dead node's keys are its ring successor's now: a validate of one
    // is answered (by a live home), not an error.
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(10);
    while coop.stats().takeovers == 0 {
        assert!(tierstack_base::time::instant_now() < deadline, "the dead home was never taken over");
        std::thread::sleep(Duration::from_millis(5));
    }
    let homed_dead = (1..).find(|&k| tierstack_coop::Homes::new(3).unwrap().home(k) == 2).unwrap();
    assert!(coop.validate(homed_dead).is_some());
}

fn tempfile_dir() -> TempDir {
    let path = std::env::temp_dir().join(format!("tierstack-coop-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

fn rand_suffix() -> u64 {
    tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn bcc_across_processes_checks_every_body_and_survives_a_kill() {
    processes("bcc");
}

#[test]
fn ccwr_across_processes_checks_every_body_and_survives_a_kill() {
    processes("ccwr");
}
