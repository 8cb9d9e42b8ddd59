//! The tier chain: broker, then trusted procfs, then the NVML probe; first
//! that works wins, and the [`Telemetry`] says which and why not.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{self, ClientOptions};
use crate::probe::{self, ProbeDriver, ProbeOptions};
use crate::procfs;
use crate::telemetry::{FailureCode, Telemetry, Tier};

/// Env var naming the broker socket (tier 1).
pub const ENV_BROKER: &str = "LIBVGPU_HOSTPID_BROKER";
/// Env var naming a trusted host procfs mount (tier 2).
pub const ENV_PROCFS: &str = "LIBVGPU_HOST_PROCFS";
/// Env var overriding the probe's lock file (tier 3).
pub const ENV_LOCK: &str = "LIBVGPU_HOSTPID_LOCK";

/// Which tiers to try.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolveConfig {
    /// Broker socket, if that tier is enabled.
    pub broker: Option<PathBuf>,
    /// Client options for the broker.
    pub broker_options: ClientOptions,
    /// Host procfs mount, if that tier is enabled.
    pub procfs: Option<PathBuf>,
    /// Probe settings; the probe runs only when a driver is passed.
    pub probe: ProbeOptions,
    /// Skip the "already in the initial PID namespace" shortcut (tests).
    pub skip_same_namespace: bool,
}

impl ResolveConfig {
    /// Reads `LIBVGPU_HOSTPID_BROKER`, `LIBVGPU_HOST_PROCFS` and
    /// `LIBVGPU_HOSTPID_LOCK`; empty values count as unset.
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
}

/// What [`resolve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// Tier, PID, attempts, last failure, duration.
    pub telemetry: Telemetry,
    /// Each tier's failure (index = [`Tier`] value − 1): `*_NOT_CONFIGURED`
    /// when skipped, `NONE` when it succeeded or was not reached.
    pub tier_failures: [FailureCode; 3],
}

impl Resolution {
    /// The host PID, if any tier produced one.
    pub fn host_pid(&self) -> Option<u32> {
        self.telemetry.host_pid
    }
}

/// Runs the tiers in order. `driver` enables the probe; pass `None` where
/// it must not run (e.g. no device is initialised yet).
///
/// First, a process that runs in the initial PID namespace (checked through
/// `/proc/self/ns/pid`) needs no tier: its `getpid()` is the host PID
/// ([`Tier::SAME_NAMESPACE`], zero attempts).
pub fn resolve<D: ProbeDriver + ?Sized>(cfg: &ResolveConfig, driver: Option<&mut D>) -> Resolution {
    let start = Instant::now();
    let mut t = Telemetry::default();
    let mut fails = [FailureCode::NONE; 3];
    let done = |mut t: Telemetry, fails, tier, pid| {
        t.tier = tier;
        t.host_pid = Some(pid);
        t.failure = FailureCode::NONE;
        t.duration = start.elapsed();
        Resolution {
            telemetry: t,
            tier_failures: fails,
        }
    };

    if !cfg.skip_same_namespace
        && procfs::in_initial_pid_namespace(std::path::Path::new("/proc")).unwrap_or(false)
    {
        return done(t, fails, Tier::SAME_NAMESPACE, std::process::id());
    }

    match &cfg.broker {
        Some(path) => {
            t.attempts += 1;
            t.tier = Tier::BROKER;
            match client::query_broker_with(path, &cfg.broker_options) {
                Ok(pid) => return done(t, fails, Tier::BROKER, pid),
                Err(e) => fails[0] = e.failure_code(),
            }
            t.failure = fails[0];
        }
        None => fails[0] = FailureCode::BROKER_NOT_CONFIGURED,
    }

    match &cfg.procfs {
        Some(mount) => {
            t.attempts += 1;
            t.tier = Tier::PROCFS;
            match procfs::host_pid_from_mount(mount) {
                Ok(pid) => return done(t, fails, Tier::PROCFS, pid),
                Err(e) => fails[1] = e.failure_code(),
            }
            t.failure = fails[1];
        }
        None => fails[1] = FailureCode::PROCFS_NOT_CONFIGURED,
    }

    match driver {
        Some(d) => {
            t.tier = Tier::PROBE;
            let r = probe::probe_host_pid(d, &cfg.probe);
            t.attempts += r.attempts;
            match r.result {
                Ok(pid) => return done(t, fails, Tier::PROBE, pid),
                Err(e) => fails[2] = e.failure_code(),
            }
            t.failure = fails[2];
        }
        None => fails[2] = FailureCode::PROBE_NOT_AVAILABLE,
    }

    if t.tier == Tier::NONE {
        // Nothing configured at all: report the probe's absence.
        t.failure = FailureCode::PROBE_NOT_AVAILABLE;
    }
    t.duration = start.elapsed();
    Resolution {
        telemetry: t,
        tier_failures: fails,
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
        ResolveConfig {
            skip_same_namespace: true,
            ..ResolveConfig::default()
        }
    }

    #[test]
    fn host_namespace_needs_no_tier() {
        let r = resolve::<NoDriver>(&ResolveConfig::default(), None);
        if procfs::in_initial_pid_namespace(std::path::Path::new("/proc")).unwrap() {
            assert_eq!(r.telemetry.tier, Tier::SAME_NAMESPACE);
            assert_eq!(r.host_pid(), Some(std::process::id()));
            assert_eq!(r.telemetry.attempts, 0);
        } else {
            assert_ne!(r.telemetry.tier, Tier::SAME_NAMESPACE);
        }
    }

    #[test]
    fn nothing_configured_fails_visibly() {
        let r = resolve::<NoDriver>(&no_shortcut(), None);
        assert_eq!(r.host_pid(), None);
        assert_eq!(r.telemetry.tier, Tier::NONE);
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
        assert_eq!(r.telemetry.tier, Tier::PROCFS);
        assert_eq!(r.telemetry.failure, FailureCode::PROCFS_READ);
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(retry_backoff(1), Duration::from_secs(1));
        assert_eq!(retry_backoff(2), Duration::from_secs(2));
        assert_eq!(retry_backoff(100), Duration::from_secs(60));
    }
}
