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
    /// The share the container was paced at (ppm; 0 = not paced). A
    /// change of more than a tenth starts the correction afresh: how much
    /// a neighbour's time lands inside our bursts depends on their rhythm.
    pub share_ppm: u32,
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
    /// Most refill rate to allow now, ppm (`law::MAX_RATE_PPM` while the
    /// container's NVML time over the last windows is more than
    /// [`SHORT_PPM`] below its share, else the whole device).
    pub rate_cap_ppm: u32,
}

/// How far below its share (ppm of the device) a container's NVML time
/// must be for its refill rate to go above the whole device.
pub const SHORT_PPM: u32 = 20_000;

/// Windows the correction averages over (with 100 ms windows, half a
/// second: short enough to settle within a second, long enough that the
/// lag between a marker's reading and NVML's window is noise).
pub const SPAN: usize = 10;

/// The correction's state across windows: the last `SPAN` windows' sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrector {
    c_ppm: u32,
    truth: [u64; SPAN],
    markers: [u64; SPAN],
    windows: [u64; SPAN],
    next: usize,
    share_ppm: u32,
}

impl Default for Corrector {
    fn default() -> Self {
        Corrector {
            c_ppm: PPM,
            truth: [0; SPAN],
            markers: [0; SPAN],
            windows: [0; SPAN],
            next: 0,
            share_ppm: 0,
        }
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

    /// Folds in one window. The correction is the ratio of the sums over
    /// the last `SPAN` windows, updated only when the markers saw at least
    /// 2 % of them (an idle container's ratio is noise). Without NVML's per-process
    /// truth, the device's busy time stands in for it, and can only lower
    /// the correction to 1 (markers that read more than the whole device
    /// was busy), never raise it.
    pub fn step(&mut self, w: &Window) -> Published {
        let (old, new) = (self.share_ppm as u64, w.share_ppm as u64);
        if old.abs_diff(new) * 10 > old.max(new) {
            // A new rhythm: keep the correction as the first guess, drop
            // the history behind it.
            self.truth = [0; SPAN];
            self.markers = [0; SPAN];
            self.windows = [0; SPAN];
        }
        self.share_ppm = w.share_ppm;
        // Every window goes into the sums, used or idle: skipping one whose
        // markers had not come back yet would drop its truth and bias the
        // ratio (a long kernel's time accrues before its marker reads).
        let (t, m) = match (w.truth_ns, w.device_busy_ns) {
            (Some(t), _) => (t, w.markers_known_ns),
            (None, Some(busy)) => (busy.min(w.markers_all_ns), w.markers_all_ns),
            (None, None) => (w.markers_all_ns, w.markers_all_ns),
        };
        self.truth[self.next] = t;
        self.markers[self.next] = m;
        self.windows[self.next] = w.window_ns;
        self.next = (self.next + 1) % SPAN;
        let (st, sm, sw) = (
            self.truth.iter().sum::<u64>(),
            self.markers.iter().sum::<u64>(),
            self.windows.iter().sum::<u64>(),
        );
        if sw > 0 && sm.saturating_mul(50) >= sw {
            self.c_ppm = ratio(st, sm).clamp(MIN_CORRECTION, MAX_CORRECTION);
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
        // Short of its share by NVML's own time (never by the markers'),
        // while the device had idle time to give: let the rate above the
        // whole device so it climbs back into the idle time. A container
        // short because a busy neighbour time-slices the device (nothing
        // idle) is not boosted: more credit would not buy it time.
        let idle = w
            .device_busy_ns
            .is_some_and(|b| b.saturating_mul(100) < w.window_ns.saturating_mul(97));
        let short = w.truth_ns.is_some()
            && idle
            && w.share_ppm > 0
            && sw > 0
            && (ratio(st, sw) as u64) + (SHORT_PPM as u64) < w.share_ppm as u64;
        Published {
            correction_ppm: self.c_ppm,
            util_ppm: util.min(PPM),
            source,
            rate_cap_ppm: if short { crate::law::MAX_RATE_PPM } else { PPM },
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
            share_ppm: 300_000,
        };
        let p = c.step(&w);
        assert_eq!(p.correction_ppm, 500_000, "the first window sets it");
        assert_eq!((p.util_ppm, p.source), (300_000, UtilSource::NvmlProcess));
        // The ratio over the last windows: a change moves it within SPAN.
        let half = Window {
            truth_ns: Some(120_000_000),
            ..w
        };
        c.step(&half);
        assert!(c.correction_ppm() > 500_000 && c.correction_ppm() < PPM);
        for _ in 0..SPAN {
            c.step(&half);
        }
        assert_eq!(c.correction_ppm(), PPM);
        // A new share drops the history: the next window decides alone.
        c.step(&Window {
            share_ppm: 700_000,
            ..w
        });
        assert_eq!(c.correction_ppm(), 500_000);
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
    fn a_container_short_of_its_share_while_the_device_idles_may_refill_faster() {
        let short = |truth: u64, busy: u64| {
            let mut c = Corrector::default();
            c.step(&Window {
                window_ns: W,
                truth_ns: Some(truth),
                markers_known_ns: W,
                markers_all_ns: W,
                device_busy_ns: Some(busy),
                share_ppm: 700_000,
            })
            .rate_cap_ppm
        };
        // 64 % of 70 while the device idled 8 %: above the device.
        assert_eq!(short(W * 64 / 100, W * 92 / 100), crate::law::MAX_RATE_PPM);
        // Within 2 points: the device.
        assert_eq!(short(W * 69 / 100, W * 92 / 100), PPM);
        // Short, but the device was busy throughout (a neighbour's slices):
        // more credit would not buy time.
        assert_eq!(short(W * 50 / 100, W), PPM);
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
            share_ppm: 300_000,
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
                share_ppm: 300_000,
            });
        }
        assert_eq!(c5.correction_ppm(), MAX_CORRECTION);
    }
}
