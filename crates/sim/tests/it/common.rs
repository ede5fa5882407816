//! Shared test fixtures: round-number costs whose event times can be
//! computed by hand.
#![allow(dead_code)]

use tierstack_model::DiskModel;
use tierstack_sim::{Budget, Costs, Load, SimConfig};
use tierstack_workload::TargetChoice;

/// Round costs: 1 byte/ns everywhere, so every time below is a sum of
/// integers.
/// - parse 10 µs, connection setup 5 µs, copy 1 B/ns;
/// - client network 20 µs one way, 1 B/ns, connect 40 µs, requests 100 B,
///   reply headers 200 B;
/// - messages: 50 µs one way of which 5 µs CPU at each end, 1 B/ns;
/// - remote reads: 10 µs of which 1 µs CPU, 1 B/ns; remote writes: 8 µs, 1 µs CPU.
pub(crate) const ROUND_COSTS: &str = r#"
[cpu]
cores = 1
request_ns = 10000
copy_bytes_per_s = 1000000000
connection_setup_ns = 5000
poll_ns = 500
[client_network]
latency_ns = 20000
bandwidth_bytes_per_s = 1000000000
connect_ns = 40000
request_bytes = 100
reply_header_bytes = 200
[cluster]
messages = "msg"
remote_read = "read"
remote_write = "write"
[transports.msg]
latency_ns = 50000
bandwidth_bytes_per_s = 1000000000
sender_cpu_ns = 5000
receiver_cpu_ns = 5000
[transports.read]
latency_ns = 10000
bandwidth_bytes_per_s = 1000000000
sender_cpu_ns = 1000
[transports.write]
latency_ns = 8000
bandwidth_bytes_per_s = 1000000000
sender_cpu_ns = 1000
"#;

pub(crate) fn round_costs() -> Costs {
    Costs::parse(ROUND_COSTS, "round").expect("the round costs are valid")
}

/// A 1 ms seek and 1 B/ns: a read of `b` bytes takes 1_000_000 + b ns.
pub(crate) fn round_disk() -> DiskModel {
    DiskModel::new(1_000_000, 1_000_000_000).expect("valid disk")
}

/// A closed loop of `clients` over `nodes` with round costs.
pub(crate) fn closed(nodes: usize, clients: usize, requests: u64, cache_bytes: u64) -> SimConfig {
    SimConfig {
        client_nodes: None,
        nodes,
        load: Load::Closed { clients, budget: Budget::Total(requests) },
        target_choice: TargetChoice::Fixed,
        new_connection_per_request: false,
        cache_bytes,
        cache_max_object_bytes: None,
        disk: round_disk(),
        costs: round_costs(),
        seed: 1,
    }
}
