//! Documents in a store (`tierstack app-server --documents-in-store`).
//!
//! In the default mode a body is a function of the version the module
//! granted, so a module that let a read overlap an update would still yield
//! a consistent body: Table 1 would be invisible end to end. Here each
//! document's body lives in an embedded in-memory store: a read copies it,
//! and an update rewrites it for the new version in two halves with a pause
//! between them (work between UPDATE_PROCEED and UPDATE_DONE, as a real
//! application's would be). Each half is written under a short critical
//! section and no lock is held across the pause, so a read wrongly admitted
//! during an update copies a body that is half new, half old (or old under a
//! new version), which the self-checking body format exposes.
//!
//! The store is this process's: every update of its documents must go
//! through this server (one application server per module, as deployed by
//! `tierstack_deploy::deployment`).

use crate::generate_body;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
// A body is plain bytes: a panic elsewhere while holding the lock leaves
// nothing inconsistent that the body check would not itself report.
use tierstack_base::sync::lock;

/// Default pause between the two halves of an update's rewrite.
pub const UPDATE_WRITE_PAUSE_DEFAULT: Duration = Duration::from_millis(1);
/// Longest pause accepted (it lengthens every update).
pub const UPDATE_WRITE_PAUSE_MAX: Duration = Duration::from_secs(10);

/// The store mode's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Pause between writing the first and the second half of a new body.
    pub update_write_pause: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { update_write_pause: UPDATE_WRITE_PAUSE_DEFAULT }
    }
}

/// Each document's stored body; `None` until first read or written.
pub(crate) struct DocumentStore {
    documents: HashMap<String, Mutex<Option<Vec<u8>>>>,
    update_write_pause: Duration,
}

impl DocumentStore {
    pub(crate) fn new<'a>(names: impl IntoIterator<Item = &'a String>, config: &StoreConfig) -> Self {
        Self {
            documents: names.into_iter().map(|name| (name.clone(), Mutex::new(None))).collect(),
            update_write_pause: config.update_write_pause,
        }
    }

    /// A copy of `name`'s stored body, to be taken under a READ grant. The
    /// first read stores the body at the granted `version` (under a grant no
    /// update is in progress, so that is the current content).
    pub(crate) fn read(&self, name: &str, version: u64, size: usize) -> Option<Bytes> {
        let entry = self.documents.get(name)?;
        let mut stored = lock(entry);
        let body = stored.get_or_insert_with(|| generate_body(name, version, size).to_vec());
        Some(Bytes::copy_from_slice(body))
    }

    /// Rewrites `name`'s body for `version` in two halves with the pause
    /// between them; to be called under an UPDATE grant. Returns the new
    /// body (`None`: unknown document).
    pub(crate) async fn rewrite(&self, name: &str, version: u64, size: usize) -> Option<Bytes> {
        let entry = self.documents.get(name)?;
        let new = generate_body(name, version, size);
        let half = new.len() / 2;
        {
            let mut stored = lock(entry);
            let body = stored.get_or_insert_with(Vec::new);
            if body.len() < half {
                body.resize(half, 0);
            }
            body[..half].copy_from_slice(&new[..half]);
        }
        // The application's work between the halves; no lock is held.
        tokio::time::sleep(self.update_write_pause).await;
        {
            let mut stored = lock(entry);
            let body = stored.get_or_insert_with(Vec::new);
            body.resize(new.len(), 0);
            body[half..].copy_from_slice(&new[half..]);
        }
        Some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_base::time::instant_now;

    fn store(pause: Duration) -> DocumentStore {
        DocumentStore::new(&["a".to_string()], &StoreConfig { update_write_pause: pause })
    }

    #[tokio::test]
    async fn reads_see_the_first_version_then_each_rewrite() {
        let store = store(Duration::ZERO);
        assert_eq!(store.read("a", 3, 300).unwrap(), generate_body("a", 3, 300));
        assert_eq!(store.read("a", 4, 300).unwrap(), generate_body("a", 3, 300), "the store, not the grant");
        assert_eq!(store.rewrite("a", 4, 300).await.unwrap(), generate_body("a", 4, 300));
        assert_eq!(store.read("a", 4, 300).unwrap(), generate_body("a", 4, 300));
        assert!(store.read("b", 1, 300).is_none() && store.rewrite("b", 1, 300).await.is_none());
    }

    /// A read during the pause (what a module violating Table 1 would
    /// allow) copies the new first half and the old second half.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_during_the_pause_is_mixed_and_does_not_block() {
        let store = std::sync::Arc::new(store(Duration::from_secs(600)));
        store.read("a", 1, 200).unwrap();
        let writer = store.clone();
        let rewrite = tokio::spawn(async move { writer.rewrite("a", 2, 200).await });
        let (old, new) = (generate_body("a", 1, 200), generate_body("a", 2, 200));
        let deadline = instant_now() + Duration::from_secs(20);
        let seen = loop {
            let seen = store.read("a", 2, 200).unwrap();
            if seen != old || instant_now() > deadline {
                break seen;
            }
            tokio::task::yield_now().await;
        };
        rewrite.abort();
        assert_eq!(&seen[..100], &new[..100]);
        assert_eq!(&seen[100..], &old[100..]);
    }
}
