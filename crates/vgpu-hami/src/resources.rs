//! Extended resource names of HAMi's NVIDIA device (chart defaults;
//! `pkg/device/nvidia/device.go`, `charts/hami/values.yaml`). Constants only.

/// Number of vGPUs (the device plugin advertises `deviceSplitCount` IDs per card).
pub const GPU: &str = "nvidia.com/gpu";
/// MiB of device memory per vGPU.
pub const GPU_MEMORY: &str = "nvidia.com/gpumem";
/// Percent (0-100) of the card's memory per vGPU.
pub const GPU_MEMORY_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// Percent (0-100) of the card's SMs; 100 = exclusive.
pub const GPU_CORES: &str = "nvidia.com/gpucores";
/// Task priority (0 high, 1 low).
pub const PRIORITY: &str = "nvidia.com/priority";
