//! Dependencies point down the named layers of ARCHITECTURE.md:
//! base → fabric → backends → primitives and services → tiers → tools and
//! deploy → binary. A crate may depend (normal or build dependencies) only on
//! workspace crates of a lower layer, or on one of its own layer through an
//! edge of [`SAME_LAYER_EDGES`], each with its reason: so no service depends
//! on another service unless the list says why, and nothing depends upward.
//! The dev-only `testkit` is reached by dev-dependencies only, no crate can be
//! published, and ARCHITECTURE.md's layer table names exactly these layers.

use std::collections::BTreeMap;

/// The layers, bottom to top.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Base,
    Fabric,
    Backends,
    PrimitivesAndServices,
    Tiers,
    ToolsAndDeploy,
    Binary,
}

impl Layer {
    /// The name ARCHITECTURE.md's layer table gives it.
    fn name(self) -> &'static str {
        match self {
            Layer::Base => "base",
            Layer::Fabric => "fabric",
            Layer::Backends => "backends",
            Layer::PrimitivesAndServices => "primitives and services",
            Layer::Tiers => "tiers",
            Layer::ToolsAndDeploy => "tools and deploy",
            Layer::Binary => "binary",
        }
    }
}

fn layer(crate_name: &str) -> Option<Layer> {
    use Layer::*;
    Some(match crate_name.strip_prefix("tierstack-").unwrap_or(crate_name) {
        "base" | "model" | "stats" | "secret" => Base,
        "fabric" | "fabric-wire" | "ucx-sys" => Fabric,
        "fabric-shm" | "fabric-tcp" | "fabric-ucx" | "cluster" => Backends,
        "dlm" | "ddss" | "coherent" | "monitor" | "coop" | "press" | "pushpull" | "tier-http" => PrimitivesAndServices,
        "appserver" | "proxy" | "origin" | "press-node" => Tiers,
        "workload" | "loadgen" | "sim" | "deploy" | "bench" | "testkit" => ToolsAndDeploy,
        "tierstack" => Binary,
        _ => return None,
    })
}

/// Edges inside one layer, each allowed for its reason. Any other edge
/// within a layer fails like an upward one.
const SAME_LAYER_EDGES: &[(&str, &str, &str)] = &[
    ("fabric-wire", "fabric", "the wire format encodes the interface's operations, errors and channels"),
    ("cluster", "fabric-shm", "cluster is the one crate that names the backends' constructors"),
    ("cluster", "fabric-tcp", "cluster is the one crate that names the backends' constructors"),
    ("cluster", "fabric-ucx", "cluster is the one crate that names the backends' constructors"),
    (
        "pushpull",
        "coherent",
        "push-pull decides over the coherent cache's version table (coherency paper §4 builds on §3)",
    ),
    ("press-node", "origin", "a PRESS node serves the origin's file set with the origin's code"),
    ("loadgen", "workload", "the load client drives the traces and target rules the workload crate defines"),
    ("sim", "workload", "the simulator replays the same traces and schedule rules as the load client"),
    ("bench", "workload", "experiments choose traces"),
    ("bench", "loadgen", "experiments drive their load through the load client"),
    ("bench", "sim", "experiments compare the simulator with real runs"),
    ("bench", "deploy", "experiments start their processes with the deployment launcher"),
];

fn same_layer_edge_allowed(from: &str, to: &str) -> bool {
    let (from, to) = (from.strip_prefix("tierstack-").unwrap_or(from), to.strip_prefix("tierstack-").unwrap_or(to));
    SAME_LAYER_EDGES.iter().any(|&(f, t, _)| f == from && t == to)
}

fn metadata() -> serde_json::Value {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Why the edge `from → to` breaks the layering, if it does.
fn edge_violation(from: &str, to: &str) -> Option<String> {
    let (lf, lt) = (layer(from)?, layer(to)?);
    if lt < lf || (lt == lf && same_layer_edge_allowed(from, to)) {
        return None;
    }
    Some(if lt == lf {
        format!(
            "{from} and {to} are both in layer '{}': add the edge to SAME_LAYER_EDGES with its reason, or remove it",
            lf.name()
        )
    } else {
        format!("{from} (layer '{}') must not depend on {to} (layer '{}', above it)", lf.name(), lt.name())
    })
}

#[test]
fn dependencies_point_down_the_named_layers() {
    let metadata = metadata();
    let mut violations = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        assert!(layer(name).is_some(), "crate {name} has no layer: add it to ARCHITECTURE.md and this test");
        assert_eq!(
            package["publish"],
            serde_json::json!([]),
            "{name} must set publish = false (publish.workspace = true)"
        );
        for dep in package["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            let is_dev = dep["kind"].as_str() == Some("dev");
            if dep_name == "tierstack-testkit" && !is_dev {
                violations.push(format!("{name} depends on tierstack-testkit, which is for dev-dependencies only"));
            }
            if dep_name.starts_with("tierstack") && !is_dev {
                violations.extend(edge_violation(name, dep_name));
            }
        }
    }
    assert!(violations.is_empty(), "layering broken:\n{}", violations.join("\n"));
}

#[test]
fn the_rule_refuses_upward_and_unlisted_same_layer_edges() {
    // The checker itself, on edges the workspace does not have.
    assert!(edge_violation("tierstack-coherent", "tierstack-proxy").is_some(), "a service above a tier");
    assert!(edge_violation("tierstack-coop", "tierstack-monitor").is_some(), "a service on another service, unlisted");
    assert!(edge_violation("tierstack-dlm", "tierstack-ddss").is_some(), "a primitive on another primitive");
    assert!(edge_violation("tierstack-deploy", "tierstack-bench").is_some(), "deploy on bench");
    assert!(edge_violation("tierstack-pushpull", "tierstack-coherent").is_none(), "the listed service edge");
    assert!(edge_violation("tierstack-proxy", "tierstack-coop").is_none(), "a tier on a service");
}

#[test]
fn every_same_layer_edge_is_used_and_stays_within_one_layer() {
    let metadata = metadata();
    let mut edges = BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap().trim_start_matches("tierstack-").to_string();
        for dep in package["dependencies"].as_array().unwrap() {
            if dep["kind"].as_str() != Some("dev") {
                edges.insert(
                    (name.clone(), dep["name"].as_str().unwrap().trim_start_matches("tierstack-").to_string()),
                    (),
                );
            }
        }
    }
    for &(from, to, reason) in SAME_LAYER_EDGES {
        assert_eq!(layer(from), layer(to), "{from} → {to} is listed as a same-layer edge but crosses layers");
        assert!(
            edges.contains_key(&(from.to_string(), to.to_string())),
            "{from} → {to} ({reason}) is listed but unused"
        );
    }
}

#[test]
fn architecture_md_names_the_same_layers() {
    // ARCHITECTURE.md's table: `| layer | crates | ... |`, one row a layer,
    // crates in backquotes. It must say what this test enforces.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");
    let text = std::fs::read_to_string(path).unwrap();
    let section =
        text.split("\n## ").find(|s| s.starts_with("Layers")).expect("ARCHITECTURE.md has a '## Layers' section");
    let mut documented: BTreeMap<String, String> = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(layer_name), Some(crates)) = (cells.get(1), cells.get(2)) else { continue };
        for name in crates.split('`').skip(1).step_by(2) {
            documented.insert(name.to_string(), layer_name.to_string());
        }
    }
    let metadata = metadata();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let short = name.trim_start_matches("tierstack-");
        let short = if name == "tierstack" { "tierstack" } else { short };
        let expected = layer(name).unwrap().name();
        assert_eq!(
            documented.get(short).map(String::as_str),
            Some(expected),
            "ARCHITECTURE.md's layer table must list `{short}` in layer '{expected}'"
        );
    }
}
