//! [`Ddss`]: one node's handle on the substrate, executing the protocols of
//! the crate docs with one-sided operations.
//!
//! Three files: this one holds the handle itself (start and attach, homes,
//! the key lock and its takeover from a dead holder, put and get);
//! `config.rs` its configuration and counters; `slots.rs` the life of a
//! slot (allocation by claim and publish, free, and the sweep that
//! reclaims what a dead allocator or freer left half done).

mod config;
mod slots;
#[cfg(test)]
mod tests;

use config::{bump, Stats};
pub use config::{DdssConfig, DdssStats};

use crate::coherence::{copy_is_fresh, keeps_copies, plan_get, GetPlan, LocalCopies, LocalCopy};
use crate::error::{DdssError, Result};
use crate::key::Key;
use crate::layout::{
    class_capacity, holder_token, record, token_holder, Layout, SlotWord, HEADER_BYTES, HOLDER_NODE_MAX,
    INCARNATION_MAX, LOST_VALUE_LEN, MAGIC, SIZE_CLASSES, SLOT_BASE, SLOT_CONTROL, SLOT_DATA, SLOT_HEADER,
    SLOT_SEQUENCE,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// These maps are caches: a panic while holding them cannot leave them
// inconsistent in a way that matters, so a poisoned lock is recovered.
use tierstack_base::sync::lock;
use tierstack_base::{seeded_rng, Clock, NodeId, SeededRng, SystemClock};
use tierstack_fabric::{
    check_batch, execute_on_memory, Completion, Fabric, FabricError, LocalRegion, Op, OpResult, PeerState, RemoteRegion,
};

/// The region name every node registers for the substrate.
pub const REGION_NAME: &str = "ddss";
/// Lock attempts (each one compare_swap at the home) before `LockBusy`.
pub const LOCK_ATTEMPTS_MAX: u32 = 20_000;
/// Lock attempts after which a busy lock's holder is first checked for
/// being gone (the end of the backoff's spinning and yielding).
const HOLDER_CHECK_FROM: u32 = 64;
/// Lock attempts between further checks of the holder (about 5 ms of backoff).
const HOLDER_CHECK_EVERY: u32 = 256;
/// compare_swaps on one bitmap word before an allocation reports contention.
pub const ALLOC_ATTEMPTS_MAX: u32 = 256;

/// A member's region and its layout, learned once from its header.
struct Home {
    region: Arc<dyn RemoteRegion>,
    layout: Layout,
}

/// One node's (or one attached process's) handle on the substrate.
pub struct Ddss {
    fabric: Arc<dyn Fabric>,
    node: NodeId,
    config: DdssConfig,
    local: Option<Arc<LocalRegion>>,
    homes: Mutex<HashMap<NodeId, Arc<Home>>>,
    copies: Mutex<LocalCopies>,
    clock: Arc<dyn Clock>,
    rng: Mutex<SeededRng>,
    /// The token this handle writes into control words it locks or claims:
    /// node and incarnation ([`holder_token`]).
    token: u32,
    /// This handle's incarnation region, registered for as long as the handle
    /// lives: its existence is what tells other handles that the incarnation
    /// in a lock or claim word still runs (see [`Ddss::holder_gone`]).
    _incarnation: Arc<LocalRegion>,
    stats: Stats,
}

fn word_at(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_ne_bytes(w)
}

fn backoff(attempt: u32) {
    if attempt < 8 {
        std::hint::spin_loop();
    } else if attempt < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

impl Ddss {
    /// Starts the substrate on this node: registers its region (once; the
    /// memory is never resized) and publishes the header. Uses the system clock.
    pub fn start(fabric: Arc<dyn Fabric>, config: DdssConfig) -> Result<Self> {
        Self::start_with_clock(fabric, config, Arc::new(SystemClock))
    }

    /// As [`Ddss::start`], with the clock that temporal coherence reads.
    pub fn start_with_clock(fabric: Arc<dyn Fabric>, config: DdssConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let layout = Layout::new(config.slots_per_class)?;
        let region = fabric.register(&config.region_name, layout.region_bytes(), tierstack_fabric::Access::all())?;
        let memory = region.memory();
        let header = layout.header_words();
        // Everything but the magic first; the magic last, so a reader that
        // sees it sees the whole header.
        for (i, word) in header.iter().enumerate().skip(1) {
            memory.store_u64(i as u64 * 8, *word)?;
        }
        memory.store_u64(0, MAGIC)?;
        let mut ddss = Self::attach_with_clock(fabric, config, clock)?;
        ddss.local = Some(region);
        Ok(ddss)
    }

    /// Attaches without a region of its own: a process that gets and puts
    /// one-sidedly on members' regions (the data path of a daemon's client).
    pub fn attach(fabric: Arc<dyn Fabric>, config: DdssConfig) -> Result<Self> {
        Self::attach_with_clock(fabric, config, Arc::new(SystemClock))
    }

    pub fn attach_with_clock(fabric: Arc<dyn Fabric>, config: DdssConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let node = fabric.local_node();
        if node.0 > HOLDER_NODE_MAX {
            return Err(DdssError::Config(format!("{node}: lock and claim words name nodes up to {HOLDER_NODE_MAX}")));
        }
        let (incarnation, region) = register_incarnation(&*fabric, &config.region_name)?;
        Ok(Self {
            node,
            token: holder_token(node, incarnation),
            _incarnation: region,
            rng: Mutex::new(seeded_rng(config.seed ^ u64::from(node.0).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
            fabric,
            config,
            local: None,
            homes: Mutex::new(HashMap::new()),
            copies: Mutex::new(LocalCopies::default()),
            clock,
            stats: Stats::default(),
        })
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn config(&self) -> &DdssConfig {
        &self.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.fabric.backend_name()
    }

    /// True if this handle has a region of its own (started, not attached).
    pub fn has_region(&self) -> bool {
        self.local.is_some()
    }

    /// The members allocation may place on.
    pub fn members(&self) -> Vec<NodeId> {
        if self.config.members.is_empty() {
            vec![self.node]
        } else {
            self.config.members.clone()
        }
    }

    pub fn stats(&self) -> DdssStats {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DdssStats {
            gets_from_copy: get(&s.gets_from_copy),
            gets_validated: get(&s.gets_validated),
            gets_fetched: get(&s.gets_fetched),
            gets_locked: get(&s.gets_locked),
            puts: get(&s.puts),
            lock_retries: get(&s.lock_retries),
            lock_takeovers: get(&s.lock_takeovers),
            values_lost: get(&s.values_lost),
            claims_taken_over: get(&s.claims_taken_over),
            allocations: get(&s.allocations),
            frees: get(&s.frees),
        }
    }

    /// The layout of `node`'s region (read from its header once).
    pub fn layout(&self, node: NodeId) -> Result<Layout> {
        Ok(self.home(node)?.layout.clone())
    }

    /// Per class of `node`: (capacity bytes, slots, used slots). The used
    /// counts are the placement hints, read one-sidedly.
    pub fn usage(&self, node: NodeId) -> Result<Vec<(u32, u32, u64)>> {
        let home = self.home(node)?;
        let mut counters = vec![0u8; SIZE_CLASSES * 8];
        home.region.read(Layout::used_counter_offset(0), &mut counters)?;
        Ok((0..SIZE_CLASSES as u8)
            .map(|c| (class_capacity(c), home.layout.slots(c), word_at(&counters, c as usize * 8)))
            .collect())
    }

    fn home(&self, node: NodeId) -> Result<Arc<Home>> {
        if let Some(home) = lock(&self.homes).get(&node) {
            return Ok(home.clone());
        }
        let region: Arc<dyn RemoteRegion> = match &self.local {
            Some(local) if node == self.node => Arc::new(LocalHandle { node, region: local.clone() }),
            _ => match self.fabric.connect(node, &self.config.region_name) {
                Ok(region) => region,
                Err(FabricError::UnknownRegion { .. }) => return Err(DdssError::NotStarted { node }),
                Err(e) => return Err(e.into()),
            },
        };
        if region.len() < HEADER_BYTES {
            return Err(DdssError::NotStarted { node });
        }
        let mut header = vec![0u8; HEADER_BYTES as usize];
        region.read(0, &mut header)?;
        let layout = Layout::from_header(node, &header, region.len())?;
        let home = Arc::new(Home { region, layout });
        lock(&self.homes).insert(node, home.clone());
        Ok(home)
    }

    /// The key's home and slot offset, after checking the key names a slot.
    fn slot(&self, key: &Key) -> Result<(Arc<Home>, u64)> {
        let home = self.home(key.home())?;
        let offset = u64::from(key.offset());
        if home.layout.slot_index(key.class(), offset).is_none() {
            return Err(DdssError::UnknownKey {
                key: key.to_string(),
                reason: format!("{} has no slot of class {} at offset {offset}", key.home(), key.class()),
            });
        }
        Ok((home, offset))
    }

    /// Classifies a slot word (control or header) that does not match `key`.
    fn mismatch(key: Key, word: SlotWord) -> DdssError {
        if word.generation < key.generation() {
            // A generation the slot has not reached: not a key its home issued.
            DdssError::UnknownKey { key: key.to_string(), reason: "generation never allocated at its home".into() }
        } else {
            DdssError::KeyFreed { key }
        }
    }

    /// Takes the key's lock word at its home; returns the locked word.
    ///
    /// A lock held past the backoff's spinning phase has its holder's
    /// process checked ([`Fabric::peer_state`]), then again every
    /// [`HOLDER_CHECK_EVERY`] attempts: a holder that is gone for certain
    /// never unlocks, so its lock is taken over ([`Ddss::take_over`]).
    fn lock(&self, region: &dyn RemoteRegion, slot: u64, key: Key) -> Result<u64> {
        let unlocked = SlotWord::unlocked(key.generation());
        let locked_word = SlotWord::locked(key.generation(), self.token);
        for attempt in 0..self.config.lock_attempts_max {
            let previous = region.compare_swap(slot + SLOT_CONTROL, unlocked, locked_word)?;
            if previous == unlocked {
                return Ok(locked_word);
            }
            let word = SlotWord::unpack(previous);
            if word.generation != key.generation() || !word.live {
                return Err(Self::mismatch(key, word));
            }
            if attempt >= HOLDER_CHECK_FROM
                && (attempt - HOLDER_CHECK_FROM).is_multiple_of(HOLDER_CHECK_EVERY)
                && self.holder_gone(word.low)
            {
                let taken = region.compare_swap(slot + SLOT_CONTROL, previous, locked_word)?;
                if taken == previous {
                    self.take_over(region, slot, key, word.low)?;
                    return Ok(locked_word);
                }
            }
            bump(&self.stats.lock_retries);
            backoff(attempt);
        }
        Err(DdssError::LockBusy { key, attempts: self.config.lock_attempts_max })
    }

    /// True if the handle whose token is `token` is gone for certain: its
    /// node's process is gone, or the node runs but without that incarnation
    /// (its id was reopened by a new process, which registered another
    /// incarnation region). Anything else (running, or the fabric cannot
    /// tell) is not gone: a lock or claim is taken over only on certainty.
    fn holder_gone(&self, token: u32) -> bool {
        if token == self.token {
            return false;
        }
        let Some((node, incarnation)) = token_holder(token) else { return false };
        match self.fabric.peer_state(node) {
            PeerState::Gone => true,
            PeerState::Running => matches!(
                self.fabric.connect(node, &incarnation_region_name(&self.config.region_name, incarnation)),
                Err(FabricError::UnknownRegion { .. })
            ),
            PeerState::Unknown => false,
        }
    }

    /// Repairs the slot whose lock this handle just took from the handle of
    /// token `holder`, which is gone. It may have died anywhere in its batch: with
    /// the sequence even, the value is whole (old or new) and stays; with
    /// it odd, the value may be half-written, so it is marked lost (gets
    /// fail with `ValueLost` until the next put) and the sequence is made
    /// even again. Either way the lock is then ours, as if taken normally.
    fn take_over(&self, region: &dyn RemoteRegion, slot: u64, key: Key, holder: u32) -> Result<()> {
        bump(&self.stats.lock_takeovers);
        let sequence = region.read_u64(slot + SLOT_SEQUENCE)?;
        let (node, incarnation) = token_holder(holder).unwrap_or((NodeId(u32::MAX), 0));
        tracing::warn!(%key, %node, incarnation, sequence, "took over the lock of a holder that is gone");
        if sequence % 2 == 0 {
            return Ok(());
        }
        bump(&self.stats.values_lost);
        let lost = SlotWord { generation: key.generation(), live: true, low: LOST_VALUE_LEN }.pack();
        region
            .post(vec![
                Op::Write { offset: slot + SLOT_HEADER, data: lost.to_ne_bytes().to_vec() },
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
            ])
            .wait()?;
        Ok(())
    }

    /// Stores `value` as the key's new version and returns that version.
    /// Under every model the put holds the key's lock word at the home, so
    /// puts of one key never interleave and versions are consecutive.
    pub fn put(&self, key: Key, value: &[u8]) -> Result<u64> {
        let (home, slot) = self.slot(&key)?;
        if value.len() > key.capacity_bytes() as usize {
            return Err(DdssError::ValueTooLarge { len: value.len(), capacity: key.capacity_bytes() });
        }
        let started_ns = self.clock.now_ns();
        let locked_word = self.lock(&*home.region, slot, key)?;
        let header = SlotWord { generation: key.generation(), live: true, low: value.len() as u32 }.pack();
        // The seqlock write of `SeqRecord::write_remote` (odd, payload, even)
        // with the unlock in the same batch: one round trip after the lock.
        let mut ops = vec![
            Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
            Op::Write { offset: slot + SLOT_HEADER, data: header.to_ne_bytes().to_vec() },
        ];
        if !value.is_empty() {
            ops.push(Op::Write { offset: slot + SLOT_DATA, data: value.to_vec() });
        }
        ops.push(Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 });
        ops.push(Op::Read { offset: slot + SLOT_BASE, len: 8 });
        ops.push(Op::CompareSwap {
            offset: slot + SLOT_CONTROL,
            expected: locked_word,
            new: SlotWord::unlocked(key.generation()),
        });
        // A fabric error here leaves the lock held: the key then fails closed
        // with LockBusy rather than exposing a half-written value.
        let mut results = home.region.post(ops).wait()?;
        let unlocked_from = results.pop().ok_or(FabricError::Closed)?.into_u64()?;
        let base = results.pop().ok_or(FabricError::Closed)?.into_u64()?;
        let odd = results.pop().ok_or(FabricError::Closed)?.into_u64()?;
        if unlocked_from != locked_word {
            return Err(DdssError::Corrupt { node: key.home(), reason: "lock word changed while held".into() });
        }
        let raw_version = odd.wrapping_add(1) / 2;
        bump(&self.stats.puts);
        if keeps_copies(key.coherence()) {
            let copy = LocalCopy { raw_version, base, bytes: Arc::from(value), fetched_at_ns: started_ns };
            lock(&self.copies).offer(key, copy);
        }
        Ok(raw_version.saturating_sub(base))
    }

    /// Returns the key's (version, value) as its coherence model allows.
    pub fn get(&self, key: Key) -> Result<(u64, Vec<u8>)> {
        let (home, slot) = self.slot(&key)?;
        let model = key.coherence();
        let now_ns = self.clock.now_ns();
        let copy = lock(&self.copies).get(&key).cloned();
        match plan_get(model, copy.as_ref(), now_ns) {
            GetPlan::UseCopy => {
                if let Some(copy) = copy {
                    bump(&self.stats.gets_from_copy);
                    return Ok(user_value(&copy));
                }
            }
            GetPlan::CheckVersion => {
                if let Some(copy) = copy {
                    let mut words = [0u8; 16];
                    home.region.read(slot + SLOT_CONTROL, &mut words)?;
                    let control = SlotWord::unpack(word_at(&words, 0));
                    if control.generation != key.generation() || !control.live {
                        lock(&self.copies).remove(&key);
                        return Err(Self::mismatch(key, control));
                    }
                    if copy_is_fresh(model, copy.raw_version, word_at(&words, 8)) {
                        lock(&self.copies).refresh(&key, copy.raw_version, now_ns);
                        bump(&self.stats.gets_validated);
                        return Ok(user_value(&copy));
                    }
                }
            }
            GetPlan::Fetch => {}
            GetPlan::LockedFetch => return self.get_locked(&home, slot, key),
        }
        let (raw_version, payload) = self.read_record(&home, slot, key)?;
        let (base, data) = self.parse_value(key, payload)?;
        bump(&self.stats.gets_fetched);
        if keeps_copies(model) {
            let copy = LocalCopy { raw_version, base, bytes: Arc::from(data), fetched_at_ns: now_ns };
            let newest = lock(&self.copies).offer(key, copy);
            return Ok(user_value(&newest));
        }
        Ok((raw_version.saturating_sub(base), data))
    }

    /// The key's record, read without the lock. A read that stays torn
    /// means a write that does not finish: a writer that died mid-put
    /// leaves the sequence odd for good. Then the get takes the key's lock
    /// once — which takes over a dead holder's and repairs the slot
    /// ([`Ddss::take_over`]), or waits out a live writer — and reads again.
    fn read_record(&self, home: &Home, slot: u64, key: Key) -> Result<(u64, Vec<u8>)> {
        let record = record(slot, key.class())?;
        match record.read(&*home.region) {
            Err(FabricError::TornRead { .. }) => {
                let locked_word = self.lock(&*home.region, slot, key)?;
                let unlocked_from =
                    home.region.compare_swap(slot + SLOT_CONTROL, locked_word, SlotWord::unlocked(key.generation()))?;
                if unlocked_from != locked_word {
                    return Err(DdssError::Corrupt { node: key.home(), reason: "lock word changed while held".into() });
                }
                Ok(record.read(&*home.region)?)
            }
            other => Ok(other?),
        }
    }

    /// Strict get: lock, read, unlock. The lock excludes puts and frees, so
    /// the sequence is even and the header matches throughout.
    fn get_locked(&self, home: &Home, slot: u64, key: Key) -> Result<(u64, Vec<u8>)> {
        let locked_word = self.lock(&*home.region, slot, key)?;
        let mut results = home
            .region
            .post(vec![
                Op::Read { offset: slot + SLOT_SEQUENCE, len: 8 },
                Op::Read { offset: slot + SLOT_HEADER, len: (SLOT_DATA - SLOT_HEADER) as u32 + key.capacity_bytes() },
                Op::CompareSwap {
                    offset: slot + SLOT_CONTROL,
                    expected: locked_word,
                    new: SlotWord::unlocked(key.generation()),
                },
            ])
            .wait()?
            .into_iter();
        let mut next = || results.next().ok_or(DdssError::Fabric(FabricError::Closed));
        let sequence = next()?.into_u64()?;
        let payload = next()?.into_bytes()?;
        let unlocked_from = next()?.into_u64()?;
        if sequence % 2 != 0 || unlocked_from != locked_word {
            return Err(DdssError::Corrupt { node: key.home(), reason: "a write ran under the strict lock".into() });
        }
        let (base, data) = self.parse_value(key, payload)?;
        bump(&self.stats.gets_locked);
        Ok(((sequence / 2).saturating_sub(base), data))
    }

    /// Checks a record payload (header, base, data) against `key`; returns
    /// the base version and the value, reusing the payload's buffer.
    fn parse_value(&self, key: Key, mut payload: Vec<u8>) -> Result<(u64, Vec<u8>)> {
        let header_bytes = (SLOT_DATA - SLOT_HEADER) as usize;
        if payload.len() < header_bytes {
            return Err(DdssError::Corrupt { node: key.home(), reason: "short record".into() });
        }
        let header = SlotWord::unpack(word_at(&payload, 0));
        if header.generation != key.generation() || !header.live {
            lock(&self.copies).remove(&key);
            return Err(Self::mismatch(key, header));
        }
        if header.low == LOST_VALUE_LEN {
            lock(&self.copies).remove(&key);
            return Err(DdssError::ValueLost { key });
        }
        let base = word_at(&payload, 8);
        let len = header.low as usize;
        if header_bytes + len > payload.len() {
            return Err(DdssError::Corrupt {
                node: key.home(),
                reason: format!("value length {len} exceeds the slot"),
            });
        }
        payload.truncate(header_bytes + len);
        payload.drain(..header_bytes);
        Ok((base, payload))
    }

    /// Forgets the cached region handle and layout of `node` (after it restarted).
    pub fn forget_home(&self, node: NodeId) {
        lock(&self.homes).remove(&node);
    }
}

/// The name of the region that marks incarnation `incarnation` of a node as running.
fn incarnation_region_name(region_name: &str, incarnation: u32) -> String {
    format!("{region_name}.i{incarnation}")
}

/// Picks this handle's incarnation and registers its region (8 bytes; its
/// existence is the mark). Incarnations of one process differ (a counter);
/// a new process starts from a base drawn from its pid and the clock, so a
/// reopened node id gets another incarnation than the dead one's except by
/// a 1 in 32767 chance, in which case the dead one's locks stay busy
/// (`LockBusy`: fail closed, never a wrong takeover).
fn register_incarnation(fabric: &dyn Fabric, region_name: &str) -> Result<(u32, Arc<LocalRegion>)> {
    use std::sync::atomic::AtomicU32;
    use std::sync::OnceLock;
    static BASE: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = *BASE.get_or_init(|| {
        let nanos =
            tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mixed = (u64::from(std::process::id()) << 32 | u64::from(nanos)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 40) as u32
    });
    let mut last_error = None;
    // Skip incarnations some other handle on this fabric registered already.
    for _ in 0..64 {
        let incarnation = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % INCARNATION_MAX + 1;
        match fabric.register(
            &incarnation_region_name(region_name, incarnation),
            8,
            tierstack_fabric::Access::read_only(),
        ) {
            Ok(region) => return Ok((incarnation, region)),
            Err(e @ FabricError::RegionExists { .. }) => last_error = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last_error.unwrap_or(FabricError::Closed).into())
}

fn user_value(copy: &LocalCopy) -> (u64, Vec<u8>) {
    (copy.raw_version.saturating_sub(copy.base), copy.bytes.to_vec())
}

fn nth_u64(results: Vec<OpResult>, n: usize) -> Result<u64> {
    Ok(results.into_iter().nth(n).ok_or(FabricError::Closed)?.into_u64()?)
}

/// This node's own region seen through the [`RemoteRegion`] interface, so
/// every protocol has one code path; operations run on the caller's thread.
struct LocalHandle {
    node: NodeId,
    region: Arc<LocalRegion>,
}

impl RemoteRegion for LocalHandle {
    fn node(&self) -> NodeId {
        self.node
    }

    fn name(&self) -> &str {
        self.region.name()
    }

    fn len(&self) -> u64 {
        self.region.len()
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        let memory = self.region.memory();
        Completion::ready(
            check_batch(self.region.name(), memory.len(), &ops).and_then(|()| execute_on_memory(memory, &ops)),
        )
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> tierstack_fabric::Result<()> {
        self.region.memory().read(offset, buf)
    }

    fn read_u64(&self, offset: u64) -> tierstack_fabric::Result<u64> {
        self.region.memory().load_u64(offset)
    }

    fn fetch_add(&self, offset: u64, delta: u64) -> tierstack_fabric::Result<u64> {
        self.region.memory().fetch_add(offset, delta)
    }

    fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> tierstack_fabric::Result<u64> {
        self.region.memory().compare_swap(offset, expected, new)
    }
}
