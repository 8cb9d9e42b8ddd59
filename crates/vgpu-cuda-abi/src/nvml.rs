//! `nvml.h` types and constants.
use std::ffi::{c_char, c_uint, c_void};
use std::fmt;

/// `nvmlReturn_t`: unknown values are carried, not rejected.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct nvmlReturn_t(pub c_uint);

impl nvmlReturn_t {
    pub const NVML_SUCCESS: Self = Self(0);
    pub const NVML_ERROR_UNINITIALIZED: Self = Self(1);
    pub const NVML_ERROR_INVALID_ARGUMENT: Self = Self(2);
    pub const NVML_ERROR_NOT_SUPPORTED: Self = Self(3);
    pub const NVML_ERROR_NO_PERMISSION: Self = Self(4);
    pub const NVML_ERROR_ALREADY_INITIALIZED: Self = Self(5);
    pub const NVML_ERROR_NOT_FOUND: Self = Self(6);
    pub const NVML_ERROR_INSUFFICIENT_SIZE: Self = Self(7);
    pub const NVML_ERROR_DRIVER_NOT_LOADED: Self = Self(9);
    pub const NVML_ERROR_TIMEOUT: Self = Self(10);
    pub const NVML_ERROR_LIBRARY_NOT_FOUND: Self = Self(12);
    pub const NVML_ERROR_FUNCTION_NOT_FOUND: Self = Self(13);
    pub const NVML_ERROR_GPU_IS_LOST: Self = Self(15);
    pub const NVML_ERROR_MEMORY: Self = Self(20);
    pub const NVML_ERROR_NO_DATA: Self = Self(21);
    pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Self = Self(25);
    pub const NVML_ERROR_UNKNOWN: Self = Self(999);

    pub fn is_success(self) -> bool {
        self.0 == 0
    }

    /// The string `nvmlErrorString` gives for a code.
    pub fn message(self) -> &'static str {
        match self.0 {
            0 => "Success",
            1 => "Uninitialized",
            2 => "Invalid Argument",
            3 => "Not Supported",
            4 => "Insufficient Permissions",
            5 => "Already Initialized",
            6 => "Not Found",
            7 => "Insufficient Size",
            9 => "Driver Not Loaded",
            10 => "Timeout",
            12 => "NVML Shared Library Not Found",
            13 => "Function Not Found",
            15 => "GPU is lost",
            20 => "Insufficient Memory",
            21 => "No data",
            25 => "Argument version mismatch",
            _ => "Unknown Error",
        }
    }
}

impl fmt::Debug for nvmlReturn_t {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvmlReturn_t({}: {})", self.0, self.message())
    }
}

/// `nvmlDevice_t`: an opaque pointer.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct nvmlDevice_t(pub *mut c_void);
// SAFETY: an opaque token; NVML is thread-safe per its documentation.
unsafe impl Send for nvmlDevice_t {}
// SAFETY: as above.
unsafe impl Sync for nvmlDevice_t {}

pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: `sizeof | (2 << 24)`.
pub const nvmlMemory_v2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}

/// Also `nvmlProcessInfo_t` (what `_v3` of the process queries fills).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}
pub type nvmlProcessInfo_t = nvmlProcessInfo_v2_t;

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: u64,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

/// NVML's "no such value" marker in process memory fields.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_nvml_h_x86_64() {
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(nvmlMemory_v2, 40 | (2 << 24));
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_v2_t>(), 24);
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(size_of::<nvmlUtilization_t>(), 8);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
    }
}
