//! The one list of CUDA driver and NVML functions vgpu calls, exports or
//! interposes, with their C types as `cuda.h` / `nvml.h` spell them: every
//! function-pointer type of the workspace comes from here ([`sig`]).
//!
//! The list is two macros that hand every entry to a callback macro (as
//! ZLUDA's `cuda_function_declarations!` does), so each user generates what
//! it needs from the same entries: [`interposer_functions!`] is what the
//! interposer resolves into its real-function table (a slot per entry, a
//! typed getter, the hook exports tied to it), [`client_functions!`] what
//! only the simulator's probes, the node agent, the benches and the test
//! clients call. Each entry is `cuda fn name(arg: Type, ...) -> Ret;` or
//! `nvml fn ...`, with types named bare (`c_uint`, `CUresult`): the caller
//! brings `std::ffi::*` and this crate's types into scope.
//!
//! `vgpu-preload`'s `tests/preload/signatures.rs` compiles every entry's
//! prototype ([`SIGNATURES`]) against NVIDIA's headers, so a wrong type
//! fails a test instead of running, and scans the workspace for
//! function-pointer types typed by hand outside this crate.
//! Add an entry here before calling or hooking a new driver function.

/// The entries the interposer (`vgpu-preload`) resolves, hooks or calls,
/// in its table order: `$callback! { cuda fn name(args) -> ret; ... }`.
#[macro_export]
macro_rules! interposer_functions {
    ($callback:ident) => {
        $callback! {
            // --- resolution and init
            cuda fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t) -> CUresult;
            cuda fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult) -> CUresult;
            cuda fn cuInit(Flags: c_uint) -> CUresult;
            // --- devices
            cuda fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
            cuda fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult;
            cuda fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
            cuda fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
            cuda fn cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) -> CUresult;
            cuda fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;
            // --- memory
            cuda fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
            cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
            cuda fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) -> CUresult;
            cuda fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult;
            cuda fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
            cuda fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult;
            cuda fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
            cuda fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult;
            cuda fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
            cuda fn cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult;
            cuda fn cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult;
            cuda fn cuArrayDestroy(hArray: CUarray) -> CUresult;
            cuda fn cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint) -> CUresult;
            cuda fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult;
            // --- legacy (v1, 32-bit) memory, context and info entry points
            cuda fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult;
            cuda fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint) -> CUresult;
            cuda fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult;
            cuda fn cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult;
            cuda fn cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult;
            cuda fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
            cuda fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult;
            cuda fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult;
            // --- stream-ordered memory and pools
            cuda fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult;
            cuda fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult;
            cuda fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult;
            cuda fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult;
            cuda fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
            cuda fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
            cuda fn cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) -> CUresult;
            cuda fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
            cuda fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult;
            cuda fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult;
            cuda fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
            cuda fn cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
            // --- contexts
            cuda fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
            cuda fn cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice) -> CUresult;
            cuda fn cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> CUresult;
            cuda fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult;
            cuda fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult;
            cuda fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult;
            cuda fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
            cuda fn cuCtxSynchronize() -> CUresult;
            cuda fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
            cuda fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
            cuda fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
            cuda fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
            cuda fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
            // --- streams and events
            cuda fn cuStreamCreate(phStream: *mut CUstream, Flags: c_uint) -> CUresult;
            cuda fn cuStreamDestroy_v2(hStream: CUstream) -> CUresult;
            cuda fn cuStreamQuery(hStream: CUstream) -> CUresult;
            cuda fn cuStreamSynchronize(hStream: CUstream) -> CUresult;
            cuda fn cuStreamSynchronize_ptsz(hStream: CUstream) -> CUresult;
            cuda fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult;
            cuda fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult;
            cuda fn cuEventQuery(hEvent: CUevent) -> CUresult;
            cuda fn cuEventSynchronize(hEvent: CUevent) -> CUresult;
            cuda fn cuEventElapsedTime(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent) -> CUresult;
            cuda fn cuEventDestroy_v2(hEvent: CUevent) -> CUresult;
            // --- launches
            cuda fn cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            cuda fn cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            cuda fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            cuda fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            cuda fn cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult;
            cuda fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult;
            cuda fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            cuda fn cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            cuda fn cuLaunchCooperativeKernelMultiDevice(launchParamsList: *mut CUDA_LAUNCH_PARAMS, numDevices: c_uint, flags: c_uint) -> CUresult;
            // --- graph memory (alloc nodes are backed when an executable is uploaded or launched)
            cuda fn cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult;
            cuda fn cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult;
            cuda fn cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64) -> CUresult;
            cuda fn cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult;
            cuda fn cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult;
            cuda fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            cuda fn cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            cuda fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult;
            cuda fn cuGraphGetNodes(hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize) -> CUresult;
            cuda fn cuGraphNodeGetType(hNode: CUgraphNode, nodeType: *mut CUgraphNodeType) -> CUresult;
            cuda fn cuGraphMemAllocNodeGetParams(hNode: CUgraphNode, params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
            cuda fn cuGraphMemFreeNodeGetParams(hNode: CUgraphNode, dptr_out: *mut CUdeviceptr) -> CUresult;
            cuda fn cuGraphChildGraphNodeGetGraph(hNode: CUgraphNode, phGraph: *mut CUgraph) -> CUresult;
            cuda fn cuDeviceGetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult;
            cuda fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult;
            // --- stream capture (captured launches are charged when their graph launches)
            cuda fn cuStreamBeginCapture(hStream: CUstream) -> CUresult;
            cuda fn cuStreamBeginCapture_ptsz(hStream: CUstream) -> CUresult;
            cuda fn cuStreamBeginCapture_v2(hStream: CUstream, mode: CUstreamCaptureMode) -> CUresult;
            cuda fn cuStreamBeginCapture_v2_ptsz(hStream: CUstream, mode: CUstreamCaptureMode) -> CUresult;
            cuda fn cuStreamBeginCaptureToGraph(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) -> CUresult;
            cuda fn cuStreamBeginCaptureToGraph_ptsz(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) -> CUresult;
            cuda fn cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult;
            cuda fn cuStreamEndCapture_ptsz(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult;
            cuda fn cuStreamIsCapturing(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus) -> CUresult;
            cuda fn cuStreamIsCapturing_ptsz(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus) -> CUresult;
            // --- synchronizing calls the limiter closes its bursts before
            cuda fn cuStreamQuery_ptsz(hStream: CUstream) -> CUresult;
            cuda fn cuEventRecord_ptsz(hEvent: CUevent, hStream: CUstream) -> CUresult;
            cuda fn cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult;
            cuda fn cuMemcpyHtoD_v2_ptds(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult;
            cuda fn cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
            cuda fn cuMemcpyDtoH_v2_ptds(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
            cuda fn cuMemcpyDtoD_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
            cuda fn cuMemcpyDtoD_v2_ptds(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;

            // --- NVML
            nvml fn nvmlInit_v2() -> nvmlReturn_t;
            nvml fn nvmlShutdown() -> nvmlReturn_t;
            nvml fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t, processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64) -> nvmlReturn_t;
        }
    };
}

/// The entries only other users call (the simulator's probe, the node
/// agent's NVML loader, the benches, test clients); same form as
/// [`interposer_functions!`].
#[macro_export]
macro_rules! client_functions {
    ($callback:ident) => {
        $callback! {
            // --- modules and functions
            cuda fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult;
            cuda fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) -> CUresult;
            cuda fn cuModuleUnload(hmod: CUmodule) -> CUresult;
            // --- devices, memory and graphs
            cuda fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
            cuda fn cuIpcGetMemHandle(pHandle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult;
            cuda fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult;
            cuda fn cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint) -> CUresult;
            cuda fn cuGraphAddKernelNode_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v2) -> CUresult;
            cuda fn cuGraphDestroy(hGraph: CUgraph) -> CUresult;

            // --- NVML
            nvml fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) -> nvmlReturn_t;
            nvml fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t;
        }
    };
}

/// One entry as the list spells it, for the header check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    /// The exact (versioned) symbol.
    pub name: &'static str,
    /// `"cuda"` (libcuda.so.1) or `"nvml"` (libnvidia-ml.so.1).
    pub lib: &'static str,
    /// Parameter types as the list writes them (`*mut CUdeviceptr`,
    /// `usize`; `stringify!` may space them as `* mut CUdeviceptr`).
    pub params: &'static [&'static str],
    pub ret: &'static str,
    /// Resolved by the interposer (in [`interposer_functions!`]).
    pub interposed: bool,
}

macro_rules! sig_types {
    ($( $lib:ident fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        $( pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
    };
}

/// The C function type of every entry: `sig::cuMemAlloc_v2` is
/// `unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult`.
pub mod sig {
    use std::ffi::{c_char, c_int, c_uint, c_void};

    use crate::*;

    interposer_functions!(sig_types);
    client_functions!(sig_types);
}

macro_rules! signatures {
    (@interposed $interposed:literal $( $lib:ident fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        &[$(Signature {
            name: stringify!($name),
            lib: stringify!($lib),
            params: &[$(stringify!($ty)),*],
            ret: stringify!($ret),
            interposed: $interposed,
        }),*]
    };
}

macro_rules! interposed_signatures {
    ($($t:tt)*) => { signatures!(@interposed true $($t)*) };
}

macro_rules! client_signatures {
    ($($t:tt)*) => { signatures!(@interposed false $($t)*) };
}

const INTERPOSED: &[Signature] = interposer_functions!(interposed_signatures);
const CLIENT: &[Signature] = client_functions!(client_signatures);

/// Every entry of both lists: the interposer's in table order, then the
/// others'.
pub fn signatures() -> impl Iterator<Item = &'static Signature> {
    INTERPOSED.iter().chain(CLIENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_results_match_the_library() {
        let mut seen = std::collections::HashSet::new();
        for s in signatures() {
            assert!(seen.insert(s.name), "duplicate {}", s.name);
            let (prefix, ret) = match s.lib {
                "cuda" => ("cu", "CUresult"),
                "nvml" => ("nvml", "nvmlReturn_t"),
                other => panic!("{}: library {other}", s.name),
            };
            assert!(s.name.starts_with(prefix), "{}", s.name);
            assert_eq!(s.ret, ret, "{}", s.name);
        }
        assert!(INTERPOSED.iter().all(|s| s.interposed));
        assert!(CLIENT.iter().all(|s| !s.interposed));
        let alloc = signatures().find(|s| s.name == "cuMemAlloc_v2");
        let params = alloc.map(|s| {
            s.params
                .iter()
                .map(|p| p.replace(' ', ""))
                .collect::<Vec<_>>()
        });
        assert_eq!(
            params,
            Some(vec!["*mutCUdeviceptr".to_string(), "usize".into()])
        );
    }

    #[test]
    fn sig_types_are_the_lists() {
        // A fn item coerces to its entry's type only if the types agree.
        unsafe extern "C" fn alloc(_: *mut crate::CUdeviceptr, _: usize) -> crate::CUresult {
            crate::CUresult::CUDA_SUCCESS
        }
        let f: sig::cuMemAlloc_v2 = alloc;
        let g: sig::cuMemAllocAsync = {
            unsafe extern "C" fn a(_: *mut u64, _: usize, _: crate::CUstream) -> crate::CUresult {
                crate::CUresult::CUDA_SUCCESS
            }
            a
        };
        assert_ne!(f as usize, 0);
        assert_ne!(g as usize, 0);
    }
}
