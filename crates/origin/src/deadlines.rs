//! Waiting for a modelled completion time, to well under a millisecond.
//!
//! tokio's timer counts whole milliseconds: a sleep ends at the first tick at
//! or after its deadline, and the runtime notices it up to a tick later. A
//! response waiting for a 5.16 ms emulated disk read left about 1.2 ms late
//! (p50, `docs/sim.md`), an error of a fifth of the disk it emulates. So one
//! thread per origin keeps the pending deadlines in a heap and sleeps on a
//! channel with a timeout (a futex wait: the kernel's high-resolution timers),
//! waking each waiter at its time. No runtime thread waits.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Instant;
use tierstack_base::time::instant_now;
use tokio::sync::oneshot;

/// One waiter: woken at `at`; `seq` keeps equal deadlines in arrival order.
struct Waiter {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Waiter {}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiter {
    /// Reversed, so the `BinaryHeap` (a max-heap) pops the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The handle to the deadline thread; the thread ends when this is dropped.
pub(crate) struct Deadlines {
    /// `None` when the thread could not be started: tokio's timer stands in.
    requests: Option<Sender<(Instant, oneshot::Sender<()>)>>,
}

impl Deadlines {
    pub(crate) fn start() -> Deadlines {
        let (requests, incoming) = mpsc::channel();
        match std::thread::Builder::new().name("origin-deadlines".into()).spawn(move || serve(incoming)) {
            Ok(_) => Deadlines { requests: Some(requests) },
            Err(e) => {
                tracing::warn!(error = %e, "no deadline thread; responses wait on tokio's 1 ms timer");
                Deadlines { requests: None }
            }
        }
    }

    /// Resolves at `deadline` (at once if it has passed), never before it.
    pub(crate) async fn wait_until(&self, deadline: Instant) {
        if deadline <= instant_now() {
            return;
        }
        if let Some(requests) = &self.requests {
            let (wake, woken) = oneshot::channel();
            if requests.send((deadline, wake)).is_ok() && woken.await.is_ok() {
                return;
            }
        }
        // The thread is gone (it never drops a waiter otherwise).
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// The deadline thread: wakes each waiter at its time, until the handle is
/// dropped.
fn serve(incoming: Receiver<(Instant, oneshot::Sender<()>)>) {
    let mut waiting = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let now = instant_now();
        while waiting.peek().is_some_and(|w: &Waiter| w.at <= now) {
            if let Some(waiter) = waiting.pop() {
                // The waiter may have gone (its connection closed): nothing to do.
                let _ = waiter.wake.send(());
            }
        }
        let next = match waiting.peek() {
            Some(earliest) => incoming.recv_timeout(earliest.at.saturating_duration_since(now)),
            None => incoming.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok((at, wake)) => {
                waiting.push(Waiter { at, seq, wake });
                seq += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn the_heap_pops_the_earliest_deadline_first_and_ties_in_arrival_order() {
        let start = instant_now();
        let mut heap = BinaryHeap::new();
        for (seq, ms) in [(0u64, 30u64), (1, 5), (2, 20), (3, 5), (4, 0)] {
            heap.push(Waiter { at: start + Duration::from_millis(ms), seq, wake: oneshot::channel().0 });
        }
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop()).map(|w| w.seq).collect();
        assert_eq!(order, [4, 1, 3, 2, 0]);
    }

    /// Every waiter resolves, none before its deadline, through the thread
    /// and through the fallback alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_never_wake_early() {
        for deadlines in [Deadlines::start(), Deadlines { requests: None }] {
            let threaded = deadlines.requests.is_some();
            let deadlines = Arc::new(deadlines);
            let start = instant_now();
            // Some far apart, some close together.
            let tasks: Vec<_> = [30u64, 5, 20, 5, 0, 12, 1, 2, 13, 6]
                .into_iter()
                .map(|ms| {
                    let deadlines = Arc::clone(&deadlines);
                    tokio::spawn(async move {
                        let at = start + Duration::from_millis(ms);
                        deadlines.wait_until(at).await;
                        assert!(instant_now() >= at, "woke before its deadline (+{ms} ms, thread: {threaded})");
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        }
    }
}
