//! A WorldCup-like trace synthesized from published statistics.
//!
//! The numbers come from the PRESS paper's Table 1, row WC98 (the 1998
//! Soccer World Cup server, three days): 24 328 files, average file size
//! 9.1 KB, average request size 4.2 KB, Zipf-like popularity with
//! α = 0.77; and from the coherency paper's §5.2: its third trace is a
//! 20 000-request subset of the WorldCup trace. See the crate essay for
//! what is assumed beyond them.

use crate::{Document, Source, Trace, WorkloadError, ZipfTable};
use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};
use tierstack_base::seeded_rng;

/// PRESS Table 1, WC98: number of files.
pub const WC98_FILES: usize = 24_328;
/// PRESS Table 1, WC98: average file size (KB taken as 1024 bytes).
pub const WC98_MEAN_FILE_BYTES: f64 = 9.1 * 1024.0;
/// PRESS Table 1, WC98: average request size.
pub const WC98_MEAN_REQUEST_BYTES: f64 = 4.2 * 1024.0;
/// PRESS Table 1, WC98: the Zipf-like coefficient.
pub const WC98_ALPHA: f64 = 0.77;
/// Coherency paper §5.2: "a 20000 request subset of the WorldCup trace".
pub const WC98_SUBSET_REQUESTS: usize = 20_000;
/// Spread of log file sizes. **Not published**: an assumption (see the crate essay).
pub const WC98_SIZE_SIGMA_ASSUMED: f64 = 1.0;

/// Bisection steps when calibrating the size–popularity correlation.
const CALIBRATION_STEPS: usize = 40;

/// Parameters of the synthesis. [`Default`] is the published WC98 row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorldCupParams {
    /// Files in the whole site (the population popularity ranks).
    pub files: usize,
    /// Mean size over files.
    pub mean_file_bytes: f64,
    /// Mean size over requests (popularity-weighted); calibrates how strongly
    /// popular files are small.
    pub mean_request_bytes: f64,
    /// Zipf-like popularity exponent.
    pub alpha: f64,
    /// Requests in the synthesized subset.
    pub requests: usize,
    /// Standard deviation of ln(size).
    pub size_sigma: f64,
    /// Smallest and largest document, after scaling.
    pub min_bytes: u64,
    pub max_bytes: u64,
}

impl Default for WorldCupParams {
    fn default() -> Self {
        Self {
            files: WC98_FILES,
            mean_file_bytes: WC98_MEAN_FILE_BYTES,
            mean_request_bytes: WC98_MEAN_REQUEST_BYTES,
            alpha: WC98_ALPHA,
            requests: WC98_SUBSET_REQUESTS,
            size_sigma: WC98_SIZE_SIGMA_ASSUMED,
            min_bytes: 64,
            max_bytes: 4 << 20,
        }
    }
}

/// The synthesized site before the request subset is drawn: a size for each
/// popularity rank.
#[derive(Clone, Debug)]
pub struct WorldCupModel {
    /// `sizes_by_rank[k]` = size of the k-th most popular file.
    pub sizes_by_rank: Vec<u64>,
    /// Popularity over ranks.
    pub popularity: ZipfTable,
    /// Calibrated correlation (Gaussian copula) between small size and high
    /// popularity: 1 = the smallest file is the most popular, 0 = independent.
    pub size_popularity_correlation: f64,
    /// Achieved means (compare with the parameters).
    pub mean_file_bytes: f64,
    pub mean_request_bytes: f64,
}

/// Builds the site model for `params`, deterministically from `seed`.
pub fn model(params: &WorldCupParams, seed: u64) -> Result<WorldCupModel, WorkloadError> {
    validate(params)?;
    let popularity = ZipfTable::new(params.files, params.alpha)?;
    let mut rng = seeded_rng(seed);
    let n = params.files;
    // Log-normal sizes: z_i drives the size, e_i is independent noise used
    // to mix size order and popularity order.
    let z: Vec<f64> = (0..n).map(|_| rng.sample::<f64, _>(StandardNormal)).collect();
    let e: Vec<f64> = (0..n).map(|_| rng.sample::<f64, _>(StandardNormal)).collect();
    let raw: Vec<f64> = z.iter().map(|zi| (params.size_sigma * zi).exp()).collect();
    let raw_mean = raw.iter().sum::<f64>() / n as f64;
    let scale = params.mean_file_bytes / raw_mean;
    let sizes: Vec<u64> =
        raw.iter().map(|r| ((r * scale).round() as u64).clamp(params.min_bytes, params.max_bytes)).collect();
    let mean_file_bytes = sizes.iter().sum::<u64>() as f64 / n as f64;

    // Assign sizes to ranks by sorting on rho*z + sqrt(1-rho^2)*e (ascending:
    // rank 0 gets the smallest key). The popularity-weighted mean decreases
    // as rho grows; bisect rho in [-1, 1] to meet mean_request_bytes.
    let assign = |rho: f64| -> (Vec<u64>, f64) {
        let mix = (1.0 - rho * rho).max(0.0).sqrt();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| (rho * z[a] + mix * e[a]).total_cmp(&(rho * z[b] + mix * e[b])));
        let by_rank: Vec<u64> = order.iter().map(|&i| sizes[i]).collect();
        let weighted = by_rank.iter().enumerate().map(|(k, &s)| popularity.probability(k) * s as f64).sum::<f64>();
        (by_rank, weighted)
    };
    let (mut lo, mut hi) = (-1.0f64, 1.0f64);
    let target = params.mean_request_bytes;
    let (_, at_hi) = assign(hi);
    let (_, at_lo) = assign(lo);
    let rho = if target <= at_hi {
        hi
    } else if target >= at_lo {
        lo
    } else {
        for _ in 0..CALIBRATION_STEPS {
            let mid = 0.5 * (lo + hi);
            if assign(mid).1 > target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    };
    let (sizes_by_rank, mean_request_bytes) = assign(rho);
    Ok(WorldCupModel {
        sizes_by_rank,
        popularity,
        size_popularity_correlation: rho,
        mean_file_bytes,
        mean_request_bytes,
    })
}

/// Synthesizes the request subset: `params.requests` draws from the model's
/// popularity; the documents are the distinct files drawn, named `wc<rank>`.
pub(crate) fn build(params: &WorldCupParams, seed: u64) -> Result<Trace, WorkloadError> {
    let model = model(params, seed)?;
    let mut rng = seeded_rng(seed ^ 0x5743_3938_7375_6273); // "WC98subs": a separate stream
    let ranks: Vec<usize> = (0..params.requests).map(|_| model.popularity.sample(&mut rng)).collect();
    let mut distinct = ranks.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let mut index_of_rank = vec![u32::MAX; params.files];
    let mut documents = Vec::with_capacity(distinct.len());
    for (i, &rank) in distinct.iter().enumerate() {
        index_of_rank[rank] = i as u32;
        documents.push(Document {
            name: format!("wc{rank}"),
            size_bytes: model.sizes_by_rank[rank],
            source_path: None,
        });
    }
    let replay = ranks.iter().map(|&r| index_of_rank[r]).collect();
    Ok(Trace::from_parts(
        format!("worldcup(files={}, alpha={}, requests={})", params.files, params.alpha, params.requests),
        documents,
        Source::Replay(replay),
        None,
    ))
}

fn validate(params: &WorldCupParams) -> Result<(), WorkloadError> {
    let bad = |what: &'static str| Err(WorkloadError::InvalidParameter { what });
    if params.requests == 0 || params.requests > crate::REPLAY_REQUESTS_MAX {
        return bad("requests must be in 1..=REPLAY_REQUESTS_MAX");
    }
    if !(params.mean_file_bytes.is_finite() && params.mean_file_bytes >= 1.0) {
        return bad("mean_file_bytes must be >= 1");
    }
    if !(params.mean_request_bytes.is_finite() && params.mean_request_bytes >= 1.0) {
        return bad("mean_request_bytes must be >= 1");
    }
    if !(params.size_sigma.is_finite() && (0.0..=8.0).contains(&params.size_sigma)) {
        return bad("size_sigma must be in 0..=8");
    }
    if params.min_bytes == 0 || params.min_bytes > params.max_bytes || params.max_bytes > crate::DOC_BYTES_MAX {
        return bad("need 0 < min_bytes <= max_bytes <= DOC_BYTES_MAX");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_reproduces_the_published_means() {
        let m = model(&WorldCupParams::default(), 1).unwrap();
        assert_eq!(m.sizes_by_rank.len(), WC98_FILES);
        let rel = |a: f64, b: f64| (a / b - 1.0).abs();
        assert!(rel(m.mean_file_bytes, WC98_MEAN_FILE_BYTES) < 0.03, "file mean {}", m.mean_file_bytes);
        assert!(rel(m.mean_request_bytes, WC98_MEAN_REQUEST_BYTES) < 0.03, "request mean {}", m.mean_request_bytes);
        // Popular files are smaller than average, as the published means say.
        assert!(m.size_popularity_correlation > 0.0);
        assert!((m.popularity.alpha() - WC98_ALPHA).abs() < 1e-12);
    }

    #[test]
    fn an_unreachable_request_mean_saturates_the_correlation() {
        let params = WorldCupParams { mean_request_bytes: 1.0, files: 1000, ..WorldCupParams::default() };
        let m = model(&params, 3).unwrap();
        assert_eq!(m.size_popularity_correlation, 1.0);
        // Fully correlated: sizes ascend with rank.
        assert!(m.sizes_by_rank.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn bad_parameters_are_errors() {
        for params in [
            WorldCupParams { requests: 0, ..WorldCupParams::default() },
            WorldCupParams { files: 0, ..WorldCupParams::default() },
            WorldCupParams { alpha: -1.0, ..WorldCupParams::default() },
            WorldCupParams { min_bytes: 10, max_bytes: 5, ..WorldCupParams::default() },
            WorldCupParams { size_sigma: f64::INFINITY, ..WorldCupParams::default() },
        ] {
            assert!(model(&params, 1).is_err(), "{params:?}");
        }
    }
}
