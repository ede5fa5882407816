//! Helpers every backend uses for its service threads.

use std::sync::Mutex;
use std::thread::JoinHandle;

/// Locks a mutex, ignoring poisoning: a backend's critical sections leave
/// their data consistent, and a panic elsewhere must not take the fabric down.
/// The one helper of the tree, re-exported for the backends.
pub use tierstack_base::sync::lock;

/// Spawns a thread named `name` and keeps its handle in `threads` (for
/// [`join_all`]), forgetting the handles of threads that have finished, so a
/// long-lived node's list stays as short as what still runs.
pub fn spawn_tracked(
    threads: &Mutex<Vec<JoinHandle<()>>>,
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let handle = std::thread::Builder::new().name(name).spawn(f)?;
    let mut threads = lock(threads);
    threads.retain(|h| !h.is_finished());
    threads.push(handle);
    Ok(())
}

/// Joins every thread in `threads`, taking the list again until it stays
/// empty (a thread may start another while we join) and never holding its
/// lock while joining. The current thread is never joined: a fabric may be
/// dropped by one of its own threads.
pub fn join_all(threads: &Mutex<Vec<JoinHandle<()>>>) {
    let me = std::thread::current().id();
    loop {
        let handles = std::mem::take(&mut *lock(threads));
        if handles.is_empty() {
            return;
        }
        for handle in handles {
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn joins_threads_started_while_joining() {
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (inner_threads, inner_finished) = (Arc::clone(&threads), Arc::clone(&finished));
        let outer = std::thread::spawn(move || {
            let last = Arc::clone(&inner_finished);
            let child = std::thread::spawn(move || {
                last.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
            lock(&inner_threads).push(child);
            inner_finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        lock(&threads).push(outer);
        join_all(&threads);
        assert_eq!(finished.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(lock(&threads).is_empty());
    }
}
