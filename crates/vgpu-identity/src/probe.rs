//! NVML probe fallback: learn the host PID by an experiment.
//!
//! Snapshot the device's NVML process list, retain the primary context,
//! snapshot again, and take the PID that appeared. Two processes probing at
//! once would each see the other's PID appear, so probes are serialized
//! node-wide by `flock` on a file in a node-shared lock directory; the kernel
//! drops the lock when its holder dies, so a SIGKILLed prober never blocks
//! the others. Exactly one new candidate is accepted; zero or several mean
//! "retry", and when attempts or time run out the probe fails — it never
//! guesses.
//!
//! The interposer implements [`ProbeDriver`] over the real (or simulated)
//! NVML and CUDA calls. Caveat: a process that already holds a primary
//! context on the device is already in the first snapshot, so no new PID can
//! appear; the probe then reports [`ProbeError::NoCandidate`] rather than
//! guess. Run it before the application's first context, or use a tier that
//! needs no experiment.
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::telemetry::FailureCode;

/// Default lock file: one per node, in a directory mounted into every
/// container (HAMi's convention is `/tmp/vgpulock`).
pub const DEFAULT_LOCK_PATH: &str = "/tmp/vgpulock/hostpid.lock";

/// The driver call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverCall {
    /// `nvmlDeviceGetComputeRunningProcesses` (or equivalent).
    NvmlPids,
    /// `cuDevicePrimaryCtxRetain`.
    RetainPrimary,
    /// `cuDevicePrimaryCtxRelease`.
    ReleasePrimary,
}

impl std::fmt::Display for DriverCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DriverCall::NvmlPids => "NVML process list",
            DriverCall::RetainPrimary => "primary context retain",
            DriverCall::ReleasePrimary => "primary context release",
        })
    }
}

/// A failed driver call with the driver's own result code
/// (`nvmlReturn_t` / `CUresult` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed with driver code {code}")]
pub struct DriverError {
    /// Which call.
    pub call: DriverCall,
    /// The raw result code.
    pub code: i32,
}

/// What the probe needs from the drivers; implemented by the interposer
/// (calling the real functions, not its own hooks) and by test fakes.
pub trait ProbeDriver {
    /// Host PIDs of the processes NVML lists on `device` (compute and
    /// graphics).
    fn nvml_pids(&mut self, device: u32) -> Result<Vec<u32>, DriverError>;
    /// Retains the primary context of CUDA device `device`.
    fn retain_primary(&mut self, device: u32) -> Result<(), DriverError>;
    /// Releases what [`ProbeDriver::retain_primary`] retained.
    fn release_primary(&mut self, device: u32) -> Result<(), DriverError>;
}

/// Probe settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOptions {
    /// The node-wide lock file (created if missing).
    pub lock_path: PathBuf,
    /// Device index for both NVML and CUDA (the caller maps indices).
    pub device: u32,
    /// Most snapshot/retain/snapshot rounds.
    pub max_attempts: u32,
    /// Upper bound on the whole probe, lock wait included.
    pub total_budget: Duration,
    /// Pause between rounds (with the lock released, so others progress).
    pub retry_delay: Duration,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            lock_path: PathBuf::from(DEFAULT_LOCK_PATH),
            device: 0,
            max_attempts: 5,
            // 300 processes x ~60 ms each can queue on the lock.
            total_budget: Duration::from_secs(30),
            retry_delay: Duration::from_millis(20),
        }
    }
}

/// Why the probe gave no PID.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The lock file could not be created or opened.
    #[error("cannot open probe lock {path}")]
    LockOpen {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `flock` failed for a reason other than contention.
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A driver call failed.
    #[error("probe driver call failed")]
    Driver(#[source] DriverError),
    /// No new PID appeared in any round.
    #[error("no new PID appeared after retaining the primary context")]
    NoCandidate,
    /// Several new PIDs appeared (another process created a context).
    #[error("{candidates} new PIDs appeared; refusing to guess")]
    Ambiguous {
        /// How many appeared in the last round.
        candidates: usize,
    },
    /// The total budget ran out (waiting for the lock or between rounds).
    #[error("probe budget exhausted")]
    Timeout,
}

impl ProbeError {
    /// Stable telemetry code.
    pub fn failure_code(&self) -> FailureCode {
        match self {
            ProbeError::LockOpen { .. } | ProbeError::Lock { .. } => FailureCode::PROBE_LOCK,
            ProbeError::Driver(_) => FailureCode::PROBE_DRIVER,
            ProbeError::NoCandidate => FailureCode::PROBE_NO_CANDIDATE,
            ProbeError::Ambiguous { .. } => FailureCode::PROBE_AMBIGUOUS,
            ProbeError::Timeout => FailureCode::PROBE_TIMEOUT,
        }
    }
}

/// The outcome of [`probe_host_pid`], with its counts.
#[derive(Debug)]
pub struct ProbeReport {
    /// The host PID or why there is none.
    pub result: Result<u32, ProbeError>,
    /// Rounds run.
    pub attempts: u32,
    /// Time spent waiting for the lock, all rounds together.
    pub lock_wait: Duration,
    /// Total time.
    pub duration: Duration,
}

/// An exclusive `flock` held until drop (or until the process dies: the
/// kernel releases it with the last descriptor of the open file).
#[derive(Debug)]
pub struct ProbeLock {
    _fd: OwnedFd,
}

/// Opens (creating if needed) the lock file. The directory is created with
/// mode 1777 like `/tmp` when missing, and the file 0666, so processes of any
/// uid in any container can share it; `O_NOFOLLOW` refuses a planted symlink.
/// A read-only descriptor suffices for `flock`.
pub fn open_lock(path: &Path) -> Result<OwnedFd, ProbeError> {
    let open_err = |source: std::io::Error| ProbeError::LockOpen {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o1777)
                .create(dir)
            {
                // umask trimmed the mode; set it as meant (best effort: a
                // racing creator may own it).
                Ok(()) => {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(open_err(e)),
            }
        }
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o666),
    )
    .map_err(|e| open_err(e.into()))?;
    Ok(fd)
}

/// Takes the lock, polling with backoff until `deadline`.
pub fn lock_until(path: &Path, deadline: Instant) -> Result<ProbeLock, ProbeError> {
    let fd = open_lock(path)?;
    let mut pause = Duration::from_micros(500);
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(ProbeLock { _fd: fd }),
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {}
            Err(e) => {
                return Err(ProbeError::Lock {
                    path: path.to_owned(),
                    source: e.into(),
                })
            }
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(ProbeError::Timeout);
        };
        if left.is_zero() {
            return Err(ProbeError::Timeout);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// PIDs in `after` that are not in `before` (0 is never a candidate).
fn new_pids(before: &[u32], after: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = after
        .iter()
        .copied()
        .filter(|p| *p != 0 && !before.contains(p))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One round under the lock. The context is released even when the second
/// snapshot fails, so a failed round leaves no context behind.
fn round<D: ProbeDriver + ?Sized>(driver: &mut D, device: u32) -> Result<Vec<u32>, ProbeError> {
    let before = driver.nvml_pids(device).map_err(ProbeError::Driver)?;
    driver.retain_primary(device).map_err(ProbeError::Driver)?;
    let after = driver.nvml_pids(device);
    let released = driver.release_primary(device);
    let after = after.map_err(ProbeError::Driver)?;
    released.map_err(ProbeError::Driver)?;
    Ok(new_pids(&before, &after))
}

/// Runs the probe: up to `max_attempts` rounds, each under the node-wide
/// lock, within `total_budget`. Driver failures end the probe at once (the
/// caller retries later with backoff); ambiguity and absence are retried.
pub fn probe_host_pid<D: ProbeDriver + ?Sized>(driver: &mut D, opts: &ProbeOptions) -> ProbeReport {
    let start = Instant::now();
    // A budget too large to add is as good as a day; never panic here.
    let deadline = start
        .checked_add(opts.total_budget)
        .unwrap_or(start + Duration::from_secs(86_400));
    let mut attempts = 0;
    let mut lock_wait = Duration::ZERO;
    let mut last = ProbeError::NoCandidate;
    let result = loop {
        if attempts >= opts.max_attempts.max(1) {
            break Err(last);
        }
        let t = Instant::now();
        let lock = match lock_until(&opts.lock_path, deadline) {
            Ok(l) => l,
            Err(e) => {
                lock_wait += t.elapsed();
                break Err(e);
            }
        };
        lock_wait += t.elapsed();
        attempts += 1;
        let outcome = round(driver, opts.device);
        drop(lock);
        match outcome {
            Ok(c) if c.len() == 1 => break Ok(c[0]),
            Ok(c) if c.is_empty() => last = ProbeError::NoCandidate,
            Ok(c) => {
                last = ProbeError::Ambiguous {
                    candidates: c.len(),
                }
            }
            Err(e) => break Err(e),
        }
        if attempts < opts.max_attempts {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break Err(ProbeError::Timeout);
            };
            if left <= opts.retry_delay {
                break Err(ProbeError::Timeout);
            }
            std::thread::sleep(opts.retry_delay);
        }
    };
    ProbeReport {
        result,
        attempts,
        lock_wait,
        duration: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Replays scripted `after` snapshots; `before` is always `base`.
    struct Scripted {
        base: Vec<u32>,
        afters: VecDeque<Vec<u32>>,
        in_after: bool,
        retained: i32,
        calls: Vec<&'static str>,
        fail_retain: Option<i32>,
    }

    impl Scripted {
        fn new(base: &[u32], afters: &[&[u32]]) -> Self {
            Scripted {
                base: base.to_vec(),
                afters: afters.iter().map(|a| a.to_vec()).collect(),
                in_after: false,
                retained: 0,
                calls: vec![],
                fail_retain: None,
            }
        }
    }

    impl ProbeDriver for Scripted {
        fn nvml_pids(&mut self, _d: u32) -> Result<Vec<u32>, DriverError> {
            self.calls.push("pids");
            if self.in_after {
                self.in_after = false;
                Ok(self.afters.pop_front().unwrap_or_default())
            } else {
                Ok(self.base.clone())
            }
        }
        fn retain_primary(&mut self, _d: u32) -> Result<(), DriverError> {
            self.calls.push("retain");
            if let Some(code) = self.fail_retain {
                return Err(DriverError {
                    call: DriverCall::RetainPrimary,
                    code,
                });
            }
            self.retained += 1;
            self.in_after = true;
            Ok(())
        }
        fn release_primary(&mut self, _d: u32) -> Result<(), DriverError> {
            self.calls.push("release");
            self.retained -= 1;
            Ok(())
        }
    }

    fn opts(dir: &Path) -> ProbeOptions {
        ProbeOptions {
            lock_path: dir.join("locks/hostpid.lock"),
            max_attempts: 3,
            total_budget: Duration::from_secs(10),
            retry_delay: Duration::from_millis(1),
            ..ProbeOptions::default()
        }
    }

    #[test]
    fn exactly_one_new_pid_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Scripted::new(&[10, 11], &[&[10, 11, 4242]]);
        let r = probe_host_pid(&mut d, &opts(dir.path()));
        assert_eq!(r.result.unwrap(), 4242);
        assert_eq!(r.attempts, 1);
        assert_eq!(d.calls, ["pids", "retain", "pids", "release"]);
        assert_eq!(d.retained, 0);
        assert!(dir.path().join("locks/hostpid.lock").exists());
    }

    #[test]
    fn zero_then_two_then_one_retries_until_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Scripted::new(&[10], &[&[10], &[10, 7, 8], &[10, 9]]);
        let r = probe_host_pid(&mut d, &opts(dir.path()));
        assert_eq!(r.result.unwrap(), 9);
        assert_eq!(r.attempts, 3);
        assert_eq!(d.retained, 0);
    }

    #[test]
    fn never_guesses() {
        let dir = tempfile::tempdir().unwrap();
        let mut two = Scripted::new(&[], &[&[7, 8], &[7, 8], &[7, 8]]);
        let r = probe_host_pid(&mut two, &opts(dir.path()));
        assert!(
            matches!(r.result, Err(ProbeError::Ambiguous { candidates: 2 })),
            "{:?}",
            r.result
        );
        assert_eq!(r.attempts, 3);
        assert_eq!(
            r.result.unwrap_err().failure_code(),
            FailureCode::PROBE_AMBIGUOUS
        );

        let mut none = Scripted::new(&[5], &[&[5], &[5], &[5]]);
        let r = probe_host_pid(&mut none, &opts(dir.path()));
        assert!(
            matches!(r.result, Err(ProbeError::NoCandidate)),
            "{:?}",
            r.result
        );
        assert_eq!(r.attempts, 3);

        // A PID that vanished and a 0 entry are not candidates either.
        let mut odd = Scripted::new(&[5, 6], &[&[0, 6], &[0], &[0, 5]]);
        let r = probe_host_pid(&mut odd, &opts(dir.path()));
        assert!(
            matches!(r.result, Err(ProbeError::NoCandidate)),
            "{:?}",
            r.result
        );
    }

    #[test]
    fn driver_failure_stops_and_releases_nothing_unretained() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Scripted::new(&[], &[&[1]]);
        d.fail_retain = Some(999);
        let r = probe_host_pid(&mut d, &opts(dir.path()));
        match r.result {
            Err(ProbeError::Driver(DriverError {
                call: DriverCall::RetainPrimary,
                code: 999,
            })) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(d.calls, ["pids", "retain"]);
        assert_eq!(r.attempts, 1);
    }

    #[test]
    fn held_lock_times_out_then_frees() {
        let dir = tempfile::tempdir().unwrap();
        let o = ProbeOptions {
            total_budget: Duration::from_millis(30),
            ..opts(dir.path())
        };
        // Another open file description holding the flock blocks us.
        let held = lock_until(&o.lock_path, Instant::now() + Duration::from_secs(1)).unwrap();
        let mut d = Scripted::new(&[], &[&[3]]);
        let r = probe_host_pid(&mut d, &o);
        assert!(
            matches!(r.result, Err(ProbeError::Timeout)),
            "{:?}",
            r.result
        );
        assert_eq!(r.attempts, 0);
        assert!(d.calls.is_empty());
        drop(held);
        let r = probe_host_pid(&mut d, &o);
        assert_eq!(r.result.unwrap(), 3);
    }

    #[test]
    fn symlinked_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        let link = dir.path().join("hostpid.lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = open_lock(&link).unwrap_err();
        assert!(matches!(err, ProbeError::LockOpen { .. }), "{err}");
    }
}
