//! How full a node's pool and key table are now, for its `/metrics`: read
//! under the state lock when asked, never kept on the request path.

use super::CoopNode;
use tierstack_base::sync::lock;

/// A node's pool and key table now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Entries in this node's pool.
    pub entries: u64,
    pub used_pages: u64,
    pub capacity_pages: u64,
    /// Keys homed here with an entry in the key table, and its capacity
    /// (both 0 on a node that is no home: a passive one).
    pub home_keys: u64,
    pub home_key_capacity: u64,
}

impl CoopNode {
    /// The pool's and the key table's occupancy now.
    pub fn occupancy(&self) -> Occupancy {
        let state = lock(&self.shared.state);
        let (home_keys, home_key_capacity) = state.keys.as_ref().map_or((0, 0), |keys| keys.occupancy());
        Occupancy {
            entries: state.cache.len() as u64,
            used_pages: u64::from(state.cache.used_pages()),
            capacity_pages: u64::from(state.cache.capacity_pages()),
            home_keys,
            home_key_capacity,
        }
    }
}
