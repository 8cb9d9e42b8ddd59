//! The owned thread's work for the limiter, every control period (10 ms):
//! read finished markers (`Pacer::poll`), re-read the limits when the
//! region's limits generation moved, set each device's target from the
//! settings and what the measurement can trust, publish the state; every
//! 100 ms, as holder of the container's sampler lease, the NVML correction
//! and the container's utilization (limited or not); and, while a device
//! is paced, ask for host-PID identity (its own task resolves and retries
//! it, off the launch path).
//!
//! Works over the limiter's own drivers and clock (`Limiter::nvml`,
//! `Limiter::clock`) and its process's limits source (`Proc::limits`), so
//! the unit tests drive it over the fakes.
//!
//! Must never hold the limiter's job lock across anything but its own
//! calls (the launch path never takes it), nor log more than once per
//! change of state.
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::time::Duration;

use vgpu_cuda_abi::nvmlDevice_t;
use vgpu_limiter::{target, target_with, Corrector, Measurement, Settings, Window, PPM};
use vgpu_region::pacing::{release_lease, try_lease};
use vgpu_region::{DegradedReason, LimiterState, SlotId};

use super::lend::{DevLend, Pace};
use super::source;
use super::{current, set_slow, Limiter};
use crate::driver::NvmlDriver;
use crate::process::{self, Next, Periodic, Task};

/// The control period.
const PERIOD: Duration = Duration::from_millis(10);
/// The sampler's window.
const SAMPLE_NS: u64 = 100_000_000;
/// The sampler lease (renewed every window; a dead holder's expires).
const LEASE_MS: u64 = 500;
/// NVML that failed is tried again after this long.
const NVML_RETRY_NS: u64 = 2_000_000_000;

#[derive(Default)]
pub struct State {
    read_once: bool,
    /// The limits snapshot version the settings were computed from.
    seen_version: u64,
    settings: Vec<Settings>,
    sample_ns: u64,
    devs: Vec<DevJob>,
    nvml: NvmlState,
    logged_state: u32,
}

#[derive(Default)]
struct NvmlState {
    up: bool,
    failed_ns: u64,
}

#[derive(Default)]
struct DevJob {
    corr: Corrector,
    handle: Option<nvmlDevice_t>,
    /// Each slot's marker-measured time at the last window.
    prev: Vec<u64>,
    /// NVML did not answer the last window (per-process samples).
    nvml_failed: bool,
    /// Lending on the GPU's board.
    lend: DevLend,
}

struct LimiterJob;
static JOB: Periodic = Periodic::new(&LimiterJob);

impl Task for LimiterJob {
    fn run(&self, _now_ns: u64) -> Next {
        match current() {
            Some(l) => {
                tick(l);
                Next::After(PERIOD)
            }
            None => Next::After(Duration::from_millis(100)),
        }
    }
    fn name(&self) -> &'static str {
        "SM limiter"
    }
}

/// Schedules the limiter's task on the owned thread (first need: this
/// image's first launch).
pub fn start() {
    if process::scheduled(&JOB) {
        return;
    }
    if let Err(e) = process::schedule(&JOB) {
        // The gate still paces (markers are read on the launch path and
        // after synchronizes); live changes and the correction wait.
        crate::warn!("SM limiter: {e}; limits are re-read only at the next start of the thread");
    }
}

/// The first reading, on the thread that built the limiter, so the first
/// launch is already paced.
pub fn first_refresh(l: &Limiter) {
    refresh_now(l);
    set_slow(l);
}

/// Re-reads the limits (when due) and sets the targets now; the hot-path
/// word is the caller's to set.
pub fn refresh_now(l: &Limiter) {
    let mut st = l.job.lock().unwrap_or_else(|e| e.into_inner());
    refresh(l, &mut st, l.clock.now_ns());
}

/// At exit (after the owned thread stopped): the sampler lease goes back.
pub fn at_exit() {
    if let Some(l) = current() {
        if let Some(led) = &l.p.ledger {
            for d in &l.devs {
                release_lease(d.bucket.raw(), led.slot().0);
            }
        }
    }
}

fn tick(l: &Limiter) {
    if let Some(why) = l.clock.tick() {
        // Only slower, never less right: not worth a warning.
        crate::debug!("SM limiter: the clock is read through the kernel from now on ({why})");
    }
    let mut st = l.job.lock().unwrap_or_else(|e| e.into_inner());
    let now = l.clock.now_ns();
    refresh(l, &mut st, now);
    set_slow(l);
    for d in &l.devs {
        d.pacer.poll(&d.markers, &d.cells());
    }
    if now.saturating_sub(st.sample_ns) >= SAMPLE_NS {
        let window = if st.sample_ns == 0 {
            0
        } else {
            now - st.sample_ns
        };
        st.sample_ns = now;
        // The first call only primes the counters, so the first window
        // is usable one window later, not two (the correction settles
        // sooner after a start).
        sample(l, &mut st, now, window);
    }
    if l.devs.iter().any(|d| !d.pacer.target().is_pass()) {
        // Identity sharpens the correction; resolved and retried by its
        // own task on this thread, never on a launch.
        crate::identity::needed();
    }
}

/// Re-reads the limits when due and sets every device's target.
fn refresh(l: &Limiter, st: &mut State, now: u64) {
    // The limits source re-reads the file when the region's limits
    // generation moved (`vgpu limit`, `vgpu suspend` bump it).
    if let Some(led) = &l.p.ledger {
        crate::attach::refresh_limits_from(l.p.limits, led);
    }
    let snap = l.p.limits.snapshot();
    let version = snap.map_or(0, |s| s.version);
    if !st.read_once || version != st.seen_version {
        st.read_once = true;
        st.seen_version = version;
        st.settings = l
            .devs
            .iter()
            .map(|d| {
                let idx = l.p.ledger.as_ref().and_then(|led| led.index(d.ord));
                source::settings(l.p, snap, d.ord, idx, &d.uuid)
            })
            .collect();
    }
    if st.devs.len() != l.devs.len() {
        st.devs = (0..l.devs.len()).map(|_| DevJob::default()).collect();
    }
    let identity = crate::identity::host_pid().is_some();
    let mut shown: Option<(LimiterState, DegradedReason)> = None;
    for (i, d) in l.devs.iter().enumerate() {
        let s = st.settings.get(i).copied().unwrap_or_default();
        let recorded = d.markers.recorded.load(Ordering::Relaxed);
        let failures = d.markers.failures.load(Ordering::Relaxed);
        let markers = !(failures > 0 && recorded == 0);
        let nvml_ok = !st.devs[i].nvml_failed;
        let m = Measurement {
            markers,
            identity: identity && nvml_ok,
        };
        let t = match source::board(snap) {
            Some(b) => {
                let slot = match (&l.p.ledger, d.local) {
                    (Some(led), false) => Some(led.slot().0),
                    _ => None,
                };
                let now_pace = match d.pacer.target() {
                    t if t.is_pass() => PPM,
                    t => t.share_ppm,
                };
                let dj = &mut st.devs[i];
                match dj.lend.step(b, &d.uuid, &s, &d.bucket, slot, now_pace, now) {
                    Ok(p) => {
                        dj.lend.logged = false;
                        match p {
                            _ if !s.elastic() => target(&s, m),
                            Pace::At(share) => target_with(&s, m, Some(share)),
                            Pace::Unlimited => target_with(&s, m, None),
                        }
                    }
                    Err(e) => {
                        if !dj.lend.logged {
                            dj.lend.logged = true;
                            crate::warn!(
                                "SM lending on CUDA device {}: {e}; no lending until the board works: the SM limit is a fixed cap, no limit is none (as without a board)",
                                d.ord
                            );
                        }
                        target(&s, m)
                    }
                }
            }
            None => target(&s, m),
        };
        if t != d.pacer.target() {
            d.pacer.set_target(t);
        }
        let reason = match t.state {
            LimiterState::DegradedTiming => DegradedReason::NoEvents,
            LimiterState::DegradedIdentity if !identity => {
                if crate::identity::failed() {
                    DegradedReason::IdentityFailed
                } else {
                    DegradedReason::IdentityPending
                }
            }
            LimiterState::DegradedIdentity => DegradedReason::NvmlUnavailable,
            _ => DegradedReason::None,
        };
        d.bucket.publish(t.share_ppm, t.state.code());
        // The slot shows the first paced device's state (else device 0's).
        let replace = match shown {
            None => true,
            Some((s0, _)) => {
                !t.is_pass()
                    && matches!(
                        s0,
                        LimiterState::NotStarted | LimiterState::Unlimited | LimiterState::Disabled
                    )
            }
        };
        if replace {
            shown = Some((t.state, reason));
        }
        if d.local && !t.is_pass() && st.logged_state & LOCAL_LOGGED == 0 {
            st.logged_state |= LOCAL_LOGGED;
            crate::error!(
                "SM limit on CUDA device {}: no shared region for it; pacing this process alone on a private bucket (the limit holds per process, not per container)",
                d.ord
            );
        }
    }
    if let (Some((state, reason)), Some(d)) = (shown, l.devs.first()) {
        d.slot.set_state(state.code(), reason.code(), now);
        log_state(st, state, reason);
    }
}

const LOCAL_LOGGED: u32 = 1 << 31;

/// One log line per degraded state entered.
fn log_state(st: &mut State, state: LimiterState, reason: DegradedReason) {
    let bit = 1u32 << state.code().min(30);
    // Identity failures have their own one line (the identity module's);
    // the limiter says only what identity does not.
    let degraded = matches!(
        reason,
        DegradedReason::NoEvents | DegradedReason::NvmlUnavailable
    );
    if !degraded || st.logged_state & bit != 0 {
        return;
    }
    st.logged_state |= bit;
    let what = match reason {
        DegradedReason::NoEvents => "the driver refuses events: launches are charged by estimate",
        DegradedReason::NvmlUnavailable => {
            "NVML per-process samples are unavailable: markers pace uncorrected"
        }
        _ => "markers pace uncorrected",
    };
    crate::warn!(
        "SM limiter degraded ({}): {what}; the limit still holds",
        state.name()
    );
}

/// One sampler window: the correction and the container's utilization,
/// by the holder of each device's sampler lease.
fn sample(l: &Limiter, st: &mut State, now: u64, window_ns: u64) {
    let Some(led) = l.p.ledger.as_ref() else {
        return;
    };
    let region = led.region();
    let me = led.slot().0;
    let now_ms = now / 1_000_000;
    let slots = region.slot_count() as usize;
    let nvml_up = nvml_up(l.nvml, &mut st.nvml, now);
    for (i, d) in l.devs.iter().enumerate() {
        let dj = &mut st.devs[i];
        if !try_lease(d.bucket.raw(), me, now_ms, LEASE_MS) {
            dj.prev.clear();
            // Another process samples; its NVML state is not ours to judge.
            dj.nvml_failed = false;
            continue;
        }
        let fresh = dj.prev.len() != slots;
        if fresh {
            dj.prev = vec![0; slots];
        }
        let (mut all, mut known) = (0u64, 0u64);
        let mut pids = Vec::new();
        for s in 0..slots {
            let sid = SlotId(s as u32);
            let (m, _, _, _) = region.slot_pacing(sid).counters(d.idx);
            let prev = dj.prev[s];
            let delta = if m >= prev { m - prev } else { m };
            dj.prev[s] = m;
            let pid = region.slot(sid).host_pid();
            if pid != 0 {
                known += delta;
                pids.push(pid);
            }
            all += delta;
        }
        if fresh || window_ns == 0 {
            // The first window has no previous counters to subtract.
            continue;
        }
        if nvml_up && dj.handle.is_none() {
            dj.handle = CString::new(d.uuid.as_str())
                .ok()
                .and_then(|u| l.nvml.device_by_uuid(&u).ok());
        }
        let handle = dj.handle.filter(|_| nvml_up);
        let truth = handle.and_then(|h| truth_ns(l.nvml, h, &pids, window_ns));
        dj.nvml_failed = handle.is_none() || (!pids.is_empty() && truth.is_none());
        let busy = handle.and_then(|h| {
            l.nvml
                .utilization(h)
                .ok()
                .map(|u| u64::from(u.gpu.min(100)) * window_ns / 100)
        });
        let w = Window {
            window_ns,
            truth_ns: truth.filter(|_| !pids.is_empty()),
            markers_known_ns: known,
            markers_all_ns: all,
            device_busy_ns: busy,
            share_ppm: d.pacer.target().share_ppm,
        };
        let p = dj.corr.step(&w);
        if d.pacer.target().is_pass() {
            d.bucket.set_correction_ppm(PPM);
            d.bucket.set_rate_cap_ppm(PPM);
        } else {
            d.bucket.set_correction_ppm(p.correction_ppm);
            d.bucket.set_rate_cap_ppm(p.rate_cap_ppm);
        }
        d.bucket
            .set_utilization(p.util_ppm, p.source.code(), now, window_ns);
    }
}

fn nvml_up(nvml: &dyn NvmlDriver, n: &mut NvmlState, now: u64) -> bool {
    if n.up {
        return true;
    }
    if n.failed_ns != 0 && now.saturating_sub(n.failed_ns) < NVML_RETRY_NS {
        return false;
    }
    if nvml.init().is_success() {
        n.up = true;
    } else {
        n.failed_ns = now.max(1);
    }
    n.up
}

/// NVML's GPU time of `pids` over the last `window_ns` (per-process
/// samples newer than the window's start, each pid's mean smUtil).
fn truth_ns(nvml: &dyn NvmlDriver, h: nvmlDevice_t, pids: &[u32], window_ns: u64) -> Option<u64> {
    // NVML stamps its samples in wall-clock time.
    let since_us = vgpu_region::realtime_ns().saturating_sub(window_ns) / 1000;
    let samples = match nvml.process_utilization(h, since_us) {
        Ok(s) => s,
        Err(vgpu_cuda_abi::nvmlReturn_t::NVML_ERROR_NOT_FOUND) => Vec::new(),
        Err(_) => return None,
    };
    let mut total = 0u64;
    for &pid in pids {
        let (mut sum, mut n) = (0u64, 0u64);
        for s in samples.iter().filter(|s| s.pid == pid) {
            sum += u64::from(s.smUtil.min(100));
            n += 1;
        }
        if n > 0 {
            total += sum * window_ns / (100 * n);
        }
    }
    Some(total.min(window_ns))
}

/// Tests: one sampler window ending at the clock's now (after a
/// [`refresh_now`]).
#[cfg(test)]
pub fn sample_now(l: &Limiter, window_ns: u64) {
    let mut st = l.job.lock().unwrap_or_else(|e| e.into_inner());
    sample(l, &mut st, l.clock.now_ns(), window_ns);
}
