//! The bytes of an entity's pool pages: copied in and out of this node's
//! pool, and read one-sided from a peer's pool in one batch.

use super::Shared;
use crate::pool::PAGE_BYTES;
use crate::service::layout::POOL_REGION;
use tierstack_fabric::{FabricError, LocalSlice, Op};

impl Shared {
    pub(super) fn read_body(&self, pages: &[u32], bytes: u64) -> Vec<u8> {
        let mut body = vec![0u8; bytes as usize];
        for (chunk, &p) in body.chunks_mut(PAGE_BYTES as usize).zip(pages) {
            let _ = self.pool.memory().read(self.layout.page_offset(p), chunk);
        }
        body
    }

    pub(super) fn write_body(&self, pages: &[u32], body: &[u8]) {
        for (chunk, &p) in body.chunks(PAGE_BYTES as usize).zip(pages) {
            let _ = self.pool.memory().write(self.layout.page_offset(p), chunk);
        }
    }

    /// One-sided read of an entity's pages from `node`'s pool into `local`
    /// pages, then of the record's sequence word, in one batch. True if the
    /// bytes are the announced entity's.
    pub(super) fn read_remote(
        &self,
        node: usize,
        from_pages: &[u32],
        local: &[u32],
        bytes: u64,
        check: Option<(u32, u64)>,
    ) -> Result<bool, FabricError> {
        let region = self.region(node, POOL_REGION)?;
        let mut ops = Vec::with_capacity(from_pages.len() + 1);
        let mut left = bytes;
        for (&rp, &lp) in from_pages.iter().zip(local) {
            let len = left.min(PAGE_BYTES);
            left -= len;
            let target = LocalSlice::new(self.pool.clone(), self.layout.page_offset(lp), len as u32);
            ops.push(Op::ReadInto { offset: self.layout.page_offset(rp), target });
        }
        if let Some((slot, _)) = check {
            ops.push(Op::Read { offset: self.layout.record_seq_offset(slot), len: 8 });
        }
        let mut results = region.post(ops).wait()?;
        match check {
            None => Ok(true),
            Some((_, seq)) => Ok(results.pop().map(|r| r.into_u64()).transpose()?.is_some_and(|s| s == seq)),
        }
    }
}
