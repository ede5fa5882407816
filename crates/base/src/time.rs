//! Time: the [`Clock`] seam that simulated code takes, and the one door to the
//! OS clocks for real I/O ([`instant_now`], [`system_now`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

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
    *ORIGIN.get_or_init(instant_now)
}

/// The real monotonic clock as an [`Instant`], for real I/O only: socket, ring
/// and UCX deadlines, a thread's sleep until its next period, and wall-time
/// measurements of real runs. Code that a policy or the simulator drives takes
/// a [`Clock`] (or the time as an argument) instead.
///
/// With [`system_now`] this is the one door to the OS clocks: clippy's
/// `disallowed_methods` (`clippy.toml`) rejects `Instant::now` and
/// `SystemTime::now` everywhere else, so every reading of real time is
/// visible as a call to this seam.
#[allow(clippy::disallowed_methods)] // The seam itself.
#[inline]
pub fn instant_now() -> Instant {
    Instant::now()
}

/// The real wall clock, for what must carry calendar time or differ between
/// runs: HTTP `Date` headers and a node's incarnation stamp. See [`instant_now`].
#[allow(clippy::disallowed_methods)] // The seam itself.
#[inline]
pub fn system_now() -> SystemTime {
    SystemTime::now()
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(process_origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`): one clock for every
/// process on the host, so events of different processes can be ordered and
/// subtracted. Use it for intervals that start in one process and end in another.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        host_monotonic_ns()
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC` (see [`HostClock`]).
pub fn host_monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return 0;
    }
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    u64::try_from(now.tv_sec).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(nanos)
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
    fn host_clock_agrees_with_std_instant() {
        // Instant is CLOCK_MONOTONIC on Linux: an interval read with the host
        // clock inside one read with Instant is no longer than it.
        let std = instant_now();
        let host = HostClock.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let host_elapsed = HostClock.now_ns() - host;
        let std_elapsed = u64::try_from(std.elapsed().as_nanos()).unwrap();
        assert!(host_elapsed >= 2_000_000, "{host_elapsed}");
        assert!(host_elapsed <= std_elapsed, "{host_elapsed} > {std_elapsed}");
    }

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
