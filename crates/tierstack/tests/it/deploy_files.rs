//! The deployment files in `deploy/`:
//! - every systemd unit passes `systemd-analyze verify` (skipped, with the
//!   reason printed, where that tool is absent), is `Type=notify` with a
//!   restart limit and the same hardening as the others, allows AF_NETLINK
//!   where its tier opens a fabric node (the ucx backend's RDMA device
//!   discovery), and names the tier it runs; the app server starts after
//!   the modules of its host; what a unit runs (`cluster exec`) sends
//!   READY=1 from the main process, as `NotifyAccess=main` requires;
//! - the container file's build stage installs UCX and libclang and
//!   requires the ucx backend, its runtime stage the UCX libraries only;
//! - the Grafana dashboard is a JSON model whose queries name only metrics
//!   the code writes.

use crate::exe;
use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn workspace_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)).unwrap()
}

/// A unit file as `(section, key, value)` entries, in file order.
struct Unit {
    file: String,
    entries: Vec<(String, String, String)>,
}

impl Unit {
    fn parse(file: &str, text: &str) -> Unit {
        let mut section = String::new();
        let mut entries = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
                continue;
            }
            let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("{file}: not a key=value line: {line}"));
            entries.push((section.clone(), key.trim().to_string(), value.trim().to_string()));
        }
        Unit { file: file.to_string(), entries }
    }

    /// Every value of `key` in `section` (a key may be given more than once).
    fn values(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries.iter().filter(|(s, k, _)| s == section && k == key).map(|(_, _, v)| v.as_str()).collect()
    }

    /// The one value of `key` in `section`.
    fn value(&self, section: &str, key: &str) -> &str {
        match self.values(section, key)[..] {
            [value] => value,
            ref values => panic!("{}: [{section}] {key}: expected one value, found {values:?}", self.file),
        }
    }

    /// The space-separated words of every value of `key` (dependency lists).
    fn words(&self, section: &str, key: &str) -> BTreeSet<&str> {
        self.values(section, key).into_iter().flat_map(str::split_whitespace).collect()
    }

    /// The tier the unit runs: `tierstack-<kind>@.service`.
    fn kind(&self) -> &str {
        self.file.trim_start_matches("tierstack-").trim_end_matches("@.service")
    }
}

/// Every `.service` file in `deploy/systemd`, parsed.
fn service_units() -> Vec<Unit> {
    let mut units: Vec<Unit> = std::fs::read_dir(deploy_dir().join("systemd"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".service"))
        .map(|name| Unit::parse(&name, &std::fs::read_to_string(deploy_dir().join("systemd").join(&name)).unwrap()))
        .collect();
    units.sort_by(|a, b| a.file.cmp(&b.file));
    assert!(units.len() >= 3, "{:?}", units.iter().map(|u| &u.file).collect::<Vec<_>>());
    units
}

/// Whether `tierstack <kind>` opens a fabric node (it takes `--topology`):
/// then it may run on the ucx backend.
fn opens_a_fabric_node(kind: &str) -> bool {
    let output = Command::new(exe()).args([kind, "--help"]).output().unwrap();
    assert!(output.status.success(), "`tierstack {kind}` is not a command: {output:?}");
    String::from_utf8_lossy(&output.stdout).contains("--topology")
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        println!("SKIPPED: systemd-analyze is not installed here (the units are checked where it is)");
        return;
    }
    // Every file beside the others, so that dependencies between them
    // (the server's Requires= on the modules' target) resolve.
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(deploy_dir().join("systemd")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !(name.ends_with(".service") || name.ends_with(".target")) {
            continue;
        }
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(&name)).unwrap();
        // verify checks that ExecStart's program exists: point it at this build.
        let text = text.replace("/usr/local/bin/tierstack", &exe().to_string_lossy());
        // An instance of a template (node 2), as systemctl would start it.
        let instance = name.replace("@.", "@2.");
        std::fs::write(dir.path().join(&instance), text).unwrap();
        checked.push(instance);
    }
    for instance in &checked {
        let output = Command::new("systemd-analyze").arg("verify").arg(dir.path().join(instance)).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Unknown keys and bad values are warnings with exit status 0:
        // any line about our units fails the test.
        let about_ours: Vec<&str> = stderr.lines().filter(|l| l.contains("tierstack")).collect();
        assert!(output.status.success() && about_ours.is_empty(), "{instance}: {stderr}");
    }
    assert!(checked.iter().any(|name| name.ends_with(".target")), "{checked:?}");
}

/// Settings every unit has, spelled the same: who it runs as, what it may
/// touch, how it stops and restarts.
const SHARED: &[(&str, &str, &str)] = &[
    ("Unit", "Wants", "network-online.target"),
    ("Unit", "StartLimitIntervalSec", "120"),
    ("Unit", "StartLimitBurst", "5"),
    ("Service", "Type", "notify"),
    ("Service", "NotifyAccess", "main"),
    ("Service", "KillSignal", "SIGTERM"),
    ("Service", "Restart", "on-failure"),
    ("Service", "RestartSec", "2"),
    ("Service", "User", "tierstack"),
    ("Service", "Group", "tierstack"),
    ("Service", "RuntimeDirectory", "tierstack"),
    ("Service", "ProtectSystem", "strict"),
    ("Service", "ProtectHome", "yes"),
    ("Service", "PrivateTmp", "yes"),
    ("Service", "NoNewPrivileges", "yes"),
    ("Service", "CapabilityBoundingSet", ""),
    ("Service", "AmbientCapabilities", ""),
    ("Service", "ProtectKernelTunables", "yes"),
    ("Service", "ProtectKernelModules", "yes"),
    ("Service", "ProtectControlGroups", "yes"),
    ("Service", "RestrictNamespaces", "yes"),
    ("Service", "RestrictSUIDSGID", "yes"),
    ("Service", "MemoryDenyWriteExecute", "yes"),
    ("Service", "SystemCallArchitectures", "native"),
    ("Install", "WantedBy", "multi-user.target"),
];

#[test]
fn every_unit_notifies_readiness_restarts_with_a_limit_and_is_hardened_alike() {
    for unit in service_units() {
        for (section, key, value) in SHARED {
            assert_eq!(unit.value(section, key), *value, "{}: [{section}] {key}", unit.file);
        }
    }
}

#[test]
fn units_whose_tier_may_use_ucx_allow_netlink_and_locked_memory() {
    let mut with_fabric = 0;
    for unit in service_units() {
        let families = unit.words("Service", "RestrictAddressFamilies");
        let environment = unit.words("Service", "Environment");
        let base: BTreeSet<&str> = ["AF_UNIX", "AF_INET", "AF_INET6"].into();
        if opens_a_fabric_node(unit.kind()) {
            with_fabric += 1;
            assert_eq!(families, &base | &["AF_NETLINK"].into(), "{}: RDMA device discovery reads netlink", unit.file);
            assert_eq!(unit.value("Service", "LimitMEMLOCK"), "infinity", "{}", unit.file);
            // MemoryDenyWriteExecute refuses UCX's code-patching hooks.
            assert!(environment.contains("UCX_MEM_MMAP_HOOK_MODE=none"), "{}: {environment:?}", unit.file);
        } else {
            // Only the sockets it needs.
            assert_eq!(families, base, "{}", unit.file);
            assert!(unit.values("Service", "LimitMEMLOCK").is_empty(), "{}", unit.file);
        }
    }
    assert!(with_fabric >= 3, "the module, server and proxy open fabric nodes");
}

#[test]
fn the_app_server_unit_starts_after_the_modules_of_its_host_and_requires_them() {
    let units = service_units();
    let unit = |kind: &str| units.iter().find(|u| u.kind() == kind).unwrap_or_else(|| panic!("no {kind} unit"));
    let (module, server) = (unit("app-module"), unit("app-server"));
    // The server cannot name its module's node id (that is in the
    // topology): it requires, and orders after, a target every module of
    // the host is ordered before and, once enabled, required by.
    let required = server.words("Unit", "Requires");
    let after = server.words("Unit", "After");
    let targets: Vec<&str> = required.intersection(&after).copied().filter(|u| u.ends_with(".target")).collect();
    assert_eq!(targets.len(), 1, "server Requires={required:?} After={after:?}");
    let target = targets[0];
    assert!(deploy_dir().join("systemd").join(target).is_file(), "{target} is shipped");
    assert!(module.words("Unit", "Before").contains(target), "the module is ordered before {target}");
    assert!(module.words("Install", "RequiredBy").contains(target), "enabling a module adds it to {target}");
    let target_unit = Unit::parse(target, &std::fs::read_to_string(deploy_dir().join("systemd").join(target)).unwrap());
    assert!(target_unit.words("Unit", "After").is_empty(), "{target} must not order itself after the servers");
}

#[test]
fn each_unit_names_the_tier_it_runs() {
    for unit in service_units() {
        let kind = unit.kind();
        let exec = unit.value("Service", "ExecStart");
        assert!(
            exec.starts_with(&format!(
                "/usr/local/bin/tierstack cluster exec /etc/tierstack/cluster.toml --node %i --kind {kind} --grace-ms "
            )),
            "{} runs node %i as {kind}: {exec}",
            unit.file
        );
        // The grace period fits in the stop timeout.
        let grace_ms: u64 = exec.rsplit(' ').next().unwrap().parse().unwrap();
        let stop_secs: u64 = unit.value("Service", "TimeoutStopSec").parse().unwrap();
        assert!(grace_ms < stop_secs * 1000, "{}", unit.file);
        // And the kind is a command of the binary.
        opens_a_fabric_node(kind);
    }
}

#[test]
fn cluster_exec_refuses_a_node_of_another_kind() {
    let output = Command::new(exe())
        .args(["cluster", "exec"])
        .arg(deploy_dir().join("cluster.toml"))
        .args(["--node", "2", "--kind", "app-module"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("node 2 runs proxy, not app-module"), "{output:?}");
}

/// One datagram from `socket` and the pid that sent it (the kernel's
/// credentials; SO_PASSCRED is on), or None when its read timeout passes.
fn receive_with_sender(socket: &UnixDatagram) -> Option<(String, libc::pid_t)> {
    let mut data = [0u8; 4096];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // u64s: aligned for the control message headers.
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `message` points at `iov`, `data` and `control`, which outlive the call.
    let received = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, 0) };
    if received < 0 {
        let error = std::io::Error::last_os_error();
        assert!(matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{error}");
        return None;
    }
    let mut sender = None;
    // SAFETY: the CMSG_ macros walk the control buffer recvmsg filled,
    // within the msg_controllen it set; the data is read unaligned.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_CREDENTIALS {
                let credentials: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast());
                sender = Some(credentials.pid);
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    let text = String::from_utf8_lossy(&data[..received as usize]).into_owned();
    Some((text, sender.expect("no sender credentials")))
}

/// Waits (at most a minute) for the notification containing `state`.
fn wait_notification(socket: &UnixDatagram, state: &str, child: &mut std::process::Child, log: &Path) -> libc::pid_t {
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(60);
    loop {
        if let Some((text, sender)) = receive_with_sender(socket) {
            if text.lines().any(|line| line == state) {
                return sender;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("exited ({status}) before {state}: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(tierstack_base::time::instant_now() < deadline, "no {state} within a minute");
    }
}

/// A notification socket that learns each datagram's sender pid.
fn notify_socket(path: &Path) -> UnixDatagram {
    let socket = UnixDatagram::bind(path).unwrap();
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option value that lives through the call.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    socket
}

/// A topology in `dir` with one node, an app-module, on `fabric` (with its
/// extra `[cluster]` lines and the node's address line).
fn module_topology(dir: &Path, fabric: &str, cluster_lines: &str, address_line: &str) -> PathBuf {
    let topology = dir.join("cluster.toml");
    let text = format!(
        "[cluster]\nname = \"unit\"\nfabric = \"{fabric}\"\nshm_root = \"{shm}\"\n{cluster_lines}\n\
         [[node]]\nid = 0\nrole = \"app\"\n{address_line}\n[node.service]\nkind = \"app-module\"\nsocket = \"{socket}\"\n",
        shm = dir.join("shm").display(),
        socket = dir.join("module.sock").display(),
    );
    std::fs::write(&topology, text).unwrap();
    topology
}

/// `cluster exec` of node 0 as a unit would start it, notifying `notify`;
/// its standard output and error go to `<dir>/module.out` and `.log`.
fn exec_module(dir: &Path, topology: &Path, notify: &Path) -> Command {
    let mut command = Command::new(exe());
    command
        .args(["cluster", "exec"])
        .arg(topology)
        .args(["--node", "0", "--kind", "app-module", "--grace-ms", "2000"])
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("module.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("module.log")).unwrap());
    command
}

/// SIGTERMs `child`, checks that it says STOPPING=1 and exits 0.
fn stop(child: &mut std::process::Child, socket: &UnixDatagram, log: &Path) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill has no memory preconditions; the child is not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(wait_notification(socket, "STOPPING=1", child, log), pid, "STOPPING=1 from the main process");
    let deadline = tierstack_base::time::instant_now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "no exit within a minute of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", std::fs::read_to_string(log).unwrap());
}

/// A unit's `Type=notify` and `NotifyAccess=main` hold only if the process
/// systemd started (`cluster exec`) is the one that says READY=1: it must
/// become the tier, not spawn it.
#[test]
fn cluster_exec_tells_systemd_it_is_ready_and_stopping_from_the_main_process() {
    let dir = tempfile::tempdir().unwrap();
    let topology = module_topology(dir.path(), "shm", "", "");
    let socket = notify_socket(&dir.path().join("notify"));
    let log = dir.path().join("module.log");
    let mut child = exec_module(dir.path(), &topology, &dir.path().join("notify")).spawn().unwrap();
    let main_pid = child.id() as libc::pid_t;
    assert_eq!(wait_notification(&socket, "READY=1", &mut child, &log), main_pid, "READY=1 from the main process");
    stop(&mut child, &socket, &log);
}

/// The units keep `MemoryDenyWriteExecute=yes`, which refuses UCX's default
/// memory hooks (they patch libc's code): with the units' environment a
/// tier on ucx, under the same refusal (the kernel's PR_SET_MDWE, what
/// systemd's seccomp filter enforces), starts and stops with no UCX error.
#[test]
fn a_tier_on_ucx_runs_cleanly_under_the_units_memory_deny_write_execute() {
    if !crate::ucx_or_skip() {
        return;
    }
    let units = service_units();
    let module = units.iter().find(|u| u.kind() == "app-module").unwrap();
    assert_eq!(module.value("Service", "MemoryDenyWriteExecute"), "yes");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cluster.key");
    tierstack_cluster::ClusterKey::generate().write_new(&key).unwrap();
    let address = tierstack_deploy::process::free_loopback_port().unwrap();
    let cluster_lines =
        format!("op_timeout_ms = 1000\nucx_transports = \"sysv,self\"\nkey_file = \"{}\"\n", key.display());
    let topology = module_topology(dir.path(), "ucx", &cluster_lines, &format!("address = \"{address}\""));
    let socket = notify_socket(&dir.path().join("notify"));
    let mut command = exec_module(dir.path(), &topology, &dir.path().join("notify"));
    for assignment in module.values("Service", "Environment") {
        let (name, value) = assignment.split_once('=').unwrap();
        command.env(name, value);
    }
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child before exec.
    unsafe {
        command.pre_exec(|| {
            const PR_SET_MDWE: libc::c_int = 65;
            const PR_MDWE_REFUSE_EXEC_GAIN: libc::c_ulong = 1;
            if libc::prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            println!("SKIPPED: this kernel has no PR_SET_MDWE (Linux 6.3 or newer has): {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let log = dir.path().join("module.log");
    let main_pid = child.id() as libc::pid_t;
    assert_eq!(wait_notification(&socket, "READY=1", &mut child, &log), main_pid);
    stop(&mut child, &socket, &log);
    // UCX logs on standard output.
    let printed =
        std::fs::read_to_string(dir.path().join("module.out")).unwrap() + &std::fs::read_to_string(&log).unwrap();
    let complaints: Vec<&str> =
        printed.lines().filter(|l| l.contains("UCX  ERROR") || l.contains("UCX  WARN")).collect();
    assert!(complaints.is_empty(), "{complaints:#?}");
}

/// A container file's stages (from each `FROM`), each as its instructions
/// with continuation lines joined and comments dropped.
fn stages(text: &str) -> Vec<Vec<String>> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Vec<String>> = Vec::new();
    for instruction in instructions {
        if instruction.starts_with("FROM ") {
            stages.push(Vec::new());
        }
        stages.last_mut().expect("the file starts with FROM").push(instruction);
    }
    stages
}

/// The packages a stage's `RUN` instructions install with apt-get.
fn apt_installs(stage: &[String]) -> BTreeSet<String> {
    let mut packages = BTreeSet::new();
    for run in stage.iter().filter_map(|i| i.strip_prefix("RUN ")) {
        for command in run.split("&&").map(str::trim) {
            if let Some(rest) = command.strip_prefix("apt-get install") {
                packages.extend(rest.split_whitespace().filter(|w| !w.starts_with('-')).map(String::from));
            }
        }
    }
    packages
}

#[test]
fn the_container_builds_with_every_backend_and_ships_the_ucx_runtime() {
    let stages = stages(&std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap());
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage: {stages:?}");
    let (build, runtime) = (&stages[0], &stages[1]);
    assert!(build[0].ends_with(" AS build") && runtime[0].contains("-slim"), "{build:?} {runtime:?}");

    let installed = apt_installs(build);
    for needed in ["libucx-dev", "ucx-utils", "libclang-dev", "pkg-config"] {
        assert!(installed.contains(needed), "the build stage installs {needed}: {installed:?}");
    }
    // The ucx backend is required by the build that makes the binary.
    let position = |wanted: &dyn Fn(&str) -> bool| build.iter().position(|i| wanted(i));
    let cargo = position(&|i| i.starts_with("RUN cargo build --release --locked -p tierstack")).expect("cargo build");
    let required = position(&|i| i == "ENV TIERSTACK_REQUIRE_UCX=1").expect("ENV TIERSTACK_REQUIRE_UCX=1");
    assert!(required < cargo, "TIERSTACK_REQUIRE_UCX=1 is set before the build");
    let install = position(&|i| i.contains("apt-get install")).unwrap();
    assert!(install < cargo);

    let shipped = apt_installs(runtime);
    assert!(shipped.contains("libucx0"), "the runtime stage installs the UCX libraries: {shipped:?}");
    let extra: Vec<&String> = shipped.iter().filter(|p| p.ends_with("-dev") || p.as_str() == "ucx-utils").collect();
    assert!(extra.is_empty(), "build tools in the runtime image: {extra:?}");
    let runtime = runtime.join("\n");
    assert!(runtime.contains("COPY --from=build /src/target/release/tierstack /usr/local/bin/tierstack"));
    assert!(runtime.contains("USER tierstack") && runtime.contains("STOPSIGNAL SIGTERM"));
}

/// The metric names a PromQL expression selects: identifiers that are not
/// functions or aggregations, keywords, label names (in `{...}` or in a
/// `by (...)` list), or inside strings, `[...]` ranges and `$variables`.
fn promql_metric_names(expr: &str) -> Vec<String> {
    const AGGREGATIONS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
    const OPERATORS: &[&str] = &["bool", "and", "or", "unless", "offset"];
    let chars: Vec<char> = expr.chars().collect();
    let skip_to = |from: usize, close: char| -> usize {
        let mut i = from + 1;
        while i < chars.len() && chars[i] != close {
            if chars[i] == '"' {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            i += 1;
        }
        i + 1
    };
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c == '"' || c == '\'' {
            i = skip_to(i, c);
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            i += 1;
            while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_word(c) {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
            if LABEL_LISTS.contains(&word.as_str()) {
                if next == Some('(') {
                    let open = i + chars[i..].iter().position(|&c| c == '(').unwrap();
                    i = skip_to(open, ')');
                }
            } else if next != Some('(') && !AGGREGATIONS.contains(&word.as_str()) && !OPERATORS.contains(&word.as_str())
            {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_metric_names_finds_the_selected_series_only() {
    let expr = r#"histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket{job=~"$job", x="}"}[$__rate_interval]))) / on (instance) group_left b offset 5m > bool 1e-3"#;
    assert_eq!(promql_metric_names(expr), ["a_bucket", "b"]);
    assert_eq!(promql_metric_names("sum(rate(c_total[5m])) by (mode)"), ["c_total"]);
}

/// The names written by `crates/proxy/src/metrics.rs` (its `counter("…")`
/// and `gauge("…")` closures add `tierstack_proxy_`; its histogram is named
/// whole), and by `process_metrics` in tier-http.
fn names_the_code_writes() -> BTreeSet<String> {
    let literals_after = |text: &str, call: &str| -> Vec<String> {
        text.match_indices(call)
            .filter_map(|(at, _)| {
                let rest = text[at + call.len()..].trim_start().strip_prefix('"')?;
                Some(rest[..rest.find('"')?].to_string())
            })
            .collect()
    };
    let mut names = BTreeSet::new();
    let proxy = workspace_file("crates/proxy/src/metrics.rs");
    for short in literals_after(&proxy, "counter(").into_iter().chain(literals_after(&proxy, "gauge(")) {
        names.insert(format!("tierstack_proxy_{short}"));
    }
    let mut histograms: Vec<String> = literals_after(&proxy, ".histogram(");
    // The lock manager's, as the dlm-node writes them.
    names.extend(
        [
            "tierstack_dlm_acquires_total",
            "tierstack_dlm_recoveries_total",
            "tierstack_dlm_fenced_total",
            "tierstack_dlm_held_locks",
        ]
        .map(String::from),
    );
    histograms.push("tierstack_dlm_acquire_wait_seconds".into());
    for histogram in histograms {
        names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{histogram}{suffix}")));
    }
    let observe = workspace_file("crates/tier-http/src/observe.rs");
    for call in ["counter_f64(", "gauge("] {
        names.extend(literals_after(&observe, call).into_iter().filter(|name| name.starts_with("process_")));
    }
    assert!(names.contains("tierstack_proxy_requests_total") && names.contains("process_cpu_seconds_total"));
    names
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_code_writes() {
    let text = std::fs::read_to_string(deploy_dir().join("grafana/tierstack.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string() && dashboard["schemaVersion"].is_u64());

    // The data source is a variable, chosen on import.
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables.iter().find(|v| v["type"] == "datasource").expect("a data source variable");
    assert_eq!(datasource["query"], "prometheus");
    let source = format!("${{{}}}", datasource["name"].as_str().unwrap());

    let mut queries = Vec::new();
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(variable["datasource"]["uid"], source.as_str(), "{variable}");
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap();
        // label_values(<selector>, <label>): the label is not a metric.
        let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).unwrap_or(query);
        queries.push(inner.rsplit_once(',').map_or(inner, |(selector, _)| selector).to_string());
    }
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "panel ids are unique: {panel}");
        let grid = &panel["gridPos"];
        assert!(grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24, "{panel}");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], source.as_str(), "{}", panel["title"]);
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            assert_eq!(target["datasource"]["uid"], source.as_str(), "{}", panel["title"]);
            queries.push(target["expr"].as_str().unwrap().to_string());
        }
    }

    let written = names_the_code_writes();
    let used: BTreeSet<String> = queries.iter().flat_map(|q| promql_metric_names(q)).collect();
    let unknown: Vec<&String> = used.difference(&written).collect();
    assert!(unknown.is_empty(), "the dashboard queries metrics no code writes: {unknown:?}");
    for wanted in [
        "tierstack_proxy_requests_total",
        "tierstack_proxy_hits_total",
        "tierstack_proxy_misses_total",
        "tierstack_proxy_version_check_seconds_bucket",
        "tierstack_proxy_stale_dropped_total",
        "tierstack_proxy_upstream_errors_total",
        "tierstack_proxy_objects",
        "tierstack_proxy_bytes",
        "tierstack_dlm_acquires_total",
        "tierstack_dlm_acquire_wait_seconds_bucket",
        "tierstack_dlm_recoveries_total",
        "tierstack_dlm_fenced_total",
        "tierstack_dlm_held_locks",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(used.contains(wanted), "the dashboard shows {wanted}");
    }
}
