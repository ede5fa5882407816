//! `tierstack reconfigure`'s flags, spelled once: the binary flattens
//! [`ReconfigureArgs`], `bench monitor --figure reconfig` launches the agent
//! with [`ReconfigureArgs::to_args`]. They live here rather than in
//! `tierstack_monitor` (the [`ReconfigAgent`]'s crate): the agent runs as a
//! service ([`ServiceArgs`], from `tier-http`), and one service crate may
//! not depend on another.
//!
//! [`ReconfigAgent`]: tierstack_monitor::ReconfigAgent

use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_cluster::NodeArgs;
use tierstack_monitor::ReconfigConfig;
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// `tierstack reconfigure`: the reconfiguration agent as a process.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ReconfigureArgs {
    /// The agent's own fabric node.
    #[command(flatten)]
    pub at: NodeArgs,
    /// This agent's id (the holder named in a claimed role word).
    #[arg(long, default_value_t = 0)]
    pub agent_id: u16,
    /// A movable back end's fabric node (repeatable); each registers its
    /// role region (`app-server --site`) and publishes its load.
    #[arg(long = "backend", required = true)]
    pub backends: Vec<u32>,
    /// How often the agent reads and decides.
    #[arg(long, default_value_t = 100)]
    pub window_ms: u64,
    /// Sensitivity: move when (busiest site's mean load + 1) / (idlest's + 1)
    /// reaches this …
    #[arg(long, default_value_t = 2.0)]
    pub ratio: f64,
    /// … in this many consecutive windows.
    #[arg(long, default_value_t = 3)]
    pub windows: u32,
    /// History: a node moved less than this long ago stays.
    #[arg(long, default_value_t = 5_000)]
    pub history_ms: u64,
    /// A site never shrinks below this many nodes.
    #[arg(long, default_value_t = 1)]
    pub min_nodes: usize,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl ReconfigureArgs {
    /// The required flags given, every other one at its default.
    pub fn new(at: NodeArgs, backends: Vec<u32>) -> ReconfigureArgs {
        ReconfigureArgs {
            at,
            agent_id: 0,
            backends,
            window_ms: 100,
            ratio: 2.0,
            windows: 3,
            history_ms: 5_000,
            min_nodes: 1,
            service: ServiceArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// The back ends' fabric nodes.
    pub fn backend_nodes(&self) -> Vec<NodeId> {
        self.backends.iter().map(|n| NodeId(*n)).collect()
    }

    /// The agent's period (at least a millisecond).
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms.max(1))
    }

    /// The policy's parameters.
    pub fn config(&self) -> ReconfigConfig {
        ReconfigConfig {
            ratio: self.ratio,
            windows: self.windows,
            history_ns: self.history_ms.saturating_mul(1_000_000),
            min_nodes_per_site: self.min_nodes,
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the required flags, then each flag whose value is
    /// not the parser's default (so that a launcher may append flags of its
    /// own).
    pub fn to_args(&self) -> Vec<String> {
        let default = ReconfigureArgs::new(self.at.clone(), self.backends.clone());
        let mut args = self.at.to_args();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        for node in &self.backends {
            flag("--backend", node.to_string());
        }
        if self.agent_id != default.agent_id {
            flag("--agent-id", self.agent_id.to_string());
        }
        if self.window_ms != default.window_ms {
            flag("--window-ms", self.window_ms.to_string());
        }
        if self.ratio != default.ratio {
            flag("--ratio", self.ratio.to_string());
        }
        if self.windows != default.windows {
            flag("--windows", self.windows.to_string());
        }
        if self.history_ms != default.history_ms {
            flag("--history-ms", self.history_ms.to_string());
        }
        if self.min_nodes != default.min_nodes {
            flag("--min-nodes", self.min_nodes.to_string());
        }
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
    use std::path::PathBuf;

    fn parse(args: &ReconfigureArgs) -> ReconfigureArgs {
        let words = std::iter::once("reconfigure".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<ReconfigureArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn reconfigure_args_round_trip_through_their_words() {
        let args = ReconfigureArgs {
            at: NodeArgs { topology: PathBuf::from("/tmp/a cluster.toml"), node: 9 },
            agent_id: 4,
            backends: vec![1, 2, 5],
            window_ms: 20,
            ratio: 1.25,
            windows: 2,
            history_ms: 300,
            min_nodes: 2,
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["reconfigure", "--topology", "t.toml", "--node", "3", "--backend", "1"];
        let parsed = tierstack_testkit::args::parse::<ReconfigureArgs, _, _>(words).unwrap();
        let at = NodeArgs { topology: PathBuf::from("t.toml"), node: 3 };
        assert_eq!(parsed, ReconfigureArgs::new(at, vec![1]));
        assert_eq!(parse(&parsed), parsed);
    }
}
