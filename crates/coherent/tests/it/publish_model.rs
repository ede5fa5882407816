//! Exhaustive model check of publishing pages with updates (issue 31):
//! every interleaving of one module running the real update plans
//! (`update_plan::grant_steps`/`done_steps`), word by word, against two
//! proxy requests that validate a cached copy and read the published page
//! one-sidedly, judged by the real `pages::judge`, and another key's page
//! evicting the record. Each served response is checked for the two
//! properties the protocol promises:
//!
//! - **consistent**: its content is the content of the version it carries;
//! - **not stale**: no update that completed before the request began
//!   produced a newer version.
//!
//! Then each safeguard is broken on purpose (the reply before the versions
//! are visible, the page installed without comparing versions, torn reads
//! accepted, another key's page accepted) and the checker must find a
//! violating interleaving.

use std::collections::{HashSet, VecDeque};
use tierstack_base::NodeId;
use tierstack_coherent::deps::{Dep, DepsHeader};
use tierstack_coherent::pages::{self, PageParts, PageVerdict, SlotRead};
use tierstack_coherent::update_plan::{self, Step, VersionsAt};
use tierstack_coherent::version_table::{fingerprint, Incarnation};

const UPDATES: u8 = 2;
const INCARNATION: u64 = 0x11;
/// The other key's slot maps to the same record (direct-mapped, 256 records).
const OTHER_SLOT: u32 = 256;

/// What is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Correct,
    /// UPDATE_DONE replies before making its versions visible.
    ReplyBeforeVisible,
    /// A page is installed whatever the versions read with it.
    IgnoreVersions,
    /// A page is installed even if a write overlapped the read.
    AcceptTorn,
    /// A page is installed whatever key's it is.
    IgnoreKey,
}

/// One word-level action of the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ModuleOp {
    Grant,
    GrantVisible,
    WriteData,
    SeqOdd,
    WriteHead,
    WriteBody,
    SeqEven,
    DoneVisible,
    DoneReply,
}

fn done_steps(mode: VersionsAt, variant: Variant) -> Vec<Step> {
    let mut steps = update_plan::done_steps(mode).to_vec();
    if variant == Variant::ReplyBeforeVisible {
        steps.retain(|s| *s != Step::Reply);
        let visible = steps.iter().position(|s| *s == Step::MakeVisible).unwrap_or(steps.len());
        steps.insert(visible, Step::Reply);
    }
    steps
}

/// The module's program for one update, publishing or not.
fn update_program(mode: VersionsAt, variant: Variant, publish: bool) -> Vec<ModuleOp> {
    let mut ops = vec![ModuleOp::Grant];
    for step in update_plan::grant_steps(mode) {
        if *step == Step::MakeVisible {
            ops.push(ModuleOp::GrantVisible);
        }
    }
    ops.push(ModuleOp::WriteData);
    for step in done_steps(mode, variant) {
        match step {
            Step::Publish if publish => {
                ops.extend([ModuleOp::SeqOdd, ModuleOp::WriteHead, ModuleOp::WriteBody, ModuleOp::SeqEven])
            }
            Step::Publish => {}
            Step::MakeVisible => ops.push(ModuleOp::DoneVisible),
            Step::Reply => ops.push(ModuleOp::DoneReply),
        }
    }
    ops
}

/// The published-pages record, word by word.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct Record {
    seq: u64,
    key_slot: u32,
    version: u64,
    content: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Copy {
    version: u64,
    content: u64,
}

/// A proxy request's progress.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Request {
    NotStarted,
    /// Begun: `floor` is the newest version of an update completed before.
    Lookup {
        floor: u64,
    },
    Check {
        floor: u64,
        copy: Copy,
    },
    PageSeq {
        floor: u64,
        copy: Copy,
    },
    PageHead {
        floor: u64,
        copy: Copy,
        seq: u64,
    },
    PageBody {
        floor: u64,
        copy: Copy,
        seq: u64,
        key_slot: u32,
        version: u64,
    },
    PageSeqAgain {
        floor: u64,
        copy: Copy,
        seq: u64,
        key_slot: u32,
        version: u64,
        content: u64,
    },
    PageVersions {
        floor: u64,
        copy: Copy,
        seqs: (u64, u64),
        key_slot: u32,
        version: u64,
        content: u64,
    },
    Upstream {
        floor: u64,
    },
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The key's visible version in the table.
    table: u64,
    /// The application's data: which update's effect it holds.
    data: u64,
    record: Record,
    /// Module: update number (1-based; UPDATES+1 when finished), its
    /// program position, whether it publishes, its granted version.
    update: u8,
    position: usize,
    publish: bool,
    granted: u64,
    /// Table 1: an update holds the key (reads wait).
    updating: bool,
    /// Newest version of a completed update.
    completed: u64,
    /// The other key's page write: position 0..=4 (4: written).
    evictor: u8,
    /// The proxy's stored copy.
    stored: Copy,
    requests: [Request; 2],
}

/// The content a version of the key stands for: version 1 is the initial
/// data 0, and update n (granted version n + 1) writes data n.
fn truth(version: u64) -> u64 {
    version - 1
}

fn header(version: u64) -> DepsHeader {
    DepsHeader {
        node: NodeId(0),
        incarnation: Incarnation(INCARNATION),
        deps: vec![Dep { key: "doc/a".into(), version, slot: 0 }],
    }
}

/// The bytes a reader assembled from the words it read (torn or not),
/// judged as the proxy judges them.
fn judge(
    variant: Variant,
    copy: Copy,
    seqs: (u64, u64),
    key_slot: u32,
    version: u64,
    content: u64,
    table: u64,
) -> Option<Copy> {
    let ignore_key = variant == Variant::IgnoreKey;
    let (key, path) = if key_slot == 0 || ignore_key { ("doc/a", "/doc/a") } else { ("doc/b", "/doc/b") };
    let deps = DepsHeader {
        deps: vec![Dep { key: key.into(), version, slot: if ignore_key { 0 } else { key_slot } }],
        ..header(version)
    };
    let parts = PageParts { path: path.into(), status: 200, headers: vec![], body: content.to_le_bytes().to_vec() };
    let stored_slot = if ignore_key { 0 } else { key_slot };
    let payload = pages::encode(stored_slot, &deps.to_string(), &parts, 4096).unwrap();
    let seqs = if variant == Variant::AcceptTorn { (2, 2) } else { seqs };
    let table = if variant == Variant::IgnoreVersions { version } else { table };
    let read = SlotRead { slot: 0, fingerprint: fingerprint("doc/a"), version: table };
    match pages::judge(&header(copy.version), "/doc/a", INCARNATION, &[read], seqs, &payload) {
        PageVerdict::Current(found) => {
            let (page, deps) = *found;
            let content = u64::from_le_bytes(page.body.try_into().unwrap());
            Some(Copy { version: deps.deps[0].version, content })
        }
        _ => None,
    }
}

struct Checker {
    mode: VersionsAt,
    variant: Variant,
    evict: bool,
    /// Concurrent proxy requests, 1 or 2 (with eviction, 2 is 20 times the
    /// states for no path one request does not also take).
    requests: usize,
}

/// What went wrong in a violating interleaving.
type Violation = String;

impl Checker {
    fn initial(&self) -> State {
        State {
            table: 1,
            data: 0,
            record: Record::default(),
            update: 1,
            position: 0,
            publish: true,
            granted: 0,
            updating: false,
            completed: 1,
            evictor: if self.evict { 0 } else { 4 },
            stored: Copy { version: 1, content: 0 },
            requests: [Request::NotStarted, if self.requests > 1 { Request::NotStarted } else { Request::Done }],
        }
    }

    /// The module may write the record unless the other writer is midway
    /// (the module's lock serializes a record's writers).
    fn module_writing(&self, s: &State) -> bool {
        if s.update > UPDATES {
            return false;
        }
        let program = update_program(self.mode, self.variant, s.publish);
        let seq_odd = program.iter().position(|op| *op == ModuleOp::SeqOdd);
        let seq_even = program.iter().position(|op| *op == ModuleOp::SeqEven);
        matches!((seq_odd, seq_even), (Some(a), Some(b)) if s.position > a && s.position <= b)
    }

    fn successors(&self, s: &State, out: &mut Vec<State>, violations: &mut Vec<Violation>) {
        // The module's next word-level action.
        if s.update <= UPDATES {
            if s.position == 0 {
                // Each update publishes a page or not: both are explored.
                for publish in [true, false] {
                    self.module_step(&State { publish, ..s.clone() }, out);
                }
            } else {
                self.module_step(s, out);
            }
        }
        // The other key's page evicts ours (its writes are serialized with ours).
        if s.evictor < 4 && !(s.evictor == 0 && self.module_writing(s)) {
            let mut next = s.clone();
            match s.evictor {
                0 => next.record.seq += 1,
                1 => {
                    next.record.key_slot = OTHER_SLOT;
                    // The version our key has after its first update: only
                    // the key tells the pages apart.
                    next.record.version = 2;
                }
                2 => next.record.content = 1000,
                _ => next.record.seq += 1,
            }
            next.evictor += 1;
            out.push(next);
        }
        for i in 0..2 {
            if let Some(next) = self.request_step(s, i, violations) {
                out.push(next);
            }
        }
    }

    fn module_step(&self, s: &State, out: &mut Vec<State>) {
        let program = update_program(self.mode, self.variant, s.publish);
        let op = program[s.position];
        if op == ModuleOp::SeqOdd && (1..4).contains(&s.evictor) {
            return; // the other writer holds the record
        }
        let mut next = s.clone();
        next.position += 1;
        match op {
            ModuleOp::Grant => {
                next.granted = update_plan::granted_version(s.table);
                next.updating = true;
            }
            ModuleOp::GrantVisible | ModuleOp::DoneVisible => next.table = s.granted,
            ModuleOp::WriteData => next.data = u64::from(s.update),
            ModuleOp::SeqOdd | ModuleOp::SeqEven => next.record.seq += 1,
            ModuleOp::WriteHead => {
                next.record.key_slot = 0;
                next.record.version = s.granted;
            }
            ModuleOp::WriteBody => next.record.content = s.data,
            ModuleOp::DoneReply => next.completed = next.completed.max(s.granted),
        }
        if next.position == program.len() {
            next.update += 1;
            next.position = 0;
            next.updating = false;
        }
        out.push(next);
    }

    fn serve(&self, floor: u64, copy: Copy, violations: &mut Vec<Violation>) {
        if copy.content != truth(copy.version) {
            violations.push(format!("served version {} with the content of another", copy.version));
        }
        if copy.version < floor {
            violations.push(format!("served version {} after an update to {floor} completed", copy.version));
        }
    }

    fn request_step(&self, s: &State, i: usize, violations: &mut Vec<Violation>) -> Option<State> {
        let mut next = s.clone();
        next.requests[i] = match s.requests[i].clone() {
            Request::NotStarted => Request::Lookup { floor: s.completed },
            Request::Lookup { floor } => Request::Check { floor, copy: s.stored },
            Request::Check { floor, copy } if s.table == copy.version => {
                self.serve(floor, copy, violations);
                Request::Done
            }
            Request::Check { floor, copy } => Request::PageSeq { floor, copy },
            Request::PageSeq { floor, copy } => Request::PageHead { floor, copy, seq: s.record.seq },
            Request::PageHead { floor, copy, seq } => {
                Request::PageBody { floor, copy, seq, key_slot: s.record.key_slot, version: s.record.version }
            }
            Request::PageBody { floor, copy, seq, key_slot, version } => {
                Request::PageSeqAgain { floor, copy, seq, key_slot, version, content: s.record.content }
            }
            Request::PageSeqAgain { floor, copy, seq, key_slot, version, content } => {
                Request::PageVersions { floor, copy, seqs: (seq, s.record.seq), key_slot, version, content }
            }
            // The versions are read last in the batch (after the record).
            Request::PageVersions { floor, copy, seqs, key_slot, version, content } => {
                match judge(self.variant, copy, seqs, key_slot, version, content, s.table) {
                    Some(page) => {
                        next.stored = page;
                        self.serve(floor, page, violations);
                        Request::Done
                    }
                    None => Request::Upstream { floor },
                }
            }
            // Table 1: the application tier's read waits while an update holds the key.
            Request::Upstream { .. } if s.updating => return None,
            Request::Upstream { floor } => {
                let copy = Copy { version: s.table, content: s.data };
                next.stored = copy;
                self.serve(floor, copy, violations);
                Request::Done
            }
            Request::Done => return None,
        };
        Some(next)
    }

    /// Explores every reachable state; returns how many and the violations.
    fn explore(&self) -> (usize, Vec<Violation>) {
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([self.initial()]);
        let mut violations = Vec::new();
        let mut successors = Vec::new();
        while let Some(state) = queue.pop_front() {
            if !seen.insert(state.clone()) {
                continue;
            }
            successors.clear();
            self.successors(&state, &mut successors, &mut violations);
            queue.extend(successors.drain(..));
            if violations.len() > 16 {
                break;
            }
        }
        (seen.len(), violations)
    }
}

#[test]
fn publishing_is_coherent_in_both_modes_under_every_interleaving() {
    for mode in [VersionsAt::Proceed, VersionsAt::Done] {
        for (evict, requests) in [(false, 2), (true, 1)] {
            let (states, violations) = Checker { mode, variant: Variant::Correct, evict, requests }.explore();
            assert!(violations.is_empty(), "{mode} (evict {evict}): {:?}", violations.first());
            assert!(states > 1000, "{mode}: explored only {states} states");
        }
    }
}

#[test]
fn done_mode_serves_published_pages_and_the_model_reaches_them() {
    // Guards the checker itself: the interesting paths are reachable.
    let checker = Checker { mode: VersionsAt::Done, variant: Variant::Correct, evict: false, requests: 2 };
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([checker.initial()]);
    let (mut page_served, mut old_served_during_update) = (false, false);
    let mut sink = Vec::new();
    while let Some(state) = queue.pop_front() {
        if !seen.insert(state.clone()) {
            continue;
        }
        let mut next = Vec::new();
        checker.successors(&state, &mut next, &mut sink);
        for n in &next {
            for (before, after) in state.requests.iter().zip(&n.requests) {
                if matches!(before, Request::PageVersions { .. }) && *after == Request::Done {
                    page_served = true;
                }
                if matches!(before, Request::Check { copy, .. } if copy.version == 1)
                    && *after == Request::Done
                    && state.updating
                    && state.position > 2
                {
                    old_served_during_update = true;
                }
            }
        }
        queue.extend(next);
    }
    assert!(page_served, "some request is served a published page");
    assert!(old_served_during_update, "done mode: the previous version is served while the update runs");
}

#[test]
fn each_broken_safeguard_is_caught() {
    for (mode, variant) in [
        (VersionsAt::Done, Variant::ReplyBeforeVisible),
        (VersionsAt::Proceed, Variant::IgnoreVersions),
        (VersionsAt::Done, Variant::IgnoreVersions),
        (VersionsAt::Done, Variant::AcceptTorn),
    ] {
        let (_, violations) = Checker { mode, variant, evict: false, requests: 2 }.explore();
        assert!(!violations.is_empty(), "{mode}, {variant:?}: no violation found");
    }
    let (_, violations) =
        Checker { mode: VersionsAt::Done, variant: Variant::IgnoreKey, evict: true, requests: 1 }.explore();
    assert!(!violations.is_empty(), "another key's page accepted: no violation found");
}
