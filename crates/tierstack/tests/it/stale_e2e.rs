//! `tierstack proxy --serve-stale-on-error SECONDS` as a process: the flag
//! reaches the proxy. An origin answers one already-stale response, then
//! is gone (its listener closed: connections refused); without the flag
//! the next request is a 502, with it the stored copy answers. (What the
//! grace may and may not serve is in `proxy/tests/it/rfc9111/stale_on_error.rs`.)

use crate::exe;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use tierstack_deploy::process::free_loopback_port;
use tierstack_testkit::child::ChildProcess;

const STEP: Duration = Duration::from_secs(30);

/// One HTTP/1.1 GET on a fresh connection: status and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(STEP)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string())
}

/// An origin that answers one request with a response stale by 30 s on
/// arrival, then closes its listener.
fn one_shot_origin() -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(STEP)).unwrap();
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            request.push(byte[0]);
        }
        let answer = "HTTP/1.1 200 OK\r\nCache-Control: max-age=30\r\nAge: 60\r\nContent-Length: 6\r\n\
                      Connection: close\r\n\r\nstored";
        stream.write_all(answer.as_bytes()).unwrap();
    });
    (addr, served)
}

#[test]
fn the_grace_flag_serves_the_stored_copy_once_the_origin_is_gone() {
    for (grace, expected) in [(None, (502, None)), (Some("3600"), (200, Some("stored")))] {
        let (origin, served) = one_shot_origin();
        let listen = free_loopback_port().unwrap();
        let mut args = vec!["proxy".to_string(), "--listen".into(), listen.to_string()];
        args.extend(["--upstream".into(), format!("http://{origin}"), "--mode".into(), "ttl".into()]);
        if let Some(grace) = grace {
            args.extend(["--serve-stale-on-error".into(), grace.to_string()]);
        }
        let mut proxy = ChildProcess::tierstack(&exe(), &args);
        proxy.wait_ready();
        assert_eq!(get(listen, "/r"), (200, "stored".to_string()), "the first answer, stored");
        served.join().unwrap();
        let (status, body) = get(listen, "/r");
        assert_eq!(status, expected.0, "grace {grace:?}: {body}");
        if let Some(stored) = expected.1 {
            assert_eq!(body, stored);
        }
    }
}
