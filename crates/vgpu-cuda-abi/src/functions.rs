//! The one list of CUDA driver and NVML functions vgpu calls, exports or
//! interposes, with their C types as `cuda.h` / `nvml.h` spell them: every
//! function-pointer type of the workspace comes from here ([`sig`]).
//!
//! The list is two macros that hand every entry to a callback macro (as
//! ZLUDA's `cuda_function_declarations!` does), so each user generates what
//! it needs from the same entries: [`interposer_functions!`] is what the
//! interposer resolves into its real-function table (a slot per entry, a
//! typed getter, the hook exports tied to it), [`client_functions!`] what
//! only the simulator's exports, its probe, the node agent, the benches and
//! the test clients call or define. Each entry is
//! `cuda fn name(arg: Type, ...) -> Ret;` or `nvml fn ...`, with types
//! named bare (`c_uint`, `CUresult`): the caller brings `std::ffi`'s and
//! this crate's types into scope.
//!
//! `vgpu-preload`'s `tests/preload/signatures.rs` compiles every entry's
//! prototype ([`signatures`]) against NVIDIA's headers, so a wrong type
//! fails a test instead of running, and scans the workspace for CUDA/NVML
//! function-pointer types typed by hand outside this crate. Add an entry
//! here before calling, hooking or simulating a new driver function.

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

/// The entries only other users call or export (the simulator's probe,
/// the node agent's NVML loader, the benches, test clients, and every
/// other export of the simulated `libcuda.so.1` / `libnvidia-ml.so.1`,
/// whose `cu!`/`nv!` macros tie each export to its `sig` type at compile
/// time); same form as [`interposer_functions!`].
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

            // --- simulated too: contexts, modules, streams, events, launches, graphs
            cuda fn cuDriverGetVersion(v: *mut c_int) -> CUresult;
            cuda fn cuGetErrorName(e: CUresult, ps: *mut *const c_char) -> CUresult;
            cuda fn cuGetErrorString(e: CUresult, ps: *mut *const c_char) -> CUresult;
            cuda fn cuDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
            cuda fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult;
            cuda fn cuMemPoolSetAccess(pool: CUmemoryPool, map: *const CUmemAccessDesc, count: usize) -> CUresult;
            cuda fn cuMemPoolGetAccess(flags: *mut c_uint, pool: CUmemoryPool, location: *mut CUmemLocation) -> CUresult;
            cuda fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult;
            cuda fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult;
            cuda fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult;
            cuda fn cuCtxDestroy(ctx: CUcontext) -> CUresult;
            cuda fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult;
            cuda fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
            cuda fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult;
            cuda fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult;
            cuda fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult;
            cuda fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult;
            cuda fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult;
            cuda fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> CUresult;
            cuda fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CUresult;
            cuda fn cuMemFreeHost(ptr: *mut c_void) -> CUresult;
            cuda fn cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: c_uint) -> CUresult;
            cuda fn cuMemHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> CUresult;
            cuda fn cuMemHostUnregister(ptr: *mut c_void) -> CUresult;
            cuda fn cuMemGetAllocationGranularity(gran: *mut usize, prop: *const CUmemAllocationProp, option: c_uint) -> CUresult;
            cuda fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, _addr: CUdeviceptr, flags: u64) -> CUresult;
            cuda fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
            cuda fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult;
            cuda fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult;
            cuda fn cuStreamCreateWithPriority(s: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult;
            cuda fn cuStreamDestroy(s: CUstream) -> CUresult;
            cuda fn cuStreamWaitEvent(s: CUstream, e: CUevent, _flags: c_uint) -> CUresult;
            cuda fn cuStreamWaitEvent_ptsz(s: CUstream, e: CUevent, _flags: c_uint) -> CUresult;
            cuda fn cuEventRecordWithFlags(e: CUevent, s: CUstream, _flags: c_uint) -> CUresult;
            cuda fn cuEventRecordWithFlags_ptsz(e: CUevent, s: CUstream, _flags: c_uint) -> CUresult;
            cuda fn cuEventElapsedTime_v2(ms: *mut f32, a: CUevent, b: CUevent) -> CUresult;
            cuda fn cuEventDestroy(e: CUevent) -> CUresult;
            cuda fn cuGraphAddKernelNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *const CUDA_KERNEL_NODE_PARAMS_v1) -> CUresult;
            // --- simulated too: copies, sets, host memory, IPC, pointers
            cuda fn cuMemcpyHtoD(dst: c_uint, src: *const c_void, n: c_uint) -> CUresult;
            cuda fn cuMemcpyDtoH(dst: *mut c_void, src: c_uint, n: c_uint) -> CUresult;
            cuda fn cuMemcpyDtoD(dst: c_uint, src: c_uint, n: c_uint) -> CUresult;
            cuda fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyHtoDAsync(dst: c_uint, src: *const c_void, n: c_uint, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoHAsync(dst: *mut c_void, src: c_uint, n: c_uint, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyDtoDAsync(dst: c_uint, src: c_uint, n: c_uint, s: CUstream) -> CUresult;
            cuda fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
            cuda fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
            cuda fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyPeer(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) -> CUresult;
            cuda fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) -> CUresult;
            cuda fn cuMemcpyPeerAsync(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D) -> CUresult;
            cuda fn cuMemcpy2D_v2_ptds(c: *const CUDA_MEMCPY2D) -> CUresult;
            cuda fn cuMemcpy2DUnaligned_v2(c: *const CUDA_MEMCPY2D) -> CUresult;
            cuda fn cuMemcpy2DUnaligned_v2_ptds(c: *const CUDA_MEMCPY2D) -> CUresult;
            cuda fn cuMemcpy2DAsync_v2(c: *const CUDA_MEMCPY2D, s: CUstream) -> CUresult;
            cuda fn cuMemcpy2DAsync_v2_ptsz(c: *const CUDA_MEMCPY2D, s: CUstream) -> CUresult;
            cuda fn cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D) -> CUresult;
            cuda fn cuMemcpy3D_v2_ptds(c: *const CUDA_MEMCPY3D) -> CUresult;
            cuda fn cuMemcpy3DAsync_v2(c: *const CUDA_MEMCPY3D, s: CUstream) -> CUresult;
            cuda fn cuMemcpy3DAsync_v2_ptsz(c: *const CUDA_MEMCPY3D, s: CUstream) -> CUresult;
            cuda fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult;
            cuda fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize) -> CUresult;
            cuda fn cuMemsetD8(dst: c_uint, v: u8, n: c_uint) -> CUresult;
            cuda fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CUresult;
            cuda fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, v: u16, n: usize) -> CUresult;
            cuda fn cuMemsetD16(dst: c_uint, v: u16, n: c_uint) -> CUresult;
            cuda fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult;
            cuda fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult;
            cuda fn cuMemsetD32(dst: c_uint, v: c_uint, n: c_uint) -> CUresult;
            cuda fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, v: u16, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize) -> CUresult;
            cuda fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize, s: CUstream) -> CUresult;
            cuda fn cuPointerGetAttribute(data: *mut c_void, attr: CUpointer_attribute, ptr: CUdeviceptr) -> CUresult;
            cuda fn cuPointerGetAttributes(n: c_uint, attrs: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: CUdeviceptr) -> CUresult;
            cuda fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) -> CUresult;
            cuda fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, host: *mut c_void, flags: c_uint) -> CUresult;
            cuda fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult;
            cuda fn cuIpcOpenMemHandle(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult;
            cuda fn cuIpcCloseMemHandle(ptr: CUdeviceptr) -> CUresult;
            cuda fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, e: CUevent) -> CUresult;
            cuda fn cuIpcOpenEventHandle(e: *mut CUevent, handle: CUipcEventHandle) -> CUresult;
            // --- simulated too: versions, errors, device and function queries
            cuda fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult;
            cuda fn cuStreamGetPriority(s: CUstream, prio: *mut c_int) -> CUresult;
            cuda fn cuStreamGetPriority_ptsz(s: CUstream, prio: *mut c_int) -> CUresult;
            cuda fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> CUresult;
            cuda fn cuStreamGetFlags_ptsz(s: CUstream, flags: *mut c_uint) -> CUresult;
            cuda fn cuStreamGetCtx(s: CUstream, ctx: *mut CUcontext) -> CUresult;
            cuda fn cuStreamGetCtx_ptsz(s: CUstream, ctx: *mut CUcontext) -> CUresult;
            cuda fn cuStreamGetCtx_v2(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) -> CUresult;
            cuda fn cuStreamGetCtx_v2_ptsz(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) -> CUresult;
            cuda fn cuStreamGetDevice(s: CUstream, dev: *mut CUdevice) -> CUresult;
            cuda fn cuStreamGetDevice_ptsz(s: CUstream, dev: *mut CUdevice) -> CUresult;
            cuda fn cuStreamGetId(s: CUstream, id: *mut u64) -> CUresult;
            cuda fn cuStreamGetId_ptsz(s: CUstream, id: *mut u64) -> CUresult;
            cuda fn cuCtxGetLimit(v: *mut usize, limit: CUlimit) -> CUresult;
            cuda fn cuCtxSetLimit(limit: CUlimit, v: usize) -> CUresult;
            cuda fn cuCtxGetCacheConfig(cfg: *mut CUfunc_cache) -> CUresult;
            cuda fn cuCtxSetCacheConfig(cfg: CUfunc_cache) -> CUresult;
            cuda fn cuCtxGetSharedMemConfig(cfg: *mut c_uint) -> CUresult;
            cuda fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult;
            cuda fn cuDeviceGetP2PAttribute(v: *mut c_int, attr: CUdevice_P2PAttribute, src: CUdevice, dst: CUdevice) -> CUresult;
            cuda fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult;
            cuda fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult;
            cuda fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult;
            cuda fn cuFuncGetAttribute(v: *mut c_int, attr: CUfunction_attribute, f: CUfunction) -> CUresult;
            cuda fn cuFuncSetAttribute(f: CUfunction, attr: CUfunction_attribute, v: c_int) -> CUresult;
            cuda fn cuFuncSetCacheConfig(f: CUfunction, cfg: CUfunc_cache) -> CUresult;
            cuda fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult;
            cuda fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize) -> CUresult;
            cuda fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: CUfunction, block: c_int, smem: usize, flags: c_uint) -> CUresult;
            cuda fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, nopts: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) -> CUresult;
            cuda fn cuModuleLoadFatBinary(module: *mut CUmodule, fat: *const c_void) -> CUresult;
            cuda fn cuLinkCreate(n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void, state: *mut CUlinkState) -> CUresult;
            cuda fn cuLinkCreate_v2(n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void, state: *mut CUlinkState) -> CUresult;
            cuda fn cuLinkAddData(state: CUlinkState, ty: CUjitInputType, data: *mut c_void, size: usize, name: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) -> CUresult;
            cuda fn cuLinkAddData_v2(state: CUlinkState, ty: CUjitInputType, data: *mut c_void, size: usize, name: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) -> CUresult;
            cuda fn cuLinkAddFile(state: CUlinkState, ty: CUjitInputType, path: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) -> CUresult;
            cuda fn cuLinkAddFile_v2(state: CUlinkState, ty: CUjitInputType, path: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) -> CUresult;
            cuda fn cuLinkComplete(state: CUlinkState, cubin: *mut *mut c_void, size: *mut usize) -> CUresult;
            cuda fn cuLinkDestroy(state: CUlinkState) -> CUresult;
            cuda fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
            cuda fn cuGraphAddMemFreeNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, dptr: CUdeviceptr) -> CUresult;
            cuda fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, v: *mut c_void) -> CUresult;
            // --- simulated too: library management (CUDA 12.0+; a `CUkernel`
            // may stand for a `CUfunction` in a launch, which the interposer
            // paces like any other, so none of these is hooked)
            cuda fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) -> CUresult;
            cuda fn cuLibraryLoadFromFile(library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) -> CUresult;
            cuda fn cuLibraryUnload(library: CUlibrary) -> CUresult;
            cuda fn cuLibraryGetKernel(pKernel: *mut CUkernel, library: CUlibrary, name: *const c_char) -> CUresult;
            cuda fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) -> CUresult;
            cuda fn cuLibraryEnumerateKernels(kernels: *mut CUkernel, numKernels: c_uint, lib: CUlibrary) -> CUresult;
            cuda fn cuLibraryGetModule(pMod: *mut CUmodule, library: CUlibrary) -> CUresult;
            cuda fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) -> CUresult;
            cuda fn cuKernelGetFunction(pFunc: *mut CUfunction, kernel: CUkernel) -> CUresult;
            cuda fn cuKernelGetLibrary(pLib: *mut CUlibrary, kernel: CUkernel) -> CUresult;
            cuda fn cuKernelGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, kernel: CUkernel, dev: CUdevice) -> CUresult;
            cuda fn cuKernelGetName(name: *mut *const c_char, hfunc: CUkernel) -> CUresult;
            // --- simulated too: NVML queries
            nvml fn nvmlInit() -> nvmlReturn_t;
            nvml fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t;
            nvml fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t;
            nvml fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t;
            nvml fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPciInfo(h: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPciInfo_v2(h: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetRunningProcessDetailList(h: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetClockInfo(h: nvmlDevice_t, ty: nvmlClockType_t, clk: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMaxClockInfo(h: nvmlDevice_t, ty: nvmlClockType_t, clk: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetComputeMode(h: nvmlDevice_t, mode: *mut nvmlComputeMode_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetDisplayActive(h: nvmlDevice_t, active: *mut nvmlEnableState_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetDisplayMode(h: nvmlDevice_t, mode: *mut nvmlEnableState_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetDriverModel(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetDriverModel_v2(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPerformanceState(h: nvmlDevice_t, p: *mut nvmlPstates_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPersistenceMode(h: nvmlDevice_t, mode: *mut nvmlEnableState_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetEnforcedPowerLimit(h: nvmlDevice_t, mw: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPowerManagementLimit(h: nvmlDevice_t, mw: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPowerManagementDefaultLimit(h: nvmlDevice_t, mw: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPowerManagementLimitConstraints(h: nvmlDevice_t, min: *mut c_uint, max: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPowerUsage(h: nvmlDevice_t, mw: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetFanSpeed(h: nvmlDevice_t, speed: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetTemperature(h: nvmlDevice_t, sensor: nvmlTemperatureSensors_t, t: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetTemperatureV(h: nvmlDevice_t, t: *mut nvmlTemperature_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetTotalEccErrors(h: nvmlDevice_t, ty: nvmlMemoryErrorType_t, counter: nvmlEccCounterType_t, n: *mut u64) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetEncoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetDecoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMigMode(h: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceIsMigDeviceHandle(h: nvmlDevice_t, is_mig: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMaxMigDeviceCount(h: nvmlDevice_t, n: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMigDeviceHandleByIndex(h: nvmlDevice_t, index: c_uint, mig: *mut nvmlDevice_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetBAR1MemoryInfo(h: nvmlDevice_t, bar1: *mut nvmlBAR1Memory_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetConfComputeMemSizeInfo(h: nvmlDevice_t, info: *mut nvmlConfComputeMemSizeInfo_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetSerial(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetMinorNumber(h: nvmlDevice_t, n: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetPcieThroughput(h: nvmlDevice_t, counter: nvmlPcieUtilCounter_t, kib_s: *mut c_uint) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetFieldValues(h: nvmlDevice_t, n: c_int, values: *mut nvmlFieldValue_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, h: *mut nvmlDevice_t) -> nvmlReturn_t;
            nvml fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, h: *mut nvmlDevice_t) -> nvmlReturn_t;
        }
    };
}

/// One C export of the list, guarded: `guard(name, body)` runs the body
/// (a closure returning `result`) and turns its error or panic into the
/// `returns` code, so no panic unwinds into C; and the export is tied at
/// compile time to its entry's type (`sig::<name>`): a wrong parameter
/// type, or an export missing from the list, fails the build. The
/// attributes (`#[no_mangle]`, docs) are the caller's. Every guarded
/// export of the workspace is made here: the simulator's `libcuda.so.1`
/// and `libnvidia-ml.so.1` (through [`guarded_exports!`]) and the
/// interposer's hooks (its `hooks!`, which adds the real-pointer lookup
/// and the hook table around it).
///
/// ```text
/// guarded_export! { #[no_mangle] guard: run, result: R;
///     fn cuInit(flags: c_uint) -> CUresult { driver::init(flags) }
/// }
/// ```
#[macro_export]
macro_rules! guarded_export {
    ($(#[$attr:meta])* guard: $guard:path, result: $result:ty;
     fn $name:ident($($a:ident: $t:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$attr])*
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            $guard(stringify!($name), move || -> $result { $body })
        }
        // The export's C type is exactly the signature list's entry.
        const _: $crate::sig::$name = $name;
    };
}

/// Exports C functions of the list, each through [`guarded_export!`]
/// with `#[no_mangle]` and one guard, result and return type for all.
///
/// ```text
/// guarded_exports! { guard: run, returns: CUresult, result: R;
///     fn cuInit(flags: c_uint) { driver::init(flags) }
/// }
/// ```
#[macro_export]
macro_rules! guarded_exports {
    (guard: $guard:path, returns: $ret:ty, result: $result:ty;
     $( fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block )*) => {
        $(
            $crate::guarded_export! { #[no_mangle] guard: $guard, result: $result;
                fn $name($($a: $t),*) -> $ret $body
            }
        )*
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
        let all: Vec<&Signature> = signatures().collect();
        let names: std::collections::BTreeSet<&str> = all.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), all.len(), "an entry is listed twice");
        for s in all {
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
}
