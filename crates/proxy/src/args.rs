//! The flags of `tierstack proxy`, spelled once: the binary's parser
//! flattens [`ProxyArgs`] (with the cooperative cache's
//! [`CoopArgs`]), a launcher builds its command line with
//! [`ProxyArgs::to_args`].

use crate::{CacheMode, Policy, Scheme, CACHE_STATE_SLOTS_DEFAULT, REFRESH_HOT_DEFAULT, REFRESH_INTERVAL_DEFAULT};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_coop::args::{parse_scheme, CoopArgs};
use tierstack_monitor::BackendAddress;
use tierstack_tier_http::service::ServiceArgs;
use tierstack_tier_http::{FrontArgs, HttpLimitsArgs};

/// `--cache-bytes` unless told otherwise.
pub const CACHE_BYTES_DEFAULT: usize = 256 << 20;
/// `--upstream-timeout-ms` unless told otherwise.
pub const UPSTREAM_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// `--monitor-interval-ms` unless told otherwise.
pub const MONITOR_INTERVAL_MS_DEFAULT: u64 = 10;
/// `--max-fails` unless told otherwise (nginx's default).
pub const MAX_FAILS_DEFAULT: u32 = 1;
/// `--fail-timeout-ms` unless told otherwise (nginx's default, 10 s).
pub const FAIL_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// `--suspect-after-ms` unless told otherwise.
pub const SUSPECT_AFTER_MS_DEFAULT: u64 = tierstack_monitor::scheme::SUSPECT_AFTER_DEFAULT.as_millis() as u64;

impl CacheMode {
    /// The word `--mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::NoCache => "no-cache",
            CacheMode::Poll => "poll",
            CacheMode::Ttl => "ttl",
        }
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `tierstack proxy`: the caching reverse proxy.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct ProxyArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where the admin endpoints listen (the application tier's pushes,
    /// `/_tierstack/stats`); keep it off the clients' network. Without it,
    /// nothing can push to this proxy. An address other than loopback
    /// needs --admin-token-file.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// A file (mode 0600, this user's) holding the bearer token that every
    /// push and purge on the admin listener must carry (`Authorization:
    /// Bearer <token>`); the application servers are given the same file.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Application server base URL (repeatable).
    #[arg(long = "upstream", required = true)]
    pub upstreams: Vec<String>,
    /// no-cache | poll | ttl
    #[arg(long, default_value = "poll")]
    pub mode: CacheMode,
    /// Topology and node id of this proxy's fabric node (needed for poll).
    #[arg(long)]
    pub topology: Option<PathBuf>,
    #[arg(long)]
    pub node: Option<u32>,
    #[arg(long, default_value_t = CACHE_BYTES_DEFAULT)]
    pub cache_bytes: usize,
    #[arg(long, default_value_t = UPSTREAM_TIMEOUT_MS_DEFAULT)]
    pub upstream_timeout_ms: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Documents tracked in the shared cache state the application tier
    /// reads to decide pushes (a multiple of 8, at most 336; 0 = none).
    #[arg(long, default_value_t = CACHE_STATE_SLOTS_DEFAULT)]
    pub state_slots: u32,
    /// How to pick the upstream of a forwarded request: hash (by path, the
    /// default routing), round-robin, least-loaded.
    #[arg(long)]
    pub balance: Option<Policy>,
    /// Where the balancer's load comes from: socket-async, socket-sync,
    /// rdma-async, rdma-sync. Needs one --upstream-monitor per --upstream.
    #[arg(long, requires = "balance")]
    pub monitor: Option<Scheme>,
    /// Each upstream's monitor, in --upstream order, as
    /// `<fabric node>@<socket address>` (either part may be empty:
    /// `3@` for the RDMA schemes, `@127.0.0.1:9101` for the socket ones).
    #[arg(long = "upstream-monitor", value_parser = parse_backend_address)]
    pub upstream_monitors: Vec<BackendAddress>,
    /// Socket-Async's and RDMA-Async's interval, to judge staleness (as the
    /// app servers' --monitor-interval-ms).
    #[arg(long, default_value_t = MONITOR_INTERVAL_MS_DEFAULT)]
    pub monitor_interval_ms: u64,
    /// Admission control: answer 503 when the chosen upstream's estimated
    /// load (running threads + requests in flight) is at least this.
    #[arg(long, requires = "balance")]
    pub admit_max: Option<u32>,
    /// Seed of the balancer's tie-breaking.
    #[arg(long, default_value_t = 1)]
    pub balance_seed: u64,
    /// Liveness (with --monitor): an upstream whose progress word stands
    /// still this long, or whose monitor does not answer in this time, is
    /// suspect (stopped or wedged): new requests avoid it, and a waiting
    /// idempotent request goes to another upstream. 0: off.
    #[arg(long, default_value_t = SUSPECT_AFTER_MS_DEFAULT)]
    pub suspect_after_ms: u64,
    /// Failed forwards (refused, broken, or no response head in time)
    /// within --fail-timeout-ms that pause an upstream for
    /// --fail-timeout-ms, as nginx's `max_fails`; 0: never paused.
    #[arg(long, default_value_t = MAX_FAILS_DEFAULT)]
    pub max_fails: u32,
    #[arg(long, default_value_t = FAIL_TIMEOUT_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..))]
    pub fail_timeout_ms: u64,
    /// Reconfiguration: route only to the upstreams whose role word (read
    /// one-sidedly before each choice) names this site. Needs --balance,
    /// --topology/--node, and a fabric node in every --upstream-monitor.
    #[arg(long, requires = "balance")]
    pub site: Option<u16>,
    /// A TOML file of these flags (see `cmd::proxy_config`); flags given
    /// here override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Cooperative caching across the proxies (issue 12): ac | bcc | ccwr |
    /// mtacc | hybcc | groupcache. The proxies of the topology (or
    /// --coop-peers) cooperate; its passive nodes (or --coop-passive, each
    /// running `tierstack coop-node`) lend their memory to MTACC/HYBCC.
    /// Needs --topology/--node. `--cache-bytes` stays a private first level
    /// in front of the pool (0: the pool is the whole cache).
    #[arg(long, value_parser = parse_scheme, requires = "topology")]
    pub coop: Option<tierstack_coop::Scheme>,
    #[command(flatten)]
    pub coop_args: CoopArgs,
    /// The client listener's limits (slow clients, connections).
    #[command(flatten)]
    pub limits: HttpLimitsArgs,
    /// The client listener's TLS and HTTP/2.
    #[command(flatten)]
    pub front: FrontArgs,
    /// Speak HTTP/2 to the upstreams (cleartext, prior knowledge: they must
    /// accept it, e.g. a proxy with --http2-cleartext); one connection per
    /// upstream carries every request as a stream.
    #[arg(long)]
    pub upstream_http2: bool,
    /// Append a Combined Log Format line per client request to this file
    /// (`tierstack load` replays it as the trace `clf:PATH`).
    #[arg(long)]
    pub access_log: Option<PathBuf>,
    /// Proxy-side refresh (poll mode): watch this many of the hottest cached
    /// documents with dependencies, read their versions in one batch every
    /// --refresh-interval-ms, and refetch a changed one before clients ask
    /// (for upstreams that neither push nor publish; 64 is a usual size).
    /// 0, the default: off (measured no better than off, docs/results.md).
    #[arg(long, default_value_t = REFRESH_HOT_DEFAULT)]
    pub refresh_hot: usize,
    /// How often the refresh reads the hot documents' versions.
    #[arg(long, default_value_t = REFRESH_INTERVAL_DEFAULT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub refresh_interval_ms: u64,
    /// The authority (`host:port`) of requests without a Host, under which
    /// pushed documents are cached (default: the --listen address).
    #[arg(long)]
    pub default_authority: Option<String>,
    /// Responses with Set-Cookie: `if-public` (default) stores one only when
    /// it is `public` or has `s-maxage`, without its cookies; `never`;
    /// `strip` stores it as any other, without its cookies; `store` keeps
    /// the cookies, replayed to every client a hit answers.
    #[arg(long, value_enum, default_value_t = crate::SetCookie::IfPublic)]
    pub set_cookie: crate::SetCookie,
    /// Grace, seconds: when the upstream fails (refused, closed, timed
    /// out, or 500/502/503/504), answer with a stored response stale by at
    /// most this long, as nginx's `proxy_cache_use_stale` and Varnish's
    /// grace. Never a response with dependencies, nor one with
    /// must-revalidate, proxy-revalidate, s-maxage or no-cache. 0: off
    /// (only the response's `stale-if-error`).
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    pub serve_stale_on_error: u64,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// `<fabric node>@<socket address>`, as `--upstream-monitor` takes it.
pub fn parse_backend_address(text: &str) -> Result<BackendAddress, String> {
    text.parse()
}

impl ProxyArgs {
    /// The admin token from `--admin-token-file`, its permissions checked.
    pub fn admin_token(&self) -> Result<Option<tierstack_secret::Secret>, tierstack_secret::SecretError> {
        self.admin_token_file.as_deref().map(tierstack_secret::read_secret_file).transpose()
    }

    /// `--suspect-after-ms` as a bound (`None`: off).
    pub fn suspect_after(&self) -> Option<std::time::Duration> {
        (self.suspect_after_ms > 0).then(|| std::time::Duration::from_millis(self.suspect_after_ms))
    }

    /// `--max-fails` and `--fail-timeout-ms`.
    pub fn failures(&self) -> crate::FailureConfig {
        crate::FailureConfig {
            max_fails: self.max_fails,
            fail_timeout: std::time::Duration::from_millis(self.fail_timeout_ms),
        }
    }

    /// The required flags given (one upstream), every other one at its default.
    pub fn new(listen: SocketAddr, upstream: String) -> ProxyArgs {
        ProxyArgs {
            listen,
            admin_listen: None,
            admin_token_file: None,
            upstreams: vec![upstream],
            mode: CacheMode::Poll,
            topology: None,
            node: None,
            cache_bytes: CACHE_BYTES_DEFAULT,
            upstream_timeout_ms: UPSTREAM_TIMEOUT_MS_DEFAULT,
            cpu: None,
            state_slots: CACHE_STATE_SLOTS_DEFAULT,
            balance: None,
            monitor: None,
            upstream_monitors: Vec::new(),
            monitor_interval_ms: MONITOR_INTERVAL_MS_DEFAULT,
            admit_max: None,
            balance_seed: 1,
            suspect_after_ms: SUSPECT_AFTER_MS_DEFAULT,
            max_fails: MAX_FAILS_DEFAULT,
            fail_timeout_ms: FAIL_TIMEOUT_MS_DEFAULT,
            site: None,
            config: None,
            coop: None,
            coop_args: CoopArgs::default(),
            limits: HttpLimitsArgs::default(),
            front: FrontArgs::default(),
            upstream_http2: false,
            access_log: None,
            refresh_hot: REFRESH_HOT_DEFAULT,
            refresh_interval_ms: REFRESH_INTERVAL_DEFAULT.as_millis() as u64,
            default_authority: None,
            set_cookie: crate::SetCookie::IfPublic,
            serve_stale_on_error: 0,
            service: ServiceArgs::default(),
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the listeners, the cache mode, the fabric node and
    /// the upstreams, then each flag whose value is not the parser's default
    /// (so that a launcher may append flags of its own). A flag that
    /// `requires` another is written only with it. `--coop` is written by
    /// name: HYBCC's threshold is `--coop-hybcc-small-max` (in [`CoopArgs`]).
    pub fn to_args(&self) -> Vec<String> {
        let default = ProxyArgs::new(self.listen, String::new());
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        flag("--listen", self.listen.to_string());
        if let Some(admin) = self.admin_listen {
            flag("--admin-listen", admin.to_string());
        }
        if let Some(token) = &self.admin_token_file {
            flag("--admin-token-file", token.display().to_string());
        }
        flag("--mode", self.mode.to_string());
        if let Some(topology) = &self.topology {
            flag("--topology", topology.display().to_string());
        }
        if let Some(node) = self.node {
            flag("--node", node.to_string());
        }
        for upstream in &self.upstreams {
            flag("--upstream", upstream.clone());
        }
        if self.cache_bytes != default.cache_bytes {
            flag("--cache-bytes", self.cache_bytes.to_string());
        }
        if self.upstream_timeout_ms != default.upstream_timeout_ms {
            flag("--upstream-timeout-ms", self.upstream_timeout_ms.to_string());
        }
        if let Some(cpu) = self.cpu {
            flag("--cpu", cpu.to_string());
        }
        if self.state_slots != default.state_slots {
            flag("--state-slots", self.state_slots.to_string());
        }
        if let Some(balance) = self.balance {
            flag("--balance", balance.to_string());
            if let Some(monitor) = self.monitor {
                flag("--monitor", monitor.to_string());
            }
            if let Some(admit_max) = self.admit_max {
                flag("--admit-max", admit_max.to_string());
            }
            if let Some(site) = self.site {
                flag("--site", site.to_string());
            }
        }
        for monitor in &self.upstream_monitors {
            flag("--upstream-monitor", monitor.to_string());
        }
        if self.monitor_interval_ms != default.monitor_interval_ms {
            flag("--monitor-interval-ms", self.monitor_interval_ms.to_string());
        }
        if self.balance_seed != default.balance_seed {
            flag("--balance-seed", self.balance_seed.to_string());
        }
        if self.suspect_after_ms != default.suspect_after_ms {
            flag("--suspect-after-ms", self.suspect_after_ms.to_string());
        }
        if self.max_fails != default.max_fails {
            flag("--max-fails", self.max_fails.to_string());
        }
        if self.fail_timeout_ms != default.fail_timeout_ms {
            flag("--fail-timeout-ms", self.fail_timeout_ms.to_string());
        }
        if let Some(config) = &self.config {
            flag("--config", config.display().to_string());
        }
        if let (Some(coop), Some(_)) = (self.coop, &self.topology) {
            flag("--coop", coop.name().to_string());
        }
        if let Some(log) = &self.access_log {
            flag("--access-log", log.display().to_string());
        }
        if self.refresh_hot != default.refresh_hot {
            flag("--refresh-hot", self.refresh_hot.to_string());
        }
        if self.refresh_interval_ms != default.refresh_interval_ms {
            flag("--refresh-interval-ms", self.refresh_interval_ms.to_string());
        }
        if let Some(authority) = &self.default_authority {
            flag("--default-authority", authority.clone());
        }
        if self.set_cookie != default.set_cookie {
            flag("--set-cookie", self.set_cookie.name().to_string());
        }
        if self.serve_stale_on_error != default.serve_stale_on_error {
            flag("--serve-stale-on-error", self.serve_stale_on_error.to_string());
        }
        args.extend(self.coop_args.to_args());
        args.extend(self.limits.to_args());
        args.extend(self.front.to_args());
        if self.upstream_http2 {
            args.push("--upstream-http2".to_string());
        }
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_base::NodeId;

    fn parse(args: &ProxyArgs) -> ProxyArgs {
        let words = std::iter::once("proxy".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<ProxyArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn proxy_args_round_trip_through_their_words() {
        let args = ProxyArgs {
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin_listen: Some("127.0.0.1:9080".parse().unwrap()),
            admin_token_file: Some(PathBuf::from("/tmp/admin token")),
            upstreams: vec!["http://127.0.0.1:8081".into(), "http://127.0.0.1:8082".into()],
            mode: CacheMode::Ttl,
            topology: Some(PathBuf::from("/tmp/a dc.toml")),
            node: Some(2),
            cache_bytes: 4096,
            upstream_timeout_ms: 1234,
            cpu: Some(0),
            state_slots: 16,
            balance: Some(Policy::LeastLoaded),
            monitor: Some(Scheme::RdmaAsync),
            upstream_monitors: vec![
                BackendAddress { node: Some(NodeId(3)), socket: None },
                BackendAddress { node: Some(NodeId(4)), socket: Some("127.0.0.1:9101".parse().unwrap()) },
            ],
            monitor_interval_ms: 20,
            admit_max: Some(8),
            balance_seed: 5,
            suspect_after_ms: 0,
            max_fails: 3,
            fail_timeout_ms: 2_500,
            site: Some(1),
            config: Some(PathBuf::from("/tmp/proxy.toml")),
            coop: Some(tierstack_coop::Scheme::Mtacc),
            coop_args: CoopArgs {
                peers: vec![1, 2],
                passive: vec![7],
                pool_bytes: 1 << 20,
                ack_timeout_ms: 9,
                hybcc_small_max: 77,
                key_table_entries: 1 << 12,
                liveness_ms: 33,
            },
            limits: HttpLimitsArgs {
                header_read_timeout_ms: 0,
                body_read_timeout_ms: 0,
                write_timeout_ms: 4321,
                max_connections: 12,
                max_connections_per_client: Some(3),
            },
            front: FrontArgs {
                tls_cert: Some(PathBuf::from("/tmp/c.pem")),
                tls_key: Some(PathBuf::from("/tmp/k.pem")),
                http2_cleartext: true,
                http2_max_concurrent_streams: 9,
                ..FrontArgs::default()
            },
            upstream_http2: true,
            access_log: Some(PathBuf::from("/tmp/access.log")),
            refresh_hot: 0,
            refresh_interval_ms: 3,
            default_authority: Some("example.org:80".into()),
            set_cookie: crate::SetCookie::Strip,
            serve_stale_on_error: 30,
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
        };
        assert_eq!(parse(&args), args);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["proxy", "--listen", "127.0.0.1:8080", "--upstream", "http://127.0.0.1:8081"];
        let parsed = tierstack_testkit::args::parse::<ProxyArgs, _, _>(words).unwrap();
        assert_eq!(parsed, ProxyArgs::new("127.0.0.1:8080".parse().unwrap(), "http://127.0.0.1:8081".into()));
        assert_eq!(parse(&parsed), parsed);
    }

    /// Flags at their defaults are left out (but the mode), so a launcher
    /// may append its own without repeating one.
    #[test]
    fn defaults_are_not_written() {
        let args = ProxyArgs::new("127.0.0.1:8080".parse().unwrap(), "http://a:1".into());
        let words = ["--listen", "127.0.0.1:8080", "--mode", "poll", "--upstream", "http://a:1"];
        assert_eq!(args.to_args(), words);
    }

    /// Every `--set-cookie` policy's spelling in `to_args` is clap's.
    #[test]
    fn set_cookie_policies_round_trip() {
        use crate::SetCookie;
        for policy in [SetCookie::IfPublic, SetCookie::Never, SetCookie::Strip, SetCookie::Store] {
            let mut args = ProxyArgs::new("127.0.0.1:8080".parse().unwrap(), "http://a:1".into());
            args.set_cookie = policy;
            assert_eq!(parse(&args), args, "{policy:?}");
        }
    }

    #[test]
    fn cache_modes_round_trip() {
        for mode in [CacheMode::NoCache, CacheMode::Poll, CacheMode::Ttl] {
            assert_eq!(mode.to_string().parse::<CacheMode>().unwrap(), mode);
        }
    }
}
