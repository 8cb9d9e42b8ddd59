//! The tier chain: same namespace, broker, trusted procfs, NVML probe, in
//! a configurable order (a subset disables the others); first that works
//! wins, and the [`Resolution`] says which, and why each other did not.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{self, ClientOptions};
use crate::probe::{self, ProbeDriver, ProbeOptions};
use crate::procfs;
use crate::telemetry::{FailureCode, IdentityTier, Telemetry, DEFAULT_ORDER};

/// Env var naming the broker socket.
pub const ENV_BROKER: &str = "LIBVGPU_HOSTPID_BROKER";
/// Env var naming a trusted host procfs mount.
pub const ENV_PROCFS: &str = "LIBVGPU_HOST_PROCFS";
/// Env var overriding the probe's lock file.
pub const ENV_LOCK: &str = "LIBVGPU_HOSTPID_LOCK";

/// Which tiers to try, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveConfig {
    /// The tiers in the order to try them ([`DEFAULT_ORDER`] by default);
    /// a tier not listed is never tried.
    pub order: Vec<IdentityTier>,
    /// Broker socket, if that tier is enabled.
    pub broker: Option<PathBuf>,
    /// Client options for the broker.
    pub broker_options: ClientOptions,
    /// Host procfs mount, if that tier is enabled.
    pub procfs: Option<PathBuf>,
    /// Probe settings; the probe runs only when a driver is passed.
    pub probe: ProbeOptions,
}

impl Default for ResolveConfig {
    fn default() -> ResolveConfig {
        ResolveConfig {
            order: DEFAULT_ORDER.to_vec(),
            broker: None,
            broker_options: ClientOptions::default(),
            procfs: None,
            probe: ProbeOptions::default(),
        }
    }
}

impl ResolveConfig {
    /// Reads `LIBVGPU_HOSTPID_BROKER`, `LIBVGPU_HOST_PROCFS` and
    /// `LIBVGPU_HOSTPID_LOCK`; empty values count as unset. (`libvgpu.so`
    /// reads its environment itself and fills the fields.)
    pub fn from_env() -> Self {
        let path = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let mut cfg = ResolveConfig {
            broker: path(ENV_BROKER),
            procfs: path(ENV_PROCFS),
            ..ResolveConfig::default()
        };
        if let Some(lock) = path(ENV_LOCK) {
            cfg.probe.lock_path = lock;
        }
        cfg
    }

    /// Without the "already in the initial PID namespace" shortcut (tests
    /// that must exercise the other tiers from the host namespace).
    pub fn without_same_namespace(mut self) -> Self {
        self.order.retain(|t| *t != IdentityTier::SameNamespace);
        self
    }
}

/// The tiers a resolution considered, in order, each with its failure
/// (`NONE`: it answered). A same-namespace check that does not apply is not
/// listed: it is not a failure, just not this process's tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tried {
    list: [(IdentityTier, FailureCode); 4],
    len: usize,
}

impl Tried {
    fn push(&mut self, t: IdentityTier, c: FailureCode) {
        if self.len < self.list.len() {
            self.list[self.len] = (t, c);
            self.len += 1;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (IdentityTier, FailureCode)> + '_ {
        self.list[..self.len].iter().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What [`resolve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// Tier, PID, attempts, last failure, duration.
    pub telemetry: Telemetry,
    /// Each tier's failure (broker, procfs, probe): `*_NOT_CONFIGURED` /
    /// `PROBE_NOT_AVAILABLE` when skipped, `NONE` when it succeeded, was
    /// not reached or is not in the order.
    pub tier_failures: [FailureCode; 3],
    /// Every tier considered, in order.
    pub tried: Tried,
}

impl Resolution {
    /// The host PID, if any tier produced one.
    pub fn host_pid(&self) -> Option<u32> {
        self.telemetry.host_pid
    }
}

/// Runs the tiers of `cfg.order`. `driver` enables the probe; pass `None`
/// where it must not run (e.g. the process already holds a context).
///
/// The same-namespace tier answers for a process in the initial PID
/// namespace (checked through `/proc/self/ns/pid`): its `getpid()` is the
/// host PID, zero attempts. When nothing could even be tried, the failure
/// is the last considered tier's reason (the default order: the probe's).
pub fn resolve<D: ProbeDriver + ?Sized>(
    cfg: &ResolveConfig,
    mut driver: Option<&mut D>,
) -> Resolution {
    let start = Instant::now();
    let mut t = Telemetry::default();
    let mut fails = [FailureCode::NONE; 3];
    let mut tried = Tried {
        list: [(IdentityTier::None, FailureCode::NONE); 4],
        len: 0,
    };
    for &tier in &cfg.order {
        let (slot, result): (usize, Result<u32, FailureCode>) = match tier {
            IdentityTier::SameNamespace => {
                if procfs::in_initial_pid_namespace(std::path::Path::new("/proc")).unwrap_or(false)
                {
                    tried.push(tier, FailureCode::NONE);
                    t.tier = tier;
                    t.host_pid = Some(std::process::id());
                    t.failure = FailureCode::NONE;
                    break;
                }
                continue;
            }
            IdentityTier::Broker => match &cfg.broker {
                None => (0, Err(FailureCode::BROKER_NOT_CONFIGURED)),
                Some(path) => {
                    t.attempts += 1;
                    t.tier = tier;
                    let r = client::query_broker_with(path, &cfg.broker_options);
                    (0, r.map_err(|e| e.failure_code()))
                }
            },
            IdentityTier::HostProcfs => match &cfg.procfs {
                None => (1, Err(FailureCode::PROCFS_NOT_CONFIGURED)),
                Some(mount) => {
                    t.attempts += 1;
                    t.tier = tier;
                    (
                        1,
                        procfs::host_pid_from_mount(mount).map_err(|e| e.failure_code()),
                    )
                }
            },
            IdentityTier::NvmlProbe => match driver.as_deref_mut() {
                None => (2, Err(FailureCode::PROBE_NOT_AVAILABLE)),
                Some(d) => {
                    t.tier = tier;
                    let r = probe::probe_host_pid(d, &cfg.probe);
                    // A probe that ran counts at least once, even when it
                    // could not start a round (the lock).
                    t.attempts += r.attempts.max(1);
                    (2, r.result.map_err(|e| e.failure_code()))
                }
            },
            IdentityTier::None => continue,
        };
        match result {
            Ok(pid) => {
                tried.push(tier, FailureCode::NONE);
                t.host_pid = Some(pid);
                t.failure = FailureCode::NONE;
                break;
            }
            Err(code) => {
                fails[slot] = code;
                tried.push(tier, code);
                if t.tier == tier {
                    // Actually tried (not merely unconfigured).
                    t.failure = code;
                }
            }
        }
    }
    if t.host_pid.is_none() && t.tier == IdentityTier::None {
        // Nothing could even be tried: the last considered tier says why.
        t.failure = tried
            .iter()
            .last()
            .map_or(FailureCode::PROBE_NOT_AVAILABLE, |(_, c)| c);
    }
    t.duration = start.elapsed();
    Resolution {
        telemetry: t,
        tier_failures: fails,
        tried,
    }
}

/// Delay before retry number `failures` (1-based) after every tier failed:
/// 1 s doubling to at most 60 s, so a failed identity keeps being retried
/// without hammering the node.
pub fn retry_backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(6);
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::DriverError;

    struct NoDriver;
    impl ProbeDriver for NoDriver {
        fn nvml_pids(&mut self, _: u32) -> Result<Vec<u32>, DriverError> {
            unreachable!()
        }
        fn retain_primary(&mut self, _: u32) -> Result<(), DriverError> {
            unreachable!()
        }
        fn release_primary(&mut self, _: u32) -> Result<(), DriverError> {
            unreachable!()
        }
    }

    fn no_shortcut() -> ResolveConfig {
        ResolveConfig::default().without_same_namespace()
    }

    #[test]
    fn host_namespace_needs_no_tier() {
        let r = resolve::<NoDriver>(&ResolveConfig::default(), None);
        if procfs::in_initial_pid_namespace(std::path::Path::new("/proc")).unwrap() {
            assert_eq!(r.telemetry.tier, IdentityTier::SameNamespace);
            assert_eq!(r.host_pid(), Some(std::process::id()));
            assert_eq!(r.telemetry.attempts, 0);
        } else {
            assert_ne!(r.telemetry.tier, IdentityTier::SameNamespace);
        }
    }

    #[test]
    fn nothing_configured_fails_visibly() {
        let r = resolve::<NoDriver>(&no_shortcut(), None);
        assert_eq!(r.host_pid(), None);
        assert_eq!(r.telemetry.tier, IdentityTier::None);
        assert_eq!(r.telemetry.failure, FailureCode::PROBE_NOT_AVAILABLE);
        assert_eq!(
            r.tier_failures,
            [
                FailureCode::BROKER_NOT_CONFIGURED,
                FailureCode::PROCFS_NOT_CONFIGURED,
                FailureCode::PROBE_NOT_AVAILABLE
            ]
        );
    }

    #[test]
    fn falls_through_missing_broker_to_procfs() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ResolveConfig {
            broker: Some(dir.path().join("absent.sock")),
            procfs: Some(dir.path().to_owned()),
            ..no_shortcut()
        };
        let r = resolve::<NoDriver>(&cfg, None);
        assert_eq!(r.host_pid(), None);
        assert_eq!(r.tier_failures[0], FailureCode::BROKER_MISSING);
        assert_eq!(r.tier_failures[1], FailureCode::PROCFS_READ);
        assert_eq!(r.telemetry.attempts, 2);
        assert_eq!(r.telemetry.tier, IdentityTier::HostProcfs);
        assert_eq!(r.telemetry.failure, FailureCode::PROCFS_READ);
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(retry_backoff(1), Duration::from_secs(1));
        assert_eq!(retry_backoff(2), Duration::from_secs(2));
        assert_eq!(retry_backoff(100), Duration::from_secs(60));
    }
}
