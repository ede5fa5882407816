//! Table 1 of the coherency paper, one test vector per row, plus the
//! module core's multi-key and admission behaviour checked against a model.

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tierstack_coherent::module_core::{Grant, Kind, ModuleCore};
use tierstack_coherent::table1::{DocumentQueues, Ipc, Proceed, Table1Error};

/// Builds queues in the state a row names: reads R1,R2 holding, or update U9
/// in progress / queued, with R3 queued behind it.
fn state(read_queue_empty: bool, update_queue_empty: bool) -> DocumentQueues {
    let mut q = DocumentQueues::new();
    match (read_queue_empty, update_queue_empty) {
        (true, true) => {}
        (false, true) => {
            q.handle(Ipc::ReadRequest(1)).unwrap();
            q.handle(Ipc::ReadRequest(2)).unwrap();
        }
        (true, false) => {
            q.handle(Ipc::UpdateRequest(9)).unwrap(); // in progress
            q.handle(Ipc::ReadRequest(3)).unwrap(); // queued behind it
        }
        (false, false) => {
            q.handle(Ipc::ReadRequest(1)).unwrap();
            q.handle(Ipc::UpdateRequest(9)).unwrap(); // waits for reader 1
            q.handle(Ipc::ReadRequest(3)).unwrap(); // queued behind the update
        }
    }
    q
}

type Expect = Result<Vec<Proceed>, Table1Error>;

#[test]
fn every_row_of_table_1() {
    let rows: Vec<(&str, Ipc, bool, bool, Expect)> = vec![
        ("READ_REQUEST, empty, empty", Ipc::ReadRequest(5), true, true, Ok(vec![Proceed::Read(5)])),
        ("READ_REQUEST, not empty, empty", Ipc::ReadRequest(5), false, true, Ok(vec![Proceed::Read(5)])),
        ("READ_REQUEST, empty, not empty", Ipc::ReadRequest(5), true, false, Ok(vec![])),
        ("READ_REQUEST, not empty, not empty", Ipc::ReadRequest(5), false, false, Ok(vec![])),
        ("READ_DONE, empty, not empty", Ipc::ReadDone(3), true, false, Err(Table1Error::NotReading(3))),
        ("READ_DONE, not empty, empty", Ipc::ReadDone(1), false, true, Ok(vec![])),
        ("READ_DONE, not empty, not empty", Ipc::ReadDone(1), false, false, Ok(vec![Proceed::Update(9)])),
        ("UPDATE_REQUEST, empty, empty", Ipc::UpdateRequest(5), true, true, Ok(vec![Proceed::Update(5)])),
        ("UPDATE_REQUEST, empty, not empty", Ipc::UpdateRequest(5), true, false, Err(Table1Error::UpdatePending(5))),
        ("UPDATE_REQUEST, not empty, empty", Ipc::UpdateRequest(5), false, true, Ok(vec![])),
        (
            "UPDATE_REQUEST, not empty, not empty",
            Ipc::UpdateRequest(5),
            false,
            false,
            Err(Table1Error::UpdatePending(5)),
        ),
        ("UPDATE_DONE, empty, empty", Ipc::UpdateDone(9), true, true, Err(Table1Error::NotUpdating(9))),
        ("UPDATE_DONE, empty, not empty", Ipc::UpdateDone(9), true, false, Ok(vec![Proceed::Read(3)])),
        ("UPDATE_DONE, not empty, not empty", Ipc::UpdateDone(9), false, false, Err(Table1Error::NotUpdating(9))),
    ];
    assert_eq!(rows.len(), 14, "Table 1 has 14 rows");
    for (row, ipc, read_empty, update_empty, expected) in rows {
        let mut q = state(read_empty, update_empty);
        assert_eq!(q.handle(ipc), expected, "row: {row}");
    }
}

#[test]
fn readers_queued_behind_an_update_proceed_together_when_it_is_done() {
    let mut q = DocumentQueues::new();
    assert_eq!(q.handle(Ipc::ReadRequest(1)), Ok(vec![Proceed::Read(1)]));
    assert_eq!(q.handle(Ipc::UpdateRequest(2)), Ok(vec![]), "the update waits for reader 1");
    assert_eq!(q.handle(Ipc::ReadRequest(3)), Ok(vec![]), "no read overtakes a queued update");
    assert_eq!(q.handle(Ipc::ReadRequest(4)), Ok(vec![]));
    assert_eq!(q.handle(Ipc::ReadDone(1)), Ok(vec![Proceed::Update(2)]));
    assert_eq!(q.handle(Ipc::UpdateDone(2)), Ok(vec![Proceed::Read(3), Proceed::Read(4)]));
    assert_eq!(q.readers(), 2);
    assert_eq!(q.handle(Ipc::ReadDone(4)), Ok(vec![]));
    assert_eq!(q.handle(Ipc::ReadDone(3)), Ok(vec![]));
    assert!(q.is_idle());
    assert_eq!(q.handle(Ipc::ReadDone(3)), Err(Table1Error::NotReading(3)), "READ_DONE, empty, empty");
}

#[test]
fn a_request_id_already_queued_on_the_document_is_refused() {
    let mut q = DocumentQueues::new();
    assert_eq!(q.handle(Ipc::ReadRequest(1)), Ok(vec![Proceed::Read(1)]));
    // Reading (in the Read Queue only).
    assert_eq!(q.handle(Ipc::ReadRequest(1)), Err(Table1Error::Duplicate(1)));
    assert_eq!(q.handle(Ipc::UpdateRequest(1)), Err(Table1Error::Duplicate(1)));
    assert_eq!(q.readers(), 1, "a refused duplicate is not queued");
    // Queued in the Update Queue only: the update waiting, and a read behind it.
    assert_eq!(q.handle(Ipc::UpdateRequest(2)), Ok(vec![]));
    assert_eq!(q.handle(Ipc::ReadRequest(3)), Ok(vec![]));
    assert_eq!(q.handle(Ipc::ReadRequest(2)), Err(Table1Error::Duplicate(2)));
    assert_eq!(q.handle(Ipc::ReadRequest(3)), Err(Table1Error::Duplicate(3)));
    assert_eq!(q.handle(Ipc::ReadDone(1)), Ok(vec![Proceed::Update(2)]));
    assert_eq!(q.handle(Ipc::UpdateDone(2)), Ok(vec![Proceed::Read(3)]), "exactly one read 3 was queued");
    assert_eq!(q.handle(Ipc::ReadDone(3)), Ok(vec![]));
    assert!(q.is_idle());
}

#[test]
fn the_core_counts_busy_keys_and_refuses_bad_requests() {
    use tierstack_coherent::module_core::CoreError;
    let mut core = ModuleCore::new();
    assert_eq!(
        core.request(1, Kind::Read, &[3, 1, 3]),
        Ok(vec![Grant { id: 1, kind: Kind::Read, slots: vec![1, 3] }]),
        "keys are taken once each, in ascending order"
    );
    assert_eq!(core.busy_keys(), 2);
    assert_eq!(core.request(1, Kind::Read, &[5]), Err(CoreError::DuplicateRequest(1)));
    assert_eq!(core.request(4, Kind::Read, &[]), Err(CoreError::NoKeys(4)));
    assert_eq!(core.request(2, Kind::Update, &[1]), Ok(vec![]), "the update waits for the reader");
    assert_eq!(core.done(2), Err(CoreError::NotGranted(2)));
    assert_eq!(core.done(9), Err(CoreError::UnknownRequest(9)));
    assert_eq!(core.abandon(9), Err(CoreError::UnknownRequest(9)));
    assert_eq!((core.requests(), core.busy_keys()), (2, 2));
    assert_eq!(core.done(1), Ok(vec![Grant { id: 2, kind: Kind::Update, slots: vec![1] }]));
    assert_eq!((core.requests(), core.busy_keys()), (1, 1), "key 3 is idle and forgotten");
    assert_eq!(core.done(2), Ok(vec![]));
    assert_eq!((core.requests(), core.busy_keys()), (0, 0));
}

#[derive(Clone, Debug)]
enum Step {
    Request {
        kind: Kind,
        keys: Vec<u32>,
    },
    Done(usize),
    Abandon(usize),
    /// Time passes (ms), then expired grants are revoked.
    Tick(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (prop_oneof![Just(Kind::Read), Just(Kind::Update)], proptest::collection::vec(0u32..4, 1..3))
            .prop_map(|(kind, keys)| Step::Request { kind, keys }),
        (0usize..32).prop_map(Step::Done),
        (0usize..32).prop_map(Step::Abandon),
        (0u64..8).prop_map(Step::Tick),
    ]
}

proptest! {
    /// Random request sequences: granted requests never conflict (an update
    /// holds its keys alone), every request is eventually granted once all
    /// holders finish, and nothing is left queued. Time passes too: a grant
    /// is revoked exactly when it has been held for the grant lifetime, and
    /// a revoked grant's DONE is refused.
    #[test]
    fn grants_never_conflict_and_everything_drains(steps in proptest::collection::vec(step(), 1..60)) {
        const LIFETIME_MS: u64 = 10;
        let mut core = ModuleCore::new();
        core.set_grant_lifetime(Some(Duration::from_millis(LIFETIME_MS)));
        let mut now_ms = 0u64;
        let mut granted_at: HashMap<u64, u64> = HashMap::new();
        let mut revoked: BTreeSet<u64> = BTreeSet::new();
        let mut next_id = 0u64;
        let mut holding: HashMap<u64, (Kind, Vec<u32>)> = HashMap::new();
        let mut waiting: BTreeSet<u64> = BTreeSet::new();
        let mut abandoned: BTreeSet<u64> = BTreeSet::new();
        let mut all: Vec<u64> = Vec::new();
        let apply = |grants: Vec<Grant>, holding: &mut HashMap<u64, (Kind, Vec<u32>)>, waiting: &mut BTreeSet<u64>| {
            for g in grants {
                waiting.remove(&g.id);
                holding.insert(g.id, (g.kind, g.slots));
            }
        };
        let check = |holding: &HashMap<u64, (Kind, Vec<u32>)>| {
            for (a, (ka, sa)) in holding {
                for (b, (kb, sb)) in holding {
                    if a < b && (*ka == Kind::Update || *kb == Kind::Update) {
                        assert!(sa.iter().all(|s| !sb.contains(s)), "{a} and {b} conflict on a key");
                    }
                }
            }
        };
        for s in steps {
            let before: BTreeSet<u64> = holding.keys().copied().collect();
            match s {
                Step::Request { kind, keys } => {
                    let id = next_id;
                    next_id += 1;
                    all.push(id);
                    waiting.insert(id);
                    let grants = core.request(id, kind, &keys).unwrap();
                    apply(grants, &mut holding, &mut waiting);
                }
                Step::Done(i) => {
                    let Some(&id) = all.get(i) else { continue };
                    if holding.remove(&id).is_some() {
                        let grants = core.done(id).unwrap();
                        apply(grants, &mut holding, &mut waiting);
                    } else if !abandoned.contains(&id) && waiting.contains(&id) {
                        prop_assert!(core.done(id).is_err(), "done before grant must fail");
                    }
                }
                Step::Abandon(i) => {
                    let Some(&id) = all.get(i) else { continue };
                    if abandoned.contains(&id) || (!holding.contains_key(&id) && !waiting.contains(&id)) {
                        continue;
                    }
                    abandoned.insert(id);
                    holding.remove(&id);
                    waiting.remove(&id);
                    let grants = core.abandon(id).unwrap();
                    apply(grants, &mut holding, &mut waiting);
                }
                Step::Tick(ms) => {
                    now_ms += ms;
                    let revocation = core.revoke_expired(Duration::from_millis(now_ms)).unwrap();
                    let expected: BTreeSet<u64> = holding
                        .keys()
                        .filter(|id| now_ms - granted_at[id] >= LIFETIME_MS)
                        .copied()
                        .collect();
                    let got: BTreeSet<u64> = revocation.revoked.iter().map(|g| g.id).collect();
                    prop_assert_eq!(&got, &expected, "revoked exactly the grants held for the lifetime");
                    for id in got {
                        holding.remove(&id);
                        revoked.insert(id);
                    }
                    apply(revocation.grants, &mut holding, &mut waiting);
                }
            }
            // Every grant that appeared in this step started its lifetime now.
            for id in holding.keys().filter(|id| !before.contains(id)) {
                granted_at.insert(*id, now_ms);
            }
            for id in &revoked {
                prop_assert!(core.done(*id).is_err(), "a revoked grant's DONE must be refused");
            }
            check(&holding);
            holding.retain(|id, _| !abandoned.contains(id));
        }
        // Drain: finish every holder until nobody waits.
        while let Some(&id) = holding.keys().next() {
            holding.remove(&id);
            let grants = core.done(id).unwrap();
            apply(grants, &mut holding, &mut waiting);
            check(&holding);
        }
        prop_assert!(waiting.is_empty(), "requests never granted: {waiting:?}");
        prop_assert_eq!(core.requests(), 0);
        prop_assert_eq!(core.busy_keys(), 0);
    }
}
