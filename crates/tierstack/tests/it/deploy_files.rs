//! The deployment files in `deploy/`: the systemd units pass
//! `systemd-analyze verify` (skipped, with the reason printed, where that
//! tool is absent) and start the command they name; the container file
//! builds the binary in one stage and ships it alone in another.

use crate::exe;
use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

const UNITS: [&str; 3] = ["tierstack-app-module@.service", "tierstack-app-server@.service", "tierstack-proxy@.service"];

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        println!("SKIPPED: systemd-analyze is not installed here (the units are checked where it is)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for unit in UNITS {
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(unit)).unwrap();
        // verify checks that ExecStart's program exists: point it at this build.
        assert!(text.contains("ExecStart=/usr/local/bin/tierstack cluster exec "), "{unit}");
        let text = text.replace("/usr/local/bin/tierstack", &exe().to_string_lossy());
        // An instance of the template (node 2), as systemctl would start it.
        let instance = unit.replace("@.", "@2.");
        std::fs::write(dir.path().join(&instance), text).unwrap();
        let output = Command::new("systemd-analyze").arg("verify").arg(dir.path().join(&instance)).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Unknown keys and bad values are warnings with exit status 0:
        // any line about our unit fails the test.
        let about_ours: Vec<&str> = stderr.lines().filter(|l| l.contains("tierstack")).collect();
        assert!(output.status.success() && about_ours.is_empty(), "{instance}: {stderr}");
        for hardening in
            ["User=tierstack", "ProtectSystem=strict", "LimitMEMLOCK=", "NoNewPrivileges=yes", "KillSignal=SIGTERM"]
        {
            assert!(
                std::fs::read_to_string(dir.path().join(&instance)).unwrap().contains(hardening),
                "{unit}: {hardening}"
            );
        }
    }
}

#[test]
fn each_unit_names_the_tier_it_runs() {
    for unit in UNITS {
        let kind = unit.trim_start_matches("tierstack-").trim_end_matches("@.service");
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(unit)).unwrap();
        assert!(text.contains(&format!("--node %i --kind {kind} ")), "{unit} runs node %i as {kind}");
    }
}

#[test]
fn the_container_file_builds_in_one_stage_and_ships_the_binary_alone() {
    let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    let stages: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage: {stages:?}");
    assert!(stages[0].ends_with(" AS build") && stages[1].contains("-slim"), "{stages:?}");
    assert!(text.contains("cargo build --release --locked -p tierstack"));
    assert!(text.contains("COPY --from=build /src/target/release/tierstack /usr/local/bin/tierstack"));
    assert!(text.contains("USER tierstack") && text.contains("STOPSIGNAL SIGTERM"));
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
