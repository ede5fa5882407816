//! Randomized multi-node histories of one key, one thread per node, each
//! node with its own fabric endpoint, on `shm` and `tcp`, checked against
//! each coherence model's definition by the independent checkers of
//! `tierstack_ddss::check`.

use rand::Rng;
use std::sync::{Arc, Barrier};
use tierstack_base::{seeded_rng, Clock, ManualClock, NodeId};
use tierstack_cluster::Backend;
use tierstack_ddss::check::{self, Event, History, Timeline};
use tierstack_ddss::{Coherence, DdssConfig, DdssError, DdssStats, Placement};
use tierstack_testkit::ddss::{backends_with_ucx, every_model, start_with_clock};

struct Run {
    backend: Backend,
    model: Coherence,
    clients: u32,
    ops_per_client: usize,
    value_bytes_max: usize,
    put_percent: u32,
    /// Each op advances the shared manual clock by up to this much.
    advance_ns_max: u64,
    /// Chance (percent) that a client yields its CPU after an op.
    yield_percent: u32,
    seed: u64,
}

/// The bytes a client writes in its `n`-th put: distinct per (client, n)
/// and position, so a torn or misattributed value cannot pass `untorn`.
fn pattern(client: u32, n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (client as usize * 97 + n * 31 + i * 7) as u8).collect()
}

fn run(spec: &Run) -> (History, Vec<DdssStats>) {
    let clock = Arc::new(ManualClock::new(1));
    let config = DdssConfig::empty()
        .with_slots(spec.value_bytes_max as u32, 4)
        .with_members((0..spec.clients).map(NodeId).collect())
        .with_seed(spec.seed);
    let nodes = start_with_clock(spec.backend, spec.clients, config, clock.clone());
    let home = NodeId((spec.seed % u64::from(spec.clients)) as u32);
    let key = nodes.ddss[0].allocate(spec.value_bytes_max as u64, Placement::Node(home), spec.model).unwrap();
    let timeline = Timeline::default();
    let barrier = Barrier::new(spec.clients as usize);
    let per_client: Vec<(Vec<Event>, Vec<Event>)> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .ddss
            .iter()
            .enumerate()
            .map(|(client, ddss)| {
                let (clock, timeline, barrier) = (&clock, &timeline, &barrier);
                s.spawn(move || {
                    let client = client as u32;
                    let mut rng = seeded_rng(spec.seed.wrapping_mul(1000) + u64::from(client));
                    let (mut puts, mut gets) = (Vec::new(), Vec::new());
                    barrier.wait();
                    for n in 0..spec.ops_per_client {
                        let is_put = rng.gen_range(0..100) < spec.put_percent;
                        let invoked_ns = clock.now_ns();
                        let invoked = timeline.tick();
                        let (version, bytes) = if is_put {
                            let bytes = pattern(client, n, rng.gen_range(0..=spec.value_bytes_max));
                            (ddss.put(key, &bytes).expect("put"), bytes)
                        } else {
                            ddss.get(key).expect("get")
                        };
                        let responded = timeline.tick();
                        let responded_ns = clock.now_ns();
                        let event = Event { client, version, bytes, invoked, responded, invoked_ns, responded_ns };
                        if is_put {
                            puts.push(event);
                        } else {
                            gets.push(event);
                        }
                        if spec.advance_ns_max > 0 {
                            clock.advance_ns(rng.gen_range(0..=spec.advance_ns_max));
                        }
                        // On 2 cores a thread can finish its whole run in one
                        // time slice; yielding makes the clients interleave.
                        if rng.gen_range(0..100) < spec.yield_percent {
                            std::thread::yield_now();
                        }
                    }
                    (puts, gets)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    let mut history = History::default();
    for (puts, gets) in per_client {
        history.puts.extend(puts);
        history.gets.extend(gets);
    }
    let stats = nodes.ddss.iter().map(|d| d.stats()).collect();
    (history, stats)
}

/// What every model promises here: untorn values, monotonic versions per
/// reader, and write-ordered puts (all puts take the key's lock).
fn check_common(spec: &Run, history: &History) {
    let label = format!("{:?} {} seed {}", spec.backend, spec.model, spec.seed);
    check::untorn(history).unwrap_or_else(|v| panic!("{label}: untorn: {v}"));
    check::monotonic(history).unwrap_or_else(|v| panic!("{label}: monotonic: {v}"));
    check::write_ordered(history).unwrap_or_else(|v| panic!("{label}: write order: {v}"));
    assert!(!history.puts.is_empty() && !history.gets.is_empty(), "{label}: both puts and gets ran");
}

fn ops(backend: Backend) -> usize {
    match backend {
        Backend::Shm | Backend::Ucx => 400,
        Backend::Tcp => 120,
    }
}

fn spec(backend: Backend, model: Coherence, seed: u64) -> Run {
    Run {
        backend,
        model,
        clients: 3,
        ops_per_client: ops(backend),
        value_bytes_max: 64,
        put_percent: 40,
        advance_ns_max: 0,
        yield_percent: 30,
        seed,
    }
}

#[test]
fn null_histories_are_untorn_and_monotonic() {
    for backend in backends_with_ucx() {
        for seed in 1..=2 {
            let spec = spec(backend, Coherence::Null, seed);
            let (history, stats) = run(&spec);
            check_common(&spec, &history);
            assert!(stats.iter().map(|s| s.gets_from_copy).sum::<u64>() > 0, "null serves local copies");
        }
        // Not vacuous, by construction: null keeps serving a reader's copy
        // after another node's put.
        let (cached, after_put, _) = copy_then_put(backend, Coherence::Null, 1, 0);
        assert_eq!(after_put, cached, "{backend:?}: null serves the old local copy");
    }
}

/// Node 1 gets (caching a copy), node 0 puts `puts` times, the clock
/// advances by `advance_ns`, node 1 gets again. Returns the versions of both
/// gets and of the last put.
fn copy_then_put(backend: Backend, model: Coherence, puts: usize, advance_ns: u64) -> (u64, u64, u64) {
    let clock = Arc::new(ManualClock::new(1));
    let config = DdssConfig::empty().with_slots(64, 4).with_members(vec![NodeId(0), NodeId(1)]).with_seed(7);
    let nodes = start_with_clock(backend, 2, config, clock.clone());
    let key = nodes.ddss[0].allocate(8, Placement::Node(NodeId(0)), model).unwrap();
    nodes.ddss[0].put(key, b"first").unwrap();
    let (cached, _) = nodes.ddss[1].get(key).unwrap();
    let mut put = 0;
    for _ in 0..puts {
        put = nodes.ddss[0].put(key, b"second").unwrap();
    }
    clock.advance_ns(advance_ns);
    let (after_put, _) = nodes.ddss[1].get(key).unwrap();
    (cached, after_put, put)
}

#[test]
fn temporal_histories_are_never_older_than_t() {
    const MAX_AGE_MS: u64 = 2;
    for backend in backends_with_ucx() {
        for seed in 1..=2 {
            let spec = Run {
                advance_ns_max: MAX_AGE_MS * 1_000_000 / 3,
                ..spec(backend, Coherence::Temporal { max_age_ms: MAX_AGE_MS }, seed)
            };
            let (history, stats) = run(&spec);
            check_common(&spec, &history);
            check::temporal(&history, MAX_AGE_MS * 1_000_000)
                .unwrap_or_else(|v| panic!("{backend:?} seed {seed}: temporal: {v}"));
            let from_copy: u64 = stats.iter().map(|s| s.gets_from_copy).sum();
            let refreshed: u64 = stats.iter().map(|s| s.gets_validated + s.gets_fetched).sum();
            assert!(from_copy > 0 && refreshed > 0, "both young copies and refreshes happened: {stats:?}");
        }
        // Not vacuous, by construction: a copy younger than T is served after
        // a put; one older than T is refreshed.
        let model = Coherence::Temporal { max_age_ms: MAX_AGE_MS };
        let (cached, young, _) = copy_then_put(backend, model, 1, 0);
        assert_eq!(young, cached, "{backend:?}: a copy younger than T is served");
        let (_, old, put) = copy_then_put(backend, model, 1, MAX_AGE_MS * 1_000_000 + 1);
        assert_eq!(old, put, "{backend:?}: a copy older than T is refreshed");
    }
}

#[test]
fn delta_histories_lag_at_most_delta_versions() {
    for backend in backends_with_ucx() {
        for (seed, versions) in [(1, 1), (2, 3)] {
            let spec = spec(backend, Coherence::Delta { versions }, seed);
            let (history, stats) = run(&spec);
            check_common(&spec, &history);
            check::delta(&history, versions).unwrap_or_else(|v| panic!("{backend:?} delta {versions}: {v}"));
            assert!(stats.iter().map(|s| s.gets_validated).sum::<u64>() > 0, "copies were validated by version");
        }
        // Not vacuous, by construction: one version behind is within delta(1)
        // and served from the copy; two behind is not, and is refreshed.
        let model = Coherence::Delta { versions: 1 };
        let (cached, within, _) = copy_then_put(backend, model, 1, 0);
        assert_eq!(within, cached, "{backend:?}: a copy 1 version behind is served under delta(1)");
        let (_, beyond, put) = copy_then_put(backend, model, 2, 0);
        assert_eq!(beyond, put, "{backend:?}: a copy 2 versions behind is refreshed under delta(1)");
    }
}

#[test]
fn read_write_and_strict_histories_return_the_latest_completed_put() {
    for backend in backends_with_ucx() {
        for model in [Coherence::Read, Coherence::Write, Coherence::Strict] {
            let spec = spec(backend, model, 7);
            let (history, _) = run(&spec);
            check_common(&spec, &history);
            check::read(&history).unwrap_or_else(|v| panic!("{backend:?} {model}: read: {v}"));
        }
    }
}

/// Large values (many words per value), clients that never yield, and many
/// operations: torn reads would be likely if the seqlock were wrong.
#[test]
fn large_values_are_never_torn() {
    for backend in backends_with_ucx() {
        for model in [Coherence::Write, Coherence::Read] {
            let spec = Run {
                value_bytes_max: 16 * 1024,
                put_percent: 50,
                yield_percent: 0,
                ops_per_client: ops(backend) * 4,
                ..spec(backend, model, 3)
            };
            let (history, _) = run(&spec);
            check_common(&spec, &history);
        }
    }
}

/// Strict: small histories, many seeds, each checked for linearizability.
#[test]
fn strict_histories_are_linearizable() {
    for backend in backends_with_ucx() {
        let seeds = match backend {
            Backend::Shm | Backend::Ucx => 40,
            Backend::Tcp => 12,
        };
        for seed in 0..seeds {
            let spec = Run { ops_per_client: 10, put_percent: 50, ..spec(backend, Coherence::Strict, seed) };
            let (history, stats) = run(&spec);
            check_common(&spec, &history);
            check::linearizable(&history).unwrap_or_else(|v| panic!("{backend:?} seed {seed}: {v}"));
            assert_eq!(stats.iter().map(|s| s.gets_locked).sum::<u64>(), history.gets.len() as u64);
        }
    }
}

// ---------------------------------------------------------------- telling the models apart

/// What the reader's second get sees in a scripted run: node 0 puts, node 1
/// gets (keeping a copy where the model keeps copies), node 0 puts `puts`
/// more times, the clock advances by `advance_ns`, node 1 gets again. The
/// whole run, with real-time ticks and clock readings, as a history.
fn scripted_history(backend: Backend, model: Coherence, puts: usize, advance_ns: u64) -> History {
    let clock = Arc::new(ManualClock::new(1));
    let config = DdssConfig::empty().with_slots(64, 4).with_members(vec![NodeId(0), NodeId(1)]).with_seed(7);
    let nodes = start_with_clock(backend, 2, config, clock.clone());
    let key = nodes.ddss[0].allocate(8, Placement::Node(NodeId(0)), model).unwrap();
    let timeline = Timeline::default();
    let mut history = History::default();
    let mut op = |client: usize, value: Option<Vec<u8>>| {
        let (invoked_ns, invoked) = (clock.now_ns(), timeline.tick());
        let (version, bytes) = match &value {
            Some(bytes) => (nodes.ddss[client].put(key, bytes).unwrap(), bytes.clone()),
            None => nodes.ddss[client].get(key).unwrap(),
        };
        let event = Event {
            client: client as u32,
            version,
            bytes,
            invoked,
            responded: timeline.tick(),
            invoked_ns,
            responded_ns: clock.now_ns(),
        };
        match value {
            Some(_) => history.puts.push(event),
            None => history.gets.push(event),
        }
    };
    op(0, Some(b"v1".to_vec()));
    op(1, None);
    for n in 0..puts {
        op(0, Some(format!("v{}", n + 2).into_bytes()));
    }
    clock.advance_ns(advance_ns);
    op(1, None);
    history
}

/// The models' guarantees as checkers of one history (see `Coherence`).
/// Read, write and strict share one: every get returns the latest put
/// completed before it (and, on this substrate, histories are linearizable;
/// `read_and_write_histories_are_linearizable_too`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guarantee {
    Untorn,
    Temporal,
    Delta,
    Latest,
}

const T_MS: u64 = 2;
const DELTA: u64 = 1;

fn guarantee(model: Coherence) -> Guarantee {
    match model {
        Coherence::Null => Guarantee::Untorn,
        Coherence::Temporal { .. } => Guarantee::Temporal,
        Coherence::Delta { .. } => Guarantee::Delta,
        Coherence::Read | Coherence::Write | Coherence::Strict => Guarantee::Latest,
    }
}

fn holds(guarantee: Guarantee, history: &History) -> bool {
    check::untorn(history).is_ok()
        && check::monotonic(history).is_ok()
        && match guarantee {
            Guarantee::Untorn => true,
            Guarantee::Temporal => check::temporal(history, T_MS * 1_000_000).is_ok(),
            Guarantee::Delta => check::delta(history, DELTA).is_ok(),
            Guarantee::Latest => check::read(history).is_ok(),
        }
}

/// Every pair of models with different guarantees is told apart by a
/// scripted history that one model's run passes and the other's fails
/// (under the stronger model's checker); each model passes its own checker
/// in every script. Read, write and strict coincide here and are told
/// apart by cost and blocking instead
/// (`the_latest_value_models_differ_in_cost_and_blocking`).
#[test]
fn each_pair_of_models_is_told_apart_by_a_history() {
    let models = every_model(T_MS, DELTA);
    // (puts after the copy, clock advance): one put, no time passes; two
    // puts; one put and more than T passes.
    let scripts = [(1, 0), (2, 0), (1, T_MS * 1_000_000 + 1)];
    for backend in backends_with_ucx() {
        // passes[m][s][g]: model m's run of script s meets guarantee g.
        let all = [Guarantee::Untorn, Guarantee::Temporal, Guarantee::Delta, Guarantee::Latest];
        let passes: Vec<Vec<Vec<bool>>> = models
            .iter()
            .map(|&model| {
                scripts
                    .iter()
                    .map(|&(puts, advance)| {
                        let history = scripted_history(backend, model, puts, advance);
                        all.iter().map(|&g| holds(g, &history)).collect()
                    })
                    .collect()
            })
            .collect();
        for (m, &model) in models.iter().enumerate() {
            let own = all.iter().position(|g| *g == guarantee(model)).unwrap();
            for (s, script) in scripts.iter().enumerate() {
                assert!(passes[m][s][own], "{backend:?}: {model} fails its own guarantee in script {script:?}");
            }
        }
        for (a, &model_a) in models.iter().enumerate() {
            for (b, &model_b) in models.iter().enumerate().skip(a + 1) {
                if guarantee(model_a) == guarantee(model_b) {
                    continue;
                }
                let apart = (0..scripts.len()).any(|s| (0..all.len()).any(|g| passes[a][s][g] != passes[b][s][g]));
                assert!(apart, "{backend:?}: no history tells {model_a} from {model_b}");
            }
        }
    }
}

/// Read, write and strict give the same guarantee (the latest completed
/// put; linearizable histories), so what tells them apart is cost and
/// blocking: read validates its copy with a 16-byte version read, write
/// moves the value every time and keeps no copy, strict takes the key's
/// lock for every get and so waits (here: `LockBusy`) behind a put that
/// holds it, where read and write return the last completed value.
#[test]
fn the_latest_value_models_differ_in_cost_and_blocking() {
    for backend in backends_with_ucx() {
        let mut config = DdssConfig::empty().with_slots(64, 4).with_members(vec![NodeId(0), NodeId(1)]);
        config.lock_attempts_max = 80;
        let nodes = start_with_clock(backend, 2, config, Arc::new(ManualClock::new(1)));
        let (writer, reader) = (&nodes.ddss[0], &nodes.ddss[1]);
        let mut keys = Vec::new();
        for model in [Coherence::Read, Coherence::Write, Coherence::Strict] {
            let key = writer.allocate(8, Placement::Node(NodeId(0)), model).unwrap();
            writer.put(key, b"one").unwrap();
            let before = reader.stats();
            reader.get(key).unwrap();
            assert_eq!(reader.get(key).unwrap(), (1, b"one".to_vec()));
            let after = reader.stats();
            let moved = |f: fn(&DdssStats) -> u64| f(&after) - f(&before);
            let costs = (moved(|s| s.gets_fetched), moved(|s| s.gets_validated), moved(|s| s.gets_locked));
            let want = match model {
                Coherence::Read => (1, 1, 0),
                Coherence::Write => (2, 0, 0),
                _ => (0, 0, 2),
            };
            assert_eq!(costs, want, "{backend:?} {model}: (fetched, validated, locked) gets");
            keys.push((model, key));
        }
        // A put that holds the key's lock and never finishes (a stranded
        // holder whose token names no node, so it is never taken over).
        let raw = nodes.cluster.fabric(1).connect(NodeId(0), "ddss").unwrap();
        for (model, key) in keys {
            let control = u64::from(key.offset());
            let unlocked = raw.read_u64(control).unwrap();
            assert_eq!(raw.compare_swap(control, unlocked, unlocked | 0x1234).unwrap(), unlocked);
            let got = reader.get(key);
            match model {
                Coherence::Strict => assert!(matches!(got, Err(DdssError::LockBusy { .. })), "{backend:?}: {got:?}"),
                _ => assert_eq!(got, Ok((1, b"one".to_vec())), "{backend:?} {model}: gets do not wait for puts"),
            }
            raw.compare_swap(control, unlocked | 0x1234, unlocked).unwrap();
        }
    }
}

/// Read and write histories are linearizable, like strict ones: the home is
/// the only copy that changes and gets read it (or check against it)
/// atomically. This is why the three coincide in guarantee.
#[test]
fn read_and_write_histories_are_linearizable_too() {
    for backend in backends_with_ucx() {
        for model in [Coherence::Read, Coherence::Write] {
            for seed in 0..8 {
                let spec = Run { ops_per_client: 10, put_percent: 50, ..spec(backend, model, seed) };
                let (history, _) = run(&spec);
                check_common(&spec, &history);
                check::linearizable(&history).unwrap_or_else(|v| panic!("{backend:?} {model} seed {seed}: {v}"));
            }
        }
    }
}
