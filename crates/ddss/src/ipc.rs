//! IPC management (the paper's Fig. 2): several processes of one node share
//! the substrate through the node's daemon.
//!
//! - **Control path:** a Unix stream socket served by [`DdssDaemon`], one
//!   JSON object per line each way (below). Allocation and release go here,
//!   so a node's processes share one region and one placement policy.
//! - **Data path:** shared memory. A client attaches its own fabric endpoint
//!   ([`DdssClient::attach_data_path`], which calls [`Ddss::attach`]) and gets
//!   and puts one-sidedly on the members' regions: with the `shm` backend
//!   those are plain loads, stores and atomics on the mapped region files,
//!   no daemon involved. A client without a fabric endpoint may instead send
//!   `get`/`put` over the socket (the daemon performs them): slower, same
//!   semantics, since the key carries its coherence model.
//!
//! # Wire (JSON lines, UTF-8, each line at most [`IPC_LINE_BYTES_MAX`] bytes)
//! Requests:
//! ```text
//! {"op":"hello"}
//! {"op":"allocate","bytes":64,"placement":"local"|"auto"|"node:3","coherence":"null"|"temporal:<ms>"|"delta:<n>"|"read"|"write"|"strict"}
//! {"op":"free","key":"<48 hex digits>"}
//! {"op":"put","key":"<key>","value":"<hex bytes>"}
//! {"op":"get","key":"<key>"}
//! ```
//! Responses (one per request, in order):
//! ```text
//! {"ok":true,"node":0,"backend":"shm","region":"ddss","members":[0,1,2]}   hello
//! {"ok":true,"key":"<key>"}                                               allocate
//! {"ok":true}                                                             free
//! {"ok":true,"version":3}                                                 put
//! {"ok":true,"version":3,"value":"<hex>"}                                 get
//! {"ok":false,"error":"<kind>","message":"<text>", "key":.., "node":.., "class_bytes":..}
//! ```
//! `error` is [`DdssError::kind`] (`region_full`, `key_freed`, `unknown_key`,
//! `lock_busy`, `value_lost`, `bad_request`, ...); the client turns the common kinds back
//! into typed errors. A malformed line gets a `bad_request` answer and the
//! connection stays open; a line over the limit closes the connection.

use crate::error::{DdssError, Result};
use crate::key::{hex, unhex, Coherence, Key, Placement};
use crate::metrics::DaemonMetrics;
use crate::substrate::{Ddss, DdssConfig};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tierstack_base::NodeId;
use tierstack_fabric::Fabric;

/// Longest request or response line (a 1 MiB value is 2 MiB of hex).
pub const IPC_LINE_BYTES_MAX: usize = 4 << 20;
/// Most client connections a daemon serves at once; more are refused.
pub const IPC_CLIENTS_MAX: usize = 64;

/// A request on the control socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Hello,
    Allocate { bytes: u64, placement: Placement, coherence: Coherence },
    Free { key: Key },
    Put { key: Key, value: String },
    Get { key: Key },
}

/// A response on the control socket; fields not used by a reply are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<NodeId>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Key>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_bytes: Option<u32>,
}

impl Response {
    fn ok() -> Self {
        Response { ok: true, ..Default::default() }
    }

    fn failure(error: &DdssError) -> Self {
        let mut response = Response {
            ok: false,
            error: Some(error.kind().to_string()),
            message: Some(error.to_string()),
            ..Default::default()
        };
        match error {
            DdssError::KeyFreed { key } | DdssError::LockBusy { key, .. } | DdssError::ValueLost { key } => {
                response.key = Some(*key)
            }
            DdssError::RegionFull { node, class_bytes } => {
                response.node = Some(*node);
                response.class_bytes = Some(*class_bytes);
            }
            _ => {}
        }
        response
    }

    fn bad_request(message: String) -> Self {
        Response { ok: false, error: Some("bad_request".into()), message: Some(message), ..Default::default() }
    }

    /// The typed error this failure response carries.
    fn into_error(self) -> DdssError {
        let kind = self.error.unwrap_or_default();
        let message = self.message.unwrap_or_default();
        match (kind.as_str(), self.key, self.node, self.class_bytes) {
            ("key_freed", Some(key), _, _) => DdssError::KeyFreed { key },
            ("value_lost", Some(key), _, _) => DdssError::ValueLost { key },
            ("region_full", _, Some(node), Some(class_bytes)) => DdssError::RegionFull { node, class_bytes },
            ("unknown_key", _, _, _) => DdssError::UnknownKey { key: String::new(), reason: message },
            _ => DdssError::Daemon { kind, message },
        }
    }
}

/// Executes one request on the daemon's substrate. Pure dispatch: no I/O
/// beyond what the substrate does, so it is tested without a socket.
pub fn handle(ddss: &Ddss, request: Request) -> Response {
    let result = match request {
        Request::Hello => Ok(Response {
            node: Some(ddss.node()),
            backend: Some(ddss.backend_name().to_string()),
            region: Some(ddss.config().region_name.clone()),
            members: Some(ddss.members()),
            ..Response::ok()
        }),
        Request::Allocate { bytes, placement, coherence } => {
            ddss.allocate(bytes, placement, coherence).map(|key| Response { key: Some(key), ..Response::ok() })
        }
        Request::Free { key } => ddss.free(key).map(|()| Response::ok()),
        Request::Put { key, value } => match unhex(&value) {
            Some(bytes) => ddss.put(key, &bytes).map(|version| Response { version: Some(version), ..Response::ok() }),
            None => return Response::bad_request("value is not hexadecimal".into()),
        },
        Request::Get { key } => ddss.get(key).map(|(version, bytes)| Response {
            version: Some(version),
            value: Some(hex(&bytes)),
            ..Response::ok()
        }),
    };
    result.unwrap_or_else(|e| Response::failure(&e))
}

/// Reads one line of at most `max` bytes. `Ok(None)` at end of stream.
fn read_line_bounded(reader: &mut impl BufRead, max: usize) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let read = reader.take(max as u64 + 1).read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        let reason = if line.len() > max { "line too long" } else { "connection closed mid-line" };
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, reason));
    }
    line.pop();
    String::from_utf8(line).map(Some).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// The daemon: serves a node's [`Ddss`] to local processes.
pub struct DdssDaemon;

/// Open client connections, so that stopping can close them.
type Connections = Arc<Mutex<HashMap<u64, UnixStream>>>;

impl DdssDaemon {
    /// Listens on `socket_path` (a stale socket file of a dead daemon is
    /// replaced; a live one is an error) and serves until the handle stops.
    pub fn serve(ddss: Arc<Ddss>, socket_path: impl AsRef<Path>) -> Result<DaemonHandle> {
        let path = socket_path.as_ref().to_path_buf();
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(DdssError::Ipc(format!("a daemon already listens on {}", path.display())));
            }
            std::fs::remove_file(&path).map_err(|e| DdssError::Ipc(format!("removing stale socket: {e}")))?;
        }
        let listener =
            UnixListener::bind(&path).map_err(|e| DdssError::Ipc(format!("bind {}: {e}", path.display())))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let connections: Connections = Arc::default();
        let metrics = Arc::new(DaemonMetrics::default());
        let accept = {
            let (stopping, connections, metrics) = (stopping.clone(), connections.clone(), metrics.clone());
            std::thread::Builder::new()
                .name(format!("ddss-daemon-{}", ddss.node().0))
                .spawn(move || accept_loop(listener, ddss, stopping, connections, metrics))
                .map_err(|e| DdssError::Ipc(format!("spawning the accept thread: {e}")))?
        };
        Ok(DaemonHandle { path, stopping, connections, metrics, accept: Some(accept) })
    }
}

fn lock_connections(connections: &Connections) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
    connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn accept_loop(
    listener: UnixListener,
    ddss: Arc<Ddss>,
    stopping: Arc<AtomicBool>,
    connections: Connections,
    metrics: Arc<DaemonMetrics>,
) {
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if stopping.load(Ordering::Acquire) {
            break;
        }
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed on the DDSS socket");
                continue;
            }
        };
        next_id += 1;
        let id = next_id;
        {
            let mut open = lock_connections(&connections);
            if open.len() >= IPC_CLIENTS_MAX {
                drop(open);
                let refusal = Response::bad_request(format!("the daemon serves at most {IPC_CLIENTS_MAX} clients"));
                let _ = write_response(&mut stream, &refusal);
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => open.insert(id, clone),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot track a DDSS client connection");
                    continue;
                }
            };
        }
        let (ddss, connections, serving_metrics) = (ddss.clone(), connections.clone(), metrics.clone());
        metrics.client_opened();
        let spawned = std::thread::Builder::new().name("ddss-client".into()).spawn(move || {
            if let Err(e) = serve_client(stream, &ddss, &serving_metrics) {
                tracing::debug!(error = %e, "DDSS client connection ended");
            }
            lock_connections(&connections).remove(&id);
            serving_metrics.client_closed();
        });
        if let Err(e) = spawned {
            metrics.client_closed();
            tracing::error!(error = %e, "cannot start a DDSS client thread");
        }
    }
}

fn write_response(stream: &mut UnixStream, response: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(response).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Serves one connection until it closes, breaks the line limit, or the
/// daemon stops (which shuts the socket down under the blocked read).
fn serve_client(stream: UnixStream, ddss: &Ddss, metrics: &DaemonMetrics) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(line) = read_line_bounded(&mut reader, IPC_LINE_BYTES_MAX)? {
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(request) => metrics.count(request, |request| handle(ddss, request), |response| !response.ok),
            Err(e) => {
                metrics.malformed();
                Response::bad_request(format!("cannot parse request: {e}"))
            }
        };
        write_response(&mut writer, &response)?;
    }
    Ok(())
}

/// A running daemon. Dropping it stops it.
pub struct DaemonHandle {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    connections: Connections,
    metrics: Arc<DaemonMetrics>,
    accept: Option<JoinHandle<()>>,
}

impl DaemonHandle {
    /// The daemon's counters (they outlive it).
    pub fn metrics(&self) -> Arc<DaemonMetrics> {
        self.metrics.clone()
    }

    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Client connections open now.
    pub fn clients(&self) -> usize {
        lock_connections(&self.connections).len()
    }

    /// Stops accepting, closes every client connection and removes the socket file.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(accept) = self.accept.take() {
            // Wake the accept loop so it sees the flag.
            let _ = UnixStream::connect(&self.path);
            let _ = accept.join();
            let _ = std::fs::remove_file(&self.path);
        }
        for (_, stream) in lock_connections(&self.connections).drain() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What a daemon said about itself in `hello`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonInfo {
    pub node: NodeId,
    pub backend: String,
    pub region: String,
    pub members: Vec<NodeId>,
}

/// A process's connection to its node's daemon.
pub struct DdssClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    info: DaemonInfo,
}

impl DdssClient {
    /// Connects and says hello.
    pub fn connect(socket_path: impl AsRef<Path>) -> Result<Self> {
        let path = socket_path.as_ref();
        let stream =
            UnixStream::connect(path).map_err(|e| DdssError::Ipc(format!("connect {}: {e}", path.display())))?;
        let writer = stream.try_clone().map_err(|e| DdssError::Ipc(e.to_string()))?;
        let placeholder =
            DaemonInfo { node: NodeId(0), backend: String::new(), region: String::new(), members: vec![] };
        let mut client = Self { reader: BufReader::new(stream), writer, info: placeholder };
        let hello = client.call(&Request::Hello)?;
        client.info = DaemonInfo {
            node: hello.node.ok_or_else(|| DdssError::Ipc("hello without node".into()))?,
            backend: hello.backend.unwrap_or_default(),
            region: hello.region.unwrap_or_default(),
            members: hello.members.unwrap_or_default(),
        };
        Ok(client)
    }

    pub fn info(&self) -> &DaemonInfo {
        &self.info
    }

    /// Sends one request and reads its response; a failure response becomes
    /// a typed error.
    pub fn call(&mut self, request: &Request) -> Result<Response> {
        let mut line = serde_json::to_vec(request).map_err(|e| DdssError::Ipc(e.to_string()))?;
        line.push(b'\n');
        let sent = self.writer.write_all(&line);
        // Even if sending failed, the daemon may have said why before it
        // closed the connection (e.g. a refusal at its client limit).
        let answer = match read_line_bounded(&mut self.reader, IPC_LINE_BYTES_MAX) {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                return Err(DdssError::Ipc(match sent {
                    Err(e) => format!("send: {e}"),
                    Ok(()) => "the daemon closed the connection".into(),
                }))
            }
            Err(e) => return Err(DdssError::Ipc(format!("receive: {e}"))),
        };
        let response: Response =
            serde_json::from_str(&answer).map_err(|e| DdssError::Ipc(format!("bad response {answer:?}: {e}")))?;
        if response.ok {
            Ok(response)
        } else {
            Err(response.into_error())
        }
    }

    pub fn allocate(&mut self, bytes: u64, placement: Placement, coherence: Coherence) -> Result<Key> {
        self.call(&Request::Allocate { bytes, placement, coherence })?
            .key
            .ok_or_else(|| DdssError::Ipc("allocate answered without a key".into()))
    }

    pub fn free(&mut self, key: Key) -> Result<()> {
        self.call(&Request::Free { key }).map(|_| ())
    }

    /// A put performed by the daemon (the fallback data path).
    pub fn put(&mut self, key: Key, value: &[u8]) -> Result<u64> {
        self.call(&Request::Put { key, value: hex(value) })?
            .version
            .ok_or_else(|| DdssError::Ipc("put answered without a version".into()))
    }

    /// A get performed by the daemon (the fallback data path).
    pub fn get(&mut self, key: Key) -> Result<(u64, Vec<u8>)> {
        let response = self.call(&Request::Get { key })?;
        let version = response.version.ok_or_else(|| DdssError::Ipc("get answered without a version".into()))?;
        let value = response
            .value
            .as_deref()
            .and_then(unhex)
            .ok_or_else(|| DdssError::Ipc("get answered without a hex value".into()))?;
        Ok((version, value))
    }

    /// The shared-memory data path: a handle that gets and puts one-sidedly
    /// through `fabric` (this process's own endpoint, e.g. an `shm` fabric
    /// opened under the cluster's root with a node id of its own), on the
    /// region name and members the daemon announced.
    pub fn attach_data_path(&self, fabric: Arc<dyn Fabric>) -> Result<Ddss> {
        if fabric.backend_name() != self.info.backend {
            return Err(DdssError::Config(format!(
                "the daemon runs on the {} fabric; this endpoint is {}",
                self.info.backend,
                fabric.backend_name()
            )));
        }
        let config =
            DdssConfig::default().with_region_name(self.info.region.clone()).with_members(self.info.members.clone());
        Ddss::attach(fabric, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_wire_form() {
        let key: Key = "000000020000014000000001000300000000000000000000".parse().unwrap();
        let cases = [
            (Request::Hello, r#"{"op":"hello"}"#.to_string()),
            (
                Request::Allocate { bytes: 64, placement: Placement::Node(NodeId(3)), coherence: Coherence::Read },
                r#"{"op":"allocate","bytes":64,"placement":"node:3","coherence":"read"}"#.to_string(),
            ),
            (Request::Free { key }, format!(r#"{{"op":"free","key":"{key}"}}"#)),
            (Request::Put { key, value: "0aff".into() }, format!(r#"{{"op":"put","key":"{key}","value":"0aff"}}"#)),
            (Request::Get { key }, format!(r#"{{"op":"get","key":"{key}"}}"#)),
        ];
        for (request, wire) in cases {
            assert_eq!(serde_json::to_string(&request).unwrap(), wire);
            assert_eq!(serde_json::from_str::<Request>(&wire).unwrap(), request);
        }
        assert_eq!(
            serde_json::to_string(&Response { version: Some(3), ..Response::ok() }).unwrap(),
            r#"{"ok":true,"version":3}"#
        );
    }

    #[test]
    fn failure_responses_round_trip_to_typed_errors() {
        let full = DdssError::RegionFull { node: NodeId(2), class_bytes: 64 };
        assert_eq!(Response::failure(&full).into_error(), full);
        let key: Key = "000000020000014000000001000300000000000000000000".parse().unwrap();
        let freed = DdssError::KeyFreed { key };
        assert_eq!(Response::failure(&freed).into_error(), freed);
        let lost = DdssError::ValueLost { key };
        assert_eq!(Response::failure(&lost).into_error(), lost);
        let other = Response::failure(&DdssError::NoLocalRegion).into_error();
        assert!(matches!(other, DdssError::Daemon { ref kind, .. } if kind == "no_local_region"));
    }

    #[test]
    fn bounded_lines() {
        let mut input = std::io::Cursor::new(b"abc\nlonger-than-limit\npartial".to_vec());
        assert_eq!(read_line_bounded(&mut input, 8).unwrap().as_deref(), Some("abc"));
        assert!(read_line_bounded(&mut input, 8).is_err());
        let mut input = std::io::Cursor::new(b"partial".to_vec());
        assert!(read_line_bounded(&mut input, 80).is_err());
        let mut input = std::io::Cursor::new(Vec::new());
        assert_eq!(read_line_bounded(&mut input, 8).unwrap(), None);
    }
}
