//! The machine's unit tests: each step spelled out for tiny configurations
//! (the explorer in `tests/model_check.rs` covers every interleaving).

use super::*;
use crate::word::{fencing_token, DrainWord, FenceWord, DRAIN_BIAS, FENCE_UNIT};

fn n(i: u32) -> NodeId {
    NodeId(i)
}

/// The client of node `i` in a cluster of nodes 0..10.
fn client(i: u32, kind: QueueKind) -> LockClient {
    LockClient::new(n(i), kind, (0..10).map(NodeId).collect())
}

fn step(client: &mut LockClient, input: Input) -> Vec<Action> {
    let mut out = Vec::new();
    client.handle(input, &mut out).unwrap();
    out
}

fn notice(from: u32, generation: u16, revoke: bool) -> Input {
    Input::Message { from: n(from), generation, msg: ProtoMsg::Notice { revoke } }
}

fn done(results: &[u64]) -> Input {
    let mut r = [0; 2];
    r[..results.len()].copy_from_slice(results);
    Input::AtomicDone { results: r, len: results.len() }
}

#[test]
fn uncontended_exclusive_is_one_batch_to_acquire_and_one_atomic_to_release() {
    let mut c = client(1, QueueKind::CoShed);
    let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let free = LockWord::free(0).encode();
    let mine = LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode();
    assert_eq!(
        actions,
        vec![Action::Atomic(vec![
            AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
            AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }
        ])]
    );
    let fence = FenceWord { count: 41, generation: 0 }.encode();
    let actions = step(&mut c, done(&[free, fence]));
    let token = FenceWord { count: 42, generation: 0 }.encode();
    assert_eq!(actions, vec![Action::Granted { mode: LockMode::Exclusive, token: Some(token), abandoned: false }]);
    let actions = step(&mut c, Input::Release);
    assert_eq!(
        actions,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap { word: WordKind::Lock, expected: mine, new: free }])]
    );
    assert_eq!(step(&mut c, done(&[mine])), vec![Action::Idle]);
    assert!(c.is_idle());
}

#[test]
fn uncontended_shared_is_one_fetch_add() {
    let mut c = client(2, QueueKind::CoShed);
    let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: true });
    assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }])]);
    let actions = step(&mut c, done(&[LockWord::free(0).encode()]));
    assert_eq!(actions, vec![Action::Granted { mode: LockMode::Shared, token: None, abandoned: false }]);
}

#[test]
fn shared_request_behind_an_exclusive_messages_the_tail() {
    let mut c = client(2, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    let word = LockWord { generation: 0, tail: Some(n(7)), shared: 3 }.encode();
    let actions = step(&mut c, done(&[word]));
    assert_eq!(actions, vec![Action::Send { to: n(7), generation: 0, msg: ProtoMsg::SharedRequest }]);
    assert_eq!(c.blocked_on(), BlockedOn::Node(n(7)));
    // A grant from someone else is a violation, not a grant.
    let mut out = Vec::new();
    let bad = Input::Message { from: n(8), generation: 0, msg: ProtoMsg::GrantShared { via: SharedVia::Group0 } };
    assert!(c.handle(bad, &mut out).is_err());
}

#[test]
fn a_break_aborts_the_waiting_request() {
    let mut c = client(2, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    let word = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
    step(&mut c, done(&[word]));
    let actions = step(&mut c, notice(9, 1, true));
    assert_eq!(actions, vec![Action::Aborted(AbortReason::Revoked { generation: 1 }), Action::Idle]);
    // A grant of the old generation is dropped.
    assert!(step(&mut c, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive }).is_empty());
}

/// What the runtime asks a client between inputs, through a request's life.
#[test]
fn accessors_follow_the_request() {
    let mut c = client(4, QueueKind::CoShed);
    assert_eq!(c.node(), n(4));
    assert!(c.is_idle() && !c.is_holding() && !c.is_waiting());
    assert_eq!(c.blocked_on(), BlockedOn::Nothing);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    assert!(!c.is_idle() && c.is_waiting() && !c.is_holding());
    // Enqueued over two group-0 shared holders: waits for them to drain.
    let shared = LockWord { generation: 0, tail: None, shared: 2 }.encode();
    step(&mut c, done(&[shared])); // the free guess failed
    step(&mut c, done(&[shared])); // enqueued
    assert_eq!(c.blocked_on(), BlockedOn::Nothing, "registering in the drain word");
    step(&mut c, done(&[DrainWord::idle(0).encode()]));
    assert_eq!(c.blocked_on(), BlockedOn::SharedHolders);
    assert!(c.is_waiting());
    step(&mut c, Input::Abandon);
    assert!(!c.is_waiting(), "an abandoned request has nobody waiting");
    let actions = step(&mut c, Input::Message { from: n(9), generation: 0, msg: ProtoMsg::Drained });
    assert_eq!(actions[0], Action::Granted { mode: LockMode::Exclusive, token: None, abandoned: true });
    assert!(!c.is_holding(), "released in the same step");
    // A hold, then a release in progress: neither holding nor waiting.
    let mut h = client(5, QueueKind::CoShed);
    step(&mut h, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut h, done(&[LockWord::free(0).encode()]));
    assert!(h.is_holding() && !h.is_waiting());
    step(&mut h, Input::Release);
    assert!(!h.is_holding() && !h.is_waiting() && !h.is_idle());
    h.reset();
    assert!(h.is_idle(), "reset forgets the request");
    // Waiting behind a predecessor names it.
    let mut w = client(6, QueueKind::Dqnl);
    step(&mut w, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    let queued = LockWord { generation: 0, tail: Some(n(2)), shared: 0 }.encode();
    step(&mut w, done(&[queued]));
    assert_eq!(
        step(&mut w, done(&[queued])),
        vec![Action::Send { to: n(2), generation: 0, msg: ProtoMsg::Successor { shared: 0 } }]
    );
    assert_eq!(w.blocked_on(), BlockedOn::Node(n(2)));
    assert!(w.is_waiting());
}

#[test]
fn try_shared_never_enqueues_and_a_coordinated_release_messages_before_idle() {
    let mut c = client(1, QueueKind::CoShed);
    let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: true, fencing: false });
    let free = LockWord::free(0);
    let one = LockWord { shared: 1, ..free };
    assert_eq!(
        actions,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Lock,
            expected: free.encode(),
            new: one.encode()
        }])],
        "a compare-and-swap that fails, not a fetch-and-add that would enqueue"
    );
    let held = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
    assert_eq!(step(&mut c, done(&[held])), vec![Action::WouldBlock, Action::Idle]);
    // A shared request granted by its coordinator releases to it, and the
    // message goes out before the client reports itself idle.
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut c, done(&[held]));
    let grant = ProtoMsg::GrantShared { via: SharedVia::Coordinator };
    step(&mut c, Input::Message { from: n(3), generation: 0, msg: grant });
    assert_eq!(
        step(&mut c, Input::Release),
        vec![Action::Send { to: n(3), generation: 0, msg: ProtoMsg::SharedRelease }, Action::Idle]
    );
}

/// Inputs only a peer speaking another protocol (or a bug) produces are
/// reported as violations, not absorbed.
#[test]
fn impossible_inputs_are_violations() {
    let violates = |c: &mut LockClient, input: Input| c.handle(input, &mut Vec::new()).is_err();
    let msg = |from: u32, msg: ProtoMsg| Input::Message { from: n(from), generation: 0, msg };
    // A shared holder is asked for a grant, or told of a successor.
    let mut shared = client(1, QueueKind::CoShed);
    step(&mut shared, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut shared, done(&[LockWord::free(0).encode()]));
    assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::SharedRequest)));
    assert!(violates(&mut shared.clone(), msg(2, ProtoMsg::Successor { shared: 0 })));
    // Its group-0 release finds a zero count.
    step(&mut shared, Input::Release);
    assert!(violates(&mut shared, done(&[LockWord::free(0).encode()])));
    // A shared enqueue that names itself as the tail.
    let mut own = client(1, QueueKind::CoShed);
    step(&mut own, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    assert!(violates(&mut own, done(&[LockWord { generation: 0, tail: Some(n(1)), shared: 0 }.encode()])));
    // An exclusive holder told of a second successor, or of more
    // releases than it granted.
    let mut holder = client(1, QueueKind::CoShed);
    step(&mut holder, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    step(&mut holder, done(&[LockWord::free(0).encode()]));
    step(&mut holder, msg(2, ProtoMsg::Successor { shared: 1 }));
    assert!(violates(&mut holder.clone(), msg(3, ProtoMsg::Successor { shared: 0 })));
    step(&mut holder, msg(4, ProtoMsg::SharedRequest));
    let actions = step(&mut holder, Input::Release);
    assert_eq!(
        actions,
        vec![Action::Send { to: n(4), generation: 0, msg: ProtoMsg::GrantShared { via: SharedVia::Coordinator } }]
    );
    assert_eq!(
        step(&mut holder, msg(4, ProtoMsg::SharedRelease)),
        vec![Action::Send { to: n(2), generation: 0, msg: ProtoMsg::GrantExclusive }, Action::Idle],
        "the successor's grant goes out before the client reports itself idle"
    );
    let mut twice = client(1, QueueKind::CoShed);
    step(&mut twice, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    step(&mut twice, done(&[LockWord::free(0).encode()]));
    step(&mut twice, msg(2, ProtoMsg::Successor { shared: 2 }));
    step(&mut twice, msg(4, ProtoMsg::SharedRequest));
    step(&mut twice, Input::Release);
    step(&mut twice, msg(4, ProtoMsg::SharedRelease));
    assert!(violates(&mut twice, msg(4, ProtoMsg::SharedRelease)), "two releases for one grant");
}

/// The last group-0 holder to release wakes the exclusive registered in
/// the drain word, and says so before reporting itself idle.
#[test]
fn the_last_group0_release_wakes_the_drain_waiter() {
    let mut c = client(1, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut c, done(&[LockWord::free(0).encode()]));
    step(&mut c, Input::Release);
    // An exclusive (node 5) enqueued over us: count into the drain word.
    let actions = step(&mut c, done(&[LockWord { generation: 0, tail: Some(n(5)), shared: 0 }.encode()]));
    let idle = DrainWord::idle(0).encode();
    assert!(
        matches!(&actions[..], [Action::Atomic(ops)] if matches!(ops[0], AtomicOp::CompareSwap { word: WordKind::Drain, expected, .. } if expected == idle))
    );
    let registered = DrainWord { generation: 0, waiter: Some(n(5)), balance: DRAIN_BIAS - 1 }.encode();
    step(&mut c, done(&[registered])); // registered meanwhile: retry with its word
    assert_eq!(
        step(&mut c, done(&[registered])),
        vec![Action::Send { to: n(5), generation: 0, msg: ProtoMsg::Drained }, Action::Idle]
    );
}

#[test]
fn mode_names_round_trip() {
    for (mode, name) in [(LockMode::Shared, "shared"), (LockMode::Exclusive, "exclusive")] {
        assert_eq!(mode.name(), name);
        assert_eq!(name.parse::<LockMode>(), Ok(mode));
    }
    assert!("both".parse::<LockMode>().is_err());
}

#[test]
fn violations_name_the_phase_they_happened_in() {
    let mut c = client(2, QueueKind::CoShed);
    let mut out = Vec::new();
    let grant = Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive };
    assert_eq!(c.handle(Input::Release, &mut out).unwrap_err().phase, "Idle");
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    let queued = LockWord { generation: 0, tail: Some(n(7)), shared: 0 }.encode();
    step(&mut c, done(&[queued])); // the guess of a free word failed
    let err = c.handle(Input::Release, &mut out).unwrap_err();
    assert_eq!(err.phase, "Enqueue");
    step(&mut c, done(&[queued])); // the retry enqueued behind node 7
    let err = c.handle(grant, &mut out).unwrap_err();
    assert_eq!((err.node, err.phase), (n(2), "WaitPredecessor"), "a grant from a node that is not our predecessor");
    assert!(err.to_string().contains("WaitPredecessor"));
}

/// The release of an exclusive holder that collected shared requests
/// guesses the word exactly: its tail with their count. One
/// compare-and-swap, no retry.
#[test]
fn a_release_converts_collected_shared_requests_in_one_guess() {
    let mut c = client(1, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    step(&mut c, done(&[LockWord::free(0).encode()]));
    for from in [n(2), n(3)] {
        assert!(step(&mut c, Input::Message { from, generation: 0, msg: ProtoMsg::SharedRequest }).is_empty());
    }
    let held = LockWord { generation: 0, tail: Some(n(1)), shared: 2 };
    let converted = LockWord { tail: None, ..held };
    assert_eq!(
        step(&mut c, Input::Release),
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Lock,
            expected: held.encode(),
            new: converted.encode()
        }])]
    );
    let group0 = ProtoMsg::GrantShared { via: SharedVia::Group0 };
    assert_eq!(
        step(&mut c, done(&[held.encode()])),
        vec![
            Action::Send { to: n(2), generation: 0, msg: group0 },
            Action::Send { to: n(3), generation: 0, msg: group0 },
            Action::Idle
        ]
    );
}

#[test]
fn a_break_notice_is_remembered_and_old_messages_are_dropped() {
    let mut c = client(2, QueueKind::CoShed);
    assert_eq!(c.generation(), 0);
    assert!(step(&mut c, notice(9, 3, true)).is_empty(), "nothing to abort when idle");
    assert_eq!(c.generation(), 3);
    assert!(step(&mut c, notice(9, 2, true)).is_empty());
    assert_eq!(c.generation(), 3, "an older notice does not move the generation back");
    let actions = step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let free = LockWord::free(3).encode();
    let mine = LockWord { generation: 3, tail: Some(n(2)), shared: 0 }.encode();
    assert_eq!(
        actions,
        vec![Action::Atomic(vec![
            AtomicOp::CompareSwap { word: WordKind::Lock, expected: free, new: mine },
            AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }
        ])]
    );
    let fence = FenceWord { count: 9, generation: 3 }.encode();
    assert_eq!(
        step(&mut c, done(&[free, fence])),
        vec![Action::Granted { mode: LockMode::Exclusive, token: Some(fencing_token(fence)), abandoned: false }]
    );
}

/// A grant whose token fetch-and-add finds the fence in a newer
/// generation was overtaken by a move: it does not hold, and the waiting
/// user is told to make its request again.
#[test]
fn a_grant_overtaken_by_a_move_is_not_a_hold() {
    let mut c = client(2, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
    step(&mut c, done(&[queued, 0])); // the free guess failed
    step(&mut c, done(&[queued])); // enqueued behind node 3
    let actions = step(&mut c, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::GrantExclusive });
    assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Fence, delta: FENCE_UNIT }])]);
    let moved = FenceWord { count: 5, generation: 1 }.encode();
    assert_eq!(
        step(&mut c, done(&[moved])),
        vec![Action::Aborted(AbortReason::Recovered { generation: 1 }), Action::Idle]
    );
    assert_eq!(c.generation(), 1);
    // The same in the first batch of an uncontended acquire.
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let free = LockWord::free(1).encode();
    let later = FenceWord { count: 6, generation: 2 }.encode();
    assert_eq!(
        step(&mut c, done(&[free, later])),
        vec![Action::Aborted(AbortReason::Recovered { generation: 2 }), Action::Idle]
    );
    // A fence behind the request's generation cannot happen.
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let behind = FenceWord { count: 7, generation: 1 }.encode();
    assert!(c.handle(done(&[LockWord::free(2).encode(), behind]), &mut Vec::new()).is_err());
}

/// A waiter whose predecessor is lost moves the lock: lock word, drain
/// word, fence word, each a compare-and-swap retried with the word it
/// saw; then it tells every node and holds the new generation until each
/// acknowledges or is lost; then passes it on like any exclusive hold.
#[test]
fn a_waiter_behind_a_lost_node_moves_the_lock_and_holds_a_barrier() {
    let nodes: Arc<[NodeId]> = (0..4).map(NodeId).collect();
    let mut c = LockClient::new(n(1), QueueKind::CoShed, nodes);
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 2 };
    step(&mut c, done(&[queued.encode()]));
    assert_eq!(c.waits(), Waits { nodes: vec![n(3)], unknown: false });
    assert!(step(&mut c, Input::PeerLost { node: n(2) }).is_empty(), "not a node it waits for");
    let actions = step(&mut c, Input::PeerLost { node: n(3) });
    let barrier = LockWord { generation: 1, tail: Some(n(1)), shared: 0 };
    let guess = LockWord::free(0).encode();
    assert_eq!(
        actions,
        vec![
            Action::Aborted(AbortReason::Recovered { generation: 1 }),
            Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: guess,
                new: barrier.encode()
            }])
        ]
    );
    assert!(!c.is_waiting(), "the user makes its request again");
    // The guess failed: retry with the word seen.
    let retry = step(&mut c, done(&[queued.encode()]));
    assert_eq!(
        retry,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Lock,
            expected: queued.encode(),
            new: barrier.encode()
        }])]
    );
    assert_eq!(c.state().0, ClientState::Moving);
    let drain = step(&mut c, done(&[queued.encode()]));
    assert_eq!(
        drain,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Drain,
            expected: DrainWord::idle(0).encode(),
            new: DrainWord::idle(1).encode()
        }])]
    );
    // A request of the new generation may arrive meanwhile: the mover is its tail.
    assert!(step(&mut c, Input::Message { from: n(2), generation: 1, msg: ProtoMsg::SharedRequest }).is_empty());
    let fence_guess = FenceWord { count: 0, generation: 0 }.encode();
    let fence = step(&mut c, done(&[DrainWord::idle(0).encode()]));
    assert_eq!(
        fence,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Fence,
            expected: fence_guess,
            new: FenceWord { count: 1, generation: 1 }.encode()
        }])]
    );
    let seen = FenceWord { count: 40, generation: 0 }.encode();
    step(&mut c, done(&[seen])); // retried with the count seen
    let floor = FenceWord { count: 41, generation: 1 }.encode();
    let notices = step(&mut c, done(&[seen]));
    let notice = |to| Action::Send { to: n(to), generation: 1, msg: ProtoMsg::Notice { revoke: false } };
    assert_eq!(notices, vec![Action::Moved { generation: 1, floor, revoke: false }, notice(0), notice(2), notice(3)]);
    assert_eq!(c.barrier(), Some((1, &[n(0), n(2), n(3)][..])));
    assert_eq!(c.state().0, ClientState::Barrier);
    assert!(!c.is_holding(), "a barrier is not the user's to release");
    assert!(c.handle(Input::Release, &mut Vec::new()).is_err());
    // Node 3 is the lost one; nodes 0 and 2 acknowledge (a stale one is ignored).
    assert!(step(&mut c, Input::PeerLost { node: n(3) }).is_empty());
    assert!(step(&mut c, Input::Message { from: n(0), generation: 0, msg: ProtoMsg::Ack }).is_empty());
    assert!(step(&mut c, Input::Message { from: n(0), generation: 1, msg: ProtoMsg::Ack }).is_empty());
    let released = step(&mut c, Input::Message { from: n(2), generation: 1, msg: ProtoMsg::Ack });
    // Released like an exclusive hold: node 2's shared request becomes group 0.
    let collected = LockWord { generation: 1, tail: Some(n(1)), shared: 1 };
    assert_eq!(
        released,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Lock,
            expected: collected.encode(),
            new: LockWord { tail: None, ..collected }.encode()
        }])]
    );
    let group0 = ProtoMsg::GrantShared { via: SharedVia::Group0 };
    assert_eq!(
        step(&mut c, done(&[collected.encode()])),
        vec![Action::Send { to: n(2), generation: 1, msg: group0 }, Action::Idle]
    );
}

/// A recovery keeps a live hold and waits for it: the holder
/// acknowledges when its user releases, with no home atomic (the old
/// generation's queue is gone). An administrator's break revokes it.
#[test]
fn a_recovery_keeps_holds_and_a_break_revokes_them() {
    let mut c = client(2, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut c, done(&[LockWord::free(0).encode()]));
    assert!(c.is_holding());
    assert!(step(&mut c, notice(7, 1, false)).is_empty(), "kept; no acknowledgement yet");
    assert!(c.is_holding());
    assert_eq!(c.generation(), 1);
    assert_eq!(
        step(&mut c, Input::Release),
        vec![Action::Send { to: n(7), generation: 1, msg: ProtoMsg::Ack }, Action::Idle]
    );
    // Not holding: acknowledged at once.
    assert_eq!(step(&mut c, notice(8, 2, false)), vec![Action::Send { to: n(8), generation: 2, msg: ProtoMsg::Ack }]);
    // A break revokes a hold; the acknowledgement owed to an earlier recovery goes out.
    step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    step(&mut c, done(&[LockWord::free(2).encode()]));
    assert!(step(&mut c, notice(7, 3, false)).is_empty());
    assert_eq!(
        step(&mut c, notice(9, 4, true)),
        vec![
            Action::Aborted(AbortReason::Revoked { generation: 4 }),
            Action::Send { to: n(7), generation: 3, msg: ProtoMsg::Ack },
            Action::Idle
        ]
    );
}

/// A client that forgot a request (its home atomic's result was lost)
/// moves the lock past that request's generation before it asks again,
/// so that late messages meant for the forgotten request are dropped
/// rather than taken for the new one; unless the lock moved on already.
#[test]
fn a_forgotten_request_is_moved_past_before_the_next_one() {
    let mut c = client(2, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    c.reset();
    let actions = step(&mut c, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    let barrier = LockWord { generation: 1, tail: Some(n(2)), shared: 0 }.encode();
    assert_eq!(
        actions,
        vec![
            Action::Aborted(AbortReason::Recovered { generation: 1 }),
            Action::Atomic(vec![AtomicOp::CompareSwap {
                word: WordKind::Lock,
                expected: LockWord::free(0).encode(),
                new: barrier
            }])
        ]
    );
    assert_eq!(c.state().0, ClientState::Moving);
    // Once the lock has moved on, no move is needed.
    let mut d = client(3, QueueKind::CoShed);
    step(&mut d, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    d.reset();
    assert!(step(&mut d, notice(9, 1, false)).contains(&Action::Send { to: n(9), generation: 1, msg: ProtoMsg::Ack }));
    let actions = step(&mut d, Input::Acquire { mode: LockMode::Shared, try_only: false, fencing: false });
    assert_eq!(actions, vec![Action::Atomic(vec![AtomicOp::FetchAdd { word: WordKind::Lock, delta: 1 }])]);
}

/// A message of the current generation that finds no request is
/// answered `Nack`; a waiter told so by the node it waits for recovers.
#[test]
fn a_message_nobody_expects_is_nacked_and_a_nack_starts_a_recovery() {
    let mut fresh = client(3, QueueKind::CoShed);
    let successor = Input::Message { from: n(2), generation: 4, msg: ProtoMsg::Successor { shared: 0 } };
    assert_eq!(step(&mut fresh, successor), vec![Action::Send { to: n(2), generation: 4, msg: ProtoMsg::Nack }]);
    let mut waiter = client(2, QueueKind::CoShed);
    step(&mut waiter, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: true });
    let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
    step(&mut waiter, done(&[queued, 0]));
    step(&mut waiter, done(&[queued]));
    assert!(step(&mut waiter, Input::Message { from: n(3), generation: 7, msg: ProtoMsg::Nack }).is_empty());
    assert!(step(&mut waiter, Input::Message { from: n(4), generation: 0, msg: ProtoMsg::Nack }).is_empty());
    let actions = step(&mut waiter, Input::Message { from: n(3), generation: 0, msg: ProtoMsg::Nack });
    assert_eq!(actions[0], Action::Aborted(AbortReason::Recovered { generation: 1 }));
    assert!(matches!(actions[1], Action::Atomic(_)));
}

/// A move that finds the lock already moved past its generation stops;
/// a break instead breaks whatever generation it finds, and waits for
/// nobody.
#[test]
fn a_late_recovery_stops_and_a_break_moves_on() {
    let mut late = client(1, QueueKind::CoShed);
    step(&mut late, Input::Acquire { mode: LockMode::Exclusive, try_only: false, fencing: false });
    let queued = LockWord { generation: 0, tail: Some(n(3)), shared: 0 }.encode();
    step(&mut late, done(&[queued]));
    step(&mut late, done(&[queued]));
    step(&mut late, Input::PeerLost { node: n(3) });
    let moved = LockWord { generation: 1, tail: Some(n(4)), shared: 0 }.encode();
    assert_eq!(step(&mut late, done(&[moved])), vec![Action::Idle]);
    assert_eq!(late.generation(), 1);
    let mut admin = client(5, QueueKind::CoShed);
    step(&mut admin, Input::Break);
    let retry = step(&mut admin, done(&[moved]));
    let barrier = LockWord { generation: 2, tail: Some(n(5)), shared: 0 }.encode();
    assert_eq!(
        retry,
        vec![Action::Atomic(vec![AtomicOp::CompareSwap { word: WordKind::Lock, expected: moved, new: barrier }])]
    );
    step(&mut admin, done(&[moved]));
    step(&mut admin, done(&[DrainWord::idle(1).encode()]));
    let fence = FenceWord { count: 0, generation: 1 }.encode();
    let actions = step(&mut admin, done(&[fence]));
    assert_eq!(actions.len(), 9 + 2, "nine notices, the move, the release of the barrier");
    assert!(actions.contains(&Action::Moved {
        generation: 2,
        floor: FenceWord { count: 1, generation: 2 }.encode(),
        revoke: true
    }));
    assert_eq!(
        actions.last(),
        Some(&Action::Atomic(vec![AtomicOp::CompareSwap {
            word: WordKind::Lock,
            expected: barrier,
            new: LockWord::free(2).encode()
        }]))
    );
}

#[test]
fn try_exclusive_on_a_held_lock_leaves_no_trace() {
    let mut c = client(1, QueueKind::CoShed);
    step(&mut c, Input::Acquire { mode: LockMode::Exclusive, try_only: true, fencing: false });
    let held = LockWord { generation: 0, tail: None, shared: 2 }.encode();
    assert_eq!(step(&mut c, done(&[held])), vec![Action::WouldBlock, Action::Idle]);
    assert!(c.is_idle());
}
