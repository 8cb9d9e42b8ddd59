//! From per-second shares to the report's figures: achieved share, mean
//! absolute error, settling time, the two-tenant ratio, and whether a row
//! met the targets. Pure functions.

/// The band a share must stay in, points.
pub const BAND_POINTS: f64 = 5.0;
/// Settling allowed, seconds (after the start or a live change).
pub const SETTLE_S: f64 = 1.0;
/// Allowed error of a two-tenant ratio, relative.
pub const RATIO_TOLERANCE: f64 = 0.10;

/// What the error figures mean (written into the JSON).
pub const MAE_DEFINITION: &str = "mean |share - target| over the whole seconds of the run, \
     skipping the first second and the second in which a live change lands (the settling \
     allowance); settled_s: start of the first second from which every second is within \
     5 points of its target";

/// One tenant's figures.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Figures {
    /// Mean share over the counted seconds, percent.
    pub achieved: f64,
    /// Mean absolute error against the per-second target (limited only).
    pub mae_points: Option<f64>,
    /// Worst error of a counted second.
    pub worst_points: Option<f64>,
    /// When it settled (seconds from the start; `None`: never).
    pub settled_s: Option<f64>,
}

/// Seconds counted for errors: all but the first and the one a change
/// lands in (`change_s`: the second index of a live change).
fn counted(n: usize, change_s: Option<usize>) -> impl Iterator<Item = usize> {
    (1..n).filter(move |i| Some(*i) != change_s)
}

/// Figures of `shares` (percent per second) against `targets` (percent
/// per second; `None` for an unlimited second).
pub fn figures(shares: &[f64], targets: &[Option<f64>], change_s: Option<usize>) -> Figures {
    let n = shares.len().min(targets.len());
    let idx: Vec<usize> = counted(n, change_s).collect();
    let achieved = if idx.is_empty() {
        shares.iter().sum::<f64>() / shares.len().max(1) as f64
    } else {
        idx.iter().map(|i| shares[*i]).sum::<f64>() / idx.len() as f64
    };
    let errs: Vec<f64> = idx
        .iter()
        .filter_map(|i| targets[*i].map(|t| (shares[*i] - t).abs()))
        .collect();
    let limited = targets.iter().any(Option::is_some);
    let (mae, worst) = if limited && !errs.is_empty() {
        (
            Some(errs.iter().sum::<f64>() / errs.len() as f64),
            Some(errs.iter().cloned().fold(0.0, f64::max)),
        )
    } else {
        (None, None)
    };
    let mut settled = None;
    if limited {
        for i in (0..n).rev() {
            let ok = targets[i].is_none_or(|t| (shares[i] - t).abs() <= BAND_POINTS);
            if ok {
                settled = Some(i as f64);
            } else {
                break;
            }
        }
    }
    Figures {
        achieved,
        mae_points: mae,
        worst_points: worst,
        settled_s: settled,
    }
}

/// Figures of the seconds after a live change at second `c` (that second
/// is the new target's settling allowance; settling counted from it).
pub fn after_change(shares: &[f64], targets: &[Option<f64>], c: usize) -> Figures {
    let n = shares.len().min(targets.len());
    let (s, t) = (&shares[c.min(n)..n], &targets[c.min(n)..n]);
    let mut f = figures(s, t, None);
    f.settled_s = f.settled_s.map(|x| x + c as f64);
    f
}

/// The two-tenant ratio check.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Ratio {
    /// Asked (a ÷ b).
    pub asked: f64,
    /// Achieved.
    pub achieved: f64,
    /// Relative error, percent.
    pub error_pct: f64,
    /// Within the 10 % target.
    pub within_target: bool,
}

/// Ratio of two tenants' achieved shares against their targets.
pub fn ratio(a_target: f64, a: f64, b_target: f64, b: f64) -> Ratio {
    let asked = a_target / b_target;
    let achieved = if b > 0.0 { a / b } else { f64::INFINITY };
    let err = (achieved / asked - 1.0).abs();
    Ratio {
        asked,
        achieved,
        error_pct: err * 100.0,
        within_target: err <= RATIO_TOLERANCE,
    }
}

/// Does a limited tenant's figure meet the targets (MAE ≤ 5, settled
/// within 1 s of the start, or of the live change)?
pub fn met(f: &Figures, change_s: Option<usize>) -> bool {
    let settle_by = change_s.map_or(SETTLE_S, |c| c as f64 + SETTLE_S);
    f.mae_points.is_some_and(|m| m <= BAND_POINTS) && f.settled_s.is_some_and(|s| s <= settle_by)
}

/// Per-second busy shares (percent) of each pid in `pids`, from device
/// intervals `(pid, start, end)` (ns), seconds from `t0`.
pub fn per_second(
    intervals: &[(u32, u64, u64)],
    pids: &[u32],
    t0: u64,
    seconds: usize,
) -> Vec<Vec<f64>> {
    let mut out = vec![vec![0.0; seconds]; pids.len()];
    for &(pid, s, e) in intervals {
        let Some(k) = pids.iter().position(|p| *p == pid) else {
            continue;
        };
        for (i, cell) in out[k].iter_mut().enumerate() {
            let (a, b) = (
                t0 + i as u64 * 1_000_000_000,
                t0 + (i as u64 + 1) * 1_000_000_000,
            );
            let busy = e.min(b).saturating_sub(s.max(a));
            *cell += busy as f64 / 1e7;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_skip_the_settling_second_and_find_the_settling_time() {
        let t = vec![Some(30.0); 5];
        let f = figures(&[99.0, 31.0, 29.0, 30.0, 32.0], &t, None);
        assert_eq!(f.settled_s, Some(1.0));
        assert!((f.mae_points.unwrap() - 1.0).abs() < 1e-9);
        assert!((f.achieved - 30.5).abs() < 1e-9);
        assert!(met(&f, None));
        // Unpaced truth: never settles, error reported as is.
        let f = figures(&[99.0, 99.5, 99.8, 99.9, 99.9], &t, None);
        assert_eq!(f.settled_s, None);
        assert!(f.mae_points.unwrap() > 69.0);
        assert!(!met(&f, None));
        // A live change at second 2: that second is not counted.
        let t2 = vec![Some(30.0), Some(30.0), Some(70.0), Some(70.0), Some(70.0)];
        let f = figures(&[40.0, 30.0, 50.0, 69.0, 71.0], &t2, Some(2));
        assert!((f.mae_points.unwrap() - (0.0 + 1.0 + 1.0) / 3.0).abs() < 1e-9);
        assert_eq!(f.settled_s, Some(3.0));
        assert!(met(&f, Some(2)));
        let a = after_change(&[40.0, 30.0, 50.0, 69.0, 71.0], &t2, 2);
        assert!((a.achieved - 70.0).abs() < 1e-9);
        assert_eq!(a.settled_s, Some(3.0));
        // Unlimited: no error figures.
        let f = figures(&[70.0, 70.0], &[None, None], None);
        assert_eq!((f.mae_points, f.settled_s), (None, None));
    }

    #[test]
    fn ratios_and_per_second_shares() {
        assert!(ratio(10.0, 10.5, 90.0, 89.0).within_target);
        assert!(!ratio(10.0, 14.0, 90.0, 85.0).within_target);
        assert!(!ratio(30.0, 30.0, 70.0, 0.0).within_target);
        let s = 1_000_000_000u64;
        let iv = vec![(7, 0, s / 2), (8, s / 2, s + s / 4), (9, 0, 3 * s)];
        let p = per_second(&iv, &[7, 8], 0, 2);
        assert_eq!(p[0], vec![50.0, 0.0]);
        assert_eq!(p[1], vec![50.0, 25.0]);
    }
}
