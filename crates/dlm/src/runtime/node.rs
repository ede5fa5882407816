//! What the fabric-facing half of every scheme shares: this node's regions,
//! the handles to the homes' tables, locating a lock's slot, sending
//! messages, and the counters behind [`super::DlmStats`].

use super::liveness::{Lease, Watch};
use super::{DlmConfig, DlmStats};
use crate::error::LockError;
use crate::msg::DlmMessage;
use crate::status::{node_region_bytes, INCARNATION_OFFSET, LEASE_OFFSET, STATUS_ENTRIES};
use crate::table::{alive_region, home_of, table_region, HomeMemory};

use crate::word::{fence_seed, SLOT_BYTES};
use crate::LockId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_base::sync::lock;
use tierstack_base::NodeId;
use tierstack_fabric::{Access, Channel, Fabric, FabricError, LocalRegion, Rights};

/// Remote nodes operate on lock words only with atomics, and read a word's
/// tag and fence; nothing writes a lock table with a plain write, so no
/// peer may (a stray write could forge a grant).
fn lock_table_access() -> Access {
    Access::new(Rights::READ_ATOMIC)
}

fn unix_ms() -> u64 {
    tierstack_base::time::system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a lock lives.
pub(super) struct Slot {
    pub(super) home_node: NodeId,
    pub(super) home: Arc<HomeMemory>,
    /// Byte offset of the lock's slot in the home table.
    pub(super) base: u64,
    /// The home's incarnation.
    pub(super) epoch: u64,
    /// The lock's home epoch (re-homing; 0 without it).
    pub(super) home_epoch: u32,
    /// What every N-CoShED/DQNL message about the lock carries (see
    /// [`crate::msg`]): the home epoch's low 16 bits above the incarnation's
    /// low 48, so a notice of a newer home tells itself apart.
    pub(super) wire_epoch: u64,
}

/// The message epoch of a lock at home epoch `home_epoch` of a home of `incarnation`.
pub(super) fn wire_epoch(incarnation: u64, home_epoch: u32) -> u64 {
    (u64::from(home_epoch & 0xFFFF) << 48) | (incarnation & ((1 << 48) - 1))
}

/// The home epoch's low 16 bits a wire epoch carries.
pub(super) fn wire_home_epoch(wire: u64) -> u16 {
    (wire >> 48) as u16
}

/// What the fabric-facing half of every scheme shares.
pub(super) struct Core {
    pub(super) fabric: Arc<dyn Fabric>,
    pub(super) me: NodeId,
    pub(super) config: DlmConfig,
    pub(super) nodes: Arc<[NodeId]>,
    pub(super) table: Option<Arc<LocalRegion>>,
    pub(super) table_name: String,
    pub(super) node_region_name: String,
    pub(super) node_region: Arc<LocalRegion>,
    /// This manager's incarnation (word 0 of its node region).
    pub(super) incarnation: u64,
    pub(super) next_entry: AtomicU64,
    pub(super) lease: Option<Arc<Lease>>,
    /// Per home node: its table and its incarnation.
    pub(super) homes: Mutex<HashMap<NodeId, (Arc<HomeMemory>, u64)>>,
    pub(super) watches: Mutex<HashMap<NodeId, Watch>>,
    pub(super) messages_handled: AtomicU64,
    pub(super) message_errors: AtomicU64,
    pub(super) violations: AtomicU64,
    pub(super) messages_sent: AtomicU64,
    pub(super) moves: AtomicU64,
    pub(super) recoveries: AtomicU64,
    pub(super) rehomes: AtomicU64,
    pub(super) peers_lost: AtomicU64,
}

impl Core {
    pub(super) fn new(fabric: Arc<dyn Fabric>, config: DlmConfig) -> Result<Self, LockError> {
        let me = fabric.local_node();
        config.validate(me)?;
        let register = |name: &str, bytes: u64, access: Access| {
            fabric
                .register(name, bytes, access)
                .map_err(|e| LockError::Config(format!("cannot register {name:?}: {e}")))
        };
        let (prefix, scheme) = (&config.region_prefix, config.scheme.name());
        let (table_name, node_region_name) = (table_region(prefix, scheme), alive_region(prefix, scheme));
        // The node region first, its incarnation written: whoever finds the
        // table finds the incarnation it belongs to.
        let node_region = register(&node_region_name, node_region_bytes(), Access::read_only())?;
        let memory = node_region.memory();
        let incarnation = tierstack_base::fresh_seed() | 1;
        let lease_ms = config.lease.map_or(0, |l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1));
        let setup = |e: FabricError| LockError::Config(format!("cannot write the node region: {e}"));
        memory.store_u64(INCARNATION_OFFSET, incarnation).map_err(setup)?;
        memory.store_u64(LEASE_OFFSET, lease_ms).map_err(setup)?;
        let table = if config.lock_servers.contains(&me) {
            Some(register(&table_name, u64::from(config.table_slots) * SLOT_BYTES, lock_table_access())?)
        } else {
            None
        };
        let lease = config.lease.map(|lease| Arc::new(Lease::new(lease)));
        let nodes: Arc<[NodeId]> = config.nodes.iter().copied().collect();
        Ok(Self {
            fabric,
            me,
            config,
            nodes,
            table,
            table_name,
            node_region_name,
            node_region,
            incarnation,
            next_entry: AtomicU64::new(0),
            lease,
            homes: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            messages_handled: AtomicU64::new(0),
            message_errors: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            rehomes: AtomicU64::new(0),
            peers_lost: AtomicU64::new(0),
        })
    }

    /// `node`'s table and the incarnation it belongs to.
    pub(super) fn home(&self, lock_id: LockId, node: NodeId) -> Result<(Arc<HomeMemory>, u64), LockError> {
        if let Some(home) = lock(&self.homes).get(&node) {
            return Ok(home.clone());
        }
        let fabric_err = |e| LockError::from_fabric(lock_id, node, e);
        let home = match (&self.table, node == self.me) {
            (Some(table), true) => (Arc::new(HomeMemory::Local(table.clone())), self.incarnation),
            _ => {
                let table = self.fabric.connect(node, &self.table_name).map_err(fabric_err)?;
                // Registered before the table: the incarnation the table
                // belongs to, or (if the home restarted just now) a newer one,
                // whose table the first atomic then misses (PeerDead).
                let epoch = self
                    .fabric
                    .connect(node, &self.node_region_name)
                    .and_then(|region| region.read_u64(INCARNATION_OFFSET))
                    .map_err(fabric_err)?;
                (Arc::new(HomeMemory::Remote(table)), epoch)
            }
        };
        Ok(lock(&self.homes).entry(node).or_insert(home).clone())
    }

    /// Drops the handle to `node`'s table after its incarnation ended, so the
    /// next use connects to the node's next incarnation.
    pub(super) fn forget_home(&self, node: NodeId, home: &Arc<HomeMemory>) {
        let mut homes = lock(&self.homes);
        if homes.get(&node).is_some_and(|(h, _)| Arc::ptr_eq(h, home)) {
            homes.remove(&node);
        }
    }

    /// Finds (or, with `create`, claims) the slot of `id` at its home: the
    /// first candidate, or with re-homing the home of the lock's current
    /// epoch (see [`Core::rehoming`]).
    /// The flag says the slot is fenced and must be moved before use (see
    /// [`Core::prepare_move`]).
    pub(super) fn locate(&self, id: LockId, create: bool) -> Result<(Slot, bool), LockError> {
        if id.0 == u64::MAX {
            return Err(LockError::InvalidLockId { lock: id });
        }
        if self.rehoming() {
            return self.locate_rehoming(id, create);
        }
        let home_node =
            home_of(id, &self.config.lock_servers).ok_or_else(|| LockError::Config("no lock servers".into()))?;
        Ok((self.slot_at(id, home_node, 0, create)?, false))
    }

    /// The slot of `id` at `home_node` (claimed with `create`), as the home of `home_epoch`.
    pub(super) fn slot_at(
        &self,
        id: LockId,
        home_node: NodeId,
        home_epoch: u32,
        create: bool,
    ) -> Result<Slot, LockError> {
        let (home, epoch) = self.home(id, home_node)?;
        let fabric_err = |e: FabricError| {
            if matches!(e, FabricError::PeerDead { .. }) {
                self.forget_home(home_node, &home);
            }
            LockError::from_fabric(id, home_node, e)
        };
        let base = if create {
            home.claim(id, fence_seed(unix_ms()))
                .map_err(fabric_err)?
                .ok_or(LockError::TableFull { home: home_node, slots: home.slots() })?
        } else {
            home.lookup(id).map_err(fabric_err)?.ok_or(LockError::UnknownLock { lock: id, home: home_node })?
        };
        Ok(Slot { home_node, home, base, epoch, home_epoch, wire_epoch: wire_epoch(epoch, home_epoch) })
    }

    /// Sends a message on [`Channel::LOCKS`]; to ourselves it goes through our
    /// own inbox of that channel, like any other.
    pub(super) fn send(&self, lock_id: LockId, to: NodeId, message: &DlmMessage) -> Result<(), LockError> {
        let payload = message.encode();
        // Counted first: a receiver may handle the message before this thread
        // runs again, and handled must never overtake sent.
        self.messages_sent.fetch_add(1, Ordering::AcqRel);
        let sent = if to == self.me {
            self.fabric.inbox(Channel::LOCKS).deliver(self.me, payload.to_vec())
        } else {
            self.fabric.send(to, Channel::LOCKS, &payload)
        };
        if sent.is_err() {
            self.messages_sent.fetch_sub(1, Ordering::AcqRel);
        }
        sent.map_err(|e| LockError::from_fabric(lock_id, to, e))
    }
    /// Counts a handled message (and its failure).
    pub(super) fn counted(&self, result: Result<(), LockError>) -> Result<(), LockError> {
        if let Err(e) = &result {
            self.message_errors.fetch_add(1, Ordering::Relaxed);
            if matches!(e, LockError::Protocol(_)) {
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.messages_handled.fetch_add(1, Ordering::Release);
        result
    }

    pub(super) fn stats(&self) -> DlmStats {
        DlmStats {
            messages_handled: self.messages_handled.load(Ordering::Acquire),
            message_errors: self.message_errors.load(Ordering::Relaxed),
            violations: self.violations.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Acquire),
            moves: self.moves.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            rehomes: self.rehomes.load(Ordering::Relaxed),
            peers_lost: self.peers_lost.load(Ordering::Relaxed),
        }
    }

    /// An index into this node's status entries for a new cell, while any are left.
    pub(super) fn claim_entry(&self) -> Option<u64> {
        let index = self.next_entry.fetch_add(1, Ordering::Relaxed);
        (index < STATUS_ENTRIES).then_some(index)
    }
}
