use crate::{FabricError, OpResult, Result};
use std::time::Duration;
use tierstack_base::time::instant_now;

type BatchResult = Result<Vec<OpResult>>;

/// The pending outcome of a posted batch.
///
/// A backend either completes at once ([`Completion::ready`], as `shm` does)
/// or hands out a [`CompletionSender`] that it promises to complete, with
/// results or an error such as a timeout. Dropping the sender without
/// completing is reported as [`FabricError::Closed`], never a hang.
#[must_use = "a posted batch does nothing observable until its completion is waited on"]
pub struct Completion(Inner);

enum Inner {
    Ready(BatchResult),
    /// The receiver and how long [`Completion::wait`] polls it before it
    /// parks the thread.
    Pending(flume::Receiver<BatchResult>, Duration),
}

/// The backend's side of a pending [`Completion`].
pub struct CompletionSender(flume::Sender<BatchResult>);

impl CompletionSender {
    /// Completes the batch. Completing one whose waiter went away is harmless.
    pub fn complete(self, result: BatchResult) {
        let _ = self.0.send(result);
    }
}

impl Completion {
    pub fn ready(result: BatchResult) -> Self {
        Completion(Inner::Ready(result))
    }

    /// A completion that `sender` will complete later.
    pub fn pending() -> (Self, CompletionSender) {
        let (tx, rx) = flume::bounded(1);
        (Completion(Inner::Pending(rx, Duration::ZERO)), CompletionSender(tx))
    }

    /// Like [`Completion::pending`], but [`Completion::wait`] first polls
    /// for the result for up to `spin` (bounded) before it parks the thread:
    /// for backends whose completions usually arrive within microseconds,
    /// where a park and wake-up would cost more than the operation.
    pub fn pending_spinning(spin: Duration) -> (Self, CompletionSender) {
        let (tx, rx) = flume::bounded(1);
        (Completion(Inner::Pending(rx, spin)), CompletionSender(tx))
    }

    /// Blocks the calling thread until the batch completes. Do not call from
    /// an async task; use [`Completion::wait_async`] there.
    pub fn wait(self) -> BatchResult {
        match self.0 {
            Inner::Ready(result) => result,
            Inner::Pending(rx, spin) => {
                if !spin.is_zero() {
                    let start = instant_now();
                    loop {
                        match rx.try_recv() {
                            Ok(result) => return result,
                            Err(flume::TryRecvError::Disconnected) => return Err(FabricError::Closed),
                            Err(flume::TryRecvError::Empty) => {}
                        }
                        if start.elapsed() >= spin {
                            break;
                        }
                        // Yield: the completing thread may share this CPU.
                        std::thread::yield_now();
                    }
                }
                rx.recv().unwrap_or(Err(FabricError::Closed))
            }
        }
    }

    /// Waits without blocking the async runtime's thread.
    pub async fn wait_async(self) -> BatchResult {
        match self.0 {
            Inner::Ready(result) => result,
            Inner::Pending(rx, _) => rx.recv_async().await.unwrap_or(Err(FabricError::Closed)),
        }
    }
}
