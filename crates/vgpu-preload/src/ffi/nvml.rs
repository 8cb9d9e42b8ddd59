//! NVML hooks: device count and handles consistent with
//! `CUDA_VISIBLE_DEVICES`, and the memory view consistent with
//! `cuMemGetInfo` (the logic is `views::nvml`'s). The library opens
//! `libnvidia-ml.so.1` lazily, at the first NVML hook.
use std::ffi::c_uint;

use vgpu_cuda_abi::*;

use crate::sys;
use crate::views::nvml::{budget, NvmlView};

fn count_hook(out: *mut c_uint, r: nvmlReturn_t) -> nvmlReturn_t {
    if r.is_success() {
        if let Some(n) = NvmlView::real().count() {
            // SAFETY: the driver just wrote through `out`.
            unsafe { sys::put(out, n) };
        }
    }
    r
}

fn handle_hook(index: c_uint, call: impl FnOnce(c_uint) -> nvmlReturn_t) -> nvmlReturn_t {
    match NvmlView::real().handle_index(index) {
        Ok(phys) => call(phys),
        Err(e) => e,
    }
}

/// The virtual (free, total) after a successful memory-info call.
fn memory_view(device: nvmlDevice_t, free: u64, total: u64) -> Option<(u64, u64)> {
    NvmlView::real().memory(device, free, total, budget)
}

crate::hooks! {
TABLE;
    [base: "nvmlDeviceGetCount", since: 0, ptds: false, family: "nvml view", policy: "number of CUDA_VISIBLE_DEVICES entries"]
    fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        count_hook(deviceCount, unsafe { real(deviceCount) })
    }

    [base: "nvmlDeviceGetCount", since: 0, ptds: false, family: "nvml view", policy: "as nvmlDeviceGetCount_v2"]
    fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        count_hook(deviceCount, unsafe { real(deviceCount) })
    }

    [base: "nvmlDeviceGetHandleByIndex", since: 0, ptds: false, family: "nvml view", policy: "index i is CUDA ordinal i (CUDA_VISIBLE_DEVICES order)"]
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments with the mapped index.
        handle_hook(index, |i| unsafe { real(i, device) })
    }

    [base: "nvmlDeviceGetHandleByIndex", since: 0, ptds: false, family: "nvml view", policy: "as nvmlDeviceGetHandleByIndex_v2"]
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments with the mapped index.
        handle_hook(index, |i| unsafe { real(i, device) })
    }

    [base: "nvmlDeviceGetIndex", since: 0, ptds: false, family: "nvml view", policy: "the device's CUDA ordinal"]
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, index) };
        if r.is_success() {
            match NvmlView::real().device_index(device) {
                None => {}
                // SAFETY: the driver just wrote through `index`.
                Some(Ok(i)) => unsafe { sys::put(index, i); },
                Some(Err(e)) => return e,
            }
        }
        r
    }

    [base: "nvmlDeviceGetMemoryInfo", since: 0, ptds: false, family: "nvml view", policy: "total = min(limit, physical); used = container usage"]
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, memory) };
        if r.is_success() {
            // SAFETY: the driver just filled `memory`.
            if let Some(m) = unsafe { sys::get(memory) } {
                if let Some((free, total)) = memory_view(device, m.free, m.total) {
                    // SAFETY: as above.
                    unsafe { sys::put(memory, nvmlMemory_t { total, free, used: total - free }) };
                }
            }
        }
        r
    }

    [base: "nvmlDeviceGetMemoryInfo", since: 0, ptds: false, family: "nvml view", policy: "as nvmlDeviceGetMemoryInfo; reserved reported as 0"]
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, memory) };
        if r.is_success() {
            // SAFETY: the driver just filled `memory`.
            if let Some(m) = unsafe { sys::get(memory) } {
                if let Some((free, total)) = memory_view(device, m.free, m.total) {
                    let v = nvmlMemory_v2_t { version: m.version, total, reserved: 0, free, used: total - free };
                    // SAFETY: as above.
                    unsafe { sys::put(memory, v) };
                }
            }
        }
        r
    }
}
