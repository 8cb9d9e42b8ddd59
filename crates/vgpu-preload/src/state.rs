//! Per-process state: configuration, the region attachment, the tables of
//! what this process charged, `cuInit` phases, fork and exit handling.
//!
//! Nothing here runs in a constructor. The state is built lazily at the first
//! hook that needs it (normally `cuInit`) and published through one atomic
//! pointer, so the hot path is a single load. After `fork` the child drops
//! the pointer (atfork handler: atomics only) and attaches again as itself
//! at its next call, getting its own slot and zeroed accounting.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use vgpu_cuda_abi::{CUdevice, CUresult};

use crate::config::{CacheSource, Config};
use crate::ledger::{Kind, Ledger, NewDevice, RegionPhase};
use crate::{aux, sys};

/// What one charge was: device (CUDA ordinal), kind, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub dev: u32,
    pub kind: Kind,
    pub bytes: u64,
}

/// A stream-ordered pool this process has charged for.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolCharge {
    pub dev: u32,
    /// Bytes currently charged for this pool (its reserved memory as last seen).
    pub charged: u64,
}

/// A cheap hasher for pointer and handle keys (the allocation hot path):
/// one folded 64x64->128 multiply, which mixes the low bits that aligned
/// device pointers leave zero. Keys come from the driver, not an attacker.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

pub type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
pub struct Tables {
    /// Linear/managed/pitched allocations by device pointer.
    pub allocs: Map<u64, Charge>,
    /// Stream-ordered allocations: pointer -> pool.
    pub async_ptrs: Map<u64, usize>,
    pub pools: Map<usize, PoolCharge>,
    /// `cuMemCreate` handles.
    pub handles: Map<u64, Charge>,
    /// Arrays and mipmapped arrays by handle.
    pub arrays: Map<usize, Charge>,
    /// Contexts created with `cuCtxCreate*`.
    pub ctxs: Map<usize, Charge>,
}

pub struct Proc {
    pub cfg: Config,
    /// `None`: no region applies; everything passes through.
    pub ledger: Option<Ledger>,
    pub pid: i32,
    /// CUDA devices this process sees (0 when unknown, e.g. NVML-only).
    pub ndev: AtomicU32,
    pub tables: Mutex<Tables>,
    /// Primary-context retain count and charge per device (its own lock: it
    /// is held across the driver's retain, which can be slow).
    pub primary: Mutex<Map<u32, (u32, u64)>>,
    /// Any SM limit configured (the launch limiter's seam).
    pub sm_limited: bool,
}

impl Proc {
    pub fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A poisoned lock only means a panic elsewhere mid-update; the maps
        // are still usable and the library must keep serving.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

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
/// Bumped by the fork child handler.
static GEN: AtomicU32 = AtomicU32::new(0);
static HOOKS_INSTALLED: AtomicBool = AtomicBool::new(false);
static CONFIG_LOGGED: AtomicBool = AtomicBool::new(false);
static LOADER_READY: AtomicU64 = AtomicU64::new(0);

pub fn note_loader_ready() {
    let _ = LOADER_READY.compare_exchange(0, sys_now(), Ordering::Relaxed, Ordering::Relaxed);
}

fn sys_now() -> u64 {
    vgpu_region::monotonic_ns()
}

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
    attached().or_else(|| attach(true))
}

/// Builds and publishes PROC. Returns `None` only when `may_init` is false
/// and the region has to be created first (the caller retries after the
/// real `cuInit`), or when re-entered on the thread that is attaching.
pub fn attach(may_init: bool) -> Option<&'static Proc> {
    loop {
        if let Some(p) = attached() {
            return Some(p);
        }
        if ATTACHING
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let gen = GEN.load(Ordering::Acquire);
            let built = build(may_init);
            let out = built.map(|b| {
                let p: &'static Proc = Box::leak(Box::new(b));
                // A fork in the middle makes this state the parent's, not ours.
                if GEN.load(Ordering::Acquire) == gen {
                    PROC.store(p as *const Proc as *mut Proc, Ordering::Release);
                }
                p
            });
            ATTACHING.store(0, Ordering::Release);
            install_process_hooks();
            return out;
        }
        if IN_ATTACH.with(std::cell::Cell::get) {
            return None;
        }
        // Another thread of this process is attaching (local work only:
        // mapping a file, one CAS); wait for it.
        std::thread::yield_now();
    }
}

thread_local! {
    static IN_ATTACH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn build(may_init: bool) -> Option<Proc> {
    IN_ATTACH.with(|c| c.set(true));
    let r = build_inner(may_init);
    IN_ATTACH.with(|c| c.set(false));
    r
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

/// The configuration of a process that has not attached (NVML only),
/// read once.
pub fn config_once() -> &'static Config {
    static CFG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    CFG.get_or_init(read_config)
}

fn build_inner(may_init: bool) -> Option<Proc> {
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
            match devices_for_create(&cfg) {
                Some(devs) => {
                    ndev = devs.len() as u32;
                    match Ledger::create(&cfg.cache, 1024, devs) {
                        Ok((l, mism)) => {
                            for m in mism {
                                crate::info!("region {}: {m} (the region's value applies)", l.path);
                            }
                            ledger = Some(l);
                        }
                        Err(e) => crate::error!("{}; memory limits are NOT enforced in this process", chain(&e)),
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
            chain(&e)
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
        tables: Mutex::new(Tables::default()),
        primary: Mutex::new(Map::default()),
        sm_limited,
    })
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Calls the real `cuInit(0)` and lists the visible devices with their
/// environment limits, for creating the region.
fn devices_for_create(cfg: &Config) -> Option<Vec<NewDevice>> {
    let a = aux::cuda()?;
    let init = crate::hooks::real::<crate::hooks::cuda::cuInit::Fn>(
        &crate::hooks::cuda::cuInit::REAL,
        crate::hooks::Lib::Cuda,
    )?;
    // SAFETY: the driver's cuInit, flags 0 as documented.
    let r = unsafe { init(0) };
    if !r.is_success() {
        crate::warn!("real cuInit failed ({r:?}) while creating the region");
        return None;
    }
    let n = a.device_count()?;
    let mut out = Vec::new();
    for i in 0..n {
        out.push(NewDevice {
            uuid: a.uuid(i as CUdevice).unwrap_or_default(),
            mem_limit: cfg.mem_limit(i),
            sm_limit: cfg.sm_limit(i),
        });
    }
    Some(out)
}

extern "C" fn on_exit() {
    // Runs from C (exit(3)): a panic must not unwind out of it.
    let _ = std::panic::catch_unwind(release_at_exit);
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

unsafe extern "C" fn on_fork_child() {
    // Atomics only: the child may be single-threaded inside a
    // multithreaded parent's image. The parent's slot stays the parent's.
    PROC.store(std::ptr::null_mut(), Ordering::Release);
    ATTACHING.store(0, Ordering::Release);
    GEN.fetch_add(1, Ordering::AcqRel);
    INIT_GEN.store(u32::MAX, Ordering::Release);
}

fn install_process_hooks() {
    if HOOKS_INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    if !sys::at_exit(on_exit) {
        crate::warn!("atexit failed; this process's slot is left to reclaim at exit");
    }
    if !sys::at_fork_child(on_fork_child) {
        crate::warn!("pthread_atfork failed; a forked child would share its parent's accounting");
    }
}

/// The generation whose `cuInit` phases have run (u32::MAX: none yet).
static INIT_GEN: AtomicU32 = AtomicU32::new(u32::MAX);

/// The `cuInit` hook: per-process once, in phases, each timestamped into the
/// slot. Nothing here waits on another process: mapping the region and
/// claiming a slot are local file operations and one CAS; identity is not
/// on this path (see `identity`).
pub fn cu_init(real: crate::hooks::cuda::cuInit::Fn, flags: std::ffi::c_uint) -> CUresult {
    let gen = GEN.load(Ordering::Acquire);
    if INIT_GEN.load(Ordering::Acquire) == gen {
        // SAFETY: forwarding the caller's cuInit.
        return unsafe { real(flags) };
    }
    let wrapper_enter = sys_now();
    let early = attach(false);
    let real_enter = sys_now();
    // SAFETY: forwarding the caller's cuInit.
    let r = unsafe { real(flags) };
    let real_exit = sys_now();
    // Creating the region needs the device list, so that path maps it
    // after the real cuInit (its phase stamps then follow RealInitExit).
    let p = early.or_else(|| attach(true));
    if let Some(p) = p {
        // The driver's count decides whether allocations must ask for the
        // current device (the region's count was only provisional).
        if let Some(n) = r.is_success().then(sys::cuda_device_count).flatten() {
            p.ndev.store(n, Ordering::Relaxed);
            if let Some(l) = &p.ledger {
                if l.device_count() < n {
                    crate::warn!(
                        "region {} describes {} device(s) but the driver shows {n}; devices {}.. are not limited",
                        l.path,
                        l.device_count(),
                        l.device_count()
                    );
                }
            }
        }
    }
    if let Some(p) = p {
        // Lazy by default (nothing waits); LIBVGPU_IDENTITY=eager resolves here.
        crate::identity::post_init(p);
    }
    let post_exit = sys_now();
    INIT_GEN.store(gen, Ordering::Release);
    if let Some(l) = p.and_then(|p| p.ledger.as_ref()) {
        let ready = LOADER_READY.load(Ordering::Relaxed);
        l.set_phase(RegionPhase::LoaderReady, ready);
        l.set_phase(RegionPhase::WrapperEnter, wrapper_enter);
        l.set_phase(RegionPhase::RegionMapped, l.mapped_ns);
        l.set_phase(RegionPhase::SlotClaimed, l.claimed_ns);
        l.set_phase(RegionPhase::RealInitEnter, real_enter);
        l.set_phase(RegionPhase::RealInitExit, real_exit);
        l.set_phase(RegionPhase::PostInitExit, post_exit);
        l.set_phase(RegionPhase::WrapperExit, sys_now());
    }
    r
}

static SM_NOTED: AtomicBool = AtomicBool::new(false);

/// The launch path's gate: one atomic load when nothing is limited. The SM
/// limiter (a later issue) plugs in here.
#[inline]
pub fn launch_gate() {
    if let Some(p) = attached() {
        if p.sm_limited {
            sm_limit_pending();
        }
    }
}

#[cold]
fn sm_limit_pending() {
    if !SM_NOTED.swap(true, Ordering::Relaxed) {
        crate::warn!("an SM limit is configured but this libvgpu.so has no launch limiter yet; launches are not paced");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn key_hasher_spreads_aligned_pointers() {
        // Device pointers are 2 MiB aligned here: the low bits (which pick
        // the bucket) must still differ.
        let b = BuildHasherDefault::<KeyHasher>::default();
        let low: std::collections::HashSet<u64> = (0..256u64)
            .map(|i| b.hash_one(0x7f00_0000_0000 + (i << 21)) & 0xff)
            .collect();
        assert!(low.len() > 128, "only {} distinct low bytes", low.len());
    }
}
