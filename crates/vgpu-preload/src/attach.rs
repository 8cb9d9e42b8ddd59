//! The per-process attachment: this process's configuration, its slot in
//! the container's region (the [`Ledger`]) and the tables of what it
//! charged, built lazily at the first hook that needs them (normally
//! `cuInit`) and published in a [`process::PerImage`] cell, so a hot path
//! that only asks "attached?" is one load and one compare.
//!
//! After `fork` the parent's state is stale in the child (an older
//! generation): the child attaches again as itself at its next call, with
//! its own slot and empty tables; at exit the slot is released.
//!
//! Must never wait on another process (mapping the region and claiming a
//! slot are local file operations and one CAS), and never attach from a
//! constructor.
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use vgpu_region::Unusable;

use crate::config::{CacheSource, Config};
use crate::driver::{self, CudaDriver};
use crate::ledger::{Charges, Ledger, LedgerError, NewDevice};
use crate::limits_source::{self, LimitsSource, Origin, Snapshot};
use crate::process::{self, Inside, Section};
use crate::sys;

pub struct Proc {
    pub cfg: Config,
    /// `None`: no limit is configured anywhere (and no region applies);
    /// everything passes through. With a limit configured this is the
    /// shared region's ledger or, when that cannot be used, a private one.
    pub ledger: Option<Ledger>,
    pub pid: i32,
    /// CUDA devices this process sees (0 when unknown, e.g. NVML-only).
    pub ndev: AtomicU32,
    pub charges: Charges,
    /// Any SM limit configured (the launch limiter's seam).
    pub sm_limited: bool,
    /// Where its limits come from (the process's `limits_source::SOURCE`;
    /// a test's own in unit tests).
    pub limits: &'static LimitsSource,
}

impl Proc {
    /// Memory budget of CUDA ordinal `dev` (`None`: none; `Some(0)`:
    /// nothing is admitted): exactly what admission enforces.
    pub fn mem_limit(&self, dev: u32) -> Option<u64> {
        let l = self.ledger.as_ref()?;
        refresh_limits_from(self.limits, l);
        l.mem_limit(dev)
    }

    pub fn used(&self, dev: u32) -> u64 {
        self.ledger.as_ref().map_or(0, |l| l.used(dev))
    }

    /// Binds CUDA ordinals to the region's devices by UUID once the driver
    /// can list them (after the real `cuInit`), then recomputes the
    /// budgets for that mapping. Idempotent.
    pub fn bind_devices(&self, drv: &dyn CudaDriver) {
        let Some(l) = &self.ledger else { return };
        if l.is_bound() {
            return;
        }
        let Ok(n) = drv.device_count() else { return };
        let uuids: Vec<String> = (0..n)
            .map(|i| driver::ordinal_uuid(drv, i).unwrap_or_default())
            .collect();
        let missing = l.bind_ordinals(&uuids);
        if !missing.is_empty() {
            let limited = self.limits.snapshot().is_some_and(|s| s.any_limit());
            if limited {
                crate::error!(
                    "region {} does not describe CUDA device(s) {missing:?} (by UUID); FAILING CLOSED on them: this process enforces their configured limits on a private ledger (not shared with the container's other processes)",
                    l.path
                );
            }
        }
        apply_budgets(self.limits, l, true);
    }
}

/// Recomputes the budgets of `l` from the limits source when the region's
/// limits generation moved (`vgpu limit` rewrote the file, or changed the
/// display copy of a region without a file): one atomic load otherwise.
pub fn refresh_limits(l: &Ledger) {
    refresh_limits_from(&limits_source::SOURCE, l)
}

/// [`refresh_limits`] from the limits source `src`.
pub fn refresh_limits_from(src: &LimitsSource, l: &Ledger) {
    let gen = l.limits_generation();
    if l.applied_generation.load(Ordering::Acquire) == gen {
        return;
    }
    src.refresh_if_changed(gen);
    if !src.settled(gen) {
        // Another thread is re-reading the file (or a newer generation came
        // meanwhile): keep the budgets in force, look again next call, so a
        // stale snapshot is never marked as this generation's.
        return;
    }
    apply_budgets(src, l, false);
    l.applied_generation.store(gen, Ordering::Release);
}

/// Sets every device's budget from the current snapshot (by the driver's
/// UUID of the ordinal, never by what the tenant-writable region records)
/// and says, as a warning, where the region's recorded limit disagrees.
fn apply_budgets(src: &LimitsSource, l: &Ledger, warn: bool) {
    let Some(s) = src.snapshot() else {
        return;
    };
    for t in l.targets() {
        let region = t.shown.filter(|_| l.private_cause.is_none());
        let want = s.device(t.ord, &t.uuid, region);
        l.set_budget(t.loc, want.memory);
        let Some(shown) = region else { continue };
        if warn && shown.memory != want.memory {
            crate::warn!(
                "device {}: region {} records a memory limit of {}, this process enforces {} ({}); {}",
                t.uuid,
                l.path,
                show(shown.memory),
                show(want.memory),
                origin(s),
                if s.from_file() {
                    "the limits file wins"
                } else {
                    "the lower of the environment's and the region's applies"
                }
            );
        }
    }
}

fn show(b: Option<u64>) -> String {
    b.map_or_else(|| "none".into(), |n| format!("{n} B"))
}

fn origin(s: &Snapshot) -> String {
    match &s.origin {
        Origin::Env => "from the environment".into(),
        Origin::File(p) => format!("from {}", p.display()),
        Origin::FailClosed { path, .. } => format!("failing closed on {}", path.display()),
    }
}

/// This image's state: a forked child attaches again as itself.
static PROC: process::PerImage<Proc> = process::PerImage::new();
static CONFIG_LOGGED: AtomicBool = AtomicBool::new(false);
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// The state if already attached (never attaches): for hot paths that have
/// nothing to do before `cuInit`.
#[inline]
pub fn attached() -> Option<&'static Proc> {
    PROC.get()
}

/// The state, attaching first if needed (which may call the real `cuInit`
/// to learn the devices when the region must be created).
#[inline]
pub fn proc() -> Option<&'static Proc> {
    attached().or_else(|| attach(true, &driver::REAL_CUDA))
}

/// Builds and publishes the state. Returns `None` only when `may_init` is
/// false and the region has to be created first (the caller retries after
/// the real `cuInit`), or when re-entered on the thread that is attaching.
/// Another thread of this process that is attaching meanwhile is waited
/// for (local work only: mapping a file, one CAS): one process, one slot.
pub fn attach(may_init: bool, drv: &dyn CudaDriver) -> Option<&'static Proc> {
    let mut built = false;
    let out = PROC.get_or_build(|| {
        register_handlers();
        let _inside = Inside::enter(Section::Attaching)?;
        let p = build(may_init, drv)?;
        built = true;
        Some(p)
    });
    if let (true, Some(p)) = (built, out) {
        if let Some(f) = LATE.get() {
            f(p, drv);
        }
        attached_hook();
    }
    out
}

/// What runs after an attach (`init` registers what a `cuInit` that did
/// not attach left for it; a function pointer, as `init` sits above
/// this layer).
pub type LateHook = fn(&Proc, &dyn CudaDriver);
static LATE: std::sync::OnceLock<LateHook> = std::sync::OnceLock::new();

/// Registers `f` to run after every later attach of this process (the
/// first registration stays).
pub fn on_late_attach(f: LateHook) {
    let _ = LATE.set(f);
}

fn register_handlers() {
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        process::on_exit(release_at_exit);
    }
}

fn release_at_exit() {
    if let Some(p) = PROC.take() {
        if p.pid == sys::getpid() {
            if let Some(l) = &p.ledger {
                l.unregister();
            }
        }
    }
}

/// Reads the environment, logging its problems once per process.
fn read_config() -> Config {
    let cfg = Config::from_env();
    if !CONFIG_LOGGED.swap(true, Ordering::Relaxed) {
        for p in &cfg.problems {
            crate::warn!("{p}");
        }
    }
    cfg
}

fn build(may_init: bool, drv: &dyn CudaDriver) -> Option<Proc> {
    build_with(read_config(), &limits_source::SOURCE, may_init, drv)
}

/// The state for configuration `cfg` with its limits loaded into `src`,
/// over `drv` (see [`attach`]; publishes nothing).
pub fn build_with(
    cfg: Config,
    src: &'static LimitsSource,
    may_init: bool,
    drv: &dyn CudaDriver,
) -> Option<Proc> {
    let limits = src.load(&cfg);
    let limited = limits.any_limit();
    let want_region = limited || cfg.cache_source == CacheSource::Env;
    let mut ledger = None;
    let mut ndev = 0;
    // Open first (no `stat` to ask whether it exists: one syscall less on
    // the cuInit path); a missing file is created when a limit asks for a
    // region, which needs the device list, hence the real cuInit.
    let unusable = match Ledger::open_existing(&cfg.cache) {
        Ok(Some(l)) => {
            ledger = Some(l);
            None
        }
        Ok(None) if want_region => {
            if !may_init {
                return None;
            }
            match devices_for_create(limits, drv) {
                Some(devs) => {
                    ndev = devs.len() as u32;
                    match Ledger::create(&cfg.cache, 1024, devs) {
                        Ok((l, _)) => {
                            ledger = Some(l);
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
                None => {
                    crate::error!(
                        "cannot enumerate CUDA devices to create the region {}; memory limits are NOT enforced",
                        cfg.cache.display()
                    );
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => Some(e),
    };
    if let Some(e) = unusable {
        if !limited {
            crate::warn!(
                "{}; no limit is configured, so this process runs without one",
                crate::log::chain(&e)
            );
        } else {
            // Fail closed: the same limits on a ledger of our own.
            if !may_init {
                return None;
            }
            ledger = private_ledger(limits, drv, &e);
            if let Some(l) = &ledger {
                ndev = l.device_count();
            }
        }
    }
    if let Some(l) = &ledger {
        if ndev == 0 {
            ndev = l.device_count();
        }
        // Disagreements with the region are said once, when the ordinals
        // are bound by UUID (bind_devices, after the real cuInit).
        apply_budgets(src, l, false);
        l.applied_generation
            .store(l.limits_generation(), Ordering::Release);
        crate::debug!("attached to region {} slot {:?}", l.path, l.slot());
    }
    let sm_limited = match &ledger {
        Some(l) => l
            .targets()
            .iter()
            .any(|t| limits.device(t.ord, &t.uuid, t.shown).sm.is_some()),
        None => false,
    };
    let p = Proc {
        cfg,
        ledger,
        pid: sys::getpid(),
        ndev: AtomicU32::new(ndev),
        charges: Charges::default(),
        sm_limited,
        limits: src,
    };
    if may_init {
        p.bind_devices(drv);
    }
    Some(p)
}

/// The fail-closed ledger: the shared region cannot be used (`e`) but a
/// limit is configured, so this process keeps it alone, and says so once,
/// loudly. Its views show that same ledger.
fn private_ledger(limits: &Snapshot, drv: &dyn CudaDriver, e: &LedgerError) -> Option<Ledger> {
    let cause = e.unusable();
    let Some(devs) = devices_for_create(limits, drv) else {
        crate::error!(
            "{}; and the CUDA devices cannot be listed for a private ledger: memory limits are NOT enforced",
            crate::log::chain(e)
        );
        return None;
    };
    match Ledger::private(devs, cause) {
        Ok(l) => {
            crate::error!(
                "region unusable ({}): {}; FAILING CLOSED: this process enforces its limits on a private ledger (its usage is not shared with the container's other processes, nor visible to vgpu inspect)",
                cause.name(),
                crate::log::chain(e)
            );
            Some(l)
        }
        Err(pe) => {
            crate::error!(
                "{}; and no private ledger ({}): memory limits are NOT enforced",
                crate::log::chain(e),
                crate::log::chain(&pe)
            );
            None
        }
    }
}

/// Why a region was not used, for tests and messages.
pub fn private_cause() -> Option<Unusable> {
    attached()?.ledger.as_ref()?.private_cause
}

/// Calls the real `cuInit(0)` and lists the visible devices with the
/// limits in force, for creating a region (its display copy) or a
/// private ledger.
fn devices_for_create(limits: &Snapshot, drv: &dyn CudaDriver) -> Option<Vec<NewDevice>> {
    let r = drv.init(0);
    if !r.is_success() {
        crate::warn!("real cuInit failed ({r:?}) while creating the region");
        return None;
    }
    let n = drv.device_count().ok()?;
    let out = (0..n)
        .map(|i| {
            let uuid = driver::ordinal_uuid(drv, i).unwrap_or_default();
            let d = limits.device(Some(i), &uuid, None);
            NewDevice {
                // The region's limit fields are a display copy: a zero
                // budget shows as the smallest limit it can hold.
                mem_limit: d.memory.map_or(0, |m| m.max(1)),
                sm_limit: d.sm.unwrap_or(0),
                uuid,
            }
        })
        .collect();
    Some(out)
}

/// Test hook (feature `failpoints`): a process that attached starts the
/// owned thread when `LIBVGPU_FAILPOINT_OWNED_THREAD` names a file.
fn attached_hook() {
    #[cfg(feature = "failpoints")]
    if let Some(path) = crate::config::failpoint_owned_thread() {
        heartbeat::start(path);
    }
}

#[cfg(feature = "failpoints")]
mod heartbeat {
    //! The owned thread's test task: appends `<event> <pid>` lines to a
    //! file (`started`, every run `tick`, `stopped`), so a test can see the
    //! thread start lazily, restart in a forked child and stop at exit.
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    use std::time::Duration;

    use crate::process::{self, Next, Periodic, Task};

    struct Heartbeat;
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    static TASK: Periodic = Periodic::new(&Heartbeat);

    fn note(what: &str) {
        let Some(path) = PATH.get() else { return };
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{what} {}", std::process::id());
        }
    }

    impl Task for Heartbeat {
        fn run(&self, _now_ns: u64) -> Next {
            note("tick");
            Next::After(Duration::from_millis(20))
        }
        fn stopped(&self) {
            note("stopped");
        }
        fn name(&self) -> &'static str {
            "test heartbeat"
        }
    }

    pub fn start(path: &Path) {
        PATH.get_or_init(|| path.to_path_buf());
        if process::scheduled(&TASK) {
            return;
        }
        note("started");
        if let Err(e) = process::schedule(&TASK) {
            note("failed");
            crate::warn!("owned thread: {e}");
        }
    }
}
