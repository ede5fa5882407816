//! Slow clients cannot hold a listener: a body that does not arrive within
//! the body deadline and a response the client does not take within the
//! write timeout close their connections; a full listener displaces the
//! connection stalled longest, so 10,000 slow clients do not keep a fresh
//! one from being served within the timeout plus one second.

use crate::support::*;
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_tier_http::ServeOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(1);

fn guarded(max_connections: Option<usize>) -> ServeOptions {
    ServeOptions {
        header_read_timeout: Some(TIMEOUT),
        body_read_timeout: Some(TIMEOUT),
        write_timeout: Some(TIMEOUT),
        max_connections,
        ..ServeOptions::default()
    }
}

/// The 10,000-client tests each hold 10,000 sockets; one at a time.
static CROWD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const CROWD_SIZE: usize = 10_000;
/// Below the crowd: a listener that waited for slots in FIFO order would
/// serve the fresh client only after dozens of rounds of timeouts.
const CROWD_LIMIT: usize = 256;
/// Tasks opening the crowd's connections side by side.
const CROWD_OPENERS: usize = 8;
/// Connections opened before waiting for the server to accept them.
const CROWD_BATCH: usize = 1_000;

/// A body trickled a byte at a time is cut at the deadline counted from the
/// head (not at an idle gap: each gap is far shorter than the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_in_by_the_deadline_closes_its_connection() {
    let server = server(guarded(None), Duration::ZERO).await;
    let mut stream = connect_small(server.addr).await;
    stream.write_all(SLOW_BODY).await.unwrap();
    let sent = instant_now();
    let trickle = async {
        loop {
            tokio::time::sleep(TIMEOUT / 10).await;
            if stream.write_all(b"c").await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(TIMEOUT + SLACK, trickle).await;
    assert!(closed_within(&mut stream, SLACK).await, "a trickled body kept its connection past the deadline");
    assert!(sent.elapsed() >= TIMEOUT * 9 / 10, "closed after {:?}, before the deadline", sent.elapsed());
}

/// The deadline covers the body only: a handler that works longer than it
/// after the body is in still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_after_its_body_is_not_cut() {
    let server = server(guarded(None), TIMEOUT * 2).await;
    let mut stream = connect_small(server.addr).await;
    stream
        .write_all(b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(TIMEOUT * 5, stream.read_to_end(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("3 bytes"), "{answer}");
}

/// A client that asks for a large answer and reads none of it is closed
/// once the server's write has waited the write timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_closed_after_the_write_timeout() {
    let mut server = server(guarded(None), Duration::ZERO).await;
    let mut stream = connect_small(server.addr).await;
    stream.write_all(SLOW_READER).await.unwrap();
    let asked = instant_now();
    server.open.wait_for(|open| *open == 1).await.unwrap();
    assert!(server.open_at_most(0, TIMEOUT + SLACK).await, "the silent reader still holds its connection");
    assert!(asked.elapsed() >= TIMEOUT * 9 / 10, "closed after {:?}, before the write timeout", asked.elapsed());
}

/// Full of idle clients, the listener serves a new one at once by closing
/// the client idle longest; the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_displaces_the_longest_stalled_connection() {
    let options = ServeOptions { header_read_timeout: Some(TIMEOUT * 30), max_connections: Some(2), ..guarded(None) };
    let mut server = server(options, Duration::ZERO).await;
    let mut oldest = connect_small(server.addr).await;
    oldest.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    server.open.wait_for(|open| *open == 1).await.unwrap();
    let mut newer = connect_small(server.addr).await;
    newer.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    server.open.wait_for(|open| *open == 2).await.unwrap();
    let answer = tokio::time::timeout(SLACK, fresh_get(server.addr)).await.expect("the fresh client waited").unwrap();
    assert!(answer.ends_with("fresh"), "{answer}");
    assert!(closed_within(&mut oldest, SLACK).await, "the oldest stalled connection was not closed");
    assert!(!closed_now(&mut newer).await, "the newer one was closed too");
}

/// A connection whose handler works is never displaced: a client beyond
/// the limit waits until that answer is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_connection_is_not_displaced() {
    let held = TIMEOUT / 2;
    let server = server(ServeOptions { max_connections: Some(1), ..guarded(None) }, held).await;
    let mut busy = connect_small(server.addr).await;
    busy.write_all(b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\na").await.unwrap();
    server.held_entered.notified().await;
    let started = instant_now();
    let answer = tokio::time::timeout(held + SLACK, fresh_get(server.addr)).await.unwrap().unwrap();
    assert!(answer.ends_with("fresh"), "{answer}");
    let mut busy_answer = Vec::new();
    busy.read_to_end(&mut busy_answer).await.unwrap();
    assert!(String::from_utf8_lossy(&busy_answer).ends_with("1 bytes"), "the working connection was cut");
    assert!(started.elapsed() >= held * 9 / 10, "the fresh client did not wait for the working one");
}

/// One more connection than the per-client cap is closed at once; those
/// within it are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_per_client_cap_are_closed() {
    let options = ServeOptions { max_connections_per_client: Some(2), ..guarded(None) };
    let mut server = server(options, Duration::ZERO).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_small(server.addr).await;
        stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(stream);
    }
    server.open.wait_for(|open| *open == 2).await.unwrap();
    let mut third = connect_small(server.addr).await;
    assert!(closed_within(&mut third, SLACK).await, "a third connection from one address was kept");
    drop(held);
    assert!(server.open_at_most(0, SLACK).await);
    let answer = tokio::time::timeout(SLACK, fresh_get(server.addr)).await.unwrap().unwrap();
    assert!(answer.ends_with("fresh"), "a closed connection did not free its place: {answer}");
}

/// Opens `CROWD_SIZE` connections that each send `request` and then
/// neither finish it nor read; then a fresh client must be served within
/// the timeout plus one second, and the server must have closed every slow
/// connection within that bound too. Returns the fresh client's wait.
async fn crowd_then_fresh(request: &'static [u8]) -> Duration {
    let _one_crowd_at_a_time = CROWD.lock().await;
    let mut server = server(guarded(Some(CROWD_LIMIT)), Duration::ZERO).await;
    let opening = instant_now();
    let mut crowd = Vec::with_capacity(CROWD_SIZE);
    // In batches that fit the listen backlog: a burst beyond it would wait
    // for the kernel's SYN retries (a second and more), whatever the server.
    for batch in 1..=CROWD_SIZE / CROWD_BATCH {
        let mut openers = tokio::task::JoinSet::new();
        for _ in 0..CROWD_OPENERS {
            let addr = server.addr;
            openers.spawn(async move {
                let mut streams = Vec::with_capacity(CROWD_BATCH / CROWD_OPENERS);
                for _ in 0..CROWD_BATCH / CROWD_OPENERS {
                    let mut stream = connect_small(addr).await;
                    stream.write_all(request).await.unwrap();
                    streams.push(stream);
                }
                streams
            });
        }
        while let Some(streams) = openers.join_next().await {
            crowd.extend(streams.unwrap());
        }
        // Each of the crowd is a client too: all are accepted within the
        // bound (a listener that let them wait in the backlog for slots
        // would take a round of timeouts per CROWD_LIMIT of them).
        let accepted = tokio::time::timeout(TIMEOUT + SLACK, server.accepted.wait_for(|n| *n >= batch * CROWD_BATCH))
            .await
            .is_ok();
        assert!(accepted, "{} of {} accepted", *server.accepted.borrow(), batch * CROWD_BATCH);
    }
    // Those displaced to make room are closed: the limit is full of the latest.
    assert!(server.open_at_most(CROWD_LIMIT, TIMEOUT + SLACK).await, "{} open", *server.open.borrow());
    eprintln!("{CROWD_SIZE} slow clients connected and accepted in {:?}", opening.elapsed());
    let started = instant_now();
    let answer = tokio::time::timeout(TIMEOUT + SLACK, fresh_get(server.addr))
        .await
        .expect("a fresh client was not served within the timeout plus one second")
        .unwrap();
    let waited = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("fresh"), "{answer}");
    assert!(server.open_at_most(0, TIMEOUT + SLACK).await, "{} slow connections still open", *server.open.borrow());
    server.stop.stop();
    waited
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_slow_bodies_do_not_lock_out_a_fresh_client() {
    let waited = crowd_then_fresh(SLOW_BODY).await;
    eprintln!("fresh client served after {waited:?} beside {CROWD_SIZE} slow bodies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_slow_readers_do_not_lock_out_a_fresh_client() {
    let waited = crowd_then_fresh(SLOW_READER).await;
    eprintln!("fresh client served after {waited:?} beside {CROWD_SIZE} slow readers");
}
