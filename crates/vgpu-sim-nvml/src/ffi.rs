//! The exported NVML C ABI (`nvml.h`, versioned names as it spells them).
//! Every export is `catch_unwind`-guarded; raw-pointer work lives here.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vgpu_cuda_abi::*;
use vgpu_sim::machine::{pci_bus, PCI_DEVICE_ID, PCI_SUBSYSTEM_ID, PCI_VENDOR_ID};
use vgpu_sim::telemetry::{self, Part};
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

/// Guarded exports of the list's entries (`vgpu_cuda_abi::guarded_exports!`).
macro_rules! nv {
    ($($t:tt)*) => {
        vgpu_cuda_abi::guarded_exports! { guard: run, returns: nvmlReturn_t, result: R; $($t)* }
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
    // SAFETY: the caller's contract, passed on.
    unsafe { process_list(h, Kind::Compute, count, infos, make) }
}

/// Which of NVML's process lists.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Compute,
    /// Graphics contexts: a simulated device runs none.
    Graphics,
    /// MPS clients: the simulation has no MPS server.
    Mps,
}

fn list_of(m: &Machine, dev: usize, kind: Kind) -> Vec<(u32, u64)> {
    match kind {
        Kind::Compute => m.compute_processes(dev),
        Kind::Graphics | Kind::Mps => Vec::new(),
    }
}

/// Safety: as `processes`.
unsafe fn process_list<T>(
    h: nvmlDevice_t,
    kind: Kind,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> R {
    if count.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    let (m, dev) = device(h.0 as u64)?;
    let procs = list_of(&m, dev, kind);
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

/// The device's part (telemetry figures) and its utilization now.
fn part_util(h: nvmlDevice_t) -> R<(std::sync::Arc<Machine>, usize, Part, u32)> {
    let (m, dev) = device(h.0 as u64)?;
    let cc = m.device(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?.cc_major;
    let u = m.utilization(dev);
    Ok((m, dev, telemetry::part(cc), u))
}

/// Safety: both out-pointers null or writable.
unsafe fn two<T>(a: *mut T, va: T, b: *mut T, vb: T) -> R {
    if a.is_null() || b.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, writable per the contract.
    unsafe {
        out(a, va)?;
        out(b, vb)
    }
}

/// A clock of `part` at `util`; `max` gives the maximum instead.
fn clock(part: &Part, util: u32, ty: c_uint, max: bool) -> R<c_uint> {
    let u = if max { 100 } else { util };
    Ok(match ty {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => part.sm_clock(u),
        NVML_CLOCK_MEM => part.mem_mhz,
        NVML_CLOCK_VIDEO => part.video_clock(u),
        _ => return Err(Ret::NVML_ERROR_INVALID_ARGUMENT),
    })
}

/// `00000000:10:00.0`, `0000:10:00.0`, `10:00.0` (and without `.0`) name
/// device `dev`'s bus, case-insensitively, as NVML accepts them.
fn bus_id_matches(id: &str, dev: usize) -> bool {
    let id = id.trim().to_ascii_lowercase();
    let (loc, func) = id.split_once('.').unwrap_or((id.as_str(), "0"));
    let parts: Vec<&str> = loc.split(':').collect();
    let (domain, bus, slot) = match parts.as_slice() {
        [d, b, s] => (*d, *b, *s),
        [b, s] => ("0", *b, *s),
        _ => return false,
    };
    let hex = |t: &str| u32::from_str_radix(t, 16).ok();
    hex(domain) == Some(0)
        && hex(bus) == Some(pci_bus(dev))
        && hex(slot) == Some(0)
        && hex(func) == Some(0)
}

unsafe fn handle_by_bus_id(id: *const c_char, h: *mut nvmlDevice_t) -> R {
    if id.is_null() || h.is_null() {
        return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
    }
    let m = nvml::machine()?;
    // SAFETY: non-null NUL-terminated string from the caller.
    let want = unsafe { CStr::from_ptr(id) }.to_string_lossy().into_owned();
    let dev = (0..m.device_count())
        .find(|d| bus_id_matches(&want, *d))
        .ok_or(Ret::NVML_ERROR_NOT_FOUND)?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(h, nvmlDevice_t(nvml::handle(dev) as *mut _)) }
}

nv! {
    fn nvmlDeviceGetGraphicsRunningProcesses(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Graphics, count, infos, |pid, mem| nvmlProcessInfo_v1_t { pid, usedGpuMemory: mem }) }
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Graphics, count, infos, v2_info) }
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Graphics, count, infos, v2_info) }
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Mps, count, infos, |pid, mem| nvmlProcessInfo_v1_t { pid, usedGpuMemory: mem }) }
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Mps, count, infos, v2_info) }
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) {
        // SAFETY: count/infos per nvml.h's contract.
        unsafe { process_list(h, Kind::Mps, count, infos, v2_info) }
    }
    fn nvmlDeviceGetRunningProcessDetailList(h: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t) {
        if plist.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller fills version, mode, array, size.
        let l = unsafe { plist.read() };
        if l.version != nvmlProcessDetailList_v1 {
            return Err(Ret::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let kind = match l.mode {
            NVML_PROCESS_MODE_COMPUTE => Kind::Compute,
            NVML_PROCESS_MODE_GRAPHICS => Kind::Graphics,
            NVML_PROCESS_MODE_MPS => Kind::Mps,
            _ => return Err(Ret::NVML_ERROR_INVALID_ARGUMENT),
        };
        let (m, dev) = device(h.0 as u64)?;
        let procs = list_of(&m, dev, kind);
        let cap = l.numProcArrayEntries as usize;
        // SAFETY: non-null in/out struct from the caller.
        unsafe { (*plist).numProcArrayEntries = procs.len() as c_uint };
        if procs.is_empty() {
            return Ok(());
        }
        if cap < procs.len() || l.procArray.is_null() {
            return Err(Ret::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (pid, mem)) in procs.into_iter().enumerate() {
            let d = nvmlProcessDetail_v1_t {
                pid,
                usedGpuMemory: mem,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
                usedGpuCcProtectedMemory: 0,
            };
            // SAFETY: i < len <= cap, the caller's array length.
            unsafe { l.procArray.add(i).write(d) };
        }
        Ok(())
    }

    fn nvmlDeviceGetClockInfo(h: nvmlDevice_t, ty: nvmlClockType_t, clk: *mut c_uint) {
        let (_, _, part, u) = part_util(h)?;
        let v = clock(&part, u, ty, false)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(clk, v) }
    }
    fn nvmlDeviceGetMaxClockInfo(h: nvmlDevice_t, ty: nvmlClockType_t, clk: *mut c_uint) {
        let (_, _, part, u) = part_util(h)?;
        let v = clock(&part, u, ty, true)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(clk, v) }
    }
    fn nvmlDeviceGetComputeMode(h: nvmlDevice_t, mode: *mut nvmlComputeMode_t) {
        device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mode, NVML_COMPUTEMODE_DEFAULT) }
    }
    fn nvmlDeviceGetDisplayActive(h: nvmlDevice_t, active: *mut nvmlEnableState_t) {
        device(h.0 as u64)?;
        // A data-centre board drives no display.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(active, NVML_FEATURE_DISABLED) }
    }
    fn nvmlDeviceGetDisplayMode(h: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mode, NVML_FEATURE_DISABLED) }
    }
    fn nvmlDeviceGetDriverModel(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        device(h.0 as u64)?;
        let _ = (current, pending);
        // Driver models (WDDM/TCC) exist on Windows only: a Linux driver
        // answers NOT_SUPPORTED, A100 and H100 alike.
        Err(Ret::NVML_ERROR_NOT_SUPPORTED)
    }
    fn nvmlDeviceGetDriverModel_v2(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        device(h.0 as u64)?;
        let _ = (current, pending);
        Err(Ret::NVML_ERROR_NOT_SUPPORTED)
    }
    fn nvmlDeviceGetPerformanceState(h: nvmlDevice_t, p: *mut nvmlPstates_t) {
        device(h.0 as u64)?;
        // Data-centre boards in persistence mode sit in P0, busy or idle.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(p, NVML_PSTATE_0) }
    }
    fn nvmlDeviceGetPersistenceMode(h: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mode, NVML_FEATURE_ENABLED) }
    }
    fn nvmlDeviceGetEnforcedPowerLimit(h: nvmlDevice_t, mw: *mut c_uint) {
        let (_, _, part, _) = part_util(h)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mw, part.power_limit_mw) }
    }
    fn nvmlDeviceGetPowerManagementLimit(h: nvmlDevice_t, mw: *mut c_uint) {
        let (_, _, part, _) = part_util(h)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mw, part.power_limit_mw) }
    }
    fn nvmlDeviceGetPowerManagementDefaultLimit(h: nvmlDevice_t, mw: *mut c_uint) {
        let (_, _, part, _) = part_util(h)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mw, part.power_limit_mw) }
    }
    fn nvmlDeviceGetPowerManagementLimitConstraints(h: nvmlDevice_t, min: *mut c_uint, max: *mut c_uint) {
        let (_, _, part, _) = part_util(h)?;
        // SAFETY: out-pointers from the caller; nulls rejected.
        unsafe { two(min, part.power_min_limit_mw, max, part.power_limit_mw) }
    }
    fn nvmlDeviceGetPowerUsage(h: nvmlDevice_t, mw: *mut c_uint) {
        let (_, _, part, u) = part_util(h)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(mw, part.power_mw(u)) }
    }
    fn nvmlDeviceGetFanSpeed(h: nvmlDevice_t, speed: *mut c_uint) {
        device(h.0 as u64)?;
        let _ = speed;
        // SXM boards are cooled by the chassis: no fan to report, as on a
        // real A100/H100 SXM.
        Err(Ret::NVML_ERROR_NOT_SUPPORTED)
    }
    fn nvmlDeviceGetTemperature(h: nvmlDevice_t, sensor: nvmlTemperatureSensors_t, t: *mut c_uint) {
        let (_, _, part, u) = part_util(h)?;
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(t, part.temperature_c(u)) }
    }
    fn nvmlDeviceGetTemperatureV(h: nvmlDevice_t, t: *mut nvmlTemperature_t) {
        if t.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets version and sensorType.
        let want = unsafe { t.read() };
        if want.version != nvmlTemperature_v1 {
            return Err(Ret::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (_, _, part, u) = part_util(h)?;
        if want.sensorType != NVML_TEMPERATURE_GPU {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        let v = nvmlTemperature_t { temperature: part.temperature_c(u) as i32, ..want };
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(t, v) }
    }
    fn nvmlDeviceGetTotalEccErrors(h: nvmlDevice_t, ty: nvmlMemoryErrorType_t, counter: nvmlEccCounterType_t, n: *mut u64) {
        device(h.0 as u64)?;
        if ty > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counter > NVML_AGGREGATE_ECC {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // ECC is on (HBM) and simulated memory never errs.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(n, 0) }
    }
    fn nvmlDeviceGetEncoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) {
        device(h.0 as u64)?;
        // No simulated encoder work: 0 % over the driver's sample period.
        // SAFETY: out-pointers from the caller; nulls rejected.
        unsafe { two(u, 0, period_us, ENC_DEC_PERIOD_US) }
    }
    fn nvmlDeviceGetDecoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) {
        device(h.0 as u64)?;
        // SAFETY: out-pointers from the caller; nulls rejected.
        unsafe { two(u, 0, period_us, ENC_DEC_PERIOD_US) }
    }
    fn nvmlDeviceGetMigMode(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        device(h.0 as u64)?;
        // MIG-capable parts with MIG off (NVML_DEVICE_MIG_DISABLE).
        // SAFETY: out-pointers from the caller; nulls rejected.
        unsafe { two(current, 0, pending, 0) }
    }
    fn nvmlDeviceIsMigDeviceHandle(h: nvmlDevice_t, is_mig: *mut c_uint) {
        device(h.0 as u64)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(is_mig, 0) }
    }
    fn nvmlDeviceGetMaxMigDeviceCount(h: nvmlDevice_t, n: *mut c_uint) {
        let (_, _, part, _) = part_util(h)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(n, part.max_mig_devices) }
    }
    fn nvmlDeviceGetMigDeviceHandleByIndex(h: nvmlDevice_t, index: c_uint, mig: *mut nvmlDevice_t) {
        device(h.0 as u64)?;
        let _ = index;
        if mig.is_null() {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // MIG is off: there is no MIG device at any index.
        Err(Ret::NVML_ERROR_NOT_FOUND)
    }
    fn nvmlDeviceGetBAR1MemoryInfo(h: nvmlDevice_t, bar1: *mut nvmlBAR1Memory_t) {
        let (m, dev, part, _) = part_util(h)?;
        let used = part.bar1_used(m.context_holders(dev));
        let v = nvmlBAR1Memory_t { bar1Total: part.bar1_bytes, bar1Free: part.bar1_bytes - used, bar1Used: used };
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(bar1, v) }
    }
    fn nvmlDeviceGetCudaComputeCapability(h: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        let (m, dev) = device(h.0 as u64)?;
        let d = m.device(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?;
        // SAFETY: out-pointers from the caller; nulls rejected.
        unsafe { two(major, d.cc_major as c_int, minor, d.cc_minor as c_int) }
    }
    fn nvmlDeviceGetConfComputeMemSizeInfo(h: nvmlDevice_t, info: *mut nvmlConfComputeMemSizeInfo_t) {
        let (m, dev, part, _) = part_util(h)?;
        // Confidential computing exists from Hopper on; with it off all
        // memory is unprotected. An A100 answers NOT_SUPPORTED.
        if !part.conf_compute {
            return Err(Ret::NVML_ERROR_NOT_SUPPORTED);
        }
        let total = m.device(dev).map_err(|_| Ret::NVML_ERROR_UNKNOWN)?.memory_bytes;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(info, nvmlConfComputeMemSizeInfo_t { protectedMemSizeKib: 0, unprotectedMemSizeKib: total >> 10 }) }
    }
    fn nvmlDeviceGetSerial(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (_, dev) = device(h.0 as u64)?;
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, &telemetry::serial(dev)) }
    }
    fn nvmlDeviceGetMinorNumber(h: nvmlDevice_t, n: *mut c_uint) {
        let (_, dev) = device(h.0 as u64)?;
        // /dev/nvidia<minor>: one per device in index order.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(n, dev as c_uint) }
    }
    fn nvmlDeviceGetPcieThroughput(h: nvmlDevice_t, counter: nvmlPcieUtilCounter_t, kib_s: *mut c_uint) {
        device(h.0 as u64)?;
        if counter > NVML_PCIE_UTIL_RX_BYTES {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        // Copies are not timed over a simulated bus: no traffic.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(kib_s, 0) }
    }
    fn nvmlDeviceGetFieldValues(h: nvmlDevice_t, n: c_int, values: *mut nvmlFieldValue_t) {
        let (_, _, part, _) = part_util(h)?;
        if n < 0 || (n > 0 && values.is_null()) {
            return Err(Ret::NVML_ERROR_INVALID_ARGUMENT);
        }
        let now_us = now_realtime_us();
        for i in 0..n as usize {
            // SAFETY: `values` holds `n` entries (C contract), non-null.
            let mut v = unsafe { values.add(i).read() };
            v.timestamp = now_us;
            v.latencyUsec = 0;
            match v.fieldId {
                NVML_FI_DEV_NVLINK_LINK_COUNT => {
                    v.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                    v.value = u64::from(part.nvlinks);
                    v.nvmlReturn = 0;
                }
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX..=NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX
                    if v.scopeId < part.nvlinks || v.scopeId == u32::MAX =>
                {
                    // Peer copies are not simulated: no NVLink traffic.
                    v.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    v.value = 0;
                    v.nvmlReturn = 0;
                }
                f if f >= NVML_FI_MAX => v.nvmlReturn = Ret::NVML_ERROR_INVALID_ARGUMENT.0,
                _ => v.nvmlReturn = Ret::NVML_ERROR_NOT_SUPPORTED.0,
            }
            // SAFETY: as above.
            unsafe { values.add(i).write(v) };
        }
        Ok(())
    }
    fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, h: *mut nvmlDevice_t) {
        // SAFETY: pointers per nvml.h's contract; nulls rejected.
        unsafe { handle_by_bus_id(id, h) }
    }
    fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, h: *mut nvmlDevice_t) {
        // SAFETY: pointers per nvml.h's contract; nulls rejected.
        unsafe { handle_by_bus_id(id, h) }
    }
}

/// What a real driver reports as the encoder/decoder sample period.
const ENC_DEC_PERIOD_US: c_uint = 167_000;

fn now_realtime_us() -> i64 {
    (vgpu_sim::clock::realtime_ns() / 1000) as i64
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
