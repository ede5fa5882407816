//! The proxy's handle (`tierstack_coop::CoopHandle`) across OS processes, on
//! shm and on tcp: three processes, each a tokio runtime running concurrent
//! fetch/store tasks over string keys, half of them responses with
//! dependencies. Every body is checked against its key (checksum), and so
//! are its metadata (key, length, deps). Then one process, a holder and a
//! home, is SIGKILLed: the survivors keep serving, misses and never an error
//! or a wrong body.
//!
//! The children are this test binary run again on `child_entry`, configured
//! by environment variables; each exits when its standard input closes.

use crate::common::Kid;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_coop::handle::{Fetched, Source};
use tierstack_coop::service::CoopConfig;
use tierstack_coop::{CoopHandle, Scheme, PAGE_BYTES};
use tierstack_fabric::{Fabric, NodeId};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};

/// The test the children run (its path in the crate's one test binary).
const CHILD_ENTRY: &str = "handle_processes::child_entry";

const BACKEND: &str = "TIERSTACK_COOP_HANDLE_BACKEND";
const ROOT: &str = "TIERSTACK_COOP_HANDLE_ROOT";
const PORTS: &str = "TIERSTACK_COOP_HANDLE_PORTS";
const NODE: &str = "TIERSTACK_COOP_HANDLE_NODE";
const SCHEME: &str = "TIERSTACK_COOP_HANDLE_SCHEME";
const NODES: u32 = 3;
const DOCS: u64 = 48;

/// The environment of child `id` (see `child_entry`).
fn child_env(backend: &str, root: &Path, ports: &[u16], id: u32, scheme: &str) -> Vec<(&'static str, String)> {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    vec![
        (BACKEND, backend.to_string()),
        (ROOT, root.display().to_string()),
        (PORTS, ports.join(",")),
        (NODE, id.to_string()),
        (SCHEME, scheme.to_string()),
    ]
}

fn key(doc: u64) -> String {
    format!("origin.test:8080/doc/{doc}?v=1")
}

/// Sizes vary (1 to 3 pages) so pages are reused across entities.
fn body(doc: u64) -> Vec<u8> {
    let len = 3000 + (doc % 3) * 4096;
    (0..len).map(|i| (tierstack_coop::key::mix(doc ^ (i / 8)) >> (8 * (i % 8))) as u8).collect()
}

/// Odd documents are responses with dependencies.
fn deps(doc: u64) -> Option<String> {
    (doc % 2 == 1).then(|| format!("n=0;i=00000000000000a1;page/{doc}={}@{}", doc * 7, doc % 5))
}

enum Opened {
    Shm(Arc<ShmFabric>),
    Tcp(Arc<TcpFabric>),
}

impl Opened {
    fn fabric(&self) -> Arc<dyn Fabric> {
        match self {
            Opened::Shm(f) => f.clone(),
            Opened::Tcp(f) => f.clone(),
        }
    }
}

fn open(backend: &str, root: &Path, ports: &[u16], id: u32) -> Opened {
    let ids: Vec<NodeId> = (0..NODES).map(NodeId).collect();
    match backend {
        "shm" => Opened::Shm(ShmFabric::open(ShmConfig::new(root, NodeId(id)).with_nodes(ids)).unwrap()),
        _ => {
            let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
            let config = TcpConfig::new(NodeId(id), addr(ports[id as usize]))
                .with_peers(ids.iter().map(|&n| (n, addr(ports[n.0 as usize]))))
                .with_op_timeout(Duration::from_millis(500));
            Opened::Tcp(TcpFabric::open(config).unwrap())
        }
    }
}

fn handle(fabric: Arc<dyn Fabric>, scheme: Scheme) -> CoopHandle {
    let ids: Vec<NodeId> = (0..NODES).map(NodeId).collect();
    let mut config = CoopConfig::new(scheme, ids, Vec::new(), 24 * PAGE_BYTES);
    config.ack_timeout = Duration::from_millis(500);
    CoopHandle::start(fabric, config).unwrap()
}

/// `n` requests over 4 concurrent tasks; a miss is "fetched from the
/// origin" and stored. Returns (served from the cache, wrong, remote hits).
fn run(rt: &tokio::runtime::Runtime, coop: &CoopHandle, seed: u64, n: u64) -> (u64, u64, u64) {
    rt.block_on(async {
        let tasks: Vec<_> = (0..4u64)
            .map(|t| {
                let coop = coop.clone();
                tokio::spawn(async move {
                    let (mut served, mut wrong, mut remote) = (0, 0, 0);
                    for i in 0..n / 4 {
                        let doc = tierstack_coop::key::mix(seed.wrapping_mul(7919) ^ (t << 32) ^ i) % DOCS + 1;
                        match coop.fetch(&key(doc)).await {
                            Fetched::Hit(hit) => {
                                served += 1;
                                remote += u64::from(matches!(hit.source, Source::Remote { .. }));
                                let expected = body(doc);
                                let right = tierstack_coop::fingerprint(&hit.body)
                                    == tierstack_coop::fingerprint(&expected)
                                    && hit.meta.key == key(doc)
                                    && hit.meta.length == expected.len() as u64
                                    && hit.meta.deps == deps(doc);
                                wrong += u64::from(!right);
                            }
                            Fetched::Miss(ticket) => coop.store(ticket, deps(doc), body(doc)).await,
                        }
                    }
                    (served, wrong, remote)
                })
            })
            .collect();
        let mut sum = (0, 0, 0);
        for t in tasks {
            let (s, w, r) = t.await.expect("a task never panics");
            sum = (sum.0 + s, sum.1 + w, sum.2 + r);
        }
        sum
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn ports_of(var: &str) -> Vec<u16> {
    var.split(',').filter(|s| !s.is_empty()).map(|p| p.parse().unwrap()).collect()
}

#[test]
fn child_entry() {
    let Ok(backend) = std::env::var(BACKEND) else { return };
    let root = PathBuf::from(std::env::var(ROOT).unwrap());
    let ports = ports_of(&std::env::var(PORTS).unwrap());
    let id: u32 = std::env::var(NODE).unwrap().parse().unwrap();
    let scheme: Scheme = std::env::var(SCHEME).unwrap().parse().unwrap();
    let opened = open(&backend, &root, &ports, id);
    let rt = runtime();
    let coop = handle(opened.fabric(), scheme);
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        if words.next() == Some("run") {
            let seed: u64 = words.next().unwrap().parse().unwrap();
            let n: u64 = words.next().unwrap().parse().unwrap();
            let (served, wrong, remote) = run(&rt, &coop, seed, n);
            println!("done {served} {wrong} {remote}");
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_ports(n: u32) -> Vec<u16> {
    // Bound together, released together: n distinct free ports.
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn processes(backend: &str, scheme: &str) {
    let nanos = tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let root = TempDir(std::env::temp_dir().join(format!("tierstack-coop-handle-{}-{nanos}", std::process::id())));
    std::fs::create_dir_all(&root.0).unwrap();
    let ports = if backend == "tcp" { free_ports(NODES) } else { Vec::new() };
    let opened = open(backend, &root.0, &ports, 0);
    let rt = runtime();
    let coop = handle(opened.fabric(), scheme.parse().unwrap());
    let mut kids: Vec<Kid> =
        (1..NODES).map(|id| Kid::spawn(CHILD_ENTRY, &child_env(backend, &root.0, &ports, id, scheme))).collect();
    for (i, kid) in kids.iter_mut().enumerate() {
        kid.start_run(i as u64 + 1, 800);
    }
    let (served, wrong, mut remote) = run(&rt, &coop, 99, 800);
    assert_eq!(wrong, 0, "{backend}/{scheme}: the parent got wrong bytes");
    for kid in &mut kids {
        let (s, w, r) = kid.finish_run();
        assert_eq!(w, 0, "{backend}/{scheme}: a child got wrong bytes");
        assert!(s > 0);
        remote += r;
    }
    assert!(served > 0 && remote > 0, "{backend}/{scheme}: cooperation happened ({served} served, {remote} remote)");
    // Kill node 2: a holder of some entities, the home (or owner) of others.
    let mut dead = kids.pop().unwrap();
    dead.child.kill();
    kids[0].start_run(7, 400);
    let (served_after, wrong, _) = run(&rt, &coop, 8, 400);
    assert_eq!(wrong, 0, "{backend}/{scheme}: wrong bytes after a kill");
    let (s, w, _) = kids[0].finish_run();
    assert_eq!(w, 0, "{backend}/{scheme}: a survivor got wrong bytes after the kill");
    assert!(served_after + s > 0, "the survivors still serve from their caches");
    // Noticed by a failed read or message, or by the membership poll first.
    let stats = coop.stats();
    assert!(stats.peer_failures + stats.takeovers > 0, "{backend}/{scheme}: the dead node was noticed");
}

#[test]
fn bcc_handle_across_processes_on_shm() {
    processes("shm", "bcc");
}

#[test]
fn ccwr_handle_across_processes_on_shm() {
    processes("shm", "ccwr");
}

#[test]
fn groupcache_handle_across_processes_on_shm() {
    processes("shm", "groupcache");
}

#[test]
fn bcc_handle_across_processes_on_tcp() {
    processes("tcp", "bcc");
}

#[test]
fn ccwr_handle_across_processes_on_tcp() {
    processes("tcp", "ccwr");
}

/// A handle refuses a passive node, and a fetch, store, validate and
/// invalidate on a lone node never fail.
#[test]
fn a_lone_handle_serves_its_own_copies_and_invalidates_them() {
    let root = TempDir(std::env::temp_dir().join(format!("tierstack-coop-handle-lone-{}", std::process::id())));
    std::fs::create_dir_all(&root.0).unwrap();
    let rt = runtime();
    let fabric = ShmFabric::open(ShmConfig::new(&root.0, NodeId(0)).with_nodes(vec![NodeId(0), NodeId(1)])).unwrap();
    let passive = CoopConfig::new(Scheme::Bcc, vec![NodeId(1)], vec![NodeId(0)], 8 * PAGE_BYTES);
    assert!(CoopHandle::start(fabric.clone(), passive).is_err());
    let config = CoopConfig::new(Scheme::Bcc, vec![NodeId(0)], Vec::new(), 8 * PAGE_BYTES);
    let coop = CoopHandle::start(fabric, config).unwrap();
    rt.block_on(async {
        let Fetched::Miss(ticket) = coop.fetch(&key(1)).await else { panic!("empty cache hit") };
        coop.store(ticket, deps(1), body(1)).await;
        let Fetched::Hit(hit) = coop.fetch(&key(1)).await else { panic!("stored, then missed") };
        assert_eq!((hit.body, hit.meta.deps, hit.source), (body(1), deps(1), Source::Local));
        // A newer response replaces the node's copy.
        let Fetched::Miss(ticket) = coop.fetch(&key(2)).await else { panic!() };
        coop.store(ticket.clone(), None, b"first".to_vec()).await;
        coop.store(ticket, None, b"second".to_vec()).await;
        let Fetched::Hit(hit) = coop.fetch(&key(2)).await else { panic!() };
        assert_eq!(hit.body, b"second");
        let Fetched::Miss(ticket) = coop.fetch(&key(3)).await else { panic!() };
        coop.store(ticket, None, body(3)).await;
        let Fetched::Hit(old) = coop.fetch(&key(3)).await else { panic!() };
        assert!(coop.validate(&old).await);
        coop.invalidate(&key(3)).await;
        assert!(!coop.validate(&old).await, "the version moved: the old copy is refused");
        let Fetched::Miss(ticket) = coop.fetch(&key(3)).await else { panic!("invalidated, still hit") };
        coop.store(ticket, None, b"new".to_vec()).await;
        let Fetched::Hit(new) = coop.fetch(&key(3)).await else { panic!() };
        assert_eq!(new.body, b"new");
        assert!(coop.validate(&new).await);
        // A store without a miss before it (a push) takes the home's version now.
        let ticket = coop.ticket(&key(5)).await;
        coop.store(ticket, deps(5), body(5)).await;
        let Fetched::Hit(pushed) = coop.fetch(&key(5)).await else { panic!("stored by ticket, then missed") };
        assert!(coop.validate(&pushed).await);
        // Too large for the pool: not stored, no error.
        let Fetched::Miss(ticket) = coop.fetch(&key(4)).await else { panic!() };
        coop.store(ticket, None, vec![1; 300 << 10]).await;
        assert!(matches!(coop.fetch(&key(4)).await, Fetched::Miss(_)));
    });
}
