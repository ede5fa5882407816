//! The seeds' traces, synthesized from what the seeds publish.
//!
//! - **PRESS** (Carrera and Bianchini, TPDS'05, §4.1 and Table 1): five Web
//!   server logs, `press:clarknet`, `press:nasa`, `press:rutgers`,
//!   `press:usask`, `press:wc98`. Each row gives the number of files, the
//!   mean file size, the number of requests, the mean request size and the
//!   Zipf-like α; the text gives the per-node memory cache of each (192, 96,
//!   352, 48 and 64 MB), "picked to produce miss rates in the 1-4 percent
//!   range when a traditional (locality-oblivious) server is run on eight
//!   nodes". We synthesize: file sizes from a heavy-tailed shape, assigned to
//!   popularity ranks so that both means match ([`crate::sizes`]), and
//!   requests as independent Zipf(α) draws over the ranks (a popularity
//!   source, as for [`Trace::zipf`]; document `k` is rank `k`, named
//!   `<trace>f<k>`, e.g. `nasaf0`). The logs' request counts (2.4 M to 51 M)
//!   are kept as *nominal* numbers only: a run chooses how many requests it
//!   issues. Timing and temporal locality of the real logs are not modelled.
//! - **Cooperative caching** (Narravula et al., CCGrid'06, §4 and Table 1):
//!   `coop:8k`, `coop:16k`, `coop:32k`, `coop:64k`, each 10 000 files of
//!   exactly 8, 16, 32 or 64 KiB (named `coop8kf<k>` …), requested uniformly
//!   ("a trace comprising of just the working set is seemingly random"), with
//!   the seed's 64 MB per node.
//!
//! **Units.** KB = 1024 bytes and MB = 1024 KB throughout, as in
//! [`crate::worldcup`]. The coop seed's Table 1 writes the 8k-trace's working
//! set as "80M" (10 000 × 8 K = 80 000 K), the same unit as its "64 M" per
//! node; we keep the files at 8 KiB and the cache at 64 MiB, so our working
//! set : cache ratios are 0.977 × the table's (78.1 MiB against 64 MiB for the
//! 8k-trace on one node). Every "holds / does not hold" of that table stays
//! on its side, and the 64k-trace on 10 nodes (the table's "640M/640M")
//! holds with 2.4 % to spare instead of exactly.
//!
//! **Scaling** (seed-notes §0.4 (iii)): a scale factor `f` in (0, 1] keeps
//! the file sizes (both means, or the coop size), α and the popularity shape,
//! and multiplies the number of files and the per-node cache by `f` (files
//! rounded, at least 1; cache rounded to bytes). The working set : cache
//! ratio, and with it where each configuration first holds the working set,
//! stays where the seed puts it. What does not scale exactly: for α < 1 the
//! request share of the most popular fraction `x` of files tends to
//! `x^(1−α)` only as the file count grows, so hit rates at a fixed cache
//! fraction drift slightly at small scales.

use crate::sizes::{ranked_sizes, SizeShape, WEB_FILE_SHAPE};
use crate::{Document, Source, Trace, WorkloadError, ZipfTable};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A kilobyte, as the seeds' tables use it.
pub const KB: f64 = 1024.0;
/// A megabyte of cache.
pub const MB: u64 = 1 << 20;

/// One row of PRESS Table 1, with the cache size §4.1 gives for the trace.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PressRow {
    /// Short name, as in `press:<name>`.
    pub name: &'static str,
    /// Where the log came from (§4.1).
    pub source: &'static str,
    pub files: usize,
    pub mean_file_kb: f64,
    /// Requests in the log (nominal: runs choose their own count).
    pub requests: u64,
    pub mean_request_kb: f64,
    pub alpha: f64,
    /// Memory cache per node, MB.
    pub cache_mb_per_node: u64,
}

/// PRESS seed, Table 1 ("Main Characteristics of the WWW Server Traces") and
/// the cache sizes of §4.1.
pub const PRESS_TABLE_1: [PressRow; 5] = [
    PressRow {
        name: "clarknet",
        source: "Clarknet, a commercial Internet provider",
        files: 34_126,
        mean_file_kb: 12.0,
        requests: 3_327_950,
        mean_request_kb: 9.3,
        alpha: 0.79,
        cache_mb_per_node: 192,
    },
    PressRow {
        name: "nasa",
        source: "NASA Kennedy Space Center",
        files: 9_129,
        mean_file_kb: 28.1,
        requests: 3_461_567,
        mean_request_kb: 22.1,
        alpha: 0.94,
        cache_mb_per_node: 96,
    },
    PressRow {
        name: "rutgers",
        source: "Rutgers CS department server, first four months of 2002",
        files: 70_256,
        mean_file_kb: 23.0,
        requests: 4_765_224,
        mean_request_kb: 19.4,
        alpha: 0.89,
        cache_mb_per_node: 352,
    },
    PressRow {
        name: "usask",
        source: "University of Saskatchewan, seven months",
        files: 13_760,
        mean_file_kb: 14.4,
        requests: 2_408_174,
        mean_request_kb: 6.2,
        alpha: 0.61,
        cache_mb_per_node: 48,
    },
    PressRow {
        name: "wc98",
        source: "1998 Soccer World Cup, three days",
        files: 24_328,
        mean_file_kb: 9.1,
        requests: 51_117_263,
        mean_request_kb: 4.2,
        alpha: 0.77,
        cache_mb_per_node: 64,
    },
];

/// Cooperative-caching seed: files per trace (Table 1: 80M / 8K).
pub const COOP_FILES: usize = 10_000;
/// Cooperative-caching seed §4: "Each node was allowed to cache 64 MBytes".
pub const COOP_CACHE_BYTES_PER_NODE: u64 = 64 * MB;

/// A PRESS trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PressTrace {
    Clarknet,
    Nasa,
    Rutgers,
    Usask,
    Wc98,
}

impl PressTrace {
    /// All five, in Table 1's order.
    pub const ALL: [PressTrace; 5] = [Self::Clarknet, Self::Nasa, Self::Rutgers, Self::Usask, Self::Wc98];

    /// Its row of Table 1.
    pub fn row(self) -> &'static PressRow {
        &PRESS_TABLE_1[self as usize]
    }

    /// The name after `press:`.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// A cooperative-caching trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoopTrace {
    #[serde(rename = "8k")]
    K8,
    #[serde(rename = "16k")]
    K16,
    #[serde(rename = "32k")]
    K32,
    #[serde(rename = "64k")]
    K64,
}

impl CoopTrace {
    /// All four, smallest files first.
    pub const ALL: [CoopTrace; 4] = [Self::K8, Self::K16, Self::K32, Self::K64];

    /// The size of every file of the trace.
    pub fn file_bytes(self) -> u64 {
        match self {
            Self::K8 => 8 << 10,
            Self::K16 => 16 << 10,
            Self::K32 => 32 << 10,
            Self::K64 => 64 << 10,
        }
    }

    /// The name after `coop:`.
    pub fn name(self) -> &'static str {
        match self {
            Self::K8 => "8k",
            Self::K16 => "16k",
            Self::K32 => "32k",
            Self::K64 => "64k",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Which of the seeds' traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishedTrace {
    Press(PressTrace),
    Coop(CoopTrace),
}

impl PublishedTrace {
    /// Parses `press:<name>` or `coop:<name>` (no scale suffix); `None` if
    /// the text names neither family, an error if it names an unknown member.
    pub(crate) fn parse(text: &str) -> Option<Result<Self, WorkloadError>> {
        let unknown = || WorkloadError::UnknownTrace(text.to_string());
        if let Some(name) = text.strip_prefix("press:") {
            return Some(PressTrace::from_name(name).map(Self::Press).ok_or_else(unknown));
        }
        if let Some(name) = text.strip_prefix("coop:") {
            return Some(CoopTrace::from_name(name).map(Self::Coop).ok_or_else(unknown));
        }
        None
    }

    /// The seed's values at scale 1.
    pub fn seed_targets(self) -> Targets {
        match self {
            Self::Press(t) => {
                let row = t.row();
                Targets {
                    files: row.files,
                    mean_file_bytes: row.mean_file_kb * KB,
                    mean_request_bytes: row.mean_request_kb * KB,
                    alpha: row.alpha,
                    nominal_requests: Some(row.requests),
                    cache_bytes_per_node: row.cache_mb_per_node * MB,
                }
            }
            Self::Coop(t) => Targets {
                files: COOP_FILES,
                mean_file_bytes: t.file_bytes() as f64,
                mean_request_bytes: t.file_bytes() as f64,
                alpha: 0.0,
                nominal_requests: None,
                cache_bytes_per_node: COOP_CACHE_BYTES_PER_NODE,
            },
        }
    }

    /// Where the numbers come from.
    pub fn source(self) -> String {
        match self {
            Self::Press(t) => format!("PRESS seed Table 1 and §4.1: {}", t.row().source),
            Self::Coop(t) => {
                format!("cooperative-caching seed §4 and Table 1: {}-trace, 10,000 files, uniform requests", t.name())
            }
        }
    }
}

impl fmt::Display for PublishedTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Press(t) => write!(f, "press:{}", t.name()),
            Self::Coop(t) => write!(f, "coop:{}", t.name()),
        }
    }
}

/// The numbers a synthesis aims for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Targets {
    pub files: usize,
    pub mean_file_bytes: f64,
    /// Request-weighted mean size.
    pub mean_request_bytes: f64,
    /// Zipf exponent of the request popularity (0 = uniform).
    pub alpha: f64,
    /// Requests in the original log, where the seed gives it.
    pub nominal_requests: Option<u64>,
    pub cache_bytes_per_node: u64,
}

impl Targets {
    /// Files × mean file size.
    pub fn working_set_bytes(&self) -> f64 {
        self.files as f64 * self.mean_file_bytes
    }

    /// These targets scaled by `scale` (see the module essay).
    pub fn scaled(&self, scale: f64) -> Self {
        Self {
            files: scaled_files(self.files, scale),
            cache_bytes_per_node: ((self.cache_bytes_per_node as f64 * scale).round() as u64).max(1),
            ..self.clone()
        }
    }
}

/// What a trace built from a seed's table reports beside its synthesized
/// numbers ([`crate::TraceSummary::published`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PublishedProfile {
    /// `press:nasa`, `coop:8k`, …
    pub trace: String,
    pub source: String,
    pub scale: f64,
    /// The seed's values (scale 1).
    pub seed: Targets,
    /// What this trace aims for: the seed's values scaled.
    pub target: Targets,
    /// How sizes were synthesized (PRESS traces).
    pub size_model: Option<SizeModelReport>,
}

/// How a PRESS trace's sizes were synthesized ([`crate::sizes`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SizeModelReport {
    /// The assumed shape; `tail_index` is the one used (lowered for a flat
    /// popularity, see [`crate::sizes`]).
    pub shape: SizeShape,
    /// The copula's ρ: 1 = the most popular files are the smallest.
    pub size_rank_correlation: f64,
    /// Head–tail swaps the polish made.
    pub polish_swaps: usize,
}

/// The number of files at `scale`: rounded, at least one.
fn scaled_files(files: usize, scale: f64) -> usize {
    ((files as f64 * scale).round() as usize).max(1)
}

/// Checks a scale factor: finite, in (0, 1].
pub fn check_scale(scale: f64) -> Result<f64, WorkloadError> {
    if scale.is_finite() && scale > 0.0 && scale <= 1.0 {
        Ok(scale)
    } else {
        Err(WorkloadError::InvalidScale(scale.to_string()))
    }
}

/// Builds one of the seeds' traces at `scale`; `seed` drives the PRESS size
/// synthesis (coop document sets do not depend on it).
pub(crate) fn build(trace: PublishedTrace, scale: f64, seed: u64) -> Result<Trace, WorkloadError> {
    let scale = check_scale(scale)?;
    let seed_targets = trace.seed_targets();
    let target = seed_targets.scaled(scale);
    let popularity = ZipfTable::new(target.files, target.alpha)?;
    let (documents, size_model) = match trace {
        PublishedTrace::Press(press) => {
            let probabilities: Vec<f64> = (0..target.files).map(|k| popularity.probability(k)).collect();
            // A different size stream per trace for the same run seed.
            let size_seed = seed ^ name_hash(press.name());
            let ranked = ranked_sizes(
                &WEB_FILE_SHAPE,
                &probabilities,
                target.mean_file_bytes,
                target.mean_request_bytes,
                size_seed,
            )?;
            let documents = ranked
                .sizes_by_rank
                .iter()
                .enumerate()
                .map(|(k, &size_bytes)| Document {
                    name: format!("{}f{k}", press.name()),
                    size_bytes,
                    source_path: None,
                })
                .collect();
            let report = SizeModelReport {
                shape: SizeShape { tail_index: ranked.tail_index, ..WEB_FILE_SHAPE },
                size_rank_correlation: ranked.size_rank_correlation,
                polish_swaps: ranked.polish_swaps,
            };
            (documents, Some(report))
        }
        PublishedTrace::Coop(coop) => {
            let documents = (0..target.files)
                .map(|k| Document {
                    name: format!("coop{}f{k}", coop.name()),
                    size_bytes: coop.file_bytes(),
                    source_path: None,
                })
                .collect();
            (documents, None)
        }
    };
    let profile = PublishedProfile {
        trace: trace.to_string(),
        source: trace.source(),
        scale,
        seed: seed_targets,
        target: target.clone(),
        size_model,
    };
    let label = if scale == 1.0 { trace.to_string() } else { format!("{trace}@{scale}") };
    Ok(Trace::from_parts(label, documents, Source::Popularity(popularity), None).with_published(profile))
}

/// FNV-1a of a name: a fixed per-trace seed offset.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_indexed_by_the_enum() {
        for t in PressTrace::ALL {
            assert_eq!(PressTrace::from_name(t.name()), Some(t));
        }
        assert_eq!(PressTrace::Usask.row().cache_mb_per_node, 48);
        assert_eq!(PressTrace::Wc98.row().requests, 51_117_263);
    }

    #[test]
    fn scaling_rounds_files_and_cache() {
        let t = PublishedTrace::Press(PressTrace::Nasa).seed_targets().scaled(0.1);
        assert_eq!(t.files, 913);
        assert_eq!(t.cache_bytes_per_node, (96.0 * MB as f64 * 0.1).round() as u64);
        assert_eq!(scaled_files(10, 0.01), 1);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(check_scale(bad), Err(WorkloadError::InvalidScale(_))), "{bad}");
        }
    }
}
