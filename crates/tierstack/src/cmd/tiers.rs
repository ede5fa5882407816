//! The tier processes: `app-module`, `app-server`, `proxy`. Each prints
//! `ready` once it serves, and serves as a service (`crate::service`): until
//! SIGTERM or SIGINT (or its standard input's end with
//! `--stop-on-stdin-eof`), then drains its requests within the grace period.

use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;
use tierstack_appserver::observe::ModuleObserved;
use tierstack_appserver::{AppServer, AppServerConfig, CpuCost, PushConfig, StoreConfig};
pub(crate) use tierstack_appserver::{AppServerArgs, ModuleArgs};
use tierstack_base::NodeId;
use tierstack_cluster::pin_to_cpu;
use tierstack_coherent::module::{ModuleOptions, ModuleServer};
use tierstack_coherent::module_socket::{self, SocketAccess};
use tierstack_coherent::version_table::{Incarnation, VersionTable};
use tierstack_monitor::{AgentConfig, LoadPublisher, MonitorAgent, SourceConfig};
pub(crate) use tierstack_proxy::ProxyArgs;
use tierstack_proxy::{BalancerConfig, Balancing, CacheStateConfig, Proxy, ProxyConfig, ProxyOptions, Site};
use tierstack_tier_http::observe::ServingFlag;
use tierstack_tier_http::Stop;

use crate::service::{announce_ready, drain};

fn runtime(worker_threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(worker_threads.max(1)).enable_all().build()?)
}

pub(crate) fn app_module(args: ModuleArgs) -> Result<()> {
    let (_, fabric) = args.at.open()?;
    let incarnation = Incarnation(tierstack_base::fresh_seed());
    let table = Arc::new(VersionTable::create_with_pages(fabric.as_ref(), args.capacity, args.pages(), incarnation)?);
    if args.test_only_admit_reads_during_updates {
        let warning = "TEST ONLY: --test-only-admit-reads-during-updates is on: this module admits reads \
                       during updates, violating Table 1; responses may be stale or mixed. Never use it outside tests.";
        eprintln!("WARNING: {warning}");
        tracing::warn!("{warning}");
    }
    let group = args.socket_group.as_deref().map(module_socket::resolve_group).transpose();
    let access = SocketAccess { group: group.context("--socket-group")?, allowed_uids: args.allow_uids.clone() };
    let options = ModuleOptions {
        test_only_admit_reads_during_updates: args.test_only_admit_reads_during_updates,
        grant_lifetime: (args.grant_timeout_ms > 0).then(|| Duration::from_millis(args.grant_timeout_ms)),
        access: access.clone(),
        versions_at: args.versions_at,
    };
    let server = Arc::new(ModuleServer::with_options(table, &options).context("--grant-timeout-ms")?);
    let serving = ServingFlag::new();
    let observed = Arc::new(ModuleObserved::new(server.clone(), serving.clone()));
    let _observer = args.observe.start(observed)?;
    runtime(1)?.block_on(async {
        let listener = module_socket::bind(&args.socket, &access).await?;
        let signals = args.service.stop_signals()?;
        announce_ready()?;
        serving.set(true);
        let result = tokio::select! {
            result = server.serve_on(listener) => result.context("module server"),
            _ = signals.wait() => Ok(()),
        };
        serving.set(false);
        result
    })?;
    drop(fabric);
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
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
            admin_token: args.admin_token().context("--admin-token-file")?,
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
        module_uids: args.module_uids,
        documents: documents(&args.documents, args.docs, args.seed)?,
        compute_threads: args.compute_threads,
        store: args
            .documents_in_store
            .then(|| StoreConfig { update_write_pause: Duration::from_millis(args.update_write_pause_ms) }),
        publish: args.publish,
    };
    let role = match (args.site, &fabric) {
        (None, _) => None,
        (Some(site), Some(fabric)) => Some(
            tierstack_monitor::reconfig::register_role(fabric.as_ref(), site).context("registering reconfig.role")?,
        ),
        (Some(_), None) => anyhow::bail!("--site needs --topology and --node"),
    };
    runtime(2)?.block_on(async {
        let mut server = AppServer::bind_with_push(config, push).await?;
        server.set_limits(args.limits.serve_options());
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
        let serving_flag = ServingFlag::new();
        let _observer = args.observe.start(server.observed(serving_flag.clone()))?;
        let stop = Stop::new();
        let signals = args.service.stop_signals()?;
        let serving = tokio::spawn(server.run(stop.clone()));
        announce_ready()?;
        serving_flag.set(true);
        signals.wait().await;
        serving_flag.set(false);
        stop.stop();
        drain(serving, args.service.grace(), "application server").await?;
        drop(agent);
        Ok(())
    })
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
            let config = super::coop::config(&args.coop_args, topology, scheme)?;
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
            let config = SourceConfig {
                suspect_after: args.suspect_after(),
                ..SourceConfig::for_interval(Duration::from_millis(args.monitor_interval_ms))
            };
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
    let limits = args.limits.serve_options();
    // Certificate and key are checked before anything starts.
    let front = args.front.front().context("the client listener's TLS")?;
    let (failures, suspect_after) = (args.failures(), args.suspect_after());
    let admin_token = args.admin_token().context("--admin-token-file")?;
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
            header_read_timeout: limits.header_read_timeout,
            body_read_timeout: limits.body_read_timeout,
            write_timeout: limits.write_timeout,
            max_connections: limits.max_connections,
            max_connections_per_client: limits.max_connections_per_client,
            admin_token,
            access_log: args.access_log.clone(),
            default_authority: args.default_authority.clone(),
            refresh_hot: args.refresh_hot,
            refresh_interval: Duration::from_millis(args.refresh_interval_ms),
            failures,
            suspect_probe: suspect_after,
            set_cookie: args.set_cookie,
            serve_stale_on_error: Duration::from_secs(args.serve_stale_on_error),
            front: front.clone(),
            upstream_http2: args.upstream_http2,
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
        if let Some(tls) = &front.tls {
            tls.reload_on_sighup().context("installing the SIGHUP handler")?;
        }
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
