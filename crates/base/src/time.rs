use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A monotonic clock in nanoseconds since an arbitrary origin.
///
/// The runtime uses [`SystemClock`]; tests and the simulator use
/// [`ManualClock`], which only moves when told to.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// The real monotonic clock. All instances share one origin (process start),
/// so readings from different instances in one process are comparable.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

fn process_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(process_origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when [`ManualClock::advance_ns`] or
/// [`ManualClock::set_ns`] is called: deterministic time for tests and simulation.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> Self {
        Self { now_ns: AtomicU64::new(start_ns) }
    }

    pub fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }

    /// Moves the clock to `now_ns`; a value in the past is ignored, so the
    /// clock stays monotonic.
    pub fn set_ns(&self, now_ns: u64) {
        self.now_ns.fetch_max(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let clock = ManualClock::new(10);
        clock.advance_ns(5);
        assert_eq!(clock.now_ns(), 15);
        clock.set_ns(3);
        assert_eq!(clock.now_ns(), 15, "set_ns into the past must be ignored");
        clock.set_ns(100);
        assert_eq!(clock.now_ns(), 100);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock;
        let a = clock.now_ns();
        let b = clock.now_ns();
        assert!(b >= a);
    }
}
