//! [`HttpLimitsArgs`]: the client-facing limits of a tier's HTTP listener,
//! spelled once, flattened into every tier's flags (proxy, app-server,
//! origin, press-node) and turned into [`ServeOptions`]. [`FrontArgs`]:
//! TLS and HTTP/2 on a listener (the proxy's, so far), turned into a
//! [`Front`](crate::Front).

use crate::conn::{
    Front, Http2Options, HTTP2_CONNECTION_WINDOW_BYTES_DEFAULT, HTTP2_KEEPALIVE_INTERVAL_DEFAULT,
    HTTP2_KEEPALIVE_TIMEOUT_DEFAULT, HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT, HTTP2_MAX_HEADER_LIST_BYTES_DEFAULT,
    HTTP2_STREAM_WINDOW_BYTES_DEFAULT, TLS_HANDSHAKE_TIMEOUT_DEFAULT,
};
use crate::tls::{TlsError, TlsFiles, TlsServer};
use crate::ServeOptions;
use std::path::PathBuf;
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

/// HTTP/2 flow-control windows: at least the protocol's initial 65,535
/// bytes, at most its 2^31 - 1.
fn window_bytes(word: &str) -> Result<u32, String> {
    let bytes: u32 = word.parse().map_err(|e| format!("{e}"))?;
    if !(65_535..=(1 << 31) - 1).contains(&bytes) {
        return Err(format!("{bytes} is no HTTP/2 window (65535 to 2147483647 bytes)"));
    }
    Ok(bytes)
}

/// What a listener speaks besides plain HTTP/1.1: TLS (with ALPN for
/// HTTP/2) and HTTP/2 on cleartext, with HTTP/2's limits.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct FrontArgs {
    /// Terminate TLS with this certificate chain (PEM, end-entity
    /// certificate first); needs --tls-key. Reloaded with the key on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); mode 0600 and owned by this
    /// user, or it is refused.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Close a connection whose TLS handshake is not done this long after
    /// it was accepted.
    #[arg(long, default_value_t = TLS_HANDSHAKE_TIMEOUT_DEFAULT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_ms: u64,
    /// Over TLS, offer HTTP/1.1 only (ALPN); without it `h2` is offered first.
    #[arg(long)]
    pub no_http2: bool,
    /// On cleartext, also serve HTTP/2 to clients that open with its
    /// preface (h2c with prior knowledge).
    #[arg(long)]
    pub http2_cleartext: bool,
    /// HTTP/2: at most this many streams open at once per connection.
    #[arg(long, default_value_t = HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: the largest request header list (decoded bytes).
    #[arg(long, default_value_t = HTTP2_MAX_HEADER_LIST_BYTES_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1024..))]
    pub http2_max_header_list_bytes: u32,
    /// HTTP/2: request body bytes a client may send one stream unread.
    #[arg(long, default_value_t = HTTP2_STREAM_WINDOW_BYTES_DEFAULT, value_parser = window_bytes)]
    pub http2_stream_window_bytes: u32,
    /// HTTP/2: request body bytes a client may send unread over all streams.
    #[arg(long, default_value_t = HTTP2_CONNECTION_WINDOW_BYTES_DEFAULT, value_parser = window_bytes)]
    pub http2_connection_window_bytes: u32,
    /// HTTP/2: ping a connection this often; 0: never.
    #[arg(long, default_value_t = HTTP2_KEEPALIVE_INTERVAL_DEFAULT.as_millis() as u64)]
    pub http2_keepalive_interval_ms: u64,
    /// HTTP/2: close a connection whose ping is not answered this long.
    #[arg(long, default_value_t = HTTP2_KEEPALIVE_TIMEOUT_DEFAULT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_keepalive_timeout_ms: u64,
}

impl Default for FrontArgs {
    /// As parsed from no flags.
    fn default() -> Self {
        let http2 = Http2Options::default();
        FrontArgs {
            tls_cert: None,
            tls_key: None,
            tls_handshake_timeout_ms: TLS_HANDSHAKE_TIMEOUT_DEFAULT.as_millis() as u64,
            no_http2: false,
            http2_cleartext: false,
            http2_max_concurrent_streams: http2.max_concurrent_streams,
            http2_max_header_list_bytes: http2.max_header_list_bytes,
            http2_stream_window_bytes: http2.stream_window_bytes,
            http2_connection_window_bytes: http2.connection_window_bytes,
            http2_keepalive_interval_ms: HTTP2_KEEPALIVE_INTERVAL_DEFAULT.as_millis() as u64,
            http2_keepalive_timeout_ms: HTTP2_KEEPALIVE_TIMEOUT_DEFAULT.as_millis() as u64,
        }
    }
}

impl FrontArgs {
    /// The command-line words that parse back into these (those at their
    /// defaults left out).
    pub fn to_args(&self) -> Vec<String> {
        let default = FrontArgs::default();
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            flag("--tls-cert", cert.display().to_string());
            flag("--tls-key", key.display().to_string());
        }
        let numbers = [
            ("--tls-handshake-timeout-ms", self.tls_handshake_timeout_ms, default.tls_handshake_timeout_ms),
            (
                "--http2-max-concurrent-streams",
                self.http2_max_concurrent_streams.into(),
                default.http2_max_concurrent_streams.into(),
            ),
            (
                "--http2-max-header-list-bytes",
                self.http2_max_header_list_bytes.into(),
                default.http2_max_header_list_bytes.into(),
            ),
            (
                "--http2-stream-window-bytes",
                self.http2_stream_window_bytes.into(),
                default.http2_stream_window_bytes.into(),
            ),
            (
                "--http2-connection-window-bytes",
                self.http2_connection_window_bytes.into(),
                default.http2_connection_window_bytes.into(),
            ),
            ("--http2-keepalive-interval-ms", self.http2_keepalive_interval_ms, default.http2_keepalive_interval_ms),
            ("--http2-keepalive-timeout-ms", self.http2_keepalive_timeout_ms, default.http2_keepalive_timeout_ms),
        ];
        for (name, value, default) in numbers {
            if value != default {
                flag(name, value.to_string());
            }
        }
        if self.no_http2 {
            args.push("--no-http2".to_string());
        }
        if self.http2_cleartext {
            args.push("--http2-cleartext".to_string());
        }
        args
    }

    /// The certificate and key files, if TLS is asked for.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        }
    }

    /// The listener's [`Front`], its certificate and key loaded (the error
    /// says which file is wrong and why).
    pub fn front(&self) -> Result<Front, TlsError> {
        let tls = match self.tls_files() {
            Some(files) => Some(TlsServer::load(files, !self.no_http2)?),
            None => None,
        };
        Ok(Front {
            tls,
            http2_cleartext: self.http2_cleartext,
            http2: Http2Options {
                max_concurrent_streams: self.http2_max_concurrent_streams,
                max_header_list_bytes: self.http2_max_header_list_bytes,
                stream_window_bytes: self.http2_stream_window_bytes,
                connection_window_bytes: self.http2_connection_window_bytes,
                keepalive_interval: (self.http2_keepalive_interval_ms > 0)
                    .then(|| Duration::from_millis(self.http2_keepalive_interval_ms)),
                keepalive_timeout: Duration::from_millis(self.http2_keepalive_timeout_ms),
            },
            tls_handshake_timeout: Some(Duration::from_millis(self.tls_handshake_timeout_ms)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards "spelled once" for the front's flags too.
    #[test]
    fn front_flags_round_trip_through_their_words() {
        let changed = FrontArgs {
            tls_cert: Some("/c.pem".into()),
            tls_key: Some("/k.pem".into()),
            tls_handshake_timeout_ms: 1_500,
            no_http2: true,
            http2_cleartext: true,
            http2_max_concurrent_streams: 7,
            http2_max_header_list_bytes: 4096,
            http2_stream_window_bytes: 70_000,
            http2_connection_window_bytes: 80_000,
            http2_keepalive_interval_ms: 0,
            http2_keepalive_timeout_ms: 900,
        };
        for front in [changed, FrontArgs::default()] {
            let words = std::iter::once("front".to_string()).chain(front.to_args());
            assert_eq!(tierstack_testkit::args::parse::<FrontArgs, _, _>(words).unwrap(), front);
        }
        assert!(FrontArgs::default().to_args().is_empty());
        let bad = ["front", "--http2-stream-window-bytes", "100"];
        assert!(tierstack_testkit::args::parse::<FrontArgs, _, _>(bad).is_err(), "a window below 65535");
        let half = ["front", "--tls-cert", "/c.pem"];
        assert!(tierstack_testkit::args::parse::<FrontArgs, _, _>(half).is_err(), "a certificate without its key");
    }

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
