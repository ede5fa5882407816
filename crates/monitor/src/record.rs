//! A node's load: what is read, and how it is laid out in words.
//!
//! The four counters that the serving code keeps itself (running threads,
//! open connections, requests in flight, queue length) live in **one packed
//! word** of 4 × 16 bits ([`Counters`]), so that each change is one atomic
//! update and one 8-byte read (untorn on every backend) gives a mutually
//! consistent snapshot of all four: RDMA-Sync needs no seqlock. The fields
//! only the kernel knows ([`KernelSample`]) come from a sampler and travel in
//! the async schemes' seqlock record ([`LoadRecord`]).

use serde::Serialize;

/// Largest value of one packed counter.
pub const COUNTER_MAX: u16 = u16::MAX;

/// Which of the packed counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gauge {
    /// Threads doing work: busy request workers and compute threads.
    RunningThreads,
    /// Accepted client connections not yet closed.
    OpenConnections,
    /// Requests between their start and their end.
    InFlightRequests,
    /// Requests waiting for a worker.
    QueueLength,
}

impl Gauge {
    pub const ALL: [Gauge; 4] =
        [Gauge::RunningThreads, Gauge::OpenConnections, Gauge::InFlightRequests, Gauge::QueueLength];

    /// Bit position of this counter in the packed word.
    pub const fn shift(self) -> u32 {
        match self {
            Gauge::RunningThreads => 0,
            Gauge::OpenConnections => 16,
            Gauge::InFlightRequests => 32,
            Gauge::QueueLength => 48,
        }
    }
}

/// The four server-kept counters, as read together from one word.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub running_threads: u16,
    pub open_connections: u16,
    pub in_flight_requests: u16,
    pub queue_len: u16,
}

impl Counters {
    /// Unpacks the counters word.
    pub const fn from_word(word: u64) -> Self {
        Counters {
            running_threads: word as u16,
            open_connections: (word >> 16) as u16,
            in_flight_requests: (word >> 32) as u16,
            queue_len: (word >> 48) as u16,
        }
    }

    /// Packs the counters into one word.
    pub const fn to_word(self) -> u64 {
        self.running_threads as u64
            | (self.open_connections as u64) << 16
            | (self.in_flight_requests as u64) << 32
            | (self.queue_len as u64) << 48
    }

    pub const fn get(self, gauge: Gauge) -> u16 {
        match gauge {
            Gauge::RunningThreads => self.running_threads,
            Gauge::OpenConnections => self.open_connections,
            Gauge::InFlightRequests => self.in_flight_requests,
            Gauge::QueueLength => self.queue_len,
        }
    }

    /// The load figure the balancer compares: running threads plus
    /// requests in flight (seed-notes b.5).
    pub const fn load(self) -> u32 {
        self.running_threads as u32 + self.in_flight_requests as u32
    }
}

/// What only the kernel knows, read by the async schemes' sampler from
/// `/proc`. Each field is `None` where this kernel does not expose it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelSample {
    /// Runnable tasks on the host (`procs_running` of `/proc/stat`).
    pub procs_running: Option<u32>,
    /// Share of CPU time busy since the previous sample, in ‰.
    pub cpu_busy_permille: Option<u32>,
    /// `MemAvailable` of `/proc/meminfo`, in KiB.
    pub mem_available_kib: Option<u64>,
    /// PSI `cpu some avg10` (`/proc/pressure/cpu`), in hundredths of a percent.
    pub psi_cpu_some_centi: Option<u32>,
}

/// A node's load at one instant: the counters, its progress word and,
/// from a sampler, the kernel's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LoadRecord {
    /// When it was sampled (`CLOCK_MONOTONIC`, ns: one clock for the host).
    pub t_ns: u64,
    pub counters: Counters,
    /// The node's heartbeat: advanced by its serving runtime while that
    /// runtime is scheduled (0: the node keeps no heartbeat). A reader that
    /// sees it stand still knows the node is hung, whatever its counters say.
    pub progress: u64,
    pub kernel: KernelSample,
}

/// Words of an encoded [`LoadRecord`].
pub const RECORD_WORDS: usize = 7;

/// A word that means "absent" in an encoded optional field.
const ABSENT: u64 = u64::MAX;

fn opt_to_word<T: Into<u64>>(value: Option<T>) -> u64 {
    value.map_or(ABSENT, Into::into)
}

fn word_to_u32(word: u64) -> Option<u32> {
    (word != ABSENT).then(|| u32::try_from(word).ok()).flatten()
}

impl LoadRecord {
    /// The record as words: `t_ns`, the counters word, the progress word,
    /// then the kernel fields (`u64::MAX` = absent).
    pub fn to_words(&self) -> [u64; RECORD_WORDS] {
        [
            self.t_ns,
            self.counters.to_word(),
            self.progress,
            opt_to_word(self.kernel.procs_running),
            opt_to_word(self.kernel.cpu_busy_permille),
            opt_to_word(self.kernel.mem_available_kib),
            opt_to_word(self.kernel.psi_cpu_some_centi),
        ]
    }

    /// Decodes [`LoadRecord::to_words`]; a 32-bit field holding more than
    /// 32 bits reads as absent.
    pub fn from_words(words: &[u64; RECORD_WORDS]) -> Self {
        LoadRecord {
            t_ns: words[0],
            counters: Counters::from_word(words[1]),
            progress: words[2],
            kernel: KernelSample {
                procs_running: word_to_u32(words[3]),
                cpu_busy_permille: word_to_u32(words[4]),
                mem_available_kib: (words[5] != ABSENT).then_some(words[5]),
                psi_cpu_some_centi: word_to_u32(words[6]),
            },
        }
    }

    /// Little-endian bytes of [`LoadRecord::to_words`] (socket frames).
    pub fn to_le_bytes(&self) -> [u8; RECORD_WORDS * 8] {
        let mut bytes = [0u8; RECORD_WORDS * 8];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(self.to_words()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    pub fn from_le_bytes(bytes: &[u8; RECORD_WORDS * 8]) -> Self {
        let mut words = [0u64; RECORD_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(chunk);
            *word = u64::from_le_bytes(eight);
        }
        Self::from_words(&words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counters() -> impl Strategy<Value = Counters> {
        (any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>()).prop_map(|(a, b, c, d)| Counters {
            running_threads: a,
            open_connections: b,
            in_flight_requests: c,
            queue_len: d,
        })
    }

    fn records() -> impl Strategy<Value = LoadRecord> {
        (
            any::<u64>(),
            counters(),
            any::<u64>(),
            proptest::option::of(any::<u32>()),
            proptest::option::of(0u32..=1000),
            proptest::option::of(0u64..u64::MAX),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(t_ns, counters, progress, procs, busy, mem, psi)| LoadRecord {
                t_ns,
                counters,
                progress,
                kernel: KernelSample {
                    procs_running: procs,
                    cpu_busy_permille: busy,
                    mem_available_kib: mem,
                    psi_cpu_some_centi: psi,
                },
            })
    }

    proptest! {
        #[test]
        fn the_counters_word_round_trips(c in counters()) {
            prop_assert_eq!(Counters::from_word(c.to_word()), c);
        }

        #[test]
        fn each_gauge_sits_at_its_shift(c in counters()) {
            for gauge in Gauge::ALL {
                prop_assert_eq!((c.to_word() >> gauge.shift()) as u16, c.get(gauge));
            }
        }

        #[test]
        fn records_round_trip_through_words_and_bytes(r in records()) {
            prop_assert_eq!(LoadRecord::from_words(&r.to_words()), r);
            prop_assert_eq!(LoadRecord::from_le_bytes(&r.to_le_bytes()), r);
        }
    }

    #[test]
    fn the_load_figure_is_running_plus_in_flight() {
        let c = Counters { running_threads: 3, open_connections: 100, in_flight_requests: 5, queue_len: 9 };
        assert_eq!(c.load(), 8);
        let full = Counters { running_threads: u16::MAX, in_flight_requests: u16::MAX, ..Counters::default() };
        assert_eq!(full.load(), 2 * u32::from(u16::MAX), "no overflow in the sum");
    }

    #[test]
    fn an_oversized_32_bit_field_reads_as_absent() {
        let mut words = LoadRecord::default().to_words();
        words[3] = u64::from(u32::MAX) + 1;
        assert_eq!(LoadRecord::from_words(&words).kernel.procs_running, None);
    }
}
