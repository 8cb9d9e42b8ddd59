//! CUDA driver API hooks. One declaration per hook; see [`crate::hooks!`].
#![allow(clippy::too_many_arguments)]
use std::ffi::{c_char, c_int, c_uint, c_void};

use vgpu_cuda_abi::*;

use crate::hooks::route_proc;
use crate::{policy, state, sys};

/// Writes our hook over a successful `cuGetProcAddress` answer when the
/// driver returned the function a hook wraps (see `hooks::route_proc`).
///
/// # Safety
/// `symbol` and `pfn` are the caller's arguments to a `cuGetProcAddress`
/// that just succeeded.
unsafe fn substitute(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
) {
    // SAFETY: per this function's contract.
    let (Some(name), Some(found)) = (unsafe { sys::cstr(symbol) }, unsafe { sys::get(pfn) }) else {
        return;
    };
    let routed = route_proc(name, found, version, flags);
    if routed != found {
        // SAFETY: the driver just wrote through `pfn`.
        unsafe { sys::put(pfn, routed) };
    }
}

/// Reads an out-pointer after a successful call.
fn out<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: only called after the driver succeeded writing through `p`
    // (or with null, which yields None).
    unsafe { sys::get(p) }
}

crate::hooks! {
TABLE;
    /// Resolution (CUDA 11.3 ABI): the driver resolves, then hooks replace
    /// exactly the driver functions they wrap.
    [Cuda, "cuGetProcAddress", 11030, false, "resolution", "route: driver answer, hook substituted when it is the wrapped function"]
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(symbol, pfn, cudaVersion, flags) };
        if r.is_success() {
            // SAFETY: the call succeeded with these arguments.
            unsafe { substitute(symbol, pfn, cudaVersion, flags) };
        }
        r
    }

    /// Resolution (CUDA 12 ABI with `symbolStatus`, filled by the driver).
    [Cuda, "cuGetProcAddress", 12000, false, "resolution", "route: driver answer and symbolStatus, hook substituted when it is the wrapped function"]
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
        if r.is_success() {
            // SAFETY: the call succeeded with these arguments.
            unsafe { substitute(symbol, pfn, cudaVersion, flags) };
        }
        r
    }

    /// Initialization in phases (see `state::cu_init`).
    [Cuda, "cuInit", 2000, false, "init", "map region, claim slot, real cuInit, post-init; phase stamps into the slot"]
    fn cuInit(Flags: c_uint) -> CUresult |real| {
        state::cu_init(real, Flags)
    }

    [Cuda, "cuMemAlloc", 3020, false, "memory", "reserve bytesize; release on failure or free"]
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::alloc(bytesize, || out(dptr), || unsafe { real(dptr, bytesize) })
    }

    [Cuda, "cuMemAllocPitch", 3020, false, "memory", "reserve width x height, settle to pitch x height as returned"]
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) -> CUresult |real| {
        policy::alloc_pitch(
            WidthInBytes,
            Height,
            || out(dptr).zip(out(pPitch)),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) },
            |p| {
                if let Some(f) = crate::hooks::real::<cuMemFree_v2::Fn>(&cuMemFree_v2::REAL, crate::hooks::Lib::Cuda) {
                    // SAFETY: frees the allocation the driver just made.
                    unsafe { f(p) };
                }
            },
        )
    }

    [Cuda, "cuMemAllocManaged", 6000, false, "memory", "reserve bytesize on the current device; release on failure or free"]
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::alloc(bytesize, || out(dptr), || unsafe { real(dptr, bytesize, flags) })
    }

    [Cuda, "cuMemFree", 3020, false, "memory", "release what was charged; unknown pointers pass through"]
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::free(dptr, || unsafe { real(dptr) })
    }

    [Cuda, "cuMemAllocAsync", 11020, false, "memory (stream-ordered)", "admit pool growth; charge follows the pool's RESERVED_MEM_CURRENT"]
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult |real| {
        policy::alloc_async(
            bytesize,
            None,
            || out(dptr),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(dptr, bytesize, hStream) },
            |p| free_async_raw(p, hStream),
        )
    }

    [Cuda, "cuMemAllocAsync", 11020, true, "memory (stream-ordered)", "as cuMemAllocAsync"]
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult |real| {
        policy::alloc_async(
            bytesize,
            None,
            || out(dptr),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(dptr, bytesize, hStream) },
            |p| free_async_raw(p, hStream),
        )
    }

    [Cuda, "cuMemAllocFromPoolAsync", 11020, false, "memory (stream-ordered)", "admit pool growth; charge follows this pool's RESERVED_MEM_CURRENT"]
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult |real| {
        policy::alloc_async(
            bytesize,
            Some(pool),
            || out(dptr),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(dptr, bytesize, pool, hStream) },
            |p| free_async_raw(p, hStream),
        )
    }

    [Cuda, "cuMemAllocFromPoolAsync", 11020, true, "memory (stream-ordered)", "as cuMemAllocFromPoolAsync"]
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult |real| {
        policy::alloc_async(
            bytesize,
            Some(pool),
            || out(dptr),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(dptr, bytesize, pool, hStream) },
            |p| free_async_raw(p, hStream),
        )
    }

    [Cuda, "cuMemFreeAsync", 11020, false, "memory (stream-ordered)", "settle the pool's charge to its reserved memory"]
    fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::free_async(dptr, || unsafe { real(dptr, hStream) })
    }

    [Cuda, "cuMemFreeAsync", 11020, true, "memory (stream-ordered)", "as cuMemFreeAsync"]
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::free_async(dptr, || unsafe { real(dptr, hStream) })
    }

    [Cuda, "cuMemPoolCreate", 11020, false, "memory (stream-ordered)", "remember the pool's device"]
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(pool, poolProps) };
        if r.is_success() {
            let dev = out(poolProps)
                .filter(|pp| pp.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE && pp.location.id >= 0)
                .map(|pp| pp.location.id as u32);
            if let Some(pl) = out(pool) {
                policy::pool_created(pl, dev);
            }
        }
        r
    }

    [Cuda, "cuMemPoolDestroy", 11020, false, "memory (stream-ordered)", "release the pool's charge; allocations still out keep theirs until freed"]
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::pool_destroy(pool, || unsafe { real(pool) })
    }

    [Cuda, "cuMemPoolTrimTo", 11020, false, "memory (stream-ordered)", "settle the pool's charge after trimming"]
    fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(pool, minBytesToKeep) };
        if r.is_success() {
            policy::pool_trimmed(pool);
        }
        r
    }

    [Cuda, "cuStreamSynchronize", 2000, false, "memory (stream-ordered)", "after it: settle pool charges (pools release memory at synchronize)"]
    fn cuStreamSynchronize(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream) };
        policy::synchronized(r);
        r
    }

    [Cuda, "cuStreamSynchronize", 7000, true, "memory (stream-ordered)", "as cuStreamSynchronize"]
    fn cuStreamSynchronize_ptsz(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream) };
        policy::synchronized(r);
        r
    }

    [Cuda, "cuCtxSynchronize", 2000, false, "memory (stream-ordered)", "as cuStreamSynchronize"]
    fn cuCtxSynchronize() -> CUresult |real| {
        // SAFETY: no arguments.
        let r = unsafe { real() };
        policy::synchronized(r);
        r
    }

    [Cuda, "cuEventSynchronize", 2000, false, "memory (stream-ordered)", "as cuStreamSynchronize"]
    fn cuEventSynchronize(hEvent: CUevent) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hEvent) };
        policy::synchronized(r);
        r
    }

    [Cuda, "cuMemCreate", 10020, false, "memory (virtual)", "reserve size for device-located handles; host-located pass through"]
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult |real| {
        let dev = out(prop)
            .filter(|p| p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE && p.location.id >= 0)
            .map(|p| p.location.id as u32);
        // SAFETY: forwarding the caller's arguments.
        policy::mem_create(size, dev, || out(handle), || unsafe { real(handle, size, prop, flags) })
    }

    [Cuda, "cuMemRelease", 10020, false, "memory (virtual)", "release the handle's charge"]
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::mem_release(handle, || unsafe { real(handle) })
    }

    [Cuda, "cuArrayCreate", 3020, false, "memory (arrays)", "reserve width x height x channels x format bytes"]
    fn cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| policy::array_bytes(&d));
        // SAFETY: forwarding the caller's arguments.
        policy::array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [Cuda, "cuArray3DCreate", 3020, false, "memory (arrays)", "reserve width x height x depth x channels x format bytes"]
    fn cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| policy::array3d_bytes(&d));
        // SAFETY: forwarding the caller's arguments.
        policy::array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [Cuda, "cuArrayDestroy", 2000, false, "memory (arrays)", "release the array's charge"]
    fn cuArrayDestroy(hArray: CUarray) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::array_destroy(hArray.0 as usize, || unsafe { real(hArray) })
    }

    [Cuda, "cuMipmappedArrayCreate", 5000, false, "memory (arrays)", "reserve the sum of all levels"]
    fn cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint) -> CUresult |real| {
        let bytes = out(pMipmappedArrayDesc).and_then(|d| policy::mipmapped_bytes(&d, numMipmapLevels));
        policy::array_create(
            bytes,
            || out(pHandle).map(|h| h.0 as usize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(pHandle, pMipmappedArrayDesc, numMipmapLevels) },
        )
    }

    [Cuda, "cuMipmappedArrayDestroy", 5000, false, "memory (arrays)", "release the array's charge"]
    fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::array_destroy(hMipmappedArray.0 as usize, || unsafe { real(hMipmappedArray) })
    }

    [Cuda, "cuCtxCreate", 3020, false, "context", "reserve the context estimate on dev; release at destroy"]
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        policy::ctx_create(dev, || out(pctx).map(|c| c.0 as usize), || unsafe { real(pctx, flags, dev) })
    }

    [Cuda, "cuCtxCreate", 11040, false, "context", "as cuCtxCreate_v2"]
    fn cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        policy::ctx_create(
            dev,
            || out(pctx).map(|c| c.0 as usize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(pctx, paramsArray, numParams, flags, dev) },
        )
    }

    [Cuda, "cuCtxCreate", 12050, false, "context", "as cuCtxCreate_v2"]
    fn cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        policy::ctx_create(
            dev,
            || out(pctx).map(|c| c.0 as usize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(pctx, ctxCreateParams, flags, dev) },
        )
    }

    [Cuda, "cuCtxDestroy", 4000, false, "context", "release the context estimate"]
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::ctx_destroy(ctx.0 as usize, || unsafe { real(ctx) })
    }

    [Cuda, "cuDevicePrimaryCtxRetain", 7000, false, "context", "first retain per device reserves the context estimate"]
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        policy::primary_retain(dev, || unsafe { real(pctx, dev) })
    }

    [Cuda, "cuDevicePrimaryCtxRelease", 7000, false, "context", "last release returns the context estimate"]
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::primary_release(dev, false, || unsafe { real(dev) })
    }

    [Cuda, "cuDevicePrimaryCtxRelease", 11000, false, "context", "last release returns the context estimate"]
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::primary_release(dev, false, || unsafe { real(dev) })
    }

    [Cuda, "cuDevicePrimaryCtxReset", 7000, false, "context", "returns the context estimate"]
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::primary_release(dev, true, || unsafe { real(dev) })
    }

    [Cuda, "cuDevicePrimaryCtxReset", 11000, false, "context", "returns the context estimate"]
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        policy::primary_release(dev, true, || unsafe { real(dev) })
    }

    [Cuda, "cuMemGetInfo", 3020, false, "view", "total = min(limit, physical); free = total - container usage"]
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointers.
        unsafe { policy::mem_get_info(free, total, || real(free, total)) }
    }

    [Cuda, "cuDeviceTotalMem", 3020, false, "view", "the limit (physical total when unlimited)"]
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointer.
        unsafe { policy::device_total_mem(bytes, dev, || real(bytes, dev)) }
    }

    [Cuda, "cuLaunchKernel", 4000, false, "launch", "pass through (the SM limiter's seam; one atomic load when unlimited)"]
    fn cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        policy::launch_gate();
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) }
    }

    [Cuda, "cuLaunchKernel", 7000, true, "launch", "as cuLaunchKernel"]
    fn cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        policy::launch_gate();
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) }
    }
}

/// Undo path of a refused stream-ordered allocation.
fn free_async_raw(p: CUdeviceptr, stream: CUstream) {
    if let Some(f) =
        crate::hooks::real::<cuMemFreeAsync::Fn>(&cuMemFreeAsync::REAL, crate::hooks::Lib::Cuda)
    {
        // SAFETY: frees the allocation the driver just made, on its stream.
        unsafe { f(p, stream) };
    }
}

/// Gives back a pool's unused memory above `keep` bytes (the real
/// `cuMemPoolTrimTo`): after a refused growth, memory the pool took past
/// the budget must not stay reserved.
pub(crate) fn pool_trim_raw(pool: CUmemoryPool, keep: u64) {
    if let Some(f) =
        crate::hooks::real::<cuMemPoolTrimTo::Fn>(&cuMemPoolTrimTo::REAL, crate::hooks::Lib::Cuda)
    {
        // SAFETY: a live pool handle the application passed to the
        // allocation that was just refused; trimming only frees unused memory.
        unsafe { f(pool, usize::try_from(keep).unwrap_or(usize::MAX)) };
    }
}
