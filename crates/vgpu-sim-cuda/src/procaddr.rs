//! `cuGetProcAddress` version table: (name, cudaVersion, flags) -> the
//! versioned export whose ABI that version asks for. Versions are those of
//! the `PFN_<name>_v<NNNN>` typedefs in `cudaTypedefs.h` (CUDA 12.9); the
//! k-th ABI of a name is exported as `name`, `name_v2`, …, and per-thread
//! default-stream variants as `_ptsz`/`_ptds`.
use std::sync::OnceLock;

use vgpu_cuda_abi::{
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};

use crate::ffi;

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Base name as callers ask for it.
    pub name: &'static str,
    /// First CUDA version whose ABI this export is.
    pub since: i32,
    /// A per-thread default-stream variant.
    pub per_thread: bool,
    /// The exported symbol.
    pub export: &'static str,
    pub addr: usize,
}

macro_rules! table {
    ($( $name:literal $since:literal $($pt:ident)? => $f:ident ),* $(,)?) => {
        vec![ $( Entry {
            name: $name,
            since: $since,
            per_thread: table!(@pt $($pt)?),
            export: stringify!($f),
            addr: ffi::$f as *const () as usize,
        } ),* ]
    };
    (@pt pt) => { true };
    (@pt) => { false };
}

pub fn table() -> &'static [Entry] {
    static T: OnceLock<Vec<Entry>> = OnceLock::new();
    T.get_or_init(|| {
        table![
            "cuInit" 2000 => cuInit,
            "cuDriverGetVersion" 2020 => cuDriverGetVersion,
            "cuGetProcAddress" 11030 => cuGetProcAddress,
            "cuGetProcAddress" 12000 => cuGetProcAddress_v2,
            "cuGetErrorName" 6000 => cuGetErrorName,
            "cuGetErrorString" 6000 => cuGetErrorString,
            "cuDeviceGet" 2000 => cuDeviceGet,
            "cuDeviceGetCount" 2000 => cuDeviceGetCount,
            "cuDeviceGetName" 2000 => cuDeviceGetName,
            "cuDeviceGetUuid" 9020 => cuDeviceGetUuid,
            "cuDeviceGetUuid" 11040 => cuDeviceGetUuid_v2,
            "cuDeviceTotalMem" 2000 => cuDeviceTotalMem,
            "cuDeviceTotalMem" 3020 => cuDeviceTotalMem_v2,
            "cuDeviceGetAttribute" 2000 => cuDeviceGetAttribute,
            "cuDeviceGetPCIBusId" 4010 => cuDeviceGetPCIBusId,
            "cuDeviceGetDefaultMemPool" 11020 => cuDeviceGetDefaultMemPool,
            "cuDevicePrimaryCtxRetain" 7000 => cuDevicePrimaryCtxRetain,
            "cuDevicePrimaryCtxRelease" 7000 => cuDevicePrimaryCtxRelease,
            "cuDevicePrimaryCtxRelease" 11000 => cuDevicePrimaryCtxRelease_v2,
            "cuDevicePrimaryCtxGetState" 7000 => cuDevicePrimaryCtxGetState,
            "cuDevicePrimaryCtxSetFlags" 7000 => cuDevicePrimaryCtxSetFlags,
            "cuDevicePrimaryCtxSetFlags" 11000 => cuDevicePrimaryCtxSetFlags_v2,
            "cuDevicePrimaryCtxReset" 7000 => cuDevicePrimaryCtxReset,
            "cuDevicePrimaryCtxReset" 11000 => cuDevicePrimaryCtxReset_v2,
            "cuCtxCreate" 2000 => cuCtxCreate,
            "cuCtxCreate" 3020 => cuCtxCreate_v2,
            "cuCtxCreate" 11040 => cuCtxCreate_v3,
            "cuCtxCreate" 12050 => cuCtxCreate_v4,
            "cuCtxDestroy" 2000 => cuCtxDestroy,
            "cuCtxDestroy" 4000 => cuCtxDestroy_v2,
            "cuCtxSetCurrent" 4000 => cuCtxSetCurrent,
            "cuCtxGetCurrent" 4000 => cuCtxGetCurrent,
            "cuCtxGetDevice" 2000 => cuCtxGetDevice,
            "cuCtxGetFlags" 7000 => cuCtxGetFlags,
            "cuCtxGetApiVersion" 3020 => cuCtxGetApiVersion,
            "cuCtxSynchronize" 2000 => cuCtxSynchronize,
            "cuCtxPushCurrent" 2000 => cuCtxPushCurrent,
            "cuCtxPushCurrent" 4000 => cuCtxPushCurrent_v2,
            "cuCtxPopCurrent" 2000 => cuCtxPopCurrent,
            "cuCtxPopCurrent" 4000 => cuCtxPopCurrent_v2,
            "cuMemGetInfo" 2000 => cuMemGetInfo,
            "cuMemGetInfo" 3020 => cuMemGetInfo_v2,
            "cuMemAlloc" 2000 => cuMemAlloc,
            "cuMemAlloc" 3020 => cuMemAlloc_v2,
            "cuMemFree" 2000 => cuMemFree,
            "cuMemFree" 3020 => cuMemFree_v2,
            "cuMemAllocPitch" 2000 => cuMemAllocPitch,
            "cuMemAllocPitch" 3020 => cuMemAllocPitch_v2,
            "cuMemAllocManaged" 6000 => cuMemAllocManaged,
            "cuMemAllocHost" 2000 => cuMemAllocHost,
            "cuMemAllocHost" 3020 => cuMemAllocHost_v2,
            "cuMemFreeHost" 2000 => cuMemFreeHost,
            "cuMemHostAlloc" 2020 => cuMemHostAlloc,
            "cuMemHostRegister" 4000 => cuMemHostRegister,
            "cuMemHostRegister" 6050 => cuMemHostRegister_v2,
            "cuMemHostUnregister" 4000 => cuMemHostUnregister,
            "cuMemAllocAsync" 11020 => cuMemAllocAsync,
            "cuMemAllocAsync" 11020 pt => cuMemAllocAsync_ptsz,
            "cuMemAllocFromPoolAsync" 11020 => cuMemAllocFromPoolAsync,
            "cuMemAllocFromPoolAsync" 11020 pt => cuMemAllocFromPoolAsync_ptsz,
            "cuMemFreeAsync" 11020 => cuMemFreeAsync,
            "cuMemFreeAsync" 11020 pt => cuMemFreeAsync_ptsz,
            "cuDeviceGetMemPool" 11020 => cuDeviceGetMemPool,
            "cuDeviceSetMemPool" 11020 => cuDeviceSetMemPool,
            "cuMemPoolCreate" 11020 => cuMemPoolCreate,
            "cuMemPoolDestroy" 11020 => cuMemPoolDestroy,
            "cuMemPoolTrimTo" 11020 => cuMemPoolTrimTo,
            "cuMemPoolGetAttribute" 11020 => cuMemPoolGetAttribute,
            "cuMemPoolSetAttribute" 11020 => cuMemPoolSetAttribute,
            "cuMemPoolSetAccess" 11020 => cuMemPoolSetAccess,
            "cuMemPoolGetAccess" 11020 => cuMemPoolGetAccess,
            "cuMemCreate" 10020 => cuMemCreate,
            "cuMemRelease" 10020 => cuMemRelease,
            "cuMemGetAllocationGranularity" 10020 => cuMemGetAllocationGranularity,
            "cuMemAddressReserve" 10020 => cuMemAddressReserve,
            "cuMemAddressFree" 10020 => cuMemAddressFree,
            "cuMemMap" 10020 => cuMemMap,
            "cuMemUnmap" 10020 => cuMemUnmap,
            "cuMemSetAccess" 10020 => cuMemSetAccess,
            "cuArrayCreate" 2000 => cuArrayCreate,
            "cuArrayCreate" 3020 => cuArrayCreate_v2,
            "cuArray3DCreate" 2000 => cuArray3DCreate,
            "cuArray3DCreate" 3020 => cuArray3DCreate_v2,
            "cuArrayDestroy" 2000 => cuArrayDestroy,
            "cuMipmappedArrayCreate" 5000 => cuMipmappedArrayCreate,
            "cuMipmappedArrayDestroy" 5000 => cuMipmappedArrayDestroy,
            "cuModuleLoad" 2000 => cuModuleLoad,
            "cuModuleLoadData" 2000 => cuModuleLoadData,
            "cuModuleUnload" 2000 => cuModuleUnload,
            "cuModuleGetFunction" 2000 => cuModuleGetFunction,
            "cuLaunchKernel" 4000 => cuLaunchKernel,
            "cuLaunchKernel" 7000 pt => cuLaunchKernel_ptsz,
            "cuLaunchKernelEx" 11060 => cuLaunchKernelEx,
            "cuLaunchKernelEx" 11060 pt => cuLaunchKernelEx_ptsz,
            "cuLaunchCooperativeKernel" 9000 => cuLaunchCooperativeKernel,
            "cuLaunchCooperativeKernel" 9000 pt => cuLaunchCooperativeKernel_ptsz,
            "cuLaunchCooperativeKernelMultiDevice" 9000 => cuLaunchCooperativeKernelMultiDevice,
            "cuStreamCreate" 2000 => cuStreamCreate,
            "cuStreamCreateWithPriority" 5050 => cuStreamCreateWithPriority,
            "cuStreamDestroy" 2000 => cuStreamDestroy,
            "cuStreamDestroy" 4000 => cuStreamDestroy_v2,
            "cuStreamSynchronize" 2000 => cuStreamSynchronize,
            "cuStreamSynchronize" 7000 pt => cuStreamSynchronize_ptsz,
            "cuStreamQuery" 2000 => cuStreamQuery,
            "cuStreamQuery" 7000 pt => cuStreamQuery_ptsz,
            "cuStreamBeginCapture" 10000 => cuStreamBeginCapture,
            "cuStreamBeginCapture" 10000 pt => cuStreamBeginCapture_ptsz,
            "cuStreamBeginCapture" 10010 => cuStreamBeginCapture_v2,
            "cuStreamBeginCapture" 10010 pt => cuStreamBeginCapture_v2_ptsz,
            "cuStreamBeginCaptureToGraph" 12030 => cuStreamBeginCaptureToGraph,
            "cuStreamBeginCaptureToGraph" 12030 pt => cuStreamBeginCaptureToGraph_ptsz,
            "cuStreamEndCapture" 10000 => cuStreamEndCapture,
            "cuStreamEndCapture" 10000 pt => cuStreamEndCapture_ptsz,
            "cuStreamIsCapturing" 10000 => cuStreamIsCapturing,
            "cuStreamIsCapturing" 10000 pt => cuStreamIsCapturing_ptsz,
            "cuStreamWaitEvent" 3020 => cuStreamWaitEvent,
            "cuStreamWaitEvent" 7000 pt => cuStreamWaitEvent_ptsz,
            "cuEventCreate" 2000 => cuEventCreate,
            "cuEventRecord" 2000 => cuEventRecord,
            "cuEventRecord" 7000 pt => cuEventRecord_ptsz,
            "cuEventRecordWithFlags" 11010 => cuEventRecordWithFlags,
            "cuEventRecordWithFlags" 11010 pt => cuEventRecordWithFlags_ptsz,
            "cuEventSynchronize" 2000 => cuEventSynchronize,
            "cuEventQuery" 2000 => cuEventQuery,
            "cuEventElapsedTime" 2000 => cuEventElapsedTime,
            "cuEventElapsedTime" 12080 => cuEventElapsedTime_v2,
            "cuEventDestroy" 2000 => cuEventDestroy,
            "cuEventDestroy" 4000 => cuEventDestroy_v2,
            "cuGraphCreate" 10000 => cuGraphCreate,
            "cuGraphAddKernelNode" 10000 => cuGraphAddKernelNode,
            "cuGraphAddKernelNode" 12000 => cuGraphAddKernelNode_v2,
            "cuGraphInstantiate" 10000 => cuGraphInstantiate,
            "cuGraphInstantiate" 11000 => cuGraphInstantiate_v2,
            "cuGraphInstantiateWithFlags" 11040 => cuGraphInstantiateWithFlags,
            "cuGraphInstantiateWithParams" 12000 => cuGraphInstantiateWithParams,
            "cuGraphInstantiateWithParams" 12000 pt => cuGraphInstantiateWithParams_ptsz,
            "cuGraphUpload" 11010 => cuGraphUpload,
            "cuGraphUpload" 11010 pt => cuGraphUpload_ptsz,
            "cuGraphGetNodes" 10000 => cuGraphGetNodes,
            "cuGraphNodeGetType" 10000 => cuGraphNodeGetType,
            "cuGraphLaunch" 10000 => cuGraphLaunch,
            "cuGraphLaunch" 10000 pt => cuGraphLaunch_ptsz,
            "cuGraphExecDestroy" 10000 => cuGraphExecDestroy,
            "cuGraphDestroy" 10000 => cuGraphDestroy,
            "cuMemcpy" 4000 => cuMemcpy,
            "cuMemcpy" 7000 pt => cuMemcpy_ptds,
            "cuMemcpyAsync" 4000 => cuMemcpyAsync,
            "cuMemcpyAsync" 7000 pt => cuMemcpyAsync_ptsz,
            "cuMemcpyPeer" 4000 => cuMemcpyPeer,
            "cuMemcpyPeer" 7000 pt => cuMemcpyPeer_ptds,
            "cuMemcpyPeerAsync" 4000 => cuMemcpyPeerAsync,
            "cuMemcpyPeerAsync" 7000 pt => cuMemcpyPeerAsync_ptsz,
            "cuMemcpyHtoD" 2000 => cuMemcpyHtoD,
            "cuMemcpyHtoD" 3020 => cuMemcpyHtoD_v2,
            "cuMemcpyHtoD" 7000 pt => cuMemcpyHtoD_v2_ptds,
            "cuMemcpyDtoH" 2000 => cuMemcpyDtoH,
            "cuMemcpyDtoH" 3020 => cuMemcpyDtoH_v2,
            "cuMemcpyDtoH" 7000 pt => cuMemcpyDtoH_v2_ptds,
            "cuMemcpyDtoD" 2000 => cuMemcpyDtoD,
            "cuMemcpyDtoD" 3020 => cuMemcpyDtoD_v2,
            "cuMemcpyDtoD" 7000 pt => cuMemcpyDtoD_v2_ptds,
            "cuMemcpyHtoDAsync" 2000 => cuMemcpyHtoDAsync,
            "cuMemcpyHtoDAsync" 3020 => cuMemcpyHtoDAsync_v2,
            "cuMemcpyHtoDAsync" 7000 pt => cuMemcpyHtoDAsync_v2_ptsz,
            "cuMemcpyDtoHAsync" 2000 => cuMemcpyDtoHAsync,
            "cuMemcpyDtoHAsync" 3020 => cuMemcpyDtoHAsync_v2,
            "cuMemcpyDtoHAsync" 7000 pt => cuMemcpyDtoHAsync_v2_ptsz,
            "cuMemcpyDtoDAsync" 3000 => cuMemcpyDtoDAsync,
            "cuMemcpyDtoDAsync" 3020 => cuMemcpyDtoDAsync_v2,
            "cuMemcpyDtoDAsync" 7000 pt => cuMemcpyDtoDAsync_v2_ptsz,
            "cuMemcpy2D" 3020 => cuMemcpy2D_v2,
            "cuMemcpy2D" 7000 pt => cuMemcpy2D_v2_ptds,
            "cuMemcpy2DUnaligned" 3020 => cuMemcpy2DUnaligned_v2,
            "cuMemcpy2DUnaligned" 7000 pt => cuMemcpy2DUnaligned_v2_ptds,
            "cuMemcpy2DAsync" 3020 => cuMemcpy2DAsync_v2,
            "cuMemcpy2DAsync" 7000 pt => cuMemcpy2DAsync_v2_ptsz,
            "cuMemcpy3D" 3020 => cuMemcpy3D_v2,
            "cuMemcpy3D" 7000 pt => cuMemcpy3D_v2_ptds,
            "cuMemcpy3DAsync" 3020 => cuMemcpy3DAsync_v2,
            "cuMemcpy3DAsync" 7000 pt => cuMemcpy3DAsync_v2_ptsz,
            "cuMemsetD8" 2000 => cuMemsetD8,
            "cuMemsetD8" 3020 => cuMemsetD8_v2,
            "cuMemsetD8" 7000 pt => cuMemsetD8_v2_ptds,
            "cuMemsetD16" 2000 => cuMemsetD16,
            "cuMemsetD16" 3020 => cuMemsetD16_v2,
            "cuMemsetD16" 7000 pt => cuMemsetD16_v2_ptds,
            "cuMemsetD32" 2000 => cuMemsetD32,
            "cuMemsetD32" 3020 => cuMemsetD32_v2,
            "cuMemsetD32" 7000 pt => cuMemsetD32_v2_ptds,
            "cuMemsetD8Async" 3020 => cuMemsetD8Async,
            "cuMemsetD8Async" 7000 pt => cuMemsetD8Async_ptsz,
            "cuMemsetD16Async" 3020 => cuMemsetD16Async,
            "cuMemsetD16Async" 7000 pt => cuMemsetD16Async_ptsz,
            "cuMemsetD32Async" 3020 => cuMemsetD32Async,
            "cuMemsetD32Async" 7000 pt => cuMemsetD32Async_ptsz,
            "cuMemsetD2D8" 3020 => cuMemsetD2D8_v2,
            "cuMemsetD2D8" 7000 pt => cuMemsetD2D8_v2_ptds,
            "cuMemsetD2D16" 3020 => cuMemsetD2D16_v2,
            "cuMemsetD2D16" 7000 pt => cuMemsetD2D16_v2_ptds,
            "cuMemsetD2D32" 3020 => cuMemsetD2D32_v2,
            "cuMemsetD2D32" 7000 pt => cuMemsetD2D32_v2_ptds,
            "cuMemsetD2D8Async" 3020 => cuMemsetD2D8Async,
            "cuMemsetD2D8Async" 7000 pt => cuMemsetD2D8Async_ptsz,
            "cuMemsetD2D16Async" 3020 => cuMemsetD2D16Async,
            "cuMemsetD2D16Async" 7000 pt => cuMemsetD2D16Async_ptsz,
            "cuMemsetD2D32Async" 3020 => cuMemsetD2D32Async,
            "cuMemsetD2D32Async" 7000 pt => cuMemsetD2D32Async_ptsz,
            "cuPointerGetAttribute" 4000 => cuPointerGetAttribute,
            "cuPointerGetAttributes" 7000 => cuPointerGetAttributes,
            "cuMemGetAddressRange" 3020 => cuMemGetAddressRange_v2,
            "cuMemHostGetDevicePointer" 3020 => cuMemHostGetDevicePointer_v2,
            "cuIpcGetMemHandle" 4010 => cuIpcGetMemHandle,
            "cuIpcOpenMemHandle" 4010 => cuIpcOpenMemHandle,
            "cuIpcOpenMemHandle" 11000 => cuIpcOpenMemHandle_v2,
            "cuIpcCloseMemHandle" 4010 => cuIpcCloseMemHandle,
            "cuIpcGetEventHandle" 4010 => cuIpcGetEventHandle,
            "cuIpcOpenEventHandle" 4010 => cuIpcOpenEventHandle,
            "cuCtxGetStreamPriorityRange" 5050 => cuCtxGetStreamPriorityRange,
            "cuStreamGetPriority" 5050 => cuStreamGetPriority,
            "cuStreamGetPriority" 7000 pt => cuStreamGetPriority_ptsz,
            "cuStreamGetFlags" 5050 => cuStreamGetFlags,
            "cuStreamGetFlags" 7000 pt => cuStreamGetFlags_ptsz,
            "cuStreamGetCtx" 9020 => cuStreamGetCtx,
            "cuStreamGetCtx" 9020 pt => cuStreamGetCtx_ptsz,
            "cuStreamGetCtx" 12050 => cuStreamGetCtx_v2,
            "cuStreamGetCtx" 12050 pt => cuStreamGetCtx_v2_ptsz,
            "cuStreamGetDevice" 12080 => cuStreamGetDevice,
            "cuStreamGetDevice" 12080 pt => cuStreamGetDevice_ptsz,
            "cuStreamGetId" 12000 => cuStreamGetId,
            "cuStreamGetId" 12000 pt => cuStreamGetId_ptsz,
            "cuCtxGetLimit" 3010 => cuCtxGetLimit,
            "cuCtxSetLimit" 3010 => cuCtxSetLimit,
            "cuCtxGetCacheConfig" 3020 => cuCtxGetCacheConfig,
            "cuCtxSetCacheConfig" 3020 => cuCtxSetCacheConfig,
            "cuCtxGetSharedMemConfig" 4020 => cuCtxGetSharedMemConfig,
            "cuDeviceCanAccessPeer" 4000 => cuDeviceCanAccessPeer,
            "cuDeviceGetP2PAttribute" 8000 => cuDeviceGetP2PAttribute,
            "cuCtxEnablePeerAccess" 4000 => cuCtxEnablePeerAccess,
            "cuCtxDisablePeerAccess" 4000 => cuCtxDisablePeerAccess,
            "cuDeviceGetByPCIBusId" 4010 => cuDeviceGetByPCIBusId,
            "cuFuncGetAttribute" 2020 => cuFuncGetAttribute,
            "cuFuncSetAttribute" 9000 => cuFuncSetAttribute,
            "cuFuncSetCacheConfig" 3000 => cuFuncSetCacheConfig,
            "cuFuncGetName" 12030 => cuFuncGetName,
            "cuOccupancyMaxActiveBlocksPerMultiprocessor" 6050 => cuOccupancyMaxActiveBlocksPerMultiprocessor,
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" 7000 => cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
            "cuModuleLoadDataEx" 2010 => cuModuleLoadDataEx,
            "cuModuleLoadFatBinary" 2000 => cuModuleLoadFatBinary,
            "cuLinkCreate" 5050 => cuLinkCreate,
            "cuLinkCreate" 6050 => cuLinkCreate_v2,
            "cuLinkAddData" 5050 => cuLinkAddData,
            "cuLinkAddData" 6050 => cuLinkAddData_v2,
            "cuLinkAddFile" 5050 => cuLinkAddFile,
            "cuLinkAddFile" 6050 => cuLinkAddFile_v2,
            "cuLinkComplete" 5050 => cuLinkComplete,
            "cuLinkDestroy" 5050 => cuLinkDestroy,
            "cuGraphAddMemAllocNode" 11040 => cuGraphAddMemAllocNode,
            "cuGraphAddMemFreeNode" 11040 => cuGraphAddMemFreeNode,
            "cuGraphMemAllocNodeGetParams" 11040 => cuGraphMemAllocNodeGetParams,
            "cuGraphMemFreeNodeGetParams" 11040 => cuGraphMemFreeNodeGetParams,
            "cuDeviceGetGraphMemAttribute" 11040 => cuDeviceGetGraphMemAttribute,
            "cuDeviceSetGraphMemAttribute" 11040 => cuDeviceSetGraphMemAttribute,
            "cuDeviceGraphMemTrim" 11040 => cuDeviceGraphMemTrim,
            "cuLibraryLoadData" 12000 => cuLibraryLoadData,
            "cuLibraryLoadFromFile" 12000 => cuLibraryLoadFromFile,
            "cuLibraryUnload" 12000 => cuLibraryUnload,
            "cuLibraryGetKernel" 12000 => cuLibraryGetKernel,
            "cuLibraryGetKernelCount" 12040 => cuLibraryGetKernelCount,
            "cuLibraryEnumerateKernels" 12040 => cuLibraryEnumerateKernels,
            "cuLibraryGetModule" 12000 => cuLibraryGetModule,
            "cuLibraryGetGlobal" 12000 => cuLibraryGetGlobal,
            "cuKernelGetFunction" 12000 => cuKernelGetFunction,
            "cuKernelGetLibrary" 12050 => cuKernelGetLibrary,
            "cuKernelGetAttribute" 12000 => cuKernelGetAttribute,
            "cuKernelGetName" 12030 => cuKernelGetName,
        ]
    })
}

/// The entry for a request, or the `CUdriverProcAddressQueryResult` of a
/// miss: SYMBOL_NOT_FOUND (no such name) or VERSION_NOT_SUFFICIENT (the
/// name exists only in later versions). With the per-thread flag, a
/// per-thread variant wins where one exists; otherwise the legacy one.
pub fn lookup(name: &str, version: i32, flags: u64) -> Result<&'static Entry, i32> {
    let t = table();
    let mut any = false;
    let mut best: [Option<&Entry>; 2] = [None, None];
    for e in t.iter().filter(|e| e.name == name) {
        any = true;
        if e.since <= version {
            let slot = &mut best[usize::from(e.per_thread)];
            if slot.is_none_or(|b| b.since < e.since) {
                *slot = Some(e);
            }
        }
    }
    if !any {
        return Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    let pt = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let hit = if pt { best[1].or(best[0]) } else { best[0] };
    hit.ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected map generated from NVIDIA's headers
    /// (`conformance/gen-procaddress-map`) for every request libcudart 12.9
    /// makes: each request for an entry the sim exports must route to
    /// exactly that export; the rest must be reported not found.
    #[test]
    fn cudart_12_9_requests_route_as_the_headers_say() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../conformance/data/cudart-12.9-procaddress-expected.txt"
        );
        let text = std::fs::read_to_string(path).expect("expected map (conformance/data)");
        let exports: std::collections::HashSet<&str> = table().iter().map(|e| e.export).collect();
        let (mut routed, mut missing, mut lines) = (0, 0, 0);
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let f: Vec<&str> = line.split('|').collect();
            assert_eq!(f.len(), 4, "bad line {line}");
            let (name, ver, flags, want) = (
                f[0],
                f[1].parse::<i32>().unwrap(),
                f[2].parse::<u64>().unwrap(),
                f[3],
            );
            lines += 1;
            let got = lookup(name, ver, flags);
            if exports.contains(want) {
                let e = got.unwrap_or_else(|s| panic!("{line}: status {s}, want {want}"));
                assert_eq!(e.export, want, "{line}");
                routed += 1;
            } else {
                // An entry the sim lacks: it must not route somewhere else.
                if let Ok(e) = got {
                    panic!("{line}: routed to {} but the headers say {want}", e.export);
                }
                missing += 1;
            }
        }
        assert!(lines >= 419, "only {lines} requests read");
        assert!(routed >= 80, "only {routed} routed");
        eprintln!("{routed} requests routed, {missing} not simulated");
    }

    #[test]
    fn status_semantics() {
        assert_eq!(
            lookup("cuMemAlloc", 12090, 0).unwrap().export,
            "cuMemAlloc_v2"
        );
        assert_eq!(lookup("cuMemAlloc", 3010, 0).unwrap().export, "cuMemAlloc");
        assert_eq!(
            lookup("cuMemAlloc", 1000, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(
            lookup("cuNoSuch", 12090, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        );
        assert_eq!(
            lookup("", 0, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        );
        assert_eq!(
            lookup("cuMemAllocAsync", 11000, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(
            lookup("cuCtxCreate", 12050, 0).unwrap().export,
            "cuCtxCreate_v4"
        );
        assert_eq!(
            lookup("cuCtxCreate", 12040, 0).unwrap().export,
            "cuCtxCreate_v3"
        );
        // Per-thread: the _ptsz variant from its version on, legacy before.
        assert_eq!(
            lookup("cuLaunchKernel", 12000, 2).unwrap().export,
            "cuLaunchKernel_ptsz"
        );
        assert_eq!(
            lookup("cuLaunchKernel", 6000, 2).unwrap().export,
            "cuLaunchKernel"
        );
        assert_eq!(
            lookup("cuLaunchKernel", 12000, 1).unwrap().export,
            "cuLaunchKernel"
        );
        // Library management: 12.0 on; the kernel count from 12.4.
        assert_eq!(
            lookup("cuLibraryLoadData", 12000, 0).unwrap().export,
            "cuLibraryLoadData"
        );
        assert_eq!(
            lookup("cuLibraryLoadData", 11080, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(
            lookup("cuLibraryGetKernelCount", 12030, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(
            lookup("cuKernelGetFunction", 12090, 2).unwrap().export,
            "cuKernelGetFunction"
        );
        // No per-thread variant: the legacy entry.
        assert_eq!(
            lookup("cuMemAlloc", 12000, 2).unwrap().export,
            "cuMemAlloc_v2"
        );
    }
}
