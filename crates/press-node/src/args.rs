//! The flags of `tierstack press-node` and `tierstack press-dispatcher`,
//! spelled once: the binary's parser flattens [`PressNodeArgs`] and
//! [`DispatcherArgs`], a launcher builds their command lines with
//! `to_args`.

use crate::{Mode, TransportKind, WINDOW_DEFAULT};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_cluster::NodeArgs;
use tierstack_model::{ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};
use tierstack_press::{
    LardConfig, COOL_DOWN_MS_DEFAULT as BREAKER_COOL_DOWN_MS_DEFAULT, MAX_SIZE_BYTES, THRESHOLD_DEFAULT,
};
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;
use tierstack_tier_http::HttpLimitsArgs;

/// A node's runtime worker threads unless told otherwise.
pub const NODE_THREADS_DEFAULT: usize = 2;
/// `--forward-timeout-ms` unless told otherwise.
pub const FORWARD_TIMEOUT_MS_DEFAULT: u64 = 2000;

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `tierstack press-node`: one PRESS cluster node.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct PressNodeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Where clients connect.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where `GET /stats` is served.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// press (Fig. 1 distribution), traditional (every node on its own) or
    /// distrib-ho (Fig. 1, the client socket handed to the service node).
    #[arg(long, default_value = "press")]
    pub mode: Mode,
    /// Communication version: tcp (topology fabric tcp), base, rdma-1c, rdma or zero (fabric shm).
    #[arg(long, default_value = "base")]
    pub transport: TransportKind,
    /// The document root: the regular files under it are served (GET,
    /// HEAD, validators, ranges). With --trace, the trace's set is written
    /// into it first (files already there with the right size are kept).
    #[arg(long, required_unless_present = "trace")]
    pub root: Option<PathBuf>,
    /// A trace's documents (`/doc/<name>`, their sizes), as `tierstack
    /// origin --trace` (e.g. press:clarknet@0.01): written once as files
    /// (under --root, else a directory per trace under the temporary
    /// directory, kept for the next run) and served as a root.
    #[arg(long)]
    pub trace: Option<String>,
    #[arg(long, default_value_t = ZIPF_ALPHA_DEFAULT)]
    pub alpha: f64,
    #[arg(long, default_value_t = ZIPF_DOCS_DEFAULT)]
    pub docs: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Memory cache in bytes (LRU); default the trace's published per-node cache.
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Emulated disk: positioning time per read, in microseconds.
    #[arg(long, requires = "disk_mb_per_s")]
    pub disk_seek_us: Option<u64>,
    /// Emulated disk: transfer rate in MB/s.
    #[arg(long, requires = "disk_seek_us")]
    pub disk_mb_per_s: Option<f64>,
    /// Fig. 1's threshold T (open connections).
    #[arg(long, default_value_t = THRESHOLD_DEFAULT)]
    pub threshold: u32,
    /// Fig. 1's max_size in bytes.
    #[arg(long, default_value_t = MAX_SIZE_BYTES)]
    pub max_size_bytes: u64,
    /// Longest wait for a forwarded request's reply, in ms, before serving it here.
    #[arg(long, default_value_t = FORWARD_TIMEOUT_MS_DEFAULT)]
    pub forward_timeout_ms: u64,
    /// After a failed or unanswered forward, how long the peer is skipped
    /// (its requests served here) before one probe forward, in ms.
    #[arg(long, default_value_t = BREAKER_COOL_DOWN_MS_DEFAULT)]
    pub breaker_cool_down_ms: u64,
    /// Flow-control window: messages in flight per ordered pair (base: credits; rdma-1c: ring entries).
    #[arg(long, default_value_t = WINDOW_DEFAULT)]
    pub window: u32,
    /// Runtime worker threads.
    #[arg(long, default_value_t = NODE_THREADS_DEFAULT)]
    pub threads: usize,
    /// Send intra-cluster messages inline from the request's task when
    /// nothing has to wait; `false` hands every send to the blocking pool
    /// (the path before issue 33's try_send, kept to measure against).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub send_inline: bool,
    /// Directory of the nodes' hand-off sockets: the node accepts client
    /// sockets handed to it (distrib-ho peers, or a press-dispatcher for a
    /// traditional node); distrib-ho needs it.
    #[arg(long)]
    pub handoff_dir: Option<PathBuf>,
    /// The client listener's limits (slow clients, connections); the
    /// distributed hand-off server's own accept path is outside them.
    #[command(flatten)]
    pub limits: HttpLimitsArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl PressNodeArgs {
    /// The node, its listener and the trace mode's trace given, every other
    /// flag at its default (no `--root`).
    pub fn new(node: NodeArgs, listen: SocketAddr, trace: String) -> PressNodeArgs {
        PressNodeArgs {
            node,
            service: ServiceArgs::default(),
            listen,
            admin: None,
            mode: Mode::Press,
            transport: TransportKind::Base,
            root: None,
            trace: Some(trace),
            alpha: ZIPF_ALPHA_DEFAULT,
            docs: ZIPF_DOCS_DEFAULT,
            seed: 1,
            cache_bytes: None,
            disk_seek_us: None,
            disk_mb_per_s: None,
            threshold: THRESHOLD_DEFAULT,
            max_size_bytes: MAX_SIZE_BYTES,
            forward_timeout_ms: FORWARD_TIMEOUT_MS_DEFAULT,
            breaker_cool_down_ms: BREAKER_COOL_DOWN_MS_DEFAULT,
            window: WINDOW_DEFAULT,
            threads: NODE_THREADS_DEFAULT,
            send_inline: true,
            handoff_dir: None,
            limits: HttpLimitsArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the node, the listener and the trace, then each
    /// flag whose value is not the parser's default (so that a launcher may
    /// append flags of its own); the disk only whole, as the parser requires.
    pub fn to_args(&self) -> Vec<String> {
        let default = PressNodeArgs::new(self.node.clone(), self.listen, String::new());
        let mut args = self.node.to_args();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        flag("--listen", self.listen.to_string());
        if let Some(trace) = &self.trace {
            flag("--trace", trace.clone());
        }
        if let Some(root) = &self.root {
            flag("--root", root.display().to_string());
        }
        if let Some(admin) = self.admin {
            flag("--admin", admin.to_string());
        }
        if self.mode != default.mode {
            flag("--mode", self.mode.to_string());
        }
        if self.transport != default.transport {
            flag("--transport", self.transport.to_string());
        }
        if self.alpha != default.alpha {
            flag("--alpha", self.alpha.to_string());
        }
        if self.docs != default.docs {
            flag("--docs", self.docs.to_string());
        }
        if self.seed != default.seed {
            flag("--seed", self.seed.to_string());
        }
        if let Some(bytes) = self.cache_bytes {
            flag("--cache-bytes", bytes.to_string());
        }
        if let (Some(seek_us), Some(mb_per_s)) = (self.disk_seek_us, self.disk_mb_per_s) {
            flag("--disk-seek-us", seek_us.to_string());
            flag("--disk-mb-per-s", mb_per_s.to_string());
        }
        if self.threshold != default.threshold {
            flag("--threshold", self.threshold.to_string());
        }
        if self.max_size_bytes != default.max_size_bytes {
            flag("--max-size-bytes", self.max_size_bytes.to_string());
        }
        if self.forward_timeout_ms != default.forward_timeout_ms {
            flag("--forward-timeout-ms", self.forward_timeout_ms.to_string());
        }
        if self.breaker_cool_down_ms != default.breaker_cool_down_ms {
            flag("--breaker-cool-down-ms", self.breaker_cool_down_ms.to_string());
        }
        if self.window != default.window {
            flag("--window", self.window.to_string());
        }
        if self.threads != default.threads {
            flag("--threads", self.threads.to_string());
        }
        if self.send_inline != default.send_inline {
            flag("--send-inline", self.send_inline.to_string());
        }
        if let Some(dir) = &self.handoff_dir {
            flag("--handoff-dir", dir.display().to_string());
        }
        args.extend(self.limits.to_args());
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args.extend(self.observe.to_args());
        args
    }
}

/// The dispatcher's runtime worker threads unless told otherwise.
pub const DISPATCHER_THREADS_DEFAULT: usize = 1;

/// `tierstack press-dispatcher`: a LARD front end handing client sockets to
/// back-end press-nodes.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct DispatcherArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Where clients connect.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where `GET /stats` is served.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Back-end press-nodes 0..N (started with the same --handoff-dir).
    #[arg(long)]
    pub backends: usize,
    /// Directory of the back-ends' hand-off sockets.
    #[arg(long)]
    pub handoff_dir: PathBuf,
    /// LARD's T_low (open connections).
    #[arg(long, default_value_t = LardConfig::default().t_low)]
    pub t_low: u32,
    /// LARD's T_high (open connections).
    #[arg(long, default_value_t = LardConfig::default().t_high)]
    pub t_high: u32,
    /// Runtime worker threads.
    #[arg(long, default_value_t = DISPATCHER_THREADS_DEFAULT)]
    pub threads: usize,
}

impl DispatcherArgs {
    /// The required flags given, every other one at its default.
    pub fn new(listen: SocketAddr, backends: usize, handoff_dir: PathBuf) -> DispatcherArgs {
        let lard = LardConfig::default();
        DispatcherArgs {
            service: ServiceArgs::default(),
            listen,
            admin: None,
            backends,
            handoff_dir,
            t_low: lard.t_low,
            t_high: lard.t_high,
            threads: DISPATCHER_THREADS_DEFAULT,
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = self.service.to_args();
        args.extend(["--listen".into(), self.listen.to_string()]);
        if let Some(admin) = self.admin {
            args.extend(["--admin".into(), admin.to_string()]);
        }
        args.extend([
            "--backends".into(),
            self.backends.to_string(),
            "--handoff-dir".into(),
            self.handoff_dir.display().to_string(),
            "--t-low".into(),
            self.t_low.to_string(),
            "--t-high".into(),
            self.t_high.to_string(),
            "--threads".into(),
            self.threads.to_string(),
        ]);
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &DispatcherArgs) -> DispatcherArgs {
        let words = std::iter::once("press-dispatcher".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<DispatcherArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn dispatcher_args_round_trip_through_their_words() {
        let args = DispatcherArgs {
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin: Some("127.0.0.1:8081".parse().unwrap()),
            backends: 4,
            handoff_dir: PathBuf::from("/tmp/press handoff"),
            t_low: 3,
            t_high: 9,
            threads: 5,
        };
        assert_eq!(parse(&args), args);
    }

    fn parse_node(args: &PressNodeArgs) -> PressNodeArgs {
        let words = std::iter::once("press-node".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<PressNodeArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once" for the node: every field, at a value other
    /// than its default, survives `to_args` and parsing.
    #[test]
    fn press_node_args_round_trip_through_their_words() {
        let args = PressNodeArgs {
            node: NodeArgs { topology: PathBuf::from("/tmp/a press.toml"), node: 2 },
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin: Some("127.0.0.1:8081".parse().unwrap()),
            mode: Mode::DistribHandoff,
            transport: TransportKind::Rdma1c,
            root: Some(PathBuf::from("/tmp/a root")),
            trace: Some("press:clarknet@0.01".into()),
            alpha: 0.9,
            docs: 40,
            seed: 3,
            cache_bytes: Some(1 << 20),
            disk_seek_us: Some(8000),
            disk_mb_per_s: Some(12.5),
            threshold: 7,
            max_size_bytes: 4096,
            forward_timeout_ms: 99,
            breaker_cool_down_ms: 123,
            window: 5,
            threads: 3,
            send_inline: false,
            handoff_dir: Some(PathBuf::from("/tmp/handoff")),
            limits: HttpLimitsArgs { header_read_timeout_ms: 5, max_connections: 64, ..HttpLimitsArgs::default() },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse_node(&args), args);
    }

    /// The node's `new` agrees with the parser's defaults.
    #[test]
    fn press_node_new_has_the_parsers_defaults() {
        let words =
            ["press-node", "--topology", "/tmp/p.toml", "--node", "1", "--listen", "127.0.0.1:8080", "--trace", "zipf"];
        let parsed = tierstack_testkit::args::parse::<PressNodeArgs, _, _>(words).unwrap();
        let at = NodeArgs { topology: PathBuf::from("/tmp/p.toml"), node: 1 };
        assert_eq!(parsed, PressNodeArgs::new(at, "127.0.0.1:8080".parse().unwrap(), "zipf".into()));
        assert_eq!(parse_node(&parsed), parsed);
    }

    /// A node serves `--root`, `--trace`, or both; never nothing.
    #[test]
    fn a_node_needs_a_root_or_a_trace() {
        let base = ["press-node", "--topology", "/tmp/p.toml", "--node", "1", "--listen", "127.0.0.1:8080"];
        let parsed = tierstack_testkit::args::parse::<PressNodeArgs, _, _>(base.iter().chain(&["--root", "/srv/www"]));
        let parsed = parsed.unwrap();
        assert_eq!((parsed.root, parsed.trace), (Some(PathBuf::from("/srv/www")), None));
        assert!(tierstack_testkit::args::parse::<PressNodeArgs, _, _>(base).is_err());
    }

    #[test]
    fn modes_and_transports_round_trip() {
        for mode in [Mode::Press, Mode::Traditional, Mode::DistribHandoff] {
            assert_eq!(mode.to_string().parse::<Mode>().unwrap(), mode);
        }
        for kind in
            [TransportKind::Tcp, TransportKind::Base, TransportKind::Rdma1c, TransportKind::Rdma, TransportKind::Zero]
        {
            assert_eq!(kind.to_string().parse::<TransportKind>().unwrap(), kind);
        }
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let listen = "127.0.0.1:8080".parse().unwrap();
        let words = ["press-dispatcher", "--listen", "127.0.0.1:8080", "--backends", "2", "--handoff-dir", "/tmp/h"];
        let parsed = tierstack_testkit::args::parse::<DispatcherArgs, _, _>(words).unwrap();
        assert_eq!(parsed, DispatcherArgs::new(listen, 2, PathBuf::from("/tmp/h")));
        assert_eq!(parse(&parsed), parsed);
    }
}
