//! The per-process attachment: this process's configuration, its slot in
//! the container's region (the [`Ledger`]) and the tables of what it
//! charged, built lazily at the first hook that needs them (normally
//! `cuInit`) and published through one atomic pointer, so a hot path that
//! only asks "attached?" is a single load.
//!
//! After `fork` the child drops the pointer (fork-child callback: atomics
//! only) and attaches again as itself at its next call, with its own slot
//! and empty tables; at exit the slot is released.
//!
//! Must never wait on another process (mapping the region and claiming a
//! slot are local file operations and one CAS), and never attach from a
//! constructor.
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8, Ordering};

use crate::config::{CacheSource, Config};
use crate::driver::{self, CudaDriver};
use crate::ledger::{Charges, Ledger, NewDevice};
use crate::process::{self, Inside, Section};
use crate::sys;

pub struct Proc {
    pub cfg: Config,
    /// `None`: no region applies; everything passes through.
    pub ledger: Option<Ledger>,
    pub pid: i32,
    /// CUDA devices this process sees (0 when unknown, e.g. NVML-only).
    pub ndev: AtomicU32,
    pub charges: Charges,
    /// Any SM limit configured (the launch limiter's seam).
    pub sm_limited: bool,
}

impl Proc {
    /// Memory limit for CUDA ordinal `dev` (0: none).
    pub fn mem_limit(&self, dev: u32) -> u64 {
        match &self.ledger {
            Some(l) => l.mem_limit(dev),
            None => self.cfg.mem_limit(dev),
        }
    }

    pub fn used(&self, dev: u32) -> u64 {
        self.ledger.as_ref().map_or(0, |l| l.used(dev))
    }
}

static PROC: AtomicPtr<Proc> = AtomicPtr::new(std::ptr::null_mut());
/// 0 idle, 1 attaching (another thread of this process is building PROC).
static ATTACHING: AtomicU8 = AtomicU8::new(0);
static CONFIG_LOGGED: AtomicBool = AtomicBool::new(false);
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// The state if already attached (never attaches): for hot paths that have
/// nothing to do before `cuInit`.
#[inline]
pub fn attached() -> Option<&'static Proc> {
    let p = PROC.load(Ordering::Acquire);
    // SAFETY: PROC only ever holds null or a leaked `Box<Proc>`, never freed.
    unsafe { p.as_ref() }
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
pub fn attach(may_init: bool, drv: &dyn CudaDriver) -> Option<&'static Proc> {
    loop {
        if let Some(p) = attached() {
            return Some(p);
        }
        if ATTACHING
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            register_handlers();
            let gen = process::generation();
            let built = {
                let _inside = Inside::enter(Section::Attaching);
                build(may_init, drv)
            };
            let out = built.map(|b| {
                let p: &'static Proc = Box::leak(Box::new(b));
                // A fork in the middle makes this state the parent's, not ours.
                if process::generation() == gen {
                    PROC.store(p as *const Proc as *mut Proc, Ordering::Release);
                }
                p
            });
            ATTACHING.store(0, Ordering::Release);
            if out.is_some() {
                attached_hook();
            }
            return out;
        }
        if process::inside(Section::Attaching) {
            return None;
        }
        // Another thread of this process is attaching (local work only:
        // mapping a file, one CAS); wait for it.
        std::thread::yield_now();
    }
}

fn register_handlers() {
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        process::on_fork_child(forked);
        process::on_exit(release_at_exit);
    }
}

/// Fork child: the parent's state stays the parent's. Atomics only.
fn forked() {
    PROC.store(std::ptr::null_mut(), Ordering::Release);
    ATTACHING.store(0, Ordering::Release);
}

fn release_at_exit() {
    let p = PROC.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: PROC only holds null or a leaked Box<Proc>.
    if let Some(p) = unsafe { p.as_ref() } {
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
    let cfg = read_config();
    let want_region = cfg.any_limit() || cfg.cache_source == CacheSource::Env;
    let mut ledger = None;
    let mut ndev = 0;
    // Open first (no `stat` to ask whether it exists: one syscall less on
    // the cuInit path); a missing file is created when the env asks for a
    // region, which needs the device list, hence the real cuInit.
    match Ledger::open_existing(&cfg.cache) {
        Ok(Some(l)) => ledger = Some(l),
        Ok(None) if want_region => {
            if !may_init {
                return None;
            }
            match devices_for_create(&cfg, drv) {
                Some(devs) => {
                    ndev = devs.len() as u32;
                    match Ledger::create(&cfg.cache, 1024, devs) {
                        Ok((l, mism)) => {
                            for m in mism {
                                crate::info!("region {}: {m} (the region's value applies)", l.path);
                            }
                            ledger = Some(l);
                        }
                        Err(e) => crate::error!(
                            "{}; memory limits are NOT enforced in this process",
                            crate::log::chain(&e)
                        ),
                    }
                }
                None => crate::error!(
                    "cannot enumerate CUDA devices to create the region {}; memory limits are NOT enforced",
                    cfg.cache.display()
                ),
            }
        }
        Ok(None) => {}
        Err(e) => crate::error!(
            "{}; memory limits are NOT enforced in this process",
            crate::log::chain(&e)
        ),
    }
    if let Some(l) = &ledger {
        if ndev == 0 {
            ndev = l.device_count();
        }
        for d in 0..l.device_count() {
            let env = cfg.mem_limit(d);
            let reg = l.mem_limit(d);
            if env != 0 && env != reg {
                crate::info!(
                    "device {d}: environment says {env} B, region {} says {reg} B; the region's limit applies",
                    l.path
                );
            }
        }
        crate::debug!("attached to region {} slot {:?}", l.path, l.slot());
    }
    let sm_limited = match &ledger {
        Some(l) => (0..l.device_count()).any(|d| l.sm_limit(d) != 0),
        None => cfg.sm_all != 0 || cfg.sm_dev.values().any(|&v| v != 0),
    };
    Some(Proc {
        cfg,
        ledger,
        pid: sys::getpid(),
        ndev: AtomicU32::new(ndev),
        charges: Charges::default(),
        sm_limited,
    })
}

/// Calls the real `cuInit(0)` and lists the visible devices with their
/// environment limits, for creating the region.
fn devices_for_create(cfg: &Config, drv: &dyn CudaDriver) -> Option<Vec<NewDevice>> {
    let r = drv.init(0);
    if !r.is_success() {
        crate::warn!("real cuInit failed ({r:?}) while creating the region");
        return None;
    }
    let n = drv.device_count().ok()?;
    let out = (0..n)
        .map(|i| NewDevice {
            uuid: driver::ordinal_uuid(drv, i).unwrap_or_default(),
            mem_limit: cfg.mem_limit(i),
            sm_limit: cfg.sm_limit(i),
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
    //! The owned thread's test job: appends `<event> <pid>` lines to a file
    //! (`started`, every tick `tick`, `stopped`), so a test can see the
    //! thread start lazily, restart in a forked child and stop at exit.
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    use std::time::Duration;

    use crate::process::{self, Job};

    struct Heartbeat {
        path: PathBuf,
    }

    impl Heartbeat {
        fn note(&self, what: &str) {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
            {
                let _ = writeln!(f, "{what} {}", std::process::id());
            }
        }
    }

    impl Job for Heartbeat {
        fn tick(&self) -> Duration {
            self.note("tick");
            Duration::from_millis(20)
        }
        fn stopped(&self) {
            self.note("stopped");
        }
    }

    pub fn start(path: &Path) {
        static JOB: OnceLock<Heartbeat> = OnceLock::new();
        let job = JOB.get_or_init(|| Heartbeat {
            path: path.to_path_buf(),
        });
        if process::owned_thread_running() {
            return;
        }
        job.note("started");
        if let Err(e) = process::start_owned_thread(job) {
            job.note("failed");
            crate::warn!("owned thread: {e}");
        }
    }
}
