//! The NVML probe's driver: `vgpu_identity::probe::ProbeDriver` over the
//! real (not hooked) CUDA and NVML functions. FFI lives here; each unsafe
//! block says why it holds.
//!
//! Device numbering: the probe is given a CUDA ordinal (what the process's
//! context is for). NVML numbers devices physically and ignores
//! `CUDA_VISIBLE_DEVICES`, so the NVML handle is found by the device's UUID;
//! only when the UUID is unavailable is the ordinal used as the NVML index.
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use vgpu_cuda_abi::{
    nvmlDevice_t, nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t, nvmlReturn_t, CUcontext, CUdevice,
};
use vgpu_identity::probe::{DriverCall, DriverError, ProbeDriver};

use crate::hooks::cuda::{cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRetain};
use crate::hooks::{self, Lib};
use crate::{aux, sys};

type NvmlInit = unsafe extern "C" fn() -> nvmlReturn_t;
type NvmlByUuid = unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
type NvmlByIndex = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type NvmlProcs<T> = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t;
type CuDeviceGet = unsafe extern "C" fn(*mut CUdevice, c_int) -> vgpu_cuda_abi::CUresult;

/// Which process-list entry point the driver has (newest first).
#[derive(Clone, Copy)]
enum Procs {
    /// `_v3` / `_v2`: `nvmlProcessInfo_v2_t` entries.
    V2(NvmlProcs<nvmlProcessInfo_v2_t>),
    /// The original: `nvmlProcessInfo_v1_t` entries.
    V1(NvmlProcs<nvmlProcessInfo_v1_t>),
}

/// Real CUDA/NVML calls for one probe (NVML initialised for its lifetime).
pub struct RealDriver {
    retain: cuDevicePrimaryCtxRetain::Fn,
    release: cuDevicePrimaryCtxRelease_v2::Fn,
    device_get: CuDeviceGet,
    nvml_shutdown: Option<NvmlInit>,
    by_uuid: Option<NvmlByUuid>,
    by_index: Option<NvmlByIndex>,
    procs: Procs,
    /// (CUDA ordinal, NVML handle) of the last lookup.
    cached: Option<(u32, nvmlDevice_t)>,
}

fn sym<F: Copy>(lib: Lib, name: &CStr) -> Option<F> {
    let p = sys::lookup(hooks::handle(lib), name);
    if p.is_null() {
        return None;
    }
    // SAFETY: each caller names the exact C type (nvml.h / cuda.h) of the
    // symbol it asks for; function and data pointers share a representation.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl RealDriver {
    /// `None` when either driver (or a needed function) is missing, or
    /// NVML does not initialise: the probe tier is then not available.
    pub fn new() -> Option<RealDriver> {
        let retain = hooks::real::<cuDevicePrimaryCtxRetain::Fn>(
            &cuDevicePrimaryCtxRetain::REAL,
            Lib::Cuda,
        )?;
        let release = hooks::real::<cuDevicePrimaryCtxRelease_v2::Fn>(
            &cuDevicePrimaryCtxRelease_v2::REAL,
            Lib::Cuda,
        )?;
        let device_get: CuDeviceGet = sym(Lib::Cuda, c"cuDeviceGet")?;
        if !hooks::ensure(Lib::Nvml) {
            return None;
        }
        let procs = sym::<NvmlProcs<nvmlProcessInfo_v2_t>>(
            Lib::Nvml,
            c"nvmlDeviceGetComputeRunningProcesses_v3",
        )
        .or_else(|| sym(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses_v2"))
        .map(Procs::V2)
        .or_else(|| sym(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses").map(Procs::V1))?;
        let init: NvmlInit =
            sym(Lib::Nvml, c"nvmlInit_v2").or_else(|| sym(Lib::Nvml, c"nvmlInit"))?;
        // SAFETY: nvmlInit_v2 takes no arguments; NVML counts inits, and
        // Drop balances this one with nvmlShutdown.
        if !unsafe { init() }.is_success() {
            return None;
        }
        Some(RealDriver {
            retain,
            release,
            device_get,
            nvml_shutdown: sym(Lib::Nvml, c"nvmlShutdown"),
            by_uuid: sym(Lib::Nvml, c"nvmlDeviceGetHandleByUUID"),
            by_index: sym(Lib::Nvml, c"nvmlDeviceGetHandleByIndex_v2")
                .or_else(|| sym(Lib::Nvml, c"nvmlDeviceGetHandleByIndex")),
            procs,
            cached: None,
        })
    }

    fn nvml_handle(&mut self, ordinal: u32) -> Result<nvmlDevice_t, DriverError> {
        if let Some((o, h)) = self.cached {
            if o == ordinal {
                return Ok(h);
            }
        }
        let err = |code: i32| DriverError {
            call: DriverCall::NvmlPids,
            code,
        };
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        let uuid = aux::cuda().and_then(|a| a.uuid(ordinal as CUdevice));
        let r = match (uuid, self.by_uuid, self.by_index) {
            (Some(u), Some(f), _) => {
                let c = std::ffi::CString::new(u)
                    .map_err(|_| err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT.0 as i32))?;
                // SAFETY: NUL-terminated UUID string and a valid out-pointer.
                unsafe { f(c.as_ptr(), &mut h) }
            }
            (_, _, Some(f)) => {
                // SAFETY: valid out-pointer.
                unsafe { f(ordinal, &mut h) }
            }
            _ => nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND,
        };
        if !r.is_success() {
            return Err(err(r.0 as i32));
        }
        self.cached = Some((ordinal, h));
        Ok(h)
    }

    fn cuda_device(&self, ordinal: u32, call: DriverCall) -> Result<CUdevice, DriverError> {
        let mut d: CUdevice = 0;
        // SAFETY: valid out-pointer; the ordinal is range-checked by the driver.
        let r = unsafe { (self.device_get)(&mut d, ordinal as c_int) };
        if r.is_success() {
            Ok(d)
        } else {
            Err(DriverError {
                call,
                code: r.0 as i32,
            })
        }
    }
}

/// Calls a process-list function, growing the buffer when NVML says it is
/// too small (other processes may start between the two calls).
fn list<T: Copy + Default>(
    f: NvmlProcs<T>,
    dev: nvmlDevice_t,
    pid: impl Fn(&T) -> u32,
) -> Result<Vec<u32>, DriverError> {
    let mut cap: usize = 256;
    for _ in 0..4 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        // SAFETY: `buf` holds `n` entries of the struct this entry point
        // fills; NVML writes at most `n` and sets `n` to the count.
        let r = unsafe { f(dev, &mut n, buf.as_mut_ptr()) };
        if r.is_success() {
            buf.truncate((n as usize).min(cap));
            return Ok(buf.iter().map(pid).collect());
        }
        if r != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            return Err(DriverError {
                call: DriverCall::NvmlPids,
                code: r.0 as i32,
            });
        }
        cap = (n as usize).max(cap) * 2;
    }
    Err(DriverError {
        call: DriverCall::NvmlPids,
        code: nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE.0 as i32,
    })
}

impl ProbeDriver for RealDriver {
    fn nvml_pids(&mut self, device: u32) -> Result<Vec<u32>, DriverError> {
        let h = self.nvml_handle(device)?;
        match self.procs {
            Procs::V2(f) => list(f, h, |p: &nvmlProcessInfo_v2_t| p.pid),
            Procs::V1(f) => list(f, h, |p: &nvmlProcessInfo_v1_t| p.pid),
        }
    }

    fn retain_primary(&mut self, device: u32) -> Result<(), DriverError> {
        let d = self.cuda_device(device, DriverCall::RetainPrimary)?;
        let mut ctx = CUcontext(std::ptr::null_mut());
        // SAFETY: the driver's cuDevicePrimaryCtxRetain with a valid
        // out-pointer and a device handle it returned.
        let r = unsafe { (self.retain)(&mut ctx, d) };
        if r.is_success() {
            Ok(())
        } else {
            Err(DriverError {
                call: DriverCall::RetainPrimary,
                code: r.0 as i32,
            })
        }
    }

    fn release_primary(&mut self, device: u32) -> Result<(), DriverError> {
        let d = self.cuda_device(device, DriverCall::ReleasePrimary)?;
        // SAFETY: releases the retain `retain_primary` made on this device.
        let r = unsafe { (self.release)(d) };
        if r.is_success() {
            Ok(())
        } else {
            Err(DriverError {
                call: DriverCall::ReleasePrimary,
                code: r.0 as i32,
            })
        }
    }
}

impl Drop for RealDriver {
    fn drop(&mut self) {
        if let Some(f) = self.nvml_shutdown {
            // SAFETY: balances the nvmlInit of `new`.
            unsafe { f() };
        }
    }
}
