//! The flags of `tierstack app-module`, spelled once: the binary's parser
//! flattens [`ModuleArgs`], a launcher builds its command line with
//! [`ModuleArgs::to_args`]. They live with the application server (the
//! module server itself is `tierstack_coherent::module`) because the
//! lifecycle flags they flatten are a layer above `coherent`.

use std::path::PathBuf;
use tierstack_cluster::NodeArgs;
use tierstack_coherent::module::GRANT_LIFETIME_DEFAULT;
use tierstack_coherent::pages::{PAGES_DEFAULT, PAGE_BYTES_DEFAULT};
use tierstack_coherent::{PagesConfig, VersionsAt};
use tierstack_tier_http::observe::ObserveArgs;
use tierstack_tier_http::service::ServiceArgs;

/// The version table's capacity unless told otherwise (`--capacity`).
pub const CAPACITY_DEFAULT: u32 = 65_536;
/// `--grant-timeout-ms` unless told otherwise.
pub const GRANT_TIMEOUT_MS_DEFAULT: u64 = GRANT_LIFETIME_DEFAULT.as_millis() as u64;

/// `tierstack app-module`: the application module, owner of the version table.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct ModuleArgs {
    /// The module's node (it owns the version table).
    #[command(flatten)]
    pub at: NodeArgs,
    /// Local socket for application servers. Created mode 0600 (0660 with
    /// --socket-group); start-up fails if a module already serves it or
    /// something other than a socket is there.
    #[arg(long)]
    pub socket: PathBuf,
    /// Version table capacity (dependency keys).
    #[arg(long, default_value_t = CAPACITY_DEFAULT)]
    pub capacity: u32,
    /// Give the socket to this group (a name or a number), mode 0660; its
    /// members (by their effective group) may connect.
    #[arg(long)]
    pub socket_group: Option<String>,
    /// A user id allowed to connect besides this module's own user and root
    /// (repeatable). Other peers are refused, logged and counted.
    #[arg(long = "allow-uid")]
    pub allow_uids: Vec<u32>,
    /// Revoke a grant (read or update) held longer than this, so a stopped
    /// or hung application server cannot hold a document for ever; 0: never.
    /// Must exceed the longest healthy hold (an update's store rewrite and
    /// write-through push).
    #[arg(long, default_value_t = GRANT_TIMEOUT_MS_DEFAULT)]
    pub grant_timeout_ms: u64,
    /// When an update's new versions become visible to proxies: `proceed`
    /// (at the grant, before the new content exists: the paper's module) or
    /// `done` (at UPDATE_DONE, after the update's page is published: proxies
    /// serve the previous version while the update runs, then read the new
    /// page one-sidedly). See docs/coherence-protocol.md.
    #[arg(long, default_value_t = VersionsAt::Proceed)]
    pub versions_at: VersionsAt,
    /// Records of the published-pages area (0: publish nothing). A page is
    /// kept in record `key slot mod N`: at most N keys never evict each other.
    #[arg(long, default_value_t = PAGES_DEFAULT)]
    pub publish_pages: u32,
    /// Largest published page (fields and body), in bytes; larger pages are
    /// not published (their update completes as usual).
    #[arg(long, default_value_t = PAGE_BYTES_DEFAULT)]
    pub publish_page_bytes: u32,
    /// TEST ONLY, breaks coherence: admit reads while updates are in
    /// progress (violating Table 1), so end-to-end tests can show their
    /// checkers catch such a module.
    #[arg(long, hide = true)]
    pub test_only_admit_reads_during_updates: bool,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl ModuleArgs {
    /// The required flags given, every other one at its default.
    pub fn new(at: NodeArgs, socket: PathBuf) -> ModuleArgs {
        ModuleArgs {
            at,
            socket,
            capacity: CAPACITY_DEFAULT,
            socket_group: None,
            allow_uids: Vec::new(),
            grant_timeout_ms: GRANT_TIMEOUT_MS_DEFAULT,
            versions_at: VersionsAt::Proceed,
            publish_pages: PAGES_DEFAULT,
            publish_page_bytes: PAGE_BYTES_DEFAULT,
            test_only_admit_reads_during_updates: false,
            service: ServiceArgs::default(),
            observe: ObserveArgs::default(),
        }
    }

    /// The published-pages area these flags ask for.
    pub fn pages(&self) -> PagesConfig {
        PagesConfig { count: self.publish_pages, page_bytes: self.publish_page_bytes }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the required flags, then each flag whose value is
    /// not the parser's default (so that a launcher may append flags of its
    /// own without repeating one).
    pub fn to_args(&self) -> Vec<String> {
        let default = ModuleArgs::new(self.at.clone(), self.socket.clone());
        let mut args = self.at.to_args();
        args.extend(["--socket".into(), self.socket.display().to_string()]);
        if self.capacity != default.capacity {
            args.extend(["--capacity".into(), self.capacity.to_string()]);
        }
        if let Some(group) = &self.socket_group {
            args.extend(["--socket-group".into(), group.clone()]);
        }
        for uid in &self.allow_uids {
            args.extend(["--allow-uid".into(), uid.to_string()]);
        }
        if self.grant_timeout_ms != default.grant_timeout_ms {
            args.extend(["--grant-timeout-ms".into(), self.grant_timeout_ms.to_string()]);
        }
        if self.versions_at != default.versions_at {
            args.extend(["--versions-at".into(), self.versions_at.to_string()]);
        }
        if self.publish_pages != default.publish_pages {
            args.extend(["--publish-pages".into(), self.publish_pages.to_string()]);
        }
        if self.publish_page_bytes != default.publish_page_bytes {
            args.extend(["--publish-page-bytes".into(), self.publish_page_bytes.to_string()]);
        }
        if self.test_only_admit_reads_during_updates {
            args.push("--test-only-admit-reads-during-updates".into());
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

    fn parse(args: &ModuleArgs) -> ModuleArgs {
        let words = std::iter::once("app-module".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<ModuleArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn module_args_round_trip_through_their_words() {
        let args = ModuleArgs {
            at: NodeArgs { topology: PathBuf::from("/tmp/a dc.toml"), node: 4 },
            socket: PathBuf::from("/tmp/module.sock"),
            capacity: 1024,
            socket_group: Some("tierstack apps".into()),
            allow_uids: vec![1001, 65534],
            grant_timeout_ms: 2500,
            versions_at: VersionsAt::Done,
            publish_pages: 16,
            publish_page_bytes: 4096,
            test_only_admit_reads_during_updates: true,
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
            observe: ObserveArgs { metrics_listen: Some("127.0.0.1:9464".parse().unwrap()) },
        };
        assert_eq!(parse(&args), args);
    }

    /// `new` agrees with the parser's defaults.
    #[test]
    fn new_has_the_parsers_defaults() {
        let words = ["app-module", "--topology", "/tmp/dc.toml", "--node", "0", "--socket", "/tmp/m.sock"];
        let parsed = tierstack_testkit::args::parse::<ModuleArgs, _, _>(words).unwrap();
        let at = NodeArgs { topology: PathBuf::from("/tmp/dc.toml"), node: 0 };
        assert_eq!(parsed, ModuleArgs::new(at, PathBuf::from("/tmp/m.sock")));
        assert_eq!(parse(&parsed), parsed);
    }
}
