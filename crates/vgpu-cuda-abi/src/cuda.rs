//! `cuda.h` types and constants.
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;

/// `CUresult`: a driver return code. Unknown values are carried, not rejected.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct CUresult(pub c_uint);

macro_rules! codes {
    ($ty:ident { $($name:ident = $val:expr,)* }) => {
        impl $ty {
            $(pub const $name: $ty = $ty($val);)*
            /// The symbolic name of a known code (as the header spells it).
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(x if x == $val => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

codes!(CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_UNMAP_FAILED = 206,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_UNKNOWN = 999,
});

impl CUresult {
    pub fn is_success(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type cuuint64_t = u64;

/// Opaque driver handles: pointers the driver hands out and the caller never
/// dereferences.
macro_rules! handles {
    ($($name:ident),*) => {
        $(
            #[repr(transparent)]
            #[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
            pub struct $name(pub *mut c_void);
            impl $name {
                pub const NULL: $name = $name(std::ptr::null_mut());
                pub fn is_null(self) -> bool { self.0.is_null() }
            }
            // SAFETY: handles are opaque tokens; the driver synchronizes any
            // state behind them, exactly as CUDA documents for its handles.
            unsafe impl Send for $name {}
            // SAFETY: as above.
            unsafe impl Sync for $name {}
        )*
    };
}
handles!(
    CUcontext,
    CUmodule,
    CUfunction,
    CUkernel,
    CUlibrary,
    CUstream,
    CUevent,
    CUarray,
    CUmipmappedArray,
    CUmemoryPool,
    CUgraph,
    CUgraphNode,
    CUgraphExec,
    CUgreenCtx
);

/// `CUmemGenericAllocationHandle` is an `unsigned long long`, not a pointer.
pub type CUmemGenericAllocationHandle = u64;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

pub type CUdevice_attribute = c_int;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 1;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: c_int = 5;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: c_int = 10;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: c_int = 83;
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: c_int = 89;
pub const CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: c_int = 95;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;

/// `CUarray_format` values (`cuda.h`).
pub type CUarray_format = c_uint;
pub const CU_AD_FORMAT_UNSIGNED_INT8: c_uint = 0x01;
pub const CU_AD_FORMAT_UNSIGNED_INT16: c_uint = 0x02;
pub const CU_AD_FORMAT_UNSIGNED_INT32: c_uint = 0x03;
pub const CU_AD_FORMAT_SIGNED_INT8: c_uint = 0x08;
pub const CU_AD_FORMAT_SIGNED_INT16: c_uint = 0x09;
pub const CU_AD_FORMAT_SIGNED_INT32: c_uint = 0x0a;
pub const CU_AD_FORMAT_HALF: c_uint = 0x10;
pub const CU_AD_FORMAT_FLOAT: c_uint = 0x20;

/// Bytes per channel element of an array format; `None` for formats vgpu
/// does not size (planar video and block-compressed formats).
pub fn array_format_bytes(format: CUarray_format) -> Option<u64> {
    match format {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => Some(1),
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => Some(2),
        CU_AD_FORMAT_UNSIGNED_INT32 | CU_AD_FORMAT_SIGNED_INT32 | CU_AD_FORMAT_FLOAT => Some(4),
        _ => None,
    }
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// The v1 (CUDA 2.x, 32-bit) ABI's device pointer (`cuda.h` under
/// `__CUDA_API_VERSION_INTERNAL`).
pub type CUdeviceptr_v1 = c_uint;

/// `CUDA_ARRAY_DESCRIPTOR_v1`: 32-bit extents.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`: 32-bit extents.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Depth: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

impl From<CUDA_ARRAY_DESCRIPTOR_v1> for CUDA_ARRAY_DESCRIPTOR {
    fn from(d: CUDA_ARRAY_DESCRIPTOR_v1) -> Self {
        CUDA_ARRAY_DESCRIPTOR {
            Width: d.Width as usize,
            Height: d.Height as usize,
            Format: d.Format,
            NumChannels: d.NumChannels,
        }
    }
}

impl From<CUDA_ARRAY3D_DESCRIPTOR_v1> for CUDA_ARRAY3D_DESCRIPTOR {
    fn from(d: CUDA_ARRAY3D_DESCRIPTOR_v1) -> Self {
        CUDA_ARRAY3D_DESCRIPTOR {
            Width: d.Width as usize,
            Height: d.Height as usize,
            Depth: d.Depth as usize,
            Format: d.Format,
            NumChannels: d.NumChannels,
            Flags: d.Flags,
        }
    }
}

pub type CUmemLocationType = c_uint;
pub const CU_MEM_LOCATION_TYPE_INVALID: c_uint = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_uint = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_uint = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_uint = 4;

pub type CUmemAllocationType = c_uint;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;

pub type CUmemAllocationGranularity_flags = c_uint;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 1;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: c_int,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUmemAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUmemAllocationProp {
    pub type_: CUmemAllocationType,
    pub requestedHandleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocFlags,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUmemPoolProps {
    pub allocType: CUmemAllocationType,
    pub handleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

impl Default for CUmemPoolProps {
    fn default() -> Self {
        CUmemPoolProps {
            allocType: 0,
            handleTypes: 0,
            location: CUmemLocation::default(),
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }
}

pub type CUmemPool_attribute = c_uint;
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_uint = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: c_uint = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_uint = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_uint = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_uint = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_uint = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_uint = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_uint = 8;

pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x04;
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
pub const CU_MEM_ATTACH_HOST: c_uint = 0x2;

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// `CUdriverProcAddressQueryResult`.
pub type CUdriverProcAddressQueryResult = c_int;
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUlaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    /// `CUlaunchAttributeValue` is a 64-byte union.
    pub value: [u8; 64],
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS` (`cuLaunchCooperativeKernelMultiDevice`, one per device).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}

/// `CUstreamCaptureStatus` (an enum in C, int-sized).
pub type CUstreamCaptureStatus = c_uint;
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_uint = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_uint = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: c_uint = 2;
/// `CUstreamCaptureMode` (an enum in C, int-sized).
pub type CUstreamCaptureMode = c_uint;
/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`).
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// `CUDA_KERNEL_NODE_PARAMS_v1` (the ABI of `cuGraphAddKernelNode`, unsuffixed).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS_v1 {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (`cuGraphAddKernelNode_v2`; what the header's
/// `CUDA_KERNEL_NODE_PARAMS` names since 12.0).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUexecAffinityParam {
    pub type_: c_uint,
    pub param: c_uint,
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUctxCreateParams {
    pub execAffinityParams: *mut CUexecAffinityParam,
    pub numExecAffinityParams: c_int,
    pub cigParams: *mut c_void,
}

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn sizes_match_cuda_h_x86_64() {
        assert_eq!(size_of::<CUresult>(), 4);
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, win32HandleMetaData), 16);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
        assert_eq!(size_of::<CUlaunchAttribute>(), 72);
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(offset_of!(CUlaunchConfig, hStream), 32);
        assert_eq!(size_of::<CUDA_LAUNCH_PARAMS>(), 56);
        assert_eq!(offset_of!(CUDA_LAUNCH_PARAMS, hStream), 40);
        assert_eq!(size_of::<CUDA_KERNEL_NODE_PARAMS_v1>(), 56);
        assert_eq!(size_of::<CUDA_KERNEL_NODE_PARAMS_v2>(), 72);
        assert_eq!(size_of::<CUctxCreateParams>(), 24);
    }

    #[test]
    fn unknown_codes_are_carried() {
        let r = CUresult(12345);
        assert_eq!(r.name(), None);
        assert_eq!(format!("{r:?}"), "CUresult(12345)");
        assert_eq!(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY.name(),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
    }
}
