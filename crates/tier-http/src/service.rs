//! Service behaviour shared by every long-running command (`app-module`,
//! `app-server`, `proxy`, `origin`, `ddss-daemon`, `dlm-node`,
//! `fabric serve`, `monitor-node`, `reconfigure`, `press-node`).
//!
//! A service serves until SIGTERM or SIGINT, as systemd, container runtimes
//! and a terminal's Ctrl-C ask it to stop; then it stops accepting, lets
//! requests in flight finish within `--grace-ms`, drops its fabric node
//! (which revokes its regions) and exits 0. Standard input is ignored: under
//! systemd, in a container or under `nohup` it is `/dev/null`.
//!
//! `--stop-on-stdin-eof` (or `TIERSTACK_STOP_ON_STDIN_EOF=1` in the
//! environment) also stops it when standard input reaches its end: the
//! option for a parent that owns the process through a pipe, so that the
//! child stops when the parent drops it (the tests, the demo's deployment;
//! `tierstack_deploy::process::ChildNode` sets the variable for every child).
//!
//! [`ServiceArgs`] are the lifecycle flags of every tier; they live here,
//! below the tiers, so that each tier's argument struct can flatten them and
//! a launcher can spell them with [`ServiceArgs::to_args`].
//!
//! SIGHUP never stops a service: it is logged and otherwise ignored here.
//! The one thing reloaded on it is a TLS listener's certificate and key
//! ([`TlsServer::reload_on_sighup`](crate::TlsServer::reload_on_sighup));
//! listeners, fabric node and caches are fixed at start, and the log
//! filter is read from `TIERSTACK_LOG` at start only.

use std::io::{self, Read};
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The environment variable that turns `--stop-on-stdin-eof` on (a
/// launcher sets it to `1` for a child it owns through a pipe).
pub const STOP_ON_STDIN_EOF_ENV: &str = "TIERSTACK_STOP_ON_STDIN_EOF";

/// The grace period's default: how long requests in flight may take to
/// finish once a stop was asked for.
pub const GRACE_MS_DEFAULT: u64 = 10_000;

/// How a long-running command stops.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct ServiceArgs {
    /// Also stop when standard input reaches its end, as when a parent
    /// that owns this process through a pipe exits or drops it (tests, the
    /// demo). Without it, only SIGTERM or SIGINT stops the process.
    #[arg(long, env = STOP_ON_STDIN_EOF_ENV, value_parser = clap::builder::BoolishValueParser::new())]
    pub stop_on_stdin_eof: bool,
    /// After SIGTERM or SIGINT: how long requests in flight may take to
    /// finish (milliseconds) before the process exits anyway.
    #[arg(long, default_value_t = GRACE_MS_DEFAULT)]
    pub grace_ms: u64,
}

impl Default for ServiceArgs {
    /// As parsed from no flags (and no environment).
    fn default() -> Self {
        ServiceArgs { stop_on_stdin_eof: false, grace_ms: GRACE_MS_DEFAULT }
    }
}

impl ServiceArgs {
    /// The command-line words that parse back into these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.stop_on_stdin_eof {
            args.push("--stop-on-stdin-eof".to_string());
        }
        args.extend(["--grace-ms".to_string(), self.grace_ms.to_string()]);
        args
    }

    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms)
    }

    /// Installs the signal handlers (and, with `--stop-on-stdin-eof`, a
    /// thread watching standard input). Call it inside a runtime and
    /// before announcing `ready`, so that a stop asked for right after is
    /// never the default action (death without cleanup).
    pub fn stop_signals(&self) -> io::Result<StopSignals> {
        let terminate = signal(SignalKind::terminate()).map_err(|e| context(e, "installing the SIGTERM handler"))?;
        let interrupt = signal(SignalKind::interrupt()).map_err(|e| context(e, "installing the SIGINT handler"))?;
        let hangup = signal(SignalKind::hangup()).map_err(|e| context(e, "installing the SIGHUP handler"))?;
        let stdin_eof = if self.stop_on_stdin_eof {
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A plain thread, not spawn_blocking: a runtime being dropped
            // waits for its blocking tasks, and this read may never end.
            std::thread::Builder::new().name("stdin-eof".into()).spawn(move || {
                // Fixed chunks, not lines: endless input without newlines
                // cannot grow a buffer.
                let mut chunk = [0u8; 1024];
                let mut stdin = std::io::stdin().lock();
                while matches!(stdin.read(&mut chunk), Ok(n) if n > 0) {}
                let _ = tx.send(());
            })?;
            Some(rx)
        } else {
            None
        };
        Ok(StopSignals { terminate, interrupt, hangup, stdin_eof })
    }

    /// For commands without a runtime of their own: installs the handlers
    /// now and waits for a stop on a thread; the receiver gets its cause.
    pub fn stop_watch_thread(&self) -> io::Result<std::sync::mpsc::Receiver<StopCause>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let signals = {
            let _entered = runtime.enter();
            self.stop_signals()?
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("stop-signals".into()).spawn(move || {
            let cause = runtime.block_on(signals.wait());
            let _ = tx.send(cause);
        })?;
        Ok(rx)
    }
}

/// An I/O error with what was being done.
fn context(error: io::Error, doing: &str) -> io::Error {
    io::Error::new(error.kind(), format!("{doing}: {error}"))
}

/// Why a service stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    Terminate,
    Interrupt,
    StdinEof,
}

impl StopCause {
    pub fn name(self) -> &'static str {
        match self {
            StopCause::Terminate => "SIGTERM",
            StopCause::Interrupt => "SIGINT",
            StopCause::StdinEof => "stdin closed",
        }
    }
}

/// The installed handlers; [`StopSignals::wait`] resolves on the first stop.
pub struct StopSignals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
    stdin_eof: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl StopSignals {
    pub async fn wait(mut self) -> StopCause {
        let cause = loop {
            let stdin_eof = async {
                match self.stdin_eof.as_mut() {
                    Some(rx) => {
                        let _ = rx.await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.terminate.recv() => break StopCause::Terminate,
                _ = self.interrupt.recv() => break StopCause::Interrupt,
                _ = stdin_eof => break StopCause::StdinEof,
                _ = self.hangup.recv() => {
                    tracing::info!("SIGHUP: not a stop, ignored here (a TLS listener reloads its certificate and key)");
                }
            }
        };
        tracing::info!(cause = cause.name(), "stopping");
        announce_stopping();
        cause
    }
}

/// Waits (at most the grace period) for a tier's serving task, which ends
/// once its connections have finished their requests after `stop` fired.
pub async fn drain(serving: tokio::task::JoinHandle<io::Result<()>>, grace: Duration, what: &str) -> io::Result<()> {
    match tokio::time::timeout(grace, serving).await {
        Ok(joined) => joined.map_err(|e| io::Error::other(format!("{what} task: {e}")))?,
        Err(_) => {
            tracing::warn!(?grace, "{what}: requests still in flight after the grace period; exiting anyway");
            Ok(())
        }
    }
}

/// Tells the process that started this one that it serves: the line `ready`
/// on standard output, flushed (`ChildNode` and `cluster up` wait for it),
/// and, under systemd with `Type=notify`, `READY=1` on `$NOTIFY_SOCKET`
/// (nothing happens without that variable).
pub fn announce_ready() -> io::Result<()> {
    use std::io::Write;
    println!("ready");
    std::io::stdout().flush()?;
    sd_notify::notify(false, &[sd_notify::NotifyState::Ready]).map_err(|e| context(e, "notifying systemd of readiness"))
}

/// Under systemd, says that the service is stopping (`STOPPING=1`), so that
/// a stop it did not ask for is not taken for a crash.
pub fn announce_stopping() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]) {
        tracing::debug!(error = %e, "notifying systemd of the stop");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards "spelled once": every field survives `to_args` and parsing.
    #[test]
    fn service_args_round_trip_through_their_words() {
        for service in [
            ServiceArgs { stop_on_stdin_eof: true, grace_ms: 1_234 },
            ServiceArgs { stop_on_stdin_eof: false, grace_ms: GRACE_MS_DEFAULT },
        ] {
            let words = std::iter::once("service".to_string()).chain(service.to_args());
            assert_eq!(tierstack_testkit::args::parse::<ServiceArgs, _, _>(words).unwrap(), service);
        }
    }
}
