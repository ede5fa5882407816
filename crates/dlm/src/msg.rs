//! The lock manager's two-sided messages on the wire.
//!
//! Lock-manager messages travel on the fabric's `Channel::LOCKS`, which is
//! what routes them to the lock manager. Every payload still starts with the
//! service tag [`SERVICE_TAG`] (`0x01`), which the decoder checks, so a stray
//! payload on the channel is refused rather than misread. The rest is a
//! fixed 32-byte frame, little-endian:
//!
//! ```text
//! byte 0      service tag 0x01
//! byte 1      kind (see `Kind`)
//! bytes 2..4  generation of the lock word (u16; 0 for SRSL)
//! bytes 4..8  argument (u32): shared count, grant route, notice kind, or SRSL mode bits
//! bytes 8..16 lock id (u64)
//! bytes 16..24 fencing token (u64; SRSL exclusive grants), the requester's incarnation (SRSL acquires), else 0
//! bytes 24..32 epoch (u64): the incarnation of the lock's home the message belongs to
//! ```
//!
//! **Why the epoch:** a home that restarts creates its locks again from
//! generation 0, so a message of the old incarnation's protocol still in
//! flight could pass for one of the new. Every message names the home
//! incarnation (the random number in the home's node region) its sender's
//! view of the lock belongs to, and receivers drop messages of another.

use crate::proto::{LockMode, ProtoMsg, SharedVia};
use crate::srsl::SrslMsg;
use crate::LockId;

/// First byte of every lock-manager payload.
pub const SERVICE_TAG: u8 = 0x01;
/// Length of every lock-manager payload.
pub const MESSAGE_BYTES: usize = 32;

/// A decoded lock-manager message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DlmMessage {
    /// N-CoShED / DQNL protocol traffic (recovery notices included).
    Proto { lock: LockId, epoch: u64, generation: u16, msg: ProtoMsg },
    /// SRSL traffic.
    Srsl { lock: LockId, epoch: u64, msg: SrslMsg },
}

/// A payload that is not a well-formed lock-manager message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed lock-manager message: {0}")]
pub struct DecodeError(pub String);

const K_SUCCESSOR: u8 = 1;
const K_SHARED_REQUEST: u8 = 2;
const K_GRANT_EXCLUSIVE: u8 = 3;
const K_GRANT_SHARED: u8 = 4;
const K_SHARED_RELEASE: u8 = 5;
const K_DRAINED: u8 = 6;
const K_NOTICE: u8 = 7;
const K_ACK: u8 = 8;
const K_NACK: u8 = 9;
const K_SRSL_ACQUIRE: u8 = 16;
const K_SRSL_GRANT: u8 = 17;
const K_SRSL_WOULD_BLOCK: u8 = 18;
const K_SRSL_RELEASE: u8 = 19;
const K_SRSL_BREAK: u8 = 20;
const K_SRSL_BROKEN: u8 = 21;
const K_SRSL_REHOMED: u8 = 22;
const K_SRSL_REPORT: u8 = 23;
const K_SRSL_MOVED: u8 = 24;
/// `Report`'s argument bit: a hold is reported (its mode in `ARG_EXCLUSIVE`).
const ARG_HELD: u32 = 4;

const ARG_EXCLUSIVE: u32 = 1;
const ARG_TRY: u32 = 2;

fn mode_bits(mode: LockMode) -> u32 {
    if mode == LockMode::Exclusive {
        ARG_EXCLUSIVE
    } else {
        0
    }
}

fn bits_mode(arg: u32) -> LockMode {
    if arg & ARG_EXCLUSIVE != 0 {
        LockMode::Exclusive
    } else {
        LockMode::Shared
    }
}

impl DlmMessage {
    pub fn encode(&self) -> [u8; MESSAGE_BYTES] {
        let (kind, lock, generation, arg, token, epoch) = match *self {
            DlmMessage::Proto { lock, epoch, generation, msg } => {
                let (kind, arg) = match msg {
                    ProtoMsg::Successor { shared } => (K_SUCCESSOR, shared),
                    ProtoMsg::SharedRequest => (K_SHARED_REQUEST, 0),
                    ProtoMsg::GrantExclusive => (K_GRANT_EXCLUSIVE, 0),
                    ProtoMsg::GrantShared { via: SharedVia::Group0 } => (K_GRANT_SHARED, 0),
                    ProtoMsg::GrantShared { via: SharedVia::Coordinator } => (K_GRANT_SHARED, 1),
                    ProtoMsg::SharedRelease => (K_SHARED_RELEASE, 0),
                    ProtoMsg::Drained => (K_DRAINED, 0),
                    ProtoMsg::Notice { revoke } => (K_NOTICE, u32::from(revoke)),
                    ProtoMsg::Ack => (K_ACK, 0),
                    ProtoMsg::Nack => (K_NACK, 0),
                };
                (kind, lock, generation, arg, 0, epoch)
            }
            DlmMessage::Srsl { lock, epoch, msg } => {
                let (kind, arg, token) = match msg {
                    SrslMsg::Acquire { mode, try_only, incarnation } => {
                        (K_SRSL_ACQUIRE, mode_bits(mode) | if try_only { ARG_TRY } else { 0 }, incarnation)
                    }
                    SrslMsg::Grant { mode, token } => (K_SRSL_GRANT, mode_bits(mode), token),
                    SrslMsg::WouldBlock => (K_SRSL_WOULD_BLOCK, 0, 0),
                    SrslMsg::Release => (K_SRSL_RELEASE, 0, 0),
                    SrslMsg::Break => (K_SRSL_BREAK, 0, 0),
                    SrslMsg::Broken { held } => (K_SRSL_BROKEN, u32::from(held), 0),
                    SrslMsg::Rehomed => (K_SRSL_REHOMED, 0, 0),
                    SrslMsg::Report { held: None } => (K_SRSL_REPORT, 0, 0),
                    SrslMsg::Report { held: Some((mode, token)) } => (K_SRSL_REPORT, mode_bits(mode) | ARG_HELD, token),
                    SrslMsg::Moved => (K_SRSL_MOVED, 0, 0),
                };
                (kind, lock, 0, arg, token, epoch)
            }
        };
        let mut out = [0u8; MESSAGE_BYTES];
        out[0] = SERVICE_TAG;
        out[1] = kind;
        out[2..4].copy_from_slice(&generation.to_le_bytes());
        out[4..8].copy_from_slice(&arg.to_le_bytes());
        out[8..16].copy_from_slice(&lock.0.to_le_bytes());
        out[16..24].copy_from_slice(&token.to_le_bytes());
        out[24..32].copy_from_slice(&epoch.to_le_bytes());
        out
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let frame: &[u8; MESSAGE_BYTES] = payload
            .try_into()
            .map_err(|_| DecodeError(format!("{} bytes, expected {MESSAGE_BYTES}", payload.len())))?;
        if frame[0] != SERVICE_TAG {
            return Err(DecodeError(format!("service tag {:#04x}, expected {SERVICE_TAG:#04x}", frame[0])));
        }
        let word = |range: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..range.len()].copy_from_slice(&frame[range]);
            u64::from_le_bytes(b)
        };
        let generation = word(2..4) as u16;
        let arg = word(4..8) as u32;
        let lock = LockId(word(8..16));
        let token = word(16..24);
        let epoch = word(24..32);
        let proto = |msg| Ok(DlmMessage::Proto { lock, epoch, generation, msg });
        let srsl = |msg| Ok(DlmMessage::Srsl { lock, epoch, msg });
        match frame[1] {
            K_SUCCESSOR => proto(ProtoMsg::Successor { shared: arg }),
            K_SHARED_REQUEST => proto(ProtoMsg::SharedRequest),
            K_GRANT_EXCLUSIVE => proto(ProtoMsg::GrantExclusive),
            K_GRANT_SHARED => match arg {
                0 => proto(ProtoMsg::GrantShared { via: SharedVia::Group0 }),
                1 => proto(ProtoMsg::GrantShared { via: SharedVia::Coordinator }),
                other => Err(DecodeError(format!("grant route {other}"))),
            },
            K_SHARED_RELEASE => proto(ProtoMsg::SharedRelease),
            K_DRAINED => proto(ProtoMsg::Drained),
            K_NOTICE => match arg {
                0 | 1 => proto(ProtoMsg::Notice { revoke: arg == 1 }),
                other => Err(DecodeError(format!("notice kind {other}"))),
            },
            K_ACK => proto(ProtoMsg::Ack),
            K_NACK => proto(ProtoMsg::Nack),
            K_SRSL_ACQUIRE => {
                srsl(SrslMsg::Acquire { mode: bits_mode(arg), try_only: arg & ARG_TRY != 0, incarnation: token })
            }
            K_SRSL_GRANT => srsl(SrslMsg::Grant { mode: bits_mode(arg), token }),
            K_SRSL_WOULD_BLOCK => srsl(SrslMsg::WouldBlock),
            K_SRSL_RELEASE => srsl(SrslMsg::Release),
            K_SRSL_BREAK => srsl(SrslMsg::Break),
            K_SRSL_BROKEN => srsl(SrslMsg::Broken { held: arg & 1 != 0 }),
            K_SRSL_REHOMED => srsl(SrslMsg::Rehomed),
            K_SRSL_REPORT => srsl(SrslMsg::Report { held: (arg & ARG_HELD != 0).then(|| (bits_mode(arg), token)) }),
            K_SRSL_MOVED => srsl(SrslMsg::Moved),
            other => Err(DecodeError(format!("unknown kind {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let lock = LockId(0x0102_0304_0506_0708);
        let all = [
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 7, msg: ProtoMsg::Successor { shared: 42 } },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 7, msg: ProtoMsg::SharedRequest },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 0, msg: ProtoMsg::GrantExclusive },
            DlmMessage::Proto {
                lock,
                epoch: 0xE9,
                generation: 1,
                msg: ProtoMsg::GrantShared { via: SharedVia::Group0 },
            },
            DlmMessage::Proto {
                lock,
                epoch: 0xE9,
                generation: 1,
                msg: ProtoMsg::GrantShared { via: SharedVia::Coordinator },
            },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 2, msg: ProtoMsg::SharedRelease },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: u16::MAX, msg: ProtoMsg::Drained },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 3, msg: ProtoMsg::Notice { revoke: true } },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 3, msg: ProtoMsg::Notice { revoke: false } },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 3, msg: ProtoMsg::Ack },
            DlmMessage::Proto { lock, epoch: 0xE9, generation: 3, msg: ProtoMsg::Nack },
            DlmMessage::Srsl {
                lock,
                epoch: u64::MAX,
                msg: SrslMsg::Acquire { mode: LockMode::Exclusive, try_only: true, incarnation: u64::MAX },
            },
            DlmMessage::Srsl {
                lock,
                epoch: u64::MAX,
                msg: SrslMsg::Acquire { mode: LockMode::Shared, try_only: false, incarnation: 0x1234_5678_9abc },
            },
            DlmMessage::Srsl {
                lock,
                epoch: u64::MAX,
                msg: SrslMsg::Grant { mode: LockMode::Exclusive, token: u64::MAX },
            },
            DlmMessage::Srsl { lock, epoch: u64::MAX, msg: SrslMsg::WouldBlock },
            DlmMessage::Srsl { lock, epoch: u64::MAX, msg: SrslMsg::Release },
            DlmMessage::Srsl { lock, epoch: u64::MAX, msg: SrslMsg::Break },
            DlmMessage::Srsl { lock, epoch: u64::MAX, msg: SrslMsg::Broken { held: true } },
            DlmMessage::Srsl { lock, epoch: u64::MAX, msg: SrslMsg::Broken { held: false } },
            DlmMessage::Srsl { lock, epoch: 3, msg: SrslMsg::Rehomed },
            DlmMessage::Srsl { lock, epoch: 3, msg: SrslMsg::Moved },
            DlmMessage::Srsl { lock, epoch: 3, msg: SrslMsg::Report { held: None } },
            DlmMessage::Srsl { lock, epoch: 3, msg: SrslMsg::Report { held: Some((LockMode::Shared, 0)) } },
            DlmMessage::Srsl { lock, epoch: 3, msg: SrslMsg::Report { held: Some((LockMode::Exclusive, u64::MAX)) } },
        ];
        for m in all {
            let bytes = m.encode();
            assert_eq!(bytes[0], SERVICE_TAG);
            assert_eq!(DlmMessage::decode(&bytes), Ok(m));
        }
    }

    #[test]
    fn malformed_payloads_are_typed_errors() {
        assert!(DlmMessage::decode(&[SERVICE_TAG; 3]).is_err());
        let mut bytes = DlmMessage::Srsl { lock: LockId(1), epoch: 1, msg: SrslMsg::Release }.encode();
        bytes[0] = 0x02;
        assert!(DlmMessage::decode(&bytes).is_err(), "another service's tag");
        bytes[0] = SERVICE_TAG;
        bytes[1] = 99;
        assert!(DlmMessage::decode(&bytes).is_err(), "unknown kind");
    }
}
