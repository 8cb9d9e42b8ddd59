//! The one list of driver functions this library calls or exports, with
//! their C types as `cuda.h` / `nvml.h` spell them.
//!
//! Everything typed comes from here: the function-pointer types
//! ([`sig`]), the real-function table's slots ([`Fn`], one per entry, with
//! its symbol and library as code rather than relocated data),
//! the typed getters (`api::cuMemAlloc_v2()`), and the hook exports in
//! `ffi/`, which a compile-time check ties to the entry of the same name.
//! `tests/signatures.rs` compiles every entry's prototype against NVIDIA's
//! headers, so a wrong parameter type fails a test instead of running.
//! Add an entry here before calling or hooking a new driver function.
//!
//! Owns no state and never calls anything: [`super::table`] resolves.
#![allow(non_camel_case_types, non_snake_case, clippy::too_many_arguments)]
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use vgpu_cuda_abi::*;

use super::table::{self, Lib};

/// One entry of the list, for the header check and the docs (built on
/// demand: the library's hot paths use [`Fn`]'s methods, which are code,
/// not relocated data in every process that loads the library).
#[derive(Debug, Clone)]
pub struct Entry {
    pub f: Fn,
    /// Parameter types as written in the list (`*mut CUdeviceptr`, `usize`).
    pub params: Vec<&'static str>,
    pub ret: &'static str,
}

impl Entry {
    pub fn name(&self) -> &'static str {
        self.f.name()
    }
}

/// A NUL-terminated literal as a `CStr`, checked at compile time.
const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("symbol names are NUL-terminated literals"),
    }
}

macro_rules! lib_of {
    (cuda) => {
        Lib::Cuda
    };
    (nvml) => {
        Lib::Nvml
    };
}

macro_rules! driver_api {
    ($( $lib:ident fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// The C function type of every entry.
        pub mod sig {
            use super::*;
            $( pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
        }

        /// The table slot of every entry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Fn { $($name),* }

        /// Number of entries (and table slots).
        pub const COUNT: usize = [$(Fn::$name),*].len();

        /// Every slot in order (`FNS[i] as usize == i`).
        static FNS: [Fn; COUNT] = [$(Fn::$name),*];

        impl Fn {
            /// The exact (versioned) symbol, for `dlsym`.
            pub fn symbol(self) -> &'static CStr {
                match self {
                    $(Fn::$name => {
                        const C: &CStr = cstr(concat!(stringify!($name), "\0"));
                        C
                    })*
                }
            }

            pub fn lib(self) -> Lib {
                match self { $(Fn::$name => lib_of!($lib),)* }
            }

            /// The entry as the list spells it.
            pub fn entry(self) -> Entry {
                match self {
                    $(Fn::$name => Entry {
                        f: self,
                        params: vec![$(stringify!($ty)),*],
                        ret: stringify!($ret),
                    },)*
                }
            }
        }

        $(
            /// The real driver function, resolved on first use (`None`:
            /// library or symbol missing).
            #[inline]
            pub fn $name() -> Option<sig::$name> {
                // SAFETY: `sig::$name` is the C type of the symbol this slot
                // resolves, by construction of this list (and checked against
                // the headers by tests/signatures.rs).
                unsafe { table::get::<sig::$name>(Fn::$name) }
            }
        )*
    };
}

driver_api! {
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

/// The entry of a symbol name, if the list has it.
pub fn by_name(name: &str) -> Option<Fn> {
    Fn::all().find(|f| f.name() == name)
}

/// Every entry, in slot order.
pub fn entries() -> Vec<Entry> {
    Fn::all().map(Fn::entry).collect()
}

impl Fn {
    pub fn name(self) -> &'static str {
        self.symbol().to_str().unwrap_or("")
    }

    pub fn all() -> impl Iterator<Item = Fn> {
        FNS.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_names_agree() {
        assert_eq!(COUNT, entries().len());
        let mut seen = std::collections::HashSet::new();
        for f in Fn::all() {
            assert_eq!(FNS[f as usize], f);
            let e = f.entry();
            assert!(seen.insert(e.name()), "duplicate {}", e.name());
            assert_eq!(by_name(e.name()), Some(f));
            let cuda = e.name().starts_with("cu");
            assert_eq!(f.lib() == Lib::Cuda, cuda, "{}", e.name());
            assert_eq!(e.ret, if cuda { "CUresult" } else { "nvmlReturn_t" });
        }
        assert_eq!(by_name("cuNotAFunction"), None);
        assert_eq!(
            Fn::cuMemAlloc_v2.entry().params,
            ["*mut CUdeviceptr", "usize"]
        );
    }
}
