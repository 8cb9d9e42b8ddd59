/* Generated from the hook table (crates/vgpu-preload/src/ffi); do not edit.
 * `cargo test -p vgpu-preload` fails when this file is stale; regenerate
 * with `VGPU_BLESS=1 cargo test -p vgpu-preload front_header`. */
#ifndef VGPU_FRONT_HOOKS_H
#define VGPU_FRONT_HOOKS_H

#define HOOK_COUNT 51

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
    X(22, cuArrayCreate_v2, c) \
    X(23, cuArray3DCreate_v2, c) \
    X(24, cuArrayDestroy, c) \
    X(25, cuMipmappedArrayCreate, c) \
    X(26, cuMipmappedArrayDestroy, c) \
    X(27, cuCtxCreate_v2, c) \
    X(28, cuCtxCreate_v3, c) \
    X(29, cuCtxCreate_v4, c) \
    X(30, cuCtxDestroy_v2, c) \
    X(31, cuDevicePrimaryCtxRetain, c) \
    X(32, cuDevicePrimaryCtxRelease, c) \
    X(33, cuDevicePrimaryCtxRelease_v2, c) \
    X(34, cuDevicePrimaryCtxReset, c) \
    X(35, cuDevicePrimaryCtxReset_v2, c) \
    X(36, cuMemGetInfo_v2, c) \
    X(37, cuDeviceTotalMem_v2, c) \
    X(38, cuLaunchKernel, c) \
    X(39, cuLaunchKernel_ptsz, c) \
    X(40, cuLaunchKernelEx, c) \
    X(41, cuLaunchKernelEx_ptsz, c) \
    X(42, cuLaunchCooperativeKernel, c) \
    X(43, cuLaunchCooperativeKernel_ptsz, c) \
    X(44, nvmlDeviceGetCount_v2, n) \
    X(45, nvmlDeviceGetCount, n) \
    X(46, nvmlDeviceGetHandleByIndex_v2, n) \
    X(47, nvmlDeviceGetHandleByIndex, n) \
    X(48, nvmlDeviceGetIndex, n) \
    X(49, nvmlDeviceGetMemoryInfo, n) \
    X(50, nvmlDeviceGetMemoryInfo_v2, n) \

#define HOOK_NAME(i, name, lib) #name "\0"
#define HOOK_LIB(i, name, lib) #lib

#endif
