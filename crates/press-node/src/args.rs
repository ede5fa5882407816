//! The flags of `tierstack press-dispatcher`, spelled once: the binary's
//! parser flattens [`DispatcherArgs`], a launcher builds its command line
//! with [`DispatcherArgs::to_args`].

use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_press::LardConfig;
use tierstack_tier_http::service::ServiceArgs;

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
    use clap::Parser;

    #[derive(Parser, Debug, PartialEq)]
    struct Command {
        #[command(flatten)]
        dispatcher: DispatcherArgs,
    }

    fn parse(args: &DispatcherArgs) -> DispatcherArgs {
        let words = std::iter::once("press-dispatcher".to_string()).chain(args.to_args());
        Command::try_parse_from(words).unwrap().dispatcher
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

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let listen = "127.0.0.1:8080".parse().unwrap();
        let words = ["press-dispatcher", "--listen", "127.0.0.1:8080", "--backends", "2", "--handoff-dir", "/tmp/h"];
        let parsed = Command::try_parse_from(words).unwrap().dispatcher;
        assert_eq!(parsed, DispatcherArgs::new(listen, 2, PathBuf::from("/tmp/h")));
        assert_eq!(parse(&parsed), parsed);
    }
}
