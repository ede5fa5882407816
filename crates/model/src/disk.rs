//! A disk that serves requests one at a time, in arrival order.

use serde::{Deserialize, Serialize};

/// A bad disk description.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("disk bandwidth must be positive (got {0} bytes/s)")]
    ZeroBandwidth(u64),
}

/// How long a disk takes: a fixed positioning time per request plus the
/// transfer at a fixed bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskModel {
    /// Seek plus rotational delay, per request, in nanoseconds.
    pub seek_ns: u64,
    /// Sustained transfer rate in bytes per second.
    pub bandwidth_bytes_per_s: u64,
}

impl DiskModel {
    pub fn new(seek_ns: u64, bandwidth_bytes_per_s: u64) -> Result<Self, ModelError> {
        if bandwidth_bytes_per_s == 0 {
            return Err(ModelError::ZeroBandwidth(bandwidth_bytes_per_s));
        }
        Ok(Self { seek_ns, bandwidth_bytes_per_s })
    }

    /// The time one request of `bytes` occupies the disk:
    /// `seek + bytes / bandwidth`, rounded up to whole nanoseconds.
    pub fn service_ns(&self, bytes: u64) -> u64 {
        let bandwidth = u128::from(self.bandwidth_bytes_per_s.max(1));
        let transfer = (u128::from(bytes) * 1_000_000_000).div_ceil(bandwidth);
        self.seek_ns.saturating_add(u64::try_from(transfer).unwrap_or(u64::MAX))
    }
}

/// A FIFO queue in front of one [`DiskModel`]: a request starts when it
/// arrives or when the previous one ends, whichever is later.
///
/// Times are nanoseconds on any monotonic clock the caller chooses (real or
/// simulated); requests must be submitted in non-decreasing arrival order.
#[derive(Clone, Debug)]
pub struct DiskQueue {
    model: DiskModel,
    busy_until_ns: u64,
    served: u64,
    busy_ns: u64,
}

impl DiskQueue {
    pub fn new(model: DiskModel) -> Self {
        Self { model, busy_until_ns: 0, served: 0, busy_ns: 0 }
    }

    /// Queues a request of `bytes` arriving at `now_ns`; returns when it
    /// completes.
    pub fn submit(&mut self, now_ns: u64, bytes: u64) -> u64 {
        let start = self.busy_until_ns.max(now_ns);
        let service = self.model.service_ns(bytes);
        self.busy_until_ns = start.saturating_add(service);
        self.served += 1;
        self.busy_ns = self.busy_ns.saturating_add(service);
        self.busy_until_ns
    }

    /// Requests submitted so far.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Total service time of the requests submitted so far.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    pub fn model(&self) -> DiskModel {
        self.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_time_is_seek_plus_transfer() {
        let disk = DiskModel::new(5_000_000, 10_000_000).unwrap();
        assert_eq!(disk.service_ns(0), 5_000_000);
        assert_eq!(disk.service_ns(10_000_000), 1_005_000_000);
        assert_eq!(disk.service_ns(1), 5_000_100, "a partial nanosecond rounds up");
        assert_eq!(DiskModel::new(1, 0), Err(ModelError::ZeroBandwidth(0)));
    }

    #[test]
    fn concurrent_requests_queue_and_their_service_times_add_up() {
        let disk = DiskModel::new(1_000, 1_000_000_000).unwrap();
        let mut queue = DiskQueue::new(disk);
        // Three requests arrive together: they end one service time apart.
        let ends: Vec<u64> = (0..3).map(|_| queue.submit(100, 1_000)).collect();
        assert_eq!(ends, [2_100, 4_100, 6_100]);
        // A request after an idle gap starts at its arrival.
        assert_eq!(queue.submit(10_000, 0), 11_000);
        assert_eq!((queue.served(), queue.busy_ns()), (4, 7_000));
    }
}
