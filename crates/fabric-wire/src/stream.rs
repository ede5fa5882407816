//! Frames on a blocking byte stream: the length prefix, bounded before
//! anything is allocated, shared by the codec's frames and the handshake's.

use crate::{decode, try_encode, Frame, WireError, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES};
use std::io::{self, Read, Write};

/// Encodes `frame` and writes it with one `write_all` (one syscall on an
/// unbuffered socket). A frame over [`FRAME_BYTES_MAX`] is refused with
/// `InvalidInput` and nothing is written.
pub fn write_frame(w: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let bytes = try_encode(frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    w.write_all(&bytes)
}

/// Reads one frame. Returns `Ok(None)` on a clean end of stream before the
/// first byte of a frame, `Truncated` on an end of stream inside one, and
/// `TooLarge` — before allocating — for a prefix over [`FRAME_BYTES_MAX`].
/// Wrap sockets in a `BufReader` so a small frame costs one `read` syscall.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, WireError> {
    let mut body = Vec::new();
    if !read_frame_body(r, &mut body)? {
        return Ok(None);
    }
    decode(&body).map(Some)
}

/// Reads one frame's body (the bytes after the length prefix, kind byte
/// first) into `body`, reusing its allocation, for [`decode`] or
/// [`crate::decode_borrowed`]. Returns `Ok(false)` on a clean end of stream before
/// the first byte of a frame; otherwise fails as [`read_frame`] does, and
/// likewise never allocates for a prefix over [`FRAME_BYTES_MAX`].
pub fn read_frame_body(r: &mut impl Read, body: &mut Vec<u8>) -> Result<bool, WireError> {
    let len = match read_length_prefix(r) {
        Ok(Some(len)) => len,
        Ok(None) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(WireError::Truncated),
        Err(e) => return Err(WireError::Io(e)),
    };
    if len > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge { len });
    }
    if len == 0 {
        return Err(WireError::Malformed("empty frame (no kind byte)".to_string()));
    }
    body.clear();
    body.resize(len, 0);
    r.read_exact(body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => WireError::Truncated,
        _ => WireError::Io(e),
    })?;
    Ok(true)
}

/// Reads a frame's length prefix: `None` at a clean end of stream before
/// its first byte, `UnexpectedEof` at an end inside it; an interrupted read
/// goes on. Checking the length against a bound is the caller's.
pub(crate) fn read_length_prefix(r: &mut impl Read) -> io::Result<Option<usize>> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let mut filled = 0;
    while filled < prefix.len() {
        match r.read(&mut prefix[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(u32::from_le_bytes(prefix) as usize))
}
