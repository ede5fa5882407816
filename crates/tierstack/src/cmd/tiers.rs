//! The tier processes: `app-module`, `app-server`, `proxy`. Each prints
//! `ready` once it serves, and serves as a service (`crate::service`): until
//! SIGTERM or SIGINT (or its standard input's end with
//! `--stop-on-stdin-eof`), then drains its requests within the grace period.

use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::{AppServer, AppServerConfig, CpuCost, PushConfig, PushPolicy, PushTarget, StoreConfig};
use tierstack_base::NodeId;
use tierstack_cluster::pin_to_cpu;
use tierstack_coherent::module::{ModuleOptions, ModuleServer};
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_monitor::{AgentConfig, BackendAddress, LoadPublisher, MonitorAgent, Scheme, SourceConfig};
use tierstack_proxy::{
    BalancerConfig, Balancing, CacheMode, CacheStateConfig, Policy, Proxy, ProxyConfig, ProxyOptions, Site,
};
use tierstack_tier_http::Stop;

use crate::service::{announce_ready, drain, ServiceArgs};

fn runtime(worker_threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(worker_threads.max(1)).enable_all().build()?)
}

#[derive(Args)]
pub(crate) struct ModuleArgs {
    /// The module's node (it owns the version table).
    #[command(flatten)]
    at: super::NodeArgs,
    /// Local socket for application servers.
    #[arg(long)]
    socket: PathBuf,
    /// Version table capacity (dependency keys).
    #[arg(long, default_value_t = 65_536)]
    capacity: u32,
    /// TEST ONLY, breaks coherence: admit reads while updates are in
    /// progress (violating Table 1), so end-to-end tests can show their
    /// checkers catch such a module.
    #[arg(long, hide = true)]
    test_only_admit_reads_during_updates: bool,
    #[command(flatten)]
    service: ServiceArgs,
}

pub(crate) fn app_module(args: ModuleArgs) -> Result<()> {
    let (_, fabric) = args.at.open()?;
    let incarnation = Incarnation(tierstack_base::fresh_seed());
    let table = Arc::new(VersionTable::create(fabric.as_ref(), args.capacity, incarnation)?);
    if args.test_only_admit_reads_during_updates {
        let warning = "TEST ONLY: --test-only-admit-reads-during-updates is on: this module admits reads \
                       during updates, violating Table 1; responses may be stale or mixed. Never use it outside tests.";
        eprintln!("WARNING: {warning}");
        tracing::warn!("{warning}");
    }
    let options = ModuleOptions { test_only_admit_reads_during_updates: args.test_only_admit_reads_during_updates };
    let server = ModuleServer::with_options(table, &options);
    runtime(1)?.block_on(async {
        let listener = ModuleServer::bind(&args.socket)?;
        let signals = args.service.stop_signals()?;
        announce_ready()?;
        tokio::select! {
            result = server.serve_on(listener) => result.context("module server"),
            _ = signals.wait() => Ok(()),
        }
    })?;
    drop(fabric);
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

#[derive(Args)]
pub(crate) struct AppServerArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// The application module's socket.
    #[arg(long)]
    module_socket: PathBuf,
    /// Documents: `single`, `zipf`, `worldcup` (as `tierstack load --trace`),
    /// or `file:PATH` with one `name size_bytes` per line.
    #[arg(long, default_value = "single")]
    documents: String,
    /// Number of Zipf documents.
    #[arg(long, default_value_t = 20)]
    docs: usize,
    /// Seed of the document set (worldcup's set depends on it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CPU-burning threads emulating CGI and application work.
    #[arg(long, default_value_t = 0)]
    compute_threads: usize,
    /// Keep the documents in an embedded store: reads copy the stored body,
    /// updates rewrite it in two halves before UPDATE_DONE (so a read that
    /// overlaps an update would get a detectably mixed body).
    #[arg(long)]
    documents_in_store: bool,
    /// With --documents-in-store: pause between the two halves of an update's rewrite.
    #[arg(long, default_value_t = tierstack_appserver::UPDATE_WRITE_PAUSE_DEFAULT.as_millis() as u64,
          requires = "documents_in_store")]
    update_write_pause_ms: u64,
    #[arg(long)]
    cpu: Option<usize>,
    /// Push completed updates to proxies: pull | push | hybrid:<fraction> |
    /// useful:<probability>. Needs --topology, --node and --push-proxy.
    #[arg(long)]
    push_policy: Option<PushPolicy>,
    /// A proxy to push to, as `<fabric node>=<base URL of its --admin-listen>` (repeatable).
    #[arg(long = "push-proxy", value_parser = parse_push_target)]
    push_proxies: Vec<PushTarget>,
    /// Bound on each cache-state read and each push.
    #[arg(long, default_value_t = 5_000)]
    push_timeout_ms: u64,
    /// Write-through: push each update to the proxies the policy picks
    /// before UPDATE_DONE, the update waiting at most
    /// --push-write-through-timeout-ms for it (then it goes on; counted).
    #[arg(long, requires = "push_policy")]
    push_write_through: bool,
    #[arg(long, default_value_t = tierstack_appserver::WRITE_THROUGH_TIMEOUT_DEFAULT.as_millis() as u64,
          requires = "push_write_through")]
    push_write_through_timeout_ms: u64,
    /// Topology and fabric node id of this server (for reading the proxies'
    /// cache states, and for publishing its load to the RDMA schemes).
    #[arg(long)]
    topology: Option<PathBuf>,
    #[arg(long)]
    node: Option<u32>,
    /// Publish this server's load (`monitor.load`): in registered memory on
    /// its fabric node when --topology/--node are given (RDMA-Sync,
    /// RDMA-Async), and through --monitor-listen (Socket-Sync, Socket-Async).
    #[arg(long)]
    publish_load: bool,
    /// Where the monitor's socket server listens (the socket schemes).
    #[arg(long, requires = "publish_load")]
    monitor_listen: Option<SocketAddr>,
    /// The monitor thread's period (RDMA-Async record, Socket-Async pushes).
    #[arg(long, default_value_t = 10, requires = "publish_load")]
    monitor_interval_ms: u64,
    /// Per-read CPU cost: `rubis` (a heavy-tailed "RUBiS-like" mix:
    /// bounded Pareto, alpha 1.1, 0.2-50 ms) or `pareto:<alpha>,<min_us>,<max_us>`;
    /// drawn from --seed.
    #[arg(long)]
    cpu_cost: Option<String>,
    /// Emulate a node of this many workers: each read's cost is spent in
    /// wall time holding a worker (not this machine's CPU), so several
    /// servers on one small machine each have their own capacity.
    #[arg(long, requires = "cpu_cost")]
    emulated_workers: Option<usize>,
    /// Reconfiguration: this server's first site. It registers a role word
    /// (`reconfig.role`) that agents (`tierstack reconfigure`) move between
    /// sites, and refuses requests stamped with another role. Needs
    /// --topology and --node.
    #[arg(long)]
    site: Option<u16>,
    #[command(flatten)]
    service: ServiceArgs,
}

fn parse_push_target(text: &str) -> Result<PushTarget, String> {
    let (node, url) = text.split_once('=').ok_or_else(|| format!("{text:?}: expected <node>=<url>"))?;
    let node = node.parse::<u32>().map_err(|_| format!("{text:?}: {node:?} is not a node id"))?;
    Ok(PushTarget { node: NodeId(node), url: url.to_string() })
}

/// The document set named by `spec` (see `AppServerArgs::documents`).
pub(crate) fn documents(spec: &str, docs: usize, seed: u64) -> Result<Vec<(String, usize)>> {
    if let Some(path) = spec.strip_prefix("file:") {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        return text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|line| {
                let mut words = line.split_whitespace();
                let name = words.next().context("empty line")?.to_string();
                let size = words.next().with_context(|| format!("no size for {name}"))?.parse()?;
                Ok((name, size))
            })
            .collect();
    }
    let trace = tierstack_workload::TraceSpec::parse(spec, 0.75, docs)?.build(seed)?;
    Ok(trace.documents().iter().map(|d| (d.name.clone(), d.size_bytes as usize)).collect())
}

pub(crate) fn app_server(args: AppServerArgs) -> Result<()> {
    if let Some(cpu) = args.cpu {
        pin_to_cpu(cpu)?;
    }
    let fabric = match (&args.topology, args.node) {
        (Some(path), Some(node)) => Some(super::open_node(path, NodeId(node))?.1),
        (None, None) => None,
        _ => anyhow::bail!("--topology and --node go together"),
    };
    let push = match (args.push_policy, &fabric) {
        (None, _) if args.push_proxies.is_empty() => None,
        (Some(policy), Some(fabric)) if !args.push_proxies.is_empty() => Some(PushConfig {
            fabric: fabric.clone(),
            proxies: args.push_proxies.clone(),
            policy,
            timeout: Duration::from_millis(args.push_timeout_ms),
            write_through: args.push_write_through.then(|| Duration::from_millis(args.push_write_through_timeout_ms)),
        }),
        _ => anyhow::bail!("--push-policy, --push-proxy, --topology and --node go together"),
    };
    let cpu_cost = args.cpu_cost.as_deref().map(|spec| CpuCost::parse(spec, args.seed)).transpose();
    let cpu_cost = cpu_cost.map_err(anyhow::Error::msg).context("--cpu-cost")?;
    let publisher = match (&fabric, args.publish_load) {
        (_, false) => None,
        (Some(fabric), true) => Some(LoadPublisher::register(fabric.as_ref()).context("registering monitor.load")?),
        (None, true) => Some(LoadPublisher::unregistered()?),
    };
    let agent = match &publisher {
        Some(publisher) => Some(MonitorAgent::start(
            publisher.clone(),
            AgentConfig {
                interval: Duration::from_millis(args.monitor_interval_ms),
                write_record: true,
                socket_listen: args.monitor_listen,
            },
        )?),
        None => None,
    };
    let config = AppServerConfig {
        listen: args.listen,
        module_socket: args.module_socket,
        documents: documents(&args.documents, args.docs, args.seed)?,
        compute_threads: args.compute_threads,
        store: args
            .documents_in_store
            .then(|| StoreConfig { update_write_pause: Duration::from_millis(args.update_write_pause_ms) }),
    };
    let role = match (args.site, &fabric) {
        (None, _) => None,
        (Some(site), Some(fabric)) => Some(
            tierstack_monitor::reconfig::register_role(fabric.as_ref(), site).context("registering reconfig.role")?,
        ),
        (Some(_), None) => anyhow::bail!("--site needs --topology and --node"),
    };
    runtime(2)?.block_on(async {
        let server = AppServer::bind_with_push(config, push).await?;
        if let Some(role) = role {
            server.set_role(role);
        }
        if let Some(workers) = args.emulated_workers {
            anyhow::ensure!(server.set_emulated_workers(workers), "--emulated-workers must be at least 1");
        }
        if let Some(publisher) = &publisher {
            server.publish_load(publisher.clone());
        }
        if let Some(cost) = cpu_cost {
            server.set_cpu_cost(cost);
        }
        let stop = Stop::new();
        let signals = args.service.stop_signals()?;
        let serving = tokio::spawn(server.run(stop.clone()));
        announce_ready()?;
        signals.wait().await;
        stop.stop();
        drain(serving, args.service.grace(), "application server").await?;
        drop(agent);
        Ok(())
    })
}

#[derive(Args)]
pub(crate) struct ProxyArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// Where the admin endpoints listen (the application tier's pushes,
    /// `/_tierstack/stats`); keep it off the clients' network. Without it,
    /// nothing can push to this proxy.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Application server base URL (repeatable).
    #[arg(long = "upstream", required = true)]
    upstreams: Vec<String>,
    /// no-cache | poll | ttl
    #[arg(long, default_value = "poll")]
    mode: CacheMode,
    /// Topology and node id of this proxy's fabric node (needed for poll).
    #[arg(long)]
    topology: Option<PathBuf>,
    #[arg(long)]
    node: Option<u32>,
    #[arg(long, default_value_t = 256 << 20)]
    cache_bytes: usize,
    #[arg(long, default_value_t = 30_000)]
    upstream_timeout_ms: u64,
    #[arg(long)]
    cpu: Option<usize>,
    /// Documents tracked in the shared cache state the application tier
    /// reads to decide pushes (a multiple of 8, at most 336; 0 = none).
    #[arg(long, default_value_t = tierstack_proxy::CACHE_STATE_SLOTS_DEFAULT)]
    state_slots: u32,
    /// How to pick the upstream of a forwarded request: hash (by path, the
    /// default routing), round-robin, least-loaded.
    #[arg(long)]
    balance: Option<Policy>,
    /// Where the balancer's load comes from: socket-async, socket-sync,
    /// rdma-async, rdma-sync. Needs one --upstream-monitor per --upstream.
    #[arg(long, requires = "balance")]
    monitor: Option<Scheme>,
    /// Each upstream's monitor, in --upstream order, as
    /// `<fabric node>@<socket address>` (either part may be empty:
    /// `3@` for the RDMA schemes, `@127.0.0.1:9101` for the socket ones).
    #[arg(long = "upstream-monitor", value_parser = parse_backend_address)]
    upstream_monitors: Vec<BackendAddress>,
    /// Socket-Async's and RDMA-Async's interval, to judge staleness (as the
    /// app servers' --monitor-interval-ms).
    #[arg(long, default_value_t = 10)]
    monitor_interval_ms: u64,
    /// Admission control: answer 503 when the chosen upstream's estimated
    /// load (running threads + requests in flight) is at least this.
    #[arg(long, requires = "balance")]
    admit_max: Option<u32>,
    /// Seed of the balancer's tie-breaking.
    #[arg(long, default_value_t = 1)]
    balance_seed: u64,
    /// Reconfiguration: route only to the upstreams whose role word (read
    /// one-sidedly before each choice) names this site. Needs --balance,
    /// --topology/--node, and a fabric node in every --upstream-monitor.
    #[arg(long, requires = "balance")]
    site: Option<u16>,
    /// A TOML file of these flags (see `cmd::proxy_config`); flags given
    /// here override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Cooperative caching across the proxies (issue 12): ac | bcc | ccwr |
    /// mtacc | hybcc | groupcache. The proxies of the topology (or
    /// --coop-peers) cooperate; its passive nodes (or --coop-passive, each
    /// running `tierstack coop-node`) lend their memory to MTACC/HYBCC.
    /// Needs --topology/--node. `--cache-bytes` stays a private first level
    /// in front of the pool (0: the pool is the whole cache).
    #[arg(long, value_parser = super::coop::parse_scheme, requires = "topology")]
    coop: Option<tierstack_coop::Scheme>,
    #[command(flatten)]
    coop_args: super::coop::CoopArgs,
    /// Close a client connection that has not sent a whole request header
    /// this long after it began waiting for one (also idle keep-alives).
    /// 0: no such timeout.
    #[arg(long, default_value_t = tierstack_proxy::HEADER_READ_TIMEOUT_DEFAULT.as_millis() as u64)]
    header_read_timeout_ms: u64,
    /// At most this many client connections at once.
    #[arg(long, default_value_t = tierstack_proxy::MAX_CONNECTIONS_DEFAULT)]
    max_connections: usize,
    /// Append a Combined Log Format line per client request to this file
    /// (`tierstack load` replays it as the trace `clf:PATH`).
    #[arg(long)]
    access_log: Option<PathBuf>,
    /// Proxy-side refresh (poll mode): watch this many of the hottest cached
    /// documents with dependencies, read their versions in one batch every
    /// --refresh-interval-ms, and refetch a changed one before clients ask
    /// (for upstreams that do not push). 0: off.
    #[arg(long, default_value_t = tierstack_proxy::REFRESH_HOT_DEFAULT)]
    refresh_hot: usize,
    /// How often the refresh reads the hot documents' versions.
    #[arg(long, default_value_t = tierstack_proxy::REFRESH_INTERVAL_DEFAULT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    refresh_interval_ms: u64,
    /// The authority (`host:port`) of requests without a Host, under which
    /// pushed documents are cached (default: the --listen address).
    #[arg(long)]
    default_authority: Option<String>,
    #[command(flatten)]
    service: ServiceArgs,
}

fn parse_backend_address(text: &str) -> Result<BackendAddress, String> {
    let (node, socket) = text.split_once('@').ok_or_else(|| format!("{text:?}: expected <node>@<socket>"))?;
    let node = match node {
        "" => None,
        node => Some(NodeId(node.parse::<u32>().map_err(|_| format!("{text:?}: {node:?} is not a node id"))?)),
    };
    let socket = match socket {
        "" => None,
        socket => Some(socket.parse::<SocketAddr>().map_err(|_| format!("{text:?}: {socket:?} is not host:port"))?),
    };
    Ok(BackendAddress { node, socket })
}

pub(crate) fn proxy(args: ProxyArgs) -> Result<()> {
    if let Some(path) = &args.config {
        tracing::info!(path = %path.display(), "configuration file expanded into flags");
    }
    let (topology, fabric) = match (&args.topology, args.node) {
        (Some(path), Some(node)) => {
            let (topology, fabric) = super::open_node(path, NodeId(node))?;
            (Some(topology), Some(fabric))
        }
        (None, None) => (None, None),
        _ => anyhow::bail!("--topology and --node go together"),
    };
    let coop = match (args.coop, &topology, &fabric) {
        (None, _, _) => None,
        (Some(scheme), Some(topology), Some(fabric)) => {
            let config = args.coop_args.config(topology, scheme)?;
            Some(tierstack_proxy::CoopHandle::start(fabric.clone(), config).context("starting the cooperative cache")?)
        }
        (Some(_), _, _) => anyhow::bail!("--coop needs --topology and --node"),
    };
    if let Some(cpu) = args.cpu {
        pin_to_cpu(cpu)?;
    }
    let source = match args.monitor {
        None if args.upstream_monitors.is_empty() => None,
        None => anyhow::bail!("--upstream-monitor needs --monitor"),
        Some(scheme) => {
            anyhow::ensure!(
                args.upstream_monitors.len() == args.upstreams.len(),
                "--monitor needs one --upstream-monitor per --upstream ({} for {})",
                args.upstream_monitors.len(),
                args.upstreams.len()
            );
            let config = SourceConfig::for_interval(Duration::from_millis(args.monitor_interval_ms));
            Some(tierstack_monitor::open_source(scheme, fabric.clone(), &args.upstream_monitors, config)?)
        }
    };
    let balancing = args.balance.map(|policy| Balancing {
        config: BalancerConfig { admit_max: args.admit_max, seed: args.balance_seed, ..BalancerConfig::new(policy) },
        source,
    });
    let site = match (args.site, &fabric) {
        (None, _) => None,
        (Some(_), None) => anyhow::bail!("--site needs --topology and --node"),
        (Some(site), Some(fabric)) => {
            anyhow::ensure!(
                args.upstream_monitors.len() == args.upstreams.len()
                    && args.upstream_monitors.iter().all(|m| m.node.is_some()),
                "--site needs one --upstream-monitor with a fabric node per --upstream"
            );
            let roles = args
                .upstream_monitors
                .iter()
                .filter_map(|m| m.node)
                .map(|node| {
                    fabric
                        .connect(node, tierstack_monitor::reconfig::ROLE_REGION)
                        .with_context(|| format!("connecting to {node}'s role region"))
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Site { site, roles })
        }
    };
    let config = ProxyConfig {
        listen: args.listen,
        upstreams: args.upstreams,
        mode: args.mode,
        cache_bytes: args.cache_bytes,
        upstream_timeout: Duration::from_millis(args.upstream_timeout_ms),
        fabric,
        admin_listen: args.admin_listen,
    };
    runtime(2)?.block_on(async {
        let cache_state =
            (args.state_slots > 0).then(|| CacheStateConfig { slots: args.state_slots, ..CacheStateConfig::default() });
        if let Some(state) = &cache_state {
            state.validate().context("--state-slots")?;
        }
        let options = ProxyOptions {
            cache_state,
            header_read_timeout: (args.header_read_timeout_ms > 0)
                .then(|| Duration::from_millis(args.header_read_timeout_ms)),
            max_connections: Some(args.max_connections),
            access_log: args.access_log.clone(),
            default_authority: args.default_authority.clone(),
            refresh_hot: args.refresh_hot,
            refresh_interval: Duration::from_millis(args.refresh_interval_ms),
        };
        let proxy = Proxy::bind_with(config, options).await?;
        if let Some(balancing) = balancing {
            proxy.set_balancing(balancing)?;
        }
        if let Some(site) = site {
            proxy.set_site(site)?;
        }
        if let Some(coop) = coop {
            proxy.set_coop(coop)?;
        }
        let stop = Stop::new();
        let signals = args.service.stop_signals()?;
        let serving = tokio::spawn(proxy.run(stop.clone()));
        announce_ready()?;
        signals.wait().await;
        stop.stop();
        drain(serving, args.service.grace(), "proxy").await?;
        anyhow::Ok(())
    })?;
    // The proxy's fabric node went with its runtime's tasks: its regions
    // (the cache state) are revoked.
    Ok(())
}
