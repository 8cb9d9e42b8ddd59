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
use crate::driver::{self, CudaDriver, REAL_CUDA};
use crate::ledger::RegionPhase;
use crate::limiter::clock::{Clock, MONOTONIC};
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
