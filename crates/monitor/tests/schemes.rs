//! The four schemes against a back end in the same process (nodes are
//! fabric endpoints of an in-process cluster): what each reports, its
//! staleness rule, and death.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_cluster::{local_cluster, Backend};
use tierstack_monitor::{
    open_source, AgentConfig, BackendAddress, Gauge, Health, LoadPublisher, LoadSource, MonitorAgent, Reading, Scheme,
    SourceConfig,
};

const INTERVAL: Duration = Duration::from_millis(2);
/// Bound on waiting for an async scheme to catch up: a hang guard, not a speed claim.
const PATIENCE: Duration = Duration::from_secs(20);

fn config() -> SourceConfig {
    SourceConfig { stale_after: Duration::from_millis(200), ..SourceConfig::for_interval(INTERVAL) }
}

/// Reads until `done` holds (async schemes catch up within some intervals).
fn read_until(source: &dyn LoadSource, done: impl Fn(&Reading) -> bool) -> Reading {
    let deadline = instant_now() + PATIENCE;
    loop {
        let reading = source.read(0);
        if done(&reading) || instant_now() > deadline {
            return reading;
        }
        std::thread::yield_now();
    }
}

struct Rig {
    _cluster: tierstack_cluster::LocalCluster,
    publisher: Arc<LoadPublisher>,
    agent: Option<MonitorAgent>,
    source: Arc<dyn LoadSource>,
}

fn rig(backend: Backend, scheme: Scheme) -> Rig {
    let cluster = local_cluster(backend, 2).unwrap();
    let publisher = LoadPublisher::register(cluster.fabric(1).as_ref()).unwrap();
    let agent_config =
        AgentConfig { interval: INTERVAL, write_record: true, socket_listen: Some("127.0.0.1:0".parse().unwrap()) };
    let agent = MonitorAgent::start(publisher.clone(), agent_config).unwrap();
    let address = BackendAddress { node: Some(NodeId(1)), socket: agent.socket_addr() };
    let source = open_source(scheme, Some(cluster.fabric(0).clone()), &[address], config()).unwrap();
    Rig { _cluster: cluster, publisher, agent: Some(agent), source }
}

/// Every scheme: a value sampled after a change reflects it (the staleness
/// rule: a reading is exactly as old as its `t_ns` says), and readings
/// become fresh.
#[test]
fn every_scheme_reports_the_counters_as_of_its_sample_time() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let rig = rig(backend, scheme);
            let what = format!("{scheme} on {}", backend.name());
            let mut guards = Vec::new();
            for step in 1..=5u16 {
                guards.push(rig.publisher.enter(Gauge::RunningThreads));
                guards.push(rig.publisher.enter(Gauge::InFlightRequests));
                let changed = host_monotonic_ns();
                let reading = read_until(rig.source.as_ref(), |r| r.record.t_ns > changed);
                assert!(reading.record.t_ns > changed, "{what}: never sampled after the change");
                assert_eq!(reading.health, Health::Fresh, "{what}");
                assert_eq!(reading.record.counters.running_threads, step, "{what}");
                assert_eq!(reading.record.counters.in_flight_requests, step, "{what}");
                assert!(reading.read_ns >= reading.record.t_ns, "{what}: read before sampled");
            }
            guards.clear();
            let changed = host_monotonic_ns();
            let reading = read_until(rig.source.as_ref(), |r| r.record.t_ns > changed);
            assert_eq!(reading.record.counters.load(), 0, "{what}");
        }
    }
}

/// RDMA-Sync reads the counters word itself: every read right after a
/// change shows it (staleness 0), with no monitor thread on the back end.
#[test]
fn rdma_sync_needs_no_back_end_thread_and_is_never_behind() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2).unwrap();
        let publisher = LoadPublisher::register(cluster.fabric(1).as_ref()).unwrap();
        let address = BackendAddress { node: Some(NodeId(1)), socket: None };
        let source = open_source(Scheme::RdmaSync, Some(cluster.fabric(0).clone()), &[address], config()).unwrap();
        let mut guards = Vec::new();
        for step in 1..=50u16 {
            guards.push(publisher.enter(Gauge::QueueLength));
            let reading = source.read(0);
            assert_eq!(reading.health, Health::Fresh);
            assert_eq!(reading.record.counters.queue_len, step, "{}", backend.name());
        }
    }
}

/// RDMA-Async whose monitor thread stops (a live node, its sampler
/// starved or gone) turns stale, not dead, and keeps its last value.
#[test]
fn a_silent_sampler_makes_rdma_async_readings_stale_not_dead() {
    let mut rig = rig(Backend::Shm, Scheme::RdmaAsync);
    let _busy = rig.publisher.enter(Gauge::RunningThreads);
    let fresh =
        read_until(rig.source.as_ref(), |r| r.health == Health::Fresh && r.record.counters.running_threads == 1);
    assert_eq!(fresh.health, Health::Fresh);
    rig.agent = None;
    let stale = read_until(rig.source.as_ref(), |r| r.health != Health::Fresh);
    assert_eq!(stale.health, Health::Stale);
    assert_eq!(stale.record.counters.running_threads, 1, "the last value is kept");
}

/// Socket-Async from a monitor that sent one frame and then fell silent
/// with its connection open (a starved monitor thread): stale, not dead.
#[test]
fn a_silent_socket_monitor_makes_socket_async_readings_stale_not_dead() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 1];
        stream.read_exact(&mut request).unwrap();
        assert_eq!(request[0], tierstack_monitor::agent::REQUEST_SUBSCRIBE);
        let counters = tierstack_monitor::Counters { queue_len: 3, ..Default::default() };
        let record = tierstack_monitor::LoadRecord { t_ns: host_monotonic_ns(), counters, ..Default::default() };
        stream.write_all(&tierstack_monitor::agent::encode_frame(&record)).unwrap();
        // Silent from now on, connection open, until the client leaves.
        let _ = stream.read(&mut request);
    });
    let address = BackendAddress { node: None, socket: Some(addr) };
    let source = open_source(Scheme::SocketAsync, None, &[address], config()).unwrap();
    let fresh = read_until(source.as_ref(), |r| r.health == Health::Fresh);
    assert_eq!((fresh.health, fresh.record.counters.queue_len), (Health::Fresh, 3));
    let stale = read_until(source.as_ref(), |r| r.health != Health::Fresh);
    assert_eq!((stale.health, stale.record.counters.queue_len), (Health::Stale, 3));
    drop(source);
    server.join().unwrap();
}

/// A back end that goes away is reported dead by every scheme.
#[test]
fn a_closed_back_end_is_reported_dead_by_every_scheme() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let cluster = local_cluster(backend, 2).unwrap();
            let mut fabrics = cluster.fabrics().to_vec();
            let publisher = LoadPublisher::register(fabrics[1].as_ref()).unwrap();
            let agent_config = AgentConfig {
                interval: INTERVAL,
                write_record: true,
                socket_listen: Some("127.0.0.1:0".parse().unwrap()),
            };
            let agent = MonitorAgent::start(publisher.clone(), agent_config).unwrap();
            let address = BackendAddress { node: Some(NodeId(1)), socket: agent.socket_addr() };
            let source = open_source(scheme, Some(fabrics[0].clone()), &[address], config()).unwrap();
            let what = format!("{scheme} on {}", backend.name());
            let first = read_until(source.as_ref(), |r| r.health == Health::Fresh);
            assert_eq!(first.health, Health::Fresh, "{what}");
            // The node ends: its monitor and its fabric endpoint close.
            drop(agent);
            drop(publisher);
            drop(cluster);
            fabrics.remove(1);
            let after = read_until(source.as_ref(), |r| r.health == Health::Dead);
            assert_eq!(after.health, Health::Dead, "{what}");
        }
    }
}

#[test]
fn schemes_parse_by_name_and_refuse_missing_addresses() {
    for scheme in Scheme::ALL {
        assert_eq!(scheme.name().parse::<Scheme>().unwrap(), scheme);
    }
    assert!("rdma".parse::<Scheme>().is_err());
    let no_socket = [BackendAddress { node: Some(NodeId(1)), socket: None }];
    assert!(open_source(Scheme::SocketSync, None, &no_socket, config()).is_err());
    let no_node = [BackendAddress { node: None, socket: Some("127.0.0.1:1".parse().unwrap()) }];
    let cluster = local_cluster(Backend::Shm, 1).unwrap();
    assert!(open_source(Scheme::RdmaSync, Some(cluster.fabric(0).clone()), &no_node, config()).is_err());
    assert!(open_source(Scheme::RdmaSync, None, &no_socket, config()).is_err());
}

/// A reading's value against the truth: the back end logs each change as
/// (before, after, value) on the host clock; value `v` may have held from the
/// `before` of the change that set it to the `after` of the next change.
fn held_within(log: &[(u64, u64, u32)], value: u32, from_ns: u64, to_ns: u64) -> bool {
    log.iter().enumerate().any(|(k, &(set_before, _, v))| {
        let until = log.get(k + 1).map_or(u64::MAX, |next| next.1);
        v == value && set_before <= to_ns && until >= from_ns
    })
}

/// The staleness bound of every scheme, asserted (shm and tcp): a reading
/// the source calls fresh carries a value that held at some instant no
/// earlier than the bound before the read began — 0 for the sync schemes
/// (sampled during the read), `stale_after` for the async ones — while the
/// back end's load changes every few hundred microseconds.
#[test]
fn a_fresh_reading_is_never_older_than_its_schemes_bound() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let rig = rig(backend, scheme);
            let what = format!("{scheme} on {}", backend.name());
            let bound_ns = match scheme {
                Scheme::RdmaSync | Scheme::SocketSync => 0,
                _ => u64::try_from(config().stale_after.as_nanos()).unwrap(),
            };
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (log, readings) = std::thread::scope(|scope| {
                let changer = scope.spawn(|| {
                    let mut rng = tierstack_base::seeded_rng(7);
                    let (mut held, mut log) = (Vec::new(), vec![(0, 0, 0u32)]);
                    for _ in 0..300 {
                        use rand::Rng;
                        let before = host_monotonic_ns();
                        if held.is_empty() || (held.len() < 20 && rng.gen_bool(0.5)) {
                            held.push(rig.publisher.enter(Gauge::RunningThreads));
                        } else {
                            held.pop();
                        }
                        log.push((before, host_monotonic_ns(), held.len() as u32));
                        // The workload's pace (not a synchronization).
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    // One guard at a time: each drop is a change of its own.
                    while !held.is_empty() {
                        let before = host_monotonic_ns();
                        held.pop();
                        log.push((before, host_monotonic_ns(), held.len() as u32));
                    }
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    log
                });
                let mut readings = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let before = host_monotonic_ns();
                    let reading = rig.source.read(0);
                    readings.push((before, host_monotonic_ns(), reading));
                }
                (changer.join().unwrap(), readings)
            });
            let fresh: Vec<_> = readings.iter().filter(|(_, _, r)| r.health == Health::Fresh).collect();
            let distinct: std::collections::BTreeSet<u32> =
                fresh.iter().map(|(_, _, r)| r.record.counters.load()).collect();
            assert!(distinct.len() >= 3, "{what}: the readings followed too few changes: {distinct:?}");
            for (before, after, reading) in fresh {
                let value = reading.record.counters.load();
                assert!(
                    held_within(&log, value, before.saturating_sub(bound_ns), *after),
                    "{what}: fresh value {value} read in [{before}, {after}] held nowhere within {bound_ns} ns before"
                );
            }
        }
    }
}

/// A Socket-Sync monitor that accepts and never answers (a stopped
/// process: the kernel accepts into its backlog): the first read waits at
/// most the suspicion bound and says Suspect; later reads within the bound
/// say Suspect at once, without asking again (counted at the server).
#[test]
fn a_hung_read_is_not_retried_within_the_bound() {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counting = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let counting = counting.clone();
            std::thread::spawn(move || {
                let mut byte = [0u8; 1];
                while matches!(stream.read(&mut byte), Ok(1)) {
                    counting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let bound = Duration::from_millis(300);
    let hung_config = SourceConfig { suspect_after: Some(bound), ..config() };
    let address = BackendAddress { node: None, socket: Some(addr) };
    let source = open_source(Scheme::SocketSync, None, &[address], hung_config).unwrap();
    let started = host_monotonic_ns();
    let reads = 50;
    for _ in 0..reads {
        assert_eq!(source.read(0).health, Health::Suspect);
    }
    let elapsed = host_monotonic_ns() - started;
    // Each request waits out the bound, then none is sent for the bound: at
    // most one request per two bounds of elapsed time, however slow the host
    // (a source that asked on every read would send one per bound).
    let windows = elapsed / (2 * u64::try_from(bound.as_nanos()).unwrap()) + 1;
    let asked = asked.load(std::sync::atomic::Ordering::Relaxed);
    assert!(asked >= 1, "the first read asked");
    assert!(asked <= windows, "{asked} requests for {reads} reads in {elapsed} ns, bound {bound:?}");
}

/// RDMA-Async whose sampler stops while the node's runtime still beats
/// (a starved monitor thread on a busy node): stale, never suspect, since
/// the live progress word moves; once the beating stops too, suspect.
#[test]
fn a_silent_sampler_on_a_beating_node_is_stale_not_suspect() {
    let mut rig = rig(Backend::Shm, Scheme::RdmaAsync);
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beater = {
        let (publisher, beating) = (rig.publisher.clone(), beating.clone());
        std::thread::spawn(move || {
            while beating.load(std::sync::atomic::Ordering::Relaxed) {
                publisher.beat();
                std::thread::sleep(tierstack_monitor::publisher::HEARTBEAT);
            }
        })
    };
    let fresh = read_until(rig.source.as_ref(), |r| r.health == Health::Fresh && r.record.progress > 0);
    assert_eq!(fresh.health, Health::Fresh);
    rig.agent = None;
    // Well past the suspicion bound (200 ms) with the sampler silent.
    let silent_since = host_monotonic_ns();
    let mut stale = 0;
    while host_monotonic_ns() - silent_since < 3 * 200_000_000 {
        let reading = rig.source.read(0);
        assert_ne!(reading.health, Health::Suspect, "a starved sampler is not a hung node");
        stale += u32::from(reading.health == Health::Stale);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(stale > 0, "the silent sampler's record aged");
    beating.store(false, std::sync::atomic::Ordering::Relaxed);
    beater.join().unwrap();
    let hung = read_until(rig.source.as_ref(), |r| r.health == Health::Suspect);
    assert_eq!(hung.health, Health::Suspect, "record and live word both still: suspect");
}

/// A monitor whose host does not complete connections in time (here a
/// listener whose accept queue is full, so the kernel drops the SYN as an
/// unreachable host would): the socket schemes call it dead, as they do a
/// refused connection, rather than stale forever.
#[test]
fn a_connect_that_times_out_is_dead_for_the_socket_schemes() {
    use std::os::fd::AsRawFd;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen(2) on a socket we own, to shrink its accept queue.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let addr = listener.local_addr().unwrap();
    // Fill the queue: connections nobody accepts, until one does not complete.
    let mut queued = Vec::new();
    let full = (0..16).any(|_| match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        Ok(stream) => {
            queued.push(stream);
            false
        }
        Err(_) => true,
    });
    assert!(full, "the accept queue never filled");
    let timeout_config = SourceConfig { socket_timeout: Duration::from_millis(300), ..config() };
    for scheme in [Scheme::SocketSync, Scheme::SocketAsync] {
        let address = BackendAddress { node: None, socket: Some(addr) };
        let source = open_source(scheme, None, &[address], timeout_config).unwrap();
        let reading = read_until(source.as_ref(), |r| r.health == Health::Dead);
        assert_eq!(reading.health, Health::Dead, "{scheme}");
    }
}

/// Which reads may wait on the network (the proxy reads those on a
/// blocking thread): Socket-Sync's and a fabric's other than shm.
#[test]
fn reads_that_cross_a_network_say_so() {
    for backend in [Backend::Shm, Backend::Tcp] {
        for scheme in Scheme::ALL {
            let rig = rig(backend, scheme);
            let expected = scheme == Scheme::SocketSync || (scheme.is_rdma() && backend == Backend::Tcp);
            assert_eq!(rig.source.reads_wait_on_the_network(), expected, "{scheme} on {}", backend.name());
        }
    }
}

/// A Socket-Sync monitor that answers once and then closes its connection
/// (a broken or restarting monitor, not a hung one): the failed read is
/// stale (unknown before any answer), never suspect.
#[test]
fn a_monitor_that_closes_is_stale_not_suspect() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        // The first connection: one request answered, then closed.
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 1];
        stream.read_exact(&mut request).unwrap();
        let record = tierstack_monitor::LoadRecord { t_ns: host_monotonic_ns(), progress: 5, ..Default::default() };
        stream.write_all(&tierstack_monitor::agent::encode_frame(&record)).unwrap();
        drop(stream);
    });
    let address = BackendAddress { node: None, socket: Some(addr) };
    let source = open_source(Scheme::SocketSync, None, &[address], config()).unwrap();
    assert_eq!(source.read(0).health, Health::Fresh);
    server.join().unwrap();
    let after = source.read(0);
    assert_eq!((after.health, after.record.progress), (Health::Stale, 5), "the last value, stale");
    // Before any answer: unknown.
    let closing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closing.local_addr().unwrap();
    let closer = std::thread::spawn(move || drop(closing.accept().unwrap()));
    let address = BackendAddress { node: None, socket: Some(addr) };
    let source = open_source(Scheme::SocketSync, None, &[address], config()).unwrap();
    assert_eq!(source.read(0).health, Health::Unknown);
    closer.join().unwrap();
}
