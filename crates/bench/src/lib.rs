//! Experiments that reproduce the seed papers' figures on tierstack.
//!
//! Each experiment measures, prints a table with the rows and columns of
//! its figure, writes the same numbers as JSON, and draws an SVG plot into
//! an output folder. Numbers are always measured in the same run as their
//! baseline and reported as ratios where the papers compare, because the
//! machines are shared and noisy.
//!
//! Shared pieces: [`stats`] (latency summaries), [`report`] (tables, JSON,
//! plots), [`html`] (the page a person opens: `index.html` per experiment),
//! [`dlm_nodes`] (the lock-manager benchmark's node processes and their
//! pipe protocol), [`fabric_node`] (`tierstack fabric`'s node tools). Experiments: [`fabric`], [`coherence`] (its hot-document experiment: [`coherence_hot`]), [`pushpull`],
//! [`dlm`], [`ddss`], [`http2`] (the proxy at the edge beside nginx, over TLS and HTTP/2), [`monitor`] (its back end: [`monitor_node`]; its reconfiguration agent's flags: [`reconfig_agent`]); [`demo`] is the comparison `tierstack demo` tells and
//! [`demo_run`] runs it; [`dlm_holds`] is the random-hold workload `tierstack dlm-node` runs.
//! Launching processes (children, the 2-tier deployment, `tierstack
//! cluster`) is deployment and lives in `tierstack_deploy`.

pub mod coherence;
pub mod coherence_hot;
pub mod coop;
pub mod coop_derive;
pub mod coop_fig7;
pub mod coop_http;
pub mod coop_nodes;
pub mod ddss;
pub mod demo;
pub mod demo_run;
pub mod dlm;
pub mod dlm_holds;
pub mod dlm_nodes;
pub mod fabric;
pub mod fabric_auth;
pub mod fabric_node;
pub mod html;
pub mod http2;
pub mod monitor;
pub mod monitor_node;
pub mod press;
pub mod pushpull;
pub mod reconfig_agent;
pub mod report;
pub mod stats;
