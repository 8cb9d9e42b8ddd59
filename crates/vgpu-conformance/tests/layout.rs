//! `vgpu-cuda-abi` against NVIDIA's headers: `conformance/layout.c` prints
//! sizes, offsets and constants as gcc sees them in cuda.h/nvml.h; this
//! test computes the same entries from the Rust definitions. An entry on
//! only one side fails too, so neither list can drift silently.
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;

use vgpu_cuda_abi::*;

macro_rules! size {
    ($v:ident, $t:ty) => {
        $v.push((format!("size {}", stringify!($t)), size_of::<$t>() as i64))
    };
}
macro_rules! off {
    ($v:ident, $t:ty, $f:ident) => {
        $v.push((
            format!("offset {} {}", stringify!($t), stringify!($f)),
            offset_of!($t, $f) as i64,
        ))
    };
}
macro_rules! konst {
    ($v:ident, $($c:ident),* $(,)?) => {
        $($v.push((format!("const {}", stringify!($c)), $c as i64));)*
    };
}
macro_rules! code {
    ($v:ident, $ty:ident, $($c:ident),* $(,)?) => {
        $($v.push((format!("const {}", stringify!($c)), $ty::$c.0 as i64));)*
    };
}

fn rust_side() -> Vec<(String, i64)> {
    let mut v = Vec::new();
    size!(v, CUresult);
    size!(v, CUdevice);
    size!(v, CUdeviceptr);
    size!(v, CUcontext);
    size!(v, CUmemGenericAllocationHandle);
    size!(v, CUuuid);
    size!(v, CUDA_ARRAY_DESCRIPTOR);
    off!(v, CUDA_ARRAY_DESCRIPTOR, Format);
    off!(v, CUDA_ARRAY_DESCRIPTOR, NumChannels);
    size!(v, CUDA_ARRAY3D_DESCRIPTOR);
    off!(v, CUDA_ARRAY3D_DESCRIPTOR, Depth);
    off!(v, CUDA_ARRAY3D_DESCRIPTOR, Format);
    off!(v, CUDA_ARRAY3D_DESCRIPTOR, Flags);
    size!(v, CUmemLocation);
    off!(v, CUmemLocation, id);
    size!(v, CUmemAllocationProp);
    off!(v, CUmemAllocationProp, requestedHandleTypes);
    off!(v, CUmemAllocationProp, location);
    off!(v, CUmemAllocationProp, win32HandleMetaData);
    off!(v, CUmemAllocationProp, allocFlags);
    size!(v, CUmemAccessDesc);
    off!(v, CUmemAccessDesc, flags);
    size!(v, CUmemPoolProps);
    off!(v, CUmemPoolProps, location);
    off!(v, CUmemPoolProps, win32SecurityAttributes);
    off!(v, CUmemPoolProps, maxSize);
    off!(v, CUmemPoolProps, usage);
    off!(v, CUmemPoolProps, reserved);
    size!(v, CUlaunchAttribute);
    off!(v, CUlaunchAttribute, value);
    size!(v, CUlaunchConfig);
    off!(v, CUlaunchConfig, sharedMemBytes);
    off!(v, CUlaunchConfig, hStream);
    off!(v, CUlaunchConfig, attrs);
    off!(v, CUlaunchConfig, numAttrs);
    size!(v, CUDA_KERNEL_NODE_PARAMS_v1);
    off!(v, CUDA_KERNEL_NODE_PARAMS_v1, sharedMemBytes);
    off!(v, CUDA_KERNEL_NODE_PARAMS_v1, kernelParams);
    off!(v, CUDA_KERNEL_NODE_PARAMS_v1, extra);
    size!(v, CUDA_KERNEL_NODE_PARAMS_v2);
    off!(v, CUDA_KERNEL_NODE_PARAMS_v2, kern);
    off!(v, CUDA_KERNEL_NODE_PARAMS_v2, ctx);
    size!(v, CUexecAffinityParam);
    size!(v, CUctxCreateParams);
    off!(v, CUctxCreateParams, numExecAffinityParams);
    off!(v, CUctxCreateParams, cigParams);

    code!(
        v,
        CUresult,
        CUDA_SUCCESS,
        CUDA_ERROR_INVALID_VALUE,
        CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_DEINITIALIZED,
        CUDA_ERROR_STUB_LIBRARY,
        CUDA_ERROR_DEVICE_UNAVAILABLE,
        CUDA_ERROR_NO_DEVICE,
        CUDA_ERROR_INVALID_DEVICE,
        CUDA_ERROR_INVALID_IMAGE,
        CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
        CUDA_ERROR_MAP_FAILED,
        CUDA_ERROR_UNMAP_FAILED,
        CUDA_ERROR_ALREADY_MAPPED,
        CUDA_ERROR_NOT_MAPPED,
        CUDA_ERROR_INVALID_SOURCE,
        CUDA_ERROR_FILE_NOT_FOUND,
        CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        CUDA_ERROR_OPERATING_SYSTEM,
        CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_ILLEGAL_STATE,
        CUDA_ERROR_NOT_FOUND,
        CUDA_ERROR_NOT_READY,
        CUDA_ERROR_ILLEGAL_ADDRESS,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_LAUNCH_FAILED,
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        CUDA_ERROR_NOT_PERMITTED,
        CUDA_ERROR_NOT_SUPPORTED,
        CUDA_ERROR_SYSTEM_NOT_READY,
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        CUDA_ERROR_TIMEOUT,
        CUDA_ERROR_UNKNOWN,
    );
    konst!(
        v,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        CU_AD_FORMAT_UNSIGNED_INT8,
        CU_AD_FORMAT_UNSIGNED_INT16,
        CU_AD_FORMAT_UNSIGNED_INT32,
        CU_AD_FORMAT_SIGNED_INT8,
        CU_AD_FORMAT_SIGNED_INT16,
        CU_AD_FORMAT_SIGNED_INT32,
        CU_AD_FORMAT_HALF,
        CU_AD_FORMAT_FLOAT,
        CU_MEM_LOCATION_TYPE_INVALID,
        CU_MEM_LOCATION_TYPE_DEVICE,
        CU_MEM_LOCATION_TYPE_HOST,
        CU_MEM_LOCATION_TYPE_HOST_NUMA,
        CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
        CU_MEM_ALLOCATION_TYPE_PINNED,
        CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        CU_MEMHOSTALLOC_PORTABLE,
        CU_MEMHOSTALLOC_DEVICEMAP,
        CU_MEMHOSTALLOC_WRITECOMBINED,
        CU_MEM_ATTACH_GLOBAL,
        CU_MEM_ATTACH_HOST,
        CU_GET_PROC_ADDRESS_DEFAULT,
        CU_GET_PROC_ADDRESS_LEGACY_STREAM,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        CU_GET_PROC_ADDRESS_SUCCESS,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
    );

    size!(v, nvmlReturn_t);
    size!(v, nvmlDevice_t);
    size!(v, nvmlMemory_t);
    off!(v, nvmlMemory_t, free);
    off!(v, nvmlMemory_t, used);
    size!(v, nvmlMemory_v2_t);
    off!(v, nvmlMemory_v2_t, total);
    off!(v, nvmlMemory_v2_t, reserved);
    off!(v, nvmlMemory_v2_t, free);
    off!(v, nvmlMemory_v2_t, used);
    size!(v, nvmlProcessInfo_v1_t);
    off!(v, nvmlProcessInfo_v1_t, usedGpuMemory);
    size!(v, nvmlProcessInfo_v2_t);
    off!(v, nvmlProcessInfo_v2_t, gpuInstanceId);
    off!(v, nvmlProcessInfo_v2_t, computeInstanceId);
    size!(v, nvmlProcessInfo_t);
    size!(v, nvmlPciInfo_t);
    off!(v, nvmlPciInfo_t, domain);
    off!(v, nvmlPciInfo_t, bus);
    off!(v, nvmlPciInfo_t, device);
    off!(v, nvmlPciInfo_t, pciDeviceId);
    off!(v, nvmlPciInfo_t, pciSubSystemId);
    off!(v, nvmlPciInfo_t, busId);
    size!(v, nvmlUtilization_t);
    off!(v, nvmlUtilization_t, memory);
    size!(v, nvmlProcessUtilizationSample_t);
    off!(v, nvmlProcessUtilizationSample_t, timeStamp);
    off!(v, nvmlProcessUtilizationSample_t, smUtil);
    off!(v, nvmlProcessUtilizationSample_t, memUtil);
    off!(v, nvmlProcessUtilizationSample_t, encUtil);
    off!(v, nvmlProcessUtilizationSample_t, decUtil);
    konst!(
        v,
        nvmlMemory_v2,
        NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE,
        NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE,
        NVML_DEVICE_UUID_BUFFER_SIZE,
        NVML_DEVICE_UUID_V2_BUFFER_SIZE,
        NVML_DEVICE_NAME_BUFFER_SIZE,
        NVML_DEVICE_NAME_V2_BUFFER_SIZE,
        NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE,
        NVML_VALUE_NOT_AVAILABLE,
    );
    code!(
        v,
        nvmlReturn_t,
        NVML_SUCCESS,
        NVML_ERROR_UNINITIALIZED,
        NVML_ERROR_INVALID_ARGUMENT,
        NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_NO_PERMISSION,
        NVML_ERROR_ALREADY_INITIALIZED,
        NVML_ERROR_NOT_FOUND,
        NVML_ERROR_INSUFFICIENT_SIZE,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_TIMEOUT,
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_FUNCTION_NOT_FOUND,
        NVML_ERROR_GPU_IS_LOST,
        NVML_ERROR_MEMORY,
        NVML_ERROR_NO_DATA,
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        NVML_ERROR_UNKNOWN,
    );
    // Issue 12: data, IPC, queries, monitors.
    size!(v, CUDA_MEMCPY2D);
    off!(v, CUDA_MEMCPY2D, srcMemoryType);
    off!(v, CUDA_MEMCPY2D, srcHost);
    off!(v, CUDA_MEMCPY2D, srcDevice);
    off!(v, CUDA_MEMCPY2D, srcArray);
    off!(v, CUDA_MEMCPY2D, srcPitch);
    off!(v, CUDA_MEMCPY2D, dstXInBytes);
    off!(v, CUDA_MEMCPY2D, dstMemoryType);
    off!(v, CUDA_MEMCPY2D, dstHost);
    off!(v, CUDA_MEMCPY2D, dstDevice);
    off!(v, CUDA_MEMCPY2D, dstPitch);
    off!(v, CUDA_MEMCPY2D, WidthInBytes);
    off!(v, CUDA_MEMCPY2D, Height);
    size!(v, CUDA_MEMCPY3D);
    off!(v, CUDA_MEMCPY3D, srcLOD);
    off!(v, CUDA_MEMCPY3D, srcMemoryType);
    off!(v, CUDA_MEMCPY3D, srcHost);
    off!(v, CUDA_MEMCPY3D, srcDevice);
    off!(v, CUDA_MEMCPY3D, srcArray);
    off!(v, CUDA_MEMCPY3D, reserved0);
    off!(v, CUDA_MEMCPY3D, srcPitch);
    off!(v, CUDA_MEMCPY3D, srcHeight);
    off!(v, CUDA_MEMCPY3D, dstXInBytes);
    off!(v, CUDA_MEMCPY3D, dstMemoryType);
    off!(v, CUDA_MEMCPY3D, dstHost);
    off!(v, CUDA_MEMCPY3D, dstDevice);
    off!(v, CUDA_MEMCPY3D, dstPitch);
    off!(v, CUDA_MEMCPY3D, dstHeight);
    off!(v, CUDA_MEMCPY3D, WidthInBytes);
    off!(v, CUDA_MEMCPY3D, Height);
    off!(v, CUDA_MEMCPY3D, Depth);
    size!(v, CUipcMemHandle);
    size!(v, CUipcEventHandle);
    size!(v, CUDA_MEM_ALLOC_NODE_PARAMS);
    off!(v, CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs);
    off!(v, CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount);
    off!(v, CUDA_MEM_ALLOC_NODE_PARAMS, bytesize);
    off!(v, CUDA_MEM_ALLOC_NODE_PARAMS, dptr);
    size!(v, CUDA_GRAPH_INSTANTIATE_PARAMS);
    off!(v, CUDA_GRAPH_INSTANTIATE_PARAMS, hUploadStream);
    off!(v, CUDA_GRAPH_INSTANTIATE_PARAMS, hErrNode_out);
    off!(v, CUDA_GRAPH_INSTANTIATE_PARAMS, result_out);
    size!(v, CUgraphEdgeData);
    size!(v, CUlinkState);
    konst!(
        v,
        CU_MEMORYTYPE_HOST,
        CU_MEMORYTYPE_DEVICE,
        CU_MEMORYTYPE_ARRAY,
        CU_MEMORYTYPE_UNIFIED,
        CU_IPC_HANDLE_SIZE,
        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
        CU_EVENT_DISABLE_TIMING,
        CU_EVENT_INTERPROCESS,
        CU_POINTER_ATTRIBUTE_CONTEXT,
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        CU_POINTER_ATTRIBUTE_HOST_POINTER,
        CU_POINTER_ATTRIBUTE_P2P_TOKENS,
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_MAPPED,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
        CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
        CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
        CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE,
        CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE,
        CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        CU_GRAPH_NODE_TYPE_KERNEL,
        CU_GRAPH_NODE_TYPE_GRAPH,
        CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        CU_GRAPH_NODE_TYPE_MEM_FREE,
        CU_GRAPH_NODE_TYPE_CONDITIONAL,
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
        CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH,
        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY,
        CUDA_GRAPH_INSTANTIATE_SUCCESS,
        CU_LIMIT_STACK_SIZE,
        CU_LIMIT_PRINTF_FIFO_SIZE,
        CU_LIMIT_MALLOC_HEAP_SIZE,
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
        CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
        CU_LIMIT_SHMEM_SIZE,
        CU_LIMIT_CIG_ENABLED,
        CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED,
        CU_FUNC_CACHE_PREFER_NONE,
        CU_FUNC_CACHE_PREFER_EQUAL,
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_NUM_REGS,
        CU_FUNC_ATTRIBUTE_PTX_VERSION,
        CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        CU_FUNC_ATTRIBUTE_MAX,
        CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
        CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
        CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
        CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED,
        CU_JIT_INPUT_CUBIN,
        CU_JIT_INPUT_PTX,
        CU_JIT_INPUT_FATBINARY,
        CU_JIT_INPUT_OBJECT,
        CU_JIT_INPUT_LIBRARY,
        CU_JIT_NUM_INPUT_TYPES,
    );
    code!(
        v,
        CUresult,
        CUDA_ERROR_UNSUPPORTED_LIMIT,
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
    );
    size!(v, nvmlBAR1Memory_t);
    off!(v, nvmlBAR1Memory_t, bar1Free);
    off!(v, nvmlBAR1Memory_t, bar1Used);
    size!(v, nvmlConfComputeMemSizeInfo_t);
    off!(v, nvmlConfComputeMemSizeInfo_t, unprotectedMemSizeKib);
    size!(v, nvmlProcessDetail_v1_t);
    off!(v, nvmlProcessDetail_v1_t, usedGpuMemory);
    off!(v, nvmlProcessDetail_v1_t, gpuInstanceId);
    off!(v, nvmlProcessDetail_v1_t, computeInstanceId);
    off!(v, nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory);
    size!(v, nvmlProcessDetailList_v1_t);
    off!(v, nvmlProcessDetailList_v1_t, mode);
    off!(v, nvmlProcessDetailList_v1_t, numProcArrayEntries);
    off!(v, nvmlProcessDetailList_v1_t, procArray);
    size!(v, nvmlTemperature_v1_t);
    off!(v, nvmlTemperature_v1_t, sensorType);
    off!(v, nvmlTemperature_v1_t, temperature);
    size!(v, nvmlFieldValue_t);
    off!(v, nvmlFieldValue_t, scopeId);
    off!(v, nvmlFieldValue_t, timestamp);
    off!(v, nvmlFieldValue_t, latencyUsec);
    off!(v, nvmlFieldValue_t, valueType);
    off!(v, nvmlFieldValue_t, nvmlReturn);
    off!(v, nvmlFieldValue_t, value);
    konst!(
        v,
        NVML_CLOCK_GRAPHICS,
        NVML_CLOCK_SM,
        NVML_CLOCK_MEM,
        NVML_CLOCK_VIDEO,
        NVML_TEMPERATURE_GPU,
        NVML_FEATURE_DISABLED,
        NVML_FEATURE_ENABLED,
        NVML_COMPUTEMODE_DEFAULT,
        NVML_PSTATE_0,
        NVML_PSTATE_UNKNOWN,
        NVML_MEMORY_ERROR_TYPE_CORRECTED,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        NVML_VOLATILE_ECC,
        NVML_AGGREGATE_ECC,
        NVML_PCIE_UTIL_TX_BYTES,
        NVML_PCIE_UTIL_RX_BYTES,
        NVML_DEVICE_SERIAL_BUFFER_SIZE,
        NVML_VALUE_TYPE_UNSIGNED_INT,
        NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        NVML_FI_DEV_NVLINK_LINK_COUNT,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
        NVML_FI_MAX,
        nvmlProcessDetailList_v1,
        nvmlTemperature_v1,
    );
    v
}

#[test]
fn vgpu_cuda_abi_matches_nvidia_headers() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
    let exe = vgpu_conformance::build_with("layout", &dir, false)
        .unwrap_or_else(|e| panic!("{}", vgpu_conformance::error_chain(&e)));
    let out = std::process::Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let c: BTreeMap<String, i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("size ") || l.starts_with("offset ") || l.starts_with("const "))
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let rust = rust_side();
    let r: BTreeMap<String, i64> = rust.iter().cloned().collect();
    assert_eq!(r.len(), rust.len(), "duplicate entries on the Rust side");
    let mut problems = Vec::new();
    for (k, want) in &c {
        match r.get(k) {
            None => problems.push(format!("{k}: in layout.c only")),
            // (Unsigned all-ones constants compare as -1 on both sides.)
            Some(got) if got != want => problems.push(format!("{k}: header {want}, Rust {got}")),
            Some(_) => {}
        }
    }
    for k in r.keys().filter(|k| !c.contains_key(*k)) {
        problems.push(format!("{k}: in layout.rs only"));
    }
    assert!(
        problems.is_empty(),
        "layout mismatches:\n{}",
        problems.join("\n")
    );
    assert!(c.len() > 150, "layout.c printed only {} entries", c.len());
}
