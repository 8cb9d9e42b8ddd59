//! The exported NVML C ABI (`nvml.h`, versioned names as it spells them).
//! Every export is `catch_unwind`-guarded; raw-pointer work lives here.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vgpu_cuda_abi::*;
use vgpu_sim::machine::{pci_bus, PCI_DEVICE_ID, PCI_SUBSYSTEM_ID, PCI_VENDOR_ID};
use vgpu_sim::{log, Machine};

use crate::nvml::{self, device, R};

type Ret = nvmlReturn_t;

fn run(name: &str, f: impl FnOnce() -> R) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ret::NVML_SUCCESS,
        Ok(Err(e)) => {
            if log::enabled(log::DEBUG) {
                log::log(log::DEBUG, &format!("{name} -> {e:?}"));
            }
            e
        }
        Err(_) => {
            log::log(
                log::ERROR,
                &format!("{name}: internal panic caught; returning NVML_ERROR_UNKNOWN"),
            );
            Ret::NVML_ERROR_UNKNOWN
        }
    }
}

macro_rules! nv {
    ($( fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> nvmlReturn_t {
                run(stringify!($name), move || -> R { $body })
            }
        )*
    };
}

/// Safety: `p` is null or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and writable per this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copy `s` and its NUL into a caller buffer of `len` bytes; too small is
/// NVML_ERROR_INSUFFICIENT_SIZE (NVML never truncates).
///
/// Safety: `buf` is null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> R {
    if buf.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(Ret::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 bytes; no overlap with `s`.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn fixed<const N: usize>(s: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (d, b) in a.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    a
}

fn pci_info(dev: usize) -> nvmlPciInfo_t {
    let bus = pci_bus(dev);
    nvmlPciInfo_t {
        busIdLegacy: fixed(&format!("0000:{bus:02x}:00.0")),
        domain: 0,
        bus,
        device: 0,
        pciDeviceId: (PCI_DEVICE_ID << 16) | PCI_VENDOR_ID,
        pciSubSystemId: PCI_SUBSYSTEM_ID,
        busId: fixed(&format!("00000000:{bus:02x}:00.0")),
    }
}

/// The compute-process list in any of the three struct versions.
///
/// Safety: `count` is null or a valid in/out count; `infos` is null or
/// holds `*count` elements.
unsafe fn processes<T>(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> R {
    if count.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    let (m, dev) = device(h.0 as u64)?;
    let procs = m.compute_processes(dev);
    // SAFETY: non-null in/out count from the caller.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = procs.len() as c_uint };
    if procs.is_empty() {
        return Ok(());
    }
    if cap < procs.len() {
        return Err(Ret::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if infos.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    for (i, (pid, mem)) in procs.into_iter().enumerate() {
        // SAFETY: i < procs.len() <= cap, the caller's array length.
        unsafe { infos.add(i).write(make(pid, mem)) };
    }
    Ok(())
}

static UNKNOWN_ERROR: &CStr = c"Unknown Error";

nv! {
    fn nvmlInit() { nvml::init() }
    fn nvmlInit_v2() { nvml::init() }
    fn nvmlInitWithFlags(flags: c_uint) {
        // NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH
        if flags & !3 != 0 {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        nvml::init()
    }
    fn nvmlShutdown() { nvml::shutdown() }

    fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) {
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, nvml::DRIVER_VERSION) }
    }
    fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) {
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, &format!("12.{}", nvml::DRIVER_VERSION)) }
    }
    fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) {
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(v, nvml::CUDA_DRIVER_VERSION) }
    }
    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) {
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(v, nvml::CUDA_DRIVER_VERSION) }
    }

    fn nvmlDeviceGetCount(n: *mut c_uint) {
        let m = nvml::machine()?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(n, m.device_count() as c_uint) }
    }
    fn nvmlDeviceGetCount_v2(n: *mut c_uint) {
        let m = nvml::machine()?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(n, m.device_count() as c_uint) }
    }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut nvmlDevice_t) {
        // SAFETY: same contract as _v2.
        unsafe { handle_by_index(i, h) }
    }
    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut nvmlDevice_t) {
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { handle_by_index(i, h) }
    }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut nvmlDevice_t) {
        if uuid.is_null() || h.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        let m = nvml::machine()?;
        // SAFETY: non-null NUL-terminated string from the caller.
        let want = unsafe { CStr::from_ptr(uuid) }.to_bytes();
        let dev = (0..m.device_count())
            .find(|d| Machine::device_uuid_string(*d).as_bytes().eq_ignore_ascii_case(want))
            .ok_or(Ret::NVML_ERROR_NOT_FOUND)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(h, nvmlDevice_t(nvml::handle(dev) as *mut _)) }
    }
    fn nvmlDeviceGetIndex(h: nvmlDevice_t, i: *mut c_uint) {
        let (_, dev) = device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(i, dev as c_uint) }
    }
    fn nvmlDeviceGetUUID(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (_, dev) = device(h.0 as u64)?;
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, &Machine::device_uuid_string(dev)) }
    }
    fn nvmlDeviceGetName(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (m, dev) = device(h.0 as u64)?;
        let name = m.device_name(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?;
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, &name) }
    }
    fn nvmlDeviceGetMemoryInfo(h: nvmlDevice_t, mem: *mut nvmlMemory_t) {
        let (m, dev) = device(h.0 as u64)?;
        let total = m.device(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?.memory_bytes;
        let used = m.used(dev).min(total);
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mem, nvmlMemory_t { total, free: total - used, used }) }
    }
    fn nvmlDeviceGetMemoryInfo_v2(h: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) {
        if mem.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call.
        let version = unsafe { (*mem).version };
        if version != nvmlMemory_v2 {
            return Err(Ret::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (m, dev) = device(h.0 as u64)?;
        let total = m.device(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?.memory_bytes;
        let used = m.used(dev).min(total);
        // The simulation reserves nothing for the driver itself.
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(mem, nvmlMemory_v2_t { version, total, reserved: 0, free: total - used, used }) }
    }
    fn nvmlDeviceGetPciInfo(h: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, dev) = device(h.0 as u64)?;
        if pci.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        let v = pci_info(dev);
        // The v1 struct ends after pciSubSystemId (plus reserved words): fill
        // only the fields every version shares.
        // SAFETY: non-null; every version of the struct has these fields
        // at these offsets.
        unsafe {
            (*pci).busIdLegacy = v.busIdLegacy;
            (*pci).domain = v.domain;
            (*pci).bus = v.bus;
            (*pci).device = v.device;
            (*pci).pciDeviceId = v.pciDeviceId;
            (*pci).pciSubSystemId = v.pciSubSystemId;
        }
        Ok(())
    }
    fn nvmlDeviceGetPciInfo_v2(h: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, dev) = device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(pci, pci_info(dev)) }
    }
    fn nvmlDeviceGetPciInfo_v3(h: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, dev) = device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(pci, pci_info(dev)) }
    }
    fn nvmlDeviceGetComputeRunningProcesses(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { processes(h, count, infos, |pid, mem| nvmlProcessInfo_v1_t { pid, usedGpuMemory: mem }) }
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { processes(h, count, infos, v2_info) }
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { processes(h, count, infos, v2_info) }
    }
    fn nvmlDeviceGetUtilizationRates(h: nvmlDevice_t, u: *mut nvmlUtilization_t) {
        let (m, dev) = device(h.0 as u64)?;
        // Memory-controller activity is not simulated: reported as 0.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(u, nvmlUtilization_t { gpu: m.utilization(dev), memory: 0 }) }
    }
    fn nvmlDeviceGetProcessUtilization(
        h: nvmlDevice_t,
        samples: *mut nvmlProcessUtilizationSample_t,
        count: *mut c_uint,
        last_seen: u64
    ) {
        if count.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        let (m, dev) = device(h.0 as u64)?;
        let list = m.process_utilization(dev, last_seen);
        // SAFETY: non-null in/out count from the caller.
        let cap = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if list.is_empty() {
            return Err(Ret::NVML_ERROR_NOT_FOUND);
        }
        if samples.is_null() || cap < list.len() {
            return Err(Ret::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, sm, ts)) in list.into_iter().enumerate() {
            let s = nvmlProcessUtilizationSample_t { pid, timeStamp: ts, smUtil: sm, memUtil: 0, encUtil: 0, decUtil: 0 };
            // SAFETY: i < list.len() <= cap, the caller's array length.
            unsafe { samples.add(i).write(s) };
        }
        Ok(())
    }
}

fn v2_info(pid: u32, mem: u64) -> nvmlProcessInfo_v2_t {
    nvmlProcessInfo_v2_t {
        pid,
        usedGpuMemory: mem,
        // Not a MIG device: NVML reports 0xFFFFFFFF for both.
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

unsafe fn handle_by_index(i: c_uint, h: *mut nvmlDevice_t) -> R {
    let m = nvml::machine()?;
    if h.is_null() || i as usize >= m.device_count() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(h, nvmlDevice_t(nvml::handle(i as usize) as *mut _)) }
}

/// `nvmlErrorString`: a static string for every code (never NULL).
#[no_mangle]
pub extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    static MSGS: &[(u32, &CStr)] = &[
        (0, c"Success"),
        (1, c"Uninitialized"),
        (2, c"Invalid Argument"),
        (3, c"Not Supported"),
        (4, c"Insufficient Permissions"),
        (5, c"Already Initialized"),
        (6, c"Not Found"),
        (7, c"Insufficient Size"),
        (9, c"Driver Not Loaded"),
        (10, c"Timeout"),
        (12, c"NVML Shared Library Not Found"),
        (13, c"Function Not Found"),
        (15, c"GPU is lost"),
        (20, c"Insufficient Memory"),
        (21, c"No data"),
        (25, c"Argument version mismatch"),
    ];
    MSGS.iter()
        .find(|(c, _)| *c == r.0)
        .map(|(_, s)| s.as_ptr())
        .unwrap_or(UNKNOWN_ERROR.as_ptr())
}
