//! How an operator watches a long-running command: `/metrics` (Prometheus
//! text format), `/healthz` and `/readyz`, on the command's own HTTP
//! listener or on `--metrics-listen ADDR`.
//!
//! A command describes itself with [`Observed`]: its metric families (see
//! `tierstack_stats::exposition`) and its readiness checks. [`respond`]
//! answers the three paths for a listener that also serves other things
//! (the origin's admin listener); [`ObserveArgs::start`] opens the
//! dedicated listener for commands without one (the application module,
//! lock-manager and substrate nodes, …), on a thread of its own so that it
//! answers even while the command's own threads are busy.
//!
//! **Who may reach it.** The listener is read-only: GET and HEAD of these
//! three paths, nothing else (405/404), and what it exposes is counts, not
//! content or secrets. It binds where `--metrics-listen` says, loopback in
//! every example; a Prometheus server on another host needs it on a
//! back-end address, which is then open to that network for reading. Every
//! connection is bounded (header and write deadlines, a connection cap).
//!
//! Every exposition ends with the standard process families
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, `process_start_time_seconds`), read from `/proc`,
//! and `tierstack_build_info`.

use crate::{text, Body, ServeOptions, Stop};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tierstack_stats::exposition::{self, Exposition};

/// The path of the metrics.
pub const METRICS_PATH: &str = "/metrics";

/// What a command exposes.
pub trait Observed: Send + Sync + 'static {
    /// Writes the command's own families (the process families follow).
    fn metrics(&self, out: &mut Exposition);

    /// Named checks `/readyz` reports; every one must pass for a 200.
    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        Vec::new()
    }
}

/// Ready once the command serves, not ready again once it stops: the
/// check every command's [`Observed::readiness`] can start with.
#[derive(Clone, Debug, Default)]
pub struct ServingFlag(Arc<AtomicBool>);

impl ServingFlag {
    pub fn new() -> Self {
        ServingFlag::default()
    }

    pub fn set(&self, serving: bool) {
        self.0.store(serving, Ordering::Release);
    }

    pub fn check(&self) -> Result<(), String> {
        if self.0.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("not serving (starting or stopping)".into())
        }
    }
}

/// The whole exposition: the command's families, then the process's.
pub fn render(observed: &dyn Observed) -> String {
    let mut out = Exposition::new();
    observed.metrics(&mut out);
    process_metrics(&mut out);
    out.finish()
}

/// The answer to `request` if its path is one of the three, else `None`.
pub fn respond<B>(request: &Request<B>, observed: &dyn Observed) -> Option<Response<Body>> {
    let path = request.uri().path();
    if ![METRICS_PATH, crate::HEALTHZ_PATH, crate::READYZ_PATH].contains(&path) {
        return None;
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
        response.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(response);
    }
    Some(match path {
        METRICS_PATH => {
            let mut response = text(StatusCode::OK, render(observed));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(exposition::CONTENT_TYPE));
            response
        }
        crate::HEALTHZ_PATH => crate::alive(),
        _ => crate::readiness(&observed.readiness()),
    })
}

/// The dedicated listener's bounds: few, short-lived connections.
fn observer_limits() -> ServeOptions {
    ServeOptions {
        header_read_timeout: Some(Duration::from_secs(10)),
        body_read_timeout: Some(Duration::from_secs(10)),
        write_timeout: Some(Duration::from_secs(10)),
        max_connections: Some(64),
        max_connections_per_client: Some(16),
        peer_addr: false,
    }
}

/// Serves the three paths on `listener` until `stop` fires.
pub async fn serve(listener: tokio::net::TcpListener, observed: Arc<dyn Observed>, stop: Stop) -> std::io::Result<()> {
    let handler = Arc::new(move |request: Request<crate::RequestBody>| {
        let answer = respond(&request, observed.as_ref())
            .unwrap_or_else(|| text(StatusCode::NOT_FOUND, "this listener serves /metrics, /healthz and /readyz\n"));
        std::future::ready(answer)
    });
    crate::serve_with_options(listener, handler, stop, None, observer_limits()).await
}

/// `--metrics-listen`: the flag of every command that has no HTTP listener
/// of its own to serve `/metrics` on.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ObserveArgs {
    /// Serve `/metrics` (Prometheus text format), `/healthz` and `/readyz`
    /// on this address (read-only; keep it on loopback or a back-end
    /// network). None without it.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

impl ObserveArgs {
    /// The command-line words that parse back into these arguments.
    pub fn to_args(&self) -> Vec<String> {
        match self.metrics_listen {
            Some(addr) => vec!["--metrics-listen".into(), addr.to_string()],
            None => Vec::new(),
        }
    }

    /// Binds `--metrics-listen` (if given) now, so that a taken port fails
    /// the command's start, and serves it on a thread of its own until the
    /// returned handle is dropped.
    pub fn start(&self, observed: Arc<dyn Observed>) -> std::io::Result<Option<Observer>> {
        let Some(addr) = self.metrics_listen else { return Ok(None) };
        Observer::start(addr, observed).map(Some)
    }
}

/// A running observation listener; dropping it stops it.
pub struct Observer {
    addr: SocketAddr,
    stop: Stop,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Observer {
    pub fn start(addr: SocketAddr, observed: Arc<dyn Observed>) -> std::io::Result<Observer> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listener = {
            let _entered = runtime.enter();
            let std_listener = std::net::TcpListener::bind(addr)
                .map_err(|e| std::io::Error::new(e.kind(), format!("--metrics-listen {addr}: {e}")))?;
            std_listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let addr = listener.local_addr()?;
        let stop = Stop::new();
        let serving_stop = stop.clone();
        let thread = std::thread::Builder::new().name("metrics".into()).spawn(move || {
            if let Err(e) = runtime.block_on(serve(listener, observed, serving_stop)) {
                tracing::warn!(error = %e, "the metrics listener stopped");
            }
        })?;
        Ok(Observer { addr, stop, thread: Some(thread) })
    }

    /// Where it listens (the port chosen when it was 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The standard process families, from `/proc/self` (absent where it is not).
pub fn process_metrics(out: &mut Exposition) {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Some(stat) = ProcStat::read(None) {
        if ticks > 0 {
            let cpu = (stat.utime + stat.stime) as f64 / ticks as f64;
            out.counter_f64("process_cpu_seconds_total", "User and system CPU time spent, seconds.", cpu);
            let boot = boot_time_secs().unwrap_or(0.0);
            if boot > 0.0 {
                let start = boot + stat.starttime as f64 / ticks as f64;
                out.gauge(
                    "process_start_time_seconds",
                    "Start time of the process since the Unix epoch, seconds.",
                    start,
                );
            }
        }
        if page > 0 {
            let rss = stat.rss_pages.max(0) as f64 * page as f64;
            out.gauge("process_resident_memory_bytes", "Resident memory size, bytes.", rss);
        }
        out.gauge("process_threads", "Threads of the process.", stat.threads as f64);
    }
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        out.gauge("process_open_fds", "Open file descriptors.", entries.count() as f64);
    }
    out.gauges(
        "tierstack_build_info",
        "The tierstack version this process runs (always 1).",
        &[(&[("version", env!("CARGO_PKG_VERSION"))], 1.0)],
    );
}

/// The fields of a process's `/proc/<pid>/stat` that the process families
/// and the launchers (`cluster`'s pid checks) need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (`R`, `S`, `Z` for a zombie, …).
    pub state: char,
    pub utime: u64,
    pub stime: u64,
    pub threads: u64,
    /// Clock ticks after boot when the process started: with the pid, it
    /// names one process (a pid is reused only by a later start).
    pub starttime: u64,
    pub rss_pages: i64,
}

impl ProcStat {
    /// Process `pid`'s, or this process's (`None`); `None` if it does not exist.
    pub fn read(pid: Option<u32>) -> Option<ProcStat> {
        let path = pid.map_or_else(|| "/proc/self/stat".to_string(), |pid| format!("/proc/{pid}/stat"));
        ProcStat::parse(&std::fs::read_to_string(path).ok()?)
    }

    fn parse(stat: &str) -> Option<ProcStat> {
        // The command name (field 2) may hold spaces and parentheses: the
        // fields after it start after its last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): field n is fields[n - 3].
        let field = |n: usize| fields.get(n - 3).copied();
        Some(ProcStat {
            state: field(3)?.chars().next()?,
            utime: field(14)?.parse().ok()?,
            stime: field(15)?.parse().ok()?,
            threads: field(20)?.parse().ok()?,
            starttime: field(22)?.parse().ok()?,
            rss_pages: field(24)?.parse().ok()?,
        })
    }
}

fn boot_time_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(ServingFlag);

    impl Observed for Fixed {
        fn metrics(&self, out: &mut Exposition) {
            out.counter("tierstack_test_things_total", "Things.", 3);
        }
        fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
            vec![("serving", self.0.check())]
        }
    }

    #[test]
    fn proc_stat_fields_are_read_after_the_command_name() {
        let line = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 5 0 1234 1000000 256 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let stat = ProcStat::parse(line).unwrap();
        assert_eq!(
            (stat.state, stat.utime, stat.stime, stat.threads, stat.starttime, stat.rss_pages),
            ('S', 7, 3, 5, 1234, 256)
        );
        assert!(ProcStat::parse("42 (truncated").is_none());
    }

    /// The listener answers the three paths, refuses other methods and
    /// paths, and its readiness follows the flag.
    #[test]
    fn the_listener_serves_metrics_health_and_readiness() {
        let flag = ServingFlag::new();
        let observer = Observer::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed(flag.clone()))).unwrap();
        let at = observer.addr();
        let get = |path: &str| tierstack_testkit::http::get(at, path).unwrap();
        let metrics = get(METRICS_PATH);
        assert_eq!(metrics.status, 200);
        assert!(metrics.text().contains("tierstack_test_things_total 3\n"), "{}", metrics.text());
        let checked = tierstack_testkit::metrics::check(&metrics.text()).unwrap();
        assert!(checked.get("process_cpu_seconds_total") >= 0.0);
        assert!(checked.get("process_resident_memory_bytes") > 0.0);
        assert_eq!(metrics.header("content-type"), Some(exposition::CONTENT_TYPE));
        assert_eq!(get("/healthz").status, 200);
        assert_eq!(get("/readyz").status, 503);
        flag.set(true);
        assert_eq!(get("/readyz").status, 200);
        assert_eq!(get("/other").status, 404);
        let post = tierstack_testkit::http::request(at, "POST", METRICS_PATH, &[]).unwrap();
        assert_eq!(post.status, 405);
    }
}
