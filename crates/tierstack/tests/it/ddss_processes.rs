//! Multi-process DDSS tests: every node's daemon and every client is a
//! separate `tierstack` process (the paper's Fig. 2: two client processes
//! share each node's substrate through its daemon), on `shm` and `tcp`.
//!
//! Clients run randomized puts and gets on keys of every coherence model and
//! print what they observed, stamped with `CLOCK_MONOTONIC` (one clock for
//! all processes of the host, so events of different processes are ordered
//! in real time). The crate's independent checkers then judge each key's
//! history against its model's definition. A failing run prints its seed;
//! `TIERSTACK_TEST_SEED=<seed>` replays the same operation mix.

use crate::exe;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tierstack_base::NodeId;
use tierstack_cluster::Backend;
use tierstack_ddss::check::{self, Event, History};
use tierstack_ddss::ipc::DdssClient;
use tierstack_ddss::{Coherence, DdssError, Key, Placement};
use tierstack_deploy::process::{write_topology, ChildNode, NodeLine};
use tierstack_testkit::ddss::every_model;

const DAEMONS: u32 = 2;
const CLIENTS: u32 = 4;
/// Client `c` is node `FIRST_CLIENT + c`, served by daemon `c % DAEMONS`.
const FIRST_CLIENT: u32 = DAEMONS;
/// The client that sends its gets and puts through its daemon instead of
/// using its own data path (the proxied fallback), so both paths meet.
const VIA_DAEMON_CLIENT: u32 = 3;
const VALUE_BYTES_MAX: usize = 64;
const TEMPORAL_MS: u64 = 2;
const DELTA_VERSIONS: u64 = 2;
/// Operations per client on the strict key: 4 clients stay within the
/// linearizability checker's event limit.
const STRICT_OPS_PER_CLIENT: usize = 24;

/// Daemons on nodes 0..DAEMONS; client nodes after them are passive (no region).
struct Site {
    dir: tempfile::TempDir,
    topology: PathBuf,
    daemons: Vec<ChildNode>,
}

impl Site {
    fn start(backend: Backend, name: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<NodeLine> = (0..DAEMONS + CLIENTS)
            .map(|id| NodeLine { id, role: if id < DAEMONS { "app" } else { "passive" }, cpu: None })
            .collect();
        let topology = write_topology(dir.path(), name, backend, 5000, &nodes).unwrap();
        let mut site = Site { dir, topology, daemons: Vec::new() };
        for node in 0..DAEMONS {
            let args = site.node_args("ddss-daemon", node, node);
            site.daemons.push(ChildNode::spawn(&exe(), &args).unwrap());
        }
        site
    }

    fn socket(&self, daemon: u32) -> PathBuf {
        self.dir.path().join(format!("ddss-{daemon}.sock"))
    }

    fn node_args(&self, sub: &str, node: u32, daemon: u32) -> Vec<String> {
        vec![
            sub.into(),
            "--topology".into(),
            self.topology.display().to_string(),
            "--node".into(),
            node.to_string(),
            "--socket".into(),
            self.socket(daemon).display().to_string(),
        ]
    }

    /// Closes every daemon's standard input and returns each one's final report.
    fn stop(self) -> Vec<Value> {
        let reports = self
            .daemons
            .into_iter()
            .map(|daemon| {
                let output = daemon.finish().unwrap();
                serde_json::from_str(output.lines().last().expect("a stop report")).unwrap()
            })
            .collect();
        for daemon in 0..DAEMONS {
            assert!(!self.dir.path().join(format!("ddss-{daemon}.sock")).exists(), "daemon {daemon} left its socket");
        }
        reports
    }
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// Parses a client's output: its events by key, and its closing summary.
fn parse_client(output: &str) -> (Vec<(Key, bool, Event)>, Value) {
    let mut events = Vec::new();
    let mut summary = Value::Null;
    for line in output.lines() {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad client line {line:?}: {e}"));
        if value.get("done").is_some() {
            summary = value;
            continue;
        }
        let key: Key = value["key"].as_str().unwrap().parse().unwrap();
        let (start, end) = (value["start_ns"].as_u64().unwrap(), value["end_ns"].as_u64().unwrap());
        let event = Event {
            client: value["client"].as_u64().unwrap() as u32,
            version: value["version"].as_u64().unwrap(),
            bytes: unhex(value["value"].as_str().unwrap()),
            invoked: start,
            responded: end,
            invoked_ns: start,
            responded_ns: end,
        };
        events.push((key, value["op"] == "put", event));
    }
    (events, summary)
}

/// Pairs of events of different clients that overlap in time.
fn overlaps(history: &History) -> usize {
    let all: Vec<&Event> = history.puts.iter().chain(&history.gets).collect();
    let mut count = 0;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.client != b.client && a.invoked < b.responded && b.invoked < a.responded {
                count += 1;
            }
        }
    }
    count
}

/// The most versions by which a get trailed the latest put completed before it began.
fn max_lag(history: &History) -> u64 {
    history
        .gets
        .iter()
        .map(|g| {
            let latest = history.puts.iter().filter(|p| p.responded < g.invoked).map(|p| p.version).max().unwrap_or(0);
            latest.saturating_sub(g.version)
        })
        .max()
        .unwrap_or(0)
}

/// Runs one client process per client node on `keys` (`ops` operations per
/// key each, pauses of up to `think_us_max`), started together, and adds
/// their events to `histories`.
fn run_round(
    site: &Site,
    keys: &[Key],
    ops: usize,
    think_us_max: u64,
    seed: u64,
    histories: &mut BTreeMap<String, History>,
) {
    let mut clients: Vec<ChildNode> = (0..CLIENTS)
        .map(|c| {
            let mut args = site.node_args("ddss-client", FIRST_CLIENT + c, c % DAEMONS);
            for key in keys {
                args.extend(["--key".to_string(), format!("{key}:{ops}")]);
            }
            let client_seed = seed.wrapping_add(u64::from(c)).to_string();
            let value_bytes_max = VALUE_BYTES_MAX.to_string();
            let think = think_us_max.to_string();
            args.extend(
                [
                    "--client",
                    &c.to_string(),
                    "--seed",
                    &client_seed,
                    "--value-bytes-max",
                    &value_bytes_max,
                    "--think-us-max",
                    &think,
                    "--wait-go",
                ]
                .map(String::from),
            );
            if c == VIA_DAEMON_CLIENT {
                args.push("--via-daemon".into());
            }
            ChildNode::spawn(&exe(), &args).unwrap()
        })
        .collect();
    for client in &mut clients {
        client.send_line("go").unwrap();
    }
    for (c, client) in clients.into_iter().enumerate() {
        let (events, summary) = parse_client(&client.finish().unwrap());
        assert_eq!(summary["done"], c as u64, "client {c} finished");
        assert_eq!(summary["events"].as_u64().unwrap() as usize, events.len());
        assert_eq!(events.len(), ops * keys.len(), "client {c} ran every operation");
        for (key, is_put, event) in events {
            let history = histories.get_mut(&key.to_string()).expect("an allocated key");
            if is_put {
                history.puts.push(event);
            } else {
                history.gets.push(event);
            }
        }
    }
}

/// Allocates one key per model through daemon 0's control socket, spread
/// over both nodes' regions (named and automatic placement).
fn allocate_keys(site: &Site) -> Vec<Key> {
    let mut control = DdssClient::connect(site.socket(0)).unwrap();
    let models = every_model(TEMPORAL_MS, DELTA_VERSIONS);
    let placements = [Placement::Node(NodeId(1)), Placement::Local, Placement::Auto];
    models
        .iter()
        .enumerate()
        .map(|(i, model)| control.allocate(VALUE_BYTES_MAX as u64, placements[i % placements.len()], *model).unwrap())
        .collect()
}

fn histories_hold_every_model(backend: Backend) {
    let seed = tierstack_testkit::test_seed();
    eprintln!("ddss_processes {backend:?}: seed {seed} (replay with TIERSTACK_TEST_SEED={seed})");
    let ops_per_key = match backend {
        Backend::Shm | Backend::Ucx => 300,
        Backend::Tcp => 150,
    };
    let site = Site::start(backend, &format!("ddss-{}", backend.name()));
    let keys = allocate_keys(&site);
    assert!(keys.iter().any(|k| k.home() == NodeId(0)) && keys.iter().any(|k| k.home() == NodeId(1)));

    // Round 1: the five relaxed-to-write models, many operations each.
    // Round 2: the strict key alone, few operations with longer pauses, so
    // the clients overlap while the history stays small enough to search
    // for a linearization.
    let (strict, relaxed): (Vec<Key>, Vec<Key>) = keys.iter().partition(|k| k.coherence() == Coherence::Strict);
    let mut histories: BTreeMap<String, History> = keys.iter().map(|k| (k.to_string(), History::default())).collect();
    run_round(&site, &relaxed, ops_per_key, 20, seed, &mut histories);
    run_round(&site, &strict, STRICT_OPS_PER_CLIENT, 300, seed ^ 0x5eed, &mut histories);

    let mut overlapping_keys = 0;
    for key in &keys {
        let history = &histories[&key.to_string()];
        let model = key.coherence();
        let label = format!("{backend:?} {model} (home {}) seed {seed}", key.home());
        let (overlaps, lag) = (overlaps(history), max_lag(history));
        eprintln!(
            "{label}: {} puts, {} gets, {overlaps} overlapping pairs, max lag {lag}",
            history.puts.len(),
            history.gets.len()
        );
        overlapping_keys += usize::from(overlaps > 0);
        assert!(!history.puts.is_empty() && !history.gets.is_empty(), "{label}: both puts and gets ran");
        let readers: std::collections::BTreeSet<u32> = history.gets.iter().map(|g| g.client).collect();
        assert!(readers.len() >= 2, "{label}: several processes read the key");
        check::untorn(history).unwrap_or_else(|v| panic!("{label}: untorn: {v}"));
        check::monotonic(history).unwrap_or_else(|v| panic!("{label}: monotonic: {v}"));
        check::write_ordered(history).unwrap_or_else(|v| panic!("{label}: write order: {v}"));
        match model {
            Coherence::Null => {}
            Coherence::Temporal { max_age_ms } => {
                check::temporal(history, max_age_ms * 1_000_000).unwrap_or_else(|v| panic!("{label}: temporal: {v}"))
            }
            Coherence::Delta { versions } => {
                check::delta(history, versions).unwrap_or_else(|v| panic!("{label}: delta: {v}"))
            }
            Coherence::Read | Coherence::Write => check::read(history).unwrap_or_else(|v| panic!("{label}: read: {v}")),
            Coherence::Strict => {
                check::read(history).unwrap_or_else(|v| panic!("{label}: read: {v}"));
                check::linearizable(history).unwrap_or_else(|v| panic!("{label}: linearizable: {v}"));
            }
        }
    }

    assert!(overlapping_keys > 0, "processes ran concurrently on some key (else the history proves little)");

    // Shown, not claimed: clients of daemon 0 used their own data path, so
    // that daemon performed no get or put; daemon 1 served the proxied client.
    let reports = site.stop();
    assert_eq!(reports[0]["stopped"], "stdin closed");
    let daemon0 = &reports[0]["stats"];
    assert_eq!(daemon0["puts"], 0, "daemon 0 performed puts: {daemon0}");
    assert_eq!(daemon0["gets_fetched"].as_u64().unwrap() + daemon0["gets_locked"].as_u64().unwrap(), 0);
    assert_eq!(daemon0["allocations"], keys.len() as u64, "every allocation went through daemon 0");
    assert!(reports[1]["stats"]["puts"].as_u64().unwrap() > 0, "daemon 1 served the proxied client");
}

#[test]
fn histories_hold_every_coherence_model_shm() {
    histories_hold_every_model(Backend::Shm);
}

#[test]
fn histories_hold_every_coherence_model_tcp() {
    histories_hold_every_model(Backend::Tcp);
}

/// On ucx over UCX shared memory (skipped, saying why, in a build without
/// UCX; CI requires it).
#[test]
fn histories_hold_every_coherence_model_ucx() {
    if !crate::ucx_or_skip() {
        return;
    }
    histories_hold_every_model(Backend::Ucx);
}

/// A key freed by one process fails for the others: the control path of
/// another node's daemon and a client process's own data path.
#[test]
fn a_freed_key_fails_in_every_process() {
    let site = Site::start(Backend::Shm, "ddss-freed");
    let mut on_node0 = DdssClient::connect(site.socket(0)).unwrap();
    let mut on_node1 = DdssClient::connect(site.socket(1)).unwrap();
    let key = on_node0.allocate(16, Placement::Node(NodeId(1)), Coherence::Read).unwrap();
    assert_eq!(on_node1.put(key, b"shared").unwrap(), 1);
    assert_eq!(on_node0.get(key).unwrap(), (1, b"shared".to_vec()));

    let client_args = |site: &Site| {
        let mut args = site.node_args("ddss-client", FIRST_CLIENT, 0);
        args.extend(["--key".to_string(), format!("{key}:5"), "--put-percent".into(), "0".into()]);
        args
    };
    let reader = ChildNode::spawn(&exe(), &client_args(&site)).unwrap();
    let (events, _) = parse_client(&reader.finish().unwrap());
    assert_eq!(events.len(), 5);
    assert!(events.iter().all(|(_, _, e)| e.version == 1 && e.bytes == b"shared"), "{events:?}");

    on_node1.free(key).unwrap();
    assert_eq!(on_node0.get(key), Err(DdssError::KeyFreed { key }));
    assert_eq!(on_node0.free(key), Err(DdssError::KeyFreed { key }));
    let reader = ChildNode::spawn(&exe(), &client_args(&site)).unwrap();
    let failure = reader.finish().expect_err("a get of a freed key fails the client");
    assert!(failure.to_string().contains("exit status"), "{failure}");
    site.stop();
}

/// The daemon stops cleanly on SIGTERM (here with `--ignore-stdin` and no
/// standard input at all): it reports why, exits successfully and removes
/// its socket.
#[test]
fn daemon_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let topology =
        write_topology(dir.path(), "ddss-term", Backend::Shm, 5000, &[NodeLine { id: 0, role: "app", cpu: None }])
            .unwrap();
    let socket = dir.path().join("term.sock");
    let mut child = Command::new(exe())
        .args(["ddss-daemon", "--topology", &topology.display().to_string(), "--node", "0"])
        .arg("--socket")
        .arg(&socket)
        .arg("--ignore-stdin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let client = DdssClient::connect(&socket).unwrap();
    assert_eq!(client.info().node, NodeId(0));
    assert_eq!(client.info().members, vec![NodeId(0)]);

    // SAFETY: signalling our own child process.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "the daemon handled SIGTERM and exited cleanly: {status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let report: Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(report["stopped"], "SIGTERM");
    assert!(!socket.exists(), "the socket was removed");
    assert_passive_node_cannot_run_a_daemon(dir.path());
}

/// A passive node holds no region, so it cannot host a daemon.
fn assert_passive_node_cannot_run_a_daemon(dir: &Path) {
    let nodes = [NodeLine { id: 0, role: "app", cpu: None }, NodeLine { id: 1, role: "passive", cpu: None }];
    let topology = write_topology(dir, "ddss-passive", Backend::Shm, 5000, &nodes).unwrap();
    let output = Command::new(exe())
        .args(["ddss-daemon", "--topology", &topology.display().to_string(), "--node", "1", "--socket"])
        .arg(dir.join("passive.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("passive"), "{output:?}");
}

/// True if `bytes` is one whole value of the clients' pattern (each byte 7
/// more than the one before): a value mixed from two puts breaks the chain.
fn is_whole_pattern(bytes: &[u8]) -> bool {
    bytes.windows(2).all(|w| w[1] == w[0].wrapping_add(7))
}

/// A client process killed (SIGKILL) while it puts in a tight loop may die
/// holding the key's lock, or in the middle of writing its value. Another
/// node must never find the key wedged (`LockBusy`) nor read a torn value:
/// the lock is taken over from the dead holder, and a half-written value is
/// reported `ValueLost` until the next put.
fn killed_writers_never_wedge_a_key(backend: Backend, rounds: usize) {
    let site = Site::start(backend, &format!("ddss-killed-{}", backend.name()));
    let mut home = DdssClient::connect(site.socket(1)).unwrap();
    let key = home.allocate(VALUE_BYTES_MAX as u64, Placement::Local, Coherence::Strict).unwrap();
    let mut version = 0;
    for round in 0..rounds {
        let mut args = site.node_args("ddss-client", FIRST_CLIENT, 0);
        args.extend(
            ["--key", &format!("{key}:2000000"), "--put-percent", "100", "--seed", &round.to_string(), "--wait-go"]
                .map(String::from),
        );
        let mut writer = ChildNode::spawn(&exe(), &args).unwrap();
        writer.send_line("go").unwrap();
        // Kill once the writer is seen putting (bounded wait).
        let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(60);
        while home.get(key).map(|(v, _)| v).unwrap_or(version + 1) <= version {
            assert!(tierstack_base::time::instant_now() < deadline, "round {round}: the writer never put");
        }
        // SAFETY: kill(2) on a child process this test owns.
        assert_eq!(unsafe { libc::kill(writer.pid() as libc::pid_t, libc::SIGKILL) }, 0);
        drop(writer); // reaps it

        match home.get(key) {
            Ok((_, bytes)) => assert!(is_whole_pattern(&bytes), "round {round}: torn value {bytes:?}"),
            Err(DdssError::ValueLost { key: lost }) => assert_eq!(lost, key),
            Err(e) => panic!("round {round}: the key is unusable after its writer died: {e}"),
        }
        let value = format!("after round {round}");
        let put = home.put(key, value.as_bytes()).unwrap_or_else(|e| panic!("round {round}: put failed: {e}"));
        assert!(put > version, "round {round}: version {put} after {version}");
        version = put;
        assert_eq!(home.get(key).unwrap(), (version, value.into_bytes()));
    }
    let reports = site.stop();
    eprintln!(
        "{}: {rounds} writers killed; locks taken over {}, values lost {}",
        backend.name(),
        reports[1]["stats"]["lock_takeovers"],
        reports[1]["stats"]["values_lost"]
    );
}

#[test]
fn killed_writers_never_wedge_a_key_shm() {
    killed_writers_never_wedge_a_key(Backend::Shm, 16);
}

#[test]
fn killed_writers_never_wedge_a_key_tcp() {
    killed_writers_never_wedge_a_key(Backend::Tcp, 8);
}
