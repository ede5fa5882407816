//! `tierstack bench http2` (issue 32): the proxy at the edge beside nginx,
//! both caching reverse proxies with TLS and HTTP/2 in front of the same
//! origin, serving the same cached object, measured in the same run.
//!
//! - **h2 hits**: `h2load -c CLIENTS -m STREAMS` over a few long-lived
//!   connections, every request a cache hit: requests/s, mean request time,
//!   and the server's CPU time per request (its processes' utime + stime
//!   from `/proc`, nginx's master and workers summed).
//! - **handshakes**: `h2load -c N -n N`, one request per connection, so
//!   every request pays a full TLS handshake (TLS 1.3, ECDSA P-256, no
//!   resumption: h2load does not resume): connections/s and CPU time per
//!   connection (handshake and one hit).
//!
//! Before measuring, each is asked once for the object (a miss), then the
//! origin is stopped: every measured request can only be a hit, and one
//! that is not would fail (502), which fails the run. Rounds alternate
//! which server goes first; ratios are tierstack over nginx within a round,
//! reported as the median and range over rounds. h2load runs with one
//! thread, on the same machine: it takes a core, which the servers share
//! with it. Skipped, with the reason printed, where `h2load` or `nginx` is
//! not installed (Debian: `apt-get install nghttp2-client nginx`).

use crate::report::{write_json, Table};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tierstack_deploy::nginx::{nginx_path, Nginx, NginxEdge};
use tierstack_deploy::process::{free_loopback_port, ChildNode};

/// `tierstack bench http2`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct Http2Args {
    /// Output folder for the JSON.
    #[arg(long, default_value = "report/http2")]
    pub out: PathBuf,
    /// A short run: 2 rounds, 3,000 requests, 100 handshakes.
    #[arg(long)]
    pub quick: bool,
    /// Rounds (each measures both servers); default 5 (2 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Requests per h2 run; default 50,000 (3,000 with --quick).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Connections (one request each) per handshake run; default 1,000
    /// (100 with --quick).
    #[arg(long)]
    pub handshakes: Option<u64>,
    /// Client connections of the h2 runs.
    #[arg(long, default_value_t = 8)]
    pub clients: u64,
    /// Streams in flight per connection in the h2 runs (`h2load -m`).
    #[arg(long, default_value_t = 10)]
    pub streams: u64,
    /// The cached object's size.
    #[arg(long, default_value_t = 4096)]
    pub object_bytes: usize,
    /// nginx's worker processes (the proxy's runtime has 2 threads).
    #[arg(long, default_value_t = 2)]
    pub nginx_workers: usize,
    /// The `h2load` executable; default: the first on `PATH`.
    #[arg(long)]
    pub h2load: Option<PathBuf>,
    /// The `nginx` executable; default: `$TIERSTACK_NGINX`, `PATH`, `/usr/sbin`.
    #[arg(long)]
    pub nginx: Option<PathBuf>,
}

impl Http2Args {
    /// Runs the experiment (or says why it is skipped).
    pub fn run(self, exe: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<()> {
        match run(&self, &exe()?)? {
            Outcome::Skipped(reason) => println!("bench http2: SKIPPED: {reason}"),
            Outcome::Measured(report) => {
                println!("{}", report.table().render());
                println!("{}", report.notes);
            }
        }
        Ok(())
    }

    fn rounds(&self) -> usize {
        self.rounds.unwrap_or(if self.quick { 2 } else { 5 }).max(1)
    }

    fn requests(&self) -> u64 {
        self.requests.unwrap_or(if self.quick { 3_000 } else { 50_000 })
    }

    fn handshakes(&self) -> u64 {
        self.handshakes.unwrap_or(if self.quick { 100 } else { 1_000 })
    }
}

/// What a run came to.
pub enum Outcome {
    Measured(Http2Report),
    Skipped(String),
}

/// One measured h2load run against one server.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    pub round: usize,
    /// `h2` or `handshake`.
    pub test: &'static str,
    /// `tierstack` or `nginx`.
    pub server: &'static str,
    pub per_s: f64,
    pub mean_request_us: f64,
    /// The server's CPU time (all its processes) per request.
    pub cpu_us_per_request: f64,
}

#[derive(Debug, Serialize)]
pub struct Http2Report {
    pub runs: Vec<Measured>,
    pub command: String,
    pub nginx_version: String,
    pub h2load_version: String,
    pub load_average_before: String,
    pub load_average_after: String,
    pub notes: String,
}

/// The parts of h2load's output a run reports.
#[derive(Clone, Debug, PartialEq)]
pub struct H2loadOutput {
    pub req_per_s: f64,
    pub succeeded: u64,
    pub failed: u64,
    pub status_2xx: u64,
    pub mean_request_us: f64,
}

/// Parses h2load's summary (`finished in …, N req/s`, the `requests:` and
/// `status codes:` lines, the mean of `time for request:`).
pub fn parse_h2load(text: &str) -> Result<H2loadOutput> {
    let line = |prefix: &str| {
        text.lines().map(str::trim).find(|l| l.starts_with(prefix)).with_context(|| format!("no {prefix:?} line"))
    };
    let finished = line("finished in")?;
    let req_per_s = finished
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" req/s"))
        .and_then(|n| n.trim().parse().ok())
        .context("no req/s")?;
    let count = |l: &str, word: &str| -> Result<u64> {
        l.split([',', ':'])
            .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().parse().ok()))
            .with_context(|| format!("no {word:?} in {l:?}"))
    };
    let requests = line("requests:")?;
    let statuses = line("status codes:")?;
    let timing = line("time for request:")?;
    // min, max, mean, sd, +/- sd: the mean is the third.
    let mean = timing.trim_start_matches("time for request:").split_whitespace().nth(2).context("no mean")?;
    Ok(H2loadOutput {
        req_per_s,
        succeeded: count(requests, " succeeded")?,
        failed: count(requests, " failed")?,
        status_2xx: count(statuses, " 2xx")?,
        mean_request_us: duration_us(mean).with_context(|| format!("bad mean {mean:?}"))?,
    })
}

/// `123us`, `4.56ms`, `1.2s` in microseconds.
fn duration_us(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else {
        (text.strip_suffix('s')?, 1e6)
    };
    Some(number.parse::<f64>().ok()? * scale)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// CPU seconds (user + system) of `pids` so far.
pub(crate) fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| tierstack_tier_http::observe::ProcStat::read(Some(*pid)))
        .map(|stat| (stat.utime + stat.stime) as f64 / ticks)
        .sum()
}

/// A self-signed certificate for 127.0.0.1 and its key (0600) in `dir`.
fn write_certificate(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .context("making the benchmark's certificate")?;
    let (cert, key) = (dir.join("edge.pem"), dir.join("edge.key"));
    std::fs::write(&cert, certified.cert.pem())?;
    std::fs::write(&key, certified.key_pair.serialize_pem())?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok((cert, key))
}

struct H2load {
    exe: PathBuf,
}

impl H2load {
    fn run(&self, url: &str, requests: u64, clients: u64, streams: u64) -> Result<H2loadOutput> {
        let output = Command::new(&self.exe)
            .args(["-n", &requests.to_string(), "-c", &clients.to_string(), "-m", &streams.to_string(), "-t", "1"])
            .arg(url)
            .output()
            .with_context(|| format!("running {:?}", self.exe))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let parsed = parse_h2load(&text).with_context(|| format!("h2load's output: {text}"))?;
        if parsed.succeeded != requests || parsed.status_2xx != requests || parsed.failed != 0 {
            bail!("h2load against {url}: not every request was a 2xx hit: {parsed:?}\n{text}");
        }
        Ok(parsed)
    }
}

fn run(args: &Http2Args, exe: &Path) -> Result<Outcome> {
    let h2load = match args.h2load.clone().or_else(|| find_on_path("h2load")) {
        Some(path) if path.is_file() => H2load { exe: path },
        Some(path) => return Ok(Outcome::Skipped(format!("no h2load at {}", path.display()))),
        None => return Ok(Outcome::Skipped("h2load is not on PATH (Debian: apt-get install nghttp2-client)".into())),
    };
    let nginx_exe = match args.nginx.clone().or_else(nginx_path) {
        Some(path) if path.is_file() => path,
        Some(path) => return Ok(Outcome::Skipped(format!("no nginx at {}", path.display()))),
        None => return Ok(Outcome::Skipped("nginx is not installed (Debian: apt-get install nginx)".into())),
    };
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("root");
    std::fs::create_dir(&root)?;
    let object: Vec<u8> = (0..args.object_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(root.join("object"), object)?;
    let (cert, key) = write_certificate(dir.path())?;

    let origin_addr = free_loopback_port()?;
    let origin_args = [
        "origin",
        "--listen",
        &origin_addr.to_string(),
        "--root",
        &root.display().to_string(),
        "--cache-control",
        "public, max-age=86400",
    ]
    .map(String::from);
    let origin = ChildNode::spawn(exe, &origin_args).context("starting the origin")?;
    let proxy_addr = free_loopback_port()?;
    let proxy_args = [
        "proxy",
        "--listen",
        &proxy_addr.to_string(),
        "--upstream",
        &format!("http://{origin_addr}"),
        "--mode",
        "ttl",
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
    ]
    .map(String::from);
    let proxy = ChildNode::spawn(exe, &proxy_args).context("starting the proxy")?;
    let edge = NginxEdge {
        upstream: origin_addr,
        cert: cert.clone(),
        key: key.clone(),
        workers: args.nginx_workers,
        max_concurrent_streams: tierstack_tier_http::conn::HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT,
    };
    let nginx = Nginx::start(&nginx_exe, &edge)?;
    let url = |addr: SocketAddr| format!("https://127.0.0.1:{}/object", addr.port());
    let servers: [(&'static str, String, Vec<u32>); 2] =
        [("tierstack", url(proxy_addr), vec![proxy.pid()]), ("nginx", url(nginx.listen), nginx.pids())];

    // One miss each fills the caches; with the origin gone, only hits succeed.
    for (name, url, _) in &servers {
        h2load.run(url, 1, 1, 1).with_context(|| format!("warming {name}"))?;
    }
    drop(origin);
    let (status, headers) = plain_get(nginx.plain, "/object")?;
    if status != 200 || !headers.to_ascii_lowercase().contains("x-cache-status: hit") {
        bail!("nginx does not serve the object from its cache: {status}\n{headers}\n{}", nginx.error_log());
    }

    let load_average_before = load_average();
    let mut runs = Vec::new();
    for round in 0..args.rounds() {
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for test in ["h2", "handshake"] {
            for &i in &order {
                let (server, url, pids) = &servers[i];
                let (requests, clients, streams) = match test {
                    "h2" => (args.requests(), args.clients, args.streams),
                    _ => (args.handshakes(), args.handshakes(), 1),
                };
                let cpu_before = cpu_seconds(pids);
                let output = h2load.run(url, requests, clients, streams)?;
                let cpu = cpu_seconds(pids) - cpu_before;
                eprintln!("bench http2: round {round} {test:9} {server:9} {:>10.0}/s", output.req_per_s);
                runs.push(Measured {
                    round,
                    test,
                    server,
                    per_s: output.req_per_s,
                    mean_request_us: output.mean_request_us,
                    cpu_us_per_request: cpu * 1e6 / requests as f64,
                });
            }
        }
    }
    let version = |exe: &Path, flag: &str| {
        Command::new(exe)
            .arg(flag)
            .output()
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
                text.lines().next().unwrap_or_default().trim().to_string()
            })
            .unwrap_or_default()
    };
    let report = Http2Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        nginx_version: version(&nginx_exe, "-v"),
        h2load_version: version(&h2load.exe, "--version"),
        load_average_before,
        load_average_after: load_average(),
        notes: String::new(),
        runs,
    };
    let notes = format!(
        "{} rounds; h2: {} requests over {} connections x {} streams; handshake: {} connections of one request \
         each; object {} bytes; nginx {} workers, the proxy 2 runtime threads; h2load -t 1 on the same machine; \
         {}; {}; load average {} before, {} after. Ratio: tierstack / nginx within a round, median [min-max] over \
         rounds (req/s: higher is better for tierstack; CPU/request: lower is).",
        args.rounds(),
        args.requests(),
        args.clients,
        args.streams,
        args.handshakes(),
        args.object_bytes,
        args.nginx_workers,
        report.nginx_version,
        report.h2load_version,
        report.load_average_before,
        report.load_average_after,
    );
    let report = Http2Report { notes, ..report };
    std::fs::create_dir_all(&args.out)?;
    write_json(&args.out.join("http2.json"), &report)?;
    drop(proxy);
    Ok(Outcome::Measured(report))
}

/// A plain HTTP/1.1 GET: the status and the head as text.
fn plain_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.take(1 << 20).read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_string();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status")?;
    Ok((status, head))
}

/// The median and range of `values`.
fn median_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
    (median, values[0], values[n - 1])
}

impl Http2Report {
    /// Per test and server: medians [ranges] over rounds, and the ratios to
    /// nginx within each round.
    pub fn table(&self) -> Table {
        let mut table = Table::with_units(
            "HTTP/2 and TLS at the edge: tierstack proxy vs nginx, one cached object",
            &[
                ("test", ""),
                ("server", ""),
                ("rate", "per s"),
                ("vs nginx", "x"),
                ("mean request", "us"),
                ("CPU per request", "us"),
                ("CPU vs nginx", "x"),
            ],
        );
        let rounds: Vec<usize> = {
            let mut r: Vec<usize> = self.runs.iter().map(|m| m.round).collect();
            r.dedup();
            r
        };
        for test in ["h2", "handshake"] {
            for server in ["tierstack", "nginx"] {
                let of = |field: fn(&Measured) -> f64| -> Vec<f64> {
                    self.runs.iter().filter(|m| m.test == test && m.server == server).map(field).collect()
                };
                let ratio = |field: fn(&Measured) -> f64| -> Vec<f64> {
                    rounds
                        .iter()
                        .filter_map(|round| {
                            let at = |s: &str| {
                                self.runs
                                    .iter()
                                    .find(|m| m.round == *round && m.test == test && m.server == s)
                                    .map(field)
                            };
                            Some(at(server)? / at("nginx")?)
                        })
                        .collect()
                };
                let cell = |values: Vec<f64>, digits: usize| {
                    let (median, low, high) = median_range(values);
                    format!("{median:.digits$} [{low:.digits$}-{high:.digits$}]")
                };
                table.row(vec![
                    test.to_string(),
                    server.to_string(),
                    cell(of(|m| m.per_s), 0),
                    cell(ratio(|m| m.per_s), 2),
                    cell(of(|m| m.mean_request_us), 0),
                    cell(of(|m| m.cpu_us_per_request), 1),
                    cell(ratio(|m| m.cpu_us_per_request), 2),
                ]);
            }
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// h2load 1.52's summary, as printed.
    const SAMPLE: &str = "\
starting benchmark...
spawning thread #0: 8 total client(s). 3000 total requests
TLS Protocol: TLSv1.3
Cipher: TLS_AES_256_GCM_SHA384
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 251.96ms, 11906.65 req/s, 48.69MB/s
requests: 3000 total, 3000 started, 3000 done, 2999 succeeded, 1 failed, 0 errored, 0 timeout
status codes: 2999 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 12.27MB (12864419) total, 37.60KB (38502) headers (space savings 91.08%), 12.00MB (12582912) data
                     min         max         mean         sd        +/- sd
time for request:      178us      6.04ms       647us       387us    83.67%
time for connect:     2.26ms      4.01ms      3.31ms       603us    62.50%
time to 1st byte:     6.35ms      6.85ms      6.56ms       197us    62.50%
req/s           :    1489.92     1498.12     1493.40        2.77    62.50%
";

    #[test]
    fn h2load_summaries_are_read() {
        let parsed = parse_h2load(SAMPLE).unwrap();
        assert_eq!(
            parsed,
            H2loadOutput { req_per_s: 11906.65, succeeded: 2999, failed: 1, status_2xx: 2999, mean_request_us: 647.0 }
        );
        assert_eq!(duration_us("4.5ms"), Some(4500.0));
        assert_eq!(duration_us("1.5s"), Some(1_500_000.0));
        assert!(parse_h2load("connect failed").is_err());
    }

    #[test]
    fn medians_and_ranges() {
        assert_eq!(median_range(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(median_range(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
    }
}
