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
//! - otherwise the first limited launch (the launch gate).
//!
//! Tiers, first that works wins (`vgpu-identity` does each one; this module
//! decides order, timing, retries and what the slot says): same PID
//! namespace as the host (`getpid()`), broker, trusted procfs, NVML probe
//! (only while the process holds no context). `LIBVGPU_IDENTITY_TIERS`
//! forces an order/subset.
//!
//! Failure is never silent and never turns SM limiting off: the slot says
//! `Failed` with the reason and the attempts, one warning line is written,
//! and later limited launches retry with exponential backoff (1 s doubling to
//! 60 s); between retries a launch costs one atomic load and a clock read.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use vgpu_identity::client::ClientOptions;
use vgpu_identity::probe::{self, ProbeOptions};
use vgpu_identity::{procfs, FailureCode, Tier};
use vgpu_region::{IdentityState, IdentityTier, Phase};

use crate::state::Proc;

/// `lazy` (default) or `eager`.
pub const ENV_MODE: &str = "LIBVGPU_IDENTITY";
/// Comma-separated tiers in the order to try them (a subset is fine):
/// `same_namespace`, `broker`, `procfs`, `probe`.
pub const ENV_TIERS: &str = "LIBVGPU_IDENTITY_TIERS";

/// One identity tier, as `LIBVGPU_IDENTITY_TIERS` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierKind {
    SameNamespace,
    Broker,
    Procfs,
    Probe,
}

impl TierKind {
    pub fn parse(s: &str) -> Option<TierKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "same_namespace" | "same-namespace" | "ns" => Some(TierKind::SameNamespace),
            "broker" => Some(TierKind::Broker),
            "procfs" | "host_procfs" => Some(TierKind::Procfs),
            "probe" | "nvml_probe" => Some(TierKind::Probe),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TierKind::SameNamespace => "same_namespace",
            TierKind::Broker => "broker",
            TierKind::Procfs => "procfs",
            TierKind::Probe => "probe",
        }
    }
}

/// The default order: no experiment when a cheap answer exists.
pub const DEFAULT_TIERS: [TierKind; 4] = [
    TierKind::SameNamespace,
    TierKind::Broker,
    TierKind::Procfs,
    TierKind::Probe,
];

/// What the environment asks for, read once per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub eager: bool,
    pub tiers: Vec<TierKind>,
    pub broker: Option<PathBuf>,
    pub procfs: Option<PathBuf>,
    pub probe: ProbeOptions,
    /// Malformed values, one readable line each (logged once).
    pub problems: Vec<String>,
}

impl Settings {
    /// From a variable lookup (the process environment in the library).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Settings {
        let mut problems = Vec::new();
        let eager = match get(ENV_MODE).as_deref().map(str::trim) {
            None | Some("") | Some("lazy") => false,
            Some("eager") => true,
            Some(v) => {
                problems.push(format!("{ENV_MODE}={v:?} is not lazy or eager; using lazy"));
                false
            }
        };
        let tiers = match get(ENV_TIERS).filter(|v| !v.trim().is_empty()) {
            None => DEFAULT_TIERS.to_vec(),
            Some(v) => {
                let mut out = Vec::new();
                let mut bad = Vec::new();
                for part in v.split(',').filter(|p| !p.trim().is_empty()) {
                    match TierKind::parse(part) {
                        Some(t) if !out.contains(&t) => out.push(t),
                        Some(_) => {}
                        None => bad.push(part.trim().to_string()),
                    }
                }
                if !bad.is_empty() {
                    problems.push(format!(
                        "{ENV_TIERS}={v:?}: unknown tier(s) {} (known: same_namespace, broker, procfs, probe); {}",
                        bad.join(", "),
                        if out.is_empty() { "using the default order" } else { "ignored" }
                    ));
                }
                if out.is_empty() {
                    DEFAULT_TIERS.to_vec()
                } else {
                    out
                }
            }
        };
        let path = |k: &str| get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut probe = ProbeOptions::default();
        if let Some(lock) = path(vgpu_identity::resolve::ENV_LOCK) {
            probe.lock_path = lock;
        }
        Settings {
            eager,
            tiers,
            broker: path(vgpu_identity::resolve::ENV_BROKER),
            procfs: path(vgpu_identity::resolve::ENV_PROCFS),
            probe,
            problems,
        }
    }
}

fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| {
        let s = Settings::from_lookup(|k| std::env::var(k).ok());
        for p in &s.problems {
            crate::warn!("{p}");
        }
        if !crate::sys::at_fork_child(on_fork_child) {
            crate::warn!(
                "pthread_atfork failed; a forked child would report its parent's host PID"
            );
        }
        s
    })
}

// Process-wide state. STATE moves NotStarted -> Running -> Resolved/Failed,
// Failed -> Running again when a retry is due; only the thread that wins the
// CAS to Running resolves, the others never wait for it.
const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const RESOLVED: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// 0: not resolved yet.
static HOST_PID: AtomicU32 = AtomicU32::new(0);
/// Tier attempts over all resolutions of this process.
static ATTEMPTS: AtomicU32 = AtomicU32::new(0);
/// Failed resolutions (drives the backoff).
static FAILURES: AtomicU32 = AtomicU32::new(0);
/// CLOCK_MONOTONIC ns before which a failed identity is not retried.
static NEXT_RETRY_NS: AtomicU64 = AtomicU64::new(0);
/// This process has created (or is creating) a context: the probe can no
/// longer see itself appear.
static HOLDS_CONTEXT: AtomicBool = AtomicBool::new(false);
static FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn on_fork_child() {
    // Atomics only (see state::on_fork_child): the child is a new process
    // with its own host PID and no contexts.
    STATE.store(NOT_STARTED, Ordering::Release);
    HOST_PID.store(0, Ordering::Release);
    ATTEMPTS.store(0, Ordering::Relaxed);
    FAILURES.store(0, Ordering::Relaxed);
    NEXT_RETRY_NS.store(0, Ordering::Relaxed);
    HOLDS_CONTEXT.store(false, Ordering::Relaxed);
    FAILURE_LOGGED.store(false, Ordering::Relaxed);
}

/// The host PID if some tier has resolved it; never blocks.
pub fn host_pid() -> Option<u32> {
    match HOST_PID.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Records a resolved host PID (tests and future callers that learn it
/// another way).
pub fn set_host_pid(pid: u32) {
    HOST_PID.store(pid, Ordering::Release);
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

/// Post-init step of `cuInit` (called by `state::cu_init` after the real
/// `cuInit`). Lazy mode does nothing but say whether identity will be
/// needed; eager mode resolves here, between `IdentityEnter`/`IdentityExit`.
pub fn post_init(p: &Proc) {
    let s = settings();
    if s.eager {
        if STATE.load(Ordering::Acquire) == NOT_STARTED {
            resolve(p, Trigger::Eager, NOT_STARTED);
        }
    } else if !p.sm_limited && STATE.load(Ordering::Acquire) == NOT_STARTED {
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
    if HOLDS_CONTEXT.load(Ordering::Relaxed) {
        return;
    }
    before_first_context(dev);
}

#[cold]
fn before_first_context(dev: i32) {
    // Registers the fork handler before HOLDS_CONTEXT changes (a forked
    // child holds no context).
    let _ = settings();
    if let Some(p) = crate::state::attached() {
        if p.sm_limited && STATE.load(Ordering::Acquire) == NOT_STARTED {
            resolve(p, Trigger::FirstContext(dev.max(0) as u32), NOT_STARTED);
        }
    }
    HOLDS_CONTEXT.store(true, Ordering::Relaxed);
}

/// The launch gate's identity step (an SM limit is configured): nothing
/// once resolved or while another thread resolves; the first launch
/// resolves; after a failure, a retry when its backoff has passed.
#[inline]
pub fn on_limited_launch(p: &Proc) {
    match STATE.load(Ordering::Acquire) {
        RESOLVED | RUNNING => {}
        NOT_STARTED => resolve(p, Trigger::Launch, NOT_STARTED),
        _ => {
            if vgpu_region::monotonic_ns() >= NEXT_RETRY_NS.load(Ordering::Relaxed) {
                resolve(p, Trigger::Launch, FAILED);
            }
        }
    }
}

/// What one pass over the tiers found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The tier that answered, or the last one tried.
    pub tier: Tier,
    pub host_pid: Option<u32>,
    pub attempts: u32,
    /// The last tried tier's failure (`NONE` on success).
    pub failure: FailureCode,
    /// Each tier considered, with its failure (`NONE`: answered).
    pub tried: Vec<(TierKind, FailureCode)>,
    pub duration_ns: u64,
}

/// Runs the tiers of `s` in order. `probe` gives the driver for the probe
/// tier (`None`: not possible now, e.g. the process holds a context).
pub fn run_tiers(
    s: &Settings,
    mut probe_driver: Option<&mut dyn probe::ProbeDriver>,
    probe_device: u32,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        tier: Tier::NONE,
        host_pid: None,
        attempts: 0,
        failure: FailureCode::NONE,
        tried: Vec::new(),
        duration_ns: 0,
    };
    for &t in &s.tiers {
        let (tier, result): (Tier, Result<u32, FailureCode>) = match t {
            TierKind::SameNamespace => {
                // Not a failure when it does not apply: just not this tier.
                if procfs::in_initial_pid_namespace(Path::new("/proc")).unwrap_or(false) {
                    (Tier::SAME_NAMESPACE, Ok(std::process::id()))
                } else {
                    continue;
                }
            }
            TierKind::Broker => match &s.broker {
                None => {
                    out.tried.push((t, FailureCode::BROKER_NOT_CONFIGURED));
                    continue;
                }
                Some(path) => {
                    out.attempts += 1;
                    let r =
                        vgpu_identity::client::query_broker_with(path, &ClientOptions::default());
                    (Tier::BROKER, r.map_err(|e| e.failure_code()))
                }
            },
            TierKind::Procfs => match &s.procfs {
                None => {
                    out.tried.push((t, FailureCode::PROCFS_NOT_CONFIGURED));
                    continue;
                }
                Some(mount) => {
                    out.attempts += 1;
                    let r = procfs::host_pid_from_mount(mount);
                    (Tier::PROCFS, r.map_err(|e| e.failure_code()))
                }
            },
            TierKind::Probe => match probe_driver.as_deref_mut() {
                None => {
                    out.tried.push((t, FailureCode::PROBE_NOT_AVAILABLE));
                    continue;
                }
                Some(d) => {
                    let opts = ProbeOptions {
                        device: probe_device,
                        ..s.probe.clone()
                    };
                    let r = probe::probe_host_pid(d, &opts);
                    out.attempts += r.attempts.max(1);
                    (Tier::PROBE, r.result.map_err(|e| e.failure_code()))
                }
            },
        };
        out.tier = tier;
        match result {
            Ok(pid) => {
                out.tried.push((t, FailureCode::NONE));
                out.host_pid = Some(pid);
                out.failure = FailureCode::NONE;
                break;
            }
            Err(code) => {
                out.tried.push((t, code));
                out.failure = code;
            }
        }
    }
    if out.host_pid.is_none() && out.failure == FailureCode::NONE {
        // Nothing could even be tried: say why (the first tier's reason).
        out.failure = out
            .tried
            .first()
            .map_or(FailureCode::PROBE_NOT_AVAILABLE, |t| t.1);
    }
    out.duration_ns = start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
    out
}

fn region_tier(t: Tier) -> IdentityTier {
    match t {
        Tier::BROKER => IdentityTier::Broker,
        Tier::PROCFS => IdentityTier::HostProcfs,
        Tier::PROBE => IdentityTier::NvmlProbe,
        Tier::SAME_NAMESPACE => IdentityTier::SameNamespace,
        _ => IdentityTier::None,
    }
}

/// `broker: BROKER_MISSING (101), procfs: …` for the log line.
fn describe(tried: &[(TierKind, FailureCode)]) -> String {
    if tried.is_empty() {
        return "no tier applies".into();
    }
    tried
        .iter()
        .map(|(t, c)| format!("{}: {c}", t.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One resolution, by the thread that moves STATE from `from` to Running.
#[cold]
fn resolve(p: &Proc, trigger: Trigger, from: u8) {
    if STATE
        .compare_exchange(from, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let s = settings();
    let slot = p.ledger.as_ref().map(|l| l.region().slot(l.slot()));
    let before = ATTEMPTS.load(Ordering::Relaxed);
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
        _ if !HOLDS_CONTEXT.load(Ordering::Relaxed) => Some(0),
        _ => None,
    };
    let mut driver = probe_dev
        .filter(|_| s.tiers.contains(&TierKind::Probe))
        .and_then(|_| crate::probe_driver::RealDriver::new());
    let out = run_tiers(
        s,
        driver.as_mut().map(|d| d as &mut dyn probe::ProbeDriver),
        probe_dev.unwrap_or(0),
    );
    drop(driver);
    let attempts = ATTEMPTS.fetch_add(out.attempts, Ordering::Relaxed) + out.attempts;
    if let Some(sl) = &slot {
        let failed_tiers = out
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
            HOST_PID.store(pid, Ordering::Release);
            if let Some(sl) = &slot {
                sl.set_host_pid(pid);
                sl.set_identity(
                    region_tier(out.tier),
                    IdentityState::Resolved,
                    attempts,
                    0,
                    out.duration_ns,
                );
            }
            if FAILURES.load(Ordering::Relaxed) > 0 {
                crate::info!(
                    "host PID {pid} found by tier {} after {attempts} attempt(s)",
                    out.tier.name()
                );
            } else {
                crate::debug!(
                    "host PID {pid} found by tier {} in {} us",
                    out.tier.name(),
                    out.duration_ns / 1000
                );
            }
            STATE.store(RESOLVED, Ordering::Release);
        }
        None => {
            let n = FAILURES.fetch_add(1, Ordering::Relaxed) + 1;
            let wait = vgpu_identity::resolve::retry_backoff(n);
            NEXT_RETRY_NS.store(
                vgpu_region::monotonic_ns().saturating_add(wait.as_nanos() as u64),
                Ordering::Relaxed,
            );
            if let Some(sl) = &slot {
                sl.set_identity(
                    region_tier(out.tier),
                    IdentityState::Failed,
                    attempts,
                    u32::from(out.failure.0),
                    out.duration_ns,
                );
            }
            let what = describe(&out.tried);
            if !FAILURE_LOGGED.swap(true, Ordering::Relaxed) {
                crate::warn!(
                    "host PID unknown ({what}); the SM limit stays configured, pending identity; retrying on launches with backoff"
                );
            } else {
                crate::debug!("host PID still unknown after {attempts} attempt(s) ({what}); next try in {wait:?}");
            }
            STATE.store(FAILED, Ordering::Release);
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
    use std::collections::HashMap;

    fn settings_of(vars: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn tiers_order_subset_and_bad_names() {
        let s = settings_of(&[]);
        assert_eq!(s.tiers, DEFAULT_TIERS);
        assert!(!s.eager && s.problems.is_empty());
        let s = settings_of(&[(ENV_TIERS, "probe, broker,probe"), (ENV_MODE, "eager")]);
        assert_eq!(s.tiers, [TierKind::Probe, TierKind::Broker]);
        assert!(s.eager);
        let s = settings_of(&[(ENV_TIERS, "broker,warp"), (ENV_MODE, "soon")]);
        assert_eq!(s.tiers, [TierKind::Broker]);
        assert!(!s.eager);
        assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
        assert!(s.problems[0].contains("\"soon\""), "{:?}", s.problems);
        assert!(s.problems[1].contains("warp"), "{:?}", s.problems);
        let s = settings_of(&[(ENV_TIERS, "nonsense")]);
        assert_eq!(s.tiers, DEFAULT_TIERS);
        assert!(s.problems[0].contains("default order"));
    }

    #[test]
    fn forced_tiers_skip_the_namespace_shortcut_and_report_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings_of(&[
            (ENV_TIERS, "broker,procfs,probe"),
            (
                "LIBVGPU_HOSTPID_BROKER",
                dir.path().join("absent.sock").to_str().unwrap(),
            ),
        ]);
        let out = run_tiers(&s, None, 0);
        assert_eq!(out.host_pid, None);
        assert_eq!(out.attempts, 1);
        assert_eq!(out.tier, Tier::BROKER);
        assert_eq!(out.failure, FailureCode::BROKER_MISSING);
        assert_eq!(
            out.tried,
            [
                (TierKind::Broker, FailureCode::BROKER_MISSING),
                (TierKind::Procfs, FailureCode::PROCFS_NOT_CONFIGURED),
                (TierKind::Probe, FailureCode::PROBE_NOT_AVAILABLE),
            ]
        );
        let line = describe(&out.tried);
        assert!(line.contains("broker: BROKER_MISSING (101)"), "{line}");
    }

    #[test]
    fn nothing_configured_names_the_first_reason() {
        let s = settings_of(&[(ENV_TIERS, "procfs")]);
        let out = run_tiers(&s, None, 0);
        assert_eq!(out.host_pid, None);
        assert_eq!(out.attempts, 0);
        assert_eq!(out.failure, FailureCode::PROCFS_NOT_CONFIGURED);
    }

    #[test]
    fn procfs_tier_reads_the_mount() {
        // This test process's /proc: accepted only in the initial namespace.
        let s = settings_of(&[(ENV_TIERS, "procfs"), ("LIBVGPU_HOST_PROCFS", "/proc")]);
        let out = run_tiers(&s, None, 0);
        if procfs::in_initial_pid_namespace(Path::new("/proc")).unwrap() {
            assert_eq!(out.host_pid, Some(std::process::id()));
            assert_eq!(out.tier, Tier::PROCFS);
        } else {
            assert_eq!(out.failure, FailureCode::PROCFS_OWN_NAMESPACE);
        }
    }
}
