//! Driver functions the library calls for itself (not hooked): device
//! enumeration, the current device, pool attributes, NVML UUIDs.
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use vgpu_cuda_abi::{
    nvmlDevice_t, nvmlReturn_t, CUdevice, CUmemPool_attribute, CUmemoryPool, CUresult, CUuuid,
};

use crate::hooks::{self, Lib};
use crate::sys;

type GetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
type GetDev = unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult;
type GetUuid = unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult;
type CtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
type PoolGetAttr = unsafe extern "C" fn(CUmemoryPool, CUmemPool_attribute, *mut c_void) -> CUresult;
type DevGetPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
type NvmlUuid = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;

pub struct CudaAux {
    count: Option<GetCount>,
    get: Option<GetDev>,
    uuid: Option<GetUuid>,
    ctx_dev: Option<CtxGetDevice>,
    pool_attr: Option<PoolGetAttr>,
    mem_pool: Option<DevGetPool>,
    default_pool: Option<DevGetPool>,
}

pub struct NvmlAux {
    uuid: Option<NvmlUuid>,
}

fn sym<F: Copy>(lib: Lib, name: &CStr) -> Option<F> {
    let p = sys::lookup(hooks::handle(lib), name);
    if p.is_null() {
        return None;
    }
    // SAFETY: each caller names the exact C type of the symbol it asks for.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

static CUDA: OnceLock<CudaAux> = OnceLock::new();
static NVML: OnceLock<NvmlAux> = OnceLock::new();

/// The CUDA helpers, loading the driver if needed (`None` without a driver).
pub fn cuda() -> Option<&'static CudaAux> {
    if let Some(a) = CUDA.get() {
        return Some(a);
    }
    if !hooks::ensure(Lib::Cuda) {
        return None;
    }
    Some(CUDA.get_or_init(|| CudaAux {
        count: sym(Lib::Cuda, c"cuDeviceGetCount"),
        get: sym(Lib::Cuda, c"cuDeviceGet"),
        uuid: sym(Lib::Cuda, c"cuDeviceGetUuid_v2").or_else(|| sym(Lib::Cuda, c"cuDeviceGetUuid")),
        ctx_dev: sym(Lib::Cuda, c"cuCtxGetDevice"),
        pool_attr: sym(Lib::Cuda, c"cuMemPoolGetAttribute"),
        mem_pool: sym(Lib::Cuda, c"cuDeviceGetMemPool"),
        default_pool: sym(Lib::Cuda, c"cuDeviceGetDefaultMemPool"),
    }))
}

pub fn nvml() -> Option<&'static NvmlAux> {
    if let Some(a) = NVML.get() {
        return Some(a);
    }
    if !hooks::ensure(Lib::Nvml) {
        return None;
    }
    Some(NVML.get_or_init(|| NvmlAux {
        uuid: sym(Lib::Nvml, c"nvmlDeviceGetUUID"),
    }))
}

/// Formats a CUDA UUID the way NVML and `CUDA_VISIBLE_DEVICES` spell it.
pub fn format_uuid(u: &CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

impl CudaAux {
    pub fn device_count(&self) -> Option<u32> {
        let f = self.count?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-parameter.
        let r = unsafe { f(&mut n) };
        (r.is_success() && n >= 0).then_some(n as u32)
    }

    pub fn uuid(&self, ordinal: CUdevice) -> Option<String> {
        let (get, uuid) = (self.get?, self.uuid?);
        let mut d: CUdevice = 0;
        // SAFETY: `d` is a valid out-parameter.
        if !unsafe { get(&mut d, ordinal) }.is_success() {
            return None;
        }
        let mut u = CUuuid::default();
        // SAFETY: `u` is a valid out-parameter of the declared type.
        unsafe { uuid(&mut u, d) }
            .is_success()
            .then(|| format_uuid(&u))
    }

    /// The current context's device ordinal.
    pub fn current_device(&self) -> Option<u32> {
        let f = self.ctx_dev?;
        let mut d: CUdevice = 0;
        // SAFETY: `d` is a valid out-parameter.
        let r = unsafe { f(&mut d) };
        (r.is_success() && d >= 0).then_some(d as u32)
    }

    /// A u64 pool attribute (reserved/used memory).
    pub fn pool_attr(&self, pool: CUmemoryPool, attr: CUmemPool_attribute) -> Option<u64> {
        let f = self.pool_attr?;
        let mut v: u64 = 0;
        // SAFETY: the memory attributes are `cuuint64_t`, which `v` is.
        let r = unsafe { f(pool, attr, (&mut v as *mut u64).cast()) };
        r.is_success().then_some(v)
    }

    /// The current pool of device `dev` (what `cuMemAllocAsync` draws from).
    pub fn current_pool(&self, dev: u32) -> Option<CUmemoryPool> {
        let f = self.mem_pool.or(self.default_pool)?;
        let mut p = CUmemoryPool::NULL;
        // SAFETY: `p` is a valid out-parameter.
        let r = unsafe { f(&mut p, dev as CUdevice) };
        (r.is_success() && !p.is_null()).then_some(p)
    }
}

impl NvmlAux {
    pub fn uuid(&self, dev: nvmlDevice_t) -> Option<String> {
        let f = self.uuid?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: `buf` holds 96 bytes, the size passed.
        let r = unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) };
        if !r.is_success() {
            return None;
        }
        // SAFETY: NVML NUL-terminates within the given length on success.
        unsafe { sys::cstr(buf.as_ptr()) }.map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format_matches_nvml() {
        let mut u = CUuuid::default();
        for (i, b) in u.bytes.iter_mut().enumerate() {
            *b = (i as u8 * 17) as c_char;
        }
        assert_eq!(format_uuid(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
