/* Generated from the hook table (crates/vgpu-preload/src/ffi); do not edit.
 * `cargo test -p vgpu-preload` fails when this file is stale; regenerate
 * with `VGPU_BLESS=1 cargo test -p vgpu-preload front_header`. */
#ifndef VGPU_FRONT_HOOKS_H
#define VGPU_FRONT_HOOKS_H

#define HOOK_COUNT 90

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
    X(54, cuLaunchCooperativeKernelMultiDevice, c) \
    X(55, cuGraphLaunch, c) \
    X(56, cuGraphLaunch_ptsz, c) \
    X(57, cuStreamBeginCapture, c) \
    X(58, cuStreamBeginCapture_ptsz, c) \
    X(59, cuStreamBeginCapture_v2, c) \
    X(60, cuStreamBeginCapture_v2_ptsz, c) \
    X(61, cuStreamEndCapture, c) \
    X(62, cuStreamEndCapture_ptsz, c) \
    X(63, cuStreamQuery, c) \
    X(64, cuStreamQuery_ptsz, c) \
    X(65, cuEventQuery, c) \
    X(66, cuMemcpyHtoD_v2, c) \
    X(67, cuMemcpyHtoD_v2_ptds, c) \
    X(68, cuMemcpyDtoH_v2, c) \
    X(69, cuMemcpyDtoH_v2_ptds, c) \
    X(70, cuMemcpyDtoD_v2, c) \
    X(71, cuMemcpyDtoD_v2_ptds, c) \
    X(72, nvmlDeviceGetCount_v2, n) \
    X(73, nvmlDeviceGetCount, n) \
    X(74, nvmlDeviceGetHandleByIndex_v2, n) \
    X(75, nvmlDeviceGetHandleByIndex, n) \
    X(76, nvmlDeviceGetIndex, n) \
    X(77, nvmlDeviceGetMemoryInfo, n) \
    X(78, nvmlDeviceGetMemoryInfo_v2, n) \
    X(79, nvmlDeviceGetComputeRunningProcesses_v3, n) \
    X(80, nvmlDeviceGetComputeRunningProcesses_v2, n) \
    X(81, nvmlDeviceGetComputeRunningProcesses, n) \
    X(82, nvmlDeviceGetGraphicsRunningProcesses_v3, n) \
    X(83, nvmlDeviceGetGraphicsRunningProcesses_v2, n) \
    X(84, nvmlDeviceGetGraphicsRunningProcesses, n) \
    X(85, nvmlDeviceGetMPSComputeRunningProcesses_v3, n) \
    X(86, nvmlDeviceGetMPSComputeRunningProcesses_v2, n) \
    X(87, nvmlDeviceGetMPSComputeRunningProcesses, n) \
    X(88, nvmlDeviceGetProcessUtilization, n) \
    X(89, nvmlDeviceGetUtilizationRates, n) \

#define HOOK_NAME(i, name, lib) #name "\0"
#define HOOK_LIB(i, name, lib) #lib

#endif
