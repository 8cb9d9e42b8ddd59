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
