//! Test helpers: nodes on loopback in one process (`tierstack_testkit`'s),
//! a freezable TCP proxy to
//! make an owner unresponsive on demand, and a raw wire client.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric_wire::{read_frame, write_frame, Frame};

pub(crate) use tierstack_testkit::nodes::tcp::{cluster, loopback, node};

/// A TCP forwarder in front of an address. `freeze` holds every byte in
/// flight (in both directions) until `thaw`; `freeze_answers` holds only the
/// owner's answers; `sever` cuts every connection.
pub(crate) struct Proxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
}

struct ProxyState {
    /// Whether bytes towards the owner, and towards the client, are held.
    frozen: Mutex<(bool, bool)>,
    thawed: Condvar,
    streams: Mutex<Vec<TcpStream>>,
    /// Flip the byte at this index of the next chunk towards the owner
    /// (a man in the middle altering a frame in flight).
    tamper: Mutex<Option<usize>>,
    /// Every byte forwarded towards the owner, in order.
    captured: Mutex<Vec<u8>>,
}

impl Proxy {
    pub(crate) fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(loopback()).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            frozen: Mutex::new((false, false)),
            thawed: Condvar::new(),
            streams: Mutex::default(),
            tamper: Mutex::new(None),
            captured: Mutex::default(),
        });
        let accept_state = Arc::clone(&state);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                client.set_nodelay(true).unwrap();
                server.set_nodelay(true).unwrap();
                {
                    let mut streams = accept_state.streams.lock().unwrap();
                    streams.push(client.try_clone().unwrap());
                    streams.push(server.try_clone().unwrap());
                }
                let directions =
                    [(client.try_clone().unwrap(), server.try_clone().unwrap(), true), (server, client, false)];
                for (from, to, towards_owner) in directions {
                    let state = Arc::clone(&accept_state);
                    std::thread::spawn(move || pump(from, to, towards_owner, &state));
                }
            }
        });
        Proxy { addr, state }
    }

    pub(crate) fn freeze(&self) {
        *self.state.frozen.lock().unwrap() = (true, true);
    }

    pub(crate) fn freeze_answers(&self) {
        *self.state.frozen.lock().unwrap() = (false, true);
    }

    pub(crate) fn thaw(&self) {
        *self.state.frozen.lock().unwrap() = (false, false);
        self.state.thawed.notify_all();
    }

    /// Flips byte `index` of the next chunk of bytes forwarded to the owner.
    pub(crate) fn tamper_next(&self, index: usize) {
        *self.state.tamper.lock().unwrap() = Some(index);
    }

    /// The bytes forwarded towards the owner so far.
    pub(crate) fn captured(&self) -> Vec<u8> {
        self.state.captured.lock().unwrap().clone()
    }

    pub(crate) fn sever(&self) {
        for stream in self.state.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.thaw();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, towards_owner: bool, state: &ProxyState) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut frozen = state.frozen.lock().unwrap();
        while if towards_owner { frozen.0 } else { frozen.1 } {
            frozen = state.thawed.wait(frozen).unwrap();
        }
        drop(frozen);
        if towards_owner {
            let mut tamper = state.tamper.lock().unwrap();
            if let Some(index) = tamper.take_if(|index| *index < n) {
                buf[index] ^= 0x01;
            }
            state.captured.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// A listener that the kernel accepts connections for but that never reads
/// or answers: an unresponsive owner.
pub(crate) fn black_hole() -> TcpListener {
    TcpListener::bind(loopback()).unwrap()
}

/// A raw client speaking the wire format directly to a fabric's listener.
pub(crate) struct RawClient {
    pub stream: TcpStream,
}

impl RawClient {
    pub(crate) fn connect(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).unwrap();
        // Bounds every read in these tests; a hang fails instead of blocking.
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        RawClient { stream }
    }

    pub(crate) fn hello(addr: SocketAddr, node: NodeId) -> RawClient {
        let mut client = RawClient::connect(addr);
        client.send(&Frame::Hello { node });
        client
    }

    pub(crate) fn send(&mut self, frame: &Frame) {
        write_frame(&mut self.stream, frame).unwrap();
    }

    pub(crate) fn recv(&mut self) -> Frame {
        read_frame(&mut self.stream).unwrap().expect("a frame, not EOF")
    }

    pub(crate) fn call(&mut self, frame: &Frame) -> Frame {
        self.send(frame);
        self.recv()
    }

    /// True once the server has closed the connection (EOF or reset);
    /// false if it is still open when the read timeout passes.
    pub(crate) fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}
