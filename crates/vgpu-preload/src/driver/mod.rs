//! The driver layer: the real CUDA and NVML functions behind two traits.
//!
//! - [`api`]: the one signature list (types of every function the library
//!   calls or exports), checked against NVIDIA's headers by a test.
//! - [`table`]: library handles and the lazily resolved slots.
//! - [`CudaDriver`] / [`NvmlDriver`]: what the policy layers (memory,
//!   views, identity, the limiter) may ask of a driver, as safe Rust calls.
//!   [`REAL_CUDA`] / [`REAL_NVML`] go through the table; `fake` (tests)
//!   records calls and answers from a script, so policy logic is tested
//!   without a driver or a process.
//!
//! Owns no policy: nothing here charges, limits or logs a decision. Must
//! never call into the hook exports (the layer above) or hold a lock across
//! a driver call.
use std::ffi::{c_void, CStr};

use vgpu_cuda_abi::*;

pub mod api;
#[cfg(test)]
pub mod fake;
mod real;
pub mod table;

pub use real::{RealCuda, RealNvml, REAL_CUDA, REAL_NVML};
pub use table::Lib;

/// A CUDA call's value, or the driver's error code.
pub type CuResult<T> = Result<T, CUresult>;
/// An NVML call's value, or NVML's error code.
pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

/// What a missing driver function answers.
pub const CUDA_MISSING: CUresult = CUresult::CUDA_ERROR_NOT_FOUND;
pub const NVML_MISSING: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND;

/// `Ok(())` for success, the code otherwise.
pub fn cu_ok(r: CUresult) -> CuResult<()> {
    if r.is_success() {
        Ok(())
    } else {
        Err(r)
    }
}

pub fn nvml_ok(r: nvmlReturn_t) -> NvmlResult<()> {
    if r.is_success() {
        Ok(())
    } else {
        Err(r)
    }
}

/// The CUDA driver API as the library's own logic uses it (the calls an
/// application makes reach the driver through the hooks' own typed slots).
/// Devices are `CUdevice` values as the driver hands them out; ordinals
/// are `u32`.
pub trait CudaDriver: Sync {
    // devices
    fn init(&self, flags: u32) -> CUresult;
    fn device_count(&self) -> CuResult<u32>;
    fn device_get(&self, ordinal: u32) -> CuResult<CUdevice>;
    /// `cuDeviceGetUuid_v2`, else the original.
    fn device_uuid(&self, dev: CUdevice) -> CuResult<CUuuid>;
    fn device_attribute(&self, attr: CUdevice_attribute, dev: CUdevice) -> CuResult<i32>;
    fn device_total_mem(&self, dev: CUdevice) -> CuResult<usize>;
    // contexts
    /// The current context's device.
    fn ctx_device(&self) -> CuResult<CUdevice>;
    fn ctx_current(&self) -> CuResult<CUcontext>;
    fn ctx_set_current(&self, ctx: CUcontext) -> CUresult;
    fn ctx_synchronize(&self) -> CUresult;
    fn ctx_create(&self, flags: u32, dev: CUdevice) -> CuResult<CUcontext>;
    fn ctx_destroy(&self, ctx: CUcontext) -> CUresult;
    fn primary_retain(&self, dev: CUdevice) -> CuResult<CUcontext>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_release(&self, dev: CUdevice) -> CUresult;
    // memory
    /// (free, total) of the current context's device.
    fn mem_get_info(&self) -> CuResult<(usize, usize)>;
    fn mem_alloc(&self, bytes: usize) -> CuResult<CUdeviceptr>;
    /// (pointer, pitch).
    fn mem_alloc_pitch(
        &self,
        width: usize,
        height: usize,
        elem: u32,
    ) -> CuResult<(CUdeviceptr, usize)>;
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult;
    fn mem_create(
        &self,
        size: usize,
        prop: &CUmemAllocationProp,
    ) -> CuResult<CUmemGenericAllocationHandle>;
    fn mem_release(&self, handle: CUmemGenericAllocationHandle) -> CUresult;
    fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult;
    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> CUresult;
    fn array_create(&self, desc: &CUDA_ARRAY_DESCRIPTOR) -> CuResult<CUarray>;
    fn array_destroy(&self, array: CUarray) -> CUresult;
    // stream-ordered memory and pools
    fn mem_alloc_async(&self, bytes: usize, stream: CUstream) -> CuResult<CUdeviceptr>;
    fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) -> CuResult<CUdeviceptr>;
    fn mem_free_async(&self, ptr: CUdeviceptr, stream: CUstream) -> CUresult;
    fn pool_create(&self, props: &CUmemPoolProps) -> CuResult<CUmemoryPool>;
    fn pool_destroy(&self, pool: CUmemoryPool) -> CUresult;
    fn pool_trim_to(&self, pool: CUmemoryPool, keep: usize) -> CUresult;
    /// A `cuuint64_t` pool attribute (reserved/used memory, thresholds).
    fn pool_attribute(&self, pool: CUmemoryPool, attr: CUmemPool_attribute) -> CuResult<u64>;
    /// The pool `cuMemAllocAsync` draws from on `dev` (the current pool,
    /// else the default one).
    fn current_pool(&self, dev: CUdevice) -> CuResult<CUmemoryPool>;
    // streams and events
    fn stream_create(&self, flags: u32) -> CuResult<CUstream>;
    fn stream_destroy(&self, stream: CUstream) -> CUresult;
    fn stream_query(&self, stream: CUstream) -> CUresult;
    fn stream_synchronize(&self, stream: CUstream) -> CUresult;
    fn event_create(&self, flags: u32) -> CuResult<CUevent>;
    fn event_record(&self, event: CUevent, stream: CUstream) -> CUresult;
    fn event_query(&self, event: CUevent) -> CUresult;
    fn event_synchronize(&self, event: CUevent) -> CUresult;
    fn event_elapsed_ms(&self, start: CUevent, end: CUevent) -> CuResult<f32>;
    fn event_destroy(&self, event: CUevent) -> CUresult;
    // launches
    /// `cuLaunchKernel`.
    ///
    /// # Safety
    /// `params`/`extra` follow `cuLaunchKernel`'s contract for `f`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_kernel(
        &self,
        f: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;
    fn graph_launch(&self, exec: CUgraphExec, stream: CUstream) -> CUresult;
    // graph memory
    /// A `cuuint64_t` graph memory attribute of device `dev`
    /// (`cuDeviceGetGraphMemAttribute`: this process's graph allocator).
    fn graph_mem_attribute(&self, dev: CUdevice, attr: CUgraphMem_attribute) -> CuResult<u64>;
    /// `cuDeviceGraphMemTrim`.
    fn graph_mem_trim(&self, dev: CUdevice) -> CUresult;
    /// `cuGraphGetNodes`: every node of `graph` (not of its child graphs).
    fn graph_nodes(&self, graph: CUgraph) -> CuResult<Vec<CUgraphNode>>;
    /// `cuGraphNodeGetType`.
    fn graph_node_type(&self, node: CUgraphNode) -> CuResult<CUgraphNodeType>;
    /// `cuGraphMemAllocNodeGetParams`: (address, location, bytes).
    fn graph_mem_alloc_node(
        &self,
        node: CUgraphNode,
    ) -> CuResult<(CUdeviceptr, CUmemLocation, usize)>;
    /// `cuGraphMemFreeNodeGetParams`: the address freed.
    fn graph_mem_free_node(&self, node: CUgraphNode) -> CuResult<CUdeviceptr>;
    /// `cuGraphChildGraphNodeGetGraph`.
    fn graph_child(&self, node: CUgraphNode) -> CuResult<CUgraph>;
    /// `cuGraphExecDestroy`.
    fn graph_exec_destroy(&self, exec: CUgraphExec) -> CUresult;
    /// `cuEventRecord_ptsz` (the per-thread default stream for a null one).
    fn event_record_ptsz(&self, _event: CUevent, _stream: CUstream) -> CUresult {
        CUDA_MISSING
    }
    /// `cuStreamIsCapturing`: whether work queued on `stream` now is being
    /// captured into a graph (`_ptsz` form when `per_thread`).
    fn stream_is_capturing(&self, _stream: CUstream, _per_thread: bool) -> CuResult<bool> {
        Err(CUDA_MISSING)
    }
    /// Whether the driver has entry `f` (a tier that needs several entries
    /// asks before it starts, rather than fail half way).
    fn has(&self, f: api::Fn) -> bool;
}

/// One process in an NVML process list, whichever struct version the
/// driver filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// NVML as the library's own logic uses it. Devices are NVML handles;
/// indices are NVML's physical numbering.
pub trait NvmlDriver: Sync {
    /// `nvmlInit_v2` (NVML counts inits; pair with [`NvmlDriver::shutdown`]).
    fn init(&self) -> nvmlReturn_t;
    fn shutdown(&self) -> nvmlReturn_t;
    fn device_count(&self) -> NvmlResult<u32>;
    fn device_by_index(&self, index: u32) -> NvmlResult<nvmlDevice_t>;
    fn device_by_uuid(&self, uuid: &CStr) -> NvmlResult<nvmlDevice_t>;
    fn device_uuid(&self, dev: nvmlDevice_t) -> NvmlResult<String>;
    fn device_index(&self, dev: nvmlDevice_t) -> NvmlResult<u32>;
    fn memory_info(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlMemory_t>;
    /// The compute processes on `dev` (`_v3`, else `_v2`, else the original).
    fn running_processes(&self, dev: nvmlDevice_t) -> NvmlResult<Vec<ProcessInfo>>;
    fn utilization(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlUtilization_t>;
    /// Per-process utilization samples newer than `since_us`.
    fn process_utilization(
        &self,
        dev: nvmlDevice_t,
        since_us: u64,
    ) -> NvmlResult<Vec<nvmlProcessUtilizationSample_t>>;
    /// Whether NVML has entry `f` (see [`CudaDriver::has`]).
    fn has(&self, f: api::Fn) -> bool;
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

/// The UUID of CUDA ordinal `ordinal`, spelled as NVML does.
pub fn ordinal_uuid(d: &dyn CudaDriver, ordinal: u32) -> Option<String> {
    let dev = d.device_get(ordinal).ok()?;
    d.device_uuid(dev).ok().map(|u| format_uuid(&u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format_matches_nvml() {
        let mut u = CUuuid::default();
        for (i, b) in u.bytes.iter_mut().enumerate() {
            *b = (i as u8 * 17) as std::ffi::c_char;
        }
        assert_eq!(format_uuid(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
