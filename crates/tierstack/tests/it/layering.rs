//! Dependencies point down the layers of ARCHITECTURE.md: a crate may depend
//! (normal or build dependencies) only on workspace crates of a lower layer.

use std::collections::BTreeMap;

fn layer(name: &str) -> Option<u32> {
    Some(match name.strip_prefix("tierstack-").unwrap_or(name) {
        "base" | "stats" => 0,
        "model" => 1,
        "fabric" => 1,
        "fabric-wire" | "ucx-sys" => 2,
        "fabric-shm" | "fabric-tcp" | "fabric-ucx" => 3,
        "cluster" => 4,
        // Dev-only (checked below): a layer only so that its own
        // dependencies point down.
        "testkit" => 4,
        "dlm" | "ddss" => 5,
        "coherent" | "monitor" | "coop" | "press" => 6,
        "pushpull" | "tier-http" => 7,
        "appserver" | "proxy" => 8,
        "origin" => 8,
        "workload" | "press-node" => 9,
        "loadgen" => 10,
        "sim" => 10,
        "deploy" => 10,
        "bench" => 11,
        "tierstack" => 12,
        _ => return None,
    })
}

#[test]
fn dependencies_point_down_the_layers() {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap().to_string();
        assert!(layer(&name).is_some(), "crate {name} has no layer: add it to ARCHITECTURE.md and this test");
        for dep in package["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            let is_dev = dep["kind"].as_str() == Some("dev");
            assert!(
                dep_name != "tierstack-testkit" || is_dev,
                "{name} depends on tierstack-testkit, which is for dev-dependencies only"
            );
            if dep_name.starts_with("tierstack") && !is_dev {
                edges.entry(name.clone()).or_default().push(dep_name.to_string());
            }
        }
    }
    for (from, deps) in &edges {
        for to in deps {
            let (lf, lt) = (layer(from).unwrap(), layer(to).unwrap_or(u32::MAX));
            assert!(lt < lf, "{from} (layer {lf}) must not depend on {to} (layer {lt})");
        }
    }
}
