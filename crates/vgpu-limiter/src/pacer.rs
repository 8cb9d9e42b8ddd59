//! One process's limiter on one device: what the interposer's launch gate
//! calls (`admit` before the real launch, `launched` after it, `before_sync`
//! before a synchronize, `poll` from the owned thread). It joins the law
//! (the container's bucket), the estimates and the meter.
//!
//! Threads: many application threads may launch at once. The pacing target
//! is one atomic word (the unlimited path is one load); the meter and the
//! estimates sit behind a mutex that launch paths only `try_lock`: a launch
//! that finds it busy is charged the last estimate and goes unmeasured
//! rather than wait for another thread. Never blocks in `admit`/`launched`
//! beyond that, never allocates, never panics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use vgpu_region::pacing::{Bucket, SlotPacing};

use crate::estimate::{Estimates, Kind};
use crate::law::{self, Decision, Params};
use crate::meter::{Markers, Measured, Meter, MeterStats};
use crate::policy::Target;

/// The launch gate's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Not paced (no limit, `disable`, not started): launch, then nothing.
    Pass,
    /// Launch now; hand the ticket to `launched`.
    Go(Ticket),
    /// Wait until `until_ns`, then ask again (a live change or a resume is
    /// seen at the next ask: waits are at most one control period).
    Wait {
        /// CLOCK_MONOTONIC ns.
        until_ns: u64,
    },
    /// Suspended: wait until `until_ns` (one period), then ask again.
    /// Queries and synchronizes are not gated.
    Suspended {
        /// CLOCK_MONOTONIC ns.
        until_ns: u64,
    },
}

/// A launch the gate let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// What the bucket was charged.
    pub charge_ns: u64,
    /// A burst marker covers it.
    pub metered: bool,
    /// Its stream.
    pub stream: u64,
    /// Its kind.
    pub kind: Kind,
    /// No estimate existed (a probe: measured before the next launch).
    pub probe: bool,
    /// The burst it was counted into at the gate (when metered).
    pub burst: u64,
    /// That burst closes after the call (`launched` takes the lock).
    pub close_after: bool,
}

/// The shared cells one launch touches: the container's bucket for the
/// device, this process's slot record, and the device index in it.
#[derive(Clone, Copy)]
pub struct Cells<'a> {
    /// The container's bucket (region, or a local one when failing closed).
    pub bucket: Bucket<'a>,
    /// This process's pacing record.
    pub slot: SlotPacing<'a>,
    /// The device's index in the region.
    pub dev: u32,
}

struct Inner<M: Copy> {
    meter: Meter<M>,
    est: Estimates,
    /// When the launch path last read markers.
    polled_ns: u64,
    /// Metered launches counted at the gate and not yet added to the
    /// slot's launch counter (added with the next measurements read, at
    /// most a control period later: one shared read-modify-write per read
    /// instead of one per launch). Below zero when launches counted and
    /// published failed afterwards.
    unpublished: i64,
    /// GPU time metered launches were charged at the gate and not yet
    /// added to the bucket's cumulative `charged_ns` (display only):
    /// published like `unpublished`, before any measurement's correction
    /// is applied to it.
    uncharged: u64,
}

/// One process's limiter on one device.
pub struct Pacer<M: Copy> {
    params: Params,
    target: AtomicU64,
    /// Kernel estimate for launches that cannot take the lock (0 = none).
    kernel_est: AtomicU64,
    inner: Mutex<Inner<M>>,
}

impl<M: Copy> Pacer<M> {
    /// A pacer that passes everything until `set_target`.
    pub fn new(params: Params) -> Pacer<M> {
        Pacer {
            params,
            target: AtomicU64::new(0),
            kernel_est: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                meter: Meter::default(),
                est: Estimates::default(),
                polled_ns: 0,
                unpublished: 0,
                uncharged: 0,
            }),
        }
    }

    /// The tunables.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Sets what to pace to (a live limit change takes effect at the next
    /// launch; a waiting launch sees it at its next ask, within a period).
    pub fn set_target(&self, t: Target) {
        self.target.store(t.pack(), Relaxed);
    }

    /// What it paces to now.
    pub fn target(&self) -> Target {
        Target::unpack(self.target.load(Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<M>> {
        // Nothing panics while holding it; a poisoned lock is still sound.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before a launch of `kind` on `stream` at `now`: pass, go (charged,
    /// maybe a start marker recorded), or wait.
    pub fn admit<K: Markers<Mark = M>>(
        &self,
        k: &K,
        cells: &Cells<'_>,
        now_ns: u64,
        stream: u64,
        kind: Kind,
    ) -> Admit {
        let bucket = &cells.bucket;
        let t = self.target();
        if t.is_pass() {
            return Admit::Pass;
        }
        let p = &self.params;
        if t.is_suspended() {
            return Admit::Suspended {
                until_ns: now_ns + p.period_ns,
            };
        }
        let Ok(mut g) = self.inner.try_lock() else {
            // Another thread is metering: charge the estimate, unmeasured.
            let est = self.kernel_est.load(Relaxed);
            if est == 0 || kind != Kind::Kernel {
                return Admit::Wait {
                    until_ns: now_ns + p.min_wait_ns,
                };
            }
            return match law::gate(bucket, now_ns, t.share_ppm, est, p) {
                Decision::Go { charge_ns } => {
                    bucket.add_charged(charge_ns);
                    Admit::Go(Ticket {
                        charge_ns,
                        metered: false,
                        stream,
                        kind,
                        probe: false,
                        burst: 0,
                        close_after: false,
                    })
                }
                Decision::Wait { until_ns } => {
                    bucket.count_wait();
                    Admit::Wait { until_ns }
                }
            };
        };
        let g = &mut *g;
        // Finished markers first, when due, or when the bucket is dry or a
        // burst holds us (the wait should be decided on the truth).
        let mut est = g.est.get(kind);
        let mut blocked = g.meter.blocked(now_ns, est.is_some());
        let due = blocked
            || now_ns.saturating_sub(g.polled_ns) >= p.poll_every_ns
            || bucket.credit() <= 0;
        if due && g.meter.pending() > 0 {
            g.polled_ns = now_ns;
            self.drain(g, k, cells);
            // What was read may have taught the estimate or freed a slot.
            est = g.est.get(kind);
            blocked = g.meter.blocked(now_ns, est.is_some());
        }
        if blocked {
            // What blocks us must get measured: an open burst (of another
            // kind, before a probe) closes now, or it would wait for a
            // launch that cannot come.
            g.meter.close_or_drop_all(k, now_ns, p);
            let wait = (g.meter.unmeasured_ns() / 2).clamp(p.min_wait_ns, p.period_ns);
            return Admit::Wait {
                until_ns: now_ns + wait,
            };
        }
        let charge = est.unwrap_or(p.initial_estimate_ns);
        match law::gate(bucket, now_ns, t.share_ppm, charge, p) {
            Decision::Go { charge_ns } => {
                // Counted into its burst now, under the lock this gate
                // holds anyway: a launch that goes through then takes no
                // lock after its call (two read-modify-writes fewer).
                let counted =
                    g.meter
                        .count_at_gate(k, now_ns, stream, kind, charge_ns, est.is_some(), p);
                if counted.is_some() {
                    g.unpublished += 1;
                }
                // Its charge joins the bucket's cumulative counter with the
                // next measurements read (one shared add per read).
                g.uncharged = g.uncharged.saturating_add(charge_ns);
                let (burst, close_after) = counted.unwrap_or((0, false));
                Admit::Go(Ticket {
                    charge_ns,
                    metered: counted.is_some(),
                    stream,
                    kind,
                    probe: est.is_none(),
                    burst,
                    close_after,
                })
            }
            Decision::Wait { until_ns } => {
                bucket.count_wait();
                // The stream may run dry while we wait: measure what is
                // queued now, so no burst spans the idle time (one whose
                // stream already drained while this thread was away is
                // dropped).
                g.meter.close_or_drop_all(k, now_ns, p);
                Admit::Wait { until_ns }
            }
        }
    }

    /// After the real launch returned (`ok`: the driver queued it):
    /// counts it, refunds a launch that failed (and takes it out of its
    /// burst), and closes its burst when the gate said so. A metered
    /// launch was counted into its burst at the gate: one that went
    /// through and leaves its burst open takes no lock here.
    pub fn launched<K: Markers<Mark = M>>(
        &self,
        k: &K,
        cells: &Cells<'_>,
        ticket: Ticket,
        ok: bool,
        waited_ns: u64,
        now_ns: u64,
    ) {
        let p = &self.params;
        if !ok {
            let b = law::bounds(self.target().share_ppm, p);
            if ticket.metered {
                // Its charge may still be in `uncharged`: refund the
                // credit here and take the charge out under the lock below.
                cells.bucket.refund_uncounted(ticket.charge_ns, b);
            } else {
                cells
                    .bucket
                    .adjust(i64::try_from(ticket.charge_ns).unwrap_or(i64::MAX), b);
            }
        } else {
            // A metered launch was counted at the gate (published with the
            // next measurements read).
            let launches = u64::from(!ticket.metered);
            if launches > 0 || waited_ns > 0 {
                cells.slot.add_launches(cells.dev, launches, waited_ns);
            }
        }
        if ticket.metered && (!ok || ticket.close_after) {
            let mut g = self.lock();
            if !ok {
                g.unpublished -= 1;
                if g.uncharged >= ticket.charge_ns {
                    g.uncharged -= ticket.charge_ns;
                } else {
                    // Published already (a read came between): take it
                    // back out of the shared counter.
                    let rest = ticket.charge_ns - g.uncharged;
                    g.uncharged = 0;
                    cells.bucket.adjust_charged(rest);
                }
            }
            g.meter
                .settle(k, now_ns, ticket.stream, ticket.burst, ticket.charge_ns, ok);
        }
    }

    /// Before a synchronize (or a blocking copy, or a query the
    /// application polls): closes open bursts so they are measured
    /// without the host's time that follows.
    pub fn before_sync<K: Markers<Mark = M>>(&self, k: &K, now_ns: u64) {
        if self.target().is_pass() {
            return;
        }
        self.lock().meter.close_all(k, now_ns);
    }

    /// Reads every measurement that is ready and applies it: the bucket
    /// gets `charged − measured` back (or pays the shortfall), the
    /// estimates learn, the slot's counters grow (the metered launches
    /// counted since the last read too). For the owned thread and
    /// after a synchronize; `admit` does it too.
    pub fn poll<K: Markers<Mark = M>>(&self, k: &K, cells: &Cells<'_>) -> usize {
        let mut g = self.lock();
        self.drain(&mut g, k, cells)
    }

    fn drain<K: Markers<Mark = M>>(&self, g: &mut Inner<M>, k: &K, cells: &Cells<'_>) -> usize {
        let (bucket, slot, dev) = (&cells.bucket, &cells.slot, cells.dev);
        if g.unpublished > 0 {
            slot.add_launches(dev, g.unpublished as u64, 0);
            g.unpublished = 0;
        }
        // Before any correction below takes from it.
        bucket.add_charged(std::mem::take(&mut g.uncharged));
        let b = law::bounds(self.target().share_ppm, &self.params);
        let mut n = 0;
        while let Some(m) = g.meter.poll(k) {
            n += 1;
            let Measured {
                kind,
                launches,
                charged_ns,
                measured_ns,
            } = m;
            let Some(ns) = measured_ns else { continue };
            let delta = charged_ns as i128 - ns as i128;
            bucket.adjust(delta.clamp(i64::MIN as i128, i64::MAX as i128) as i64, b);
            bucket.add_measured(ns);
            slot.add_measured(dev, ns);
            g.est.add(kind, launches, ns);
            if kind == Kind::Kernel {
                let e = g.est.kernel_ns().max(1);
                self.kernel_est.store(e, Relaxed);
                slot.set_estimate(dev, e);
            }
        }
        n
    }

    /// Drops every marker (fork child, exit, context loss).
    pub fn clear<K: Markers<Mark = M>>(&self, k: &K) {
        self.lock().meter.clear(k);
    }

    /// Meter counters.
    pub fn stats(&self) -> MeterStats {
        self.lock().meter.stats()
    }

    /// GPU time charged at the gate and not yet added to the bucket's
    /// cumulative `charged_ns` (it is at the next measurements read).
    pub fn unpublished_charge_ns(&self) -> u64 {
        self.lock().uncharged
    }

    /// The kernel estimate, GPU-ns (0 = none yet).
    pub fn kernel_estimate_ns(&self) -> u64 {
        self.kernel_est.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::Elapsed;
    use crate::policy::{target, Measurement, Settings};
    use std::sync::atomic::{AtomicU32, AtomicU64};
    use vgpu_region::layout::RawSlotPacing;
    use vgpu_region::pacing::{zeroed_slot_pacing, LocalBucket};

    /// A device that runs every launch at once for 40 µs of GPU time, in
    /// launch order: a marker reads the GPU time queued before it.
    struct Instant40 {
        gpu_ns: AtomicU64,
        released: AtomicU32,
    }

    impl Markers for Instant40 {
        type Mark = u64;
        fn record(&self, _stream: u64) -> Option<u64> {
            Some(self.gpu_ns.load(Relaxed))
        }
        fn elapsed(&self, a: u64, b: u64) -> Elapsed {
            Elapsed::Ready(b.saturating_sub(a))
        }
        fn release(&self, _m: u64) {
            self.released.fetch_add(1, Relaxed);
        }
    }

    /// What each scenario below paces over: a pacer limited to `sm` %
    /// with markers, a process-local bucket, a zeroed slot record and the
    /// 40 µs device.
    struct Rig {
        pacer: Pacer<u64>,
        bucket: LocalBucket,
        slot: RawSlotPacing,
        k: Instant40,
    }

    impl Rig {
        fn new(sm: u32) -> Rig {
            let pacer = Pacer::new(Params::default());
            let settings = Settings {
                sm_limit: Some(sm),
                ..Settings::default()
            };
            let m = Measurement {
                markers: true,
                identity: true,
            };
            pacer.set_target(target(&settings, m));
            Rig {
                pacer,
                bucket: LocalBucket::new(),
                slot: zeroed_slot_pacing(),
                k: Instant40 {
                    gpu_ns: AtomicU64::new(0),
                    released: AtomicU32::new(0),
                },
            }
        }

        fn cells(&self) -> Cells<'_> {
            Cells {
                bucket: self.bucket.bucket(),
                slot: SlotPacing::new(Some(&self.slot), 1),
                dev: 0,
            }
        }
    }

    #[test]
    fn a_probe_after_another_kind_is_not_blocked_forever() {
        // Kernels, then the first launch of a graph (a probe, no estimate):
        // the kernels' open burst must close so the probe can go.
        let rig = Rig::new(30);
        let (pacer, k) = (&rig.pacer, &rig.k);
        let cells = rig.cells();
        let mut now = 1_000_000_000u64;
        let go = |kind: Kind, now: &mut u64| {
            for _ in 0..1000 {
                match pacer.admit(k, &cells, *now, 0, kind) {
                    Admit::Go(t) => {
                        k.gpu_ns.fetch_add(40_000, Relaxed);
                        pacer.launched(k, &cells, t, true, 0, *now);
                        return true;
                    }
                    Admit::Wait { until_ns } => *now = until_ns,
                    other => panic!("{other:?}"),
                }
            }
            false
        };
        for _ in 0..20 {
            assert!(go(Kind::Kernel, &mut now));
        }
        assert!(go(Kind::Graph(7), &mut now), "the graph probe never went");
        assert!(go(Kind::Graph(7), &mut now));
    }

    #[test]
    fn gate_counted_launches_reach_the_slot_once_and_failures_leave_their_burst() {
        let rig = Rig::new(50);
        let (pacer, k) = (&rig.pacer, &rig.k);
        let cells = rig.cells();
        let launches = || cells.slot.counters(0).1;
        let now = 1_000_000_000u64;
        // The first launch probes (measured alone): its burst closes after
        // it, under the lock.
        let Admit::Go(t) = pacer.admit(k, &cells, now, 0, Kind::Kernel) else {
            panic!("the first launch goes");
        };
        assert!(t.metered && t.probe && t.close_after);
        k.gpu_ns.fetch_add(40_000, Relaxed);
        pacer.launched(k, &cells, t, true, 0, now);
        pacer.poll(k, &cells);
        assert_eq!(launches(), 1);
        assert!(pacer.kernel_estimate_ns() > 0, "the probe was measured");
        // Estimated launches: counted into one open burst at the gate, none
        // takes the lock after its call; the slot sees them at the next
        // read of measurements.
        let mut ok = 0;
        let mut failed_bursts = Vec::new();
        for i in 0..10u64 {
            let Admit::Go(t) = pacer.admit(k, &cells, now + 1_000 * (i + 1), 0, Kind::Kernel)
            else {
                panic!("launch {i} waits");
            };
            assert!(t.metered && !t.close_after, "launch {i}: {t:?}");
            let went = i % 3 != 2;
            if went {
                k.gpu_ns.fetch_add(40_000, Relaxed);
                ok += 1;
            } else {
                failed_bursts.push(t.burst);
            }
            pacer.launched(k, &cells, t, went, 0, now + 1_000 * (i + 1));
        }
        assert_eq!(launches(), 1, "not published before a read");
        pacer.before_sync(k, now + 20_000);
        pacer.poll(k, &cells);
        assert_eq!(launches(), 1 + ok, "each launch that went, once");
        assert_eq!(pacer.stats().measured, 2, "the probe and one burst");
        // The failed launches were refunded and left their burst's
        // charge, so its measurement settled exactly what the 7 that went
        // were charged: the bucket holds the 8 launches' GPU time.
        assert_eq!(failed_bursts.len(), 3);
        let charged = cells.bucket.raw().charged_ns.load(Relaxed);
        assert_eq!(charged, 8 * 40_000);
        pacer.poll(k, &cells);
        assert_eq!(launches(), 1 + ok, "nothing counted twice");
    }

    #[test]
    fn threads_launching_at_once_share_one_pacer() {
        let rig = Rig::new(30);
        let clock = AtomicU64::new(1_000_000_000);
        let gone = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (rig, clock, gone) = (&rig, &clock, &gone);
                sc.spawn(move || {
                    let (pacer, k) = (&rig.pacer, &rig.k);
                    let cells = rig.cells();
                    for _ in 0..5_000 {
                        let now = clock.fetch_add(1_000, Relaxed);
                        match pacer.admit(k, &cells, now, t, Kind::Kernel) {
                            Admit::Go(ticket) => {
                                k.gpu_ns.fetch_add(40_000, Relaxed);
                                pacer.launched(k, &cells, ticket, true, 0, now);
                                gone.fetch_add(1, Relaxed);
                            }
                            Admit::Wait { until_ns } => assert!(until_ns > now),
                            other => panic!("{other:?}"),
                        }
                    }
                    pacer.before_sync(k, clock.load(Relaxed));
                    pacer.poll(k, &cells);
                });
            }
        });
        let cells = SlotPacing::new(Some(&rig.slot), 1);
        let (_, launches, _, _) = cells.counters(0);
        assert_eq!(launches, gone.load(Relaxed), "every launch counted once");
        let b = crate::law::bounds(300_000, &Params::default());
        let c = rig.bucket.bucket().credit();
        assert!(c >= b.floor_ns && c <= b.cap_ns, "credit {c}");
        // 20 ms of simulated time at 30 %: about 6 ms of 40 µs launches,
        // plus the 6 ms bank and the lookahead; never the 20 000 asked for.
        let n = gone.load(Relaxed);
        let p = Params::default();
        let most = (6_000_000 + 6_000_000 + p.lookahead_ns) / 40_000 + 100;
        assert!(n > 100 && n < most, "{n} launches went (most {most})");
        assert!(rig.pacer.kernel_estimate_ns() > 0);
    }
}
