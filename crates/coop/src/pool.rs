//! The page-based pool: a node's cache memory as fixed 4 KiB pages.
//!
//! An entity takes `ceil(bytes / PAGE_BYTES)` pages (at least one), not
//! the next power of two: an 8 KiB document takes exactly two pages, so a
//! 64 MiB pool holds 8,192 of them, as the seed's Table 1 assumes (a
//! power-of-two slot with any header would double each to 16 KiB and halve
//! the capacity). Only body bytes count; metadata lives elsewhere.
//!
//! The pages of one entity need not be contiguous: [`PagePool::alloc`] hands
//! out the lowest free pages, so runs stay contiguous while the pool is
//! young, and a reader moves an entity with one transfer per run of pages.

use crate::CoopError;
use std::collections::BTreeSet;

/// Bytes per page.
pub const PAGE_BYTES: u64 = 4096;

/// Largest entity the cache takes: 64 pages (256 KiB). Larger responses are
/// served but never cached (a page-table record lists an entity's pages).
pub const ENTITY_PAGES_MAX: u32 = 64;

/// Pages an entity of `bytes` takes (at least one).
pub fn pages_for(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(PAGE_BYTES).max(1)).unwrap_or(u32::MAX)
}

/// Whether an entity of `bytes` may be cached at all.
pub fn cacheable(bytes: u64) -> bool {
    pages_for(bytes) <= ENTITY_PAGES_MAX
}

/// A pool of `capacity` pages: which are free.
#[derive(Clone, Debug)]
pub struct PagePool {
    capacity: u32,
    free: BTreeSet<u32>,
}

impl PagePool {
    /// A pool of `capacity` pages, all free.
    pub fn new(capacity: u32) -> Self {
        Self { capacity, free: (0..capacity).collect() }
    }

    /// A pool over `bytes` of memory (whole pages only).
    pub fn with_bytes(bytes: u64) -> Self {
        Self::new(u32::try_from(bytes / PAGE_BYTES).unwrap_or(u32::MAX))
    }

    pub fn capacity_pages(&self) -> u32 {
        self.capacity
    }

    pub fn free_pages(&self) -> u32 {
        // At most `capacity` entries, which is a u32.
        self.free.len() as u32
    }

    pub fn used_pages(&self) -> u32 {
        self.capacity - self.free_pages()
    }

    /// Takes `n` pages (the lowest free ones), all or nothing.
    pub fn alloc(&mut self, n: u32) -> Result<Vec<u32>, CoopError> {
        if n > self.free_pages() {
            return Err(CoopError::NoRoom { need_pages: n, free_pages: self.free_pages() });
        }
        let pages: Vec<u32> = self.free.iter().take(n as usize).copied().collect();
        for p in &pages {
            self.free.remove(p);
        }
        Ok(pages)
    }

    /// Returns `pages` to the pool. A page outside the pool or already free
    /// is refused, and then nothing is returned.
    pub fn release(&mut self, pages: &[u32]) -> Result<(), CoopError> {
        let mut seen = BTreeSet::new();
        for &p in pages {
            if p >= self.capacity || self.free.contains(&p) || !seen.insert(p) {
                return Err(CoopError::BadPage { page: p });
            }
        }
        self.free.extend(pages);
        Ok(())
    }

    /// Whether `page` is free.
    pub fn is_free(&self, page: u32) -> bool {
        self.free.contains(&page)
    }
}

/// Runs of consecutive pages, as `(first page, pages)`: one transfer each.
pub fn runs(pages: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((first, len)) if *first + *len == p => *len += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_exact_not_power_of_two() {
        assert_eq!(pages_for(0), 1);
        assert_eq!(pages_for(8 << 10), 2);
        assert_eq!(pages_for((8 << 10) + 1), 3);
        assert_eq!(pages_for(64 << 10), 16);
        // 64 MiB holds 8,192 entities of 8 KiB: Table 1's capacity.
        let pool = PagePool::with_bytes(64 << 20);
        assert_eq!(pool.capacity_pages() / pages_for(8 << 10), 8192);
        assert!(cacheable(256 << 10) && !cacheable((256 << 10) + 1));
    }

    #[test]
    fn alloc_is_all_or_nothing_and_release_refuses_double_frees() {
        let mut pool = PagePool::new(5);
        let a = pool.alloc(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(matches!(pool.alloc(3), Err(CoopError::NoRoom { need_pages: 3, free_pages: 2 })));
        assert_eq!(pool.free_pages(), 2);
        pool.release(&a[..1]).unwrap();
        assert!(matches!(pool.release(&a[..1]), Err(CoopError::BadPage { page: 0 })));
        assert!(matches!(pool.release(&[9]), Err(CoopError::BadPage { page: 9 })));
        assert!(matches!(pool.release(&[1, 1]), Err(CoopError::BadPage { page: 1 })));
        assert_eq!(pool.used_pages(), 2);
        assert_eq!(runs(&[0, 1, 2, 5, 6, 9]), vec![(0, 3), (5, 2), (9, 1)]);
    }
}
