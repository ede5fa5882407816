//! A real HAProxy in front of a set of HTTP servers, as a child process:
//! the PRESS experiment's baseline front end (consistent hashing with
//! bounded loads).

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The `haproxy` executable: `$TIERSTACK_HAPROXY`, else the first on
/// `PATH`, else `/usr/sbin/haproxy`; `None` when there is none.
pub fn haproxy_path() -> Option<PathBuf> {
    crate::process::find_program("TIERSTACK_HAPROXY", "haproxy")
}

/// A real HAProxy in front of `servers`: `balance uri`, `hash-type
/// consistent`, `hash-balance-factor 125` (consistent hashing with bounded
/// loads: no server takes more than 125 % of the average load). Killed and
/// reaped when dropped.
pub struct Haproxy {
    child: std::process::Child,
    pub listen: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Writes the configuration, starts `haproxy -db` and waits (bounded)
    /// until it accepts connections.
    pub fn start(exe: &std::path::Path, servers: &[SocketAddr]) -> Result<Haproxy> {
        let dir = tempfile::tempdir()?;
        let listen = crate::process::free_loopback_port()?;
        let mut cfg = format!(
            "global\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    \
             timeout server 30s\n\nfrontend press\n    bind {listen}\n    default_backend nodes\n\nbackend nodes\n    \
             balance uri\n    hash-type consistent\n    hash-balance-factor 125\n"
        );
        for (i, server) in servers.iter().enumerate() {
            cfg.push_str(&format!("    server node{i} {server}\n"));
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg)?;
        let mut child = std::process::Command::new(exe)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let deadline = tierstack_base::time::instant_now() + std::time::Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(listen).is_ok() {
                break;
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("haproxy exited before it listened: {status}");
            }
            if tierstack_base::time::instant_now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("haproxy did not listen on {listen} within 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(Haproxy { child, listen, _dir: dir })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
