//! Order statistics and the least-squares line used by the burst report.
//!
//! Percentiles are nearest-rank (no interpolation), so every reported value is
//! a latency some worker actually saw.

/// How the report defines its percentiles (printed beside them).
pub const PERCENTILE_DEFINITION: &str =
    "nearest-rank: pP = the ceil(P/100 * n)-th smallest of the n successful workers' latencies (p100 = max)";

/// Nearest-rank percentile `p` (0 < p <= 100) of an ascending-sorted sample.
/// `None` for an empty sample. `p <= 0` gives the minimum.
pub fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Index (into the sorted sample) of the nearest-rank percentile `p`.
pub fn nearest_rank_index(n: usize, p: f64) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    Some(rank.clamp(1, n) - 1)
}

/// Arithmetic mean; `None` when empty.
pub fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        None
    } else {
        Some(xs.iter().sum::<f64>() / xs.len() as f64)
    }
}

/// Summary of one latency sample (milliseconds).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    pub n: usize,
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

impl Summary {
    pub fn of(sample: &[f64]) -> Summary {
        let mut s: Vec<f64> = sample.to_vec();
        s.sort_by(f64::total_cmp);
        Summary {
            n: s.len(),
            min_ms: s.first().copied(),
            p50_ms: nearest_rank(&s, 50.0),
            p95_ms: nearest_rank(&s, 95.0),
            p99_ms: nearest_rank(&s, 99.0),
            max_ms: s.last().copied(),
            mean_ms: mean(&s),
        }
    }
}

/// Ordinary least-squares line y = intercept + slope * x.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Fit {
    pub intercept: f64,
    pub slope: f64,
    /// Coefficient of determination; 1.0 when y has no variance and the line
    /// passes through every point.
    pub r2: f64,
    pub points: usize,
}

/// Least-squares fit; `None` with fewer than two distinct x values.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - (intercept + slope * p.0)).powi(2))
        .sum();
    let r2 = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    Some(Fit {
        intercept,
        slope,
        r2,
        points: points.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_matches_hand_computed() {
        // Sample of 10: ranks are ceil(p/100*10).
        let s: Vec<f64> = (1..=10).map(|i| i as f64 * 10.0).collect();
        assert_eq!(nearest_rank(&s, 50.0), Some(50.0)); // rank 5
        assert_eq!(nearest_rank(&s, 95.0), Some(100.0)); // rank ceil(9.5)=10
        assert_eq!(nearest_rank(&s, 90.0), Some(90.0)); // rank 9
        assert_eq!(nearest_rank(&s, 91.0), Some(100.0)); // rank ceil(9.1)=10
        assert_eq!(nearest_rank(&s, 10.0), Some(10.0));
        assert_eq!(nearest_rank(&s, 0.0), Some(10.0));
        assert_eq!(nearest_rank(&[], 50.0), None);
        // 200 values 1..=200: p99 = rank 198, p95 = rank 190, p50 = rank 100.
        let s: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(nearest_rank(&s, 99.0), Some(198.0));
        assert_eq!(nearest_rank(&s, 95.0), Some(190.0));
        assert_eq!(nearest_rank(&s, 50.0), Some(100.0));
        assert_eq!(nearest_rank_index(200, 99.0), Some(197));
    }

    #[test]
    fn summary_sorts_its_input() {
        let s = Summary::of(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!(s.n, 5);
        assert_eq!(s.min_ms, Some(1.0));
        assert_eq!(s.p50_ms, Some(3.0));
        assert_eq!(s.p99_ms, Some(5.0));
        assert_eq!(s.mean_ms, Some(3.0));
        assert_eq!(Summary::of(&[]).p50_ms, None);
    }

    #[test]
    fn least_squares_recovers_a_line() {
        let pts: Vec<(f64, f64)> = [1.0, 2.0, 8.0, 32.0]
            .iter()
            .map(|&x| (x, 3.0 + 0.5 * x))
            .collect();
        let f = least_squares(&pts).unwrap();
        assert!((f.slope - 0.5).abs() < 1e-9);
        assert!((f.intercept - 3.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-9);
        // Noisy: R² strictly below 1.
        let f = least_squares(&[(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)]).unwrap();
        assert!((f.slope - 0.5).abs() < 1e-9);
        assert!(f.r2 < 1.0 && f.r2 > 0.0);
        assert_eq!(least_squares(&[(1.0, 1.0)]), None);
        assert_eq!(least_squares(&[(2.0, 1.0), (2.0, 5.0)]), None);
    }
}
