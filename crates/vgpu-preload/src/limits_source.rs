//! Where this process's limits come from (docs/limits.md, "What a process
//! enforces"): the operator's limits file when there is one, else the
//! HAMi-compatible environment; never the tenant-writable region alone.
//!
//! - [`LimitsSource::load`] (at attach, once per process image): locate the
//!   file (`/etc/vgpu/limits`, else `LIBVGPU_LIMITS_FILE`), read it (bounded,
//!   regular file only, never through a symlink), publish a [`Snapshot`].
//! - [`snapshot`]: the current one, one atomic load (`&'static`, never
//!   freed: a snapshot is replaced only when the file's content changes).
//! - [`refresh_if_changed`]`(region_generation)`: re-reads the file when
//!   the region's limits generation moved (`vgpu limit` bumps it after
//!   rewriting the file); a tenant bumping it only costs a re-read.
//! - A file that exists but cannot be used fails closed: the last good
//!   file's limits, else the environment's, else a zero memory budget;
//!   never unlimited, and said loudly.
//!
//! Must never block (a FIFO is refused by the reader), never hold a lock
//! (fork-safe: the published pointer and a "refreshing" flag, both
//! atomics), never call a driver.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use vgpu_region::limits::{self, DeviceLimit, Limits, LimitsError, Policy};

use crate::config::{Config, UtilPolicy};

/// Where the limits in force came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// No file anywhere: the environment (lowered by the region's recorded
    /// limit, see [`Snapshot::device`]).
    Env,
    /// The limits file at this path.
    File(PathBuf),
    /// A file is there but cannot be used: `last_good` is the last content
    /// that could (none at the first read); `why` the error.
    FailClosed { path: PathBuf, why: String },
}

/// The limits in force (immutable; replaced as a whole).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub origin: Origin,
    /// The file's content (the last good one when failing closed).
    pub file: Option<Limits>,
    /// The environment's limits by CUDA ordinal (`CUDA_DEVICE_MEMORY_LIMIT*`,
    /// `CUDA_DEVICE_SM_LIMIT*`), policy and priority.
    pub env: EnvLimits,
    /// Bumped at every published change (1 = the first load).
    pub version: u64,
    /// The file re-read at a refresh (also with `Origin::Env` when
    /// `LIBVGPU_LIMITS_FILE` names a file not written yet).
    pub path: Option<PathBuf>,
}

/// The environment half, copied out of [`Config`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvLimits {
    pub mem_all: u64,
    pub mem_dev: Vec<(u32, u64)>,
    pub sm_all: u32,
    pub sm_dev: Vec<(u32, u32)>,
    pub policy: UtilPolicy,
    pub priority: i32,
}

impl EnvLimits {
    pub fn from_config(c: &Config) -> EnvLimits {
        EnvLimits {
            mem_all: c.mem_all,
            mem_dev: c.mem_dev.iter().map(|(&k, &v)| (k, v)).collect(),
            sm_all: c.sm_all,
            sm_dev: c.sm_dev.iter().map(|(&k, &v)| (k, v)).collect(),
            policy: c.util_policy,
            priority: c.priority,
        }
    }

    /// The environment's limit for CUDA ordinal `ord` (`None` = none).
    pub fn device(&self, ord: Option<u32>) -> DeviceLimit {
        let mem = ord
            .and_then(|o| self.mem_dev.iter().find(|(k, _)| *k == o).map(|x| x.1))
            .unwrap_or(self.mem_all);
        let sm = ord
            .and_then(|o| self.sm_dev.iter().find(|(k, _)| *k == o).map(|x| x.1))
            .unwrap_or(self.sm_all);
        DeviceLimit {
            memory: (mem != 0).then_some(mem),
            sm: (sm != 0 && sm < 100).then_some(sm),
        }
    }

    fn any(&self) -> bool {
        self.mem_all != 0
            || (self.sm_all != 0 && self.sm_all < 100)
            || self.mem_dev.iter().any(|x| x.1 != 0)
            || self.sm_dev.iter().any(|x| x.1 != 0 && x.1 < 100)
    }
}

fn lower<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

impl Snapshot {
    /// What this process enforces on the physical device `uuid`, which it
    /// sees as CUDA ordinal `ord` (`None`: not visible to it), given the
    /// region's recorded display copy `region` (`None`: no region):
    ///
    /// - a usable file: the file's line, lowered (never raised) by the
    ///   environment; the region's copy does not count;
    /// - no file: the environment, lowered by the region's copy (so a
    ///   first process without a limit no longer leaves the container
    ///   unlimited for everyone after it);
    /// - failing closed: the last good file as above, else as if there
    ///   zero memory budget (`Some(0)`: nothing is admitted), whatever
    ///   the environment says.
    pub fn device(&self, ord: Option<u32>, uuid: &str, region: Option<DeviceLimit>) -> DeviceLimit {
        let env = self.env.device(ord);
        let no_file = || {
            let r = region.unwrap_or_default();
            DeviceLimit {
                memory: lower(env.memory, r.memory),
                sm: lower(env.sm, r.sm),
            }
        };
        match (&self.origin, &self.file) {
            (Origin::Env, _) => no_file(),
            (_, Some(f)) => limits::effective(Some(f.for_device(uuid)), env),
            (Origin::File(_), None) => limits::effective(Some(DeviceLimit::default()), env),
            (Origin::FailClosed { .. }, None) => {
                // No operator limit ever read: a zero memory budget. The
                // environment is the tenant's and may only lower a limit,
                // never stand in for the operator's (`1t` would be
                // unlimited), nor may the region.
                let mut d = no_file();
                d.memory = Some(0);
                d
            }
        }
    }

    /// Whether any limit applies at all (a region is then needed, and an
    /// unusable one means a private ledger rather than running unlimited).
    pub fn any_limit(&self) -> bool {
        match &self.origin {
            Origin::FailClosed { .. } => true,
            _ => {
                self.env.any()
                    || self.file.as_ref().is_some_and(|f| {
                        f.devices
                            .iter()
                            .any(|d| d.memory.is_some() || d.sm.is_some_and(|s| s < 100))
                    })
            }
        }
    }

    /// `policy`: the file's, else the environment's.
    pub fn policy(&self) -> Policy {
        match self.file.as_ref().and_then(|f| f.policy) {
            Some(p) => p,
            None => match self.env.policy {
                UtilPolicy::Default => Policy::Default,
                UtilPolicy::Force => Policy::Force,
                UtilPolicy::Disable => Policy::Disable,
            },
        }
    }

    /// `priority`: the file's, else the environment's.
    pub fn priority(&self) -> i32 {
        self.file
            .as_ref()
            .and_then(|f| f.priority)
            .unwrap_or(self.env.priority)
    }

    /// `suspended` (only a file can say so).
    pub fn suspended(&self) -> bool {
        self.file.as_ref().is_some_and(Limits::is_suspended)
    }

    /// Whether limits come from a file (usable or not).
    pub fn from_file(&self) -> bool {
        !matches!(self.origin, Origin::Env)
    }
}

/// The state behind [`snapshot`] (one static instance; tests make their own).
pub struct LimitsSource {
    current: AtomicPtr<Snapshot>,
    /// The region generation last acted on (`u64::MAX`: none yet).
    seen: AtomicU64,
    refreshing: AtomicBool,
}

/// The process's limits source.
pub static SOURCE: LimitsSource = LimitsSource::new();

/// The limits in force for this process (`None` before the first load).
pub fn snapshot() -> Option<&'static Snapshot> {
    SOURCE.snapshot()
}

/// See [`LimitsSource::refresh_if_changed`].
pub fn refresh_if_changed(region_generation: u64) -> bool {
    SOURCE.refresh_if_changed(region_generation)
}

/// See [`LimitsSource::settled`].
pub fn settled(region_generation: u64) -> bool {
    SOURCE.settled(region_generation)
}

/// The file to read for `cfg`: `/etc/vgpu/limits` when anything is there
/// or when the deployment requires it (see [`required`]), else
/// `LIBVGPU_LIMITS_FILE`. The flag says whether a missing file fails
/// closed (the operator's) or means "the environment until it appears"
/// (a file the process's own environment names).
pub fn locate(cfg: &Config) -> Option<(PathBuf, bool)> {
    if required(cfg) {
        return Some((cfg.limits_default.clone(), true));
    }
    limits::locate_with(
        &cfg.limits_default,
        cfg.limits_file.as_deref().map(|p| p.as_os_str()),
    )
    .map(|(p, src)| (p, src == limits::Source::Default))
}

/// Whether the deployment says a limits file must exist: the directory of
/// the operator's path (`/etc/vgpu`, the node agent's read-only mount) is
/// there. Then that file is the only source of limits: missing or unusable
/// means the last good limits or a zero budget, and `LIBVGPU_LIMITS_FILE`
/// (the tenant's own environment) is not consulted.
pub fn required(cfg: &Config) -> bool {
    limits::default_dir_present(&cfg.limits_default)
}

impl LimitsSource {
    pub const fn new() -> LimitsSource {
        LimitsSource {
            current: AtomicPtr::new(std::ptr::null_mut()),
            seen: AtomicU64::new(u64::MAX),
            refreshing: AtomicBool::new(false),
        }
    }

    pub fn snapshot(&self) -> Option<&'static Snapshot> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: `current` holds null or a leaked Box<Snapshot>, never freed.
        unsafe { p.as_ref() }
    }

    fn publish(&self, s: Snapshot) -> &'static Snapshot {
        let s: &'static Snapshot = Box::leak(Box::new(s));
        self.current
            .store(s as *const Snapshot as *mut Snapshot, Ordering::Release);
        s
    }

    /// Reads the limits afresh for a process image with configuration
    /// `cfg` (attach: a forked child that changed its environment gets its
    /// own), logs what wins, and publishes them.
    pub fn load(&self, cfg: &Config) -> &'static Snapshot {
        // A fork in the middle of a refresh leaves the flag set in the child.
        self.refreshing.store(false, Ordering::Release);
        self.seen.store(u64::MAX, Ordering::Release);
        let env = EnvLimits::from_config(cfg);
        let version = self.snapshot().map_or(1, |s| s.version + 1);
        let located = locate(cfg);
        let operators = located.as_ref().is_some_and(|l| l.1);
        let path = located.map(|l| l.0);
        let s = match path.as_ref().map(|p| (p, limits::read_limits_file(p))) {
            None => Snapshot {
                origin: Origin::Env,
                file: None,
                env,
                version,
                path,
            },
            // A file the environment names that does not exist (yet): the
            // environment, and the file once it appears. (The operator's
            // file missing where the deployment requires it fails closed.)
            Some((_, Err(e))) if e.is_not_found() && !operators => Snapshot {
                origin: Origin::Env,
                file: None,
                env,
                version,
                path,
            },
            Some((p, Ok(l))) => {
                crate::debug!("limits from {}", p.display());
                Snapshot {
                    origin: Origin::File(p.clone()),
                    file: Some(l),
                    env,
                    version,
                    path,
                }
            }
            Some((p, Err(e))) => {
                let p = p.clone();
                let s = Snapshot {
                    origin: Origin::FailClosed {
                        path: p.clone(),
                        why: crate::log::chain(&e),
                    },
                    file: None,
                    env,
                    version,
                    path,
                };
                fail_closed_line(&p, &e, &s, false);
                s
            }
        };
        self.publish(s)
    }

    /// Re-reads the file when `region_generation` differs from the last one
    /// seen; true when the limits in force changed. Before any `load`, or
    /// while another thread re-reads, nothing happens.
    pub fn refresh_if_changed(&self, region_generation: u64) -> bool {
        let seen = self.seen.load(Ordering::Acquire);
        if seen == region_generation {
            return false;
        }
        let Some(cur) = self.snapshot() else {
            return false;
        };
        if self
            .refreshing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        // The first generation seen may already be past the load's read:
        // re-read (an unchanged file publishes nothing).
        let changed = self.reread(cur);
        self.seen.store(region_generation, Ordering::Release);
        self.refreshing.store(false, Ordering::Release);
        changed
    }

    /// Whether the snapshot reflects generation `gen` (it was acted on and
    /// no re-read is under way): budgets computed now are current.
    pub fn settled(&self, gen: u64) -> bool {
        !self.refreshing.load(Ordering::Acquire) && self.seen.load(Ordering::Acquire) == gen
    }

    fn reread(&self, cur: &'static Snapshot) -> bool {
        let Some(path) = cur.path.clone() else {
            return false;
        };
        let next = match limits::read_limits_file(&path) {
            Ok(l) if cur.file.as_ref() == Some(&l) && matches!(cur.origin, Origin::File(_)) => {
                return false
            }
            Err(e) if e.is_not_found() && cur.origin == Origin::Env => return false,
            Ok(l) => {
                crate::info!(
                    "limits file {} changed; the new limits apply",
                    path.display()
                );
                Snapshot {
                    origin: Origin::File(path.clone()),
                    file: Some(l),
                    env: cur.env.clone(),
                    version: cur.version + 1,
                    path: Some(path),
                }
            }
            Err(e) => {
                let why = crate::log::chain(&e);
                if matches!(&cur.origin, Origin::FailClosed { why: w, .. } if *w == why) {
                    return false;
                }
                let s = Snapshot {
                    origin: Origin::FailClosed {
                        path: path.clone(),
                        why,
                    },
                    file: cur.file.clone(),
                    env: cur.env.clone(),
                    version: cur.version + 1,
                    path: Some(path.clone()),
                };
                fail_closed_line(&path, &e, &s, true);
                s
            }
        };
        self.publish(next);
        true
    }
}

impl Default for LimitsSource {
    fn default() -> Self {
        Self::new()
    }
}

fn fail_closed_line(path: &std::path::Path, e: &LimitsError, s: &Snapshot, live: bool) {
    let keeps = if s.file.is_some() {
        "keeping the last limits read from it"
    } else {
        "admitting no device memory (a zero budget; the environment may lower a limit, never stand in for the operator's)"
    };
    crate::error!(
        "limits file {} {}: {}; failing closed: {keeps}, never unlimited",
        path.display(),
        if live {
            "can no longer be used"
        } else {
            "cannot be used"
        },
        crate::log::chain(e)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const G: u64 = 1 << 30;

    fn cfg(dir: &Path, file: Option<&Path>, vars: &[(&str, &str)]) -> Config {
        let mut c = Config::from_vars(vars.iter().copied());
        // A directory that is not there: no limits file is required.
        c.limits_default = dir.join("no-etc-vgpu").join("limits");
        c.limits_file = file.map(Path::to_path_buf);
        c
    }

    fn write(p: &Path, text: &str) {
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn no_file_means_the_environment_lowered_by_the_region() {
        let d = tempfile::tempdir().unwrap();
        let src = LimitsSource::new();
        let s = src.load(&cfg(d.path(), None, &[("CUDA_DEVICE_MEMORY_LIMIT", "2g")]));
        assert_eq!(s.origin, Origin::Env);
        assert_eq!(s.device(Some(0), "GPU-a", None).memory, Some(2 * G));
        let reg = DeviceLimit {
            memory: Some(G),
            sm: None,
        };
        assert_eq!(s.device(Some(0), "GPU-a", Some(reg)).memory, Some(G));
        // A region saying "none" cannot raise the environment's limit.
        assert_eq!(
            s.device(Some(0), "GPU-a", Some(DeviceLimit::default()))
                .memory,
            Some(2 * G)
        );
        assert!(s.any_limit());
        let s = src.load(&cfg(d.path(), None, &[]));
        assert!(!s.any_limit());
        assert_eq!(s.version, 2);
    }

    #[test]
    fn the_file_wins_over_env_and_region_and_env_only_lowers() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("limits");
        write(&f, "vgpu-limits 1\ndevice GPU-a memory=1073741824 sm=30\ndevice * memory=3221225472\npolicy force\npriority 1\n");
        let src = LimitsSource::new();
        let s = src.load(&cfg(
            d.path(),
            Some(&f),
            &[("CUDA_DEVICE_MEMORY_LIMIT", "2g")],
        ));
        assert_eq!(s.origin, Origin::File(f.clone()));
        let huge = DeviceLimit {
            memory: None,
            sm: None,
        };
        assert_eq!(
            s.device(Some(0), "gpu-A", Some(huge)),
            DeviceLimit {
                memory: Some(G),
                sm: Some(30)
            }
        );
        // `*` says 3g; the env's 2g lowers it.
        assert_eq!(s.device(Some(1), "GPU-b", None).memory, Some(2 * G));
        assert_eq!(s.policy(), Policy::Force);
        assert_eq!(s.priority(), 1);
        // The env cannot raise a file's limit.
        let s = src.load(&cfg(
            d.path(),
            Some(&f),
            &[("CUDA_DEVICE_MEMORY_LIMIT", "9g")],
        ));
        assert_eq!(s.device(Some(1), "GPU-b", None).memory, Some(3 * G));
    }

    #[test]
    fn an_unusable_file_fails_closed_never_unlimited() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("limits");
        write(&f, "vgpu-limits 2\n");
        let src = LimitsSource::new();
        // No other limit: a zero budget.
        let s = src.load(&cfg(d.path(), Some(&f), &[]));
        assert!(matches!(s.origin, Origin::FailClosed { .. }));
        assert_eq!(s.device(Some(0), "GPU-a", None).memory, Some(0));
        assert!(s.any_limit());
        // The environment does not stand in for the operator's file, not
        // even a small limit (the tenant chooses it: `1t` is unlimited).
        for v in ["1g", "1t"] {
            let s = src.load(&cfg(d.path(), Some(&f), &[("CUDA_DEVICE_MEMORY_LIMIT", v)]));
            assert_eq!(s.device(Some(0), "GPU-a", None).memory, Some(0), "{v}");
        }
        // A FIFO is refused without blocking.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let s = src.load(&cfg(d.path(), Some(&fifo), &[]));
        assert!(matches!(s.origin, Origin::FailClosed { .. }));
        assert_eq!(s.device(Some(0), "GPU-a", None).memory, Some(0));
    }

    #[test]
    fn refresh_follows_the_generation_and_keeps_the_last_good_file() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("limits");
        write(&f, "vgpu-limits 1\ndevice * memory=1073741824\n");
        let src = LimitsSource::new();
        src.load(&cfg(d.path(), Some(&f), &[]));
        // The first generation seen: re-read, unchanged.
        assert!(!src.refresh_if_changed(7));
        assert!(src.settled(7) && !src.settled(8));
        write(&f, "vgpu-limits 1\ndevice * memory=2147483648\n");
        // Same generation: not re-read.
        assert!(!src.refresh_if_changed(7));
        assert_eq!(
            src.snapshot().unwrap().device(None, "x", None).memory,
            Some(G)
        );
        assert!(src.refresh_if_changed(8));
        assert_eq!(
            src.snapshot().unwrap().device(None, "x", None).memory,
            Some(2 * G)
        );
        // Bumped without a change: re-read, nothing published.
        let v = src.snapshot().unwrap().version;
        assert!(!src.refresh_if_changed(9));
        assert_eq!(src.snapshot().unwrap().version, v);
        // Corrupted: the last good limits stay in force.
        write(&f, "garbage\n");
        assert!(src.refresh_if_changed(10));
        let s = src.snapshot().unwrap();
        assert!(matches!(s.origin, Origin::FailClosed { .. }));
        assert_eq!(s.device(None, "x", None).memory, Some(2 * G));
        // Removed: still failing closed on the last good file.
        std::fs::remove_file(&f).unwrap();
        assert!(src.refresh_if_changed(11));
        assert_eq!(
            src.snapshot().unwrap().device(None, "x", None).memory,
            Some(2 * G)
        );
        // Repaired: the file again.
        write(&f, "vgpu-limits 1\ndevice * memory=1073741824\n");
        assert!(src.refresh_if_changed(12));
        let s = src.snapshot().unwrap();
        assert_eq!(s.origin, Origin::File(f.clone()));
        assert_eq!(s.device(None, "x", None).memory, Some(G));
    }

    #[test]
    fn a_named_file_not_written_yet_means_the_environment_until_it_appears() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("later");
        let src = LimitsSource::new();
        let s = src.load(&cfg(
            d.path(),
            Some(&f),
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
        ));
        assert_eq!(s.origin, Origin::Env);
        assert_eq!(s.device(None, "x", None).memory, Some(G));
        assert!(!src.refresh_if_changed(1));
        assert!(!src.refresh_if_changed(2), "still absent: nothing changes");
        write(&f, "vgpu-limits 1\ndevice * memory=536870912\n");
        assert!(src.refresh_if_changed(3));
        assert_eq!(
            src.snapshot().unwrap().device(None, "x", None).memory,
            Some(G / 2)
        );
    }

    #[test]
    fn where_the_operators_directory_exists_its_file_is_required() {
        let d = tempfile::tempdir().unwrap();
        let etc = d.path().join("etc-vgpu");
        std::fs::create_dir(&etc).unwrap();
        let own = d.path().join("own");
        write(&own, "vgpu-limits 1\ndevice * memory=1099511627776\n");
        let mut c = cfg(d.path(), Some(&own), &[("CUDA_DEVICE_MEMORY_LIMIT", "1t")]);
        c.limits_default = etc.join("limits");
        let src = LimitsSource::new();
        // No file in it: neither the tenant's file nor its environment
        // stands in; a zero budget.
        let s = src.load(&c);
        assert!(matches!(s.origin, Origin::FailClosed { .. }), "{s:?}");
        assert_eq!(s.device(Some(0), "GPU-a", None).memory, Some(0));
        // The operator writes it: it applies at the next re-read.
        write(
            &c.limits_default,
            "vgpu-limits 1\ndevice * memory=1073741824\n",
        );
        assert!(src.refresh_if_changed(1));
        assert_eq!(
            src.snapshot()
                .unwrap()
                .device(Some(0), "GPU-a", None)
                .memory,
            Some(G)
        );
        // Removed again: the last good limits, never the environment's.
        std::fs::remove_file(&c.limits_default).unwrap();
        assert!(src.refresh_if_changed(2));
        assert_eq!(
            src.snapshot()
                .unwrap()
                .device(Some(0), "GPU-a", None)
                .memory,
            Some(G)
        );
    }

    #[test]
    fn the_default_path_wins_over_the_variable() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("named");
        write(&f, "vgpu-limits 1\ndevice * memory=1073741824\n");
        let def = d.path().join("default");
        write(&def, "vgpu-limits 1\ndevice * memory=2147483648\n");
        let mut c = cfg(d.path(), Some(&f), &[]);
        c.limits_default = def.clone();
        let s = LimitsSource::new().load(&c);
        assert_eq!(s.origin, Origin::File(def));
        assert_eq!(s.device(None, "x", None).memory, Some(2 * G));
    }
}
