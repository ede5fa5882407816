//! The monitored node's side: its load region, kept by the code that
//! changes the load.
//!
//! Region `monitor.load` ([`REGION_NAME`], [`REGION_BYTES`] bytes):
//!
//! ```text
//! offset  0  magic            MAGIC: tells a monitor region from anything else
//! offset  8  counters word    Counters packed 4 x 16 bits  } RDMA-Sync reads these
//! offset 16  progress word    the heartbeat (0: none kept) } two words in one read
//! offset 24  saturated        increments refused because a counter was at COUNTER_MAX
//! offset 32  started_ns       when this publisher started (CLOCK_MONOTONIC)
//! offset 40  sampled record   a SeqRecord of a LoadRecord (RDMA-Async reads this)
//! ```
//!
//! The counters word changes only through [`GaugeGuard`]s: a guard adds one
//! to its counter when made and takes it away when dropped, so a counter
//! never goes below zero and always equals the number of live guards (up to
//! [`COUNTER_MAX`]: an increment that would carry into the next counter is
//! refused, counted in `saturated`, and its guard takes nothing away). This
//! is the analog of the kernel updating its counters as a side effect of
//! scheduling (seed-notes b.3): no thread of the node ever runs for a reader.
//!
//! The progress word is the node's liveness: [`LoadPublisher::beat`], called
//! by a task of the serving runtime every [`HEARTBEAT`], adds one. A node
//! whose process is stopped (SIGSTOP, a debugger, a VM pause) or whose
//! runtime is wedged keeps counters that look idle forever; its progress
//! word standing still is what tells a reader (the counters cannot: an idle
//! node's are still too). A node that never beats leaves it 0, which
//! readers take as "no heartbeat kept", never as hung.

use crate::record::{Counters, Gauge, KernelSample, LoadRecord, COUNTER_MAX, RECORD_WORDS};
use crate::MonitorError;
use std::sync::{Arc, Mutex};
use tierstack_base::host_monotonic_ns;
use tierstack_fabric::memory::RegionMemory;
use tierstack_fabric::seqlock::SeqRecord;
use tierstack_fabric::{Fabric, LocalRegion};

/// Name of the load region on every monitored node.
pub const REGION_NAME: &str = "monitor.load";
/// `"tsmonld2"`: the first word of every load region (2: with the
/// progress word).
pub const MAGIC: u64 = u64::from_le_bytes(*b"tsmonld2");
pub const MAGIC_OFFSET: u64 = 0;
pub const COUNTERS_OFFSET: u64 = 8;
pub const PROGRESS_OFFSET: u64 = 16;
pub const SATURATED_OFFSET: u64 = 24;
pub const STARTED_OFFSET: u64 = 32;
pub const RECORD_OFFSET: u64 = 40;
/// How often a serving runtime advances its progress word
/// ([`LoadPublisher::beat`]): a reader calls a node hung when the word
/// stands still for many of these.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(10);
/// Bytes of the load region.
pub const REGION_BYTES: u64 = RECORD_OFFSET + 8 + RECORD_WORDS as u64 * 8;

/// The sampled record's place in the region.
pub fn sampled_record() -> SeqRecord {
    // In bounds and aligned by construction (checked by a test).
    SeqRecord::new(RECORD_OFFSET, (RECORD_WORDS * 8) as u32).unwrap_or_else(|_| unreachable!("aligned offset"))
}

/// A node's published load.
pub struct LoadPublisher {
    region: Arc<LocalRegion>,
    record: SeqRecord,
    /// The seqlock record has one writer at a time.
    record_writer: Mutex<()>,
}

impl std::fmt::Debug for LoadPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadPublisher").field("counters", &self.counters()).finish()
    }
}

impl LoadPublisher {
    /// Registers `monitor.load` on `fabric`, so that other nodes read it.
    pub fn register(fabric: &dyn Fabric) -> Result<Arc<Self>, MonitorError> {
        let region = fabric.register(REGION_NAME, REGION_BYTES, tierstack_fabric::Access::read_only())?;
        Self::init(region)
    }

    /// A publisher in private memory, readable only through the socket
    /// schemes (a node without a fabric endpoint).
    pub fn unregistered() -> Result<Arc<Self>, MonitorError> {
        let memory = RegionMemory::heap(REGION_NAME, REGION_BYTES)?;
        Self::init(Arc::new(LocalRegion::new(REGION_NAME, memory)))
    }

    fn init(region: Arc<LocalRegion>) -> Result<Arc<Self>, MonitorError> {
        let memory = region.memory();
        memory.store_u64(STARTED_OFFSET, host_monotonic_ns())?;
        memory.store_u64(MAGIC_OFFSET, MAGIC)?;
        Ok(Arc::new(LoadPublisher { region, record: sampled_record(), record_writer: Mutex::new(()) }))
    }

    fn memory(&self) -> &RegionMemory {
        self.region.memory()
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        Counters::from_word(self.memory().load_u64(COUNTERS_OFFSET).unwrap_or(0))
    }

    /// The progress word now.
    pub fn progress(&self) -> u64 {
        self.memory().load_u64(PROGRESS_OFFSET).unwrap_or(0)
    }

    /// Advances the progress word: the node is scheduled and serving. Call
    /// it from the serving runtime (a task every [`HEARTBEAT`]), not from a
    /// thread of its own, or a wedged runtime would still look alive.
    pub fn beat(&self) {
        let _ = self.memory().fetch_add(PROGRESS_OFFSET, 1);
    }

    /// Increments refused so far because a counter was full.
    pub fn saturated(&self) -> u64 {
        self.memory().load_u64(SATURATED_OFFSET).unwrap_or(0)
    }

    /// Counts one more of `gauge` until the guard is dropped.
    pub fn enter(self: &Arc<Self>, gauge: Gauge) -> GaugeGuard {
        let counted = self.try_increment(gauge);
        GaugeGuard { publisher: self.clone(), gauge, counted }
    }

    /// Adds one to `gauge` unless it is full; true if it did.
    fn try_increment(&self, gauge: Gauge) -> bool {
        let memory = self.memory();
        let unit = 1u64 << gauge.shift();
        let mut current = memory.load_u64(COUNTERS_OFFSET).unwrap_or(0);
        loop {
            if Counters::from_word(current).get(gauge) == COUNTER_MAX {
                let _ = memory.fetch_add(SATURATED_OFFSET, 1);
                return false;
            }
            match memory.compare_swap(COUNTERS_OFFSET, current, current + unit) {
                Ok(previous) if previous == current => return true,
                Ok(previous) => current = previous,
                Err(_) => return false,
            }
        }
    }

    /// Takes one away from `gauge`; only a guard that added one calls it,
    /// so the counter is at least 1 and the subtraction borrows nothing.
    fn decrement(&self, gauge: Gauge) {
        let unit = 1u64 << gauge.shift();
        let _ = self.memory().fetch_add(COUNTERS_OFFSET, unit.wrapping_neg());
    }

    /// Writes the sampled record (the async schemes' sampler): the counters
    /// now, the kernel's fields, and `t_ns`. Returns what it wrote.
    pub fn write_record(&self, kernel: KernelSample, t_ns: u64) -> Result<LoadRecord, MonitorError> {
        let record = LoadRecord { t_ns, counters: self.counters(), progress: self.progress(), kernel };
        let bytes: Vec<u8> = record.to_words().iter().flat_map(|w| w.to_ne_bytes()).collect();
        let _one_writer = self.record_writer.lock().map_err(|_| MonitorError::Poisoned)?;
        self.record.write_local(self.memory(), &bytes)?;
        Ok(record)
    }

    /// The record as the sampler last wrote it (the owner's own read).
    pub fn last_record(&self) -> Result<LoadRecord, MonitorError> {
        let words = self.memory().words(RECORD_OFFSET, 1 + RECORD_WORDS)?;
        let mut payload = [0u64; RECORD_WORDS];
        for _ in 0..tierstack_fabric::seqlock::READ_ATTEMPTS_MAX {
            if tierstack_fabric::seqlock::read_words(words, &mut payload).is_some() {
                return Ok(LoadRecord::from_words(&payload));
            }
            std::thread::yield_now();
        }
        Err(MonitorError::Fabric(tierstack_fabric::FabricError::TornRead {
            offset: RECORD_OFFSET,
            retries: tierstack_fabric::seqlock::READ_ATTEMPTS_MAX,
        }))
    }
}

/// One unit of a counter, held while the thing it counts lasts (a busy
/// thread, an open connection, a request in flight, a queued request).
#[must_use = "the counter goes back down when the guard is dropped"]
pub struct GaugeGuard {
    publisher: Arc<LoadPublisher>,
    gauge: Gauge,
    counted: bool,
}

impl GaugeGuard {
    /// False if the counter was full and this guard was not counted.
    pub fn counted(&self) -> bool {
        self.counted
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        if self.counted {
            self.publisher.decrement(self.gauge);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_and_is_aligned() {
        let record = sampled_record();
        assert_eq!(record.offset() + record.footprint_bytes(), REGION_BYTES);
        assert!(RECORD_OFFSET.is_multiple_of(8));
    }

    #[test]
    fn guards_count_while_they_live() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let a = publisher.enter(Gauge::RunningThreads);
        let b = publisher.enter(Gauge::RunningThreads);
        let c = publisher.enter(Gauge::QueueLength);
        assert_eq!(publisher.counters(), Counters { running_threads: 2, queue_len: 1, ..Counters::default() });
        drop(a);
        drop(c);
        assert_eq!(publisher.counters(), Counters { running_threads: 1, ..Counters::default() });
        drop(b);
        assert_eq!(publisher.counters(), Counters::default());
    }

    #[test]
    fn a_full_counter_refuses_and_never_carries_into_its_neighbour() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let full = Counters { open_connections: COUNTER_MAX, ..Counters::default() }.to_word();
        publisher.memory().store_u64(COUNTERS_OFFSET, full).unwrap();
        let refused = publisher.enter(Gauge::OpenConnections);
        assert!(!refused.counted());
        assert_eq!(publisher.saturated(), 1);
        assert_eq!(publisher.counters().in_flight_requests, 0, "no carry");
        drop(refused);
        assert_eq!(publisher.counters().open_connections, COUNTER_MAX, "a refused guard takes nothing away");
    }

    #[test]
    fn the_progress_word_starts_at_zero_and_each_beat_adds_one() {
        let publisher = LoadPublisher::unregistered().unwrap();
        assert_eq!(publisher.progress(), 0, "no heartbeat until the first beat");
        publisher.beat();
        publisher.beat();
        assert_eq!(publisher.progress(), 2);
        assert_eq!(publisher.write_record(KernelSample::default(), 1).unwrap().progress, 2);
        assert_eq!(publisher.counters(), Counters::default(), "beats touch no counter");
    }

    #[test]
    fn the_sampled_record_holds_the_counters_and_the_kernel_fields() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let _busy = publisher.enter(Gauge::InFlightRequests);
        let kernel = KernelSample { procs_running: Some(3), ..KernelSample::default() };
        let written = publisher.write_record(kernel, 42).unwrap();
        assert_eq!(written.counters.in_flight_requests, 1);
        assert_eq!(publisher.last_record().unwrap(), written);
        assert_eq!(publisher.last_record().unwrap().t_ns, 42);
    }

    #[test]
    fn concurrent_guards_leave_exact_counters() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let publisher = publisher.clone();
                std::thread::spawn(move || {
                    let gauge = Gauge::ALL[i % 4];
                    let mut held = Vec::new();
                    for round in 0..20_000 {
                        held.push(publisher.enter(gauge));
                        if round % 3 != 0 {
                            held.pop();
                        }
                    }
                    held
                })
            })
            .collect();
        let held: Vec<Vec<GaugeGuard>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (i, guards) in held.iter().enumerate() {
            assert_eq!(u64::from(publisher.counters().get(Gauge::ALL[i % 4])), guards.len() as u64);
        }
        drop(held);
        assert_eq!(publisher.counters(), Counters::default());
    }
}
