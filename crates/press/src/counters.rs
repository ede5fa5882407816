//! Per-type message and byte counters: Table 2 ("Num msgs per 1K reqs",
//! "Num Kbytes per 1K reqs", "Avg msg size").
//!
//! A node counts what it *sends*, once per message, by [`MsgType`]; the
//! bytes are the message's encoded size plus, for the remote-write versions,
//! the file data written into the receiver's ring (the data a `File`
//! transfer moves, whichever way it travels). Summed over the nodes, that is
//! the cluster's intra-cluster traffic.

use crate::proto::MsgType;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by a node's threads.
#[derive(Debug, Default)]
pub struct Counters {
    messages: [AtomicU64; 4],
    bytes: [AtomicU64; 4],
}

impl Counters {
    pub fn record(&self, kind: MsgType, bytes: u64) {
        self.messages[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.bytes[kind as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Counts {
        let mut c = Counts::default();
        for t in MsgType::ALL {
            c.messages[t as usize] = self.messages[t as usize].load(Ordering::Relaxed);
            c.bytes[t as usize] = self.bytes[t as usize].load(Ordering::Relaxed);
        }
        c
    }
}

/// A snapshot of [`Counters`] (or a sum of several nodes' snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub messages: [u64; 4],
    pub bytes: [u64; 4],
}

impl Counts {
    pub fn messages(&self, kind: MsgType) -> u64 {
        self.messages[kind as usize]
    }

    pub fn bytes(&self, kind: MsgType) -> u64 {
        self.bytes[kind as usize]
    }

    /// Element-wise sum (the cluster's total from per-node counts).
    pub fn plus(&self, other: &Counts) -> Counts {
        let mut c = *self;
        for i in 0..4 {
            c.messages[i] += other.messages[i];
            c.bytes[i] += other.bytes[i];
        }
        c
    }

    /// Element-wise difference `self - before` (saturating), for a
    /// measurement window.
    pub fn since(&self, before: &Counts) -> Counts {
        let mut c = *self;
        for i in 0..4 {
            c.messages[i] = c.messages[i].saturating_sub(before.messages[i]);
            c.bytes[i] = c.bytes[i].saturating_sub(before.bytes[i]);
        }
        c
    }

    /// Table 2's rows for `requests` client requests: per type, messages and
    /// KiB per 1,000 requests and the average message size in bytes (`None`
    /// where no message was sent, the paper's "N/A").
    pub fn table2(&self, requests: u64) -> Vec<Table2Row> {
        let per_k = |v: u64| if requests == 0 { 0.0 } else { v as f64 * 1000.0 / requests as f64 };
        MsgType::ALL
            .iter()
            .map(|&t| {
                let (m, b) = (self.messages(t), self.bytes(t));
                Table2Row {
                    kind: t,
                    messages_per_k: per_k(m),
                    kbytes_per_k: per_k(b) / 1024.0,
                    avg_bytes: (m > 0).then(|| b as f64 / m as f64),
                }
            })
            .collect()
    }
}

/// One row of Table 2.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Table2Row {
    pub kind: MsgType,
    pub messages_per_k: f64,
    pub kbytes_per_k: f64,
    pub avg_bytes: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table2_arithmetic() {
        let c = Counters::default();
        for _ in 0..3 {
            c.record(MsgType::Forward, 50);
        }
        c.record(MsgType::File, 2048);
        let s = c.snapshot();
        let rows = s.table2(6);
        assert_eq!(rows[MsgType::Forward as usize].messages_per_k, 500.0);
        assert_eq!(rows[MsgType::Forward as usize].avg_bytes, Some(50.0));
        assert!((rows[MsgType::File as usize].kbytes_per_k - 2000.0 / 6.0).abs() < 1e-9);
        assert_eq!(rows[MsgType::Caching as usize].avg_bytes, None);
        assert_eq!(s.plus(&s).since(&s), s);
        assert_eq!(s.table2(0)[1].messages_per_k, 0.0);
    }
}
