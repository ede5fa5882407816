//! The one poison-tolerant lock helper.
//!
//! A `Mutex` is poisoned when a thread panics while holding it. Throughout
//! tierstack a panic inside a critical section is a bug that is already
//! reported where it happened (the panicking thread's message, a failed
//! test), and the data behind every lock is kept consistent between
//! statements that can panic: caches, counters, protocol cells whose state
//! is the last consistent one. Cascading the panic into every other thread
//! that touches the lock would turn one bug into an outage and hide the
//! first message among many, so callers take the data as it stands.
//! Code whose data a panic *can* leave inconsistent must not use this and
//! should map the poison into its own error instead.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data as it stands if a panicking thread
/// poisoned it (see the module docs for why that is sound here).
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_mutex_still_yields_its_data() {
        let shared = Arc::new(Mutex::new(1));
        let inner = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut guard = inner.lock().unwrap();
            *guard = 2;
            panic!("poison the mutex");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*lock(&shared), 2, "the value written before the panic");
        *lock(&shared) = 3;
        assert_eq!(*lock(&shared), 3);
    }
}
