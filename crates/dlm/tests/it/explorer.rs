//! What the lock-manager model checks share: the scripted requests and an
//! exhaustive depth-first explorer with a colour per state fingerprint, so
//! that a cycle (a livelock) is found rather than looped in.

#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use tierstack_dlm::proto::LockMode;

/// One scripted request of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Req {
    pub mode: LockMode,
    pub try_only: bool,
}

pub(crate) const E: Req = Req { mode: LockMode::Exclusive, try_only: false };
pub(crate) const S: Req = Req { mode: LockMode::Shared, try_only: false };
pub(crate) const TE: Req = Req { mode: LockMode::Exclusive, try_only: true };
pub(crate) const TS: Req = Req { mode: LockMode::Shared, try_only: true };

/// A 128-bit fingerprint (two independently seeded hashes), so that two
/// distinct states colliding is negligible over millions of states.
pub(crate) fn fingerprint<W: Hash>(world: &W) -> u128 {
    let mut a = DefaultHasher::new();
    world.hash(&mut a);
    let mut b = DefaultHasher::new();
    0xDEAD_BEEF_u64.hash(&mut b);
    world.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// What an exploration visited.
#[derive(Debug, Default)]
pub(crate) struct Explored {
    pub states: usize,
    /// States with no successor, each checked by `check_terminal`.
    pub terminals: usize,
    pub max_depth: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Colour {
    OnStack,
    Done,
}

/// Visits every state reachable from `start` (each once, `visit` called on
/// each), checks every terminal one, and fails on the first broken
/// invariant or on a cycle.
pub(crate) fn explore<W: Hash + Debug>(
    start: W,
    successors: impl Fn(&W) -> Result<Vec<W>, String>,
    check_terminal: impl Fn(&W) -> Result<(), String>,
    mut visit: impl FnMut(&W),
) -> Result<Explored, String> {
    let mut explored = Explored { states: 1, ..Explored::default() };
    let mut colours: HashMap<u128, Colour> = HashMap::new();
    visit(&start);
    let first = successors(&start)?;
    if first.is_empty() {
        explored.terminals += 1;
        check_terminal(&start)?;
    }
    let start_fp = fingerprint(&start);
    colours.insert(start_fp, Colour::OnStack);
    let mut stack: Vec<(u128, Vec<W>)> = vec![(start_fp, first)];
    while let Some((_, children)) = stack.last_mut() {
        let Some(world) = children.pop() else {
            let (fp, _) = stack.pop().ok_or("empty stack")?;
            colours.insert(fp, Colour::Done);
            continue;
        };
        let fp = fingerprint(&world);
        match colours.get(&fp) {
            Some(Colour::OnStack) => return Err(format!("cycle (livelock) through {world:#?}")),
            Some(Colour::Done) => continue,
            None => {}
        }
        explored.states += 1;
        visit(&world);
        let children = successors(&world).map_err(|e| format!("{e}\nin {world:#?}"))?;
        if children.is_empty() {
            explored.terminals += 1;
            check_terminal(&world).map_err(|e| format!("{e}\nin {world:#?}"))?;
        }
        colours.insert(fp, Colour::OnStack);
        stack.push((fp, children));
        explored.max_depth = explored.max_depth.max(stack.len());
    }
    Ok(explored)
}
