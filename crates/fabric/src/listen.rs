//! What the socket-bootstrapped backends (`tcp`, `ucx`) share when a node
//! opens: the checks on its configuration and its listening socket; and
//! the one wait for a socket to become ready.

use crate::{FabricError, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;
use tierstack_base::limits::NODES_MAX;
use tierstack_base::NodeId;

/// A node's bound listener and the two addresses it is known by.
#[derive(Debug)]
pub struct Listening {
    pub listener: TcpListener,
    /// The address bound (the real port when asked for port 0).
    pub local_addr: SocketAddr,
    /// `local_addr` with an unspecified IP replaced by loopback: how the
    /// node connects to itself (to wake its own `accept`, or to reach its
    /// own regions through the same path as a peer's).
    pub self_addr: SocketAddr,
}

/// Checks `node` and `op_timeout` as every socket backend requires, then
/// binds `listen`. Errors name the address and the node.
pub fn bind_node(node: NodeId, listen: SocketAddr, op_timeout: Duration) -> Result<Listening> {
    if node.0 >= NODES_MAX {
        return Err(FabricError::UnknownNode { node });
    }
    if op_timeout.is_zero() {
        return Err(FabricError::Io("op_timeout must be positive".to_string()));
    }
    let listener =
        TcpListener::bind(listen).map_err(|e| FabricError::Io(format!("binding {listen} for {node}: {e}")))?;
    let local_addr = listener.local_addr()?;
    Ok(Listening { listener, local_addr, self_addr: loopback_for(local_addr) })
}

/// `addr` with an unspecified IP (`0.0.0.0`, `::`) replaced by loopback of
/// the same family; any other address unchanged.
pub fn loopback_for(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

/// Waits until `stream` is ready for `events` (`libc::POLLIN`,
/// `libc::POLLOUT`) or hung up: `Ok(true)`; `Ok(false)` when `timeout`
/// (`None`: no bound) passes first. An interrupted wait goes on.
pub fn wait_ready(stream: &TcpStream, events: libc::c_short, timeout: Option<Duration>) -> std::io::Result<bool> {
    let mut fd = libc::pollfd { fd: stream.as_raw_fd(), events, revents: 0 };
    let timeout_ms = timeout.map_or(-1, |t| libc::c_int::try_from(t.as_millis()).unwrap_or(libc::c_int::MAX));
    loop {
        // SAFETY: one valid pollfd, for a socket the caller holds open.
        match unsafe { libc::poll(&mut fd, 1, timeout_ms) } {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_become_loopback_of_their_family() {
        let v4: SocketAddr = "0.0.0.0:7".parse().unwrap();
        let v6: SocketAddr = "[::]:7".parse().unwrap();
        let other: SocketAddr = "10.0.0.1:7".parse().unwrap();
        assert_eq!(loopback_for(v4), "127.0.0.1:7".parse().unwrap());
        assert_eq!(loopback_for(v6), "[::1]:7".parse().unwrap());
        assert_eq!(loopback_for(other), other);
    }

    #[test]
    fn a_socket_is_ready_once_its_peer_writes_and_not_before() {
        use std::io::Write;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(!wait_ready(&server, libc::POLLIN, Some(Duration::from_millis(1))).unwrap(), "nothing was sent");
        assert!(wait_ready(&server, libc::POLLOUT, Some(Duration::from_millis(1))).unwrap());
        client.write_all(b"x").unwrap();
        assert!(wait_ready(&server, libc::POLLIN, None).unwrap());
    }

    #[test]
    fn bad_node_ids_and_zero_timeouts_are_refused_before_binding() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(matches!(
            bind_node(NodeId(NODES_MAX), any, Duration::from_secs(1)),
            Err(FabricError::UnknownNode { .. })
        ));
        assert!(matches!(bind_node(NodeId(0), any, Duration::ZERO), Err(FabricError::Io(_))));
        let bound = bind_node(NodeId(0), any, Duration::from_secs(1)).unwrap();
        assert_ne!(bound.local_addr.port(), 0);
        assert_eq!(bound.self_addr, bound.local_addr);
    }
}
