//! `tierstack ddss-daemon`'s flags, spelled once: the binary flattens
//! [`DaemonArgs`], [`super::start_session`] launches the home with
//! [`DaemonArgs::to_args`]. They live here, beside their launcher, rather
//! than in `tierstack_ddss`: the daemon is a service ([`ServiceArgs`], from
//! `tier-http`), and one service crate may not depend on another.

use std::path::PathBuf;
use tierstack_cluster::NodeArgs;
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// `tierstack ddss-daemon`: a node's DDSS substrate served on a socket.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub at: NodeArgs,
    /// The control socket to listen on (a stale one is replaced).
    #[arg(long)]
    pub socket: PathBuf,
    /// Accepted for compatibility: standard input is ignored unless
    /// --stop-on-stdin-eof is given.
    #[arg(long, hide = true, conflicts_with = "stop_on_stdin_eof")]
    pub ignore_stdin: bool,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl DaemonArgs {
    /// The required flags given, every other one at its default.
    pub fn new(at: NodeArgs, socket: PathBuf) -> DaemonArgs {
        DaemonArgs { at, socket, ignore_stdin: false, service: ServiceArgs::default(), observe: ObserveArgs::default() }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the required flags, then each flag whose value is
    /// not the parser's default (so that a launcher may append flags of its
    /// own).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = self.at.to_args();
        args.extend(["--socket".to_string(), self.socket.display().to_string()]);
        if self.ignore_stdin {
            args.push("--ignore-stdin".to_string());
        }
        if self.service != ServiceArgs::default() {
            args.extend(self.service.to_args());
        }
        args.extend(self.observe.to_args());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &DaemonArgs) -> DaemonArgs {
        let words = std::iter::once("ddss-daemon".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<DaemonArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing (`--ignore-stdin` excludes
    /// `--stop-on-stdin-eof`: each is given in a case of its own).
    #[test]
    fn daemon_args_round_trip_through_their_words() {
        let at = NodeArgs { topology: PathBuf::from("/tmp/a cluster.toml"), node: 2 };
        let args = DaemonArgs {
            at,
            socket: PathBuf::from("/tmp/d d.sock"),
            ignore_stdin: false,
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
        let ignoring =
            DaemonArgs { ignore_stdin: true, service: ServiceArgs { stop_on_stdin_eof: false, grace_ms: 77 }, ..args };
        assert_eq!(parse(&ignoring), ignoring);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["ddss-daemon", "--topology", "t.toml", "--node", "0", "--socket", "d.sock"];
        let parsed = tierstack_testkit::args::parse::<DaemonArgs, _, _>(words).unwrap();
        let at = NodeArgs { topology: PathBuf::from("t.toml"), node: 0 };
        assert_eq!(parsed, DaemonArgs::new(at, PathBuf::from("d.sock")));
        assert_eq!(parse(&parsed), parsed);
    }
}
