//! The flags of `tierstack app-server`, spelled once: the binary's parser
//! flattens [`AppServerArgs`], a launcher builds its command line with
//! [`AppServerArgs::to_args`].

use crate::{PushPolicy, PushTarget, UPDATE_WRITE_PAUSE_DEFAULT, WRITE_THROUGH_TIMEOUT_DEFAULT};
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_base::NodeId;
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;
use tierstack_tier_http::HttpLimitsArgs;

/// The document set unless told otherwise (`--documents`).
pub const DOCUMENTS_DEFAULT: &str = "single";
/// Zipf documents unless told otherwise (`--docs`).
pub const DOCS_DEFAULT: usize = 20;
/// `--push-timeout-ms` unless told otherwise.
pub const PUSH_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// `--monitor-interval-ms` unless told otherwise.
pub const MONITOR_INTERVAL_MS_DEFAULT: u64 = 10;

/// `tierstack app-server`: the reference application server.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct AppServerArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    /// The application module's socket.
    #[arg(long)]
    pub module_socket: PathBuf,
    /// A user the module may run as besides this server's own user and
    /// root (repeatable); a socket served by anyone else is refused.
    #[arg(long = "module-uid")]
    pub module_uids: Vec<u32>,
    /// Documents: `single`, `zipf`, `worldcup` (as `tierstack load --trace`),
    /// or `file:PATH` with one `name size_bytes` per line.
    #[arg(long, default_value = DOCUMENTS_DEFAULT)]
    pub documents: String,
    /// Number of Zipf documents.
    #[arg(long, default_value_t = DOCS_DEFAULT)]
    pub docs: usize,
    /// Seed of the document set (worldcup's set depends on it).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CPU-burning threads emulating CGI and application work.
    #[arg(long, default_value_t = 0)]
    pub compute_threads: usize,
    /// Keep the documents in an embedded store: reads copy the stored body,
    /// updates rewrite it in two halves before UPDATE_DONE (so a read that
    /// overlaps an update would get a detectably mixed body).
    #[arg(long)]
    pub documents_in_store: bool,
    /// With --documents-in-store: pause between the two halves of an update's rewrite.
    #[arg(long, default_value_t = UPDATE_WRITE_PAUSE_DEFAULT.as_millis() as u64,
          requires = "documents_in_store")]
    pub update_write_pause_ms: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Push completed updates to proxies: pull | push | hybrid:<fraction> |
    /// useful:<probability>. Needs --topology, --node and --push-proxy.
    #[arg(long)]
    pub push_policy: Option<PushPolicy>,
    /// A proxy to push to, as `<fabric node>=<base URL of its --admin-listen>` (repeatable).
    #[arg(long = "push-proxy", value_parser = parse_push_target)]
    pub push_proxies: Vec<PushTarget>,
    /// Bound on each cache-state read and each push.
    #[arg(long, default_value_t = PUSH_TIMEOUT_MS_DEFAULT)]
    pub push_timeout_ms: u64,
    /// The file (mode 0600) holding the token the proxies' admin listeners
    /// require: the one given to their --admin-token-file. Every push
    /// carries it as `Authorization: Bearer <token>`.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Write-through: push each update to the proxies the policy picks
    /// before UPDATE_DONE, the update waiting at most
    /// --push-write-through-timeout-ms for it (then it goes on; counted).
    #[arg(long, requires = "push_policy")]
    pub push_write_through: bool,
    #[arg(long, default_value_t = WRITE_THROUGH_TIMEOUT_DEFAULT.as_millis() as u64,
          requires = "push_write_through")]
    pub push_write_through_timeout_ms: u64,
    /// Publish each update's new page: hand it to the module with
    /// UPDATE_DONE, so proxies whose copy went out of date read the new page
    /// one-sidedly instead of asking this server (best with the module's
    /// `--versions-at done`). The page is generated once per update, its
    /// --cpu-cost spent then.
    #[arg(long)]
    pub publish: bool,
    /// Topology and fabric node id of this server (for reading the proxies'
    /// cache states, and for publishing its load to the RDMA schemes).
    #[arg(long)]
    pub topology: Option<PathBuf>,
    #[arg(long)]
    pub node: Option<u32>,
    /// Publish this server's load (`monitor.load`): in registered memory on
    /// its fabric node when --topology/--node are given (RDMA-Sync,
    /// RDMA-Async), and through --monitor-listen (Socket-Sync, Socket-Async).
    #[arg(long)]
    pub publish_load: bool,
    /// Where the monitor's socket server listens (the socket schemes).
    #[arg(long, requires = "publish_load")]
    pub monitor_listen: Option<SocketAddr>,
    /// The monitor thread's period (RDMA-Async record, Socket-Async pushes).
    #[arg(long, default_value_t = MONITOR_INTERVAL_MS_DEFAULT, requires = "publish_load")]
    pub monitor_interval_ms: u64,
    /// Per-read CPU cost: `rubis` (a heavy-tailed "RUBiS-like" mix:
    /// bounded Pareto, alpha 1.1, 0.2-50 ms), `pareto:<alpha>,<min_us>,<max_us>`
    /// or `fixed:<us>` (every page costs exactly that); drawn from --seed.
    #[arg(long)]
    pub cpu_cost: Option<String>,
    /// Emulate a node of this many workers: each read's cost is spent in
    /// wall time holding a worker (not this machine's CPU), so several
    /// servers on one small machine each have their own capacity.
    #[arg(long, requires = "cpu_cost")]
    pub emulated_workers: Option<usize>,
    /// Reconfiguration: this server's first site. It registers a role word
    /// (`reconfig.role`) that agents (`tierstack reconfigure`) move between
    /// sites, and refuses requests stamped with another role. Needs
    /// --topology and --node.
    #[arg(long)]
    pub site: Option<u16>,
    /// The listener's limits (slow clients, connections).
    #[command(flatten)]
    pub limits: HttpLimitsArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    // `--metrics-listen`: the client listener does not serve `/metrics`
    // (a proxy forwards client paths to it).
    #[command(flatten)]
    pub observe: ObserveArgs,
}

/// `<fabric node>=<url>`, as `--push-proxy` takes it.
pub fn parse_push_target(text: &str) -> Result<PushTarget, String> {
    let (node, url) = text.split_once('=').ok_or_else(|| format!("{text:?}: expected <node>=<url>"))?;
    let node = node.parse::<u32>().map_err(|_| format!("{text:?}: {node:?} is not a node id"))?;
    Ok(PushTarget { node: NodeId(node), url: url.to_string() })
}

/// The word [`parse_push_target`] reads back into `target`.
pub fn push_target_arg(target: &PushTarget) -> String {
    format!("{}={}", target.node.0, target.url)
}

impl AppServerArgs {
    /// The proxies' admin token from `--admin-token-file`, its permissions checked.
    pub fn admin_token(&self) -> Result<Option<tierstack_secret::Secret>, tierstack_secret::SecretError> {
        self.admin_token_file.as_deref().map(tierstack_secret::read_secret_file).transpose()
    }

    /// The required flags given, every other one at its default.
    pub fn new(listen: SocketAddr, module_socket: PathBuf) -> AppServerArgs {
        AppServerArgs {
            listen,
            module_socket,
            module_uids: Vec::new(),
            documents: DOCUMENTS_DEFAULT.to_string(),
            docs: DOCS_DEFAULT,
            seed: 1,
            compute_threads: 0,
            documents_in_store: false,
            update_write_pause_ms: UPDATE_WRITE_PAUSE_DEFAULT.as_millis() as u64,
            cpu: None,
            push_policy: None,
            push_proxies: Vec::new(),
            push_timeout_ms: PUSH_TIMEOUT_MS_DEFAULT,
            admin_token_file: None,
            push_write_through: false,
            push_write_through_timeout_ms: WRITE_THROUGH_TIMEOUT_DEFAULT.as_millis() as u64,
            publish: false,
            topology: None,
            node: None,
            publish_load: false,
            monitor_listen: None,
            monitor_interval_ms: MONITOR_INTERVAL_MS_DEFAULT,
            cpu_cost: None,
            emulated_workers: None,
            site: None,
            limits: HttpLimitsArgs::default(),
            service: ServiceArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the required flags, then each flag whose value is
    /// not the parser's default (so that a launcher may append flags of its
    /// own without repeating one). A flag that `requires` another is
    /// written only with it.
    pub fn to_args(&self) -> Vec<String> {
        let default = AppServerArgs::new(self.listen, self.module_socket.clone());
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        if let Some(topology) = &self.topology {
            flag("--topology", topology.display().to_string());
        }
        if let Some(node) = self.node {
            flag("--node", node.to_string());
        }
        flag("--listen", self.listen.to_string());
        flag("--module-socket", self.module_socket.display().to_string());
        for uid in &self.module_uids {
            flag("--module-uid", uid.to_string());
        }
        if self.documents != default.documents {
            flag("--documents", self.documents.clone());
        }
        if self.docs != default.docs {
            flag("--docs", self.docs.to_string());
        }
        if self.seed != default.seed {
            flag("--seed", self.seed.to_string());
        }
        if self.compute_threads != default.compute_threads {
            flag("--compute-threads", self.compute_threads.to_string());
        }
        if let Some(cpu) = self.cpu {
            flag("--cpu", cpu.to_string());
        }
        if let Some(policy) = &self.push_policy {
            flag("--push-policy", policy.to_string());
        }
        for target in &self.push_proxies {
            flag("--push-proxy", push_target_arg(target));
        }
        if self.push_timeout_ms != default.push_timeout_ms {
            flag("--push-timeout-ms", self.push_timeout_ms.to_string());
        }
        if let Some(token) = &self.admin_token_file {
            flag("--admin-token-file", token.display().to_string());
        }
        if self.push_write_through && self.push_write_through_timeout_ms != default.push_write_through_timeout_ms {
            flag("--push-write-through-timeout-ms", self.push_write_through_timeout_ms.to_string());
        }
        if self.publish_load && self.monitor_interval_ms != default.monitor_interval_ms {
            flag("--monitor-interval-ms", self.monitor_interval_ms.to_string());
        }
        if let (true, Some(listen)) = (self.publish_load, self.monitor_listen) {
            flag("--monitor-listen", listen.to_string());
        }
        if let Some(cost) = &self.cpu_cost {
            flag("--cpu-cost", cost.clone());
            if let Some(workers) = self.emulated_workers {
                flag("--emulated-workers", workers.to_string());
            }
        }
        if let Some(site) = self.site {
            flag("--site", site.to_string());
        }
        if self.documents_in_store && self.update_write_pause_ms != default.update_write_pause_ms {
            flag("--update-write-pause-ms", self.update_write_pause_ms.to_string());
        }
        for (on, name) in [
            (self.documents_in_store, "--documents-in-store"),
            (self.push_write_through, "--push-write-through"),
            (self.publish, "--publish"),
            (self.publish_load, "--publish-load"),
        ] {
            if on {
                args.push(name.to_string());
            }
        }
        args.extend(self.limits.to_args());
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args.extend(self.observe.to_args());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &AppServerArgs) -> AppServerArgs {
        let words = std::iter::once("app-server".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<AppServerArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn app_server_args_round_trip_through_their_words() {
        let args = AppServerArgs {
            listen: "127.0.0.1:8081".parse().unwrap(),
            module_socket: PathBuf::from("/tmp/a module.sock"),
            module_uids: vec![1001, 65534],
            documents: "zipf".into(),
            docs: 33,
            seed: 9,
            compute_threads: 3,
            documents_in_store: true,
            update_write_pause_ms: 7,
            cpu: Some(1),
            push_policy: Some(PushPolicy::Hybrid { fraction: 0.25 }),
            push_proxies: vec![
                PushTarget { node: NodeId(1), url: "http://127.0.0.1:9001".into() },
                PushTarget { node: NodeId(2), url: "http://127.0.0.1:9002".into() },
            ],
            push_timeout_ms: 123,
            admin_token_file: Some(PathBuf::from("/tmp/admin token")),
            push_write_through: true,
            push_write_through_timeout_ms: 45,
            publish: true,
            topology: Some(PathBuf::from("/tmp/dc.toml")),
            node: Some(3),
            publish_load: true,
            monitor_listen: Some("127.0.0.1:9101".parse().unwrap()),
            monitor_interval_ms: 25,
            cpu_cost: Some("rubis".into()),
            emulated_workers: Some(4),
            site: Some(2),
            limits: HttpLimitsArgs {
                header_read_timeout_ms: 1,
                body_read_timeout_ms: 2,
                write_timeout_ms: 0,
                max_connections: 4,
                max_connections_per_client: Some(5),
            },
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
    }

    /// Flags at their defaults are left out, so a launcher may append its
    /// own without repeating one (`app-server` refuses a repeated flag).
    #[test]
    fn defaults_are_not_written() {
        let args = AppServerArgs::new("127.0.0.1:8081".parse().unwrap(), PathBuf::from("/tmp/m.sock"));
        assert_eq!(args.to_args(), ["--listen", "127.0.0.1:8081", "--module-socket", "/tmp/m.sock"]);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["app-server", "--listen", "127.0.0.1:8081", "--module-socket", "/tmp/m.sock"];
        let parsed = tierstack_testkit::args::parse::<AppServerArgs, _, _>(words).unwrap();
        assert_eq!(parsed, AppServerArgs::new("127.0.0.1:8081".parse().unwrap(), PathBuf::from("/tmp/m.sock")));
        assert_eq!(parse(&parsed), parsed);
    }
}
