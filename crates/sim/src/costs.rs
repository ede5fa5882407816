//! What each modelled operation costs: the cost files.
//!
//! Two files ship in `crates/sim/costs/`: `seeds.toml` (the seeds' published
//! costs, each with its source) and `measured.toml` (this machine's costs, each
//! with the tierstack command that measured it). Both are compiled in and can
//! be named `seeds` and `measured`; any other TOML file of the same shape can
//! be given by path. Unknown keys are errors, so a misspelt cost never
//! silently falls back to a default.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tierstack_model::DiskModel;

/// The compiled-in `costs/seeds.toml`.
pub const SEEDS_TOML: &str = include_str!("../costs/seeds.toml");
/// The compiled-in `costs/measured.toml`.
pub const MEASURED_TOML: &str = include_str!("../costs/measured.toml");
/// The names [`Costs::resolve`] accepts for the compiled-in files.
pub const BUILTIN_COST_FILES: [&str; 2] = ["measured", "seeds"];

/// Most CPU cores modelled per node.
pub const CORES_MAX: u32 = 1024;
/// Longest single cost accepted (one hour): larger values are certainly a unit mistake.
pub const COST_NS_MAX: u64 = 3_600_000_000_000;

/// A cost file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CostsError {
    #[error("reading cost file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cost file {source_name}: {message}")]
    Parse { source_name: String, message: String },
    #[error("cost file {source_name}: {what}")]
    Invalid { source_name: String, what: String },
    #[error("transport choice: {0}")]
    Choice(String),
    #[error("no cost file {0:?} (and it is not a built-in name: measured, seeds)")]
    NotFound(String),
    /// A disk given on the command line that cannot be (its message names the flag).
    #[error("{0}")]
    DiskFlags(String),
    #[error(transparent)]
    Disk(#[from] tierstack_model::ModelError),
}

/// Per-node CPU costs. The CPU is a FIFO server (`cores` of them per node).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuCosts {
    /// Parallel FIFO servers per node.
    pub cores: u32,
    /// One HTTP request: parse it, decide, build the reply header.
    pub request_ns: u64,
    /// Memory copy rate, for reply bodies and message copies.
    pub copy_bytes_per_s: u64,
    /// Accepting and closing one client connection.
    pub connection_setup_ns: u64,
    /// Noticing one remote-write arrival by polling.
    pub poll_ns: u64,
}

/// The network between the clients and the nodes (HTTP over TCP). Clients are
/// not modelled as resources; a reply occupies its node's NIC.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientNetwork {
    /// One-way wire latency of a small message (no CPU time).
    pub latency_ns: u64,
    pub bandwidth_bytes_per_s: u64,
    /// What opening a connection adds before a request leaves the client
    /// (the handshake); the node's CPU part is `cpu.connection_setup_ns`.
    pub connect_ns: u64,
    /// Bytes of one HTTP request.
    pub request_bytes: u64,
    /// Bytes of one reply's status line and headers (the body is added).
    pub reply_header_bytes: u64,
}

/// Default disk parameters (the command line overrides them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskCosts {
    pub seek_ns: u64,
    pub bandwidth_bytes_per_s: u64,
}

/// Which named transport carries each kind of intra-cluster traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportChoice {
    /// Two-sided messages (send/receive).
    pub messages: String,
    /// One-sided reads of a remote node's memory.
    pub remote_read: String,
    /// One-sided writes into a remote node's memory.
    pub remote_write: String,
}

/// One way of moving bytes between nodes.
///
/// `latency_ns` is the whole one-way time of a small message on an idle
/// system, as papers publish it; the CPU parts (`sender_cpu_ns`, and for
/// two-sided messages `receiver_cpu_ns`) are spent on the nodes' CPUs and the
/// rest is wire time. So an idle simulated message takes exactly `latency_ns`
/// plus its bytes at `bandwidth_bytes_per_s` (plus copies).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transport {
    pub latency_ns: u64,
    pub bandwidth_bytes_per_s: u64,
    pub sender_cpu_ns: u64,
    /// Ignored for one-sided operations (the target's CPU never runs).
    #[serde(default)]
    pub receiver_cpu_ns: u64,
    /// Copies of the payload the transport itself makes at the sender
    /// (a kernel socket copies once), each at the CPU's copy rate.
    #[serde(default)]
    pub sender_copies: u32,
    /// Copies at the receiver (two-sided only).
    #[serde(default)]
    pub receiver_copies: u32,
}

/// A whole cost file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Costs {
    pub cpu: CpuCosts,
    pub client_network: ClientNetwork,
    #[serde(default)]
    pub disk: Option<DiskCosts>,
    pub cluster: TransportChoice,
    pub transports: BTreeMap<String, Transport>,
}

/// Nanoseconds to move `bytes` at `bytes_per_s`, rounded up (as
/// [`tierstack_model::DiskModel::service_ns`] does).
pub fn transfer_ns(bytes: u64, bytes_per_s: u64) -> u64 {
    let rate = u128::from(bytes_per_s.max(1));
    u64::try_from((u128::from(bytes) * 1_000_000_000).div_ceil(rate)).unwrap_or(u64::MAX)
}

impl Costs {
    /// Parses and validates TOML text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, CostsError> {
        let costs: Costs = toml::from_str(text)
            .map_err(|e| CostsError::Parse { source_name: source_name.to_string(), message: e.to_string() })?;
        costs.validate().map_err(|what| CostsError::Invalid { source_name: source_name.to_string(), what })?;
        Ok(costs)
    }

    /// Reads and validates a cost file.
    pub fn load(path: &Path) -> Result<Self, CostsError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| CostsError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// A compiled-in cost file by name (`measured` or `seeds`).
    pub fn builtin(name: &str) -> Option<Self> {
        let text = match name {
            "measured" => MEASURED_TOML,
            "seeds" => SEEDS_TOML,
            _ => return None,
        };
        // The compiled-in files are validated by this crate's tests.
        Self::parse(text, name).ok()
    }

    /// The command line's `--costs` value: an existing file, else a built-in
    /// name.
    pub fn resolve(value: &str) -> Result<Self, CostsError> {
        let path = Path::new(value);
        if path.exists() {
            return Self::load(path);
        }
        match value {
            "measured" => Self::parse(MEASURED_TOML, "measured"),
            "seeds" => Self::parse(SEEDS_TOML, "seeds"),
            _ => Err(CostsError::NotFound(value.to_string())),
        }
    }

    /// Replaces the transport choice (e.g. from the command line), checking it.
    pub fn with_choice(mut self, choice: TransportChoice) -> Result<Self, CostsError> {
        self.cluster = choice;
        self.validate().map_err(CostsError::Choice)?;
        Ok(self)
    }

    /// Replaces the transports named (`--messages-transport`,
    /// `--remote-read-transport`, `--remote-write-transport`), keeping the
    /// cost file's for the others; unchanged when none is named.
    pub fn with_overrides(
        self,
        messages: Option<String>,
        remote_read: Option<String>,
        remote_write: Option<String>,
    ) -> Result<Self, CostsError> {
        if messages.is_none() && remote_read.is_none() && remote_write.is_none() {
            return Ok(self);
        }
        let choice = TransportChoice {
            messages: messages.unwrap_or_else(|| self.cluster.messages.clone()),
            remote_read: remote_read.unwrap_or_else(|| self.cluster.remote_read.clone()),
            remote_write: remote_write.unwrap_or_else(|| self.cluster.remote_write.clone()),
        };
        self.with_choice(choice)
    }

    /// The disk of a run: the command line's seek time (µs) and transfer
    /// rate (MB/s, 10^6 bytes per second) when both are given, else the
    /// cost file's `[disk]`.
    pub fn disk_model(&self, seek_us: Option<f64>, mb_per_s: Option<f64>) -> Result<DiskModel, CostsError> {
        let (seek_ns, bytes_per_s) = match (seek_us, mb_per_s, &self.disk) {
            (Some(seek_us), Some(mb_per_s), _) => {
                if !(seek_us.is_finite() && seek_us >= 0.0) {
                    return Err(CostsError::DiskFlags(format!(
                        "--disk-seek-us must be a finite non-negative number (got {seek_us})"
                    )));
                }
                if !(mb_per_s.is_finite() && mb_per_s > 0.0) {
                    return Err(CostsError::DiskFlags(format!(
                        "--disk-mb-per-s must be a finite positive number (got {mb_per_s})"
                    )));
                }
                ((seek_us * 1e3).round() as u64, (mb_per_s * 1e6).round() as u64)
            }
            (_, _, Some(disk)) => (disk.seek_ns, disk.bandwidth_bytes_per_s),
            _ => {
                return Err(CostsError::DiskFlags(
                    "the cost file has no [disk]: give --disk-seek-us and --disk-mb-per-s".into(),
                ))
            }
        };
        Ok(DiskModel::new(seek_ns, bytes_per_s)?)
    }

    /// The transport carrying two-sided messages.
    pub fn messages(&self) -> &Transport {
        self.transport(&self.cluster.messages)
    }

    /// The transport carrying one-sided reads.
    pub fn remote_read(&self) -> &Transport {
        self.transport(&self.cluster.remote_read)
    }

    /// The transport carrying one-sided writes.
    pub fn remote_write(&self) -> &Transport {
        self.transport(&self.cluster.remote_write)
    }

    fn transport(&self, name: &str) -> &Transport {
        // `validate` has checked every chosen name; a fallback keeps this total.
        self.transports.get(name).unwrap_or(&FALLBACK_TRANSPORT)
    }

    /// Nanoseconds of CPU to copy `bytes` once.
    pub fn copy_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.cpu.copy_bytes_per_s)
    }

    /// Checks every rule a simulation relies on; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let cpu = &self.cpu;
        if cpu.cores == 0 || cpu.cores > CORES_MAX {
            return Err(format!("cpu.cores must be in 1..={CORES_MAX} (got {})", cpu.cores));
        }
        positive("cpu.copy_bytes_per_s", cpu.copy_bytes_per_s)?;
        bounded("cpu.request_ns", cpu.request_ns)?;
        bounded("cpu.connection_setup_ns", cpu.connection_setup_ns)?;
        bounded("cpu.poll_ns", cpu.poll_ns)?;
        let net = &self.client_network;
        positive("client_network.bandwidth_bytes_per_s", net.bandwidth_bytes_per_s)?;
        bounded("client_network.latency_ns", net.latency_ns)?;
        bounded("client_network.connect_ns", net.connect_ns)?;
        if let Some(disk) = &self.disk {
            positive("disk.bandwidth_bytes_per_s", disk.bandwidth_bytes_per_s)?;
            bounded("disk.seek_ns", disk.seek_ns)?;
        }
        for (name, t) in &self.transports {
            positive(&format!("transports.{name}.bandwidth_bytes_per_s"), t.bandwidth_bytes_per_s)?;
            bounded(&format!("transports.{name}.latency_ns"), t.latency_ns)?;
        }
        let chosen = [
            ("cluster.messages", &self.cluster.messages, true),
            ("cluster.remote_read", &self.cluster.remote_read, false),
            ("cluster.remote_write", &self.cluster.remote_write, false),
        ];
        for (key, name, two_sided) in chosen {
            let Some(t) = self.transports.get(name) else {
                let known: Vec<&str> = self.transports.keys().map(String::as_str).collect();
                return Err(format!("{key} names transport {name:?}, which is not defined (defined: {known:?})"));
            };
            let cpu_part = t.sender_cpu_ns + if two_sided { t.receiver_cpu_ns } else { 0 };
            if cpu_part > t.latency_ns {
                return Err(format!(
                    "transports.{name}: the CPU parts ({cpu_part} ns) exceed latency_ns ({} ns), which includes them",
                    t.latency_ns
                ));
            }
        }
        Ok(())
    }
}

impl Transport {
    /// Wire time of a small message: the latency minus the CPU parts.
    pub fn wire_ns(&self, two_sided: bool) -> u64 {
        let cpu = self.sender_cpu_ns + if two_sided { self.receiver_cpu_ns } else { 0 };
        self.latency_ns.saturating_sub(cpu)
    }
}

const FALLBACK_TRANSPORT: Transport = Transport {
    latency_ns: 0,
    bandwidth_bytes_per_s: 1,
    sender_cpu_ns: 0,
    receiver_cpu_ns: 0,
    sender_copies: 0,
    receiver_copies: 0,
};

fn positive(key: &str, value: u64) -> Result<(), String> {
    if value == 0 {
        return Err(format!("{key} must be positive"));
    }
    Ok(())
}

fn bounded(key: &str, value: u64) -> Result<(), String> {
    if value > COST_NS_MAX {
        return Err(format!("{key} = {value} ns is more than an hour; check the unit (nanoseconds)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_files_parse_and_validate() {
        for name in BUILTIN_COST_FILES {
            let costs = Costs::resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(Costs::builtin(name).is_some());
            assert!(!costs.transports.is_empty());
        }
        assert!(Costs::builtin("other").is_none());
    }

    #[test]
    fn the_seed_file_carries_the_press_numbers() {
        let seeds = Costs::resolve("seeds").unwrap();
        let tcp = &seeds.transports["press-tcp"];
        assert_eq!((tcp.latency_ns, tcp.bandwidth_bytes_per_s), (76_000, 32_000_000));
        let via = &seeds.transports["press-via"];
        assert_eq!((via.latency_ns, via.bandwidth_bytes_per_s), (16_000, 102_000_000));
        assert_eq!(seeds.transports["press-via-remote-write"].latency_ns, 8_000);
    }

    #[test]
    fn transfer_time_rounds_up() {
        assert_eq!(transfer_ns(0, 1), 0);
        assert_eq!(transfer_ns(1, 1_000_000_000), 1);
        assert_eq!(transfer_ns(1, 3_000_000_000), 1, "a third of a nanosecond rounds up");
        assert_eq!(transfer_ns(32_000, 32_000_000), 1_000_000);
    }

    fn minimal(extra: &str) -> String {
        format!(
            r#"
[cpu]
cores = 1
request_ns = 10
copy_bytes_per_s = 1000000000
connection_setup_ns = 0
poll_ns = 0
[client_network]
latency_ns = 5
bandwidth_bytes_per_s = 1000
connect_ns = 10
request_bytes = 10
reply_header_bytes = 10
[cluster]
messages = "t"
remote_read = "t"
remote_write = "t"
[transports.t]
latency_ns = 100
bandwidth_bytes_per_s = 1000
sender_cpu_ns = 10
receiver_cpu_ns = 10
{extra}
"#
        )
    }

    #[test]
    fn bad_files_give_errors_that_name_the_problem() {
        assert!(Costs::parse(&minimal(""), "x").is_ok());
        let unknown_key = minimal("surprise = 1");
        let e = Costs::parse(&unknown_key, "x").unwrap_err().to_string();
        assert!(e.contains("surprise"), "{e}");
        let missing = minimal("").replace("request_ns = 10\n", "");
        let e = Costs::parse(&missing, "x").unwrap_err().to_string();
        assert!(e.contains("request_ns"), "{e}");
        let zero_bw =
            minimal("").replace("bandwidth_bytes_per_s = 1000\nconnect_ns", "bandwidth_bytes_per_s = 0\nconnect_ns");
        let e = Costs::parse(&zero_bw, "x").unwrap_err().to_string();
        assert!(e.contains("client_network.bandwidth_bytes_per_s must be positive"), "{e}");
        let bad_name = minimal("").replace("messages = \"t\"", "messages = \"nope\"");
        let e = Costs::parse(&bad_name, "x").unwrap_err().to_string();
        assert!(e.contains("cluster.messages") && e.contains("nope"), "{e}");
        let cpu_over = minimal("").replace("sender_cpu_ns = 10", "sender_cpu_ns = 95");
        let e = Costs::parse(&cpu_over, "x").unwrap_err().to_string();
        assert!(e.contains("exceed latency_ns"), "{e}");
        let no_cores = minimal("").replace("cores = 1", "cores = 0");
        assert!(Costs::parse(&no_cores, "x").unwrap_err().to_string().contains("cpu.cores"));
        let e = Costs::resolve("/nonexistent/costs.toml").unwrap_err().to_string();
        assert!(e.contains("not a built-in name"), "{e}");
    }

    #[test]
    fn a_file_on_disk_is_read_and_its_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, minimal("")).unwrap();
        assert_eq!(Costs::resolve(path.to_str().unwrap()).unwrap(), Costs::parse(&minimal(""), "x").unwrap());
        std::fs::write(&path, "[cpu\n").unwrap();
        let e = Costs::resolve(path.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("c.toml"), "{e}");
    }

    #[test]
    fn wire_time_is_the_latency_less_its_cpu_parts() {
        let costs = Costs::parse(&minimal(""), "x").unwrap();
        assert_eq!(costs.messages().wire_ns(true), 80);
        assert_eq!(costs.remote_read().wire_ns(false), 90);
    }

    #[test]
    fn command_line_overrides_replace_only_what_they_name() {
        let costs = Costs::resolve("seeds").unwrap();
        let same = costs.clone().with_overrides(None, None, None).unwrap();
        assert_eq!(same.cluster, costs.cluster);
        let read = costs.cluster.messages.clone();
        let changed = costs.clone().with_overrides(None, Some(read.clone()), None).unwrap();
        assert_eq!(changed.cluster.remote_read, read);
        assert_eq!(changed.cluster.messages, costs.cluster.messages);
        assert!(matches!(
            costs.with_overrides(Some("no such transport".into()), None, None),
            Err(CostsError::Choice(_))
        ));
    }

    #[test]
    fn the_disk_comes_from_the_flags_or_the_cost_file() {
        let mut costs = Costs::resolve("seeds").unwrap();
        let disk = costs.disk_model(Some(5000.0), Some(20.0)).unwrap();
        assert_eq!((disk.seek_ns, disk.bandwidth_bytes_per_s), (5_000_000, 20_000_000));
        let seek = costs.disk_model(Some(-1.0), Some(20.0)).unwrap_err().to_string();
        assert_eq!(seek, "--disk-seek-us must be a finite non-negative number (got -1)");
        let rate = costs.disk_model(Some(1.0), Some(f64::NAN)).unwrap_err().to_string();
        assert!(rate.starts_with("--disk-mb-per-s must be a finite positive number"));
        costs.disk = Some(DiskCosts { seek_ns: 7, bandwidth_bytes_per_s: 9 });
        let disk = costs.disk_model(None, None).unwrap();
        assert_eq!((disk.seek_ns, disk.bandwidth_bytes_per_s), (7, 9));
        costs.disk = None;
        assert!(costs.disk_model(None, None).unwrap_err().to_string().contains("has no [disk]"));
    }
}
