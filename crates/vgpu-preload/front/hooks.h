/* Generated from the hook table (crates/vgpu-preload/src/ffi); do not edit.
 * `cargo test -p vgpu-preload` fails when this file is stale; regenerate
 * with `VGPU_BLESS=1 cargo test -p vgpu-preload front_header`. */
#ifndef VGPU_FRONT_HOOKS_H
#define VGPU_FRONT_HOOKS_H

#define HOOK_COUNT 101

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
    X(57, cuGraphInstantiate, c) \
    X(58, cuGraphInstantiate_v2, c) \
    X(59, cuGraphInstantiateWithFlags, c) \
    X(60, cuGraphInstantiateWithParams, c) \
    X(61, cuGraphInstantiateWithParams_ptsz, c) \
    X(62, cuGraphUpload, c) \
    X(63, cuGraphUpload_ptsz, c) \
    X(64, cuGraphExecDestroy, c) \
    X(65, cuDeviceGraphMemTrim, c) \
    X(66, cuStreamBeginCapture, c) \
    X(67, cuStreamBeginCapture_ptsz, c) \
    X(68, cuStreamBeginCapture_v2, c) \
    X(69, cuStreamBeginCapture_v2_ptsz, c) \
    X(70, cuStreamBeginCaptureToGraph, c) \
    X(71, cuStreamBeginCaptureToGraph_ptsz, c) \
    X(72, cuStreamEndCapture, c) \
    X(73, cuStreamEndCapture_ptsz, c) \
    X(74, cuStreamQuery, c) \
    X(75, cuStreamQuery_ptsz, c) \
    X(76, cuEventQuery, c) \
    X(77, cuMemcpyHtoD_v2, c) \
    X(78, cuMemcpyHtoD_v2_ptds, c) \
    X(79, cuMemcpyDtoH_v2, c) \
    X(80, cuMemcpyDtoH_v2_ptds, c) \
    X(81, cuMemcpyDtoD_v2, c) \
    X(82, cuMemcpyDtoD_v2_ptds, c) \
    X(83, nvmlDeviceGetCount_v2, n) \
    X(84, nvmlDeviceGetCount, n) \
    X(85, nvmlDeviceGetHandleByIndex_v2, n) \
    X(86, nvmlDeviceGetHandleByIndex, n) \
    X(87, nvmlDeviceGetIndex, n) \
    X(88, nvmlDeviceGetMemoryInfo, n) \
    X(89, nvmlDeviceGetMemoryInfo_v2, n) \
    X(90, nvmlDeviceGetComputeRunningProcesses_v3, n) \
    X(91, nvmlDeviceGetComputeRunningProcesses_v2, n) \
    X(92, nvmlDeviceGetComputeRunningProcesses, n) \
    X(93, nvmlDeviceGetGraphicsRunningProcesses_v3, n) \
    X(94, nvmlDeviceGetGraphicsRunningProcesses_v2, n) \
    X(95, nvmlDeviceGetGraphicsRunningProcesses, n) \
    X(96, nvmlDeviceGetMPSComputeRunningProcesses_v3, n) \
    X(97, nvmlDeviceGetMPSComputeRunningProcesses_v2, n) \
    X(98, nvmlDeviceGetMPSComputeRunningProcesses, n) \
    X(99, nvmlDeviceGetProcessUtilization, n) \
    X(100, nvmlDeviceGetUtilizationRates, n) \

#define HOOK_NAME(i, name, lib) #name "\0"
#define HOOK_LIB(i, name, lib) #lib

#endif
