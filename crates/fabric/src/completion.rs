use crate::{FabricError, OpResult, Result};

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
    Pending(flume::Receiver<BatchResult>),
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
        (Completion(Inner::Pending(rx)), CompletionSender(tx))
    }

    /// Blocks the calling thread until the batch completes. Do not call from
    /// an async task; use [`Completion::wait_async`] there.
    pub fn wait(self) -> BatchResult {
        match self.0 {
            Inner::Ready(result) => result,
            Inner::Pending(rx) => rx.recv().unwrap_or(Err(FabricError::Closed)),
        }
    }

    /// Waits without blocking the async runtime's thread.
    pub async fn wait_async(self) -> BatchResult {
        match self.0 {
            Inner::Ready(result) => result,
            Inner::Pending(rx) => rx.recv_async().await.unwrap_or(Err(FabricError::Closed)),
        }
    }
}
