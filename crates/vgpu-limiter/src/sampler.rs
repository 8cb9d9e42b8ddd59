//! The slow loop: a few times a second, one process per container (the
//! holder of the sampler lease) compares what the markers measured with
//! the device's own per-process accounting (NVML samples of the
//! container's host PIDs) and publishes the ratio as the bucket's
//! correction, and the container's utilization (always, limited or not).
//! Pure arithmetic over one window's figures; the interposer's owned
//! thread gathers them.
//!
//! Without host PIDs the truth is unknown. The markers alone over-count
//! when neighbours' work runs inside our spans, which only ever charges
//! the container more than it used (it gets less, never more, than its
//! share); NVML's device-wide busy time, which needs no PID, still caps
//! that error: our time cannot exceed the device's.

use vgpu_region::UtilSource;

use crate::policy::PPM;

/// Correction bounds (ppm): markers may read from 10× to 0.25× the truth.
pub const MIN_CORRECTION: u32 = PPM / 10;
/// See `MIN_CORRECTION`.
pub const MAX_CORRECTION: u32 = 4 * PPM;

/// One window's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Its length, ns.
    pub window_ns: u64,
    /// NVML's GPU time for the container's known host PIDs (`None`: no
    /// host PID known, or NVML refused).
    pub truth_ns: Option<u64>,
    /// Marker-measured time of the processes whose host PID is known.
    pub markers_known_ns: u64,
    /// Marker-measured time of the whole container.
    pub markers_all_ns: u64,
    /// NVML's device-wide busy time (`None`: NVML unavailable).
    pub device_busy_ns: Option<u64>,
}

/// What to publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The bucket's correction (truth ÷ markers), ppm.
    pub correction_ppm: u32,
    /// The container's utilization, ppm of the device's time.
    pub util_ppm: u32,
    /// What it was measured with.
    pub source: UtilSource,
}

/// The correction's state across windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrector {
    c_ppm: u32,
}

impl Default for Corrector {
    fn default() -> Self {
        Corrector { c_ppm: PPM }
    }
}

fn ratio(num: u64, den: u64) -> u32 {
    if den == 0 {
        return PPM;
    }
    ((num as u128 * PPM as u128) / den as u128).min(u32::MAX as u128) as u32
}

impl Corrector {
    /// The correction now, ppm.
    pub fn correction_ppm(&self) -> u32 {
        self.c_ppm
    }

    /// Folds in one window. The correction moves halfway to the window's
    /// ratio (a sample's noise halves, a real change is tracked in a few
    /// windows), only when the markers saw at least 2 % of the window (an
    /// idle container's ratio is noise).
    pub fn step(&mut self, w: &Window) -> Published {
        let enough = |ns: u64| w.window_ns > 0 && ns.saturating_mul(50) >= w.window_ns;
        let sample = match (w.truth_ns, w.device_busy_ns) {
            (Some(t), _) if enough(w.markers_known_ns) => Some(ratio(t, w.markers_known_ns)),
            // No truth: the device's busy time bounds ours; never raises
            // the correction above 1 (that would pace harder on a guess).
            (None, Some(busy)) if enough(w.markers_all_ns) => {
                Some(ratio(busy, w.markers_all_ns).min(PPM))
            }
            (None, None) if enough(w.markers_all_ns) => Some(PPM),
            _ => None,
        };
        if let Some(s) = sample {
            let s = s.clamp(MIN_CORRECTION, MAX_CORRECTION) as i64;
            let c = self.c_ppm as i64;
            // Halfway, rounded away from the old value so it arrives.
            let step = (s - c) / 2 + (s - c).signum() * ((s - c).abs() % 2);
            self.c_ppm = (c + step).clamp(MIN_CORRECTION as i64, MAX_CORRECTION as i64) as u32;
        }
        let (util, source) = match w.truth_ns {
            Some(t) => (ratio(t, w.window_ns), UtilSource::NvmlProcess),
            None if w.markers_all_ns > 0 => {
                let corrected =
                    (w.markers_all_ns as u128 * self.c_ppm as u128 / PPM as u128) as u64;
                (ratio(corrected, w.window_ns), UtilSource::Markers)
            }
            None => match w.device_busy_ns {
                Some(b) => (ratio(b, w.window_ns), UtilSource::DeviceBound),
                None => (0, UtilSource::None),
            },
        };
        Published {
            correction_ppm: self.c_ppm,
            util_ppm: util.min(PPM),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 200_000_000;

    #[test]
    fn truth_corrects_markers_that_over_count() {
        let mut c = Corrector::default();
        let w = Window {
            window_ns: W,
            truth_ns: Some(60_000_000),
            markers_known_ns: 120_000_000,
            markers_all_ns: 120_000_000,
            device_busy_ns: Some(W),
        };
        let p = c.step(&w);
        assert_eq!(p.correction_ppm, 750_000);
        assert_eq!((p.util_ppm, p.source), (300_000, UtilSource::NvmlProcess));
        for _ in 0..20 {
            c.step(&w);
        }
        assert!((c.correction_ppm() as i64 - 500_000).abs() < 1_000);
        // An idle window changes nothing.
        let idle = Window {
            window_ns: W,
            truth_ns: Some(0),
            ..Window::default()
        };
        let before = c.correction_ppm();
        assert_eq!(c.step(&idle).util_ppm, 0);
        assert_eq!(c.correction_ppm(), before);
    }

    #[test]
    fn without_truth_the_device_bounds_and_utilization_is_still_filled() {
        let mut c = Corrector::default();
        // Markers say 150 ms of 200, the whole device was busy 100 ms.
        let w = Window {
            window_ns: W,
            truth_ns: None,
            markers_known_ns: 0,
            markers_all_ns: 150_000_000,
            device_busy_ns: Some(100_000_000),
        };
        let p = c.step(&w);
        assert!(p.correction_ppm < PPM);
        assert_eq!(p.source, UtilSource::Markers);
        // A busy device never raises the correction above 1.
        let mut c2 = Corrector::default();
        let w2 = Window {
            device_busy_ns: Some(W),
            markers_all_ns: 10_000_000,
            ..w
        };
        assert_eq!(c2.step(&w2).correction_ppm, PPM);
        // Not paced, no PID: the device-wide figure, marked as a bound.
        let w3 = Window {
            window_ns: W,
            device_busy_ns: Some(50_000_000),
            ..Window::default()
        };
        let p3 = Corrector::default().step(&w3);
        assert_eq!((p3.util_ppm, p3.source), (250_000, UtilSource::DeviceBound));
        let p4 = Corrector::default().step(&Window {
            window_ns: W,
            ..Window::default()
        });
        assert_eq!(p4.source, UtilSource::None);
        // Clamped both ways.
        let mut c5 = Corrector::default();
        for _ in 0..40 {
            c5.step(&Window {
                window_ns: W,
                truth_ns: Some(W),
                markers_known_ns: W / 20,
                markers_all_ns: W / 20,
                device_busy_ns: None,
            });
        }
        assert_eq!(c5.correction_ppm(), MAX_CORRECTION);
    }
}
