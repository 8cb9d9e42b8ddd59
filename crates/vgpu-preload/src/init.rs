//! The `cuInit` hook's work, per process image once, in phases each
//! timestamped into the slot: attach (map the region, claim a slot), the
//! real `cuInit`, the driver's device count, identity's post-init step.
//!
//! Must never wait on another process: mapping the region and claiming a
//! slot are local file operations and one CAS; identity is not on this
//! path unless `LIBVGPU_IDENTITY=eager` asks for it.
use std::sync::atomic::{AtomicU32, Ordering};

use vgpu_cuda_abi::CUresult;

use crate::attach::{self, Proc};
use crate::clock::{Clock, MONOTONIC};
use crate::driver::{self, CudaDriver, REAL_CUDA};
use crate::ledger::RegionPhase;
use crate::process;

/// The generation + 1 whose `cuInit` phases have run (0: none yet).
static INIT_GEN: AtomicU32 = AtomicU32::new(0);

/// The `cuInit` hook, around the real call `real`.
pub fn cu_init(real: impl Fn(std::ffi::c_uint) -> CUresult, flags: std::ffi::c_uint) -> CUresult {
    let gen = process::generation().wrapping_add(1);
    if INIT_GEN.load(Ordering::Acquire) == gen {
        return real(flags);
    }
    let r = init_with(&REAL_CUDA, &MONOTONIC, attach::attach, real, flags);
    INIT_GEN.store(gen, Ordering::Release);
    r
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
