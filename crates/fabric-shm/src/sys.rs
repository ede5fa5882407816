//! The operating-system calls of the message transport: futex waits and
//! wakes on words of shared mappings, and watching a process for its end.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The address of the low 32 bits of `word`, the part a futex compares.
fn futex_address(word: &AtomicU64) -> *const u32 {
    let base = word.as_ptr().cast::<u32>().cast_const();
    if cfg!(target_endian = "big") {
        base.wrapping_add(1)
    } else {
        base
    }
}

/// Sleeps while the low 32 bits of `word` equal those of `expected`, until
/// a [`wake_all`] on the same word, or `timeout`; may return early (a
/// signal, a changed value). A shared (not process-private) futex, so it
/// works across processes that map the same file.
pub(crate) fn futex_wait(word: &AtomicU64, expected: u64, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits a c_long of any width.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the address is a valid, aligned u32 inside `word`, which
    // outlives the call; FUTEX_WAIT only reads it. The result (woken,
    // EAGAIN, ETIMEDOUT, EINTR) needs no handling: callers recheck.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_address(word),
            libc::FUTEX_WAIT,
            expected as u32,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread, of any process, sleeping on `word` in [`futex_wait`].
pub(crate) fn wake_all(word: &AtomicU64) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not access the memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_address(word),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// A monotonic clock read at the cost of a memory load (the kernel's
/// coarse clock: it advances once per scheduler tick, a few ms), for checks
/// on hot paths that only need to happen every few milliseconds.
pub(crate) fn coarse_now() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    Duration::new(u64::try_from(now.tv_sec).unwrap_or(0), u32::try_from(now.tv_nsec).unwrap_or(0))
}

/// True if `pid` names a live (possibly stopped) process.
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let exists =
        unsafe { libc::kill(pid_t, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // A zombie has exited; its pid still answers kill(0).
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

/// Watches one process for its end. With a pidfd (Linux 5.3+) the check is
/// one `poll` and immune to the pid's reuse; without, it falls back to
/// [`process_alive`].
#[derive(Debug)]
pub(crate) struct ProcessWatch {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl ProcessWatch {
    pub(crate) fn new(pid: u32) -> ProcessWatch {
        let pidfd = libc::pid_t::try_from(pid).ok().and_then(|pid_t| {
            // SAFETY: pidfd_open takes a pid and flags and returns a new
            // descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0u32) };
            let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
            // SAFETY: `fd` is a descriptor we just opened and own.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        });
        ProcessWatch { pid, pidfd }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// True while the process runs (a stopped process runs).
    pub(crate) fn alive(&self) -> bool {
        let Some(fd) = &self.pidfd else { return process_alive(self.pid) };
        let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        match unsafe { libc::poll(&mut poll, 1, 0) } {
            0 => true,
            1.. => false, // a pidfd becomes readable when its process ends
            _ => process_alive(self.pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn a_futex_wait_returns_on_a_changed_value_and_on_a_wake() {
        let word = Arc::new(AtomicU64::new(5));
        // A different value: returns at once (a one-hour timeout would hang the test).
        futex_wait(&word, 4, Duration::from_secs(3600));
        let sleeper = {
            let word = word.clone();
            std::thread::spawn(move || {
                while word.load(Ordering::Acquire) == 5 {
                    futex_wait(&word, 5, Duration::from_secs(3600));
                }
            })
        };
        word.store(6, Ordering::Release);
        wake_all(&word);
        sleeper.join().unwrap();
    }

    #[test]
    fn this_process_is_alive_and_an_ended_child_is_not() {
        assert!(ProcessWatch::new(std::process::id()).alive());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let watch = ProcessWatch::new(child.id());
        child.wait().unwrap();
        assert!(!watch.alive());
        assert!(!process_alive(u32::MAX));
    }
}
