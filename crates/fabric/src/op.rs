use crate::{FabricError, LocalRegion, Result};
use std::sync::Arc;
use tierstack_base::limits::{BATCH_OPS_MAX, TRANSFER_BYTES_MAX};

/// A range of a region registered by this node: the local buffer of a
/// [`Op::WriteFrom`] or [`Op::ReadInto`], as an RDMA work request names a
/// registered local buffer. Cloning shares the region (an `Arc`).
///
/// Making one checks nothing: [`check_batch`] checks its bounds and its
/// alignment against the remote offset when the op is posted, with the rest
/// of the batch. Two slices are equal when they name the same region (by
/// identity, not by contents), offset and length.
#[derive(Clone)]
pub struct LocalSlice {
    region: Arc<LocalRegion>,
    offset: u64,
    len: u32,
}

impl LocalSlice {
    /// The `len` bytes at `offset` of `region`.
    pub fn new(region: Arc<LocalRegion>, offset: u64, len: u32) -> Self {
        Self { region, offset, len }
    }

    pub fn region(&self) -> &Arc<LocalRegion> {
        &self.region
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fails with [`FabricError::LocalOutOfBounds`] unless the slice lies
    /// inside its region.
    pub fn check_bounds(&self) -> Result<()> {
        let (offset, len, region_len) = (self.offset, u64::from(self.len), self.region.len());
        if offset.checked_add(len).is_none_or(|end| end > region_len) {
            return Err(FabricError::LocalOutOfBounds {
                region: self.region.name().to_string(),
                offset,
                len,
                region_len,
            });
        }
        Ok(())
    }
}

impl PartialEq for LocalSlice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.region, &other.region) && self.offset == other.offset && self.len == other.len
    }
}

impl Eq for LocalSlice {}

impl std::fmt::Debug for LocalSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSlice")
            .field("region", &self.region.name())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// One one-sided operation on a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Copy `len` bytes at `offset` out of the region.
    Read { offset: u64, len: u32 },
    /// Copy `data` into the region at `offset`.
    Write { offset: u64, data: Vec<u8> },
    /// Copy the bytes of `source`, a slice of a region of this node, into
    /// the region at `offset`, with no intermediate buffer of the caller's.
    /// `offset` and `source.offset()` must be equal modulo 8.
    WriteFrom { offset: u64, source: LocalSlice },
    /// Copy `target.len()` bytes at `offset` out of the region straight into
    /// `target`, a slice of a region of this node. `offset` and
    /// `target.offset()` must be equal modulo 8. `target` is written only by
    /// a batch that completes successfully, and only before its completion.
    ReadInto { offset: u64, target: LocalSlice },
    /// Wrapping add to the 64-bit word at `offset` (8-aligned); yields the previous value.
    FetchAdd { offset: u64, delta: u64 },
    /// Swap the word at `offset` (8-aligned) to `new` if it is `expected`; yields the previous value.
    CompareSwap { offset: u64, expected: u64, new: u64 },
}

/// The result of one [`Op`], in the same position of the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    Read(Vec<u8>),
    Written,
    /// A [`Op::WriteFrom`] wrote its source's bytes.
    WrittenFrom,
    /// A [`Op::ReadInto`] copied the bytes into its target.
    ReadInto,
    FetchAdd(u64),
    CompareSwap(u64),
}

impl OpResult {
    /// The bytes of a `Read` result.
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        match self {
            OpResult::Read(data) => Ok(data),
            other => Err(FabricError::Io(format!("expected a read result, got {other:?}"))),
        }
    }

    /// The previous value of an atomic result.
    pub fn into_u64(self) -> Result<u64> {
        match self {
            OpResult::FetchAdd(v) | OpResult::CompareSwap(v) => Ok(v),
            OpResult::Read(data) if data.len() == 8 => {
                Ok(u64::from_ne_bytes(data.try_into().map_err(|_| FabricError::Io("bad word".into()))?))
            }
            other => Err(FabricError::Io(format!("expected an atomic result, got {other:?}"))),
        }
    }
}

impl Op {
    fn span(&self) -> (u64, u64) {
        match self {
            Op::Read { offset, len } => (*offset, u64::from(*len)),
            Op::Write { offset, data } => (*offset, data.len() as u64),
            Op::WriteFrom { offset, source: local } | Op::ReadInto { offset, target: local } => {
                (*offset, u64::from(local.len()))
            }
            Op::FetchAdd { offset, .. } | Op::CompareSwap { offset, .. } => (*offset, 8),
        }
    }

    fn is_atomic(&self) -> bool {
        matches!(self, Op::FetchAdd { .. } | Op::CompareSwap { .. })
    }

    /// The local slice of a transfer between registered regions.
    pub fn local_slice(&self) -> Option<&LocalSlice> {
        match self {
            Op::WriteFrom { source, .. } => Some(source),
            Op::ReadInto { target, .. } => Some(target),
            _ => None,
        }
    }
}

/// Validates a batch against a region of `region_len` bytes: size limits,
/// bounds and alignment. Backends call it before executing anything, so an
/// invalid batch never half-executes.
///
/// Alignment rules: `Read`/`Write` take any offset and length (every aligned
/// 8-byte word inside is still moved atomically); `FetchAdd`/`CompareSwap`
/// need an 8-aligned offset ([`FabricError::Misaligned`]). `WriteFrom` and
/// `ReadInto` take any offset and length too, but their local and remote
/// offsets must be equal modulo 8 ([`FabricError::LocalMisaligned`]): then
/// every aligned word of the remote range faces an aligned word of the local
/// slice, and each is moved with one atomic load and one atomic store, so
/// neither side ever sees a torn word. Their local slice must lie inside its
/// region ([`FabricError::LocalOutOfBounds`]), and its length counts towards
/// the transfer limits like a read's or a write's.
pub fn check_batch(region: &str, region_len: u64, ops: &[Op]) -> Result<()> {
    if ops.is_empty() || ops.len() > BATCH_OPS_MAX {
        return Err(FabricError::BatchSize { ops: ops.len(), max: BATCH_OPS_MAX });
    }
    let mut transfer_total: usize = 0;
    for op in ops {
        let (offset, len) = op.span();
        if len as usize > TRANSFER_BYTES_MAX {
            return Err(FabricError::TransferTooLarge { len: len as usize });
        }
        transfer_total = transfer_total.saturating_add(len as usize);
        if op.is_atomic() && !offset.is_multiple_of(8) {
            return Err(FabricError::Misaligned { offset });
        }
        if offset.checked_add(len).is_none_or(|end| end > region_len) {
            return Err(FabricError::OutOfBounds { region: region.to_string(), offset, len, region_len });
        }
        if let Some(local) = op.local_slice() {
            local.check_bounds()?;
            if offset % 8 != local.offset() % 8 {
                return Err(FabricError::LocalMisaligned { local_offset: local.offset(), remote_offset: offset });
            }
        }
    }
    if transfer_total > TRANSFER_BYTES_MAX {
        return Err(FabricError::TransferTooLarge { len: transfer_total });
    }
    Ok(())
}
