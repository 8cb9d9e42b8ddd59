//! NVML hooks: device count and handles consistent with
//! `CUDA_VISIBLE_DEVICES`, and the memory view consistent with
//! `cuMemGetInfo` (the logic is `views::nvml`'s). The library opens
//! `libnvidia-ml.so.1` lazily, at the first NVML hook.
use std::ffi::c_uint;

use vgpu_cuda_abi::*;

use crate::sys;
use crate::views::nvml::{budget, NvmlView};
use crate::views::procs::{self, Entry};

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

/// The driver's whole list (its answer grows with the buffer asked for).
fn fetch<T: Copy + Default>(
    mut f: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut cap: usize = 64;
    for _ in 0..6 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        let r = f(&mut n, buf.as_mut_ptr());
        if r.is_success() {
            buf.truncate((n as usize).min(cap));
            return Ok(buf);
        }
        if r != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            return Err(r);
        }
        cap = (n as usize).max(cap) * 2;
    }
    Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE)
}

/// Copies `list` out by NVML's contract for `(count, infos)` arrays: a
/// size query (or a buffer too small) gets the count and
/// `NVML_ERROR_INSUFFICIENT_SIZE` (success when the list is empty).
///
/// # Safety
/// `count` is null or valid for reads and writes; `infos` is null or valid
/// for `*count` writes of `T` (the caller's arguments to NVML).
pub unsafe fn copy_out<T: Copy>(list: &[T], count: *mut u32, infos: *mut T) -> nvmlReturn_t {
    if count.is_null() {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, per this function's contract.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = list.len() as u32 };
    if list.is_empty() {
        return nvmlReturn_t::NVML_SUCCESS;
    }
    if infos.is_null() || cap < list.len() {
        return nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, e) in list.iter().enumerate() {
        // SAFETY: i < list.len() <= cap, the caller's array length.
        unsafe { infos.add(i).write(*e) };
    }
    nvmlReturn_t::NVML_SUCCESS
}

/// A process-list hook: the container's processes only, each with what
/// the ledger charges it (so the list sums to the memory view's `used`).
fn list_hook<T: Entry>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    real: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let mut real = real;
    let Some((mine, charged)) = NvmlView::real().container(device) else {
        return real(count, infos);
    };
    match fetch(real) {
        // SAFETY: the caller's (count, infos), per NVML's contract.
        Ok(all) => unsafe {
            copy_out(
                &procs::filter(&all, &mine, charged, &sys::proc_identity),
                count,
                infos,
            )
        },
        Err(e) => e,
    }
}

/// Samples from a second ago on, for the container's utilization rate.
fn recent_us() -> u64 {
    (vgpu_region::realtime_ns() / 1000).saturating_sub(1_000_000)
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

    // Process lists and utilization: the container's, not the card's.
    [base: "nvmlDeviceGetComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "only the container's processes (the region's host PIDs), memory as charged"]
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding to the driver with our own buffers or the caller's.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetGraphicsRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetGraphicsRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetGraphicsRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetMPSComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetMPSComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetMPSComputeRunningProcesses", since: 0, ptds: false, family: "nvml view (processes)", policy: "as nvmlDeviceGetComputeRunningProcesses_v3"]
    fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t |real| {
        // SAFETY: as above.
        list_hook(device, infoCount, infos, |n, b| unsafe { real(device, n, b) })
    }

    [base: "nvmlDeviceGetProcessUtilization", since: 0, ptds: false, family: "nvml view (processes)", policy: "samples of the container's processes only"]
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t, processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64) -> nvmlReturn_t |real| {
        let Some((mine, _)) = NvmlView::real().container(device) else {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real(device, utilization, processSamplesCount, lastSeenTimeStamp) };
        };
        // SAFETY: forwarding with our own buffers.
        match fetch(|n, b| unsafe { real(device, b, n, lastSeenTimeStamp) }) {
            Ok(all) => {
                let list = procs::filter_samples(&all, &mine, &sys::proc_identity);
                // SAFETY: the caller's (count, samples), per NVML's contract.
                let r = unsafe { copy_out(&list, processSamplesCount, utilization) };
                if list.is_empty() && r.is_success() {
                    // NVML's answer for "no samples".
                    return nvmlReturn_t::NVML_ERROR_NOT_FOUND;
                }
                r
            }
            Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND) => {
                if !processSamplesCount.is_null() {
                    // SAFETY: non-null count from the caller.
                    unsafe { *processSamplesCount = 0 };
                }
                nvmlReturn_t::NVML_ERROR_NOT_FOUND
            }
            Err(e) => e,
        }
    }

    [base: "nvmlDeviceGetUtilizationRates", since: 0, ptds: false, family: "nvml view (processes)", policy: "the container's processes' share of the last second, not the card's"]
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) -> nvmlReturn_t |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device, utilization) };
        if !r.is_success() {
            return r;
        }
        let Some((mine, _)) = NvmlView::real().container(device) else { return r };
        let since = recent_us();
        let samples = fetch(|n, b| {
            // SAFETY: our own buffers.
            unsafe { crate::driver::api::nvmlDeviceGetProcessUtilization().map_or(nvmlReturn_t::NVML_ERROR_NOT_FOUND, |f| f(device, b, n, since)) }
        })
        .unwrap_or_default();
        // SAFETY: the driver just filled `utilization`.
        unsafe { sys::put(utilization, procs::utilization(&samples, &mine, &sys::proc_identity)) };
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_out_keeps_nvmls_array_contract() {
        let e = |pid| nvmlProcessInfo_v2_t {
            pid,
            ..Default::default()
        };
        let list = [e(10), e(11)];
        let mut n = 0u32;
        // SAFETY: valid pointers (null infos is a size query).
        let r = unsafe { copy_out(&list, &mut n, std::ptr::null_mut()) };
        assert_eq!((r, n), (nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE, 2));
        let mut buf = [nvmlProcessInfo_v2_t::default(); 4];
        let mut n = 4u32;
        // SAFETY: buf holds n entries.
        let r = unsafe { copy_out(&list, &mut n, buf.as_mut_ptr()) };
        assert_eq!((r, n, buf[1].pid), (nvmlReturn_t::NVML_SUCCESS, 2, 11));
        let mut n = 1u32;
        // SAFETY: buf holds n entries.
        let r = unsafe { copy_out(&list, &mut n, buf.as_mut_ptr()) };
        assert_eq!((r, n), (nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE, 2));
        let mut n = 0u32;
        // SAFETY: valid pointers.
        let r = unsafe { copy_out::<nvmlProcessInfo_v2_t>(&[], &mut n, std::ptr::null_mut()) };
        assert_eq!((r, n), (nvmlReturn_t::NVML_SUCCESS, 0));
    }
}
