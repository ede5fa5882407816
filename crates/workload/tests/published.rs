//! The seeds' traces against the tables they come from.
//!
//! Tolerances (also in docs/traces.md):
//! - file count: exact; per-node cache: exact (MB = 2^20 bytes);
//! - mean file size and mean request size (the exact popularity-weighted
//!   expectation): within 1 % of the table (the construction reaches 0.01 %);
//! - α: the maximum-likelihood fit over 200 000 draws within 0.01 of the
//!   table (standard error ≈ 0.002, so 0.01 is ≈ 5 standard errors);
//! - the sampled request mean: within 5 standard errors of its expectation,
//!   the standard error computed from the trace's exact size variance;
//! - coop: sizes exact, uniformity by Pearson's chi-square over the 10 000
//!   files (df 9 999), bound = df + 6·sqrt(2·df).

// Helpers outside #[test] functions unwrap too: in a test a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use tierstack_workload::published::{Targets, COOP_CACHE_BYTES_PER_NODE, COOP_FILES, MB, PRESS_TABLE_1};
use tierstack_workload::{
    fit_zipf_alpha, write_clf, CoopTrace, PressTrace, PublishedTrace, Trace, TraceSpec, WorkloadError,
    ZIPF_ALPHA_DEFAULT,
};

const MEAN_TOLERANCE: f64 = 0.01;
const ALPHA_TOLERANCE: f64 = 0.01;
const ALPHA_FIT_DRAWS: usize = 200_000;

fn build(name: &str, seed: u64) -> Trace {
    TraceSpec::parse(name, ZIPF_ALPHA_DEFAULT, 20).unwrap().build(seed).unwrap()
}

fn relative_error(got: f64, want: f64) -> f64 {
    (got / want - 1.0).abs()
}

/// Counts of `draws` requests (worker 0 of 1) by document index.
fn counts(trace: &Trace, draws: usize, seed: u64) -> Vec<u64> {
    let mut counts = vec![0u64; trace.documents().len()];
    for i in trace.sample(draws, seed) {
        counts[i] += 1;
    }
    counts
}

/// Checks a synthesized trace against its targets; returns the fitted α.
fn check_against(trace: &Trace, target: &Targets, seed: u64) -> f64 {
    let s = trace.summary();
    let label = &s.label;
    assert_eq!(s.documents, target.files, "{label}: file count");
    assert!(relative_error(s.mean_document_bytes, target.mean_file_bytes) < MEAN_TOLERANCE, "{label}: {s:?}");
    assert!(relative_error(s.mean_request_bytes, target.mean_request_bytes) < MEAN_TOLERANCE, "{label}: {s:?}");
    assert_eq!(trace.cache_bytes_per_node(), Some(target.cache_bytes_per_node), "{label}");
    assert_eq!(trace.popularity_alpha(), Some(target.alpha), "{label}");

    let counts = counts(trace, ALPHA_FIT_DRAWS, seed);
    let fitted = fit_zipf_alpha(&counts).unwrap();
    assert!((fitted - target.alpha).abs() < ALPHA_TOLERANCE, "{label}: fitted alpha {fitted}");

    // The sampled bytes per request agree with the expectation the summary reports.
    let sizes: Vec<f64> = trace.documents().iter().map(|d| d.size_bytes as f64).collect();
    let mean = s.mean_request_bytes;
    let variance: f64 = (0..sizes.len()).map(|k| trace.probability(k) * (sizes[k] - mean).powi(2)).sum();
    let sampled: f64 = counts.iter().zip(&sizes).map(|(&c, s)| c as f64 * s).sum::<f64>() / ALPHA_FIT_DRAWS as f64;
    let standard_error = (variance / ALPHA_FIT_DRAWS as f64).sqrt();
    assert!(
        (sampled - mean).abs() <= 5.0 * standard_error + 1e-9 * mean,
        "{label}: sampled {sampled}, expected {mean} ± {standard_error}"
    );
    fitted
}

#[test]
fn every_press_trace_matches_table_1() {
    for (trace, row) in PressTrace::ALL.into_iter().zip(&PRESS_TABLE_1) {
        let name = format!("press:{}", row.name);
        let t = build(&name, 1);
        let p = t.published().unwrap().clone();
        assert_eq!(p.trace, name);
        assert_eq!(p.scale, 1.0);
        assert_eq!(p.seed, p.target, "scale 1: the targets are the seed's");
        // The targets are the row, in bytes (KB = 1024).
        assert_eq!(p.target.files, row.files);
        assert_eq!(p.target.mean_file_bytes, row.mean_file_kb * 1024.0);
        assert_eq!(p.target.mean_request_bytes, row.mean_request_kb * 1024.0);
        assert_eq!(p.target.nominal_requests, Some(row.requests));
        assert_eq!(p.target.cache_bytes_per_node, row.cache_mb_per_node * MB);
        assert_eq!(trace.row(), row);
        check_against(&t, &p.target, 7);
        // Every document is named after its rank and sized within the shape's bounds.
        let model = p.size_model.unwrap();
        for (k, d) in t.documents().iter().enumerate() {
            assert_eq!(d.name, format!("{}f{k}", row.name));
            assert!((model.shape.min_bytes..=model.shape.max_bytes).contains(&d.size_bytes), "{name}: {d:?}");
        }
        // Popular files are smaller than average, as the table's means say.
        assert!(model.size_rank_correlation > 0.0, "{name}: {model:?}");
    }
}

#[test]
fn the_per_node_caches_are_the_seeds() {
    let caches: Vec<u64> =
        PressTrace::ALL.iter().map(|&t| PublishedTrace::Press(t).seed_targets().cache_bytes_per_node).collect();
    assert_eq!(caches, [192 * MB, 96 * MB, 352 * MB, 48 * MB, 64 * MB]);
    assert_eq!(build("press:usask@0.5", 1).cache_bytes_per_node(), Some(24 * MB));
    assert_eq!(build("coop:32k", 1).cache_bytes_per_node(), Some(64 * MB));
    assert_eq!(build("zipf", 1).cache_bytes_per_node(), None);
}

/// Pearson's chi-square of counts against the uniform distribution.
fn uniform_chi_square(counts: &[u64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let expected = n as f64 / counts.len() as f64;
    counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
}

fn uniform_chi_square_bound(buckets: usize) -> f64 {
    let df = (buckets - 1) as f64;
    df + 6.0 * (2.0 * df).sqrt()
}

#[test]
fn coop_traces_are_exact_sizes_requested_uniformly() {
    for (trace, bytes) in CoopTrace::ALL.into_iter().zip([8192u64, 16384, 32768, 65536]) {
        let name = format!("coop:{}", trace.name());
        let t = build(&name, 3);
        assert_eq!(t.documents().len(), COOP_FILES);
        assert!(t.documents().iter().all(|d| d.size_bytes == bytes), "{name}");
        let names: HashSet<&str> = t.documents().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names.len(), COOP_FILES);
        let s = t.summary();
        assert_eq!(s.total_document_bytes, COOP_FILES as u64 * bytes, "working set");
        assert_eq!((s.mean_document_bytes, s.mean_request_bytes), (bytes as f64, bytes as f64));
        assert_eq!(t.cache_bytes_per_node(), Some(COOP_CACHE_BYTES_PER_NODE));
        let p = t.published().unwrap();
        assert_eq!(p.target.alpha, 0.0);
        assert!(p.size_model.is_none());

        let counts = counts(&t, 500_000, 11);
        let chi2 = uniform_chi_square(&counts);
        assert!(chi2 < uniform_chi_square_bound(COOP_FILES), "{name}: chi-square {chi2}");
        assert!(fit_zipf_alpha(&counts).unwrap() < ALPHA_TOLERANCE, "{name}");
    }
}

#[test]
fn the_uniformity_check_rejects_a_slight_skew() {
    // The bound above must be able to fail: Zipf(0.05) over the same files,
    // a barely visible skew (rank 1 is drawn 1.58x as often as rank 10 000),
    // exceeds it.
    let skewed = Trace::zipf(0.05, COOP_FILES).unwrap();
    let chi2 = uniform_chi_square(&counts(&skewed, 500_000, 11));
    assert!(chi2 > uniform_chi_square_bound(COOP_FILES), "chi-square {chi2}");
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let a = build("press:nasa@0.2", 5);
    let b = build("press:nasa@0.2", 5);
    let c = build("press:nasa@0.2", 6);
    assert_eq!(a.documents(), b.documents());
    assert_eq!(a.sample(5000, 5), b.sample(5000, 5));
    assert_ne!(a.documents(), c.documents(), "the size synthesis depends on the seed");
    assert_ne!(a.sample(5000, 5), a.sample(5000, 6));
    let w0: Vec<usize> = a.stream(5, 0, 2).take(1000).collect();
    let w1: Vec<usize> = a.stream(5, 1, 2).take(1000).collect();
    assert_ne!(w0, w1, "workers draw independently");
    // Different seeds still meet the same targets.
    check_against(&c, &c.published().unwrap().target, 1);

    // Coop document sets do not depend on the seed; their streams do.
    let (x, y) = (build("coop:8k", 1), build("coop:8k", 2));
    assert_eq!(x.documents(), y.documents());
    assert_eq!(x.sample(1000, 1), y.sample(1000, 1));
    assert_ne!(x.sample(1000, 1), x.sample(1000, 2));

    // Traces do not share size streams: Clarknet and Rutgers at the same seed differ in shape.
    let first_sizes = |name: &str| build(name, 1).documents().iter().take(50).map(|d| d.size_bytes).collect::<Vec<_>>();
    assert_ne!(first_sizes("press:clarknet@0.1"), first_sizes("press:rutgers@0.1"));
}

fn build_spec_targets(name: &str) -> Targets {
    match TraceSpec::parse(name, 0.75, 20).unwrap() {
        TraceSpec::Press { trace, .. } => PublishedTrace::Press(trace).seed_targets(),
        TraceSpec::Coop { trace, .. } => PublishedTrace::Coop(trace).seed_targets(),
        other => panic!("not a seed's trace: {other:?}"),
    }
}

#[test]
fn scaling_shrinks_files_and_cache_and_keeps_the_ratios() {
    for name in ["press:clarknet", "press:usask", "press:wc98", "coop:64k"] {
        let tenth = build(&format!("{name}@0.1"), 2);
        let pt = tenth.published().unwrap();
        let seed = &pt.seed;
        assert_eq!(pt.scale, 0.1);
        assert_eq!(pt.seed, build_spec_targets(name), "{name}: the seed's numbers are kept beside the scaled ones");
        assert_eq!(pt.target.files, (seed.files as f64 * 0.1).round() as usize);
        assert_eq!(pt.target.cache_bytes_per_node, (seed.cache_bytes_per_node as f64 * 0.1).round() as u64);
        assert_eq!(
            (pt.target.mean_file_bytes, pt.target.mean_request_bytes, pt.target.alpha),
            (seed.mean_file_bytes, seed.mean_request_bytes, seed.alpha),
            "{name}: sizes and alpha are not scaled"
        );
        check_against(&tenth, &pt.target, 3);
        // Full-scale traces meet the seed's numbers (every_press_trace_matches_table_1),
        // so the seed's ratio stands for theirs.
        let ratio = tenth.summary().total_document_bytes as f64 / tenth.cache_bytes_per_node().unwrap() as f64;
        let seed_ratio = seed.working_set_bytes() / seed.cache_bytes_per_node as f64;
        assert!(relative_error(ratio, seed_ratio) < MEAN_TOLERANCE, "{name}: {ratio} vs {seed_ratio}");
    }
    // The seed's capacity thresholds survive: the coop 8k-trace overflows one
    // node's cache and fits two, at any scale.
    for scale in [1.0, 0.25, 0.01] {
        let t = build(&format!("coop:8k@{scale}"), 1);
        let (working_set, cache) = (t.summary().total_document_bytes, t.cache_bytes_per_node().unwrap());
        assert!(working_set > cache && working_set <= 2 * cache, "scale {scale}: {working_set} vs {cache}");
    }
}

#[test]
fn usask_too_small_misses_its_request_mean_visibly() {
    // The documented limit (crate::sizes): under Zipf(0.61) over 138 files no
    // assignment reaches 6.2 KB per request; the construction saturates and
    // the summary shows the miss instead of hiding it.
    let t = build("press:usask@0.01", 1);
    let s = t.summary();
    let p = s.published.as_ref().unwrap();
    let model = p.size_model.as_ref().unwrap();
    assert_eq!(model.size_rank_correlation, 1.0);
    assert_eq!(model.shape.tail_index, tierstack_workload::sizes::TAIL_INDEX_MIN);
    assert!(s.mean_request_bytes > 1.01 * p.target.mean_request_bytes, "{s:?}");
    assert!(relative_error(s.mean_document_bytes, p.target.mean_file_bytes) < MEAN_TOLERANCE);
    // At scale 0.02 it is met again.
    let t = build("press:usask@0.02", 1);
    check_against(&t, &t.published().unwrap().target, 1);
}

#[test]
fn names_and_scales_parse_and_bad_ones_are_typed_errors() {
    assert_eq!(
        TraceSpec::parse("press:nasa", 0.75, 20).unwrap(),
        TraceSpec::Press { trace: PressTrace::Nasa, scale: 1.0 }
    );
    assert_eq!(
        TraceSpec::parse("press:wc98@0.25", 0.75, 20).unwrap(),
        TraceSpec::Press { trace: PressTrace::Wc98, scale: 0.25 }
    );
    assert_eq!(
        TraceSpec::parse("coop:64k@1", 0.75, 20).unwrap(),
        TraceSpec::Coop { trace: CoopTrace::K64, scale: 1.0 }
    );
    assert_eq!(
        TraceSpec::parse("coop:16k", 0.75, 20).unwrap().with_scale(0.5).unwrap(),
        TraceSpec::Coop { trace: CoopTrace::K16, scale: 0.5 }
    );
    for unknown in
        ["press:", "press:nasa2", "press:NASA", "coop:", "coop:12k", "nasa", "coop8k", "single@0.5", "zipf@1"]
    {
        assert!(matches!(TraceSpec::parse(unknown, 0.75, 20), Err(WorkloadError::UnknownTrace(_))), "{unknown}");
    }
    for bad_scale in [
        "press:nasa@0",
        "press:nasa@-0.1",
        "press:nasa@1.5",
        "press:nasa@abc",
        "press:nasa@",
        "coop:8k@nan",
        "coop:8k@inf",
    ] {
        assert!(matches!(TraceSpec::parse(bad_scale, 0.75, 20), Err(WorkloadError::InvalidScale(_))), "{bad_scale}");
    }
    assert!(matches!(
        TraceSpec::parse("zipf", 0.75, 20).unwrap().with_scale(0.5),
        Err(WorkloadError::InvalidParameter { .. })
    ));
    assert!(matches!(
        TraceSpec::parse("coop:8k", 0.75, 20).unwrap().with_scale(2.0),
        Err(WorkloadError::InvalidScale(_))
    ));
    // A spec built by hand is checked when built.
    assert!(matches!(
        TraceSpec::Press { trace: PressTrace::Nasa, scale: 0.0 }.build(1),
        Err(WorkloadError::InvalidScale(_))
    ));
    // The messages name the forms.
    let message = TraceSpec::parse("press:x", 0.75, 20).unwrap_err().to_string();
    assert!(message.contains("press:{clarknet,nasa,rutgers,usask,wc98}[@SCALE]"), "{message}");

    // Serializable round trip (reports carry the spec).
    let spec = TraceSpec::parse("press:usask@0.5", 0.75, 20).unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json, r#"{"kind":"press","trace":"usask","scale":0.5}"#);
    assert_eq!(serde_json::from_str::<TraceSpec>(&json).unwrap(), spec);
    let coop = TraceSpec::parse("coop:8k", 0.75, 20).unwrap();
    assert_eq!(serde_json::to_string(&coop).unwrap(), r#"{"kind":"coop","trace":"8k","scale":1.0}"#);
}

#[test]
fn summaries_carry_targets_only_for_the_seeds_traces() {
    let s = build("press:rutgers@0.05", 1).summary();
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["published"]["target"]["files"], 3513);
    assert_eq!(json["published"]["seed"]["files"], 70_256);
    assert_eq!(json["published"]["seed"]["nominal_requests"], 4_765_224);
    assert_eq!(json["label"], "press:rutgers@0.05");
    // Existing traces' summaries serialize exactly as before: no new key.
    let zipf = serde_json::to_value(Trace::zipf(0.75, 20).unwrap().summary()).unwrap();
    assert!(zipf.get("published").is_none(), "{zipf}");
    assert!(Trace::single().published().is_none());
}

#[test]
fn clf_export_replays_as_the_same_requests() {
    for name in ["press:nasa@0.1", "coop:16k@0.05"] {
        let trace = build(name, 3);
        let requests = 3000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.log");
        let written = write_clf(&trace, requests, 9, std::fs::File::create(&path).unwrap()).unwrap();
        assert_eq!(written, requests as u64);

        let replayed = TraceSpec::parse(&format!("clf:{}", path.display()), 0.75, 20).unwrap().build(0).unwrap();
        let stats = replayed.clf_stats().unwrap();
        assert_eq!((stats.lines, stats.requests, stats.malformed), (requests as u64, requests as u64, 0), "{name}");
        let original = trace.sample(requests, 9);
        let again = replayed.sample(requests, 0);
        for (i, (&o, &r)) in original.iter().zip(&again).enumerate() {
            let (od, rd) = (&trace.documents()[o], &replayed.documents()[r]);
            assert_eq!(rd.source_path.as_deref(), Some(od.path().as_str()), "{name}: request {i}");
            assert_eq!(rd.size_bytes, od.size_bytes, "{name}: request {i}");
        }
        let distinct: HashSet<usize> = original.iter().copied().collect();
        assert_eq!(replayed.documents().len(), distinct.len());
    }
    // In memory too, and zero requests write nothing.
    let trace = build("coop:8k@0.01", 1);
    let mut buf = Vec::new();
    assert_eq!(write_clf(&trace, 0, 1, &mut buf).unwrap(), 0);
    assert!(buf.is_empty());
    write_clf(&trace, 10, 1, &mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    assert!(text.starts_with("10.0.0.1 - - [01/Jun/1998:00:00:00 +0000] \"GET /doc/coop8kf"), "{text}");
    assert_eq!(Trace::clf_from_str(&text).unwrap().clf_stats().unwrap().requests, 10);
}
