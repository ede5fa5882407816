//! Real hand-off of client connections between processes on one host: the
//! accepting process reads the request's header block, decides where it is
//! served, and passes the client's socket (`SCM_RIGHTS` over a Unix
//! datagram socket) together with the bytes it already read; the receiving
//! process serves the connection as if it had accepted it, answering the
//! client directly on its own connection.
//!
//! Datagram layout (this host only, both ends this crate):
//! `kind u8 | from u16 LE | load u32 LE | reply-path length u16 LE | reply path | request bytes`,
//! with exactly one descriptor attached. `reply path` (may be empty) is where
//! the receiver sends a [`DONE_LEN`]-byte `done` datagram (`b'D'`, its
//! index as u16 LE) when the connection ends: the dispatcher's load count.

use bytes::{Buf, Bytes};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Longest request header block read before the decision.
pub const HEAD_MAX: usize = 16 * 1024;
/// Longest wait for a client's header block.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest hand-off datagram received.
const DATAGRAM_MAX: usize = HEAD_MAX + 4096;
/// A `done` datagram's length.
pub const DONE_LEN: usize = 3;

/// A hand-off datagram's fixed header: kind, from, load, reply length.
const HEADER: usize = 9;

/// The kind byte of a hand-off datagram.
pub const KIND_HANDOFF: u8 = b'H';

/// The hand-off socket of node `index` under `dir`.
pub fn socket_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("press-ho-{index}.sock"))
}

/// What reading a request's header block can end with.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("reading the request: {0}")]
    Io(#[from] io::Error),
    #[error("the client closed before a whole request header")]
    Closed,
    #[error("the request header is longer than {HEAD_MAX} bytes")]
    TooLong,
    #[error("no request header within {HEAD_TIMEOUT:?}")]
    Timeout,
    #[error("malformed request line")]
    Malformed,
}

/// A request's header block as read off the client's connection: the bytes
/// (handed on with the socket) and the request target's path.
pub struct Head {
    pub bytes: Bytes,
    pub path: String,
}

/// Reads up to the end of the first request's header block (bounded in
/// size and time) and returns the bytes read and the target's path.
pub async fn read_head(stream: &mut TcpStream) -> Result<Head, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok::<usize, HeadError>(end);
            }
            if buf.len() >= HEAD_MAX {
                return Err(HeadError::TooLong);
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(HeadError::Closed);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let end = tokio::time::timeout(HEAD_TIMEOUT, read).await.map_err(|_| HeadError::Timeout)??;
    let line = buf[..end].split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (_method, target) = (parts.next(), parts.next().ok_or(HeadError::Malformed)?);
    let target = std::str::from_utf8(target).map_err(|_| HeadError::Malformed)?;
    // An absolute-form target keeps only its path.
    let path = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map(|i| &rest[i..]).unwrap_or("/"),
        None => target,
    };
    let path = path.split('?').next().unwrap_or(path).to_string();
    Ok(Head { bytes: Bytes::from(buf), path })
}

/// A connection whose first bytes were already read: they are read again
/// first, then the socket. Writes go straight to the socket.
pub struct Prefixed {
    prefix: Bytes,
    inner: TcpStream,
}

impl Prefixed {
    pub fn new(prefix: Bytes, inner: TcpStream) -> Self {
        Prefixed { prefix, inner }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(out.remaining());
            out.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, out)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A hand-off datagram's fields.
#[derive(Debug, PartialEq, Eq)]
pub struct Handoff {
    /// The sending node's index (the dispatcher sends `u16::MAX`).
    pub from: u16,
    pub load: u32,
    pub reply: Option<PathBuf>,
    pub request: Bytes,
}

/// Encodes a hand-off datagram's payload.
pub fn encode(from: u16, load: u32, reply: Option<&Path>, request: &[u8]) -> Result<Vec<u8>, io::Error> {
    use std::os::unix::ffi::OsStrExt;
    let reply = reply.map(|p| p.as_os_str().as_bytes()).unwrap_or_default();
    let reply_len =
        u16::try_from(reply.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "reply path too long"))?;
    let mut out = Vec::with_capacity(HEADER + reply.len() + request.len());
    out.push(KIND_HANDOFF);
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&load.to_le_bytes());
    out.extend_from_slice(&reply_len.to_le_bytes());
    out.extend_from_slice(reply);
    out.extend_from_slice(request);
    Ok(out)
}

/// Decodes a hand-off datagram's payload; `None` if it is not one.
pub fn decode(payload: &[u8]) -> Option<Handoff> {
    use std::os::unix::ffi::OsStrExt;
    if payload.len() < HEADER || payload[0] != KIND_HANDOFF {
        return None;
    }
    let from = u16::from_le_bytes(payload[1..3].try_into().ok()?);
    let load = u32::from_le_bytes(payload[3..7].try_into().ok()?);
    let reply_len = usize::from(u16::from_le_bytes(payload[7..9].try_into().ok()?));
    let reply = payload.get(HEADER..HEADER + reply_len)?;
    let request = payload.get(HEADER + reply_len..)?;
    let reply = (!reply.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(reply)));
    Some(Handoff { from, load, reply, request: Bytes::copy_from_slice(request) })
}

/// A `done` datagram for back-end `index`.
pub fn done_datagram(index: u16) -> [u8; DONE_LEN] {
    let i = index.to_le_bytes();
    [b'D', i[0], i[1]]
}

/// The back-end index a `done` datagram names.
pub fn parse_done(payload: &[u8]) -> Option<u16> {
    match payload {
        [b'D', a, b] => Some(u16::from_le_bytes([*a, *b])),
        _ => None,
    }
}

/// Sends `payload` with the descriptor `fd` attached on `socket` (connected
/// to the receiver's hand-off socket).
pub fn send_fd(socket: &UnixDatagram, fd: RawFd, payload: &[u8]) -> io::Result<()> {
    let fd_len = std::mem::size_of::<RawFd>() as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    // u64 words: the control buffer must be aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: an all-zero msghdr is valid (null name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at a control buffer of CMSG_SPACE(fd_len) bytes,
    // so the first header and its data (CMSG_LEN(fd_len) bytes) lie inside
    // it; the write is unaligned-safe.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_len) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` and everything it points at live across the call.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != payload.len() {
        return Err(io::Error::other("hand-off datagram truncated"));
    }
    Ok(())
}

/// Receives one datagram and the descriptors attached to it (close-on-exec).
/// A datagram without a descriptor returns `None` for it; descriptors beyond
/// the first are closed.
pub fn recv_fd(socket: &UnixDatagram) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; DATAGRAM_MAX];
    let fd_len = std::mem::size_of::<RawFd>() as u32;
    // SAFETY: pure size computation; room for four descriptors.
    let space = unsafe { libc::CMSG_SPACE(4 * fd_len) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as in `send_fd`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the buffers `msg` names live across the call.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of `control`; the
    // CMSG_* walk stays inside them, and SCM_RIGHTS data are descriptors
    // now owned by this process (each wrapped once in an OwnedFd).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    buf.truncate(n as usize);
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::other("hand-off datagram larger than the receive buffer"));
    }
    Ok((buf, fds.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_descriptor_and_its_payload_cross_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path(), 3);
        let receiver = UnixDatagram::bind(&path).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.connect(&path).unwrap();
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let payload = encode(2, 7, Some(Path::new("/tmp/x.sock")), b"GET / HTTP/1.1\r\n\r\n").unwrap();
        send_fd(&sender, b.as_raw_fd(), &payload).unwrap();
        drop(b);
        let (got, fd) = recv_fd(&receiver).unwrap();
        let handoff = decode(&got).unwrap();
        assert_eq!((handoff.from, handoff.load), (2, 7));
        assert_eq!(handoff.reply.as_deref(), Some(Path::new("/tmp/x.sock")));
        assert_eq!(&handoff.request[..], b"GET / HTTP/1.1\r\n\r\n");
        // The received descriptor is the same connection.
        let mut b = std::os::unix::net::UnixStream::from(fd.unwrap());
        b.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        a.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }

    #[test]
    fn bad_datagrams_decode_to_none() {
        assert!(decode(b"").is_none());
        assert!(decode(b"X\0\0\0\0\0\0\0\0").is_none());
        assert!(decode(&[KIND_HANDOFF, 0, 0, 0, 0, 0, 0, 9, 0, b'a']).is_none(), "reply path cut");
        assert_eq!(parse_done(&done_datagram(513)), Some(513));
        assert_eq!(parse_done(b"D\0"), None);
    }
}
