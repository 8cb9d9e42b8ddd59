//! The control law: a token bucket in GPU time. Credit accrues at the
//! container's share of wall time (`rate`), each launch takes its
//! estimated GPU time, and every measurement replaces the estimate with
//! what the device actually spent (`Bucket::adjust`). Over any span the
//! container has started no more GPU time than the span earned, plus the
//! bank (`cap`), so its share of the device's time converges to the target
//! without a gain to tune: the law is an accounting identity, not a
//! feedback loop on utilization, and nothing in it is counted in blocks or
//! SMs, which is why it holds the same from 20 to 200 SMs (docs/limiter.md).
//!
//! Never blocks, allocates or panics: `gate` says go or when to look again;
//! the caller waits (outside any signal handler).

use vgpu_region::pacing::{earned, Bounds, Bucket};

use crate::policy::PPM;

/// Tunables. None is in units of blocks or SMs; each is a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Credit a container may bank, as wall time at its share: after an
    /// idle spell it may run this long at its share ahead of the clock.
    pub burst_window_ns: u64,
    /// Deepest debt, as wall time at its share; debt past it (a gross
    /// underestimate, e.g. a thousand long kernels queued on a guess) is
    /// forgiven so a process never stalls for minutes.
    pub debt_window_ns: u64,
    /// While credit is positive, refill at most this often on the launch
    /// path (a refill is two compare-exchanges).
    pub refill_every_ns: u64,
    /// Shortest wait the gate asks for.
    pub min_wait_ns: u64,
    /// Longest single wait: settings (a live limit change, a resume) are
    /// looked at again at least this often. The control period.
    pub period_ns: u64,
    /// A marker burst closes after this much wall time.
    pub marker_period_ns: u64,
    /// Most launches in one marker burst.
    pub max_burst_launches: u32,
    /// First guess of a launch's GPU time, before anything was measured.
    pub initial_estimate_ns: u64,
    /// The launch path reads finished markers at most this often (a read
    /// is a driver call per pending burst); the gate reads them anyway
    /// before it would wait, and the owned thread every period.
    pub poll_every_ns: u64,
    /// Once the bucket is dry, wait until this much GPU time is banked
    /// again (at most the bank): launches then go in bursts of about this
    /// much, one marker pair each, instead of one at a time.
    pub batch_ns: u64,
    /// Launches go on until the credit is this far below zero (at most the
    /// debt floor), so this much of the container's work stays queued on
    /// the device while its launching thread sleeps at the gate. A thread
    /// woken late (a loaded CPU, a sleep that overshoots) then finds the
    /// device still busy with its work instead of idle. It shifts the
    /// bucket by a constant: the rate over any span is unchanged.
    pub lookahead_ns: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            burst_window_ns: 20_000_000,
            debt_window_ns: 1_000_000_000,
            refill_every_ns: 50_000,
            min_wait_ns: 20_000,
            period_ns: 10_000_000,
            marker_period_ns: 2_000_000,
            max_burst_launches: 4096,
            initial_estimate_ns: 100_000,
            batch_ns: 500_000,
            poll_every_ns: 200_000,
            lookahead_ns: 10_000_000,
        }
    }
}

/// The bucket's bounds for `share_ppm`: a bank of `burst_window` at the
/// share (at least 100 µs, so one launch can always start from a full
/// bank) and a debt floor of `debt_window` at the share.
#[inline]
pub fn bounds(share_ppm: u32, p: &Params) -> Bounds {
    let cap = earned(p.burst_window_ns, share_ppm).max(100_000);
    let floor = earned(p.debt_window_ns, share_ppm).max(cap);
    Bounds::new(cap, -floor)
}

/// Most refill rate, ppm of wall time in marker time: 110 % of the wall,
/// allowed only while the sampler says the container gets less than its
/// share (the bucket's `rate_cap_ppm`; else the whole device).
///
/// Why: a container whose markers read about the whole wall (it always
/// has work queued and a neighbour's slices run inside its bursts) has a
/// correction `c` about equal to what it gets, so its rate `share / c`
/// sits at the whole device, the cap: whatever pushes it below its share
/// (a launcher starved of the CPU, a burst charged its estimate) also
/// lowers `c` and nothing pushes it back: the larger tenant of a pair
/// drifted to 64–67 of 70 and 80–85 of 90 while the device idled. Above
/// the cap only while NVML says it is short, it climbs back; a container
/// at or over its share stays capped at the device, so one held far below
/// its fair slice beside an unlimited neighbour (a priority hold) is not
/// let through (a cap of 110 % always let the model's 20 % hold reach 25).
pub const MAX_RATE_PPM: u32 = PPM + PPM / 10;

/// Refill rate in ppm of wall time: the share divided by the measurement
/// correction (truth ÷ markers). Markers that read 2× the device's own
/// accounting (a neighbour's time inside our spans) refill 2× as fast, so
/// the container still gets its share of real device time. At most
/// [`MAX_RATE_PPM`]; the gate applies the bucket's own cap as well.
#[inline]
pub fn rate_ppm(share_ppm: u32, correction_ppm: u32) -> u32 {
    let c = correction_ppm.max(1) as u64;
    ((share_ppm as u64 * PPM as u64) / c).min(MAX_RATE_PPM as u64) as u32
}

/// The gate's answer for one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Launch now; the bucket was charged `charge_ns`.
    Go {
        /// What was taken (the estimate).
        charge_ns: u64,
    },
    /// No credit: look again at `until_ns` (CLOCK_MONOTONIC).
    Wait {
        /// When credit is expected back (bounded by the control period).
        until_ns: u64,
    },
}

/// One launch at `now`: refill, then take `estimate_ns` if any credit is
/// left, else say when there will be. A launch may take more than is left
/// (debt): a kernel cannot be split, and the debt delays the next one.
#[inline]
pub fn gate(
    bucket: &Bucket<'_>,
    now_ns: u64,
    share_ppm: u32,
    estimate_ns: u64,
    p: &Params,
) -> Decision {
    // The rate (a division) only when a refill or a wait needs it: most
    // launches take from a bucket that was refilled less than
    // `refill_every` ago.
    let rate = || rate_ppm(share_ppm, bucket.correction_ppm()).min(bucket.rate_cap_ppm());
    let b = bounds(share_ppm, p);
    let mut credit = bucket.credit();
    let last = bucket
        .raw()
        .refill_at_ns
        .load(std::sync::atomic::Ordering::Relaxed);
    if credit <= 0 || last == 0 || now_ns.saturating_sub(last) >= p.refill_every_ns {
        credit = bucket.refill(now_ns, rate(), b);
    }
    let ahead = (p.lookahead_ns as i64).min(-b.floor_ns / 2).max(0);
    if credit > -ahead {
        bucket.take(estimate_ns, b);
        return Decision::Go {
            charge_ns: estimate_ns,
        };
    }
    // Dry: wait for a batch, not for the first nanosecond of credit.
    let batch = (p.batch_ns.min(b.cap_ns as u64)) as i64;
    Decision::Wait {
        until_ns: now_ns
            + wait_for(
                credit.saturating_add(ahead).saturating_sub(batch),
                rate(),
                p,
            ),
    }
}

/// Wall time until `credit` (≤ 0) is positive again at `rate_ppm`, within
/// `[min_wait, period]`.
pub fn wait_for(credit: i64, rate_ppm: u32, p: &Params) -> u64 {
    let need = credit.unsigned_abs().saturating_add(1) as u128;
    let dt = if rate_ppm == 0 {
        p.period_ns as u128
    } else {
        (need * PPM as u128).div_ceil(rate_ppm as u128)
    };
    (dt.min(p.period_ns as u128) as u64).max(p.min_wait_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_region::pacing::LocalBucket;

    #[test]
    fn bounds_and_rates() {
        let p = Params::default();
        let b = bounds(300_000, &p);
        assert_eq!(b.cap_ns, 6_000_000);
        assert_eq!(b.floor_ns, -300_000_000);
        assert_eq!(bounds(1, &p).cap_ns, 100_000);
        assert!(bounds(1, &p).floor_ns <= -100_000);
        assert_eq!(rate_ppm(300_000, PPM), 300_000);
        assert_eq!(rate_ppm(300_000, PPM / 2), 600_000);
        // Marker time may run faster than the wall: a 70 % share whose
        // markers read twice the truth refills at 140 %.
        assert_eq!(rate_ppm(700_000, PPM / 2), MAX_RATE_PPM);
        assert_eq!(rate_ppm(900_000, 850_000), 1_058_823);
        assert_eq!(rate_ppm(300_000, 0), MAX_RATE_PPM);
        assert_eq!(wait_for(-3_000, 300_000, &p), 20_000);
        assert_eq!(wait_for(-300_000, 300_000, &p), 1_000_004);
        assert_eq!(wait_for(i64::MIN, 1, &p), p.period_ns);
        assert_eq!(wait_for(-1, 0, &p), p.period_ns);
    }

    #[test]
    fn gate_goes_while_credit_lasts_then_waits_the_right_time() {
        let p = Params::default();
        let l = LocalBucket::new();
        let b = l.bucket();
        let mut now = 1_000_000_000;
        let mut goes = 0;
        // A 6 ms bank at 30 %, 1 ms launches: six go, and ten more into
        // the 10 ms lookahead, then the credit is -10 ms.
        loop {
            match gate(&b, now, 300_000, 1_000_000, &p) {
                Decision::Go { charge_ns } => {
                    assert_eq!(charge_ns, 1_000_000);
                    goes += 1;
                }
                Decision::Wait { until_ns } => {
                    // Dry: back when a 0.5 ms batch is banked, 1.67 ms at 30 %.
                    assert_eq!(until_ns, now + 1_666_670);
                    break;
                }
            }
        }
        assert_eq!(goes, 16);
        // 10 ms later, 3 ms more credit.
        now += 10_000_000;
        let mut more = 0;
        while let Decision::Go { .. } = gate(&b, now, 300_000, 1_000_000, &p) {
            more += 1;
        }
        assert_eq!(more, 3);
    }
}
