//! Properties of the trace generators, through the public API.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use proptest::prelude::*;
use std::collections::HashSet;
use std::io::Write;
use tierstack_workload::{
    Trace, TraceSpec, WorkloadError, WorldCupParams, SINGLE_DOC_BYTES, ZIPF_MAX_BYTES, ZIPF_MIN_BYTES,
};

#[test]
fn single_is_one_8k_document_requested_forever() {
    let t = Trace::single();
    assert_eq!(t.documents().len(), 1);
    assert_eq!(t.documents()[0].size_bytes, SINGLE_DOC_BYTES);
    assert_eq!(t.documents()[0].path(), "/doc/single");
    assert_eq!(t.documents()[0].key(), "doc/single");
    assert_eq!(t.sample(1000, 1), vec![0; 1000]);
    assert!(matches!(Trace::single_sized(0), Err(WorkloadError::InvalidDocumentSize { .. })));
}

#[test]
fn zipf_documents_span_200b_to_1mib_and_popularity_decreases() {
    let t = Trace::zipf(0.75, 20).unwrap();
    let docs = t.documents();
    assert_eq!(docs.len(), 20);
    assert_eq!(docs[0].size_bytes, ZIPF_MIN_BYTES);
    assert_eq!(docs[19].size_bytes, ZIPF_MAX_BYTES);
    assert!(docs.iter().all(|d| (ZIPF_MIN_BYTES..=ZIPF_MAX_BYTES).contains(&d.size_bytes)));
    assert!(docs.windows(2).all(|w| w[0].size_bytes < w[1].size_bytes));
    let names: HashSet<_> = docs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names.len(), 20);

    // Frequencies over 100k draws, 4 workers' streams together: the most
    // popular document leads, and the empirical log-log slope is -alpha.
    let mut counts = [0u64; 20];
    for w in 0..4 {
        for i in t.stream(11, w, 4).take(25_000) {
            counts[i] += 1;
        }
    }
    let n: u64 = counts.iter().sum();
    for (k, &c) in counts.iter().enumerate() {
        let expected = t.probability(k) * n as f64;
        let sd = expected.sqrt();
        assert!((c as f64 - expected).abs() < 5.0 * sd, "rank {k}: {c} vs {expected:.0}");
    }
    let slope = {
        let xs: Vec<f64> = (1..=20).map(|k| (k as f64).ln()).collect();
        let ys: Vec<f64> = counts.iter().map(|&c| (c as f64).ln()).collect();
        let (mx, my) = (xs.iter().sum::<f64>() / 20.0, ys.iter().sum::<f64>() / 20.0);
        let cov: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let var: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        cov / var
    };
    assert!((slope + 0.75).abs() < 0.05, "slope {slope}");
}

#[test]
fn streams_are_deterministic_from_the_seed() {
    let t = Trace::zipf(0.9, 50).unwrap();
    assert_eq!(t.sample(500, 42), t.sample(500, 42));
    assert_ne!(t.sample(500, 42), t.sample(500, 43));
    let a: Vec<_> = t.stream(42, 0, 2).take(100).collect();
    let b: Vec<_> = t.stream(42, 1, 2).take(100).collect();
    assert_ne!(a, b, "workers must not draw the same sequence");

    let p = WorldCupParams { files: 2000, requests: 3000, ..WorldCupParams::default() };
    let w1 = Trace::worldcup_like(&p, 5).unwrap();
    let w2 = Trace::worldcup_like(&p, 5).unwrap();
    let w3 = Trace::worldcup_like(&p, 6).unwrap();
    assert_eq!(w1.documents(), w2.documents());
    assert_eq!(w1.sample(3000, 0), w2.sample(3000, 0));
    assert_ne!(w1.documents(), w3.documents());
}

#[test]
fn worldcup_subset_has_the_published_shape() {
    let t = TraceSpec::WorldCup(WorldCupParams::default()).build(1).unwrap();
    let s = t.summary();
    assert_eq!(s.replay_requests, Some(20_000));
    // 20 000 draws over 24 328 files touch a few thousand distinct ones.
    assert!(s.documents > 1000 && s.documents < 20_000, "{} documents", s.documents);
    // Requested bytes per request near the published 4.2 KB (sampling noise).
    assert!((s.mean_request_bytes / (4.2 * 1024.0) - 1.0).abs() < 0.15, "{}", s.mean_request_bytes);
    assert!(t.documents().iter().all(|d| d.name.starts_with("wc") && d.size_bytes >= 64));
    // Replay is cyclic: worker 0 of 1 sees the list twice in 40 000 requests.
    let two = t.sample(40_000, 0);
    assert_eq!(two[..20_000], two[20_000..]);
    // Workers start spread over the list.
    let w0: Vec<_> = t.stream(0, 0, 4).take(10).collect();
    let w2: Vec<_> = t.stream(0, 2, 4).take(10).collect();
    assert_eq!(w2[..], two[10_000..10_010]);
    assert_ne!(w0, w2);
}

#[test]
fn trace_spec_parses_the_cli_forms() {
    assert_eq!(TraceSpec::parse("single", 0.75, 20).unwrap(), TraceSpec::Single { size_bytes: 8192 });
    assert_eq!(TraceSpec::parse("zipf", 0.5, 7).unwrap(), TraceSpec::Zipf { alpha: 0.5, docs: 7 });
    assert!(matches!(TraceSpec::parse("worldcup", 0.75, 20).unwrap(), TraceSpec::WorldCup(_)));
    assert_eq!(TraceSpec::parse("clf:/tmp/x.log", 0.75, 20).unwrap(), TraceSpec::Clf { path: "/tmp/x.log".into() });
    for bad in ["clf:", "zip", ""] {
        assert!(matches!(TraceSpec::parse(bad, 0.75, 20), Err(WorkloadError::UnknownTrace(_))), "{bad}");
    }
    assert!(matches!(TraceSpec::parse("zipf", -1.0, 20).unwrap().build(0), Err(WorkloadError::InvalidAlpha { .. })));
    assert!(matches!(
        TraceSpec::parse("zipf", 0.75, 0).unwrap().build(0),
        Err(WorkloadError::InvalidDocumentCount { .. })
    ));
    // Serializable round trip (reports carry the spec).
    let spec = TraceSpec::parse("zipf", 0.75, 20).unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json, r#"{"kind":"zipf","alpha":0.75,"docs":20}"#);
    assert_eq!(serde_json::from_str::<TraceSpec>(&json).unwrap(), spec);
    let wc = TraceSpec::WorldCup(WorldCupParams::default());
    assert_eq!(serde_json::from_str::<TraceSpec>(&serde_json::to_string(&wc).unwrap()).unwrap(), wc);
}

const LOG: &str = r#"
10.0.0.1 - - [30/Apr/1998:21:30:17 +0000] "GET /images/logo.gif HTTP/1.0" 200 1204
10.0.0.2 - - [30/Apr/1998:21:30:18 +0000] "GET /index.html HTTP/1.0" 200 8000
garbage line without structure
10.0.0.3 - - [30/Apr/1998:21:30:19 +0000] "GET /images/logo.gif HTTP/1.0" 304 -
10.0.0.4 - - [30/Apr/1998:21:30:20 +0000] "POST /cgi-bin/form HTTP/1.0" 200 10
10.0.0.5 - - [30/Apr/1998:21:30:21 +0000] "GET /missing.html HTTP/1.0" 404 300
10.0.0.6 - - [30/Apr/1998:21:30:22 +0000] "GET /index.html HTTP/1.0" 200 8100
10.0.0.7 - - [30/Apr/1998:21:30:23 +0000] "GET /index.html HTTP/1.0" 200 12abc
10.0.0.8 - - [30/Apr/1998:21:30:24 +0000] GET /index.html HTTP/1.0 200 10
"#;

#[test]
fn clf_replay_counts_and_skips_bad_lines() {
    let t = Trace::clf_from_str(LOG).unwrap();
    let stats = t.clf_stats().unwrap();
    assert_eq!(stats.lines, 9);
    assert_eq!(stats.requests, 4);
    assert_eq!(stats.malformed, 3);
    assert_eq!(stats.skipped_method, 1);
    assert_eq!(stats.skipped_status, 1);
    let docs = t.documents();
    assert_eq!(docs.len(), 2);
    assert_eq!((docs[0].name.as_str(), docs[0].source_path.as_deref()), ("c0", Some("/images/logo.gif")));
    assert_eq!(docs[0].size_bytes, 1204, "size from the bytes field; '-' does not shrink it");
    assert_eq!(docs[1].size_bytes, 8100, "largest reported size wins");
    assert_eq!(t.sample(8, 0), vec![0, 1, 0, 1, 0, 1, 0, 1]);
}

#[test]
fn clf_file_replay_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(LOG.as_bytes()).unwrap();
    f.write_all(&[0xff, 0xfe, b'\n']).unwrap(); // not UTF-8: malformed, not fatal
    drop(f);
    let t = TraceSpec::Clf { path: path.clone() }.build(0).unwrap();
    assert_eq!(t.clf_stats().unwrap().malformed, 4);
    assert_eq!(t.documents().len(), 2);

    let empty = dir.path().join("empty.log");
    std::fs::write(&empty, "junk\nmore junk\n").unwrap();
    assert!(matches!(Trace::clf(&empty), Err(WorkloadError::EmptyLog { lines: 2, malformed: 2 })));
    assert!(matches!(Trace::clf(&dir.path().join("nope.log")), Err(WorkloadError::Io { .. })));
}

proptest! {
    /// Any text: the parser never panics, and every kept request indexes a document.
    #[test]
    fn clf_never_panics(lines in proptest::collection::vec(".{0,80}", 0..30)) {
        let text = lines.join("\n");
        if let Ok(t) = Trace::clf_from_str(&text) {
            let n = t.documents().len();
            prop_assert!(t.sample(50, 0).iter().all(|&i| i < n));
        }
    }

    /// Zipf traces of any shape: sizes in range, draws in range.
    #[test]
    fn zipf_sizes_and_draws_in_range(docs in 1usize..300, alpha in 0.0f64..3.0, seed in any::<u64>()) {
        let t = Trace::zipf(alpha, docs).unwrap();
        prop_assert_eq!(t.documents().len(), docs);
        prop_assert!(t.documents().iter().all(|d| (ZIPF_MIN_BYTES..=ZIPF_MAX_BYTES).contains(&d.size_bytes)));
        prop_assert!(t.sample(200, seed).iter().all(|&i| i < docs));
    }
}
