//! The `cuInit` hook's work, per process image once, in phases each
//! timestamped: attach (map the region, claim a slot), the real `cuInit`,
//! the driver's device count, identity's post-init step.
//!
//! By default `cuInit` does not attach: it calls the real `cuInit` and
//! keeps its phase stamps in process memory; the process attaches at its
//! first call that needs the region (a context, an allocation, a memory
//! view, a limited launch: `attach::proc`), which binds the ordinals and
//! writes those stamps into its slot. A burst of processes starting at once
//! then pays in `cuInit` what the driver costs (issue 19), and a process
//! that never touches device memory never claims a slot. Every charge
//! still goes through `proc`, so a limited process is held from its first
//! allocation and fails closed exactly as before. `LIBVGPU_ATTACH=eager`
//! (and `LIBVGPU_IDENTITY=eager`, which needs the slot there) attaches
//! inside `cuInit` as before, for measurements of the phases.
//!
//! Must never wait on another process: mapping the region and claiming a
//! slot are local file operations and one CAS; identity is not on this
//! path unless `LIBVGPU_IDENTITY=eager` asks for it.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use vgpu_cuda_abi::CUresult;

use crate::attach::{self, Proc};
use crate::clock::{Clock, MONOTONIC};
use crate::driver::{self, CudaDriver, REAL_CUDA};
use crate::ledger::RegionPhase;
use crate::process;

/// The generation + 1 whose `cuInit` phases have run (0: none yet).
static INIT_GEN: AtomicU32 = AtomicU32::new(0);

/// The lazy path's stamps (wrapper enter, real enter, real exit, wrapper
/// exit) of generation `STAMPS_GEN - 1`, and whether its real `cuInit`
/// succeeded; written into the slot when the process attaches.
static STAMPS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static STAMPS_GEN: AtomicU32 = AtomicU32::new(0);
static INIT_OK: AtomicBool = AtomicBool::new(false);

/// The `cuInit` hook, around the real call `real`.
pub fn cu_init(real: impl Fn(std::ffi::c_uint) -> CUresult, flags: std::ffi::c_uint) -> CUresult {
    let gen = process::generation().wrapping_add(1);
    if INIT_GEN.load(Ordering::Acquire) == gen {
        return real(flags);
    }
    // Attached already (a policy hook came first) or asked to: the phases
    // as they always ran, attach included.
    let r = if attach::attached().is_some() || crate::config::attach_eager_in_env() {
        init_with(&REAL_CUDA, &MONOTONIC, attach::attach, real, flags)
    } else {
        lazy(&MONOTONIC, real, flags, gen)
    };
    INIT_GEN.store(gen, Ordering::Release);
    r
}

/// The first `cuInit` of an image that does not attach: the real call,
/// stamped into process memory (clock reads only).
fn lazy(
    clock: &dyn Clock,
    real: impl Fn(std::ffi::c_uint) -> CUresult,
    flags: std::ffi::c_uint,
    gen: u32,
) -> CUresult {
    let enter = clock.now_ns();
    let real_enter = clock.now_ns();
    let r = real(flags);
    let real_exit = clock.now_ns();
    INIT_OK.store(r.is_success(), Ordering::Relaxed);
    for (s, t) in STAMPS
        .iter()
        .zip([enter, real_enter, real_exit, clock.now_ns()])
    {
        s.store(t, Ordering::Relaxed);
    }
    attach::on_late_attach(after_late_attach);
    STAMPS_GEN.store(gen, Ordering::Release);
    r
}

/// Called once a process attached outside `cuInit` (`attach::attach`):
/// when this image's `cuInit` already ran without attaching, what it
/// skipped happens now: the driver's device count, the ordinals bound by
/// UUID, identity's post-init step, and its phase stamps into the slot.
/// `RegionMapped`/`SlotClaimed` stay zero there: the region was not on the
/// `cuInit` path (the slot's claim time is recorded with the slot).
pub fn after_late_attach(p: &Proc, drv: &dyn CudaDriver) {
    let gen = process::generation().wrapping_add(1);
    if STAMPS_GEN.load(Ordering::Acquire) != gen {
        return;
    }
    if INIT_OK.load(Ordering::Relaxed) {
        if let Ok(n) = drv.device_count() {
            p.ndev.store(n, Ordering::Relaxed);
            p.bind_devices(drv);
        }
    }
    crate::identity::post_init(p);
    if let Some(l) = p.ledger.as_ref() {
        let [enter, real_enter, real_exit, exit] =
            STAMPS.each_ref().map(|s| s.load(Ordering::Relaxed));
        l.set_phase(RegionPhase::LoaderReady, driver::table::first_load_ns());
        l.set_phase(RegionPhase::WrapperEnter, enter);
        l.set_phase(RegionPhase::RealInitEnter, real_enter);
        l.set_phase(RegionPhase::RealInitExit, real_exit);
        l.set_phase(RegionPhase::PostInitExit, exit);
        l.set_phase(RegionPhase::WrapperExit, exit);
    }
}

/// The phases of the first `cuInit` of an image over `drv` (what the
/// library asks of the driver), timed by `clock`, attaching through
/// `attach` (`attach::attach` in the library), around the real call
/// `real`. Returns `real`'s result unchanged.
pub fn init_with<'p>(
    drv: &dyn CudaDriver,
    clock: &dyn Clock,
    attach: impl Fn(bool, &dyn CudaDriver) -> Option<&'p Proc>,
    real: impl Fn(std::ffi::c_uint) -> CUresult,
    flags: std::ffi::c_uint,
) -> CUresult {
    let now = || clock.now_ns();
    let wrapper_enter = now();
    let early = attach(false, drv);
    let real_enter = now();
    let r = real(flags);
    let real_exit = now();
    // Creating the region needs the device list, so that path maps it
    // after the real cuInit (its phase stamps then follow RealInitExit).
    let p = early.or_else(|| attach(true, drv));
    if let Some(p) = p {
        // The driver's count decides whether allocations must ask for the
        // current device (the region's count was only provisional).
        if let Some(n) = r.is_success().then(|| drv.device_count().ok()).flatten() {
            p.ndev.store(n, Ordering::Relaxed);
            // Ordinals to the region's devices by UUID (CUDA_VISIBLE_DEVICES
            // may reorder or hide them); warns about devices it lacks.
            p.bind_devices(drv);
        }
        // Lazy by default (nothing waits); LIBVGPU_IDENTITY=eager resolves here.
        crate::identity::post_init(p);
    }
    let post_exit = now();
    if let Some(l) = p.and_then(|p| p.ledger.as_ref()) {
        l.set_phase(RegionPhase::LoaderReady, driver::table::first_load_ns());
        l.set_phase(RegionPhase::WrapperEnter, wrapper_enter);
        l.set_phase(RegionPhase::RegionMapped, l.mapped_ns);
        l.set_phase(RegionPhase::SlotClaimed, l.claimed_ns);
        l.set_phase(RegionPhase::RealInitEnter, real_enter);
        l.set_phase(RegionPhase::RealInitExit, real_exit);
        l.set_phase(RegionPhase::PostInitExit, post_exit);
        l.set_phase(RegionPhase::WrapperExit, now());
    }
    r
}

#[cfg(test)]
mod tests {
    //! `init_with` and `attach::build_with` over the fake driver, a fake
    //! clock and real region files; each test owns its limits source and
    //! publishes nothing process-wide.
    #![allow(clippy::unwrap_used)]
    use std::cell::Cell;
    use std::path::Path;

    use super::*;
    use crate::attach::build_with;
    use crate::clock::FakeClock;
    use crate::config::Config;
    use crate::driver::fake::FakeCuda;
    use crate::ledger::{Ledger, NewDevice};
    use crate::limits_source::LimitsSource;

    const G: u64 = 1 << 30;
    const MS: u64 = 1_000_000;

    fn config(dir: &Path, vars: &[(&str, &str)]) -> Config {
        let cache = dir.join("r.cache").display().to_string();
        let mut all = vec![("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache.as_str())];
        all.extend_from_slice(vars);
        let mut c = Config::from_vars(all);
        c.limits_default = dir.join("no-etc-vgpu").join("limits");
        c
    }

    fn uuid(d: &FakeCuda, ord: u32) -> String {
        driver::ordinal_uuid(d, ord).unwrap()
    }

    /// A region at `<dir>/r.cache` describing `uuids` (in that order).
    fn region(dir: &Path, uuids: &[String]) {
        let devs = uuids
            .iter()
            .map(|u| NewDevice {
                uuid: u.clone(),
                mem_limit: 4 * G,
                sm_limit: 0,
            })
            .collect();
        Ledger::create(&dir.join("r.cache"), 16, devs).unwrap();
    }

    /// `init_with` over `cuda` for `cfg` with its own limits source; the
    /// attached state and how many times it attached.
    fn init(
        cuda: &FakeCuda,
        clock: &FakeClock,
        cfg: &Config,
        real: impl Fn(std::ffi::c_uint) -> CUresult,
    ) -> (CUresult, Option<&'static Proc>, u32) {
        let src: &'static LimitsSource = Box::leak(Box::new(LimitsSource::new()));
        let attached = Cell::new(None);
        let tries = Cell::new(0);
        let attach = |may_init: bool, drv: &dyn CudaDriver| {
            tries.set(tries.get() + 1);
            let p = build_with(cfg.clone(), src, may_init, drv).map(|p| &*Box::leak(Box::new(p)));
            attached.set(p.or(attached.get()));
            p
        };
        let r = init_with(cuda, clock, attach, real, 0);
        (r, attached.get(), tries.get())
    }

    #[test]
    fn a_failing_cuinit_passes_through_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let cuda = FakeCuda::new(2, 80 * G);
        let clock = FakeClock::new(5_000 * MS);
        region(dir.path(), &[uuid(&cuda, 0), uuid(&cuda, 1)]);
        let cfg = config(dir.path(), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
        cuda.fail_next("cuInit", CUresult::CUDA_ERROR_NO_DEVICE);
        let real = |f| {
            clock.advance(3 * MS);
            cuda.init(f)
        };
        let (r, p, tries) = init(&cuda, &clock, &cfg, real);
        assert_eq!(r, CUresult::CUDA_ERROR_NO_DEVICE);
        let p = p.unwrap();
        assert_eq!(
            tries, 1,
            "the region existed: attached before the real call"
        );
        assert_eq!(
            cuda.count("cuDeviceGetCount"),
            0,
            "no device list after a failure"
        );
        let l = p.ledger.as_ref().unwrap();
        assert!(!l.is_bound(), "nothing to bind without a driver");
        let slot = l.region().slot(l.slot());
        let enter = slot.phase(RegionPhase::RealInitEnter);
        assert_eq!(enter, 5_000 * MS, "the phases follow the given clock");
        assert_eq!(slot.phase(RegionPhase::RealInitExit) - enter, 3 * MS);

        // The same image's driver working: its answer, and the devices bound.
        let (r, p, _) = init(&cuda, &clock, &cfg, |f| cuda.init(f));
        assert_eq!(r, CUresult::CUDA_SUCCESS);
        let p = p.unwrap();
        assert!(p.ledger.as_ref().unwrap().is_bound());
        assert_eq!(p.ndev.load(Ordering::Relaxed), 2);
        assert_eq!(p.mem_limit(1), Some(G));
    }

    #[test]
    fn a_memory_limit_without_a_usable_region_gets_a_private_ledger() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("r.cache"), b"not a region").unwrap();
        let cuda = FakeCuda::new(1, 80 * G);
        let cfg = config(dir.path(), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
        let src: &'static LimitsSource = Box::leak(Box::new(LimitsSource::new()));
        // Before the real cuInit the devices cannot be listed: try later.
        assert!(build_with(cfg.clone(), src, false, &cuda).is_none());
        let (p, lines) = crate::log::captured(|| build_with(cfg.clone(), src, true, &cuda));
        let p = p.unwrap();
        let l = p.ledger.as_ref().unwrap();
        assert_eq!(l.private_cause, Some(vgpu_region::Unusable::Foreign));
        assert_eq!(p.mem_limit(0), Some(G), "the limit holds");
        assert!(
            lines.iter().any(|l| l.contains("FAILING CLOSED")),
            "{lines:?}"
        );
        // No limit anywhere: no ledger, and said so.
        let cfg = config(dir.path(), &[]);
        let (p, lines) = crate::log::captured(|| build_with(cfg, src, true, &cuda));
        assert!(p.unwrap().ledger.is_none());
        assert!(
            lines.iter().any(|l| l.contains("no limit is configured")),
            "{lines:?}"
        );
    }

    #[test]
    fn a_lazy_cuinit_leaves_the_region_alone_and_its_stamps_to_the_attach() {
        let dir = tempfile::tempdir().unwrap();
        // The region lists ordinal 1 first: binding must happen at attach.
        let cuda = FakeCuda::new(2, 80 * G);
        region(dir.path(), &[uuid(&cuda, 1), uuid(&cuda, 0)]);
        let cfg = config(dir.path(), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
        let clock = FakeClock::new(7_000 * MS);
        let gen = process::generation().wrapping_add(1);
        let real = |f| {
            clock.advance(2 * MS);
            cuda.init(f)
        };
        let r = vgpu_region::Region::open(&dir.path().join("r.cache")).unwrap();
        let live = r.live_slots();
        assert_eq!(lazy(&clock, real, 0, gen), CUresult::CUDA_SUCCESS);
        assert_eq!(r.live_slots(), live, "cuInit claimed no slot");
        assert_eq!(cuda.count("cuDeviceGetCount"), 0, "nor asked for devices");

        // The first call that needs the region attaches, then the step
        // the lazy cuInit left: ordinals bound, its stamps in the slot.
        let src: &'static LimitsSource = Box::leak(Box::new(LimitsSource::new()));
        let p = build_with(cfg, src, true, &cuda).unwrap();
        assert_eq!(r.live_slots(), live + 1, "the attach claimed one");
        after_late_attach(&p, &cuda);
        let l = p.ledger.as_ref().unwrap();
        assert!(l.is_bound());
        assert_eq!((l.index(0), l.index(1)), (Some(1), Some(0)));
        assert_eq!(p.ndev.load(Ordering::Relaxed), 2);
        assert_eq!(p.mem_limit(1), Some(G));
        let slot = l.region().slot(l.slot());
        let enter = slot.phase(RegionPhase::RealInitEnter);
        assert_eq!(enter, 7_000 * MS, "the stamps of the cuInit itself");
        assert_eq!(slot.phase(RegionPhase::RealInitExit) - enter, 2 * MS);
        assert_eq!(slot.phase(RegionPhase::WrapperExit), 7_002 * MS);
        assert_eq!(
            slot.phase(RegionPhase::RegionMapped),
            0,
            "the region was not on the cuInit path"
        );
    }

    #[test]
    fn devices_bind_to_the_region_by_uuid_not_by_ordinal() {
        let dir = tempfile::tempdir().unwrap();
        let cuda = FakeCuda::new(3, 80 * G);
        let clock = FakeClock::new(1);
        // The region lists ordinal 2 first and lacks ordinal 1.
        region(dir.path(), &[uuid(&cuda, 2), uuid(&cuda, 0)]);
        let cfg = config(
            dir.path(),
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_2", "3g"),
            ],
        );
        let ((r, p, _), lines) =
            crate::log::captured(|| init(&cuda, &clock, &cfg, |f| cuda.init(f)));
        assert_eq!(r, CUresult::CUDA_SUCCESS);
        let p = p.unwrap();
        let l = p.ledger.as_ref().unwrap();
        assert_eq!(p.ndev.load(Ordering::Relaxed), 3);
        assert_eq!(
            (l.index(0), l.index(1), l.index(2)),
            (Some(1), None, Some(0))
        );
        assert_eq!(l.device_uuid(0), uuid(&cuda, 2));
        assert_eq!(p.mem_limit(2), Some(3 * G));
        assert_eq!(p.mem_limit(0), Some(2 * G));
        assert!(
            lines
                .iter()
                .any(|l| l.contains("does not describe CUDA device(s) [1]")),
            "{lines:?}"
        );
    }
}
