//! Keys, home nodes and the groupcache baseline's owner ring.
//!
//! A cached entity is named by a 64-bit [`Key`], the FNV-1a fingerprint of
//! its cache key (the request target, for the proxy). Metadata lives at the
//! entity's **home**: one of the *active* nodes (the proxies), its point on a
//! consistent-hashing ring ([`Homes`]; seed-notes a.7 #5 asked for a fixed
//! hash, the ring keeps it fixed while every home lives and moves only a
//! dead home's keys, to their successors).
//! Passive back-end nodes (MTACC, HYBCC) are never homes (coop §3.3).

use std::collections::BTreeMap;

/// The name of a cached entity: a fingerprint of its cache key.
pub type Key = u64;

/// FNV-1a (64-bit) of `bytes`, the fingerprint used as a [`Key`].
pub fn fingerprint(bytes: &[u8]) -> Key {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3))
}

/// A 64-bit finalizer (splitmix64's): spreads nearby keys over the whole
/// range before they are reduced to a node index.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The partition of the key space over the active nodes: a
/// consistent-hashing ring with [`RING_POINTS_PER_NODE`] virtual points per
/// node (the same ring as groupcache's owners). Node indices `0..active` are
/// the active nodes. With every node alive a key's home is fixed
/// ([`Homes::home`]); when homes are declared dead, a key of a dead home
/// moves to the next live node on the ring and no other key moves
/// ([`Homes::home_among`]).
#[derive(Clone, Debug)]
pub struct Homes {
    active: usize,
    ring: HashRing,
}

impl Homes {
    /// A partition over `active` nodes; `None` if there are none.
    pub fn new(active: usize) -> Option<Self> {
        Some(Self { active, ring: HashRing::new(active)? })
    }

    /// The home node (an index below `active`) of `key`, every node alive.
    pub fn home(&self, key: Key) -> usize {
        self.ring.owner(key)
    }

    /// The home of `key` among the nodes whose bit is set in `live` (bit i:
    /// node i): its first live successor on the ring. With no live active
    /// node, [`Homes::home`].
    pub fn home_among(&self, key: Key, live: u64) -> usize {
        self.ring.owner_among(key, live)
    }

    pub fn active(&self) -> usize {
        self.active
    }
}

/// Virtual points per node on the groupcache ring (groupcache's default is 50).
pub const RING_POINTS_PER_NODE: u32 = 64;

/// A consistent-hashing ring (groupcache's `consistenthash`): each node owns
/// [`RING_POINTS_PER_NODE`] points; a key belongs to the first point at or
/// after its hash, wrapping around.
#[derive(Clone, Debug)]
pub struct HashRing {
    points: BTreeMap<u64, usize>,
}

impl HashRing {
    /// A ring over nodes `0..nodes`; `None` if there are none.
    pub fn new(nodes: usize) -> Option<Self> {
        if nodes == 0 {
            return None;
        }
        let mut points = BTreeMap::new();
        for node in 0..nodes {
            for point in 0..RING_POINTS_PER_NODE {
                let h = mix(fingerprint(format!("{point}:{node}").as_bytes()));
                // A collision keeps the first owner: deterministic.
                points.entry(h).or_insert(node);
            }
        }
        Some(Self { points })
    }

    /// The node that owns `key`.
    pub fn owner(&self, key: Key) -> usize {
        let h = mix(key);
        self.points
            .range(h..)
            .next()
            .or_else(|| self.points.iter().next())
            .map(|(_, &node)| node)
            // The ring has at least one point (`new` refuses zero nodes).
            .unwrap_or(0)
    }

    /// The first node at or after `key`'s point whose bit is set in `live`
    /// (nodes beyond bit 63 count as live); [`HashRing::owner`] if none is.
    pub fn owner_among(&self, key: Key, live: u64) -> usize {
        let is_live = |n: usize| n >= 64 || live & (1u64 << n) != 0;
        let h = mix(key);
        self.points
            .range(h..)
            .chain(self.points.range(..h))
            .map(|(_, &node)| node)
            .find(|&n| is_live(n))
            .unwrap_or_else(|| self.owner(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_fixed_and_spread() {
        let homes = Homes::new(4).unwrap();
        let mut per = [0u32; 4];
        for k in 0..4000u64 {
            let h = homes.home(fingerprint(format!("/doc/{k}").as_bytes()));
            assert_eq!(h, homes.home(fingerprint(format!("/doc/{k}").as_bytes())));
            per[h] += 1;
        }
        assert!(per.iter().all(|&n| n > 800), "{per:?}");
        assert!(Homes::new(0).is_none());
    }

    /// A dead home's keys go to live successors; no other key moves.
    #[test]
    fn a_dead_homes_keys_move_and_no_others() {
        let homes = Homes::new(4).unwrap();
        let all = 0b1111;
        let without_2 = 0b1011;
        let mut moved = [0u32; 4];
        for k in 0..20_000u64 {
            let (before, after) = (homes.home_among(k, all), homes.home_among(k, without_2));
            assert_eq!(before, homes.home(k));
            if before == 2 {
                assert_ne!(after, 2);
                moved[after] += 1;
            } else {
                assert_eq!(before, after, "key {k} moved though its home lives");
            }
        }
        // Virtual nodes spread the dead home's keys over every survivor.
        assert!(moved.iter().enumerate().all(|(n, &c)| n == 2 || c > 500), "{moved:?}");
        assert_eq!(homes.home_among(5, 0), homes.home(5));
    }

    #[test]
    fn ring_moves_few_keys_when_a_node_joins() {
        let (a, b) = (HashRing::new(4).unwrap(), HashRing::new(5).unwrap());
        let moved = (0..10_000u64).filter(|&k| a.owner(k) != b.owner(k)).count();
        // Ideal is 1/5 of the keys; modulo hashing would move 4/5.
        assert!(moved < 3_500, "{moved}");
        assert!((0..10_000u64).all(|k| b.owner(k) < 5));
    }
}
