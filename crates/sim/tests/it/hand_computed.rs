//! Tiny configurations whose every event time is computed by hand from the
//! round costs in `common` (1 byte per ns everywhere).

use crate::common;

use common::{closed, round_costs};
use tierstack_sim::{
    run, Action, Actions, Arrivals, Caching, Copies, Delivery, Done, Independent, Load, Policy, Request, Served, Via,
    View,
};
use tierstack_workload::Trace;

/// One 1000-byte document.
fn one_doc() -> Trace {
    Trace::single_sized(1000).unwrap()
}

// The independent timeline of one node, one client, two requests:
// request 1: connect (40 µs) + 20 µs + 100 B → at the node at 60_100;
//   parse 10 µs + setup 5 µs → 75_100; miss: disk 1_001_000 → 1_076_100;
//   copy 1000 → 1_077_100; NIC 1200 B → 1_078_300; + 20 µs → 1_098_300.
// request 2 (same connection), issued at 1_098_300: + 20_100 → 1_118_400;
//   parse → 1_128_400; hit; copy → 1_129_400; NIC → 1_130_600; + 20 µs →
//   1_150_600, a latency of 52_300.
const FIRST_LATENCY: u64 = 1_098_300;
const HIT_LATENCY: u64 = 52_300;

#[test]
fn one_node_one_client_gives_the_hand_computed_times() {
    let config = closed(1, 1, 2, 1 << 20);
    let report = run(&config, &one_doc(), Independent).unwrap();
    assert_eq!(report.requests, 2);
    assert_eq!(report.makespan_ns, FIRST_LATENCY + HIT_LATENCY);
    assert_eq!(report.latency.max_ns, FIRST_LATENCY);
    assert_eq!(report.latency.p50_ns, HIT_LATENCY, "nearest rank: the smaller of two");
    assert_eq!(report.latency.mean_ns, (FIRST_LATENCY + HIT_LATENCY) as f64 / 2.0);
    let expected_throughput = 2.0 * 1e9 / (FIRST_LATENCY + HIT_LATENCY) as f64;
    assert_eq!(report.throughput_per_s, expected_throughput);
    let node = &report.per_node[0];
    assert_eq!((node.hits, node.misses, node.disk_reads, node.connections), (1, 1, 1, 1));
    assert_eq!(node.disk_busy_ns, 1_001_000);
    assert_eq!(node.cpu_busy_ns, 15_000 + 1_000 + 10_000 + 1_000, "two parses, one setup, two copies");
    assert_eq!(node.nic_busy_ns, 2 * 1_200);
    assert_eq!(node.reply_bytes, 2_000);
}

#[test]
fn a_new_connection_per_request_costs_a_round_trip_and_a_setup() {
    let mut config = closed(1, 1, 2, 1 << 20);
    config.new_connection_per_request = true;
    let report = run(&config, &one_doc(), Independent).unwrap();
    assert_eq!(report.latency.p50_ns, HIT_LATENCY + 40_000 + 5_000, "connect_ns and the setup CPU");
    assert_eq!(report.per_node[0].connections, 2);
}

/// Four documents `/a` … `/d` of 1000 bytes, replayed in that order.
fn four_docs() -> Trace {
    let log: String = ["a", "b", "c", "d"]
        .iter()
        .map(|p| format!("h - - [01/Jul/1995:00:00:01 -0400] \"GET /{p} HTTP/1.0\" 200 1000\n"))
        .collect();
    Trace::clf_from_str(&log).unwrap()
}

#[test]
fn concurrent_misses_queue_at_the_disk_and_their_service_times_add_up() {
    // Four clients start at offsets 0..4 of the replayed list, so they ask
    // for /a, /b, /c, /d at once. The parses are serialized by the CPU (15 µs
    // each: 75_100, 90_100, 105_100, 120_100); all four miss and queue at the
    // disk, so they end one service time (1_001_000) apart.
    let clients = 4;
    let config = closed(1, clients, clients as u64, 1 << 20);
    let report = run(&config, &four_docs(), Independent).unwrap();
    let node = &report.per_node[0];
    assert_eq!((node.misses, node.disk_reads, node.hits), (4, 4, 0));
    assert_eq!(node.disk_busy_ns, 4 * 1_001_000);
    // The last read ends at 75_100 + 4 × 1_001_000; reply: copy, NIC, wire.
    let last_disk_end = 75_100 + 4 * 1_001_000;
    assert_eq!(report.makespan_ns, last_disk_end + 1_000 + 1_200 + 20_000);
    assert!(report.makespan_ns >= 4 * 1_001_000, "four reads of 1.001 ms take at least 4.004 ms");
    assert_eq!(report.latency.max_ns, report.makespan_ns);
    assert_eq!(report.latency.p50_ns, 75_100 + 2 * 1_001_000 + 22_200, "the second of four ends second");
    assert!((report.utilization.disk_max - 4_004_000.0 / report.makespan_ns as f64).abs() < 1e-12);
}

#[test]
fn requests_for_an_object_being_read_hit_and_wait_for_that_read() {
    // As tierstack origin: the first request misses and inserts at once; the
    // three others (parsed at 90_100 … 120_100) hit and wait for the read,
    // which ends at 1_076_100. Then four copies (1 µs each) and four NIC
    // transfers (1.2 µs each, the NIC the bottleneck from the second on):
    // the last reply leaves at 1_077_100 + 4 × 1_200 = 1_081_900.
    let clients = 4;
    let config = closed(1, clients, clients as u64, 1 << 20);
    let report = run(&config, &one_doc(), Independent).unwrap();
    let node = &report.per_node[0];
    assert_eq!((node.misses, node.disk_reads, node.hits), (1, 1, 3));
    assert_eq!(report.makespan_ns, 1_081_900 + 20_000);
    assert_eq!(report.latency.p50_ns - 1_078_300 - 20_000, 1_200, "the second reply waits one NIC transfer");
}

#[test]
fn two_cores_parse_two_requests_at_once() {
    // A 1 ns disk, so the CPU decides. One core: parses end at 75_100 and
    // 90_100; reads end at 75_101 and 90_101, but the first copy waits for the
    // second parse: copies 90_100 → 91_100 and → 92_100; NIC → 92_300 and →
    // 93_500; + 20 µs → 113_500.
    let fast_disk = tierstack_model::DiskModel::new(0, 1_000_000_000_000).unwrap();
    let mut config = closed(1, 2, 2, 1 << 20);
    config.disk = fast_disk;
    let one_core = run(&config, &one_doc(), Independent).unwrap();
    assert_eq!(one_core.makespan_ns, 113_500);
    // Two cores: both parses end at 75_100, reads at 75_101 and 75_102, copies
    // on both cores → 76_101 and 76_102; NIC 76_101 → 77_301 → 78_501; + 20 µs.
    config.costs = tierstack_sim::Costs::parse(&common::ROUND_COSTS.replace("cores = 1", "cores = 2"), "2").unwrap();
    let two_cores = run(&config, &one_doc(), Independent).unwrap();
    assert_eq!(two_cores.makespan_ns, 98_501);
    assert_eq!(two_cores.per_node[0].cpu_busy_ns, one_core.per_node[0].cpu_busy_ns, "the same work");
}

#[test]
fn an_open_loop_measures_latency_from_the_schedule() {
    // No cache, a new connection per request: every request alone would take
    // FIRST_LATENCY. At 500 req/s (2 ms apart) nothing queues.
    let mut config = closed(1, 1, 10, 0);
    config.new_connection_per_request = true;
    config.load = Load::Open { rate_per_s: 500.0, requests: 10, streams: 1, arrivals: Arrivals::Constant };
    let report = run(&config, &one_doc(), Independent).unwrap();
    assert_eq!((report.latency.p50_ns, report.latency.max_ns), (FIRST_LATENCY, FIRST_LATENCY));
    assert_eq!(report.makespan_ns, 10 * 2_000_000 + FIRST_LATENCY, "request k is due at (k + 1) × 2 ms");
    // At 2000 req/s (0.5 ms apart) the disk (1.001 ms) falls behind: request
    // k is due at (k + 1) × 500_000, its read ends at 575_100 + (k + 1) ×
    // 1_001_000, and its latency counts from when it was due.
    config.load = Load::Open { rate_per_s: 2000.0, requests: 10, streams: 1, arrivals: Arrivals::Constant };
    let report = run(&config, &one_doc(), Independent).unwrap();
    let last = 575_100 + 10 * 1_001_000 + 22_200 - 10 * 500_000;
    assert_eq!(report.latency.max_ns, last);
    assert_eq!(report.requests, 10);
}

/// A test policy: the initial node forwards every request to the next node,
/// which serves it and sends the file back; the initial node replies.
struct ForwardToNext;

#[derive(Debug)]
enum Msg {
    Forward(Request),
    File(Request),
}

impl Policy for ForwardToNext {
    type Message = Msg;
    type Token = ();

    fn name(&self) -> &'static str {
        "forward-to-next"
    }

    fn on_request(&mut self, view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        let to = (node + 1) % view.node_count();
        out.push(Action::Send {
            from: node,
            to,
            kind: "forward",
            bytes: 50,
            via: Via::Message,
            copies: Copies::default(),
            payload: Msg::Forward(request),
        });
    }

    fn on_message(&mut self, _view: &View<'_>, delivery: Delivery<Msg>, out: &mut Actions<Self>) {
        match delivery.payload {
            Msg::Forward(request) => {
                out.push(Action::Serve { node: delivery.to, request: request.id, caching: Caching::Normal, token: () })
            }
            Msg::File(request) => out.push(Action::Reply { node: delivery.to, request: request.id }),
        }
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<()>, out: &mut Actions<Self>) {
        out.push(Action::Send {
            from: served.node,
            to: served.request.initial,
            kind: "file",
            bytes: served.request.bytes,
            via: Via::Message,
            copies: Copies::default(),
            payload: Msg::File(served.request),
        });
    }
}

#[test]
fn a_forwarded_request_pays_both_messages_at_both_ends() {
    // Parsed at 75_100 on node 0. forward: send CPU 5 µs → 80_100; NIC 50 B →
    // 80_150; wire 40 µs → 120_150; receive CPU 5 µs → 125_150. Node 1 misses:
    // disk → 1_126_150. file: CPU → 1_131_150; NIC 1000 B → 1_132_150; wire →
    // 1_172_150; receive → 1_177_150. Reply from node 0: copy → 1_178_150;
    // NIC 1200 B → 1_179_350; + 20 µs → 1_199_350.
    let config = closed(2, 1, 1, 1 << 20);
    let report = run(&config, &one_doc(), ForwardToNext).unwrap();
    assert_eq!(report.makespan_ns, 1_199_350);
    assert_eq!(report.forwarded_requests, 1);
    assert_eq!(report.forwarded_share, 1.0);
    assert_eq!(report.messages["forward"].messages, 1);
    assert_eq!(report.messages["forward"].bytes, 50);
    assert_eq!(report.messages["file"].bytes, 1000);
    let (n0, n1) = (&report.per_node[0], &report.per_node[1]);
    assert_eq!((n0.requests, n0.served, n0.replies), (1, 0, 1));
    assert_eq!((n1.requests, n1.served, n1.served_for_others, n1.misses), (0, 1, 1, 1));
    assert_eq!(n0.cpu_busy_ns, 15_000 + 5_000 + 5_000 + 1_000, "parse+setup, send, receive, reply copy");
    assert_eq!(n1.cpu_busy_ns, 5_000 + 5_000);
    assert_eq!((n0.nic_busy_ns, n1.nic_busy_ns), (50 + 1_200, 1_000));
}

#[test]
fn forwarding_on_a_larger_cluster_conserves_messages() {
    let mut config = closed(5, 10, 400, 1 << 20);
    config.target_choice = tierstack_workload::TargetChoice::Random;
    let trace = Trace::zipf(0.8, 50).unwrap();
    let report = run(&config, &trace, ForwardToNext).unwrap();
    assert_eq!(report.requests, 400);
    assert_eq!((report.messages["forward"].messages, report.messages["file"].messages), (400, 400));
    assert_eq!(report.messages["file"].bytes, report.totals.reply_bytes, "every file message is one reply's body");
    assert_eq!(report.totals.served_for_others, 400);
    assert_eq!(report.forwarded_share, 1.0);
}

/// A test policy: node 0 reads every document one-sidedly out of node 1's
/// memory and replies.
struct ReadFromNeighbour;

impl Policy for ReadFromNeighbour {
    type Message = std::convert::Infallible;
    type Token = Request;

    fn name(&self) -> &'static str {
        "read-from-neighbour"
    }

    fn on_request(&mut self, _view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        out.push(Action::RemoteRead {
            from: node,
            target: node + 1,
            kind: "data",
            bytes: request.bytes,
            token: request,
        });
    }

    fn on_served(&mut self, _view: &View<'_>, _served: Served<Request>, _out: &mut Actions<Self>) {}

    fn on_done(&mut self, _view: &View<'_>, done: Done<Request>, out: &mut Actions<Self>) {
        out.push(Action::Reply { node: done.node, request: done.token.id });
    }
}

#[test]
fn a_one_sided_read_never_runs_the_targets_cpu() {
    // Parsed at 75_100; post 1 µs → 76_100; node 1's NIC 1000 B → 77_100;
    // wire 9 µs → 86_100; reply: copy → 87_100; NIC → 88_300; + 20 µs → 108_300.
    let config = closed(2, 1, 1, 1 << 20);
    let report = run(&config, &one_doc(), ReadFromNeighbour).unwrap();
    assert_eq!(report.makespan_ns, 108_300);
    assert_eq!(report.per_node[1].cpu_busy_ns, 0, "one-sided: the target's CPU never runs");
    assert_eq!(report.per_node[1].nic_busy_ns, 1_000);
    assert_eq!(report.messages["data"].bytes, 1_000);
    assert_eq!(report.forwarded_requests, 0);
}

#[test]
fn the_round_costs_are_what_the_comments_say() {
    let costs = round_costs();
    assert_eq!(costs.messages().wire_ns(true), 40_000);
    assert_eq!(costs.remote_read().wire_ns(false), 9_000);
    assert_eq!(costs.copy_ns(1000), 1000);
}
