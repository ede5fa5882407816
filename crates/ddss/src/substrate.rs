//! [`Ddss`]: one node's handle on the substrate, executing the protocols of
//! the crate docs with one-sided operations.

use crate::alloc::{claim, clear_bit, Claim, RegionBitmap};
use crate::coherence::{copy_is_fresh, keeps_copies, plan_get, GetPlan, LocalCopies, LocalCopy};
use crate::error::{DdssError, Result};
use crate::key::{Coherence, Key, Placement};
use crate::layout::{
    class_capacity, class_for, holder_token, next_generation, record, token_holder, Layout, SlotWord, HEADER_BYTES,
    HOLDER_NODE_MAX, INCARNATION_MAX, LOST_VALUE_LEN, MAGIC, SIZE_CLASSES, SLOT_BASE, SLOT_CONTROL, SLOT_DATA,
    SLOT_HEADER, SLOT_SEQUENCE, VALUE_BYTES_MAX,
};
use rand::Rng;
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

/// How a node takes part in the substrate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DdssConfig {
    /// Name of the registered region (the same on every node).
    pub region_name: String,
    /// Slots of each size class in this node's region (class `c` holds up to `8 << c` bytes).
    pub slots_per_class: [u32; SIZE_CLASSES],
    /// Nodes that run the substrate: targets of `Placement::Node` and `Placement::Auto`.
    /// Empty means only this node.
    pub members: Vec<NodeId>,
    pub lock_attempts_max: u32,
    pub alloc_attempts_max: u32,
    /// Seed of the RNG that spreads allocations over nodes and bitmap words.
    pub seed: u64,
}

impl Default for DdssConfig {
    /// About 7 MiB per node: 256 slots of each class up to 1 KiB, 64 up to
    /// 8 KiB, 16 up to 64 KiB, 2 up to 1 MiB.
    fn default() -> Self {
        let mut slots = [0u32; SIZE_CLASSES];
        for (c, s) in slots.iter_mut().enumerate() {
            *s = match c {
                0..=7 => 256,
                8..=10 => 64,
                11..=13 => 16,
                _ => 2,
            };
        }
        Self {
            region_name: REGION_NAME.to_string(),
            slots_per_class: slots,
            members: Vec::new(),
            lock_attempts_max: LOCK_ATTEMPTS_MAX,
            alloc_attempts_max: ALLOC_ATTEMPTS_MAX,
            seed: 0x0dd5_5eed,
        }
    }
}

impl DdssConfig {
    /// A config with no slots at all; add classes with [`DdssConfig::with_slots`].
    pub fn empty() -> Self {
        Self { slots_per_class: [0; SIZE_CLASSES], ..Self::default() }
    }

    /// Sets the slot count of the class that holds `capacity_bytes`.
    pub fn with_slots(mut self, capacity_bytes: u32, slots: u32) -> Self {
        let class = class_for(u64::from(capacity_bytes)).unwrap_or(SIZE_CLASSES as u8 - 1);
        self.slots_per_class[class as usize] = slots;
        self
    }

    pub fn with_members(mut self, members: Vec<NodeId>) -> Self {
        self.members = members;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn with_region_name(mut self, name: impl Into<String>) -> Self {
        self.region_name = name.into();
        self
    }
}

/// Counters of what a handle's operations did (for tests and reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DdssStats {
    /// Gets answered from the local copy with no remote operation.
    pub gets_from_copy: u64,
    /// Gets answered from the local copy after a one-sided version read.
    pub gets_validated: u64,
    /// Gets that read the value from its home (seqlock read).
    pub gets_fetched: u64,
    /// Gets under the key's lock (strict).
    pub gets_locked: u64,
    pub puts: u64,
    /// Failed lock attempts (contention).
    pub lock_retries: u64,
    /// Locks taken over from a holder whose process is gone.
    pub lock_takeovers: u64,
    /// Of those, takeovers that found the value half-written and marked it lost.
    pub values_lost: u64,
    /// Slot claims (an allocation or free in progress) taken over from a
    /// handle whose process is gone, by an allocation or a sweep.
    pub claims_taken_over: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Default)]
struct Stats {
    gets_from_copy: AtomicU64,
    gets_validated: AtomicU64,
    gets_fetched: AtomicU64,
    gets_locked: AtomicU64,
    puts: AtomicU64,
    lock_retries: AtomicU64,
    lock_takeovers: AtomicU64,
    values_lost: AtomicU64,
    claims_taken_over: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

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
        let region = fabric.register(&config.region_name, layout.region_bytes())?;
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

    /// Allocates room for a value of up to `bytes` bytes with `coherence`,
    /// in the smallest size class that fits and that the home has slots of
    /// (a full class does not spill into larger ones: that is `RegionFull`).
    /// The new key's value is empty, at version 0.
    pub fn allocate(&self, bytes: u64, placement: Placement, coherence: Coherence) -> Result<Key> {
        let class = class_for(bytes).ok_or(DdssError::AllocationTooLarge { bytes, max: VALUE_BYTES_MAX })?;
        let candidates = match placement {
            Placement::Local => {
                if self.local.is_none() {
                    return Err(DdssError::NoLocalRegion);
                }
                vec![self.node]
            }
            Placement::Node(node) => {
                if !self.members().contains(&node) {
                    return Err(DdssError::NotMember { node });
                }
                vec![node]
            }
            Placement::Auto => self.rank_by_free_slots(class)?,
        };
        let mut last_error = DdssError::RegionFull { node: self.node, class_bytes: class_capacity(class) };
        for node in candidates {
            match self.allocate_on(node, class, coherence) {
                Ok(key) => {
                    bump(&self.stats.allocations);
                    return Ok(key);
                }
                // Auto placement routes around full and unreachable members.
                Err(e) if placement == Placement::Auto => last_error = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_error)
    }

    /// Members ordered by free slots of `class`, most first; ties in RNG order.
    fn rank_by_free_slots(&self, class: u8) -> Result<Vec<NodeId>> {
        let mut ranked = Vec::new();
        let mut last_error = None;
        for node in self.members() {
            let free = self.home(node).and_then(|home| {
                let Some(class) = home.layout.class_with_slots(class) else { return Ok(0) };
                let used = home.region.read_u64(Layout::used_counter_offset(class))?;
                Ok(u64::from(home.layout.slots(class)).saturating_sub(used))
            });
            match free {
                Ok(free) => {
                    let tie: u64 = lock(&self.rng).gen();
                    ranked.push((std::cmp::Reverse(free), tie, node));
                }
                Err(e) => {
                    tracing::debug!(%node, error = %e, "member skipped by automatic placement");
                    last_error = Some(e);
                }
            }
        }
        if ranked.is_empty() {
            return Err(last_error.unwrap_or(DdssError::NotStarted { node: self.node }));
        }
        ranked.sort();
        Ok(ranked.into_iter().map(|(_, _, node)| node).collect())
    }

    /// Claims a slot on `node` one-sidedly and initializes it: of the
    /// smallest class at least `min_class` that the node has slots of. A
    /// class that looks full is swept once for claims of dead handles.
    fn allocate_on(&self, node: NodeId, min_class: u8, coherence: Coherence) -> Result<Key> {
        let home = self.home(node)?;
        let class = home
            .layout
            .class_with_slots(min_class)
            .ok_or(DdssError::RegionFull { node, class_bytes: class_capacity(min_class) })?;
        let (slot, claimed) = self.claim_on(&home, node, class)?;
        self.publish(&home, node, class, slot, claimed, coherence)
    }

    /// Claims a free slot of `class` on `node`: returns its offset and its
    /// control word as claimed by this handle.
    fn claim_on(&self, home: &Home, node: NodeId, class: u8) -> Result<(u64, u64)> {
        let slots = home.layout.slots(class);
        let (bitmap_offset, words) = home.layout.bitmap(class);
        let bitmap = RegionBitmap { region: &*home.region, offset: bitmap_offset, words };
        let start = lock(&self.rng).gen_range(0..slots);
        let mut swept = false;
        loop {
            let mut claimed = 0;
            let outcome = claim(&bitmap, slots, start, self.config.alloc_attempts_max, |index| {
                let slot = home.layout.slot_offset(class, index);
                Ok(match self.claim_slot(&*home.region, slot)? {
                    Some(word) => {
                        claimed = word;
                        true
                    }
                    None => false,
                })
            })?;
            match outcome {
                Claim::Claimed(index) => return Ok((home.layout.slot_offset(class, index), claimed)),
                Claim::Full if !swept && self.sweep_class(home, class)? > 0 => swept = true,
                Claim::Full => return Err(DdssError::RegionFull { node, class_bytes: class_capacity(class) }),
                Claim::Contended => {
                    return Err(DdssError::Contended { node, attempts: self.config.alloc_attempts_max });
                }
            }
        }
    }

    /// Takes the claim of the slot at `slot` if it is free, or claimed by a
    /// handle that is gone; returns the claimed control word.
    fn claim_slot(&self, region: &dyn RemoteRegion, slot: u64) -> Result<Option<u64>> {
        let current = region.read_u64(slot + SLOT_CONTROL)?;
        let word = SlotWord::unpack(current);
        if word.live || (word.low != 0 && !self.holder_gone(word.low)) {
            return Ok(None);
        }
        let mine = SlotWord { generation: word.generation, live: false, low: self.token }.pack();
        if region.compare_swap(slot + SLOT_CONTROL, current, mine)? != current {
            return Ok(None);
        }
        if word.low != 0 {
            bump(&self.stats.claims_taken_over);
            tracing::warn!(slot, holder = word.low, "took over the slot claim of a handle that is gone");
        }
        Ok(Some(mine))
    }

    /// Initializes and publishes the slot this handle claimed (control word
    /// `claimed`): a new generation, an empty value at version 0.
    fn publish(
        &self,
        home: &Home,
        node: NodeId,
        class: u8,
        slot: u64,
        claimed: u64,
        coherence: Coherence,
    ) -> Result<Key> {
        let sequence = home.region.read_u64(slot + SLOT_SEQUENCE)?;
        // A claimer that died inside its own initialization left the
        // sequence odd; the write below then starts from there.
        let odd = sequence % 2;
        let generation = next_generation(SlotWord::unpack(claimed).generation);
        let base = (sequence + 2 - odd) / 2;
        let header = SlotWord { generation, live: true, low: 0 }.pack();
        let mut init = header.to_ne_bytes().to_vec();
        init.extend_from_slice(&base.to_ne_bytes());
        let results = home
            .region
            .post(vec![
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 - odd },
                Op::Write { offset: slot + SLOT_HEADER, data: init },
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: claimed, new: SlotWord::unlocked(generation) },
                Op::FetchAdd { offset: Layout::used_counter_offset(class), delta: 1 },
            ])
            .wait()?;
        let swapped = nth_u64(results, 3)?;
        if swapped != claimed {
            return Err(DdssError::Corrupt { node, reason: format!("claim on slot {slot} changed under us") });
        }
        let offset = u32::try_from(slot).map_err(|_| DdssError::Corrupt { node, reason: "slot offset".into() })?;
        Ok(Key::new(node, offset, generation, class, coherence))
    }

    /// Releases every slot of `node` whose allocation or free was left
    /// unfinished by a handle that is gone (its claim still in the control
    /// word, the bitmap bit possibly set); returns how many. Allocation runs
    /// it by itself when a class looks full.
    pub fn sweep(&self, node: NodeId) -> Result<u32> {
        let home = self.home(node)?;
        let mut reclaimed = 0;
        for class in 0..SIZE_CLASSES as u8 {
            reclaimed += self.sweep_class(&home, class)?;
        }
        Ok(reclaimed)
    }

    fn sweep_class(&self, home: &Home, class: u8) -> Result<u32> {
        let (bitmap_offset, words) = home.layout.bitmap(class);
        let bitmap = RegionBitmap { region: &*home.region, offset: bitmap_offset, words };
        let mut reclaimed = 0;
        for index in 0..home.layout.slots(class) {
            let slot = home.layout.slot_offset(class, index);
            let word = SlotWord::unpack(home.region.read_u64(slot + SLOT_CONTROL)?);
            if word.live || word.low == 0 {
                continue; // allocated, or free: nothing unfinished
            }
            let Some(mine) = self.claim_slot(&*home.region, slot)? else { continue };
            clear_bit(&bitmap, index)?;
            let free = SlotWord { generation: word.generation, live: false, low: 0 }.pack();
            if home.region.compare_swap(slot + SLOT_CONTROL, mine, free)? != mine {
                return Err(DdssError::Corrupt {
                    node: home.region.node(),
                    reason: format!("claim on slot {slot} changed under us"),
                });
            }
            reclaimed += 1;
        }
        Ok(reclaimed)
    }

    /// Frees the key's slot. Later gets and puts of the key, from any node,
    /// fail with `KeyFreed` (a local copy under null or temporal coherence
    /// elsewhere may still answer until it is refreshed).
    pub fn free(&self, key: Key) -> Result<()> {
        let (home, slot) = self.slot(&key)?;
        let locked_word = self.lock(&*home.region, slot, key)?;
        let dead = SlotWord { generation: key.generation(), live: false, low: 0 }.pack();
        // Not live, and claimed by us until the bit is clear: a free that
        // dies midway leaves a claim that allocation or a sweep takes over.
        let claimed = SlotWord { generation: key.generation(), live: false, low: self.token }.pack();
        let results = home
            .region
            .post(vec![
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::Write { offset: slot + SLOT_HEADER, data: dead.to_ne_bytes().to_vec() },
                Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
                Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: locked_word, new: claimed },
                Op::FetchAdd { offset: Layout::used_counter_offset(key.class()), delta: 1u64.wrapping_neg() },
            ])
            .wait()?;
        if nth_u64(results, 3)? != locked_word {
            return Err(DdssError::Corrupt { node: key.home(), reason: "lock word changed while held".into() });
        }
        lock(&self.copies).remove(&key);
        let index = home.layout.slot_index(key.class(), slot).ok_or_else(|| DdssError::UnknownKey {
            key: key.to_string(),
            reason: "slot vanished from the layout".into(),
        })?;
        let (bitmap_offset, words) = home.layout.bitmap(key.class());
        let was_set = clear_bit(&RegionBitmap { region: &*home.region, offset: bitmap_offset, words }, index)?;
        if home.region.compare_swap(slot + SLOT_CONTROL, claimed, dead)? != claimed {
            return Err(DdssError::Corrupt { node: key.home(), reason: "claim changed while held".into() });
        }
        if !was_set {
            // Freed all the same (the control word is the authority); reported.
            return Err(DdssError::Corrupt { node: key.home(), reason: format!("slot {index} was not allocated") });
        }
        bump(&self.stats.frees);
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
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mixed = (u64::from(std::process::id()) << 32 | u64::from(nanos)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 40) as u32
    });
    let mut last_error = None;
    // Skip incarnations some other handle on this fabric registered already.
    for _ in 0..64 {
        let incarnation = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % INCARNATION_MAX + 1;
        match fabric.register(&incarnation_region_name(region_name, incarnation), 8) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_fabric_shm::{ShmConfig, ShmFabric};
    use tierstack_fabric_tcp::{TcpConfig, TcpFabric};

    fn config() -> DdssConfig {
        // Few lock attempts, so that a lock held by a live process is
        // reported busy quickly; enough for two holder checks.
        DdssConfig { lock_attempts_max: 400, ..DdssConfig::empty().with_slots(64, 4) }.with_members(vec![
            NodeId(0),
            NodeId(1),
            NodeId(2),
        ])
    }

    /// Ends the writer's fabric, as its process's death would.
    type EndWriter = Box<dyn FnOnce()>;

    /// Three fabrics (home, writer, survivor) and a way to end the writer's.
    fn fabrics(shm: bool, root: &std::path::Path) -> (Vec<Arc<dyn Fabric>>, EndWriter) {
        if shm {
            let open = |id| ShmFabric::open(ShmConfig::new(root, NodeId(id))).unwrap();
            let (home, writer, survivor) = (open(0), open(1), open(2));
            let fabrics: Vec<Arc<dyn Fabric>> = vec![home, writer.clone(), survivor];
            // The last handle of the writer's fabric goes with the closure's
            // caller dropping everything else it holds.
            return (fabrics, Box::new(move || drop(writer)));
        }
        let loopback = "127.0.0.1:0".parse().unwrap();
        let tcp: Vec<Arc<TcpFabric>> =
            (0..3).map(|id| TcpFabric::open(TcpConfig::new(NodeId(id), loopback)).unwrap()).collect();
        for a in &tcp {
            for b in &tcp {
                a.add_peer(b.local_node(), b.local_addr());
            }
        }
        let writer = tcp[1].clone();
        let fabrics = tcp.into_iter().map(|f| f as Arc<dyn Fabric>).collect();
        (fabrics, Box::new(move || writer.shutdown()))
    }

    /// The writer (node 1) takes the key's lock as a put does and, if
    /// `mid_write`, starts the seqlock write (odd sequence, half a value),
    /// and goes no further: what a process killed inside its put leaves.
    /// Returns its handles (to drop before its fabric ends) and the locked word.
    fn stall_inside_a_put(
        fabrics: &[Arc<dyn Fabric>],
        key: Key,
        mid_write: bool,
    ) -> (Ddss, Arc<dyn RemoteRegion>, u64) {
        let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
        let (_, slot) = writer.slot(&key).unwrap();
        let region = fabrics[1].connect(NodeId(0), REGION_NAME).unwrap();
        let locked_word = writer.lock(&*region, slot, key).unwrap();
        if mid_write {
            region.fetch_add(slot + SLOT_SEQUENCE, 1).unwrap();
            region.write(slot + SLOT_DATA, b"hal").unwrap();
        }
        (writer, region, locked_word)
    }

    /// The writer stalls inside a put (see [`stall_inside_a_put`]), then its
    /// process ends before it unlocks.
    fn dead_holder(shm: bool, mid_write: bool) {
        let root = tempfile::tempdir().unwrap();
        let (fabrics, end_writer) = fabrics(shm, root.path());
        let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
        let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
        let key = home.allocate(64, Placement::Local, Coherence::Strict).unwrap();
        assert_eq!(survivor.put(key, b"first").unwrap(), 1);

        let (writer, region, locked_word) = stall_inside_a_put(&fabrics, key, mid_write);
        let busy = survivor.put(key, b"x");
        assert!(matches!(busy, Err(DdssError::LockBusy { .. })), "a live holder's lock is not taken: {busy:?}");
        assert_eq!(survivor.stats().lock_takeovers, 0);

        drop((region, writer));
        let mut fabrics = fabrics;
        fabrics.remove(1);
        end_writer();
        assert_eq!(fabrics[1].peer_state(NodeId(1)), PeerState::Gone);

        let got = survivor.get(key);
        if mid_write {
            assert_eq!(got, Err(DdssError::ValueLost { key }), "a half-written value is never returned");
        } else {
            assert_eq!(got, Ok((1, b"first".to_vec())), "the value the dead holder never touched stays");
        }
        let stats = survivor.stats();
        assert_eq!((stats.lock_takeovers, stats.values_lost), (1, u64::from(mid_write)));
        let version = survivor.put(key, b"third").unwrap();
        assert_eq!(version, if mid_write { 3 } else { 2 }, "the lost put keeps versions consecutive");
        assert_eq!(home.get(key).unwrap(), (version, b"third".to_vec()));
        assert_ne!(locked_word, SlotWord::unlocked(key.generation()));
    }

    /// A get that takes no lock (read coherence) finds the dead writer's
    /// sequence odd for good; it takes the lock over and reports the loss.
    #[test]
    fn a_lockless_get_of_a_value_whose_writer_died_mid_write_reports_it_lost() {
        for shm in [true, false] {
            let root = tempfile::tempdir().unwrap();
            let (mut fabrics, end_writer) = fabrics(shm, root.path());
            let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
            let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
            let key = home.allocate(64, Placement::Local, Coherence::Read).unwrap();
            assert_eq!(home.put(key, b"first").unwrap(), 1);
            drop(stall_inside_a_put(&fabrics, key, true));
            fabrics.remove(1);
            end_writer();
            assert_eq!(survivor.get(key), Err(DdssError::ValueLost { key }), "shm={shm}");
            assert_eq!(survivor.stats().lock_takeovers, 1);
            assert_eq!(survivor.put(key, b"again").unwrap(), 3);
            assert_eq!(survivor.get(key).unwrap(), (3, b"again".to_vec()));
        }
    }

    /// The writer holds the key's lock, its process ends, and a new process
    /// reopens its node id (and runs the substrate there). The lock word
    /// names the dead incarnation, so it is taken over although node 1 runs.
    #[test]
    fn a_lock_held_by_a_dead_incarnation_of_a_reopened_node_is_taken_over() {
        let root = tempfile::tempdir().unwrap();
        let (mut fabrics, end_writer) = fabrics(true, root.path());
        let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
        let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
        let key = home.allocate(64, Placement::Local, Coherence::Write).unwrap();
        assert_eq!(survivor.put(key, b"first").unwrap(), 1);
        drop(stall_inside_a_put(&fabrics, key, false));
        fabrics.remove(1);
        end_writer();
        let reopened = ShmFabric::open(ShmConfig::new(root.path(), NodeId(1))).unwrap();
        let successor = Ddss::attach(reopened.clone(), config()).unwrap();
        assert_eq!(fabrics[1].peer_state(NodeId(1)), PeerState::Running, "node 1 runs again");
        assert_eq!(successor.put(key, b"second").unwrap(), 2, "the new incarnation takes its predecessor's lock over");
        assert_eq!(successor.stats().lock_takeovers, 1);
        assert_eq!(survivor.get(key).unwrap(), (2, b"second".to_vec()));
        // A live incarnation's lock is still respected, on the same node id.
        let (_, slot) = successor.slot(&key).unwrap();
        let region = reopened.connect(NodeId(0), REGION_NAME).unwrap();
        successor.lock(&*region, slot, key).unwrap();
        assert!(matches!(survivor.put(key, b"x"), Err(DdssError::LockBusy { .. })));
    }

    /// An allocator that dies after claiming a slot and before publishing
    /// it: with the bitmap bit still clear (the next allocation takes the
    /// claim over) or already set (the class looks full; the sweep frees it).
    #[test]
    fn a_slot_claimed_by_a_dead_allocator_is_reclaimed() {
        for (shm, bit_set) in [(true, false), (true, true), (false, true)] {
            let root = tempfile::tempdir().unwrap();
            let (mut fabrics, end_writer) = fabrics(shm, root.path());
            let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
            let survivor = Ddss::attach(fabrics[2].clone(), config()).unwrap();
            let keys: Vec<Key> =
                (0..3).map(|_| home.allocate(64, Placement::Local, Coherence::Null).unwrap()).collect();
            let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
            let whome = writer.home(NodeId(0)).unwrap();
            let class = keys[0].class();
            let (slot, _) = if bit_set {
                writer.claim_on(&whome, NodeId(0), class).unwrap()
            } else {
                // Claimed in the control word; died before setting the bit.
                let index = (0..4)
                    .find(|i| writer.claim_slot(&*whome.region, whome.layout.slot_offset(class, *i)).unwrap().is_some())
                    .unwrap();
                (whome.layout.slot_offset(class, index), 0)
            };
            let full = survivor.allocate(64, Placement::Node(NodeId(0)), Coherence::Null);
            assert!(matches!(full, Err(DdssError::RegionFull { .. })), "a live claim is respected: {full:?}");
            drop((whome, writer));
            fabrics.remove(1);
            end_writer();
            let key = survivor.allocate(64, Placement::Node(NodeId(0)), Coherence::Null).unwrap();
            assert_eq!(u64::from(key.offset()), slot, "shm={shm} bit_set={bit_set}: the dead claim's slot");
            assert_eq!(survivor.stats().claims_taken_over, 1, "by the allocation or its sweep");
            assert_eq!(survivor.put(key, b"mine").unwrap(), 1);
            assert_eq!(home.get(key).unwrap(), (1, b"mine".to_vec()));
            assert!(matches!(home.allocate(64, Placement::Local, Coherence::Null), Err(DdssError::RegionFull { .. })));
            for k in keys.into_iter().chain([key]) {
                home.free(k).unwrap();
            }
            assert_eq!(home.usage(NodeId(0)).unwrap()[class as usize].2, 0, "used counter back to zero");
        }
    }

    /// A free that dies after marking the slot dead and before clearing its
    /// bit: the slot is reclaimed by the sweep of a full class.
    #[test]
    fn a_slot_whose_free_died_midway_is_reclaimed() {
        let root = tempfile::tempdir().unwrap();
        let (mut fabrics, end_writer) = fabrics(true, root.path());
        let home = Ddss::start(fabrics[0].clone(), config()).unwrap();
        let keys: Vec<Key> = (0..4).map(|_| home.allocate(64, Placement::Local, Coherence::Null).unwrap()).collect();
        let writer = Ddss::attach(fabrics[1].clone(), config()).unwrap();
        let (whome, slot) = writer.slot(&keys[0]).unwrap();
        let locked_word = writer.lock(&*whome.region, slot, keys[0]).unwrap();
        let claimed = SlotWord { generation: keys[0].generation(), live: false, low: writer.token }.pack();
        let dead = SlotWord { generation: keys[0].generation(), live: false, low: 0 }.pack();
        // The first batch of `free`, and no further.
        let ops = vec![
            Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
            Op::Write { offset: slot + SLOT_HEADER, data: dead.to_ne_bytes().to_vec() },
            Op::FetchAdd { offset: slot + SLOT_SEQUENCE, delta: 1 },
            Op::CompareSwap { offset: slot + SLOT_CONTROL, expected: locked_word, new: claimed },
            Op::FetchAdd { offset: Layout::used_counter_offset(keys[0].class()), delta: 1u64.wrapping_neg() },
        ];
        assert_eq!(nth_u64(whome.region.post(ops).wait().unwrap(), 3).unwrap(), locked_word);
        drop((whome, writer));
        fabrics.remove(1);
        end_writer();
        assert_eq!(home.get(keys[0]), Err(DdssError::KeyFreed { key: keys[0] }));
        let key = home.allocate(64, Placement::Local, Coherence::Null).unwrap();
        assert_eq!(u64::from(key.offset()), slot);
        assert_eq!(key.generation(), keys[0].generation() + 1);
        assert_eq!(home.sweep(NodeId(0)).unwrap(), 0, "nothing left to sweep");
    }

    #[test]
    fn a_lock_whose_holder_died_before_writing_is_taken_over_with_the_value_intact() {
        dead_holder(true, false);
        dead_holder(false, false);
    }

    #[test]
    fn a_lock_whose_holder_died_mid_write_is_taken_over_and_the_value_reported_lost() {
        dead_holder(true, true);
        dead_holder(false, true);
    }
}
