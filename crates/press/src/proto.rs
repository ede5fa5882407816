//! PRESS's intra-cluster messages and their byte encoding (specified in
//! `docs/wire-format.md`, section "PRESS messages").
//!
//! Every message starts with an 8-byte header that carries the sender's
//! load: that is piggy-backing (§3.1), so no message type exists for load
//! alone. The body types are the paper's six minus load information
//! (§3.2): request forwarding, file transfer (inline data, or for the
//! remote-write versions a descriptor of data written into the receiver's
//! data ring), caching information, window flow control and buffer
//! management. Decoding arbitrary bytes returns an error, never panics
//! (property-tested).

/// Longest file path a message carries, in bytes.
pub const PATH_BYTES_MAX: usize = 1024;

/// Largest file body a `File` message carries inline.
pub const FILE_BYTES_MAX: usize = 16 << 20;

/// Bytes of the common header (kind, flags, reserved, load).
pub const HEADER_BYTES: usize = 8;

/// How a file transfer ended at the service node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileStatus {
    /// The body follows (inline or in the data ring).
    Ok = 0,
    /// No such file at the service node.
    NotFound = 1,
    /// The service node could not serve it (e.g. no room to send); the
    /// initial node answers the client with an error.
    Failed = 2,
}

impl FileStatus {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(FileStatus::Ok),
            1 => Some(FileStatus::NotFound),
            2 => Some(FileStatus::Failed),
            _ => None,
        }
    }
}

/// The body of a PRESS message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Request forwarding: serve `path` for the initial node's `request`.
    Forward { request: u64, path: String },
    /// File transfer with the data inline (TCP, Base).
    File { request: u64, status: FileStatus, data: Vec<u8> },
    /// File transfer whose data the sender wrote into the receiver's data
    /// ring at `offset`, `len` bytes (RDMA-1c, RDMA, Zero).
    FileInfo { request: u64, status: FileStatus, offset: u64, len: u32 },
    /// Caching information: the sender started or stopped caching `path`.
    Caching { start: bool, path: String },
    /// Window flow control: the receiver freed `credits` message slots.
    Flow { credits: u32 },
    /// Buffer management: the receiver is done with `len` bytes at `offset`
    /// of the data buffer the sender writes into.
    BufferMgmt { offset: u64, len: u32 },
}

/// A message: the sender's load (piggy-backed) and a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Open connections at the sender when it sent this.
    pub load: u32,
    pub body: Body,
}

/// Table 2's message categories ("we group flow control and buffer
/// management messages into a single category").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MsgType {
    Flow = 0,
    Forward = 1,
    Caching = 2,
    File = 3,
}

impl MsgType {
    pub const ALL: [MsgType; 4] = [MsgType::Flow, MsgType::Forward, MsgType::Caching, MsgType::File];

    pub fn name(self) -> &'static str {
        match self {
            MsgType::Flow => "Flow",
            MsgType::Forward => "Forward",
            MsgType::Caching => "Caching",
            MsgType::File => "File",
        }
    }
}

impl Body {
    /// The Table 2 category this body counts in.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Body::Forward { .. } => MsgType::Forward,
            Body::File { .. } | Body::FileInfo { .. } => MsgType::File,
            Body::Caching { .. } => MsgType::Caching,
            Body::Flow { .. } | Body::BufferMgmt { .. } => MsgType::Flow,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Body::Forward { .. } => 1,
            Body::File { .. } => 2,
            Body::FileInfo { .. } => 3,
            Body::Caching { .. } => 4,
            Body::Flow { .. } => 5,
            Body::BufferMgmt { .. } => 6,
        }
    }
}

/// Bytes that do not decode as a PRESS message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("message of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("unknown file status {0}")]
    UnknownStatus(u8),
    #[error("a field runs past the end of the message")]
    Truncated,
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("path of {0} bytes exceeds {PATH_BYTES_MAX}")]
    PathTooLong(usize),
    #[error("path is not UTF-8")]
    PathNotUtf8,
    #[error("file of {0} bytes exceeds {FILE_BYTES_MAX}")]
    FileTooLarge(usize),
    #[error("caching flag {0} is neither 0 nor 1")]
    CachingFlag(u8),
}

/// Encodes a message. Fails only for a path or an inline file over its
/// limit (checked before anything is written).
pub fn encode(message: &Message) -> Result<Vec<u8>, ProtoError> {
    let mut out = Vec::with_capacity(encoded_len(message));
    encode_into(message, &mut out)?;
    Ok(out)
}

/// Encodes a message at the end of `out`.
pub fn encode_into(message: &Message, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let flags = match &message.body {
        Body::File { status, .. } | Body::FileInfo { status, .. } => *status as u8,
        Body::Caching { start, .. } => u8::from(*start),
        _ => 0,
    };
    match &message.body {
        Body::Forward { path, .. } | Body::Caching { path, .. } if path.len() > PATH_BYTES_MAX => {
            return Err(ProtoError::PathTooLong(path.len()))
        }
        Body::File { data, .. } if data.len() > FILE_BYTES_MAX => return Err(ProtoError::FileTooLarge(data.len())),
        _ => {}
    }
    out.push(message.body.kind());
    out.push(flags);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&message.load.to_le_bytes());
    match &message.body {
        Body::Forward { request, path } => {
            out.extend_from_slice(&request.to_le_bytes());
            put_path(out, path);
        }
        Body::File { request, data, .. } => {
            out.extend_from_slice(&request.to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(data);
        }
        Body::FileInfo { request, offset, len, .. } => {
            out.extend_from_slice(&request.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        Body::Caching { path, .. } => put_path(out, path),
        Body::Flow { credits } => out.extend_from_slice(&credits.to_le_bytes()),
        Body::BufferMgmt { offset, len } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
    }
    Ok(())
}

/// The encoded size of a message, in bytes.
pub fn encoded_len(message: &Message) -> usize {
    HEADER_BYTES
        + match &message.body {
            Body::Forward { path, .. } => 8 + 2 + path.len(),
            Body::File { data, .. } => 8 + 4 + data.len(),
            Body::FileInfo { .. } => 8 + 8 + 4,
            Body::Caching { path, .. } => 2 + path.len(),
            Body::Flow { .. } => 4,
            Body::BufferMgmt { .. } => 8 + 4,
        }
}

fn put_path(out: &mut Vec<u8>, path: &str) {
    // Length checked against PATH_BYTES_MAX (< u16::MAX) by the caller.
    out.extend_from_slice(&(path.len() as u16).to_le_bytes());
    out.extend_from_slice(path.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.bytes.len() < n {
            return Err(ProtoError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        let b = self.take(8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }
    fn path(&mut self) -> Result<String, ProtoError> {
        let len = self.u16()? as usize;
        if len > PATH_BYTES_MAX {
            return Err(ProtoError::PathTooLong(len));
        }
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::PathNotUtf8)
    }
}

/// Decodes one message that fills `bytes` exactly.
pub fn decode(bytes: &[u8]) -> Result<Message, ProtoError> {
    if bytes.len() < HEADER_BYTES {
        return Err(ProtoError::Short(bytes.len()));
    }
    let (kind, flags) = (bytes[0], bytes[1]);
    if bytes[2] != 0 || bytes[3] != 0 {
        return Err(ProtoError::Reserved);
    }
    let load = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let mut r = Reader { bytes: &bytes[HEADER_BYTES..] };
    let status = || FileStatus::from_u8(flags).ok_or(ProtoError::UnknownStatus(flags));
    let body = match kind {
        1 => Body::Forward { request: r.u64()?, path: r.path()? },
        2 => {
            let status = status()?;
            let request = r.u64()?;
            let len = r.u32()? as usize;
            if len > FILE_BYTES_MAX {
                return Err(ProtoError::FileTooLarge(len));
            }
            Body::File { request, status, data: r.take(len)?.to_vec() }
        }
        3 => Body::FileInfo { status: status()?, request: r.u64()?, offset: r.u64()?, len: r.u32()? },
        4 => {
            let start = match flags {
                0 => false,
                1 => true,
                other => return Err(ProtoError::CachingFlag(other)),
            };
            Body::Caching { start, path: r.path()? }
        }
        5 => Body::Flow { credits: r.u32()? },
        6 => Body::BufferMgmt { offset: r.u64()?, len: r.u32()? },
        other => return Err(ProtoError::UnknownKind(other)),
    };
    if !r.bytes.is_empty() {
        return Err(ProtoError::Trailing(r.bytes.len()));
    }
    if !matches!(body, Body::File { .. } | Body::FileInfo { .. } | Body::Caching { .. }) && flags != 0 {
        return Err(ProtoError::Reserved);
    }
    Ok(Message { load, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_bytes_match_the_documented_layout() {
        // The example in docs/wire-format.md.
        let m = Message { load: 3, body: Body::Forward { request: 0x0102, path: "/a".into() } };
        let bytes = encode(&m).unwrap();
        assert_eq!(bytes, vec![1, 0, 0, 0, 3, 0, 0, 0, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 2, 0, b'/', b'a']);
        assert_eq!(bytes.len(), encoded_len(&m));
        assert_eq!(decode(&bytes).unwrap(), m);
    }

    #[test]
    fn limits_are_refused_both_ways() {
        let long = "x".repeat(PATH_BYTES_MAX + 1);
        let m = Message { load: 0, body: Body::Caching { start: true, path: long } };
        assert_eq!(encode(&m).unwrap_err(), ProtoError::PathTooLong(PATH_BYTES_MAX + 1));
        let mut forged = vec![4, 1, 0, 0, 0, 0, 0, 0];
        forged.extend_from_slice(&((PATH_BYTES_MAX + 1) as u16).to_le_bytes());
        assert_eq!(decode(&forged).unwrap_err(), ProtoError::PathTooLong(PATH_BYTES_MAX + 1));
        let mut forged = vec![2, 0, 0, 0, 0, 0, 0, 0];
        forged.extend_from_slice(&[0; 8]);
        forged.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&forged).unwrap_err(), ProtoError::FileTooLarge(u32::MAX as usize));
        assert_eq!(decode(&[5, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9]).unwrap_err(), ProtoError::Trailing(1));
        assert_eq!(decode(&[5, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).unwrap_err(), ProtoError::Reserved);
        assert_eq!(decode(&[9, 0, 0, 0, 0, 0, 0, 0]).unwrap_err(), ProtoError::UnknownKind(9));
        assert_eq!(decode(&[2, 7, 0, 0, 0, 0, 0, 0]).unwrap_err(), ProtoError::UnknownStatus(7));
        assert_eq!(decode(&[4, 2, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err(), ProtoError::CachingFlag(2));
        assert_eq!(decode(&[5, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err(), ProtoError::Reserved);
        assert_eq!(decode(&[5, 0]).unwrap_err(), ProtoError::Short(2));
    }
}
