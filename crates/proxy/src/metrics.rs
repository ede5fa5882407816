//! Prometheus text exposition (format 0.0.4) of the proxy's counters, at
//! `/metrics` on the admin listener: the same numbers as
//! `/_tierstack/stats`, plus the version checks' latency histogram.

use crate::stats::ProxyStats;
use tierstack_stats::exposition::{Exposition, SecondsHistogram};

/// Upper bounds of the version-check latency buckets, seconds.
pub(crate) const CHECK_BUCKETS_SECS: &[f64] =
    &[5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 100e-3];

/// The version checks' latency histogram (microsecond-scale buckets).
pub(crate) struct CheckLatency(pub(crate) SecondsHistogram);

impl Default for CheckLatency {
    fn default() -> Self {
        CheckLatency(SecondsHistogram::new(CHECK_BUCKETS_SECS))
    }
}

/// The exposition text.
/// With `--coop`, the cooperative cache node's `tierstack_coop_*` families follow.
pub(crate) fn render(
    stats: &ProxyStats,
    checks: &CheckLatency,
    coop: Option<&tierstack_coop::service::CoopNode>,
) -> String {
    let mut out = Exposition::new();
    let mut counter = |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_proxy_{name}"), help, value);
    counter("requests_total", "Requests on the client listener.", stats.requests);
    counter("hits_total", "Requests served from the proxy's own stored response (X-Cache: HIT).", stats.hits);
    counter("misses_total", "Requests forwarded upstream.", stats.misses);
    counter("coalesced_total", "Requests served another request's concurrent fetch (not hits).", stats.coalesced);
    counter("abandoned_total", "Requests whose client left before they were served.", stats.abandoned);
    counter("not_modified_total", "Hits answered 304 to the client's conditions.", stats.not_modified);
    counter("version_checks_total", "Version checks on the request path.", stats.checks);
    counter("stale_dropped_total", "Stored responses a version check found out of date.", stats.stale_dropped);
    counter("version_check_errors_total", "Version checks that could not be made (fail closed).", stats.check_errors);
    counter(
        "stale_served_total",
        "Stale responses served (stale-while-revalidate, stale-if-error).",
        stats.stale_served,
    );
    counter(
        "served_on_error_total",
        "Stored responses served in place of an upstream failure (stale-if-error, --serve-stale-on-error).",
        stats.served_on_error,
    );
    counter("ranges_served_total", "Hits answered 206 or 416 from a stored complete response.", stats.ranges_served);
    counter("revalidations_total", "Conditional requests sent to revalidate stored responses.", stats.revalidations);
    counter("revalidated_total", "Revalidations answered 304.", stats.revalidated);
    counter("invalidations_total", "Stored responses dropped after unsafe methods.", stats.invalidations);
    counter("purges_total", "Objects dropped by an admin purge.", stats.purges);
    counter("upstream_errors_total", "Upstreams that did not answer, or not in time.", stats.upstream_errors);
    counter(
        "upstream_retries_total",
        "Forwards sent to another upstream after the chosen one failed them.",
        stats.upstream_retries,
    );
    counter(
        "upstream_abandoned_total",
        "Forwards given up before a response head: their upstream turned suspect or dead.",
        stats.upstream_abandoned,
    );
    counter(
        "upstream_timeouts_total",
        "Forwards with no response head within the upstream timeout.",
        stats.upstream_timeouts,
    );
    counter(
        "upstream_pauses_total",
        "Times an upstream was paused after max_fails failed forwards.",
        stats.upstream_pauses,
    );
    counter("upstream_bytes_total", "Response body bytes received from upstreams.", stats.upstream_bytes);
    counter("evictions_total", "Keys evicted to stay within the cache's bound.", stats.evictions);
    counter("pushes_installed_total", "Pushed documents installed.", stats.pushes_installed);
    counter(
        "pages_installed_total",
        "Hits served from a page the application module published, read one-sidedly.",
        stats.pages_installed,
    );
    counter(
        "pages_unusable_total",
        "Published-page reads that found no current page for the request.",
        stats.pages_unusable,
    );
    counter("refresh_reads_total", "Batched version reads of the hot set (proxy-side refresh).", stats.refresh_reads);
    counter(
        "refresh_refetches_total",
        "Hot documents refetched because their versions changed.",
        stats.refresh_refetches,
    );
    let mut gauge =
        |name: &str, help: &str, value: u64| out.gauge(&format!("tierstack_proxy_{name}"), help, value as f64);
    gauge("objects", "Stored responses (every variant).", stats.cached_entries);
    gauge("bytes", "Bytes of the stored responses (bodies and fields).", stats.cached_bytes);
    gauge("waiting_on_fetch", "Requests waiting for another request's fetch now.", stats.waiting_on_fetch);
    out.histogram(
        "tierstack_proxy_version_check_seconds",
        "Latency of the version checks on the request path.",
        &checks.0,
    );
    if let Some(node) = coop {
        tierstack_coop::service::write_metrics(node, &mut out);
    }
    tierstack_tier_http::observe::process_metrics(&mut out);
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_is_cumulative_and_counts_every_check() {
        let h = CheckLatency::default();
        for ns in [1_000, 7_000, 7_000, 2_000_000, 1_000_000_000] {
            h.0.record_ns(ns);
        }
        let stats = ProxyStats { checks: 5, hits: 3, served_on_error: 2, ranges_served: 1, ..ProxyStats::default() };
        let text = render(&stats, &h, None);
        assert!(text.contains("tierstack_proxy_version_check_seconds_bucket{le=\"0.000005\"} 1\n"), "{text}");
        assert!(text.contains("tierstack_proxy_version_check_seconds_bucket{le=\"0.00001\"} 3\n"), "{text}");
        assert!(text.contains("tierstack_proxy_version_check_seconds_bucket{le=\"0.0025\"} 4\n"), "{text}");
        assert!(text.contains("tierstack_proxy_version_check_seconds_bucket{le=\"+Inf\"} 5\n"), "{text}");
        assert!(text.contains("tierstack_proxy_version_check_seconds_count 5\n"));
        assert!(text.contains("tierstack_proxy_hits_total 3\n"));
        // As Prometheus (and promtool, where installed) takes it.
        let checked = tierstack_testkit::metrics::check(&text).unwrap();
        assert_eq!(checked.get("tierstack_proxy_hits_total"), 3.0);
        assert_eq!(checked.get("tierstack_proxy_served_on_error_total"), 2.0);
        assert_eq!(checked.get("tierstack_proxy_ranges_served_total"), 1.0);
        assert!(checked.get("process_resident_memory_bytes") > 0.0, "the process families follow");
    }
}
