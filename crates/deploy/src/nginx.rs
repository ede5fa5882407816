//! A real nginx as a caching reverse proxy, as a child process: the HTTP/2
//! and TLS benchmark's baseline edge (`tierstack bench http2`). It caches
//! what the upstream lets it (`proxy_cache`, 200s for an hour), speaks
//! HTTP/2 over TLS on one port and plain HTTP/1.1 on another (to check
//! `X-Cache-Status` with a hand-written request).

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `nginx` executable: `$TIERSTACK_NGINX`, else the first on `PATH`,
/// else `/usr/sbin/nginx`; `None` when there is none.
pub fn nginx_path() -> Option<PathBuf> {
    crate::process::find_program("TIERSTACK_NGINX", "nginx")
}

/// `nginx -v`'s version, e.g. `(1, 22, 1)`.
pub fn nginx_version(exe: &Path) -> Result<(u32, u32, u32)> {
    let output = std::process::Command::new(exe).arg("-v").output().with_context(|| format!("running {exe:?} -v"))?;
    let text = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    parse_version(&text).with_context(|| format!("no version in `nginx -v`'s {text:?}"))
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let version = text.split("nginx/").nth(1)?.split_whitespace().next()?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
}

/// How the edge is set up.
pub struct NginxEdge {
    /// Where misses go (plain HTTP/1.1).
    pub upstream: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub workers: usize,
    /// HTTP/2 streams per connection (nginx's `http2_max_concurrent_streams`).
    pub max_concurrent_streams: u32,
}

/// A running nginx; stopped (SIGTERM to the master, then SIGKILL if it
/// lingers) and reaped when dropped.
pub struct Nginx {
    child: std::process::Child,
    /// HTTP/2 over TLS (ALPN h2, http/1.1).
    pub listen: SocketAddr,
    /// Plain HTTP/1.1, same cache.
    pub plain: SocketAddr,
    dir: tempfile::TempDir,
}

impl Nginx {
    /// Writes the configuration, starts `nginx` in the foreground and waits
    /// (bounded) until both ports accept connections.
    pub fn start(exe: &Path, edge: &NginxEdge) -> Result<Nginx> {
        let dir = tempfile::tempdir()?;
        let listen = crate::process::free_loopback_port()?;
        let plain = crate::process::free_loopback_port()?;
        let version = nginx_version(exe)?;
        // `http2 on;` replaced `listen … http2` in 1.25.1.
        let (listen_h2, http2_on) = if version >= (1, 25, 1) { ("", "        http2 on;\n") } else { (" http2", "") };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let d = dir.path().display();
        let config = format!(
            "daemon off;\nmaster_process on;\nworker_processes {workers};\n{user}pid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 8192; }}\nhttp {{\n    access_log off;\n    \
             client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
             uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n    \
             proxy_cache_path {d}/cache levels=1:2 keys_zone=edge:10m max_size=256m inactive=1h use_temp_path=off;\n    \
             keepalive_requests 100000000;\n    server {{\n        listen {listen} ssl{listen_h2};\n{http2_on}        \
             listen {plain};\n        ssl_certificate {cert};\n        ssl_certificate_key {key};\n        \
             ssl_protocols TLSv1.2 TLSv1.3;\n        http2_max_concurrent_streams {streams};\n        \
             location / {{\n            proxy_pass http://{upstream};\n            proxy_http_version 1.1;\n            \
             proxy_set_header Connection \"\";\n            proxy_cache edge;\n            proxy_cache_valid 200 1h;\n            \
             add_header X-Cache-Status $upstream_cache_status;\n        }}\n    }}\n}}\n",
            workers = edge.workers.max(1),
            user = if root { "user root;\n" } else { "" },
            cert = edge.cert.display(),
            key = edge.key.display(),
            streams = edge.max_concurrent_streams,
            upstream = edge.upstream,
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, config)?;
        let mut child = std::process::Command::new(exe)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(listen).is_err() || std::net::TcpStream::connect(plain).is_err() {
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                bail!("nginx exited before it listened: {status}; its error log: {log}");
            }
            if tierstack_base::time::instant_now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("nginx did not listen on {listen} and {plain} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Nginx { child, listen, plain, dir })
    }

    /// The master's and its workers' pids (for their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        let master = self.child.id();
        let mut pids = vec![master];
        pids.extend(children_of(master));
        pids
    }

    /// nginx's error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// The pids whose parent is `parent` (from `/proc/*/stat`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            // Field 4 (ppid) is the second after the command name's last ')'.
            stat.rfind(')').and_then(|at| stat[at + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()))
                == Some(parent)
        })
        .collect()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (a SIGKILL to the master
        // alone would leave them running).
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // unreaped child's, so it cannot name another process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && tierstack_base::time::instant_now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_are_read_from_nginx_v() {
        assert_eq!(super::parse_version("nginx version: nginx/1.22.1\n"), Some((1, 22, 1)));
        assert_eq!(super::parse_version("nginx version: nginx/1.25.1 (Ubuntu)"), Some((1, 25, 1)));
        assert_eq!(super::parse_version("nginx version: openresty/1.2"), None);
    }
}
