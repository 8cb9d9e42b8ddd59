//! [`CudaDriver`] and [`NvmlDriver`] over the real-function table. FFI:
//! every call passes values and pointers to live locals of exactly the
//! types the signature list declares.
use std::ffi::{c_char, c_uint, c_void, CStr};

use vgpu_cuda_abi::*;

use super::{
    api, cu_ok, nvml_ok, CuResult, CudaDriver, NvmlDriver, NvmlResult, ProcessInfo, CUDA_MISSING,
    NVML_MISSING,
};

/// The real CUDA driver (stateless: the table is the state).
pub struct RealCuda;
/// The real NVML.
pub struct RealNvml;

pub static REAL_CUDA: RealCuda = RealCuda;
pub static REAL_NVML: RealNvml = RealNvml;

/// Calls entry `$name` of the table with `$args`, or answers `$missing`.
macro_rules! call {
    ($missing:expr, $name:ident($($a:expr),* $(,)?)) => {
        match api::$name() {
            // SAFETY: the function is the driver's `$name`, typed by the
            // signature list; every use in this file passes values and
            // pointers to live locals of exactly the declared types.
            Some(f) => unsafe { f($($a),*) },
            None => $missing,
        }
    };
}
macro_rules! cu {
    ($($t:tt)*) => { call!(CUDA_MISSING, $($t)*) };
}
macro_rules! nv {
    ($($t:tt)*) => { call!(NVML_MISSING, $($t)*) };
}

impl CudaDriver for RealCuda {
    fn init(&self, flags: u32) -> CUresult {
        cu!(cuInit(flags))
    }
    fn device_count(&self) -> CuResult<u32> {
        let mut n = 0;
        cu_ok(cu!(cuDeviceGetCount(&mut n)))?;
        u32::try_from(n).map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)
    }
    fn device_get(&self, ordinal: u32) -> CuResult<CUdevice> {
        let mut d = 0;
        let ord = i32::try_from(ordinal).map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        cu_ok(cu!(cuDeviceGet(&mut d, ord))).map(|_| d)
    }
    fn device_uuid(&self, dev: CUdevice) -> CuResult<CUuuid> {
        let mut u = CUuuid::default();
        let r = if api::cuDeviceGetUuid_v2().is_some() {
            cu!(cuDeviceGetUuid_v2(&mut u, dev))
        } else {
            cu!(cuDeviceGetUuid(&mut u, dev))
        };
        cu_ok(r).map(|_| u)
    }
    fn device_attribute(&self, attr: CUdevice_attribute, dev: CUdevice) -> CuResult<i32> {
        let mut v = 0;
        cu_ok(cu!(cuDeviceGetAttribute(&mut v, attr, dev))).map(|_| v)
    }
    fn device_total_mem(&self, dev: CUdevice) -> CuResult<usize> {
        let mut b = 0;
        cu_ok(cu!(cuDeviceTotalMem_v2(&mut b, dev))).map(|_| b)
    }
    fn ctx_device(&self) -> CuResult<CUdevice> {
        let mut d = 0;
        cu_ok(cu!(cuCtxGetDevice(&mut d))).map(|_| d)
    }
    fn ctx_current(&self) -> CuResult<CUcontext> {
        let mut c = CUcontext::NULL;
        cu_ok(cu!(cuCtxGetCurrent(&mut c))).map(|_| c)
    }
    fn ctx_set_current(&self, ctx: CUcontext) -> CUresult {
        cu!(cuCtxSetCurrent(ctx))
    }
    fn ctx_synchronize(&self) -> CUresult {
        cu!(cuCtxSynchronize())
    }
    fn ctx_create(&self, flags: u32, dev: CUdevice) -> CuResult<CUcontext> {
        let mut c = CUcontext::NULL;
        cu_ok(cu!(cuCtxCreate_v2(&mut c, flags, dev))).map(|_| c)
    }
    fn ctx_destroy(&self, ctx: CUcontext) -> CUresult {
        cu!(cuCtxDestroy_v2(ctx))
    }
    fn primary_retain(&self, dev: CUdevice) -> CuResult<CUcontext> {
        let mut c = CUcontext::NULL;
        cu_ok(cu!(cuDevicePrimaryCtxRetain(&mut c, dev))).map(|_| c)
    }
    fn primary_release(&self, dev: CUdevice) -> CUresult {
        cu!(cuDevicePrimaryCtxRelease_v2(dev))
    }
    fn mem_get_info(&self) -> CuResult<(usize, usize)> {
        let (mut f, mut t) = (0, 0);
        cu_ok(cu!(cuMemGetInfo_v2(&mut f, &mut t))).map(|_| (f, t))
    }
    fn mem_alloc(&self, bytes: usize) -> CuResult<CUdeviceptr> {
        let mut p = 0;
        cu_ok(cu!(cuMemAlloc_v2(&mut p, bytes))).map(|_| p)
    }
    fn mem_alloc_pitch(
        &self,
        width: usize,
        height: usize,
        elem: u32,
    ) -> CuResult<(CUdeviceptr, usize)> {
        let (mut p, mut pitch) = (0, 0);
        cu_ok(cu!(cuMemAllocPitch_v2(
            &mut p, &mut pitch, width, height, elem
        )))
        .map(|_| (p, pitch))
    }
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult {
        cu!(cuMemFree_v2(ptr))
    }
    fn mem_create(
        &self,
        size: usize,
        prop: &CUmemAllocationProp,
    ) -> CuResult<CUmemGenericAllocationHandle> {
        let mut h = 0;
        cu_ok(cu!(cuMemCreate(&mut h, size, prop, 0))).map(|_| h)
    }
    fn mem_release(&self, handle: CUmemGenericAllocationHandle) -> CUresult {
        cu!(cuMemRelease(handle))
    }
    fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult {
        cu!(cuMemMap(ptr, size, 0, handle, 0))
    }
    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> CUresult {
        cu!(cuMemUnmap(ptr, size))
    }
    fn array_create(&self, desc: &CUDA_ARRAY_DESCRIPTOR) -> CuResult<CUarray> {
        let mut a = CUarray::NULL;
        cu_ok(cu!(cuArrayCreate_v2(&mut a, desc))).map(|_| a)
    }
    fn array_destroy(&self, array: CUarray) -> CUresult {
        cu!(cuArrayDestroy(array))
    }
    fn mem_alloc_async(&self, bytes: usize, stream: CUstream) -> CuResult<CUdeviceptr> {
        let mut p = 0;
        cu_ok(cu!(cuMemAllocAsync(&mut p, bytes, stream))).map(|_| p)
    }
    fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) -> CuResult<CUdeviceptr> {
        let mut p = 0;
        cu_ok(cu!(cuMemAllocFromPoolAsync(&mut p, bytes, pool, stream))).map(|_| p)
    }
    fn mem_free_async(&self, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
        cu!(cuMemFreeAsync(ptr, stream))
    }
    fn pool_create(&self, props: &CUmemPoolProps) -> CuResult<CUmemoryPool> {
        let mut p = CUmemoryPool::NULL;
        cu_ok(cu!(cuMemPoolCreate(&mut p, props))).map(|_| p)
    }
    fn pool_destroy(&self, pool: CUmemoryPool) -> CUresult {
        cu!(cuMemPoolDestroy(pool))
    }
    fn pool_trim_to(&self, pool: CUmemoryPool, keep: usize) -> CUresult {
        cu!(cuMemPoolTrimTo(pool, keep))
    }
    fn pool_attribute(&self, pool: CUmemoryPool, attr: CUmemPool_attribute) -> CuResult<u64> {
        // The attributes this library reads are all `cuuint64_t`.
        let mut v: u64 = 0;
        let out = (&mut v as *mut u64).cast::<c_void>();
        cu_ok(cu!(cuMemPoolGetAttribute(pool, attr, out))).map(|_| v)
    }
    fn current_pool(&self, dev: CUdevice) -> CuResult<CUmemoryPool> {
        let mut p = CUmemoryPool::NULL;
        let r = if api::cuDeviceGetMemPool().is_some() {
            cu!(cuDeviceGetMemPool(&mut p, dev))
        } else {
            cu!(cuDeviceGetDefaultMemPool(&mut p, dev))
        };
        cu_ok(r)?;
        if p.is_null() {
            Err(CUresult::CUDA_ERROR_NOT_FOUND)
        } else {
            Ok(p)
        }
    }
    fn stream_create(&self, flags: u32) -> CuResult<CUstream> {
        let mut s = CUstream::NULL;
        cu_ok(cu!(cuStreamCreate(&mut s, flags))).map(|_| s)
    }
    fn stream_destroy(&self, stream: CUstream) -> CUresult {
        cu!(cuStreamDestroy_v2(stream))
    }
    fn stream_query(&self, stream: CUstream) -> CUresult {
        cu!(cuStreamQuery(stream))
    }
    fn stream_synchronize(&self, stream: CUstream) -> CUresult {
        cu!(cuStreamSynchronize(stream))
    }
    fn event_create(&self, flags: u32) -> CuResult<CUevent> {
        let mut e = CUevent::NULL;
        cu_ok(cu!(cuEventCreate(&mut e, flags))).map(|_| e)
    }
    fn event_record(&self, event: CUevent, stream: CUstream) -> CUresult {
        cu!(cuEventRecord(event, stream))
    }
    fn event_record_ptsz(&self, event: CUevent, stream: CUstream) -> CUresult {
        cu!(cuEventRecord_ptsz(event, stream))
    }
    fn stream_is_capturing(&self, stream: CUstream, per_thread: bool) -> CuResult<bool> {
        let mut st: CUstreamCaptureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        let r = if per_thread {
            cu!(cuStreamIsCapturing_ptsz(stream, &mut st))
        } else {
            cu!(cuStreamIsCapturing(stream, &mut st))
        };
        cu_ok(r).map(|_| st != CU_STREAM_CAPTURE_STATUS_NONE)
    }
    fn event_query(&self, event: CUevent) -> CUresult {
        cu!(cuEventQuery(event))
    }
    fn event_synchronize(&self, event: CUevent) -> CUresult {
        cu!(cuEventSynchronize(event))
    }
    fn event_elapsed_ms(&self, start: CUevent, end: CUevent) -> CuResult<f32> {
        let mut ms = 0f32;
        cu_ok(cu!(cuEventElapsedTime(&mut ms, start, end))).map(|_| ms)
    }
    fn event_destroy(&self, event: CUevent) -> CUresult {
        cu!(cuEventDestroy_v2(event))
    }
    unsafe fn launch_kernel(
        &self,
        f: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        let [gx, gy, gz] = grid;
        let [bx, by, bz] = block;
        cu!(cuLaunchKernel(
            f, gx, gy, gz, bx, by, bz, shared_mem, stream, params, extra
        ))
    }
    fn graph_launch(&self, exec: CUgraphExec, stream: CUstream) -> CUresult {
        cu!(cuGraphLaunch(exec, stream))
    }
    fn graph_mem_attribute(&self, dev: CUdevice, attr: CUgraphMem_attribute) -> CuResult<u64> {
        // Every graph memory attribute is a `cuuint64_t`.
        let mut v: u64 = 0;
        let out = (&mut v as *mut u64).cast::<c_void>();
        cu_ok(cu!(cuDeviceGetGraphMemAttribute(dev, attr, out))).map(|_| v)
    }
    fn graph_mem_trim(&self, dev: CUdevice) -> CUresult {
        cu!(cuDeviceGraphMemTrim(dev))
    }
    fn graph_nodes(&self, graph: CUgraph) -> CuResult<Vec<CUgraphNode>> {
        let mut n: usize = 0;
        cu_ok(cu!(cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n)))?;
        let mut v = vec![CUgraphNode::NULL; n];
        let mut got = n;
        cu_ok(cu!(cuGraphGetNodes(graph, v.as_mut_ptr(), &mut got)))?;
        v.truncate(got.min(n));
        Ok(v)
    }
    fn graph_node_type(&self, node: CUgraphNode) -> CuResult<CUgraphNodeType> {
        let mut t: CUgraphNodeType = 0;
        cu_ok(cu!(cuGraphNodeGetType(node, &mut t))).map(|_| t)
    }
    fn graph_mem_alloc_node(
        &self,
        node: CUgraphNode,
    ) -> CuResult<(CUdeviceptr, CUmemLocation, usize)> {
        let mut p = CUDA_MEM_ALLOC_NODE_PARAMS::default();
        cu_ok(cu!(cuGraphMemAllocNodeGetParams(node, &mut p)))
            .map(|_| (p.dptr, p.poolProps.location, p.bytesize))
    }
    fn graph_mem_free_node(&self, node: CUgraphNode) -> CuResult<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        cu_ok(cu!(cuGraphMemFreeNodeGetParams(node, &mut p))).map(|_| p)
    }
    fn graph_child(&self, node: CUgraphNode) -> CuResult<CUgraph> {
        let mut g = CUgraph::NULL;
        cu_ok(cu!(cuGraphChildGraphNodeGetGraph(node, &mut g))).map(|_| g)
    }
    fn graph_exec_destroy(&self, exec: CUgraphExec) -> CUresult {
        cu!(cuGraphExecDestroy(exec))
    }
    fn has(&self, f: api::Fn) -> bool {
        !super::table::address(f).is_null()
    }
}

/// Calls a process-list function, growing the buffer when NVML says it is
/// too small (processes may start between two calls).
fn list<T: Copy + Default>(
    mut f: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
    info: impl Fn(&T) -> ProcessInfo,
) -> NvmlResult<Vec<ProcessInfo>> {
    let mut cap: usize = 256;
    for _ in 0..4 {
        let mut buf = vec![T::default(); cap];
        let mut n = cap as c_uint;
        let r = f(&mut n, buf.as_mut_ptr());
        if r.is_success() {
            buf.truncate((n as usize).min(cap));
            return Ok(buf.iter().map(info).collect());
        }
        if r != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            return Err(r);
        }
        cap = (n as usize).max(cap) * 2;
    }
    Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE)
}

impl NvmlDriver for RealNvml {
    fn init(&self) -> nvmlReturn_t {
        nv!(nvmlInit_v2())
    }
    fn shutdown(&self) -> nvmlReturn_t {
        nv!(nvmlShutdown())
    }
    fn device_count(&self) -> NvmlResult<u32> {
        crate::config::failpoint_nvml_stall();
        let mut n: c_uint = 0;
        nvml_ok(nv!(nvmlDeviceGetCount_v2(&mut n))).map(|_| n)
    }
    fn device_by_index(&self, index: u32) -> NvmlResult<nvmlDevice_t> {
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        nvml_ok(nv!(nvmlDeviceGetHandleByIndex_v2(index, &mut h))).map(|_| h)
    }
    fn device_by_uuid(&self, uuid: &CStr) -> NvmlResult<nvmlDevice_t> {
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        nvml_ok(nv!(nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h))).map(|_| h)
    }
    fn device_uuid(&self, dev: nvmlDevice_t) -> NvmlResult<String> {
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvml_ok(nv!(nvmlDeviceGetUUID(
            dev,
            buf.as_mut_ptr(),
            buf.len() as c_uint
        )))?;
        // Never trust the driver to terminate: the last byte is ours.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (the last byte was just set).
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(s.to_string_lossy().into_owned())
    }
    fn device_index(&self, dev: nvmlDevice_t) -> NvmlResult<u32> {
        let mut i: c_uint = 0;
        nvml_ok(nv!(nvmlDeviceGetIndex(dev, &mut i))).map(|_| i)
    }
    fn memory_info(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlMemory_t> {
        let mut m = nvmlMemory_t::default();
        nvml_ok(nv!(nvmlDeviceGetMemoryInfo(dev, &mut m))).map(|_| m)
    }
    fn running_processes(&self, dev: nvmlDevice_t) -> NvmlResult<Vec<ProcessInfo>> {
        let v2 = |p: &nvmlProcessInfo_v2_t| ProcessInfo {
            pid: p.pid,
            used_gpu_memory: p.usedGpuMemory,
        };
        if api::nvmlDeviceGetComputeRunningProcesses_v3().is_some() {
            list(
                |n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v3(dev, n, b)),
                v2,
            )
        } else if api::nvmlDeviceGetComputeRunningProcesses_v2().is_some() {
            list(
                |n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v2(dev, n, b)),
                v2,
            )
        } else {
            list(
                |n, b| nv!(nvmlDeviceGetComputeRunningProcesses(dev, n, b)),
                |p: &nvmlProcessInfo_v1_t| ProcessInfo {
                    pid: p.pid,
                    used_gpu_memory: p.usedGpuMemory,
                },
            )
        }
    }
    fn utilization(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlUtilization_t> {
        let mut u = nvmlUtilization_t::default();
        nvml_ok(nv!(nvmlDeviceGetUtilizationRates(dev, &mut u))).map(|_| u)
    }
    fn process_utilization(
        &self,
        dev: nvmlDevice_t,
        since_us: u64,
    ) -> NvmlResult<Vec<nvmlProcessUtilizationSample_t>> {
        let mut n: c_uint = 0;
        // First ask how many samples there are (NVML answers
        // INSUFFICIENT_SIZE with the count, or success with none).
        let null = std::ptr::null_mut();
        let r = nv!(nvmlDeviceGetProcessUtilization(dev, null, &mut n, since_us));
        if r.is_success() || n == 0 {
            return nvml_ok(r).map(|_| Vec::new());
        }
        if r != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            return Err(r);
        }
        let mut buf = vec![nvmlProcessUtilizationSample_t::default(); n as usize];
        let mut m = n;
        nvml_ok(nv!(nvmlDeviceGetProcessUtilization(
            dev,
            buf.as_mut_ptr(),
            &mut m,
            since_us
        )))?;
        buf.truncate((m as usize).min(n as usize));
        Ok(buf)
    }
    fn has(&self, f: api::Fn) -> bool {
        !super::table::address(f).is_null()
    }
}
