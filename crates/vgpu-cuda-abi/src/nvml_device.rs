//! `nvml.h` types and constants of the device queries monitoring tools
//! make (clocks, power, thermals, ECC, MIG, BAR1, process detail lists,
//! field values). Layouts pinned by `vgpu-conformance`'s layout test.
use std::ffi::c_uint;

pub type nvmlClockType_t = c_uint;
pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;

pub type nvmlTemperatureSensors_t = c_uint;
pub const NVML_TEMPERATURE_GPU: c_uint = 0;

pub type nvmlEnableState_t = c_uint;
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;

pub type nvmlComputeMode_t = c_uint;
pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;

pub type nvmlPstates_t = c_uint;
pub const NVML_PSTATE_0: c_uint = 0;
pub const NVML_PSTATE_UNKNOWN: c_uint = 32;

pub type nvmlMemoryErrorType_t = c_uint;
pub const NVML_MEMORY_ERROR_TYPE_CORRECTED: c_uint = 0;
pub const NVML_MEMORY_ERROR_TYPE_UNCORRECTED: c_uint = 1;
pub type nvmlEccCounterType_t = c_uint;
pub const NVML_VOLATILE_ECC: c_uint = 0;
pub const NVML_AGGREGATE_ECC: c_uint = 1;

pub type nvmlPcieUtilCounter_t = c_uint;
pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;

/// `nvmlProcessDetailList_t::mode` values (nvml.h names them in prose only;
/// these are pynvml's names).
pub const NVML_PROCESS_MODE_COMPUTE: c_uint = 0;
pub const NVML_PROCESS_MODE_GRAPHICS: c_uint = 1;
pub const NVML_PROCESS_MODE_MPS: c_uint = 2;

pub const NVML_DEVICE_SERIAL_BUFFER_SIZE: usize = 30;

pub type nvmlValueType_t = c_uint;
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
pub const NVML_FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: c_uint = 140;
pub const NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: c_uint = 141;
pub const NVML_FI_MAX: c_uint = 274;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: u64,
    pub bar1Free: u64,
    pub bar1Used: u64,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlConfComputeMemSizeInfo_t {
    pub protectedMemSizeKib: u64,
    pub unprotectedMemSizeKib: u64,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlProcessDetail_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
    pub usedGpuCcProtectedMemory: u64,
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct nvmlProcessDetailList_v1_t {
    pub version: c_uint,
    pub mode: c_uint,
    pub numProcArrayEntries: c_uint,
    pub procArray: *mut nvmlProcessDetail_v1_t,
}

pub type nvmlProcessDetailList_t = nvmlProcessDetailList_v1_t;

/// `NVML_STRUCT_VERSION(ProcessDetailList, 1)`.
pub const nvmlProcessDetailList_v1: c_uint =
    (std::mem::size_of::<nvmlProcessDetailList_v1_t>() as c_uint) | (1 << 24);

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlTemperature_v1_t {
    pub version: c_uint,
    pub sensorType: nvmlTemperatureSensors_t,
    pub temperature: i32,
}

pub type nvmlTemperature_t = nvmlTemperature_v1_t;

/// `NVML_STRUCT_VERSION(Temperature, 1)`.
pub const nvmlTemperature_v1: c_uint =
    (std::mem::size_of::<nvmlTemperature_v1_t>() as c_uint) | (1 << 24);

/// `nvmlFieldValue_t`; `value` is the 8-byte `nvmlValue_t` union.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: nvmlValueType_t,
    pub nvmlReturn: c_uint,
    pub value: u64,
}
