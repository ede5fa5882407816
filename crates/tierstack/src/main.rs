//! `tierstack`: the command-line entry point. Thin glue: parse arguments,
//! open what the topology describes, call into the crates that do the work.

mod cmd;
mod service;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tierstack", version, about = "Multi-tier data-center services on one-sided remote memory operations")]
struct Cli {
    /// Log lines on standard error: `human` or `json` (one JSON object per
    /// line, for log collectors). The filter comes from TIERSTACK_LOG
    /// (default `warn`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERSTACK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only on a terminal: a service's log file (`cluster up`) or a
    // journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Human => logs.init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// The main job: a 2-tier data-center on localhost under load, with every response checked for staleness.
    Demo(cmd::demo::DemoArgs),
    /// Experiments that reproduce the papers' figures.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Fabric node tools: serve regions, operate on them, stress them.
    #[command(subcommand)]
    Fabric(cmd::fabric::FabricCommand),
    /// Load client: replay a trace over HTTP while an updater changes documents; checks staleness.
    Load(cmd::load::LoadArgs),
    /// Run a topology's services on this host as detached processes: `up`, `status` (health and load), `down` (graceful).
    #[command(subcommand)]
    Cluster(cmd::cluster::ClusterCommand),
    /// Trace-driven cluster simulator: N nodes with CPUs, NICs, disks and caches under a policy; exact counts, modelled throughput.
    Sim(cmd::sim::SimArgs),
    /// The application module: version table owner and Table 1 queues, on a local socket.
    AppModule(cmd::tiers::ModuleArgs),
    /// The reference application server (HTTP), using the application module.
    AppServer(cmd::tiers::AppServerArgs),
    /// The caching proxy (HTTP) with one-sided version checks.
    #[command(args_override_self = true)]
    Proxy(cmd::tiers::ProxyArgs),
    /// Every node's published load (running threads, connections, requests, queue, kernel fields), read one-sidedly, redrawn live.
    Top(cmd::top::TopArgs),
    /// A static origin web server (a directory or a synthetic file set) with an emulated disk and a memory cache.
    Origin(cmd::origin::OriginArgs),
    /// A PRESS cluster node (HTTP): locality-conscious request distribution (Fig. 1) over fabric messages.
    PressNode(cmd::press::PressNodeArgs),
    /// The dispatcher hand-off server's front end: accepts every client connection and hands its socket to a back-end press-node chosen by locality (LARD).
    PressDispatcher(cmd::press::DispatcherArgs),
    /// DDSS node daemon: start the node's substrate and serve it to local processes on a socket.
    DdssDaemon(cmd::ddss::DaemonArgs),
    /// DDSS client process: run a randomized history through a node's daemon, print its events.
    DdssClient(cmd::ddss::ClientArgs),
    /// Lock-manager node: run random shared/exclusive holds on a topology's locks, print each hold, serve until SIGTERM.
    DlmNode(cmd::dlm::LockNodeArgs),
    /// Lock-manager operator tools: `status` (every lock's and node's state, read one-sidedly), `break <lock>`.
    #[command(subcommand)]
    Dlm(cmd::dlm::DlmCommand),
    /// Lock-manager node driven by `bench dlm` over its standard input (see tierstack_bench::dlm_nodes).
    #[command(hide = true)]
    DlmBenchNode(cmd::dlm::BenchNodeArgs),
    /// Reconfiguration agent: moves back ends from the idlest site to the busiest (one CAS on the node's role word).
    Reconfigure(cmd::reconfig::ReconfigureArgs),
    /// Monitored back end driven by `bench monitor` (worker and compute threads; prints its walk's log at the end).
    #[command(hide = true)]
    MonitorNode(cmd::monitor::MonitorNodeArgs),
    /// Cooperative-cache node without HTTP: the passive back-end memory of MTACC/HYBCC beside `proxy --coop`.
    CoopNode(cmd::coop::CoopNodeArgs),
    /// Cooperative-cache node driven by `bench coop --figure 7` over its standard input (see tierstack_bench::coop_nodes).
    #[command(hide = true)]
    CoopBenchNode(cmd::coop::BenchNodeArgs),
    /// Workload traces: the seeds' numbers beside the synthesized ones (show), Common Log Format export (export).
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
}

fn main() -> std::process::ExitCode {
    let args = match cmd::proxy_config::expand(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    init_logs(cli.log_format);
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Bench(command) => cmd::bench::run(command),
        Command::Fabric(command) => cmd::fabric::run(command),
        Command::AppModule(args) => cmd::tiers::app_module(args),
        Command::AppServer(args) => cmd::tiers::app_server(args),
        Command::Proxy(args) => cmd::tiers::proxy(args),
        Command::Top(args) => cmd::top::run(args),
        Command::Reconfigure(args) => cmd::reconfig::run(args),
        Command::MonitorNode(args) => cmd::monitor::run_node(args),
        Command::Origin(args) => cmd::origin::run(args),
        Command::PressNode(args) => cmd::press::run(args),
        Command::PressDispatcher(args) => cmd::press::run_dispatcher(args),
        Command::DdssDaemon(args) => cmd::ddss::run_daemon(args),
        Command::DdssClient(args) => cmd::ddss::run_client(args),
        Command::DlmNode(args) => cmd::dlm::run_node(args),
        Command::DlmBenchNode(args) => cmd::dlm::run_bench_node(args),
        Command::Dlm(command) => cmd::dlm::run(command),
        Command::Load(args) => cmd::load::run(args),
        Command::Trace(command) => cmd::trace::run(command),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Cluster(command) => cmd::cluster::run(command),
        Command::CoopNode(args) => cmd::coop::run(args),
        Command::CoopBenchNode(args) => cmd::coop::run_bench_node(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierstack: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every subcommand's arguments are well formed (unique names and groups).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
