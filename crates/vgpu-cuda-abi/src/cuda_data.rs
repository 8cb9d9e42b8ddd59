//! `cuda.h` types of data movement, IPC, pointer attributes, graph memory
//! nodes, linking and the queries bindings make (limits, function
//! attributes, P2P). Layouts pinned by `vgpu-conformance`'s layout test.
use std::ffi::{c_uint, c_void};

use crate::cuda::{CUarray, CUdeviceptr, CUgraphNode, CUmemAccessDesc, CUmemPoolProps, CUstream};

pub type CUmemorytype = c_uint;
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

/// `CUDA_MEMCPY2D_v2` (what `cuMemcpy2D_v2` takes).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: CUmemorytype,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: CUmemorytype,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// `CUDA_MEMCPY3D_v2` (what `cuMemcpy3D_v2` takes).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_MEMCPY3D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcZ: usize,
    pub srcLOD: usize,
    pub srcMemoryType: CUmemorytype,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub reserved0: *mut c_void,
    pub srcPitch: usize,
    pub srcHeight: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstZ: usize,
    pub dstLOD: usize,
    pub dstMemoryType: CUmemorytype,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub reserved1: *mut c_void,
    pub dstPitch: usize,
    pub dstHeight: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
    pub Depth: usize,
}

pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// `CUipcMemHandle` (passed by value).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUipcMemHandle {
    pub reserved: [u8; CU_IPC_HANDLE_SIZE],
}

/// `CUipcEventHandle` (passed by value).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUipcEventHandle {
    pub reserved: [u8; CU_IPC_HANDLE_SIZE],
}

pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub const CU_EVENT_INTERPROCESS: c_uint = 4;

pub type CUpointer_attribute = c_uint;
pub const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: c_uint = 3;
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: c_uint = 4;
pub const CU_POINTER_ATTRIBUTE_P2P_TOKENS: c_uint = 5;
pub const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: c_uint = 6;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: c_uint = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_uint = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;
pub const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_uint = 10;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_uint = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_uint = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: c_uint = 13;
pub const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: c_uint = 14;
pub const CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: c_uint = 15;
pub const CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: c_uint = 16;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: c_uint = 17;
pub const CU_POINTER_ATTRIBUTE_MAPPING_SIZE: c_uint = 18;
pub const CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: c_uint = 19;
pub const CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: c_uint = 20;
pub const CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: c_uint = 21;
pub const CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE: c_uint = 3;

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1` (`cuGraphAddMemAllocNode`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

impl Default for CUDA_MEM_ALLOC_NODE_PARAMS {
    fn default() -> Self {
        CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: CUmemPoolProps::default(),
            accessDescs: std::ptr::null(),
            accessDescCount: 0,
            bytesize: 0,
            dptr: 0,
        }
    }
}

pub type CUgraphMem_attribute = c_uint;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_uint = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: c_uint = 1;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_uint = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: c_uint = 3;

/// `CUgraphNodeType` (an enum in C, int-sized): the kinds vgpu looks for.
pub type CUgraphNodeType = c_uint;
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_uint = 0;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_uint = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_uint = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_uint = 11;
pub const CU_GRAPH_NODE_TYPE_CONDITIONAL: c_uint = 13;

/// `CUgraphInstantiate_flags`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: u64 = 8;
/// `CUgraphInstantiateResult`: `CUDA_GRAPH_INSTANTIATE_SUCCESS`.
pub const CUDA_GRAPH_INSTANTIATE_SUCCESS: c_uint = 0;

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (`cuGraphInstantiateWithParams`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub hUploadStream: CUstream,
    pub hErrNode_out: CUgraphNode,
    pub result_out: c_uint,
}

/// `CUgraphEdgeData` (`cuStreamBeginCaptureToGraph`'s dependency data).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUgraphEdgeData {
    pub from_port: u8,
    pub to_port: u8,
    pub type_: u8,
    pub reserved: [u8; 5],
}

pub type CUlimit = c_uint;
pub const CU_LIMIT_STACK_SIZE: c_uint = 0;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: c_uint = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_uint = 2;
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: c_uint = 3;
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_uint = 4;
pub const CU_LIMIT_MAX_L2_FETCH_GRANULARITY: c_uint = 5;
pub const CU_LIMIT_PERSISTING_L2_CACHE_SIZE: c_uint = 6;
pub const CU_LIMIT_SHMEM_SIZE: c_uint = 7;
pub const CU_LIMIT_CIG_ENABLED: c_uint = 8;
pub const CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: c_uint = 9;

pub type CUfunc_cache = c_uint;
pub const CU_FUNC_CACHE_PREFER_NONE: c_uint = 0;
pub const CU_FUNC_CACHE_PREFER_EQUAL: c_uint = 3;

pub type CUfunction_attribute = c_uint;
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_uint = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_uint = 1;
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: c_uint = 2;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_uint = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_uint = 4;
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: c_uint = 5;
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: c_uint = 6;
pub const CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: c_uint = 7;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_uint = 8;
pub const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: c_uint = 9;
pub const CU_FUNC_ATTRIBUTE_MAX: c_uint = 16;

pub type CUdevice_P2PAttribute = c_uint;
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_uint = 1;
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_uint = 2;
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_uint = 3;
pub const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_uint = 4;

pub type CUjitInputType = c_uint;
/// `CUjit_option` (JIT options of `cuModuleLoadDataEx`, `cuLibraryLoad*`).
pub type CUjit_option = c_uint;
/// `CUlibraryOption` (`cuLibraryLoad*`).
pub type CUlibraryOption = c_uint;
pub const CU_LIBRARY_BINARY_IS_PRESERVED: CUlibraryOption = 1;
pub const CU_LIBRARY_NUM_OPTIONS: CUlibraryOption = 2;
pub const CU_JIT_INPUT_CUBIN: c_uint = 0;
pub const CU_JIT_INPUT_PTX: c_uint = 1;
pub const CU_JIT_INPUT_FATBINARY: c_uint = 2;
pub const CU_JIT_INPUT_OBJECT: c_uint = 3;
pub const CU_JIT_INPUT_LIBRARY: c_uint = 4;
pub const CU_JIT_NUM_INPUT_TYPES: c_uint = 6;

/// Opaque `CUlinkState`.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct CUlinkState(pub *mut c_void);
