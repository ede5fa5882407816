//! Workloads: what the load client asks for, and what the application server
//! must be able to serve.
//!
//! This crate owns the [`Trace`]: a document set (name → size in bytes) plus
//! a source of requests over it, either a popularity distribution sampled
//! forever or a finite request list replayed cyclically. It performs no I/O
//! except reading a log file for [`Trace::clf`]; everything else is a pure
//! function of its parameters and a seed (`tierstack_base::seeded_rng`), so
//! the application server and the load client build the same document set
//! from the same [`TraceSpec`] and seed.
//!
//! Documents are served at `/doc/<name>` ([`Document::path`]) and their
//! default dependency key is `doc/<name>` ([`Document::key`]); names are
//! short and key-safe (`[A-Za-z0-9]`), so they fit the header contract of
//! `docs/coherence-protocol.md`.
//!
//! # The traces, and where their numbers come from
//!
//! - [`Trace::single`]: one document, `single`, of 8 KiB — the coherency
//!   paper's Trace 1 ("a single 8Kbyte file", §5.2).
//! - [`Trace::zipf`]: `docs` documents `z0 … z{docs-1}` (default 20) whose
//!   sizes span 200 B to 1 MiB geometrically (log-uniform ladder with exact
//!   endpoints), accessed with Zipf(α) popularity — the paper's Trace 2 ("20
//!   files of sizes varying from 200bytes to 1Mbytes … follow a Zipf
//!   distribution"). The paper gives neither α nor how size relates to
//!   popularity. We take α = 0.75 by default (the middle of the 0.61–0.94
//!   range the PRESS paper's Table 1 reports for real traces) and give the
//!   smallest size to the most popular document (`z0` is the most popular
//!   and smallest): in all five traces of PRESS Table 1 the average
//!   *request* size is below the average *file* size, i.e. popular files are
//!   small. The document set does not depend on the seed.
//! - [`Trace::worldcup_like`]: the paper's Trace 3 is "a 20000 request subset
//!   of the WorldCup trace", which we cannot ship; we synthesize one from the
//!   WC98 row of PRESS Table 1: **24 328 files, average file size 9.1 KB,
//!   average request size 4.2 KB, α = 0.77**, and the 20 000-request subset
//!   size of coherency §5.2. Sizes are log-normal with σ = 1.0 (an
//!   assumption: the table publishes only means) scaled to the 9.1 KB file
//!   mean; sizes are matched to popularity ranks through a Gaussian copula
//!   whose correlation is calibrated by bisection so that the
//!   popularity-weighted mean is 4.2 KB. Then 20 000 ranks are drawn from
//!   Zipf(0.77) over the 24 328 files; the documents of the trace are the
//!   distinct files drawn (`wc<rank>`), and the trace replays those 20 000
//!   requests. PRESS Table 3's hit rates (WC98: 98.4 % for the traditional
//!   server, 99.9 % total for PRESS) depend on its cache sizes, node count
//!   and the real trace's temporal locality, so they are not used as
//!   synthesis targets; [`worldcup::model`] reports the achieved means.
//! - The seeds' traces ([`published`]): `press:clarknet|nasa|rutgers|usask|wc98`
//!   from PRESS Table 1 (files, mean file size, mean request size, α, the
//!   nominal request count and the per-node cache of §4.1), with heavy-tailed
//!   sizes assigned to popularity ranks so that both means match
//!   ([`sizes`]) and independent Zipf(α) requests; and `coop:8k|16k|32k|64k`
//!   from the cooperative-caching seed (10 000 files of one size, uniform
//!   requests, 64 MB per node). Both take a scale factor (`press:nasa@0.1`)
//!   that shrinks the file count and the cache together. `docs/traces.md`
//!   has the table of targets against synthesized values
//!   (`tierstack trace show`), and [`write_clf`] exports any trace's requests
//!   as a log that [`Trace::clf`] replays.
//! - [`Trace::clf`]: Common Log Format replay ([`clf`]): the GET requests
//!   with status 2xx or 304, documents = distinct paths (`c<i>`, the original
//!   path kept in [`Document::source_path`]), sizes from the bytes field;
//!   malformed lines are counted in [`ClfStats`], never fatal.
//!
//! # Streams
//!
//! [`Trace::stream`] gives worker `w` of `W` an endless iterator of document
//! indices: for a distribution, independent draws from a per-worker seeded
//! RNG; for a replayed list, the list read cyclically from offset
//! `w * len / W`, so workers spread over the trace instead of marching in step.
//! Which target each request goes to ([`target`]) and, in an open loop, when
//! it is due and which stream it belongs to ([`arrival`]) are rules of this
//! crate too, so the load client and the simulator share them.
//!
//! Key design choice: Zipf sampling is an exact inverse-CDF table
//! ([`ZipfTable`]), not a rejection sampler: one uniform draw and a binary
//! search, exact for every α ≥ 0, and its frequencies are tested with a
//! chi-square bound.
//! [`fit_zipf_alpha`] recovers α from request counts by maximum likelihood.

pub mod arrival;
pub mod clf;
mod fit;
pub mod published;
pub mod show;
pub mod sizes;
pub mod target;
pub mod worldcup;
mod zipf;

pub use arrival::{stream_of, ArrivalSchedule, Arrivals};
pub use clf::{write_clf, ClfStats};
pub use fit::fit_zipf_alpha;
pub use published::{CoopTrace, PressTrace, PublishedProfile, PublishedTrace};
pub use target::{TargetChoice, TargetChooser};
pub use worldcup::WorldCupParams;
pub use zipf::ZipfTable;

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tierstack_base::{seeded_rng, SeededRng};

/// URL path prefix of documents: document `name` is served at `/doc/<name>`.
pub const DOC_PATH_PREFIX: &str = "/doc/";
/// Prefix of a document's default dependency key: `doc/<name>`.
pub const DOC_KEY_PREFIX: &str = "doc/";
/// Coherency paper Trace 1: one 8 KiB document.
pub const SINGLE_DOC_BYTES: u64 = 8 << 10;
/// Coherency paper Trace 2: 20 documents ([`ZIPF_DOCS_DEFAULT`]) …
/// … of 200 B …
pub const ZIPF_MIN_BYTES: u64 = 200;
/// … to 1 MiB.
pub const ZIPF_MAX_BYTES: u64 = 1 << 20;
/// The Zipf defaults live in `tierstack_model`, so that the tiers whose
/// flags default to them (origin, press-node) need not depend on workload.
pub use tierstack_model::{ZIPF_ALPHA_DEFAULT, ZIPF_DOCS_DEFAULT};
/// Largest Zipf exponent accepted.
pub const ALPHA_MAX: f64 = 16.0;
/// Most documents in one trace.
pub const DOCS_MAX: usize = 1 << 20;
/// Largest document size (larger sizes in a log are clamped and counted).
pub const DOC_BYTES_MAX: u64 = 64 << 20;
/// Most requests in a replayed list (4 bytes each).
pub const REPLAY_REQUESTS_MAX: usize = 64 << 20;

/// Errors building a trace.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("invalid Zipf exponent {alpha} (need a finite value in 0..={ALPHA_MAX})")]
    InvalidAlpha { alpha: f64 },
    #[error("invalid document count {docs} (need 1..={max})")]
    InvalidDocumentCount { docs: usize, max: usize },
    #[error("invalid document size {size_bytes} (need 1..={max})", max = DOC_BYTES_MAX)]
    InvalidDocumentSize { size_bytes: u64 },
    #[error("invalid parameter: {what}")]
    InvalidParameter { what: &'static str },
    #[error(
        "unknown trace {0:?} (expected single, zipf, worldcup, clf:PATH, \
         press:{{clarknet,nasa,rutgers,usask,wc98}}[@SCALE] or coop:{{8k,16k,32k,64k}}[@SCALE])"
    )]
    UnknownTrace(String),
    #[error("invalid scale {0:?} (need a number in (0, 1])")]
    InvalidScale(String),
    #[error("log has no usable request ({lines} lines, {malformed} malformed)")]
    EmptyLog { lines: u64, malformed: u64 },
    #[error("log has more than {max} requests")]
    TooManyRequests { max: usize },
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// One document of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Key-safe name: the document is `/doc/<name>`.
    pub name: String,
    /// Body size the application server generates.
    pub size_bytes: u64,
    /// For replayed logs, the path the log named.
    pub source_path: Option<String>,
}

impl Document {
    /// The URL path, `/doc/<name>`.
    pub fn path(&self) -> String {
        format!("{DOC_PATH_PREFIX}{}", self.name)
    }

    /// The default dependency key, `doc/<name>`.
    pub fn key(&self) -> String {
        format!("{DOC_KEY_PREFIX}{}", self.name)
    }
}

/// Which trace to build: the serializable description shared by the load
/// client, the application server and reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceSpec {
    Single {
        size_bytes: u64,
    },
    Zipf {
        alpha: f64,
        docs: usize,
    },
    #[serde(rename = "worldcup")]
    WorldCup(WorldCupParams),
    Clf {
        path: PathBuf,
    },
    /// A PRESS trace (seed Table 1) at `scale` (see [`published`]).
    Press {
        trace: PressTrace,
        scale: f64,
    },
    /// A cooperative-caching trace (seed §4) at `scale` (see [`published`]).
    Coop {
        trace: CoopTrace,
        scale: f64,
    },
}

impl TraceSpec {
    /// Parses the command-line form: `single`, `zipf`, `worldcup`,
    /// `clf:PATH`, `press:NAME[@SCALE]` or `coop:NAME[@SCALE]` (NAME as in
    /// [`published`]; SCALE in (0, 1], default 1, e.g. `press:nasa@0.1`);
    /// `alpha` and `docs` apply to `zipf`.
    pub fn parse(kind: &str, alpha: f64, docs: usize) -> Result<Self, WorkloadError> {
        match kind {
            "single" => return Ok(Self::Single { size_bytes: SINGLE_DOC_BYTES }),
            "zipf" => return Ok(Self::Zipf { alpha, docs }),
            "worldcup" => return Ok(Self::WorldCup(WorldCupParams::default())),
            _ => {}
        }
        if let Some(path) = kind.strip_prefix("clf:") {
            return match path.is_empty() {
                false => Ok(Self::Clf { path: PathBuf::from(path) }),
                true => Err(WorkloadError::UnknownTrace(kind.to_string())),
            };
        }
        let (name, scale) = match kind.split_once('@') {
            Some((name, scale_text)) => {
                let scale = scale_text.parse::<f64>().map_err(|_| WorkloadError::InvalidScale(scale_text.to_string()));
                (name, published::check_scale(scale?)?)
            }
            None => (kind, 1.0),
        };
        match PublishedTrace::parse(name) {
            Some(Ok(PublishedTrace::Press(trace))) => Ok(Self::Press { trace, scale }),
            Some(Ok(PublishedTrace::Coop(trace))) => Ok(Self::Coop { trace, scale }),
            Some(Err(e)) => Err(e),
            None => Err(WorkloadError::UnknownTrace(kind.to_string())),
        }
    }

    /// The same trace at `scale` (for `press` and `coop`; an error for the
    /// others, which have no scale).
    pub fn with_scale(self, scale: f64) -> Result<Self, WorkloadError> {
        let scale = published::check_scale(scale)?;
        match self {
            Self::Press { trace, .. } => Ok(Self::Press { trace, scale }),
            Self::Coop { trace, .. } => Ok(Self::Coop { trace, scale }),
            _ => Err(WorkloadError::InvalidParameter { what: "only press:* and coop:* traces take a scale" }),
        }
    }

    /// Builds the trace. `seed` matters for `worldcup` and `press` (the
    /// synthesis); the other document sets do not depend on it.
    pub fn build(&self, seed: u64) -> Result<Trace, WorkloadError> {
        match self {
            Self::Single { size_bytes } => Trace::single_sized(*size_bytes),
            Self::Zipf { alpha, docs } => Trace::zipf(*alpha, *docs),
            Self::WorldCup(params) => Trace::worldcup_like(params, seed),
            Self::Clf { path } => Trace::clf(path),
            Self::Press { trace, scale } => published::build(PublishedTrace::Press(*trace), *scale, seed),
            Self::Coop { trace, scale } => published::build(PublishedTrace::Coop(*trace), *scale, seed),
        }
    }
}

/// Where requests come from.
#[derive(Debug)]
pub(crate) enum Source {
    /// Independent draws; rank `k` is document `k`.
    Popularity(ZipfTable),
    /// A finite list of document indices, replayed cyclically.
    Replay(Vec<u32>),
}

#[derive(Debug)]
struct TraceInner {
    label: String,
    documents: Vec<Document>,
    source: Source,
    clf_stats: Option<ClfStats>,
    published: Option<PublishedProfile>,
}

/// A document set and a source of requests over it. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct Trace {
    inner: Arc<TraceInner>,
}

/// A trace's headline numbers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSummary {
    pub label: String,
    pub documents: usize,
    pub total_document_bytes: u64,
    pub mean_document_bytes: f64,
    /// Expected body bytes per request (popularity-weighted, or the replayed
    /// list's mean).
    pub mean_request_bytes: f64,
    /// Length of the replayed list, if the trace replays one.
    pub replay_requests: Option<usize>,
    pub clf: Option<ClfStats>,
    /// For the seeds' traces (`press:*`, `coop:*`): the seed's numbers and
    /// the scaled targets (files, means, α, per-node cache) to read beside
    /// the synthesized values above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<PublishedProfile>,
}

impl Trace {
    pub(crate) fn from_parts(
        label: String,
        documents: Vec<Document>,
        source: Source,
        clf_stats: Option<ClfStats>,
    ) -> Self {
        Self { inner: Arc::new(TraceInner { label, documents, source, clf_stats, published: None }) }
    }

    /// Attaches the profile of a trace built from a seed's table (only while
    /// the trace is not yet shared).
    pub(crate) fn with_published(mut self, profile: PublishedProfile) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.published = Some(profile);
        }
        self
    }

    /// The paper's Trace 1: one 8 KiB document named `single`.
    pub fn single() -> Self {
        Self::from_parts(
            "single(8192)".to_string(),
            vec![Document { name: "single".to_string(), size_bytes: SINGLE_DOC_BYTES, source_path: None }],
            Source::Replay(vec![0]),
            None,
        )
    }

    /// One document named `single` of `size_bytes`.
    pub fn single_sized(size_bytes: u64) -> Result<Self, WorkloadError> {
        if size_bytes == 0 || size_bytes > DOC_BYTES_MAX {
            return Err(WorkloadError::InvalidDocumentSize { size_bytes });
        }
        Ok(Self::from_parts(
            format!("single({size_bytes})"),
            vec![Document { name: "single".to_string(), size_bytes, source_path: None }],
            Source::Replay(vec![0]),
            None,
        ))
    }

    /// The paper's Trace 2: `docs` documents of 200 B … 1 MiB (geometric
    /// ladder, smallest = most popular), Zipf(`alpha`) popularity.
    pub fn zipf(alpha: f64, docs: usize) -> Result<Self, WorkloadError> {
        let table = ZipfTable::new(docs, alpha)?;
        let documents = (0..docs)
            .map(|k| Document { name: format!("z{k}"), size_bytes: ladder_size(k, docs), source_path: None })
            .collect();
        Ok(Self::from_parts(format!("zipf(alpha={alpha}, docs={docs})"), documents, Source::Popularity(table), None))
    }

    /// The paper's Trace 3, synthesized (see the crate essay and [`worldcup`]).
    pub fn worldcup_like(params: &WorldCupParams, seed: u64) -> Result<Self, WorkloadError> {
        worldcup::build(params, seed)
    }

    /// Replays a Common Log Format file.
    pub fn clf(path: &Path) -> Result<Self, WorkloadError> {
        clf::from_path(path)
    }

    /// Replays Common Log Format text held in memory.
    pub fn clf_from_str(text: &str) -> Result<Self, WorkloadError> {
        clf::from_str(text)
    }

    /// A human-readable description.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The document set; requests are indices into it.
    pub fn documents(&self) -> &[Document] {
        &self.inner.documents
    }

    /// What a CLF replay read, for CLF traces.
    pub fn clf_stats(&self) -> Option<&ClfStats> {
        self.inner.clf_stats.as_ref()
    }

    /// The seed's numbers and the targets, for the seeds' traces.
    pub fn published(&self) -> Option<&PublishedProfile> {
        self.inner.published.as_ref()
    }

    /// The memory cache per node the seed pairs with this trace (scaled with
    /// it), for the seeds' traces.
    pub fn cache_bytes_per_node(&self) -> Option<u64> {
        self.published().map(|p| p.target.cache_bytes_per_node)
    }

    /// The Zipf exponent of the request popularity, for traces that draw
    /// requests from one (0 = uniform).
    pub fn popularity_alpha(&self) -> Option<f64> {
        match &self.inner.source {
            Source::Popularity(table) => Some(table.alpha()),
            Source::Replay(_) => None,
        }
    }

    /// Probability that a request asks for document `index` (over one full
    /// cycle of a replayed list).
    pub fn probability(&self, index: usize) -> f64 {
        match &self.inner.source {
            Source::Popularity(table) => table.probability(index),
            Source::Replay(list) => {
                list.iter().filter(|&&i| i as usize == index).count() as f64 / list.len().max(1) as f64
            }
        }
    }

    /// Headline numbers.
    pub fn summary(&self) -> TraceSummary {
        let docs = self.documents();
        let total: u64 = docs.iter().map(|d| d.size_bytes).sum();
        let (mean_request_bytes, replay_requests) = match &self.inner.source {
            Source::Popularity(table) => {
                (docs.iter().enumerate().map(|(k, d)| table.probability(k) * d.size_bytes as f64).sum(), None)
            }
            Source::Replay(list) => {
                let bytes: u64 = list.iter().map(|&i| docs.get(i as usize).map_or(0, |d| d.size_bytes)).sum();
                (bytes as f64 / list.len().max(1) as f64, Some(list.len()))
            }
        };
        TraceSummary {
            label: self.label().to_string(),
            documents: docs.len(),
            total_document_bytes: total,
            mean_document_bytes: total as f64 / docs.len().max(1) as f64,
            mean_request_bytes,
            replay_requests,
            clf: self.inner.clf_stats.clone(),
            published: self.inner.published.clone(),
        }
    }

    /// The endless request stream of worker `worker` of `workers`.
    pub fn stream(&self, seed: u64, worker: usize, workers: usize) -> RequestStream {
        let workers = workers.max(1);
        let position = match &self.inner.source {
            Source::Replay(list) => ((worker % workers) as u128 * list.len() as u128 / workers as u128) as usize,
            Source::Popularity(_) => 0,
        };
        RequestStream { trace: self.clone(), rng: seeded_rng(stream_seed(seed, worker)), position }
    }

    /// The first `n` requests of worker 0 of 1 (convenience for tests and tools).
    pub fn sample(&self, n: usize, seed: u64) -> Vec<usize> {
        self.stream(seed, 0, 1).take(n).collect()
    }
}

/// Size of rank `k` of `n` on the geometric 200 B … 1 MiB ladder.
fn ladder_size(k: usize, n: usize) -> u64 {
    if n <= 1 {
        return ZIPF_MIN_BYTES;
    }
    let ratio = ZIPF_MAX_BYTES as f64 / ZIPF_MIN_BYTES as f64;
    let size = ZIPF_MIN_BYTES as f64 * ratio.powf(k as f64 / (n - 1) as f64);
    (size.round() as u64).clamp(ZIPF_MIN_BYTES, ZIPF_MAX_BYTES)
}

/// Per-worker seeds that differ in many bits (splitmix64 finalizer).
fn stream_seed(seed: u64, worker: usize) -> u64 {
    let mut z = seed ^ (worker as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An endless iterator of document indices (see [`Trace::stream`]).
#[derive(Debug)]
pub struct RequestStream {
    trace: Trace,
    rng: SeededRng,
    position: usize,
}

impl Iterator for RequestStream {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match &self.trace.inner.source {
            Source::Popularity(table) => Some(table.sample(&mut self.rng)),
            Source::Replay(list) => {
                let len = list.len();
                if len == 0 {
                    return None;
                }
                let index = list[self.position % len] as usize;
                self.position = (self.position + 1) % len;
                Some(index)
            }
        }
    }
}

impl RequestStream {
    /// A uniformly random document index (the updater's choice), from this
    /// stream's RNG.
    pub fn uniform_document(&mut self) -> usize {
        let n = self.trace.documents().len().max(1);
        self.rng.gen_range(0..n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_has_exact_endpoints_and_is_log_uniform() {
        assert_eq!(ladder_size(0, 20), 200);
        assert_eq!(ladder_size(19, 20), 1 << 20);
        // Constant ratio between neighbours (up to rounding).
        let r = (ladder_size(10, 20) as f64) / (ladder_size(9, 20) as f64);
        let expected = (((1u64 << 20) as f64) / 200.0).powf(1.0 / 19.0);
        assert!((r - expected).abs() < 0.01, "{r} vs {expected}");
        assert_eq!(ladder_size(0, 1), 200);
    }

    #[test]
    fn stream_seeds_differ_per_worker() {
        assert_ne!(stream_seed(1, 0), stream_seed(1, 1));
        assert_ne!(stream_seed(1, 0), stream_seed(2, 0));
    }
}
