//! Clocks shared by every process on the machine.
//!
//! libc's `clock_gettime` (the vDSO glibc has already set up for the
//! process) rather than rustix's: rustix's own vDSO lookup costs a
//! `prctl(PR_GET_AUXV)` and an ELF walk on first use, inside `cuInit`.

fn read(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; every clock id used is
    // supported by every Linux kernel, so the call cannot fail.
    unsafe { libc::clock_gettime(id, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns: the clock of every phase timestamp, comparable
/// across processes of one boot.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC_COARSE in ns: the same clock at the kernel tick's
/// resolution (1-4 ms), read without the TSC (a few ns instead of tens),
/// for rate limits of tens of ms on hot paths.
pub fn coarse_monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// CLOCK_REALTIME in ns since the Unix epoch (creation time, for humans).
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// How long a published anchor is used: ten rounds of the owned thread that
/// re-anchors every 10 ms. Past it, reads take the kernel's clock again.
const STALE_NS: u64 = 100_000_000;
/// Reads this many ticks or more past the anchor take the kernel's clock
/// without converting (100 ms at up to 64 GHz, so the product below fits).
const STALE_TICKS: u64 = 1 << 33;
/// The first rate is measured over at least this span...
const FIRST_RATE_NS: u64 = 20_000_000;
/// ...and measured again over this one (NTP may slew CLOCK_MONOTONIC).
const RATE_NS: u64 = 200_000_000;
/// The published anchor's prediction must stay this close to the kernel's
/// clock, and a new rate this close to the last (parts per million), or
/// the process stops reading the TSC.
const MAX_ERROR_NS: u64 = 20_000;
/// A sample whose TSC reads around the kernel's clock are further apart
/// than this (7 µs at 3 GHz; about 80 ns when nothing interrupts) was
/// interrupted in each of its tries and is not used: its error could reach
/// the bound above.
const MAX_SAMPLE_TICKS: u64 = 20_000;
const MAX_RATE_CHANGE_PPM: u128 = 1_000;

/// CLOCK_MONOTONIC, read from the CPU's time-stamp counter where the
/// kernel reads it from the TSC too: one `rdtsc` and a multiply, about
/// half a vDSO `clock_gettime` (15 against 30-40 ns on the 2-core VM the
/// benches ran on), for the limiter's gate, which reads the clock once per
/// paced launch.
///
/// One thread (the interposer's owned thread) calls [`TscClock::anchor`]
/// every few ms: it samples the TSC and the kernel's clock together,
/// measures the rate over hundreds of ms, and publishes (TSC, ns, rate)
/// through a [`Seq3`](crate::seqlock::Seq3). Readers convert from the
/// anchor while it is younger than 100 ms and fall back to
/// `clock_gettime` otherwise: before the first anchor, when the owner
/// thread stalls, on another architecture, when the kernel's clocksource
/// is not `tsc`, and for good once the TSC disagreed with the kernel's
/// clock by more than 20 µs or changed rate by more than 0.1 %. So the
/// clock is never less right than the kernel's by more than that bound;
/// at a re-anchor it may step back by the anchor's error (well under a
/// µs), as two threads' reads of the kernel's clock may already arrive
/// out of order.
#[derive(Debug)]
pub struct TscClock {
    /// (TSC, ns, ns per tick << 32).
    anchor: crate::seqlock::Seq3,
    /// The anchoring thread's state, held by whoever set `busy`.
    busy: std::sync::atomic::AtomicBool,
    base_tsc: std::sync::atomic::AtomicU64,
    base_ns: std::sync::atomic::AtomicU64,
    mult: std::sync::atomic::AtomicU64,
    /// 0: not checked yet, 1: in use, 2: off for this process.
    state: std::sync::atomic::AtomicU64,
}

/// What one anchoring did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchored {
    /// Still measuring the rate, or another thread is anchoring.
    Waiting,
    /// A new anchor is published.
    Published,
    /// The TSC is not used (and why): said once, when it is switched off.
    Off(&'static str),
    /// Off since an earlier call (or never on).
    StaysOff,
}

impl TscClock {
    pub const fn new() -> TscClock {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        TscClock {
            anchor: crate::seqlock::Seq3::new(),
            busy: AtomicBool::new(false),
            base_tsc: AtomicU64::new(0),
            base_ns: AtomicU64::new(0),
            mult: AtomicU64::new(0),
            state: AtomicU64::new(0),
        }
    }

    /// CLOCK_MONOTONIC in ns (see the type's documentation).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self.anchor.read() {
            Some(a) => from_anchor(a, tsc()).unwrap_or_else(monotonic_ns),
            None => monotonic_ns(),
        }
    }

    /// Samples the TSC and the kernel's clock together and publishes a new
    /// anchor (from one thread every few ms; a racing call waits its turn
    /// by returning).
    pub fn anchor(&self) -> Anchored {
        use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
        if self.state.load(Relaxed) == 2 {
            return Anchored::StaysOff;
        }
        if self.busy.swap(true, Acquire) {
            return Anchored::Waiting;
        }
        let out = self.anchor_locked();
        self.busy.store(false, Release);
        out
    }

    fn anchor_locked(&self) -> Anchored {
        use std::sync::atomic::Ordering::Relaxed;
        if self.state.load(Relaxed) == 0 {
            if let Err(why) = usable() {
                self.state.store(2, Relaxed);
                return Anchored::Off(why);
            }
            self.state.store(1, Relaxed);
        }
        let (t, ns, width) = sample();
        if width > MAX_SAMPLE_TICKS {
            return Anchored::Waiting;
        }
        let mut cal = Cal {
            base_tsc: self.base_tsc.load(Relaxed),
            base_ns: self.base_ns.load(Relaxed),
            mult: self.mult.load(Relaxed),
        };
        let step = cal.step(t, ns, self.anchor.read());
        self.base_tsc.store(cal.base_tsc, Relaxed);
        self.base_ns.store(cal.base_ns, Relaxed);
        self.mult.store(cal.mult, Relaxed);
        match step {
            Step::Hold => Anchored::Waiting,
            Step::Publish(a) => {
                self.anchor.write(a);
                Anchored::Published
            }
            Step::Off(why) => {
                self.anchor.withdraw();
                self.state.store(2, Relaxed);
                Anchored::Off(why)
            }
        }
    }

    /// In a fork child: an anchoring the parent's thread had under way is
    /// over (that thread is gone). Atomics only.
    pub fn forked(&self) {
        self.busy.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether reads convert from the TSC right now (tests, diagnostics).
    pub fn in_use(&self) -> bool {
        self.anchor
            .read()
            .is_some_and(|a| from_anchor(a, tsc()).is_some())
    }
}

impl Default for TscClock {
    fn default() -> TscClock {
        TscClock::new()
    }
}

/// The time at `t` ticks from an anchor, if the anchor is not stale.
#[inline]
fn from_anchor([t0, n0, mult]: [u64; 3], t: u64) -> Option<u64> {
    // A TSC behind the anchor wraps to a huge distance: stale.
    let d = t.wrapping_sub(t0);
    if d >= STALE_TICKS {
        return None;
    }
    let dn = ((d as u128 * mult as u128) >> 32) as u64;
    (dn <= STALE_NS).then(|| n0.saturating_add(dn))
}

/// Calibration: the rate's base sample and the rate (ns per tick << 32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cal {
    base_tsc: u64,
    base_ns: u64,
    mult: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Hold,
    Publish([u64; 3]),
    Off(&'static str),
}

impl Cal {
    /// One sample (`t` ticks at `ns`) given what is published now.
    fn step(&mut self, t: u64, ns: u64, published: Option<[u64; 3]>) -> Step {
        if let Some(a) = published {
            // Only an anchor readers still use is judged (a process that
            // was stopped for a minute comes back to a stale one).
            if let Some(p) = from_anchor(a, t) {
                if p.abs_diff(ns) > MAX_ERROR_NS {
                    return Step::Off("the TSC drifted from CLOCK_MONOTONIC");
                }
            } else if t < a[0] && ns.saturating_sub(a[1]) < STALE_NS {
                return Step::Off("the TSC went back");
            }
        }
        if self.base_ns == 0 || t <= self.base_tsc || ns <= self.base_ns {
            // The first sample, or a TSC behind the base: measure afresh.
            *self = Cal {
                base_tsc: t,
                base_ns: ns,
                mult: if t <= self.base_tsc { 0 } else { self.mult },
            };
            return Step::Hold;
        }
        let span = ns - self.base_ns;
        if self.mult == 0 && span < FIRST_RATE_NS {
            return Step::Hold;
        }
        if self.mult == 0 || span >= RATE_NS {
            let m = (u128::from(span) << 32) / u128::from(t - self.base_tsc);
            // 64 GHz to 100 MHz: anything else is not a TSC read right.
            if !(1u128 << 26..=10u128 << 32).contains(&m) {
                return Step::Off("the TSC's rate is out of range");
            }
            let old = u128::from(self.mult);
            if old != 0 && m.abs_diff(old) * 1_000_000 > old * MAX_RATE_CHANGE_PPM {
                return Step::Off("the TSC's rate changed");
            }
            self.mult = m as u64;
            self.base_tsc = t;
            self.base_ns = ns;
        }
        Step::Publish([t, ns, self.mult])
    }
}

/// Whether this process may read the time from the TSC: x86-64, and the
/// kernel keeps CLOCK_MONOTONIC on the TSC (it switches away from a TSC it
/// finds unstable or unsynchronized across CPUs).
fn usable() -> Result<(), &'static str> {
    if !cfg!(target_arch = "x86_64") {
        return Err("not x86-64");
    }
    match std::fs::read_to_string(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
    ) {
        Ok(s) if s.trim() == "tsc" => Ok(()),
        Ok(_) => Err("the kernel's clocksource is not the TSC"),
        Err(_) => Err("the kernel's clocksource cannot be read"),
    }
}

/// The TSC and CLOCK_MONOTONIC read together: the pair of three tries whose
/// two TSC reads around the kernel's clock are closest (one not
/// interrupted), the TSC taken at their middle, and how far apart those
/// two reads were.
fn sample() -> (u64, u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..3 {
        let a = tsc();
        let ns = monotonic_ns();
        let b = tsc();
        let w = b.wrapping_sub(a);
        if w < best.0 {
            best = (w, a.wrapping_add(w / 2), ns);
        }
    }
    (best.1, best.2, best.0)
}

/// The time-stamp counter (0 elsewhere than x86-64, where [`usable`] says
/// no and nothing is published).
#[inline]
fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` reads a counter every x86-64 CPU has; it takes
        // no pointer and has no precondition (a kernel that forbade it
        // with CR4.TSD would fault `clock_gettime`'s vDSO as well).
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GHZ3: u64 = (1u64 << 32) / 3; // 1/3 ns per tick

    #[test]
    fn an_anchor_converts_ticks_and_goes_stale() {
        let a = [1_000, 5_000_000, GHZ3];
        assert_eq!(from_anchor(a, 1_000), Some(5_000_000));
        assert_eq!(from_anchor(a, 1_000 + 3_000), Some(5_000_000 + 999));
        assert_eq!(
            from_anchor(a, 1_000 + 300_000_000 - 3),
            Some(5_000_000 + 99_999_998)
        );
        assert_eq!(from_anchor(a, 1_000 + 301_000_000), None, "past 100 ms");
        assert_eq!(from_anchor(a, 999), None, "a TSC behind the anchor");
        assert_eq!(from_anchor(a, u64::MAX), None);
    }

    /// A 3 GHz TSC against the kernel's clock, sampled every 10 ms.
    fn run(cal: &mut Cal, published: &mut Option<[u64; 3]>, t: u64, ns: u64) -> Step {
        let s = cal.step(t, ns, *published);
        if let Step::Publish(a) = s {
            *published = Some(a);
        }
        s
    }

    #[test]
    fn the_rate_is_measured_before_anything_is_published_then_tracked() {
        let (mut cal, mut p) = (Cal::default(), None);
        let at = |ms: u64| (1_000_000 + ms * 3_000_000, 7_000_000_000 + ms * 1_000_000);
        let (t, ns) = at(0);
        assert_eq!(run(&mut cal, &mut p, t, ns), Step::Hold);
        let (t, ns) = at(10);
        assert_eq!(
            run(&mut cal, &mut p, t, ns),
            Step::Hold,
            "10 ms is too short a span"
        );
        let (t, ns) = at(20);
        assert_eq!(run(&mut cal, &mut p, t, ns), Step::Publish([t, ns, GHZ3]));
        for ms in (30..2_000).step_by(10) {
            let (t, ns) = at(ms);
            assert!(matches!(run(&mut cal, &mut p, t, ns), Step::Publish(_)));
            // Between anchors the conversion matches the kernel's clock.
            let (t2, ns2) = at(ms + 7);
            assert!(
                from_anchor(p.unwrap(), t2).unwrap().abs_diff(ns2) <= 1,
                "at {ms} ms"
            );
        }
    }

    #[test]
    fn a_slewed_kernel_clock_is_followed_within_the_bound() {
        let (mut cal, mut p) = (Cal::default(), None);
        // CLOCK_MONOTONIC runs 500 ppm fast against the TSC (NTP's most).
        for ms in (0..3_000u64).step_by(10) {
            let t = ms * 3_000_000;
            let ns = 1_000_000 + ms * 1_000_000 + ms * 500;
            let s = run(&mut cal, &mut p, t + 1, ns);
            assert!(!matches!(s, Step::Off(_)), "at {ms}: {s:?}");
            if let Some(a) = p {
                let (t2, ns2) = (t + 15_000_000, ns + 5_000_000 + 2_500);
                let err = from_anchor(a, t2).unwrap().abs_diff(ns2);
                assert!(err < 100, "{err} ns off at {ms} ms");
            }
        }
    }

    #[test]
    fn a_jump_or_a_rate_change_switches_the_tsc_off() {
        let mut p = None;
        let mut cal = Cal::default();
        for ms in (0..500u64).step_by(10) {
            run(&mut cal, &mut p, 1 + ms * 3_000_000, 1 + ms * 1_000_000);
        }
        // A migration: the TSC jumps ahead by a second's worth.
        let (mut c2, p2) = (cal, p);
        let s = c2.step(1 + 500 * 3_000_000 + 3_000_000_000, 1 + 500 * 1_000_000, p2);
        assert!(
            matches!(s, Step::Publish(_)),
            "a stale-far anchor is not judged: {s:?}"
        );
        let s = cal.step(1 + 500 * 3_000_000 + 300_000, 1 + 500 * 1_000_000, p);
        assert_eq!(s, Step::Off("the TSC drifted from CLOCK_MONOTONIC"));
        // A TSC behind a fresh anchor.
        let s = cal.step(1 + 400 * 3_000_000, 1 + 500 * 1_000_000 + 1_000, p);
        assert_eq!(s, Step::Off("the TSC went back"));
        // The rate moves by 1 %: the next re-measure refuses it.
        let (mut cal, mut p) = (Cal::default(), None);
        let mut last = Step::Hold;
        for ms in (0..1_000u64).step_by(10) {
            let t = if ms <= 300 {
                ms * 3_000_000
            } else {
                900_000_000 + (ms - 300) * 2_970_000
            };
            let c = cal;
            last = cal.step(t + 1, 1 + ms * 1_000_000, None);
            if let Step::Publish(a) = last {
                p = Some(a);
            } else if matches!(last, Step::Off(_)) {
                assert_ne!(c.mult, 0);
                break;
            }
        }
        assert!(p.is_some());
        assert_eq!(last, Step::Off("the TSC's rate changed"));
    }

    #[test]
    fn the_real_clock_stays_within_the_bound_of_the_kernels() {
        let c = TscClock::new();
        let first = c.now_ns();
        assert!(
            first.abs_diff(monotonic_ns()) < 1_000_000,
            "before any anchor: the kernel's"
        );
        // The rate needs 20 ms; a loaded machine may stretch that (5 s).
        let t0 = std::time::Instant::now();
        let mut last = Anchored::Waiting;
        while t0.elapsed() < std::time::Duration::from_secs(5) {
            last = c.anchor();
            if last != Anchored::Waiting {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        match last {
            _ if usable().is_ok() => {
                assert_eq!(last, Anchored::Published, "a TSC clocksource is used");
                assert!(c.in_use());
                // Reads between the kernel's: within the bound (20 µs)
                // plus the time between the reads. Only triples read
                // within 2 µs count (not interrupted); a thousand of them.
                let (mut worst, mut counted, mut tsc_reads) = (0, 0, 0);
                let t1 = std::time::Instant::now();
                while counted < 1_000 && t1.elapsed() < std::time::Duration::from_secs(5) {
                    if c.anchor() == Anchored::Published || c.in_use() {
                        tsc_reads += 1;
                    }
                    for _ in 0..100 {
                        let a = monotonic_ns();
                        let b = c.now_ns();
                        let z = monotonic_ns();
                        if z - a < 2_000 {
                            worst = worst.max(a.saturating_sub(b)).max(b.saturating_sub(z));
                            counted += 1;
                        }
                    }
                }
                assert!(
                    counted >= 1_000,
                    "only {counted} uninterrupted reads in 5 s"
                );
                assert!(tsc_reads > 0, "the anchor was never in use");
                assert!(
                    worst < MAX_ERROR_NS,
                    "{worst} ns outside the kernel's reads"
                );
            }
            Anchored::Off(why) => {
                assert!(!why.is_empty());
                assert!(!c.in_use());
            }
            other => panic!("no anchor after 5 s: {other:?}"),
        }
        assert!(c.now_ns() >= first);
    }
}
