//! A node's counters as Prometheus families (`tierstack_coop_*`), written
//! into an exposition by whoever serves `/metrics`: `tierstack coop-node`
//! (a passive module) and a proxy running `--coop` (where the lookups
//! happen). One family per counter, labelled by small fixed sets (where a
//! lookup was served, which home answered a validate, the primitive, the
//! message kind).

use super::CoopNode;
use crate::counts::{MsgKind, Primitive};
use tierstack_stats::exposition::{Exposition, Labels};

/// Writes `node`'s families into `out`.
pub fn write_metrics(node: &CoopNode, out: &mut Exposition) {
    let stats = node.stats();
    out.counters(
        "tierstack_coop_lookups_total",
        "Lookups by where they were served: this node's pool, a peer's, or nowhere (miss).",
        &[
            (&[("result", "local_hit")], stats.local_hits),
            (&[("result", "remote_hit")], stats.remote_hits),
            (&[("result", "miss")], stats.misses),
        ],
    );
    out.counters(
        "tierstack_coop_validates_total",
        "Validates by the key table that answered: this node's own (it is the key's home) or another home's, read one-sidedly.",
        &[(&[("home", "local")], stats.validates_home_local), (&[("home", "remote")], stats.validates_home_remote)],
    );
    let calls: Vec<([(&str, &str); 1], u64)> = Primitive::ALL
        .iter()
        .map(|p| ([("primitive", p.name())], stats.tally.primitives.get(p).map_or(0, |t| t.calls)))
        .collect();
    out.counters(
        "tierstack_coop_primitive_calls_total",
        "Primitive calls made by this node (fetch, store, validate, invalidate).",
        &labelled(&calls),
    );
    let by_kind = |map: &std::collections::BTreeMap<MsgKind, u64>| -> Vec<([(&str, &str); 1], u64)> {
        MsgKind::ALL.iter().map(|k| ([("kind", k.name())], map.get(k).copied().unwrap_or(0))).collect()
    };
    let (messages, bytes) = (by_kind(&stats.tally.messages), by_kind(&stats.tally.bytes));
    out.counters("tierstack_coop_messages_total", "Messages this node sent, by kind.", &labelled(&messages));
    out.counters(
        "tierstack_coop_message_bytes_total",
        "Bytes of the messages this node sent, by kind.",
        &labelled(&bytes),
    );
    let (_, handled) = node.message_counts();
    let mut counter =
        |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_coop_{name}_total"), help, value);
    counter("messages_handled", "Messages this node received and handled.", handled);
    counter("stale_reads", "Remote reads refused because the slot changed since it was announced.", stats.stale_reads);
    counter("peer_failures", "Reads, messages or stores that failed on a dead or silent peer.", stats.peer_failures);
    counter("announces", "Announcements of this node's pool contents (one per member sent to).", stats.announces);
    counter("announce_bytes", "Bytes of those announcements.", stats.announce_bytes);
    counter(
        "announces_skipped",
        "Announcements not sent to a peer whose inbox stayed full (skipped for a back-off).",
        stats.announces_skipped,
    );
    counter(
        "key_table_full",
        "Add-holders this node's key table refused, as a home (the key's probe window was full).",
        stats.key_table_full,
    );
    counter(
        "pool_refusals",
        "Copies this node dropped because their home refused to list them (left unpooled).",
        stats.pool_refusals,
    );
    counter("stalls", "Primitives that waited on a peer's answer.", stats.stalls);
    counter("stall_timeouts", "Of those, the waits that ran out (ack timeout).", stats.stall_timeouts);
    counter(
        "takeovers",
        "Membership changes applied: a home declared dead (its keys to ring successors) or back.",
        stats.takeovers,
    );
    counter("takeover_drops", "Copies dropped because their home changed.", stats.takeover_drops);
    counter(
        "purges_unconfirmed",
        "Purges the home did not acknowledge (every member was told to drop its copy).",
        stats.purges_unconfirmed,
    );
    counter("malformed", "Malformed messages dropped.", stats.malformed);
    counter("guarded_evictions", "Redundant copies' evictions asked at their homes.", stats.guarded_evictions);
    counter("last_copy_refusals", "Guarded evictions the home refused (the last copy).", stats.last_copy_refusals);
    let occupancy = node.occupancy();
    let mut gauge =
        |name: &str, help: &str, value: u64| out.gauge(&format!("tierstack_coop_{name}"), help, value as f64);
    gauge("pool_entries", "Entries in this node's pool now.", occupancy.entries);
    gauge("pool_used_pages", "Pool pages in use now.", occupancy.used_pages);
    gauge("pool_capacity_pages", "Pool pages in all.", occupancy.capacity_pages);
    gauge("home_keys", "Keys in this node's key table (as their home) now.", occupancy.home_keys);
    gauge("home_key_capacity", "Entries the key table holds at most (0: no home here).", occupancy.home_key_capacity);
}

/// Rows of one-label samples as the exposition takes them.
fn labelled<'a>(rows: &'a [([(&'a str, &'a str); 1], u64)]) -> Vec<(Labels<'a>, u64)> {
    rows.iter().map(|(labels, n)| (&labels[..], *n)).collect()
}
