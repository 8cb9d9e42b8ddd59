//! Host-PID identity inside libvgpu.so (docs/design.md section 6).
//!
//! Memory limits need no host PID, so `cuInit` never waits for identity
//! (unless `LIBVGPU_IDENTITY=eager` asks for it, which the burst bench uses
//! to measure each tier). The SM limiter needs it, so identity resolves at
//! first need, once per process:
//!
//! - the first context this process creates (`cuCtxCreate*`, the first
//!   `cuDevicePrimaryCtxRetain`) when an SM limit is configured: the last
//!   moment the NVML probe can work, since a process that already holds a
//!   context is in the "before" snapshot and can never appear as new;
//! - otherwise its own task on the owned thread, scheduled by the limiter
//!   once a device is paced (never on the launch path).
//!
//! Tiers, first that works wins: same PID namespace as the host
//! (`getpid()`), broker, trusted procfs, NVML probe (only while the process
//! holds no context). `vgpu-identity` owns the chain and its order
//! (`LIBVGPU_IDENTITY_TIERS` forces an order/subset); this module decides
//! when it runs, the retries, and what the slot and the log say.
//!
//! Failure is never silent and never turns SM limiting off: the slot says
//! `Failed` with the reason and the attempts, one warning line is written,
//! and the identity task retries with exponential backoff (1 s doubling to
//! 60 s) while a device is paced; a launch never pays for it.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use vgpu_identity::probe::ProbeDriver;
use vgpu_identity::resolve::{Resolution, ResolveConfig};
use vgpu_identity::{tier_name, FailureCode, IdentityTier};
use vgpu_region::{IdentityState, Phase};

use crate::attach::Proc;
use crate::config;
use crate::process;

pub mod probe;

/// The chain's configuration from the environment's, for a probe on CUDA
/// device `probe_device`.
pub fn resolve_config(s: &config::Identity, probe_device: u32) -> ResolveConfig {
    let mut cfg = ResolveConfig {
        order: s.tiers.clone(),
        broker: s.broker.clone(),
        procfs: s.procfs.clone(),
        ..ResolveConfig::default()
    };
    cfg.probe = s.probe.clone();
    cfg.probe.device = probe_device;
    cfg
}

// STATE moves NotStarted -> Running -> Resolved/Failed, Failed -> Running
// again when a retry is due; only the thread that wins the CAS to Running
// resolves, the others never wait for it.
const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const RESOLVED: u8 = 2;
const FAILED: u8 = 3;

/// This process image's identity (a forked child is a new process with its
/// own host PID and no contexts: it gets a fresh one).
#[derive(Default)]
struct Ident {
    state: AtomicU8,
    /// 0: not resolved yet.
    host_pid: AtomicU32,
    /// Tier attempts over all resolutions of this process.
    attempts: AtomicU32,
    /// Failed resolutions (drives the backoff).
    failures: AtomicU32,
    /// CLOCK_MONOTONIC ns before which a failed identity is not retried.
    next_retry_ns: AtomicU64,
    /// This process has created (or is creating) a context: the probe can
    /// no longer see itself appear.
    holds_context: AtomicBool,
    failure_logged: AtomicBool,
}

static IDENT: process::PerImage<Ident> = process::PerImage::new();

/// The state if anything has touched identity in this image (never builds).
#[inline]
fn peek() -> Option<&'static Ident> {
    IDENT.get()
}

/// The state, made fresh for this image first if needed.
fn ident() -> Option<&'static Ident> {
    IDENT.get_or_build(|| Some(Ident::default()))
}

/// The host PID if some tier has resolved it; never blocks.
pub fn host_pid() -> Option<u32> {
    match peek()?.host_pid.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Whether the last resolution failed (every tier; retried with backoff).
pub fn failed() -> bool {
    peek().is_some_and(|s| s.state.load(Ordering::Acquire) == FAILED)
}

/// Records a resolved host PID (tests and future callers that learn it
/// another way).
pub fn set_host_pid(pid: u32) {
    if let Some(s) = ident() {
        s.host_pid.store(pid, Ordering::Release);
    }
}

fn state() -> u8 {
    peek().map_or(NOT_STARTED, |s| s.state.load(Ordering::Acquire))
}

/// Why identity is being resolved now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// `LIBVGPU_IDENTITY=eager`, inside `cuInit` (phase stamps).
    Eager,
    /// Before this process's first context on CUDA device `dev`.
    FirstContext(u32),
    /// A limited launch (first, or a due retry).
    Launch,
}

/// Post-init step of `cuInit` (called by `init::cu_init` after the real
/// `cuInit`). Lazy mode does nothing but say whether identity will be
/// needed; eager mode resolves here, between `IdentityEnter`/`IdentityExit`.
pub fn post_init(p: &Proc) {
    if p.cfg.identity.eager {
        if state() == NOT_STARTED {
            resolve(p, Trigger::Eager, NOT_STARTED);
        }
    } else if !p.sm_limited && state() == NOT_STARTED {
        if let Some(l) = &p.ledger {
            l.region().slot(l.slot()).set_identity(
                IdentityTier::None,
                IdentityState::NotNeeded,
                0,
                0,
                0,
            );
        }
    }
}

/// Called by the context-creating hooks before the real call, with the
/// CUDA ordinal the context is for. With an SM limit configured and
/// identity not started, resolves now: the probe still works here.
#[inline]
pub fn before_context(dev: i32) {
    if peek().is_some_and(|s| s.holds_context.load(Ordering::Relaxed)) {
        return;
    }
    before_first_context(dev);
}

#[cold]
fn before_first_context(dev: i32) {
    // Attaching here (`cuInit` normally does not): the hook attaches right
    // after anyway, and the identity of a limited process resolves before
    // its first context, while the probe still works.
    if let Some(p) = crate::attach::proc() {
        if p.sm_limited && state() == NOT_STARTED {
            resolve(p, Trigger::FirstContext(dev.max(0) as u32), NOT_STARTED);
        }
    }
    if let Some(s) = ident() {
        s.holds_context.store(true, Ordering::Relaxed);
    }
}

/// The limiter says identity is wanted (a device is paced): schedules the
/// identity task on the owned thread unless the host PID is known. The
/// task resolves, and after a failure retries when its backoff has passed;
/// nothing here runs on a launch.
#[inline]
pub fn needed() {
    if state() == RESOLVED || process::scheduled(&RETRY) {
        return;
    }
    if let Err(e) = process::schedule(&RETRY) {
        crate::debug!("identity task: {e}");
    }
}

/// How often the task looks while another thread resolves.
const BUSY_RECHECK: Duration = Duration::from_millis(100);

struct Retry;
static RETRY: process::Periodic = process::Periodic::new(&Retry);

impl process::Task for Retry {
    fn run(&self, now_ns: u64) -> process::Next {
        let Some(p) = crate::attach::attached() else {
            return process::Next::Stop;
        };
        let Some(s) = ident() else {
            return process::Next::Stop;
        };
        match s.state.load(Ordering::Acquire) {
            RESOLVED => return process::Next::Stop,
            RUNNING => return process::Next::After(BUSY_RECHECK),
            NOT_STARTED => resolve(p, Trigger::Launch, NOT_STARTED),
            _ => {
                if now_ns >= s.next_retry_ns.load(Ordering::Relaxed) {
                    resolve(p, Trigger::Launch, FAILED);
                }
            }
        }
        retry_after(s, vgpu_region::monotonic_ns())
    }
    fn name(&self) -> &'static str {
        "host-PID identity"
    }
}

/// When the task runs next after a round that left `s`.
fn retry_after(s: &Ident, now_ns: u64) -> process::Next {
    match s.state.load(Ordering::Acquire) {
        RESOLVED => process::Next::Stop,
        FAILED => {
            let at = s.next_retry_ns.load(Ordering::Relaxed);
            process::Next::After(Duration::from_nanos(at.saturating_sub(now_ns)))
        }
        _ => process::Next::After(BUSY_RECHECK),
    }
}

/// `broker: BROKER_MISSING (101), procfs: …` for the log line.
fn describe(r: &Resolution) -> String {
    if r.tried.is_empty() {
        return "no tier applies".into();
    }
    r.tried
        .iter()
        .map(|(t, c)| format!("{}: {c}", tier_name(t)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One resolution, by the thread that moves STATE from `from` to Running.
#[cold]
fn resolve(p: &Proc, trigger: Trigger, from: u8) {
    let Some(st) = ident() else { return };
    if st
        .state
        .compare_exchange(from, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let s = &p.cfg.identity;
    let slot = p.ledger.as_ref().map(|l| l.region().slot(l.slot()));
    let before = st.attempts.load(Ordering::Relaxed);
    if let Some(sl) = &slot {
        sl.set_identity(IdentityTier::None, IdentityState::Pending, before, 0, 0);
        if trigger == Trigger::Eager {
            sl.set_phase(Phase::IdentityEnter, vgpu_region::monotonic_ns());
        }
    }
    // The probe retains a primary context of its own; that only shows this
    // process as new in NVML while it holds no other context.
    let probe_dev = match trigger {
        Trigger::FirstContext(d) => Some(d),
        _ if !st.holds_context.load(Ordering::Relaxed) => Some(0),
        _ => None,
    };
    let mut driver = probe_dev
        .filter(|_| s.tiers.contains(&IdentityTier::NvmlProbe))
        .and_then(|_| probe::over(&crate::driver::REAL_CUDA, &crate::driver::REAL_NVML));
    let res = vgpu_identity::resolve::resolve(
        &resolve_config(s, probe_dev.unwrap_or(0)),
        driver.as_mut().map(|d| d as &mut dyn ProbeDriver),
    );
    drop(driver);
    let out = res.telemetry;
    let duration_ns = out.duration.as_nanos().min(u128::from(u64::MAX)) as u64;
    let attempts = st.attempts.fetch_add(out.attempts, Ordering::Relaxed) + out.attempts;
    if let Some(sl) = &slot {
        let failed_tiers = res
            .tried
            .iter()
            .filter(|(_, c)| *c != FailureCode::NONE)
            .count();
        for _ in 0..failed_tiers {
            sl.bump_fallback(vgpu_region::Fallback::IdentityTierFailed);
        }
    }
    match out.host_pid {
        Some(pid) => {
            st.host_pid.store(pid, Ordering::Release);
            if let Some(sl) = &slot {
                sl.set_host_pid(pid);
                sl.set_identity(out.tier, IdentityState::Resolved, attempts, 0, duration_ns);
            }
            if st.failures.load(Ordering::Relaxed) > 0 {
                crate::info!(
                    "host PID {pid} found by tier {} after {attempts} attempt(s)",
                    tier_name(out.tier)
                );
            } else {
                crate::debug!(
                    "host PID {pid} found by tier {} in {} us",
                    tier_name(out.tier),
                    duration_ns / 1000
                );
            }
            st.state.store(RESOLVED, Ordering::Release);
        }
        None => {
            let n = st.failures.fetch_add(1, Ordering::Relaxed) + 1;
            let wait = vgpu_identity::resolve::retry_backoff(n);
            st.next_retry_ns.store(
                vgpu_region::monotonic_ns().saturating_add(wait.as_nanos() as u64),
                Ordering::Relaxed,
            );
            if let Some(sl) = &slot {
                sl.set_identity(
                    out.tier,
                    IdentityState::Failed,
                    attempts,
                    u32::from(out.failure.0),
                    duration_ns,
                );
            }
            let what = describe(&res);
            if !st.failure_logged.swap(true, Ordering::Relaxed) {
                crate::warn!(
                    "host PID unknown ({what}); the SM limit stays configured and holds (markers, uncorrected); retrying with backoff off the launch path"
                );
            } else {
                crate::debug!("host PID still unknown after {attempts} attempt(s) ({what}); next try in {wait:?}");
            }
            st.state.store(FAILED, Ordering::Release);
        }
    }
    if trigger == Trigger::Eager {
        if let Some(sl) = &slot {
            sl.set_phase(Phase::IdentityExit, vgpu_region::monotonic_ns());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use vgpu_identity::procfs;

    fn identity_of(vars: &[(&str, &str)]) -> config::Identity {
        config::Config::from_vars(vars.iter().copied()).identity
    }

    fn run(s: &config::Identity) -> Resolution {
        vgpu_identity::resolve::resolve::<dyn ProbeDriver>(&resolve_config(s, 0), None)
    }

    #[test]
    fn forced_tiers_skip_the_namespace_shortcut_and_report_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let s = identity_of(&[
            (config::ENV_IDENTITY_TIERS, "broker,procfs,probe"),
            (
                "LIBVGPU_HOSTPID_BROKER",
                dir.path().join("absent.sock").to_str().unwrap(),
            ),
        ]);
        let out = run(&s);
        assert_eq!(out.host_pid(), None);
        assert_eq!(out.telemetry.attempts, 1);
        assert_eq!(out.telemetry.tier, IdentityTier::Broker);
        assert_eq!(out.telemetry.failure, FailureCode::BROKER_MISSING);
        assert_eq!(
            out.tried.iter().collect::<Vec<_>>(),
            [
                (IdentityTier::Broker, FailureCode::BROKER_MISSING),
                (IdentityTier::HostProcfs, FailureCode::PROCFS_NOT_CONFIGURED),
                (IdentityTier::NvmlProbe, FailureCode::PROBE_NOT_AVAILABLE),
            ]
        );
        let line = describe(&out);
        assert!(line.contains("broker: BROKER_MISSING (101)"), "{line}");
    }

    #[test]
    fn the_retry_task_runs_when_the_backoff_is_due_and_stops_once_resolved() {
        use process::Next;
        let s = Ident::default();
        s.state.store(FAILED, Ordering::SeqCst);
        s.next_retry_ns.store(5_000_000_000, Ordering::SeqCst);
        assert_eq!(
            retry_after(&s, 1_000_000_000),
            Next::After(Duration::from_secs(4))
        );
        // Overdue: at once.
        assert_eq!(retry_after(&s, 6_000_000_000), Next::After(Duration::ZERO));
        // Another thread resolving (the first context): look again soon.
        s.state.store(RUNNING, Ordering::SeqCst);
        assert_eq!(retry_after(&s, 0), Next::After(BUSY_RECHECK));
        s.state.store(RESOLVED, Ordering::SeqCst);
        assert_eq!(retry_after(&s, 0), Next::Stop);
    }

    #[test]
    fn nothing_configured_names_the_reason() {
        let s = identity_of(&[(config::ENV_IDENTITY_TIERS, "procfs")]);
        let out = run(&s);
        assert_eq!(out.host_pid(), None);
        assert_eq!(out.telemetry.attempts, 0);
        assert_eq!(out.telemetry.failure, FailureCode::PROCFS_NOT_CONFIGURED);
    }

    #[test]
    fn procfs_tier_reads_the_mount() {
        // This test process's /proc: accepted only in the initial namespace.
        let s = identity_of(&[
            (config::ENV_IDENTITY_TIERS, "procfs"),
            ("LIBVGPU_HOST_PROCFS", "/proc"),
        ]);
        let out = run(&s);
        if procfs::in_initial_pid_namespace(Path::new("/proc")).unwrap() {
            assert_eq!(out.host_pid(), Some(std::process::id()));
            assert_eq!(out.telemetry.tier, IdentityTier::HostProcfs);
        } else {
            assert_eq!(out.telemetry.failure, FailureCode::PROCFS_OWN_NAMESPACE);
        }
    }
}
