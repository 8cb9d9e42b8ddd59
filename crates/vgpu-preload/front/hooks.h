/* Generated from the hook table (crates/vgpu-preload/src/ffi); do not edit.
 * `cargo test -p vgpu-preload` fails when this file is stale; regenerate
 * with `VGPU_BLESS=1 cargo test -p vgpu-preload front_header`. */
#ifndef VGPU_FRONT_HOOKS_H
#define VGPU_FRONT_HOOKS_H

#define HOOK_COUNT 72

#define HOOKS(X) \
    X(0, cuGetProcAddress, c) \
    X(1, cuGetProcAddress_v2, c) \
    X(2, cuInit, c) \
    X(3, cuMemAlloc_v2, c) \
    X(4, cuMemAllocPitch_v2, c) \
    X(5, cuMemAllocManaged, c) \
    X(6, cuMemFree_v2, c) \
    X(7, cuMemAllocAsync, c) \
    X(8, cuMemAllocAsync_ptsz, c) \
    X(9, cuMemAllocFromPoolAsync, c) \
    X(10, cuMemAllocFromPoolAsync_ptsz, c) \
    X(11, cuMemFreeAsync, c) \
    X(12, cuMemFreeAsync_ptsz, c) \
    X(13, cuMemPoolCreate, c) \
    X(14, cuMemPoolDestroy, c) \
    X(15, cuMemPoolTrimTo, c) \
    X(16, cuStreamSynchronize, c) \
    X(17, cuStreamSynchronize_ptsz, c) \
    X(18, cuCtxSynchronize, c) \
    X(19, cuEventSynchronize, c) \
    X(20, cuMemCreate, c) \
    X(21, cuMemRelease, c) \
    X(22, cuMemMap, c) \
    X(23, cuMemUnmap, c) \
    X(24, cuArrayCreate_v2, c) \
    X(25, cuArray3DCreate_v2, c) \
    X(26, cuArrayDestroy, c) \
    X(27, cuMipmappedArrayCreate, c) \
    X(28, cuMipmappedArrayDestroy, c) \
    X(29, cuCtxCreate_v2, c) \
    X(30, cuCtxCreate_v3, c) \
    X(31, cuCtxCreate_v4, c) \
    X(32, cuCtxDestroy_v2, c) \
    X(33, cuDevicePrimaryCtxRetain, c) \
    X(34, cuDevicePrimaryCtxRelease, c) \
    X(35, cuDevicePrimaryCtxRelease_v2, c) \
    X(36, cuDevicePrimaryCtxReset, c) \
    X(37, cuDevicePrimaryCtxReset_v2, c) \
    X(38, cuMemGetInfo_v2, c) \
    X(39, cuDeviceTotalMem_v2, c) \
    X(40, cuMemAlloc, c) \
    X(41, cuMemAllocPitch, c) \
    X(42, cuMemFree, c) \
    X(43, cuArrayCreate, c) \
    X(44, cuArray3DCreate, c) \
    X(45, cuCtxCreate, c) \
    X(46, cuMemGetInfo, c) \
    X(47, cuDeviceTotalMem, c) \
    X(48, cuLaunchKernel, c) \
    X(49, cuLaunchKernel_ptsz, c) \
    X(50, cuLaunchKernelEx, c) \
    X(51, cuLaunchKernelEx_ptsz, c) \
    X(52, cuLaunchCooperativeKernel, c) \
    X(53, cuLaunchCooperativeKernel_ptsz, c) \
    X(54, nvmlDeviceGetCount_v2, n) \
    X(55, nvmlDeviceGetCount, n) \
    X(56, nvmlDeviceGetHandleByIndex_v2, n) \
    X(57, nvmlDeviceGetHandleByIndex, n) \
    X(58, nvmlDeviceGetIndex, n) \
    X(59, nvmlDeviceGetMemoryInfo, n) \
    X(60, nvmlDeviceGetMemoryInfo_v2, n) \
    X(61, nvmlDeviceGetComputeRunningProcesses_v3, n) \
    X(62, nvmlDeviceGetComputeRunningProcesses_v2, n) \
    X(63, nvmlDeviceGetComputeRunningProcesses, n) \
    X(64, nvmlDeviceGetGraphicsRunningProcesses_v3, n) \
    X(65, nvmlDeviceGetGraphicsRunningProcesses_v2, n) \
    X(66, nvmlDeviceGetGraphicsRunningProcesses, n) \
    X(67, nvmlDeviceGetMPSComputeRunningProcesses_v3, n) \
    X(68, nvmlDeviceGetMPSComputeRunningProcesses_v2, n) \
    X(69, nvmlDeviceGetMPSComputeRunningProcesses, n) \
    X(70, nvmlDeviceGetProcessUtilization, n) \
    X(71, nvmlDeviceGetUtilizationRates, n) \

#define HOOK_NAME(i, name, lib) #name "\0"
#define HOOK_LIB(i, name, lib) #lib

#endif
