//! A 2-tier data-center on localhost, as processes: the application module
//! (fabric node 0, owner of the version table), the application server, and
//! P proxies (fabric nodes 1..=P). Used by `tierstack demo` and
//! `tierstack bench coherence`.
//!
//! With two or more CPUs the application tier (module, server and its
//! compute threads) is pinned to the last CPU and the proxies to CPU 0, so
//! the tiers act as separate nodes, as in the paper's testbed.
//! [`DeploymentOptions::application_tier_sessions`] also runs the module
//! and the application server each in a session of their own
//! ([`ChildNode::spawn_in_own_session`]), as `tierstack demo` does.
//!
//! [`Deployment::start_with`] adds what [`DeploymentOptions`] asks for: a push
//! policy (the application server then becomes fabric node P+1, reads the
//! proxies' cache states and pushes updates: `tierstack bench push-pull`),
//! and the proxies' cache and cache-state sizes.
//!
//! The proxies run with an admin token ([`write_admin_token`], in the
//! deployment's scratch directory), which the application server sends with
//! every push.

use crate::process::{free_loopback_port, write_topology, ChildNode, NodeLine};
use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tierstack_appserver::{AppServerArgs, ModuleArgs, PushPolicy, PushTarget};
use tierstack_base::NodeId;
use tierstack_cluster::{Backend, NodeArgs};
use tierstack_proxy::{CacheMode, ProxyArgs, ProxyStats};

/// Warm-up fetches in flight at once (see [`Deployment::warm_up`]).
pub const WARM_UP_CONCURRENCY: usize = 16;

/// What to start.
#[derive(Clone, Debug)]
pub struct DeploymentConfig {
    /// The `tierstack` executable.
    pub exe: PathBuf,
    pub backend: Backend,
    /// Proxy cache mode: `no-cache`, `poll` or `ttl`.
    pub mode: String,
    pub proxies: u32,
    pub compute_threads: usize,
    /// Document set, as `tierstack app-server --documents`.
    pub documents: String,
    pub docs: usize,
    pub seed: u64,
    pub pin: bool,
}

/// Optional parts of a deployment. `Default` starts what
/// [`Deployment::start`] starts.
#[derive(Clone, Debug, Default)]
pub struct DeploymentOptions {
    /// The application server's push policy (`pull`, `push`,
    /// `hybrid:<fraction>`, `useful:<probability>`); `None`: no push path.
    /// With one, the proxies run with `--refresh-hot 0` (proxy-side refresh
    /// is for upstreams that do not push) unless `ExtraArgs::proxy` names it.
    pub push_policy: Option<String>,
    /// Each proxy's `--cache-bytes`; `None`: the proxy's default.
    pub proxy_cache_bytes: Option<usize>,
    /// Each proxy's `--state-slots`; `None`: the proxy's default.
    pub state_slots: Option<u32>,
    /// Start the module and the application server each in a session of
    /// its own, as processes of another machine. Linux's autogroup
    /// scheduling shares one CPU weight among a session's processes, spread
    /// over the CPUs where they run: in our session the server's busy
    /// compute threads would leave the proxies and the load client on the
    /// other CPU almost no weight, and any other session's work there would
    /// starve them. The cost: a session cannot be joined, so the module's
    /// responder gets about half the busy CPU rather than one thread's
    /// share, and two-sided checks wait less than on a loaded node.
    pub application_tier_sessions: bool,
    /// With a push policy: push each update before UPDATE_DONE
    /// (`tierstack app-server --push-write-through`), the update waiting
    /// at most this long for it.
    pub write_through: Option<Duration>,
}

/// Extra command-line arguments for the application tier's processes (for
/// modes only tests use, such as the store mode and the module's test-only
/// switches). Empty by default.
#[derive(Clone, Debug, Default)]
pub struct ExtraArgs {
    /// Appended to `tierstack app-module`.
    pub app_module: Vec<String>,
    /// Appended to `tierstack app-server`.
    pub app_server: Vec<String>,
    /// Appended to every `tierstack proxy`.
    pub proxy: Vec<String>,
}

/// A running deployment; dropping it stops every process.
pub struct Deployment {
    pub proxy_urls: Vec<String>,
    pub app_url: String,
    proxy_addrs: Vec<SocketAddr>,
    /// Each proxy's admin listener (pushes, stats).
    admin_addrs: Vec<SocketAddr>,
    app_addr: SocketAddr,
    // Stopped first, by `stop`, `drop` or `stop_proxy`.
    proxy_children: Vec<Option<ChildNode>>,
    // Then in reverse start order: server, module.
    children: Vec<ChildNode>,
    // How to start the module and the server again (`restart_application_tier`).
    exe: PathBuf,
    module_args: Vec<String>,
    app_args: Vec<String>,
    application_tier_sessions: bool,
    /// Started by [`Deployment::start_supervised`]: every process is under it.
    supervisor: Option<crate::supervise::Supervisor>,
    _scratch: tempfile::TempDir,
}

/// A command line's arguments, owned.
pub fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A deployment's proxy: its client and admin listeners, cache mode,
/// topology file and fabric node, no upstream yet.
pub fn proxy(listen: SocketAddr, admin: SocketAddr, mode: CacheMode, topology: &Path, node: u32) -> ProxyArgs {
    ProxyArgs {
        admin_listen: Some(admin),
        mode,
        topology: Some(topology.to_path_buf()),
        node: Some(node),
        upstreams: Vec::new(),
        ..ProxyArgs::new(listen, String::new())
    }
}

/// The start of every `tierstack proxy` command line a deployment runs
/// ([`proxy`]'s words). A `mode` the proxy does not know goes through as
/// given, so that the proxy refuses it as it would any command line's.
pub fn proxy_args(listen: SocketAddr, admin: SocketAddr, mode: &str, topology: &str, node: u32) -> Vec<String> {
    let mut args = strings(&["proxy"]);
    match mode.parse::<CacheMode>() {
        Ok(mode) => args.extend(proxy(listen, admin, mode, Path::new(topology), node).to_args()),
        Err(_) => {
            args.extend(proxy(listen, admin, CacheMode::Poll, Path::new(topology), node).to_args());
            // Later flags override earlier ones for `tierstack proxy`.
            args.extend(strings(&["--mode", mode]));
        }
    }
    args
}

/// A fresh admin token for the proxies (and the server that pushes to
/// them), in a new 0600 file in `dir`: deployments run with the admin
/// listeners' check on, as a production one should.
pub fn write_admin_token(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("admin.token");
    let token: String = tierstack_secret::random_nonce::<32>().iter().map(|b| format!("{b:02x}")).collect();
    tierstack_secret::write_new_secret_file(&path, format!("{token}\n").as_bytes())
        .with_context(|| format!("writing the admin token {}", path.display()))?;
    Ok(path)
}

impl Deployment {
    pub fn start(config: &DeploymentConfig) -> Result<Deployment> {
        Self::start_with(config, &DeploymentOptions::default())
    }

    /// As [`Deployment::start`], with `options`.
    pub fn start_with(config: &DeploymentConfig, options: &DeploymentOptions) -> Result<Deployment> {
        Self::start_with_args(config, options, &ExtraArgs::default())
    }

    /// As [`Deployment::start_with`], passing `extra` arguments to the
    /// application module and server.
    pub fn start_with_args(
        config: &DeploymentConfig,
        options: &DeploymentOptions,
        extra: &ExtraArgs,
    ) -> Result<Deployment> {
        let scratch = tempfile::Builder::new().prefix("tierstack-deploy-").tempdir()?;
        let cpus = tierstack_cluster::online_cpus();
        let (front_cpu, app_cpu) = if config.pin && cpus >= 2 { (Some(0), Some(cpus - 1)) } else { (None, None) };
        let mut nodes = vec![NodeLine { id: 0, role: "app", cpu: app_cpu }];
        nodes.extend((1..=config.proxies).map(|id| NodeLine { id, role: "proxy", cpu: front_cpu }));
        let app_node = config.proxies + 1;
        if options.push_policy.is_some() {
            nodes.push(NodeLine { id: app_node, role: "app", cpu: app_cpu });
        }
        let topology = write_topology(scratch.path(), "dc", config.backend, 1000, &nodes)?;
        let socket = scratch.path().join("module.sock");
        let admin_token = write_admin_token(scratch.path())?;
        let mut children = Vec::new();

        let mut module_args = strings(&["app-module"]);
        module_args.extend(ModuleArgs::new(NodeArgs { topology: topology.clone(), node: 0 }, socket.clone()).to_args());
        module_args.extend(extra.app_module.iter().cloned());
        let spawn_tier =
            if options.application_tier_sessions { ChildNode::spawn_in_own_session } else { ChildNode::spawn };
        let module = spawn_tier(&config.exe, &module_args).context("starting the application module")?;
        children.push(module);

        let app_addr = free_loopback_port()?;
        let mut server = AppServerArgs {
            documents: config.documents.clone(),
            docs: config.docs,
            seed: config.seed,
            compute_threads: config.compute_threads,
            cpu: app_cpu,
            ..AppServerArgs::new(app_addr, socket)
        };
        // With a push path the server must know the proxies' admin
        // addresses, so they are chosen now; otherwise each just before its
        // proxy starts, which leaves a free port less time to be taken by
        // someone else.
        let mut admin_addrs = Vec::new();
        if options.push_policy.is_some() {
            for _ in 0..config.proxies {
                admin_addrs.push(free_loopback_port()?);
            }
        }
        if let Some(policy) = &options.push_policy {
            let policy = policy.parse::<PushPolicy>().map_err(anyhow::Error::msg).context("the push policy")?;
            server.push_policy = Some(policy);
            server.topology = Some(topology.clone());
            server.node = Some(app_node);
            server.admin_token_file = Some(admin_token.clone());
            server.push_proxies = (1..=config.proxies)
                .zip(&admin_addrs)
                .map(|(node, addr)| PushTarget { node: NodeId(node), url: format!("http://{addr}") })
                .collect();
            if let Some(bound) = options.write_through {
                server.push_write_through = true;
                server.push_write_through_timeout_ms = bound.as_millis().max(1) as u64;
            }
        }
        let mut app_args = strings(&["app-server"]);
        app_args.extend(server.to_args());
        app_args.extend(extra.app_server.iter().cloned());
        children.push(spawn_tier(&config.exe, &app_args).context("starting the application server")?);
        let app_url = format!("http://{app_addr}");
        let mode = config.mode.parse::<CacheMode>().map_err(anyhow::Error::msg).context("the proxies' cache mode")?;

        let mut proxy_children = Vec::new();
        let mut proxy_addrs = Vec::new();
        for node in 1..=config.proxies {
            let index = (node - 1) as usize;
            if admin_addrs.len() <= index {
                admin_addrs.push(free_loopback_port()?);
            }
            let addr = free_loopback_port()?;
            proxy_addrs.push(addr);
            let mut args = ProxyArgs {
                upstreams: vec![app_url.clone()],
                admin_token_file: Some(admin_token.clone()),
                ..proxy(addr, admin_addrs[index], mode, &topology, node)
            };
            if let Some(bytes) = options.proxy_cache_bytes {
                args.cache_bytes = bytes;
            }
            if let Some(slots) = options.state_slots {
                args.state_slots = slots;
            }
            // Proxy-side refresh is for upstreams that do not push: with a
            // push path the proxies leave it off (`extra` may turn it on).
            if options.push_policy.is_some() {
                args.refresh_hot = 0;
            }
            let mut proxy_args = strings(&["proxy"]);
            proxy_args.extend(args.to_args());
            proxy_args.extend(extra.proxy.iter().cloned());
            let child = ChildNode::spawn(&config.exe, &proxy_args).with_context(|| format!("starting proxy {node}"))?;
            proxy_children.push(Some(child));
        }
        Ok(Deployment {
            proxy_urls: proxy_addrs.iter().map(|a| format!("http://{a}")).collect(),
            app_url,
            proxy_addrs,
            admin_addrs,
            app_addr,
            proxy_children,
            children,
            exe: config.exe.clone(),
            module_args,
            app_args,
            application_tier_sessions: options.application_tier_sessions,
            supervisor: None,
            _scratch: scratch,
        })
    }

    /// The same data-center as [`Deployment::start`], started the way
    /// `tierstack cluster up` starts one: a topology whose `[node.service]`
    /// sections name every process (module 0, proxies 1..=P, the server
    /// P+1), under the in-process supervisor ([`crate::supervise`]) with the
    /// processes tied to this one. Each runs in a session of its own (as
    /// [`DeploymentOptions::application_tier_sessions`] asks for the
    /// application tier); one that dies is restarted. `tierstack demo` runs
    /// this way.
    pub fn start_supervised(config: &DeploymentConfig) -> Result<Deployment> {
        let scratch = tempfile::Builder::new().prefix("tierstack-deploy-").tempdir()?;
        let cpus = tierstack_cluster::online_cpus();
        let (front_cpu, app_cpu) = if config.pin && cpus >= 2 { (Some(0), Some(cpus - 1)) } else { (None, None) };
        let app_node = config.proxies + 1;
        let mut nodes = vec![NodeLine { id: 0, role: "app", cpu: app_cpu }];
        nodes.extend((1..=config.proxies).map(|id| NodeLine { id, role: "proxy", cpu: front_cpu }));
        nodes.push(NodeLine { id: app_node, role: "app", cpu: app_cpu });
        let admin_token = write_admin_token(scratch.path())?;
        let app_addr = free_loopback_port()?;
        let quoted = |words: &[String]| words.iter().map(|w| format!("{w:?}")).collect::<Vec<_>>().join(", ");
        let server_args = strings(&["--documents", &config.documents]).into_iter().chain(strings(&[
            "--docs",
            &config.docs.to_string(),
            "--seed",
            &config.seed.to_string(),
            "--compute-threads",
            &config.compute_threads.to_string(),
        ]));
        let mut services = vec![
            (
                0,
                format!(
                    "kind = \"app-module\"\nsocket = {:?}",
                    scratch.path().join("module.sock").display().to_string()
                ),
            ),
            (
                app_node,
                format!(
                    "kind = \"app-server\"\nlisten = \"{app_addr}\"\nmodule = 0\nargs = [{}]",
                    quoted(&server_args.collect::<Vec<_>>())
                ),
            ),
        ];
        let (mut proxy_addrs, mut admin_addrs) = (Vec::new(), Vec::new());
        for node in 1..=config.proxies {
            let (listen, admin) = (free_loopback_port()?, free_loopback_port()?);
            proxy_addrs.push(listen);
            admin_addrs.push(admin);
            let token = strings(&["--admin-token-file", &admin_token.display().to_string()]);
            services.push((
                node,
                format!(
                    "kind = \"proxy\"\nlisten = \"{listen}\"\nadmin = \"{admin}\"\nupstreams = [{app_node}]\n\
                     mode = {:?}\nargs = [{}]",
                    config.mode,
                    quoted(&token)
                ),
            ));
        }
        let topology = crate::process::write_topology_with_services(
            scratch.path(),
            "dc",
            config.backend,
            1000,
            &nodes,
            &services,
        )?;
        let up = crate::cluster::UpConfig {
            exe: config.exe.clone(),
            run_dir: scratch.path().join("run"),
            grace_ms: tierstack_tier_http::service::GRACE_MS_DEFAULT,
            tied: true,
        };
        let supervisor = crate::supervise::Supervisor::start(&topology, &up)?;
        let app_url = format!("http://{app_addr}");
        Ok(Deployment {
            proxy_urls: proxy_addrs.iter().map(|a| format!("http://{a}")).collect(),
            app_url,
            proxy_addrs,
            admin_addrs,
            app_addr,
            proxy_children: Vec::new(),
            children: Vec::new(),
            exe: config.exe.clone(),
            module_args: Vec::new(),
            app_args: Vec::new(),
            application_tier_sessions: true,
            supervisor: Some(supervisor),
            _scratch: scratch,
        })
    }

    /// Fetches each of `paths` once through every proxy, so that a timed run
    /// starts from warm caches (the paper measures steady state). Bounded by
    /// the upstream's own timeout. The fetches run [`WARM_UP_CONCURRENCY`]
    /// at a time: with the application tier under load each one waits for
    /// its CPU, and one after the other they would take longer than the run.
    pub fn warm_up(&self, paths: &[String]) -> Result<()> {
        let fetches: Vec<(SocketAddr, &String)> =
            self.proxy_addrs.iter().flat_map(|addr| paths.iter().map(move |path| (*addr, path))).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let fetch_all = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(addr, path)) = fetches.get(i) else { return Ok(()) };
                get_status(addr, path).with_context(|| format!("warming {path} at {addr}"))?;
            }
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..WARM_UP_CONCURRENCY.min(fetches.len())).map(|_| scope.spawn(fetch_all)).collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a warm-up thread panicked"))))
        })
    }

    /// Updates `path` once at the application server (a PUT), e.g. so a
    /// timed run does not include the push path's first connections.
    pub fn update(&self, path: &str) -> Result<()> {
        let (code, body) = exchange(self.app_addr, "PUT", path)?;
        anyhow::ensure!(code == 200, "PUT {path} at the application server: status {code}: {body}");
        Ok(())
    }

    /// Each proxy's `/_tierstack/stats`.
    pub fn proxy_stats<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        self.admin_addrs.iter().map(|a| get_json(*a, "/_tierstack/stats")).collect()
    }

    /// Every proxy's stats once none has a request in flight
    /// ([`ProxyStats::in_flight`]), for checks of their accounting, which
    /// holds only then: a load run's last requests, given up by the client
    /// as it stopped, end at the proxy a moment later. After
    /// [`SETTLE_TIMEOUT`] the stats are returned as they are (a proxy that
    /// never settles fails its accounting check, with the numbers).
    pub fn settled_proxy_stats(&self) -> Result<Vec<ProxyStats>> {
        let deadline = tierstack_base::time::instant_now() + SETTLE_TIMEOUT;
        loop {
            let stats: Vec<ProxyStats> = self.proxy_stats()?;
            if stats.iter().all(|p| p.in_flight() == 0) || tierstack_base::time::instant_now() >= deadline {
                return Ok(stats);
            }
            std::thread::sleep(SETTLE_POLL);
        }
    }

    /// The `/_tierstack/stats` of proxy `index` (0-based; fabric node `index + 1`).
    /// Proxy `index`'s admin listener.
    pub fn proxy_admin(&self, index: usize) -> Option<SocketAddr> {
        self.admin_addrs.get(index).copied()
    }

    pub fn proxy_stats_at<T: DeserializeOwned>(&self, index: usize) -> Result<T> {
        let addr = self.admin_addrs.get(index).with_context(|| format!("no proxy {index}"))?;
        get_json(*addr, "/_tierstack/stats")
    }

    /// The application server's `/_tierstack/stats`.
    pub fn app_stats<T: DeserializeOwned>(&self) -> Result<T> {
        get_json(self.app_addr, "/_tierstack/stats")
    }

    /// Stops proxy `index` (0-based) while the rest keeps running, as a
    /// proxy that dies would.
    pub fn stop_proxy(&mut self, index: usize) -> Result<()> {
        let child = self.proxy_children.get_mut(index).and_then(Option::take);
        child.with_context(|| format!("proxy {index} is not running"))?.finish()?;
        Ok(())
    }

    /// Restarts the application tier while the proxies keep running: stops
    /// the application server and the module, then starts the module (a new
    /// incarnation of its version table, on the same fabric node and
    /// socket) and the server (on the same address). The server is
    /// restarted too because it connects to its module once, at start.
    /// Requests arriving meanwhile fail at the proxies.
    pub fn restart_application_tier(&mut self) -> Result<()> {
        anyhow::ensure!(self.supervisor.is_none(), "a supervised deployment restarts what dies by itself");
        // Dropping a child closes its stdin and, after a bounded wait, kills it.
        while let Some(child) = self.children.pop() {
            drop(child);
        }
        let spawn_tier =
            if self.application_tier_sessions { ChildNode::spawn_in_own_session } else { ChildNode::spawn };
        let module = spawn_tier(&self.exe, &self.module_args).context("restarting the application module")?;
        self.children.push(module);
        let server = spawn_tier(&self.exe, &self.app_args).context("restarting the application server")?;
        self.children.push(server);
        Ok(())
    }

    /// Stops every process, proxies first.
    pub fn stop(mut self) -> Result<()> {
        if let Some(supervisor) = self.supervisor.take() {
            let report = supervisor.stop()?;
            anyhow::ensure!(report.clean(), "stopping the deployment: {}", report.summary());
        }
        for child in self.proxy_children.drain(..).flatten() {
            child.finish()?;
        }
        while let Some(child) = self.children.pop() {
            child.finish()?;
        }
        Ok(())
    }

    pub fn scratch(&self) -> &Path {
        self._scratch.path()
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.proxy_children.clear();
        while let Some(child) = self.children.pop() {
            drop(child);
        }
    }
}

/// A minimal blocking HTTP/1.1 GET (`Connection: close`) returning the status
/// line's code and the body: enough for stats endpoints and warm-up, without
/// a runtime.
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    exchange(addr, "GET", path)
}

/// As [`get`], every step bounded by `timeout` (a tool that must not hang
/// on a stopped process: `tierstack top`).
pub fn get_within(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    exchange_within(addr, "GET", path, timeout, timeout)
}

/// As [`get`], with `method` and an empty body.
fn exchange(addr: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    exchange_within(addr, method, path, Duration::from_secs(5), Duration::from_secs(60))
}

fn exchange_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    connect: Duration,
    read: Duration,
) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, connect)?;
    stream.set_read_timeout(Some(read))?;
    stream.set_write_timeout(Some(read))?;
    let length = if method == "GET" { "" } else { "Content-Length: 0\r\n" };
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{length}Connection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("malformed status line")?;
    Ok((code, body.to_string()))
}

fn get_status(addr: SocketAddr, path: &str) -> Result<()> {
    let (code, _) = get(addr, path)?;
    anyhow::ensure!(code == 200, "GET {path} from {addr}: status {code}");
    Ok(())
}

/// GET `path` and parse the body as JSON.
/// How long [`Deployment::settled_proxy_stats`] waits for the proxies'
/// last requests to end.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
const SETTLE_POLL: Duration = Duration::from_millis(20);

pub fn get_json<T: DeserializeOwned>(addr: SocketAddr, path: &str) -> Result<T> {
    let (code, body) = get(addr, path)?;
    anyhow::ensure!(code == 200, "GET {path} from {addr}: status {code}");
    serde_json::from_str(&body).with_context(|| format!("parsing JSON from {addr}{path}"))
}
