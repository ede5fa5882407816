//! Measurements for `tierstack bench ddss` (the paper's Fig. 3a): put
//! latency of a 1-byte value under each coherence model, get latency under
//! each model, and put/get latency for value sizes 1 B .. 64 KiB; plus the
//! same sizes against `redis-server` on loopback (SET/GET over a minimal
//! RESP client), measured in the same run.
//!
//! The functions return raw per-operation samples ([`LatencyRow`]) so the
//! caller can summarize, tabulate and plot them its own way;
//! [`LatencyRow::summary`] is a small built-in summary.
//!
//! Gets under null and temporal coherence are answered from the reader's
//! local copy, and under delta and read from it after a one-sided 16-byte
//! version read, since nothing else writes the key during the measurement: the rows
//! show what each model costs a reader when data is not changing. The
//! size sweep uses write coherence, whose gets always fetch from the home.
//!
//! Puts run one code path under every model (lock, one batch), so the
//! per-model put rows measure the same thing; reports should say so
//! ([`MODEL_NOTE`]) rather than present their differences as the models'.

use crate::error::{DdssError, Result};
use crate::key::{Coherence, Placement};
use crate::substrate::Ddss;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tierstack_base::{Clock, NodeId, SystemClock};

/// What a report of the per-model rows must say next to them.
pub const MODEL_NOTE: &str = "put: one code path for all six models (lock + one batch), so per-model put \
latencies differ only by noise; read, write and strict give the same guarantee (the latest completed put, \
linearizable) and differ only in what a get costs (version check / whole value / lock) and whether it waits \
for a put";

/// Value sizes of the sweep: 1 B .. 64 KiB.
pub const SIZES: [usize; 6] = [1, 64, 1024, 4096, 16 * 1024, 64 * 1024];
/// How long to wait for a freshly started `redis-server` to answer.
pub const REDIS_START_TIMEOUT_MS: u64 = 5000;
/// Longest RESP reply the client accepts.
const RESP_REPLY_BYTES_MAX: usize = 16 << 20;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Measured operations per row.
    pub iterations: usize,
    /// Unmeasured operations before each row.
    pub warmup: usize,
    pub sizes: Vec<usize>,
    pub models: Vec<Coherence>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { iterations: 2000, warmup: 200, sizes: SIZES.to_vec(), models: Coherence::examples().to_vec() }
    }
}

/// Latency samples of one (system, op, model, size).
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    /// `ddss-<backend>` or `redis`.
    pub system: String,
    /// `put` or `get` (SET or GET for redis).
    pub op: String,
    /// Coherence model (`-` for redis).
    pub model: String,
    pub value_bytes: usize,
    pub samples_ns: Vec<u64>,
}

/// A row's summary.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl LatencyRow {
    pub fn summary(&self) -> LatencySummary {
        let mut sorted = self.samples_ns.clone();
        sorted.sort_unstable();
        let pct = |p: f64| {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
        };
        let count = sorted.len();
        let mean_us =
            if count == 0 { 0.0 } else { sorted.iter().map(|s| *s as f64).sum::<f64>() / count as f64 / 1000.0 };
        LatencySummary { count, mean_us, p50_us: pct(50.0), p99_us: pct(99.0), max_us: pct(100.0) }
    }
}

/// A plain-text table of rows (for reports and the CLI).
pub fn table(rows: &[LatencyRow]) -> String {
    let mut out = format!(
        "{:<10} {:<4} {:<12} {:>8} {:>7} {:>10} {:>10} {:>10}\n",
        "system", "op", "model", "bytes", "count", "mean_us", "p50_us", "p99_us"
    );
    for row in rows {
        let s = row.summary();
        out.push_str(&format!(
            "{:<10} {:<4} {:<12} {:>8} {:>7} {:>10.2} {:>10.2} {:>10.2}\n",
            row.system, row.op, row.model, row.value_bytes, s.count, s.mean_us, s.p50_us, s.p99_us
        ));
    }
    out
}

fn time_ops(clock: &dyn Clock, options: &BenchOptions, mut op: impl FnMut(usize) -> Result<()>) -> Result<Vec<u64>> {
    for i in 0..options.warmup {
        op(i)?;
    }
    let mut samples = Vec::with_capacity(options.iterations);
    for i in 0..options.iterations {
        let start = clock.now_ns();
        op(options.warmup + i)?;
        samples.push(clock.now_ns().saturating_sub(start));
    }
    Ok(samples)
}

/// Measures DDSS from `client` against keys homed on `home` (another node,
/// so operations cross the fabric; the home's substrate must be started).
pub fn measure(client: &Ddss, home: NodeId, options: &BenchOptions) -> Result<Vec<LatencyRow>> {
    let clock = SystemClock;
    let system = format!("ddss-{}", client.backend_name());
    let row = |op: &str, model: Coherence, value_bytes: usize, samples_ns: Vec<u64>| LatencyRow {
        system: system.clone(),
        op: op.to_string(),
        model: model.to_string(),
        value_bytes,
        samples_ns,
    };
    let mut rows = Vec::new();
    // Warm the path (connections, caches, CPU clocks) before the first row.
    let warm = client.allocate(1, Placement::Node(home), Coherence::Write)?;
    for i in 0..options.warmup * 5 {
        client.put(warm, &[i as u8])?;
        client.get(warm)?;
    }
    client.free(warm)?;
    for model in &options.models {
        let key = client.allocate(1, Placement::Node(home), *model)?;
        let puts = time_ops(&clock, options, |i| client.put(key, &[i as u8]).map(|_| ()))?;
        let gets = time_ops(&clock, options, |_| client.get(key).map(|_| ()))?;
        client.free(key)?;
        rows.push(row("put", *model, 1, puts));
        rows.push(row("get", *model, 1, gets));
    }
    for &size in &options.sizes {
        let key = client.allocate(size as u64, Placement::Node(home), Coherence::Write)?;
        let value = vec![0x5au8; size];
        let puts = time_ops(&clock, options, |_| client.put(key, &value).map(|_| ()))?;
        let gets = time_ops(&clock, options, |_| client.get(key).map(|_| ()))?;
        client.free(key)?;
        rows.push(row("put", Coherence::Write, size, puts));
        rows.push(row("get", Coherence::Write, size, gets));
    }
    Ok(rows)
}

/// The outcome of the Redis comparison.
#[derive(Clone, Debug)]
pub enum RedisOutcome {
    Measured(Vec<LatencyRow>),
    /// Not measured because `redis-server` is not installed (and why).
    Skipped(String),
    /// `redis-server` is there but the measurement did not work: it would not
    /// start or answer, or an operation failed. Unlike a skip, a failure.
    Failed(String),
}

/// Finds `name` on the `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| PathBuf::from(dir).join(name)).find(|path| path.is_file())
}

/// A `redis-server` child on a free loopback port; killed on drop.
struct RedisChild(Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redis-server` on loopback (no persistence), measures SET and GET
/// for each size, and stops it. Skips with a reason if it is not installed;
/// fails if it is but does not come up or the measurement fails.
pub fn measure_redis(options: &BenchOptions) -> RedisOutcome {
    let Some(binary) = find_on_path("redis-server") else {
        return RedisOutcome::Skipped(
            "redis-server is not installed (Debian: apt-get install redis-server); comparison skipped".into(),
        );
    };
    measure_redis_server(&binary, options)
}

/// [`measure_redis`] with the server executable given: never a skip.
pub fn measure_redis_server(binary: &std::path::Path, options: &BenchOptions) -> RedisOutcome {
    let port = match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => return RedisOutcome::Failed(format!("no free loopback port: {e}")),
    };
    let child = Command::new(binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => RedisChild(child),
        Err(e) => return RedisOutcome::Failed(format!("cannot start {}: {e}", binary.display())),
    };
    let deadline = Instant::now() + Duration::from_millis(REDIS_START_TIMEOUT_MS);
    let mut client = loop {
        match RespClient::connect(&format!("127.0.0.1:{port}")).and_then(|mut c| c.ping().map(|()| c)) {
            Ok(client) => break client,
            Err(e) => {
                if let Ok(Some(status)) = child.0.try_wait() {
                    return RedisOutcome::Failed(format!("{} exited ({status}) before answering", binary.display()));
                }
                if Instant::now() >= deadline {
                    return RedisOutcome::Failed(format!(
                        "redis-server did not answer within {REDIS_START_TIMEOUT_MS} ms: {e}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    match measure_redis_with(&mut client, options) {
        Ok(rows) => RedisOutcome::Measured(rows),
        Err(e) => RedisOutcome::Failed(format!("redis measurement failed: {e}")),
    }
}

/// Measures SET/GET for each size on an open connection.
pub fn measure_redis_with(client: &mut RespClient, options: &BenchOptions) -> Result<Vec<LatencyRow>> {
    let clock = SystemClock;
    let mut rows = Vec::new();
    // Warm the connection and the server before the first row.
    for _ in 0..options.warmup * 5 {
        client.set(b"tierstack-ddss-bench-warm", b"w")?;
        client.get(b"tierstack-ddss-bench-warm")?;
    }
    for &size in &options.sizes {
        let key = format!("tierstack-ddss-bench-{size}");
        let value = vec![0x5au8; size];
        let sets = time_ops(&clock, options, |_| client.set(key.as_bytes(), &value))?;
        let gets = time_ops(&clock, options, |_| {
            let got = client.get(key.as_bytes())?;
            if got.as_deref().map(<[u8]>::len) != Some(size) {
                return Err(DdssError::Ipc(format!("redis returned a wrong value for {key}")));
            }
            Ok(())
        })?;
        for (op, samples_ns) in [("put", sets), ("get", gets)] {
            rows.push(LatencyRow {
                system: "redis".into(),
                op: op.into(),
                model: "-".into(),
                value_bytes: size,
                samples_ns,
            });
        }
    }
    Ok(rows)
}

/// A minimal RESP (Redis protocol) client: PING, SET and GET only.
pub struct RespClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn resp_error(message: impl Into<String>) -> DdssError {
    DdssError::Ipc(format!("redis: {}", message.into()))
}

impl RespClient {
    pub fn connect(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr).map_err(|e| resp_error(format!("connect {addr}: {e}")))?;
        stream.set_nodelay(true).map_err(|e| resp_error(e.to_string()))?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| resp_error(e.to_string()))?;
        let writer = stream.try_clone().map_err(|e| resp_error(e.to_string()))?;
        Ok(Self { reader: BufReader::new(stream), writer })
    }

    fn command(&mut self, parts: &[&[u8]]) -> Result<()> {
        let mut out = format!("*{}\r\n", parts.len()).into_bytes();
        for part in parts {
            out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out).map_err(|e| resp_error(format!("send: {e}")))
    }

    fn line(&mut self) -> Result<Vec<u8>> {
        let mut line = Vec::new();
        (&mut self.reader)
            .take(RESP_REPLY_BYTES_MAX as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| resp_error(e.to_string()))?;
        if !line.ends_with(b"\r\n") {
            return Err(resp_error("truncated reply"));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn simple(&mut self, expected: &[u8]) -> Result<()> {
        let line = self.line()?;
        if line.first() == Some(&b'+') && &line[1..] == expected {
            Ok(())
        } else {
            Err(resp_error(format!("unexpected reply {:?}", String::from_utf8_lossy(&line))))
        }
    }

    pub fn ping(&mut self) -> Result<()> {
        self.command(&[b"PING"])?;
        self.simple(b"PONG")
    }

    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.command(&[b"SET", key, value])?;
        self.simple(b"OK")
    }

    /// The value, or `None` for a missing key.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.command(&[b"GET", key])?;
        let line = self.line()?;
        if line.first() != Some(&b'$') {
            return Err(resp_error(format!("unexpected reply {:?}", String::from_utf8_lossy(&line))));
        }
        let len: i64 = std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| resp_error("bad bulk length"))?;
        if len < 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| resp_error("bad bulk length"))?;
        if len > RESP_REPLY_BYTES_MAX {
            return Err(resp_error("reply too large"));
        }
        let mut value = vec![0u8; len + 2];
        self.reader.read_exact(&mut value).map_err(|e| resp_error(e.to_string()))?;
        if !value.ends_with(b"\r\n") {
            return Err(resp_error("bulk reply not terminated"));
        }
        value.truncate(len);
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    /// A fake RESP server on loopback that answers a scripted sequence, to
    /// test the client's parsing without Redis.
    fn fake_server(replies: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            // Read one command's first line, then send everything.
            reader.read_until(b'\n', &mut buf).unwrap();
            writer.write_all(replies).unwrap();
            // Keep the connection until the client goes away.
            let _ = reader.read_to_end(&mut buf);
        });
        addr
    }

    #[test]
    fn resp_client_parses_replies() {
        let addr = fake_server(b"+PONG\r\n+OK\r\n$3\r\nabc\r\n$-1\r\n-ERR nope\r\n");
        let mut client = RespClient::connect(&addr).unwrap();
        client.ping().unwrap();
        client.set(b"k", b"abc").unwrap();
        assert_eq!(client.get(b"k").unwrap(), Some(b"abc".to_vec()));
        assert_eq!(client.get(b"missing").unwrap(), None);
        assert!(client.set(b"k", b"v").is_err(), "an error reply is an error");
    }

    #[test]
    fn summaries_use_nearest_rank() {
        let row = LatencyRow {
            system: "x".into(),
            op: "put".into(),
            model: "null".into(),
            value_bytes: 1,
            samples_ns: (1..=100).map(|i| i * 1000).collect(),
        };
        let s = row.summary();
        assert_eq!((s.count, s.p50_us, s.p99_us, s.max_us), (100, 50.0, 99.0, 100.0));
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert!(table(&[row]).contains("null"));
    }
}
