//! The SM limiter's shared protocol over the pacing section: the
//! container's token bucket (one per device, drawn from by every process of
//! the container), the sampler lease, and each slot's pacing counters.
//! Atomics only, through the `sync` facade, so the loom model checks the
//! very code the mapped file runs (`tests/loom_pacing.rs`). It never
//! blocks, allocates or panics, and decides nothing: how much to charge and
//! when to wait is the control law's (crate `vgpu-limiter`).
//!
//! Why the bucket is exact without a lock: time is credited by claiming an
//! interval. A refiller reads `refill_at` (t0) and moves it to its own `now`
//! by compare-exchange; only the winner credits `(now - t0) × rate`. The
//! intervals claimed by successive winners are disjoint and adjacent, so
//! every instant is credited exactly once, whichever processes refill and
//! however they interleave. Credit itself changes only by compare-exchange
//! loops that keep it within `[floor, cap]`, so no interleaving of refills,
//! takes and corrections can leave it outside those bounds. A refiller
//! killed between its two steps loses its interval (the container is
//! briefly under-credited, never over).

use crate::layout::{RawPacing, RawSlotPacing, RawSlotPacingDevice, MAX_DEVICES};
use crate::sync::{
    AtomicI64,
    Ordering::{Relaxed, SeqCst},
};

/// Bounds the credit is kept within: `floor ≤ credit ≤ cap`, `floor ≤ 0 ≤ cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most credit a container may bank (its burst), GPU-ns.
    pub cap_ns: i64,
    /// Deepest debt, GPU-ns (≤ 0): debt past it is forgiven.
    pub floor_ns: i64,
}

impl Bounds {
    /// Bounds with `floor ≤ 0 ≤ cap` enforced.
    #[inline]
    pub fn new(cap_ns: i64, floor_ns: i64) -> Bounds {
        Bounds {
            cap_ns: cap_ns.max(0),
            floor_ns: floor_ns.min(0),
        }
    }

    #[inline]
    fn clamp(self, v: i64) -> i64 {
        v.clamp(self.floor_ns, self.cap_ns)
    }
}

/// Credit moved by `delta`, saturating, within `b`.
#[inline]
fn bounded(c: i64, delta: i64, b: Bounds) -> i64 {
    b.clamp(c.saturating_add(delta))
}

/// CAS loop: credit ← f(credit). Returns (before, after).
#[inline]
fn update(cell: &AtomicI64, f: impl Fn(i64) -> i64) -> (i64, i64) {
    let mut cur = cell.load(SeqCst);
    loop {
        let new = f(cur);
        if new == cur {
            return (cur, cur);
        }
        match cell.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
            Ok(_) => return (cur, new),
            Err(c) => cur = c,
        }
    }
}

/// GPU-ns earned over `dt_ns` of wall time at `rate_ppm` (parts per million
/// of the device's time), saturating at i64::MAX.
#[inline]
pub fn earned(dt_ns: u64, rate_ppm: u32) -> i64 {
    // u64 when the product fits (every bound and refill of the launch
    // path: a division by a constant, no 128-bit division call).
    let v = match dt_ns.checked_mul(u64::from(rate_ppm)) {
        Some(p) => u128::from(p / 1_000_000),
        None => (dt_ns as u128 * rate_ppm as u128) / 1_000_000,
    };
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One container bucket (a device's `RawPacing`), in the file or in memory.
#[derive(Clone, Copy)]
pub struct Bucket<'a> {
    cell: &'a RawPacing,
}

impl<'a> Bucket<'a> {
    /// The bucket over `cell`.
    pub fn new(cell: &'a RawPacing) -> Bucket<'a> {
        Bucket { cell }
    }

    /// The raw cells (display fields, sampler cells).
    #[inline]
    pub fn raw(&self) -> &'a RawPacing {
        self.cell
    }

    /// Credit now, GPU-ns.
    #[inline]
    pub fn credit(&self) -> i64 {
        self.cell.credit_ns.load(SeqCst)
    }

    /// Credits the time since the last refill at `rate_ppm`, within `b`, and
    /// returns the credit after. The first refill ever starts the clock and
    /// grants a full burst (`cap`): a fresh container may start at once.
    /// An interval another process already claimed is not credited again.
    pub fn refill(&self, now_ns: u64, rate_ppm: u32, b: Bounds) -> i64 {
        let at = &self.cell.refill_at_ns;
        let mut t0 = at.load(SeqCst);
        loop {
            if t0 != 0 && now_ns <= t0 {
                // Someone credited up to (or past) our now. A lowered cap
                // still applies at once.
                return update(&self.cell.credit_ns, |c| b.clamp(c)).1;
            }
            match at.compare_exchange(t0, now_ns, SeqCst, SeqCst) {
                Ok(_) => {
                    let add = if t0 == 0 {
                        b.cap_ns
                    } else {
                        earned(now_ns - t0, rate_ppm)
                    };
                    return update(&self.cell.credit_ns, |c| bounded(c, add, b)).1;
                }
                Err(cur) => t0 = cur,
            }
        }
    }

    /// Takes `ns` for a launch (its estimated cost) from the credit and
    /// returns the credit before the take; the credit never goes below the
    /// floor. The cumulative `charged_ns` counter (display only) is the
    /// caller's to add, with [`Bucket::add_charged`]: a caller that meters
    /// under a lock batches it (one shared read-modify-write per
    /// measurement read, not one per launch).
    #[inline]
    pub fn take(&self, ns: u64, b: Bounds) -> i64 {
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        update(&self.cell.credit_ns, |c| bounded(c, -ns, b)).0
    }

    /// Counts `ns` into the cumulative charged time (for the sampler and
    /// displays; nothing paces on it).
    #[inline]
    pub fn add_charged(&self, ns: u64) {
        if ns > 0 {
            self.cell.charged_ns.fetch_add(ns, Relaxed);
        }
    }

    /// Gives `ns` of a launch that never ran back to the credit, within
    /// `b`, without touching the charged counter (the caller had not
    /// counted it yet). Returns the credit after.
    pub fn refund_uncounted(&self, ns: u64, b: Bounds) -> i64 {
        let ns = i64::try_from(ns).unwrap_or(i64::MAX);
        update(&self.cell.credit_ns, |c| bounded(c, ns, b)).1
    }

    /// Applies a measurement's correction: `charged - measured` (positive
    /// gives credit back, negative charges the shortfall), within `b`.
    /// Returns the credit after.
    pub fn adjust(&self, delta_ns: i64, b: Bounds) -> i64 {
        if delta_ns >= 0 {
            self.adjust_charged(delta_ns as u64);
        } else {
            self.add_charged(delta_ns.unsigned_abs());
        }
        update(&self.cell.credit_ns, |c| bounded(c, delta_ns, b)).1
    }

    /// Takes `ns` back out of the cumulative charged time, stopping at 0
    /// (a garbage counter must not wrap).
    pub fn adjust_charged(&self, ns: u64) {
        let charged = &self.cell.charged_ns;
        let mut c = charged.load(Relaxed);
        while let Err(x) = charged.compare_exchange_weak(c, c.saturating_sub(ns), Relaxed, Relaxed)
        {
            c = x;
        }
    }

    /// Counts measured GPU time (cumulative, for the sampler and displays).
    pub fn add_measured(&self, ns: u64) {
        self.cell.measured_ns.fetch_add(ns, Relaxed);
    }

    /// Counts a launch that had to wait.
    pub fn count_wait(&self) {
        self.cell.waits.fetch_add(1, Relaxed);
    }

    /// Records the share and limiter state the caller paces with (display
    /// only: each process paces with the limits it read itself).
    pub fn publish(&self, share_ppm: u32, state_code: u32) {
        if self.cell.share_ppm.load(Relaxed) != share_ppm {
            self.cell.share_ppm.store(share_ppm, Relaxed);
        }
        if self.cell.mode.load(Relaxed) != state_code {
            self.cell.mode.store(state_code, Relaxed);
        }
    }

    /// The measurement correction (truth ÷ markers) in ppm; 1e6 when none
    /// has been published.
    #[inline]
    pub fn correction_ppm(&self) -> u32 {
        match self.cell.correction_ppm.load(Relaxed) {
            0 => 1_000_000,
            c => c,
        }
    }

    /// Most refill rate now, ppm (the sampler's; the whole device when it
    /// published none).
    #[inline]
    pub fn rate_cap_ppm(&self) -> u32 {
        match self.cell.rate_cap_ppm.load(Relaxed) {
            0 => 1_000_000,
            c => c,
        }
    }

    /// Publishes the most refill rate (the sampler).
    pub fn set_rate_cap_ppm(&self, ppm: u32) {
        if self.cell.rate_cap_ppm.load(Relaxed) != ppm {
            self.cell.rate_cap_ppm.store(ppm, Relaxed);
        }
    }

    /// Publishes the measurement correction (the sampler).
    pub fn set_correction_ppm(&self, ppm: u32) {
        self.cell.correction_ppm.store(ppm.max(1), Relaxed);
    }

    /// Publishes the container's utilization of the device.
    pub fn set_utilization(&self, util_ppm: u32, source_code: u32, at_ns: u64, window_ns: u64) {
        let c = self.cell;
        c.util_ppm.store(util_ppm, Relaxed);
        c.util_source.store(source_code, Relaxed);
        c.util_window_ns.store(window_ns, Relaxed);
        c.util_at_ns.store(at_ns, SeqCst);
    }
}

const LEASE_SHIFT: u32 = 44;
const LEASE_MASK: u64 = (1 << LEASE_SHIFT) - 1;

/// Who holds the sampler lease, if anyone, and until when (ms).
pub fn lease_holder(word: u64) -> Option<(u32, u64)> {
    let holder = word >> LEASE_SHIFT;
    (holder != 0).then(|| ((holder - 1) as u32, word & LEASE_MASK))
}

/// Takes or renews the sampler lease of `cell` for slot `me` until
/// `now_ms + ttl_ms`. True if `me` holds it afterwards. A lease whose
/// holder stopped renewing (dead, stopped, gone) is taken over once it
/// expires; two takers of one expired lease cannot both win (one
/// compare-exchange on one word).
pub fn try_lease(cell: &RawPacing, me: u32, now_ms: u64, ttl_ms: u64) -> bool {
    let lease = &cell.sampler_lease;
    let w = lease.load(SeqCst);
    let free = match lease_holder(w) {
        None => true,
        Some((h, until)) => h == me || now_ms > until,
    };
    if !free {
        return false;
    }
    let mine = ((me as u64 + 1) << LEASE_SHIFT) | (now_ms.saturating_add(ttl_ms) & LEASE_MASK);
    lease.compare_exchange(w, mine, SeqCst, SeqCst).is_ok()
}

/// Gives the lease up if `me` holds it (a clean exit: the next sampler
/// need not wait for expiry).
pub fn release_lease(cell: &RawPacing, me: u32) {
    let lease = &cell.sampler_lease;
    let w = lease.load(SeqCst);
    if lease_holder(w).is_some_and(|(h, _)| h == me) {
        let _ = lease.compare_exchange(w, 0, SeqCst, SeqCst);
    }
}

/// A slot's pacing record (written by its own process).
#[derive(Clone, Copy)]
pub struct SlotPacing<'a> {
    raw: Option<&'a RawSlotPacing>,
    devices: u32,
}

impl<'a> SlotPacing<'a> {
    /// The record (`None`: out of range or read-only; setters do nothing).
    pub fn new(raw: Option<&'a RawSlotPacing>, devices: u32) -> SlotPacing<'a> {
        SlotPacing { raw, devices }
    }

    fn dev(&self, dev: u32) -> Option<&'a RawSlotPacingDevice> {
        let r = self.raw?;
        (dev < self.devices && (dev as usize) < MAX_DEVICES).then(|| &r.devices[dev as usize])
    }

    /// Sets the limiter state (and reason) if it changed.
    pub fn set_state(&self, state_code: u32, reason_code: u32, now_ns: u64) {
        if let Some(r) = self.raw {
            if r.state.load(Relaxed) != state_code || r.reason.load(Relaxed) != reason_code {
                r.reason.store(reason_code, Relaxed);
                r.state_since_ns.store(now_ns, Relaxed);
                r.state.store(state_code, SeqCst);
            }
        }
    }

    /// (state, reason, since) codes as stored.
    pub fn state(&self) -> (u32, u32, u64) {
        self.raw.map_or((0, 0, 0), |r| {
            (
                r.state.load(SeqCst),
                r.reason.load(Relaxed),
                r.state_since_ns.load(Relaxed),
            )
        })
    }

    /// Counts GPU time this process's markers measured on `dev`.
    pub fn add_measured(&self, dev: u32, ns: u64) {
        if let Some(d) = self.dev(dev) {
            d.measured_ns.fetch_add(ns, Relaxed);
        }
    }

    /// Counts launches through the gate and time waited there.
    pub fn add_launches(&self, dev: u32, launches: u64, waited_ns: u64) {
        if let Some(d) = self.dev(dev) {
            if launches > 0 {
                d.launches.fetch_add(launches, Relaxed);
            }
            if waited_ns > 0 {
                d.waited_ns.fetch_add(waited_ns, Relaxed);
            }
        }
    }

    /// Records the current per-launch estimate.
    pub fn set_estimate(&self, dev: u32, ns: u64) {
        if let Some(d) = self.dev(dev) {
            d.estimate_ns.store(ns, Relaxed);
        }
    }

    /// (measured, launches, waited, estimate) on `dev`.
    pub fn counters(&self, dev: u32) -> (u64, u64, u64, u64) {
        self.dev(dev).map_or((0, 0, 0, 0), |d| {
            (
                d.measured_ns.load(Relaxed),
                d.launches.load(Relaxed),
                d.waited_ns.load(Relaxed),
                d.estimate_ns.load(Relaxed),
            )
        })
    }
}

/// Zeroes a slot's pacing record (claim, reclaim, unregister).
pub(crate) fn clear_slot_pacing(r: &RawSlotPacing, devices: usize) {
    let z64 = |c: &crate::sync::AtomicU64| {
        if c.load(Relaxed) != 0 {
            c.store(0, SeqCst);
        }
    };
    let z32 = |c: &crate::sync::AtomicU32| {
        if c.load(Relaxed) != 0 {
            c.store(0, SeqCst);
        }
    };
    z32(&r.state);
    z32(&r.reason);
    z64(&r.state_since_ns);
    for d in r.devices.iter().take(devices.min(MAX_DEVICES)) {
        z64(&d.measured_ns);
        z64(&d.launches);
        z64(&d.waited_ns);
        z64(&d.estimate_ns);
    }
}

/// An in-memory bucket with the same protocol: for a process that must
/// pace without a usable region (fail closed: it enforces its limit on its
/// own), and for tests.
#[cfg(not(loom))]
pub struct LocalBucket {
    cell: Box<RawPacing>,
}

#[cfg(not(loom))]
impl Default for LocalBucket {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
impl LocalBucket {
    /// A fresh bucket (never refilled).
    pub fn new() -> LocalBucket {
        LocalBucket {
            cell: Box::new(zeroed_pacing()),
        }
    }

    /// Its bucket.
    pub fn bucket(&self) -> Bucket<'_> {
        Bucket::new(&self.cell)
    }
}

/// A `RawPacing` with every cell zero.
pub fn zeroed_pacing() -> RawPacing {
    use crate::sync::{AtomicU32, AtomicU64};
    let z64 = || AtomicU64::new(0);
    let z32 = || AtomicU32::new(0);
    RawPacing {
        credit_ns: AtomicI64::new(0),
        refill_at_ns: z64(),
        charged_ns: z64(),
        measured_ns: z64(),
        waits: z64(),
        share_ppm: z32(),
        mode: z32(),
        correction_ppm: z32(),
        rate_cap_ppm: z32(),
        _reserved0: z64(),
        util_ppm: z32(),
        util_source: z32(),
        util_at_ns: z64(),
        util_window_ns: z64(),
        sampler_lease: z64(),
        _reserved1: std::array::from_fn(|_| z64()),
    }
}

/// A `RawSlotPacing` with every cell zero.
pub fn zeroed_slot_pacing() -> RawSlotPacing {
    use crate::sync::{AtomicU32, AtomicU64};
    let z64 = || AtomicU64::new(0);
    RawSlotPacing {
        state: AtomicU32::new(0),
        reason: AtomicU32::new(0),
        state_since_ns: z64(),
        _reserved: std::array::from_fn(|_| z64()),
        devices: std::array::from_fn(|_| RawSlotPacingDevice {
            measured_ns: z64(),
            launches: z64(),
            waited_ns: z64(),
            estimate_ns: z64(),
        }),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        cap_ns: 1_000,
        floor_ns: -5_000,
    };

    #[test]
    fn first_refill_grants_a_burst_then_credits_time_once() {
        let l = LocalBucket::new();
        let b = l.bucket();
        assert_eq!(b.refill(10_000, 300_000, B), 1_000);
        assert_eq!(b.take(900, B), 1_000);
        assert_eq!(b.credit(), 100);
        // 1000 ns at 30 % = 300 ns.
        assert_eq!(b.refill(11_000, 300_000, B), 400);
        // Same instant again: nothing more.
        assert_eq!(b.refill(11_000, 300_000, B), 400);
        // An older clock reading (another process's) credits nothing.
        assert_eq!(b.refill(10_500, 300_000, B), 400);
        // Capped.
        assert_eq!(b.refill(1_000_000, 300_000, B), 1_000);
    }

    #[test]
    fn credit_stays_within_bounds() {
        let l = LocalBucket::new();
        let b = l.bucket();
        b.refill(1, 1_000_000, B);
        for _ in 0..100 {
            b.take(u64::MAX, B);
        }
        assert_eq!(b.credit(), -5_000);
        b.adjust(i64::MAX, B);
        assert_eq!(b.credit(), 1_000);
        b.adjust(i64::MIN, B);
        assert_eq!(b.credit(), -5_000);
        // A lowered cap applies at the next refill.
        b.adjust(1_000_000, B);
        let small = Bounds::new(10, -10);
        assert_eq!(b.refill(2, 1_000_000, small), 10);
        assert_eq!(earned(u64::MAX, u32::MAX), i64::MAX);
    }

    #[test]
    fn lease_is_exclusive_until_it_expires() {
        let cell = zeroed_pacing();
        assert!(try_lease(&cell, 3, 100, 50));
        assert!(!try_lease(&cell, 4, 120, 50));
        assert!(try_lease(&cell, 3, 140, 50), "the holder renews");
        assert!(!try_lease(&cell, 4, 190, 50));
        assert!(try_lease(&cell, 4, 191, 50), "expired: taken over");
        assert_eq!(
            lease_holder(cell.sampler_lease.load(SeqCst)),
            Some((4, 241))
        );
        release_lease(&cell, 3);
        assert_eq!(
            lease_holder(cell.sampler_lease.load(SeqCst)),
            Some((4, 241))
        );
        release_lease(&cell, 4);
        assert_eq!(lease_holder(cell.sampler_lease.load(SeqCst)), None);
    }
}
