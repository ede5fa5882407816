use crate::{FabricError, Result};
use tierstack_base::limits::{BATCH_OPS_MAX, TRANSFER_BYTES_MAX};

/// One one-sided operation on a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Copy `len` bytes at `offset` out of the region.
    Read { offset: u64, len: u32 },
    /// Copy `data` into the region at `offset`.
    Write { offset: u64, data: Vec<u8> },
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
            Op::FetchAdd { offset, .. } | Op::CompareSwap { offset, .. } => (*offset, 8),
        }
    }

    fn is_atomic(&self) -> bool {
        matches!(self, Op::FetchAdd { .. } | Op::CompareSwap { .. })
    }
}

/// Validates a batch against a region of `region_len` bytes: size limits,
/// bounds and alignment. Backends call it before executing anything, so an
/// invalid batch never half-executes.
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
    }
    if transfer_total > TRANSFER_BYTES_MAX {
        return Err(FabricError::TransferTooLarge { len: transfer_total });
    }
    Ok(())
}
