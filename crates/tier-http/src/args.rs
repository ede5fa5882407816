//! [`HttpLimitsArgs`]: the client-facing limits of a tier's HTTP listener,
//! spelled once, flattened into every tier's flags (proxy, app-server,
//! origin, press-node) and turned into [`ServeOptions`].

use crate::ServeOptions;
use std::time::Duration;

/// `--header-read-timeout-ms` unless told otherwise.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The body deadline unless told otherwise ([`crate::guard`] says why a deadline).
pub const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The write timeout unless told otherwise.
pub const WRITE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// `--max-connections` unless told otherwise.
pub const MAX_CONNECTIONS_DEFAULT: usize = 10_000;

/// How long a client may take and how many connections it may hold.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct HttpLimitsArgs {
    /// Close a client connection that has not sent a whole request header
    /// this long after it began waiting for one (also idle keep-alives).
    /// 0: no such timeout.
    #[arg(long, default_value_t = HEADER_READ_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub header_read_timeout_ms: u64,
    /// Close a client connection whose request body has not arrived this
    /// long after its head (slow bodies). 0: no such deadline.
    #[arg(long, default_value_t = BODY_READ_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub body_read_timeout_ms: u64,
    /// Close a client connection that takes no bytes of its answer for this
    /// long (slow readers). 0: no such timeout.
    #[arg(long, default_value_t = WRITE_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub write_timeout_ms: u64,
    /// At most this many client connections at once; when full, a new one
    /// displaces the connection that has waited on its client the longest
    /// (never one whose request is being worked on).
    #[arg(long, default_value_t = MAX_CONNECTIONS_DEFAULT)]
    pub max_connections: usize,
    /// At most this many client connections from one IP address (none
    /// unless given: clients behind one NAT share an address).
    #[arg(long)]
    pub max_connections_per_client: Option<usize>,
}

impl Default for HttpLimitsArgs {
    /// As parsed from no flags.
    fn default() -> Self {
        HttpLimitsArgs {
            header_read_timeout_ms: HEADER_READ_TIMEOUT_DEFAULT.as_millis() as u64,
            body_read_timeout_ms: BODY_READ_TIMEOUT_DEFAULT.as_millis() as u64,
            write_timeout_ms: WRITE_TIMEOUT_DEFAULT.as_millis() as u64,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            max_connections_per_client: None,
        }
    }
}

impl HttpLimitsArgs {
    /// The command-line words that parse back into these limits (those at
    /// their defaults left out).
    pub fn to_args(&self) -> Vec<String> {
        let default = HttpLimitsArgs::default();
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        if self.header_read_timeout_ms != default.header_read_timeout_ms {
            flag("--header-read-timeout-ms", self.header_read_timeout_ms.to_string());
        }
        if self.body_read_timeout_ms != default.body_read_timeout_ms {
            flag("--body-read-timeout-ms", self.body_read_timeout_ms.to_string());
        }
        if self.write_timeout_ms != default.write_timeout_ms {
            flag("--write-timeout-ms", self.write_timeout_ms.to_string());
        }
        if self.max_connections != default.max_connections {
            flag("--max-connections", self.max_connections.to_string());
        }
        if let Some(max) = self.max_connections_per_client {
            flag("--max-connections-per-client", max.to_string());
        }
        args
    }

    /// The listener options these limits ask for (0 ms: none).
    pub fn serve_options(&self) -> ServeOptions {
        let bound = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        ServeOptions {
            header_read_timeout: bound(self.header_read_timeout_ms),
            body_read_timeout: bound(self.body_read_timeout_ms),
            write_timeout: bound(self.write_timeout_ms),
            max_connections: Some(self.max_connections),
            max_connections_per_client: self.max_connections_per_client,
            peer_addr: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards "spelled once": every field survives `to_args` and parsing.
    #[test]
    fn limits_round_trip_through_their_words() {
        let changed = HttpLimitsArgs {
            header_read_timeout_ms: 0,
            body_read_timeout_ms: 1_234,
            write_timeout_ms: 0,
            max_connections: 7,
            max_connections_per_client: Some(3),
        };
        for limits in [changed, HttpLimitsArgs::default()] {
            let words = std::iter::once("limits".to_string()).chain(limits.to_args());
            assert_eq!(tierstack_testkit::args::parse::<HttpLimitsArgs, _, _>(words).unwrap(), limits);
        }
        assert!(HttpLimitsArgs::default().to_args().is_empty());
    }

    #[test]
    fn zero_turns_a_timeout_off_and_defaults_are_safe() {
        let options = HttpLimitsArgs { header_read_timeout_ms: 0, ..HttpLimitsArgs::default() }.serve_options();
        assert_eq!(options.header_read_timeout, None);
        assert_eq!(options.body_read_timeout, Some(BODY_READ_TIMEOUT_DEFAULT));
        assert_eq!(options.write_timeout, Some(WRITE_TIMEOUT_DEFAULT));
        assert_eq!(options.max_connections, Some(MAX_CONNECTIONS_DEFAULT));
    }
}
