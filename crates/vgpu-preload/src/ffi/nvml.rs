//! NVML hooks: device count and handles consistent with
//! `CUDA_VISIBLE_DEVICES`, and the memory view consistent with
//! `cuMemGetInfo`. The library opens `libnvidia-ml.so.1` lazily.
use std::ffi::c_uint;
use std::sync::Mutex;

use vgpu_cuda_abi::*;

use crate::hooks::{self, Lib};
use crate::ledger::View;
use crate::{aux, state, sys, visible};

/// Physical NVML devices in CUDA ordinal order, once NVML is initialized.
static MAP: Mutex<Option<Vec<(u32, usize)>>> = Mutex::new(None);

/// The visible devices as (physical index, handle), or `None` when
/// `CUDA_VISIBLE_DEVICES` is unset (NVML's own numbering applies) or NVML
/// cannot be asked yet.
fn visible_map() -> Option<Vec<(u32, usize)>> {
    let var = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let mut m = MAP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = m.as_ref() {
        return Some(v.clone());
    }
    let count = hooks::real::<nvmlDeviceGetCount_v2::Fn>(&nvmlDeviceGetCount_v2::REAL, Lib::Nvml)?;
    let by_index = hooks::real::<nvmlDeviceGetHandleByIndex_v2::Fn>(
        &nvmlDeviceGetHandleByIndex_v2::REAL,
        Lib::Nvml,
    )?;
    let a = aux::nvml()?;
    let mut n: c_uint = 0;
    // SAFETY: `n` is a valid out-parameter.
    if !unsafe { count(&mut n) }.is_success() {
        return None; // not initialized yet: try again next time
    }
    let mut handles = Vec::new();
    let mut uuids = Vec::new();
    for i in 0..n {
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        // SAFETY: `h` is a valid out-parameter.
        if !unsafe { by_index(i, &mut h) }.is_success() {
            return None;
        }
        uuids.push(a.uuid(h).unwrap_or_default());
        handles.push(h.0 as usize);
    }
    let v: Vec<(u32, usize)> = visible::resolve(Some(&var), &uuids)
        .into_iter()
        .map(|i| (i, handles[i as usize]))
        .collect();
    *m = Some(v.clone());
    Some(v)
}

/// The CUDA ordinal of an NVML handle (its NVML index when no mapping applies).
fn ordinal_of(dev: nvmlDevice_t) -> Option<u32> {
    if let Some(m) = visible_map() {
        return m
            .iter()
            .position(|&(_, h)| h == dev.0 as usize)
            .map(|i| i as u32);
    }
    let f = hooks::real::<nvmlDeviceGetIndex::Fn>(&nvmlDeviceGetIndex::REAL, Lib::Nvml)?;
    let mut i: c_uint = 0;
    // SAFETY: `i` is a valid out-parameter.
    unsafe { f(dev, &mut i) }.is_success().then_some(i)
}

/// (limit, container usage) for CUDA ordinal `ord`; limit 0 = none.
fn budget(ord: u32) -> (u64, u64) {
    if let Some(p) = state::attached() {
        return (p.mem_limit(ord), p.used(ord));
    }
    // A process that only asks NVML (nvidia-smi, a monitor) reads the
    // region without claiming a slot; before the region exists (it is
    // created at the first cuInit) the environment's limit applies with
    // nothing in use.
    static VIEW: Mutex<Option<&'static View>> = Mutex::new(None);
    let cfg = state::config_once();
    let mut v = VIEW.lock().unwrap_or_else(|e| e.into_inner());
    if v.is_none() && cfg.cache.exists() {
        match View::open(&cfg.cache) {
            Ok(view) => *v = Some(Box::leak(Box::new(view))),
            Err(e) => crate::debug!("NVML view without the region: {e}"),
        }
    }
    match *v {
        Some(view) => (view.mem_limit(ord), view.used(ord)),
        None => (cfg.mem_limit(ord), 0),
    }
}

fn count_hook(out: *mut c_uint, r: nvmlReturn_t) -> nvmlReturn_t {
    if r.is_success() {
        if let Some(m) = visible_map() {
            // SAFETY: the driver just wrote through `out`.
            unsafe { sys::put(out, m.len() as c_uint) };
        }
    }
    r
}

fn handle_hook(
    index: c_uint,
    out: *mut nvmlDevice_t,
    call: impl FnOnce(c_uint) -> nvmlReturn_t,
) -> nvmlReturn_t {
    match visible_map() {
        None => call(index),
        Some(m) => match m.get(index as usize) {
            Some(&(phys, _)) => call(phys),
            None => {
                let _ = out;
                nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT
            }
        },
    }
}

crate::hooks! {
TABLE;
    [Nvml, "nvmlDeviceGetCount", 0, false, "nvml view", "number of CUDA_VISIBLE_DEVICES entries"]
    fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        count_hook(deviceCount, unsafe { real(deviceCount) })
    }

    [Nvml, "nvmlDeviceGetCount", 0, false, "nvml view", "as nvmlDeviceGetCount_v2"]
    fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        count_hook(deviceCount, unsafe { real(deviceCount) })
    }

    [Nvml, "nvmlDeviceGetHandleByIndex", 0, false, "nvml view", "index i is CUDA ordinal i (CUDA_VISIBLE_DEVICES order)"]
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments with the mapped index.
        handle_hook(index, device, |i| unsafe { real(i, device) })
    }

    [Nvml, "nvmlDeviceGetHandleByIndex", 0, false, "nvml view", "as nvmlDeviceGetHandleByIndex_v2"]
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments with the mapped index.
        handle_hook(index, device, |i| unsafe { real(i, device) })
    }

    [Nvml, "nvmlDeviceGetIndex", 0, false, "nvml view", "the device's CUDA ordinal"]
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, index) };
        if r.is_success() && std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
            match visible_map().and_then(|m| m.iter().position(|&(_, h)| h == device.0 as usize)) {
                // SAFETY: the driver just wrote through `index`.
                Some(i) => unsafe { sys::put(index, i as c_uint); },
                None => return nvmlReturn_t::NVML_ERROR_NOT_FOUND,
            }
        }
        r
    }

    [Nvml, "nvmlDeviceGetMemoryInfo", 0, false, "nvml view", "total = min(limit, physical); used = container usage"]
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, memory) };
        if r.is_success() {
            if let Some(ord) = ordinal_of(device) {
                let (limit, used) = budget(ord);
                // SAFETY: the driver just filled `memory`.
                if let (true, Some(m)) = (limit != 0, unsafe { sys::get(memory) }) {
                    let (free, total) = crate::policy::view(limit, used, m.free, m.total);
                    // SAFETY: as above.
                    unsafe { sys::put(memory, nvmlMemory_t { total, free, used: total - free }) };
                }
            }
        }
        r
    }

    [Nvml, "nvmlDeviceGetMemoryInfo", 0, false, "nvml view", "as nvmlDeviceGetMemoryInfo; reserved reported as 0"]
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, memory) };
        if r.is_success() {
            if let Some(ord) = ordinal_of(device) {
                let (limit, used) = budget(ord);
                // SAFETY: the driver just filled `memory`.
                if let (true, Some(m)) = (limit != 0, unsafe { sys::get(memory) }) {
                    let (free, total) = crate::policy::view(limit, used, m.free, m.total);
                    let v = nvmlMemory_v2_t { version: m.version, total, reserved: 0, free, used: total - free };
                    // SAFETY: as above.
                    unsafe { sys::put(memory, v) };
                }
            }
        }
        r
    }
}
