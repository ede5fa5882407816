//! Measurements for `tierstack bench ddss` (the paper's Fig. 3a): put
//! latency of a 1-byte value under each coherence model, get latency under
//! each model, and put/get latency for value sizes 1 B .. 64 KiB; plus the
//! same sizes against `redis-server` on loopback (SET/GET over a minimal
//! RESP client), measured in the same run.
//!
//! The functions return raw per-operation samples ([`LatencyRow`]) so the
//! caller can summarize, tabulate and plot them its own way;
//! [`LatencyRow::summary`] is `tierstack_stats`'s summary of them. (This
//! code lived in the `ddss` crate; it uses only its public API.)
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

use super::resp::RespClient;
use serde::Serialize;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_ddss::{Coherence, Ddss, DdssError, Placement, Result};
use tierstack_stats::LatencySummary;

/// What a report of the per-model rows must say next to them.
pub const MODEL_NOTE: &str = "put: one code path for all six models (lock + one batch), so per-model put \
latencies differ only by noise; read, write and strict give the same guarantee (the latest completed put, \
linearizable) and differ only in what a get costs (version check / whole value / lock) and whether it waits \
for a put";

/// Value sizes of the sweep: 1 B .. 64 KiB.
pub const SIZES: [usize; 6] = [1, 64, 1024, 4096, 16 * 1024, 64 * 1024];
/// How long to wait for a freshly started `redis-server` to answer.
pub const REDIS_START_TIMEOUT_MS: u64 = 5000;

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

impl LatencyRow {
    pub fn summary(&self) -> LatencySummary {
        tierstack_stats::summarize(self.samples_ns.clone())
    }
}

/// Nanoseconds as microseconds, for the table.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
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
            row.system,
            row.op,
            row.model,
            row.value_bytes,
            s.count,
            s.mean_ns / 1000.0,
            us(s.p50_ns),
            us(s.p99_ns)
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
    let deadline = tierstack_base::time::instant_now() + Duration::from_millis(REDIS_START_TIMEOUT_MS);
    let mut client = loop {
        match RespClient::connect(&format!("127.0.0.1:{port}")).and_then(|mut c| c.ping().map(|()| c)) {
            Ok(client) => break client,
            Err(e) => {
                if let Ok(Some(status)) = child.0.try_wait() {
                    return RedisOutcome::Failed(format!("{} exited ({status}) before answering", binary.display()));
                }
                if tierstack_base::time::instant_now() >= deadline {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!((s.count, us(s.p50_ns), us(s.p99_ns), us(s.max_ns)), (100, 50.0, 99.0, 100.0));
        assert!((s.mean_ns / 1000.0 - 50.5).abs() < 1e-9);
        assert!(table(&[row]).contains("null"));
    }
}
