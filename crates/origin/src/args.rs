//! The flags of `tierstack origin`, spelled once: the binary's parser
//! flattens [`OriginArgs`], a launcher builds its command line with
//! [`OriginArgs::to_args`].

use crate::CACHE_CONTROL_DEFAULT;
use std::net::SocketAddr;
use std::path::PathBuf;
use tierstack_model::{ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};
use tierstack_tier_http::service::ServiceArgs;
use tierstack_tier_http::HttpLimitsArgs;

/// The origin's runtime worker threads unless told otherwise.
pub const ORIGIN_THREADS_DEFAULT: usize = 2;

/// `tierstack origin`: a static web server with an emulated disk.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[command(group(clap::ArgGroup::new("content").required(true).args(["root", "files", "trace"])))]
pub struct OriginArgs {
    /// Where clients connect.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where `GET /stats` is served (keep it off the clients' network).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Serve the real files under this directory.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Serve a synthetic set: a text file of `path size` lines.
    #[arg(long)]
    pub files: Option<PathBuf>,
    /// Serve a trace's documents (`/doc/<name>`, their sizes) as a synthetic
    /// set: single | zipf | worldcup | clf:PATH | press:NAME[@SCALE] |
    /// coop:NAME[@SCALE] (as `tierstack load --trace`; see `tierstack trace show`).
    #[arg(long)]
    pub trace: Option<String>,
    /// Zipf exponent (zipf trace).
    #[arg(long, default_value_t = ZIPF_ALPHA_DEFAULT, requires = "trace")]
    pub alpha: f64,
    /// Number of documents (zipf trace).
    #[arg(long, default_value_t = ZIPF_DOCS_DEFAULT, requires = "trace")]
    pub docs: usize,
    /// Seed of the trace's document set (worldcup's depends on it).
    #[arg(long, default_value_t = 1, requires = "trace")]
    pub seed: u64,
    /// The Cache-Control header; "" sends none.
    #[arg(long, default_value = CACHE_CONTROL_DEFAULT)]
    pub cache_control: String,
    /// Last-Modified of synthetic objects: an HTTP-date, or `start` for the
    /// origin's start time. Default: a fixed date (Sat, 01 Jan 2000), so
    /// origins serving one set agree on validators across restarts.
    #[arg(long)]
    pub last_modified: Option<String>,
    /// Emulated disk: positioning time per read, in microseconds.
    #[arg(long, requires = "disk_mb_per_s")]
    pub disk_seek_us: Option<u64>,
    /// Emulated disk: transfer rate in MB/s (10^6 bytes per second).
    #[arg(long, requires = "disk_seek_us")]
    pub disk_mb_per_s: Option<f64>,
    /// Memory cache in bytes (LRU); 0: none, every GET reads the disk.
    /// Default: the trace's published per-node cache (--trace press:NAME or
    /// coop:NAME, scaled with the trace), else 0.
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Objects larger than this are not cached (default: the whole cache).
    #[arg(long)]
    pub cache_max_object_bytes: Option<u64>,
    /// Runtime worker threads.
    #[arg(long, default_value_t = ORIGIN_THREADS_DEFAULT)]
    pub threads: usize,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// The client listener's limits (slow clients, connections).
    #[command(flatten)]
    pub limits: HttpLimitsArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
}

impl OriginArgs {
    /// An origin serving `trace`'s documents, every other flag at its default.
    pub fn for_trace(listen: SocketAddr, trace: String) -> OriginArgs {
        OriginArgs {
            listen,
            admin: None,
            root: None,
            files: None,
            trace: Some(trace),
            alpha: ZIPF_ALPHA_DEFAULT,
            docs: ZIPF_DOCS_DEFAULT,
            seed: 1,
            cache_control: CACHE_CONTROL_DEFAULT.to_string(),
            last_modified: None,
            disk_seek_us: None,
            disk_mb_per_s: None,
            cache_bytes: None,
            cache_max_object_bytes: None,
            threads: ORIGIN_THREADS_DEFAULT,
            cpu: None,
            limits: HttpLimitsArgs::default(),
            service: ServiceArgs::default(),
        }
    }

    /// The command-line words (after the subcommand) that parse back into
    /// these arguments: the listener and the content, then each flag whose
    /// value is not the parser's default (so that a launcher may append
    /// flags of its own). The trace's parameters are written only with a
    /// trace, the disk only whole (the parser requires as much).
    pub fn to_args(&self) -> Vec<String> {
        let default = OriginArgs::for_trace(self.listen, String::new());
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        flag("--listen", self.listen.to_string());
        if let Some(admin) = self.admin {
            flag("--admin", admin.to_string());
        }
        if let Some(root) = &self.root {
            flag("--root", root.display().to_string());
        }
        if let Some(files) = &self.files {
            flag("--files", files.display().to_string());
        }
        if let Some(trace) = &self.trace {
            flag("--trace", trace.clone());
            if self.alpha != default.alpha {
                flag("--alpha", self.alpha.to_string());
            }
            if self.docs != default.docs {
                flag("--docs", self.docs.to_string());
            }
            if self.seed != default.seed {
                flag("--seed", self.seed.to_string());
            }
        }
        if self.cache_control != default.cache_control {
            flag("--cache-control", self.cache_control.clone());
        }
        if let Some(date) = &self.last_modified {
            flag("--last-modified", date.clone());
        }
        if let (Some(seek_us), Some(mb_per_s)) = (self.disk_seek_us, self.disk_mb_per_s) {
            flag("--disk-seek-us", seek_us.to_string());
            flag("--disk-mb-per-s", mb_per_s.to_string());
        }
        if let Some(bytes) = self.cache_bytes {
            flag("--cache-bytes", bytes.to_string());
        }
        if let Some(bytes) = self.cache_max_object_bytes {
            flag("--cache-max-object-bytes", bytes.to_string());
        }
        if self.threads != default.threads {
            flag("--threads", self.threads.to_string());
        }
        if let Some(cpu) = self.cpu {
            flag("--cpu", cpu.to_string());
        }
        args.extend(self.limits.to_args());
        if self.service != default.service {
            args.extend(self.service.to_args());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &OriginArgs) -> OriginArgs {
        let words = std::iter::once("origin".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<OriginArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing (the content sources
    /// exclude each other: each is given in a case of its own).
    #[test]
    fn origin_args_round_trip_through_their_words() {
        let args = OriginArgs {
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin: Some("127.0.0.1:8081".parse().unwrap()),
            root: None,
            files: None,
            trace: Some("press:clarknet@0.01".into()),
            alpha: 0.9,
            docs: 55,
            seed: 4,
            cache_control: String::new(),
            last_modified: Some("start".into()),
            disk_seek_us: Some(8000),
            disk_mb_per_s: Some(12.5),
            cache_bytes: Some(1 << 20),
            cache_max_object_bytes: Some(4096),
            threads: 3,
            cpu: Some(1),
            limits: HttpLimitsArgs {
                write_timeout_ms: 9,
                max_connections_per_client: Some(2),
                ..HttpLimitsArgs::default()
            },
            service: ServiceArgs { stop_on_stdin_eof: true, grace_ms: 77 },
        };
        assert_eq!(parse(&args), args);
        let untraced = OriginArgs { trace: None, alpha: ZIPF_ALPHA_DEFAULT, docs: ZIPF_DOCS_DEFAULT, seed: 1, ..args };
        let root = OriginArgs { root: Some(PathBuf::from("/srv/a www")), ..untraced.clone() };
        assert_eq!(parse(&root), root);
        let files = OriginArgs { files: Some(PathBuf::from("/tmp/files.txt")), ..untraced };
        assert_eq!(parse(&files), files);
    }

    /// `for_trace` agrees with the parser's defaults.
    #[test]
    fn for_trace_has_the_parsers_defaults() {
        let words = ["origin", "--listen", "127.0.0.1:8080", "--trace", "zipf"];
        let parsed = tierstack_testkit::args::parse::<OriginArgs, _, _>(words).unwrap();
        assert_eq!(parsed, OriginArgs::for_trace("127.0.0.1:8080".parse().unwrap(), "zipf".into()));
        assert_eq!(parse(&parsed), parsed);
    }
}
