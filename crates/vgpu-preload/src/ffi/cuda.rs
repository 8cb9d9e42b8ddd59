//! CUDA driver API hooks. One declaration per hook; see [`crate::hooks!`].
//! Each body decodes the C arguments, asks the policy layer, and forwards
//! through `real` (the driver's own function of the same name).
#![allow(clippy::too_many_arguments)]
use std::ffi::{c_char, c_int, c_uint, c_void};

use vgpu_cuda_abi::*;

use super::route::route_proc;
use crate::limiter::{self, Launch};
use crate::memory::{self, Mem};
use crate::{attach, driver, init, sys, views};

/// Writes our hook over a successful `cuGetProcAddress` answer when the
/// driver returned the function a hook wraps (see `route::route_proc`).
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

/// Runs `f` over the memory policy when a region applies (attaching first
/// if needed), else `call` untouched.
#[inline]
fn limited<C: FnOnce() -> CUresult>(
    call: C,
    f: impl FnOnce(Mem<'static>, C) -> CUresult,
) -> CUresult {
    match memory::limited() {
        Some(m) => f(m, call),
        None => call(),
    }
}

/// As [`limited`], for frees and destroys: nothing to release before this
/// process ever charged (no attaching).
#[inline]
fn attached<C: FnOnce() -> CUresult>(
    call: C,
    f: impl FnOnce(Mem<'static>, C) -> CUresult,
) -> CUresult {
    match memory::limited_attached() {
        Some(m) => f(m, call),
        None => call(),
    }
}

/// The device a `CUmemLocation` names, when it is a device.
fn device_of(loc: &CUmemLocation) -> Option<u32> {
    (loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0).then_some(loc.id as u32)
}

crate::hooks! {
TABLE;
    /// Resolution (CUDA 11.3 ABI): the driver resolves, then hooks replace
    /// exactly the driver functions they wrap.
    [base: "cuGetProcAddress", since: 11030, ptds: false, family: "resolution", policy: "route: driver answer, hook substituted when it is the wrapped function"]
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
    [base: "cuGetProcAddress", since: 12000, ptds: false, family: "resolution", policy: "route: driver answer and symbolStatus, hook substituted when it is the wrapped function"]
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
        if r.is_success() {
            // SAFETY: the call succeeded with these arguments.
            unsafe { substitute(symbol, pfn, cudaVersion, flags) };
        }
        r
    }

    /// Initialization in phases (see `init::cu_init`).
    [base: "cuInit", since: 2000, ptds: false, family: "init", policy: "real cuInit, its phase stamps kept until the process attaches (the first call that needs the region); LIBVGPU_ATTACH=eager: map region, claim slot, real cuInit, post-init inside it"]
    fn cuInit(Flags: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's cuInit.
        init::cu_init(|f| unsafe { real(f) }, Flags)
    }

    [base: "cuMemAlloc", since: 3020, ptds: false, family: "memory", policy: "reserve bytesize; release on failure or free"]
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize) };
        limited(call, |m, call| m.alloc(bytesize, || out(dptr), call))
    }

    [base: "cuMemAllocPitch", since: 3020, ptds: false, family: "memory", policy: "reserve width x height, settle to pitch x height as returned"]
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) };
        limited(call, |m, call| m.alloc_pitch(WidthInBytes, Height, || out(dptr).zip(out(pPitch)), call))
    }

    [base: "cuMemAllocManaged", since: 6000, ptds: false, family: "memory", policy: "reserve bytesize on the current device; release on failure or free"]
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize, flags) };
        limited(call, |m, call| m.alloc(bytesize, || out(dptr), call))
    }

    [base: "cuMemFree", since: 3020, ptds: false, family: "memory", policy: "release what was charged; unknown pointers pass through"]
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr) };
        attached(call, |m, call| m.free(dptr, call))
    }

    [base: "cuMemAllocAsync", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "admit pool growth; charge follows the pool's RESERVED_MEM_CURRENT; captured into a graph: passed through (a graph alloc node, charged when an executable backs it)"]
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize, hStream) };
        if limiter::captured(hStream, false) {
            return call(); // a graph alloc node: charged when its graph is backed
        }
        limited(call, |m, call| m.alloc_async(bytesize, None, hStream, || out(dptr), call))
    }

    [base: "cuMemAllocAsync", since: 11020, ptds: true, family: "memory (stream-ordered)", policy: "as cuMemAllocAsync"]
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize, hStream) };
        if limiter::captured(hStream, true) {
            return call(); // a graph alloc node: charged when its graph is backed
        }
        limited(call, |m, call| m.alloc_async(bytesize, None, hStream, || out(dptr), call))
    }

    [base: "cuMemAllocFromPoolAsync", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "admit pool growth; charge follows this pool's RESERVED_MEM_CURRENT; captured: as cuMemAllocAsync"]
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize, pool, hStream) };
        if limiter::captured(hStream, false) {
            return call(); // a graph alloc node: charged when its graph is backed
        }
        limited(call, |m, call| m.alloc_async(bytesize, Some(pool), hStream, || out(dptr), call))
    }

    [base: "cuMemAllocFromPoolAsync", since: 11020, ptds: true, family: "memory (stream-ordered)", policy: "as cuMemAllocFromPoolAsync"]
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize, pool, hStream) };
        if limiter::captured(hStream, true) {
            return call(); // a graph alloc node: charged when its graph is backed
        }
        limited(call, |m, call| m.alloc_async(bytesize, Some(pool), hStream, || out(dptr), call))
    }

    [base: "cuMemFreeAsync", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "settle the pool's charge to its reserved memory (a graph allocation: the device's graph charge); captured into a graph: passed through"]
    fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, hStream) };
        if limiter::captured(hStream, false) {
            return call(); // a graph free node: nothing is freed now
        }
        attached(call, |m, call| m.free_async(dptr, call))
    }

    [base: "cuMemFreeAsync", since: 11020, ptds: true, family: "memory (stream-ordered)", policy: "as cuMemFreeAsync"]
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, hStream) };
        if limiter::captured(hStream, true) {
            return call(); // a graph free node: nothing is freed now
        }
        attached(call, |m, call| m.free_async(dptr, call))
    }

    [base: "cuMemPoolCreate", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "remember the pool's device"]
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(pool, poolProps) };
        if r.is_success() {
            let dev = out(poolProps).and_then(|pp| device_of(&pp.location));
            if let (Some(pl), Some(m)) = (out(pool), memory::limited()) {
                m.pool_created(pl, dev);
            }
        }
        r
    }

    [base: "cuMemPoolDestroy", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "release the pool's charge; allocations still out keep theirs until freed"]
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pool) };
        attached(call, |m, call| m.pool_destroy(pool, call))
    }

    [base: "cuMemPoolTrimTo", since: 11020, ptds: false, family: "memory (stream-ordered)", policy: "settle the pool's charge after trimming"]
    fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(pool, minBytesToKeep) };
        if let (true, Some(m)) = (r.is_success(), memory::limited_attached()) {
            m.pool_trimmed(pool);
        }
        r
    }

    [base: "cuStreamSynchronize", since: 2000, ptds: false, family: "memory (stream-ordered)", policy: "limiter: close open bursts before, read markers after; then settle pool charges (pools release memory at synchronize)"]
    fn cuStreamSynchronize(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| synchronized(unsafe { real(hStream) }))
    }

    [base: "cuStreamSynchronize", since: 7000, ptds: true, family: "memory (stream-ordered)", policy: "as cuStreamSynchronize"]
    fn cuStreamSynchronize_ptsz(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| synchronized(unsafe { real(hStream) }))
    }

    [base: "cuCtxSynchronize", since: 2000, ptds: false, family: "memory (stream-ordered)", policy: "as cuStreamSynchronize"]
    fn cuCtxSynchronize() -> CUresult |real| {
        // SAFETY: no arguments.
        sync_call(|| synchronized(unsafe { real() }))
    }

    [base: "cuEventSynchronize", since: 2000, ptds: false, family: "memory (stream-ordered)", policy: "as cuStreamSynchronize"]
    fn cuEventSynchronize(hEvent: CUevent) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| synchronized(unsafe { real(hEvent) }))
    }

    [base: "cuMemCreate", since: 10020, ptds: false, family: "memory (virtual)", policy: "reserve size for device-located handles; host-located pass through"]
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(handle, size, prop, flags) };
        match out(prop).and_then(|p| device_of(&p.location)) {
            None => call(), // host-located: pass through
            Some(dev) => limited(call, |m, call| m.mem_create(size, dev, || out(handle), call)),
        }
    }

    [base: "cuMemRelease", since: 10020, ptds: false, family: "memory (virtual)", policy: "release the handle's charge"]
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(handle) };
        attached(call, |m, call| m.mem_release(handle, call))
    }

    [base: "cuMemMap", since: 10020, ptds: false, family: "memory (virtual)", policy: "count the mapping of a charged handle (its charge outlives cuMemRelease while mapped)"]
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(ptr, size, offset, handle, flags) };
        attached(call, |m, call| m.mem_map(ptr, size, handle, call))
    }

    [base: "cuMemUnmap", since: 10020, ptds: false, family: "memory (virtual)", policy: "the last unmap of a released handle returns its charge"]
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(ptr, size) };
        attached(call, |m, call| m.mem_unmap(ptr, size, call))
    }

    [base: "cuArrayCreate", since: 3020, ptds: false, family: "memory (arrays)", policy: "reserve width x height x channels x format bytes"]
    fn cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| memory::array_bytes(&d));
        // SAFETY: forwarding the caller's arguments.
        array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [base: "cuArray3DCreate", since: 3020, ptds: false, family: "memory (arrays)", policy: "reserve width x height x depth x channels x format bytes"]
    fn cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| memory::array3d_bytes(&d));
        // SAFETY: forwarding the caller's arguments.
        array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [base: "cuArrayDestroy", since: 2000, ptds: false, family: "memory (arrays)", policy: "release the array's charge"]
    fn cuArrayDestroy(hArray: CUarray) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(hArray) };
        attached(call, |m, call| m.array_destroy(hArray.0 as usize, call))
    }

    [base: "cuMipmappedArrayCreate", since: 5000, ptds: false, family: "memory (arrays)", policy: "reserve the sum of all levels"]
    fn cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint) -> CUresult |real| {
        let bytes = out(pMipmappedArrayDesc).and_then(|d| memory::mipmapped_bytes(&d, numMipmapLevels));
        array_create(
            bytes,
            || out(pHandle).map(|h| h.0 as usize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { real(pHandle, pMipmappedArrayDesc, numMipmapLevels) },
        )
    }

    [base: "cuMipmappedArrayDestroy", since: 5000, ptds: false, family: "memory (arrays)", policy: "release the array's charge"]
    fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(hMipmappedArray) };
        attached(call, |m, call| m.array_destroy(hMipmappedArray.0 as usize, call))
    }

    [base: "cuCtxCreate", since: 3020, ptds: false, family: "context", policy: "reserve the context estimate on dev; release at destroy"]
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pctx, flags, dev) };
        limited(call, |m, call| m.ctx_create(dev, || out(pctx).map(|c| c.0 as usize), call))
    }

    [base: "cuCtxCreate", since: 11040, ptds: false, family: "context", policy: "as cuCtxCreate_v2"]
    fn cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pctx, paramsArray, numParams, flags, dev) };
        limited(call, |m, call| m.ctx_create(dev, || out(pctx).map(|c| c.0 as usize), call))
    }

    [base: "cuCtxCreate", since: 12050, ptds: false, family: "context", policy: "as cuCtxCreate_v2"]
    fn cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pctx, ctxCreateParams, flags, dev) };
        limited(call, |m, call| m.ctx_create(dev, || out(pctx).map(|c| c.0 as usize), call))
    }

    [base: "cuCtxDestroy", since: 4000, ptds: false, family: "context", policy: "release the context estimate"]
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(ctx) };
        attached(call, |m, call| m.ctx_destroy(ctx.0 as usize, call))
    }

    [base: "cuDevicePrimaryCtxRetain", since: 7000, ptds: false, family: "context", policy: "first retain per device reserves the context estimate"]
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pctx, dev) };
        limited(call, |m, call| m.primary_retain(dev, || out(pctx).map(|c| c.0 as usize), call))
    }

    [base: "cuDevicePrimaryCtxRelease", since: 7000, ptds: false, family: "context", policy: "last release returns the context estimate"]
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dev) };
        attached(call, |m, call| m.primary_release(dev, false, call))
    }

    [base: "cuDevicePrimaryCtxRelease", since: 11000, ptds: false, family: "context", policy: "last release returns the context estimate"]
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dev) };
        attached(call, |m, call| m.primary_release(dev, false, call))
    }

    [base: "cuDevicePrimaryCtxReset", since: 7000, ptds: false, family: "context", policy: "returns the context estimate"]
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dev) };
        attached(call, |m, call| m.primary_release(dev, true, call))
    }

    [base: "cuDevicePrimaryCtxReset", since: 11000, ptds: false, family: "context", policy: "returns the context estimate"]
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dev) };
        attached(call, |m, call| m.primary_release(dev, true, call))
    }

    [base: "cuMemGetInfo", since: 3020, ptds: false, family: "view", policy: "total = min(limit, physical); free = total - container usage"]
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointers.
        let r = unsafe { real(free, total) };
        if !r.is_success() {
            return r;
        }
        let Some(p) = attach::proc() else { return r };
        let (pf, pt) = (out(free).unwrap_or(0) as u64, out(total).unwrap_or(0) as u64);
        if let Some((f, t)) = views::mem_info(p, &driver::REAL_CUDA, pf, pt) {
            // SAFETY: the driver just succeeded writing both.
            unsafe {
                sys::put(free, f as usize);
                sys::put(total, t as usize);
            }
        }
        r
    }

    [base: "cuDeviceTotalMem", since: 3020, ptds: false, family: "view", policy: "the limit (physical total when unlimited)"]
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointer.
        let r = unsafe { real(bytes, dev) };
        if !r.is_success() {
            return r;
        }
        let Some(p) = attach::proc() else { return r };
        if let Some(v) = views::total_mem(p, dev, out(bytes).unwrap_or(0) as u64) {
            // SAFETY: the driver just wrote it successfully.
            unsafe { sys::put(bytes, v as usize) };
        }
        r
    }

    // Legacy (v1) memory, context and info entry points: the 32-bit ABI of
    // CUDA 2.x, still exported by the driver and reached by a direct call,
    // `dlsym("cuMemAlloc")` (Python ctypes) or cuGetProcAddress below 3020.
    [base: "cuMemAlloc", since: 2000, ptds: false, family: "memory (legacy v1)", policy: "as cuMemAlloc_v2 (32-bit size and pointer)"]
    fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, bytesize) };
        limited(call, |m, call| m.alloc(bytesize as usize, || out(dptr).map(u64::from), call))
    }

    [base: "cuMemAllocPitch", since: 2000, ptds: false, family: "memory (legacy v1)", policy: "as cuMemAllocPitch_v2 (32-bit)"]
    fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) };
        let got = || out(dptr).map(u64::from).zip(out(pPitch).map(|p| p as usize));
        limited(call, |m, call| m.alloc_pitch(WidthInBytes as usize, Height as usize, got, call))
    }

    [base: "cuMemFree", since: 2000, ptds: false, family: "memory (legacy v1)", policy: "as cuMemFree_v2"]
    fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(dptr) };
        attached(call, |m, call| m.free(u64::from(dptr), call))
    }

    [base: "cuArrayCreate", since: 2000, ptds: false, family: "memory (legacy v1)", policy: "as cuArrayCreate_v2 (32-bit extents)"]
    fn cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| memory::array_bytes(&d.into()));
        // SAFETY: forwarding the caller's arguments.
        array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [base: "cuArray3DCreate", since: 2000, ptds: false, family: "memory (legacy v1)", policy: "as cuArray3DCreate_v2 (32-bit extents)"]
    fn cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult |real| {
        let bytes = out(pAllocateArray).and_then(|d| memory::array3d_bytes(&d.into()));
        // SAFETY: forwarding the caller's arguments.
        array_create(bytes, || out(pHandle).map(|h| h.0 as usize), || unsafe { real(pHandle, pAllocateArray) })
    }

    [base: "cuCtxCreate", since: 2000, ptds: false, family: "context (legacy v1)", policy: "as cuCtxCreate_v2"]
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult |real| {
        crate::identity::before_context(dev);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(pctx, flags, dev) };
        limited(call, |m, call| m.ctx_create(dev, || out(pctx).map(|c| c.0 as usize), call))
    }

    [base: "cuMemGetInfo", since: 2000, ptds: false, family: "view (legacy v1)", policy: "as cuMemGetInfo_v2, saturated to 32 bits"]
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointers.
        let r = unsafe { real(free, total) };
        if !r.is_success() {
            return r;
        }
        let Some(p) = attach::proc() else { return r };
        let (pf, pt) = (out(free).unwrap_or(0) as u64, out(total).unwrap_or(0) as u64);
        if let Some((f, t)) = views::mem_info(p, &driver::REAL_CUDA, pf, pt) {
            // SAFETY: the driver just succeeded writing both.
            unsafe {
                sys::put(free, u32_sat(f));
                sys::put(total, u32_sat(t));
            }
        }
        r
    }

    [base: "cuDeviceTotalMem", since: 2000, ptds: false, family: "view (legacy v1)", policy: "as cuDeviceTotalMem_v2, saturated to 32 bits"]
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments and out-pointer.
        let r = unsafe { real(bytes, dev) };
        if !r.is_success() {
            return r;
        }
        let Some(p) = attach::proc() else { return r };
        if let Some(v) = views::total_mem(p, dev, out(bytes).unwrap_or(0) as u64) {
            // SAFETY: the driver just wrote it successfully.
            unsafe { sys::put(bytes, u32_sat(v)) };
        }
        r
    }

    [base: "cuLaunchKernel", since: 4000, ptds: false, family: "launch", policy: "paced: the limiter's gate charges the launch to the container's bucket (one atomic load when nothing is paced)"]
    fn cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::Kernel, hStream, false, move || unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) })
    }

    [base: "cuLaunchKernel", since: 7000, ptds: true, family: "launch", policy: "as cuLaunchKernel"]
    fn cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::Kernel, hStream, true, move || unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra) })
    }

    [base: "cuLaunchKernelEx", since: 11060, ptds: false, family: "launch", policy: "as cuLaunchKernel"]
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        let stream = out(config).map_or(CUstream::NULL, |c| c.hStream);
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::KernelEx, stream, false, move || unsafe { real(config, f, kernelParams, extra) })
    }

    [base: "cuLaunchKernelEx", since: 11060, ptds: true, family: "launch", policy: "as cuLaunchKernel"]
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult |real| {
        let stream = out(config).map_or(CUstream::NULL, |c| c.hStream);
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::KernelEx, stream, true, move || unsafe { real(config, f, kernelParams, extra) })
    }

    [base: "cuLaunchCooperativeKernel", since: 9000, ptds: false, family: "launch", policy: "as cuLaunchKernel"]
    fn cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::Cooperative, hStream, false, move || unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams) })
    }

    [base: "cuLaunchCooperativeKernel", since: 9000, ptds: true, family: "launch", policy: "as cuLaunchKernel"]
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::Cooperative, hStream, true, move || unsafe { real(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams) })
    }

    // Launch paths (paced), continued: graphs and multi-device launches.
    [base: "cuLaunchCooperativeKernelMultiDevice", since: 9000, ptds: false, family: "launch", policy: "paced as one launch on the calling context's device (stream of the first entry)"]
    fn cuLaunchCooperativeKernelMultiDevice(launchParamsList: *mut CUDA_LAUNCH_PARAMS, numDevices: c_uint, flags: c_uint) -> CUresult |real| {
        let stream = out(launchParamsList as *const CUDA_LAUNCH_PARAMS).map_or(CUstream::NULL, |p| p.hStream);
        // SAFETY: forwarding the caller's arguments.
        limiter::launch(Launch::CooperativeMultiDevice, stream, false, move || unsafe { real(launchParamsList, numDevices, flags) })
    }

    [base: "cuGraphLaunch", since: 10000, ptds: false, family: "launch", policy: "paced: charged the executable's own measured cost (one burst per graph launch); graph memory admitted as cuGraphUpload, then its allocations live until freed"]
    fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult |real| {
        limiter::launch(Launch::Graph(hGraphExec), hStream, false, || {
            // SAFETY: forwarding the caller's arguments.
            graph_run(hGraphExec, hStream, false, true, || unsafe { real(hGraphExec, hStream) })
        })
    }

    [base: "cuGraphLaunch", since: 10000, ptds: true, family: "launch", policy: "as cuGraphLaunch"]
    fn cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult |real| {
        limiter::launch(Launch::Graph(hGraphExec), hStream, true, || {
            // SAFETY: forwarding the caller's arguments.
            graph_run(hGraphExec, hStream, true, true, || unsafe { real(hGraphExec, hStream) })
        })
    }

    // Graph memory: alloc nodes are backed when an executable is uploaded
    // or launched; the charge follows the driver's graph allocator.
    [base: "cuGraphInstantiate", since: 10000, ptds: false, family: "graph memory", policy: "list the graph's memory nodes (child graphs too) for its executable; memory backed at instantiation is settled, undone and refused past the budget"]
    fn cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize) };
        limited(call, |m, call| m.graph_instantiate(hGraph, 0, || out(phGraphExec), call))
    }

    [base: "cuGraphInstantiate", since: 11000, ptds: false, family: "graph memory", policy: "as cuGraphInstantiate"]
    fn cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize) };
        limited(call, |m, call| m.graph_instantiate(hGraph, 0, || out(phGraphExec), call))
    }

    [base: "cuGraphInstantiateWithFlags", since: 11040, ptds: false, family: "graph memory", policy: "as cuGraphInstantiate; AUTO_FREE_ON_LAUNCH noted (a relaunch reuses what its previous launch left live)"]
    fn cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(phGraphExec, hGraph, flags) };
        limited(call, |m, call| m.graph_instantiate(hGraph, flags, || out(phGraphExec), call))
    }

    [base: "cuGraphInstantiateWithParams", since: 12000, ptds: false, family: "graph memory", policy: "as cuGraphInstantiateWithFlags; with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD admitted as cuGraphUpload"]
    fn cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult |real| {
        let flags = out(instantiateParams.cast_const()).map_or(0, |p| p.flags);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(phGraphExec, hGraph, instantiateParams) };
        limited(call, |m, call| m.graph_instantiate(hGraph, flags, || out(phGraphExec), call))
    }

    [base: "cuGraphInstantiateWithParams", since: 12000, ptds: true, family: "graph memory", policy: "as cuGraphInstantiateWithParams"]
    fn cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult |real| {
        let flags = out(instantiateParams.cast_const()).map_or(0, |p| p.flags);
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(phGraphExec, hGraph, instantiateParams) };
        limited(call, |m, call| m.graph_instantiate(hGraph, flags, || out(phGraphExec), call))
    }

    [base: "cuGraphUpload", since: 11010, ptds: false, family: "graph memory", policy: "admit the executable's alloc nodes not live (less its own unused memory), refused with CUDA_ERROR_OUT_OF_MEMORY before the driver; charge follows the device's graph RESERVED_MEM_CURRENT"]
    fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        graph_run(hGraphExec, hStream, false, false, || unsafe { real(hGraphExec, hStream) })
    }

    [base: "cuGraphUpload", since: 11010, ptds: true, family: "graph memory", policy: "as cuGraphUpload"]
    fn cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        graph_run(hGraphExec, hStream, true, false, || unsafe { real(hGraphExec, hStream) })
    }

    [base: "cuGraphExecDestroy", since: 10000, ptds: false, family: "graph memory", policy: "forget the executable's memory nodes; settle its devices' graph charge"]
    fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let call = || unsafe { real(hGraphExec) };
        attached(call, |m, call| m.graph_exec_destroy(hGraphExec, call))
    }

    [base: "cuDeviceGraphMemTrim", since: 11040, ptds: false, family: "graph memory", policy: "settle the device's graph charge to RESERVED_MEM_CURRENT after the trim"]
    fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(device) };
        if let Some(m) = memory::limited_attached() {
            m.graph_trimmed(device, r);
        }
        r
    }

    // Stream capture: captured launches do not run, so they are not paced.
    [base: "cuStreamBeginCapture", since: 10000, ptds: false, family: "capture", policy: "count the capture: while one is in progress, the gate (and the stream-ordered allocation hooks) ask whether a stream is captured"]
    fn cuStreamBeginCapture(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamBeginCapture", since: 10000, ptds: true, family: "capture", policy: "as cuStreamBeginCapture"]
    fn cuStreamBeginCapture_ptsz(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamBeginCapture", since: 10010, ptds: false, family: "capture", policy: "as cuStreamBeginCapture"]
    fn cuStreamBeginCapture_v2(hStream: CUstream, mode: CUstreamCaptureMode) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, mode) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamBeginCapture", since: 10010, ptds: true, family: "capture", policy: "as cuStreamBeginCapture"]
    fn cuStreamBeginCapture_v2_ptsz(hStream: CUstream, mode: CUstreamCaptureMode) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, mode) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamBeginCaptureToGraph", since: 12030, ptds: false, family: "capture", policy: "as cuStreamBeginCapture, into an existing graph"]
    fn cuStreamBeginCaptureToGraph(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, hGraph, dependencies, dependencyData, numDependencies, mode) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamBeginCaptureToGraph", since: 12030, ptds: true, family: "capture", policy: "as cuStreamBeginCaptureToGraph"]
    fn cuStreamBeginCaptureToGraph_ptsz(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, hGraph, dependencies, dependencyData, numDependencies, mode) };
        limiter::capture_begun(r);
        r
    }

    [base: "cuStreamEndCapture", since: 10000, ptds: false, family: "capture", policy: "the capture ends (the count drops)"]
    fn cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, phGraph) };
        limiter::capture_ended(r);
        r
    }

    [base: "cuStreamEndCapture", since: 10000, ptds: true, family: "capture", policy: "as cuStreamEndCapture"]
    fn cuStreamEndCapture_ptsz(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real(hStream, phGraph) };
        limiter::capture_ended(r);
        r
    }

    // Synchronizing calls the limiter closes its bursts before (so a
    // launch-then-synchronize loop is held and measured launch by launch).
    [base: "cuStreamQuery", since: 2000, ptds: false, family: "synchronize", policy: "limiter: close open bursts before, read markers after"]
    fn cuStreamQuery(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(hStream) })
    }

    [base: "cuStreamQuery", since: 7000, ptds: true, family: "synchronize", policy: "as cuStreamQuery"]
    fn cuStreamQuery_ptsz(hStream: CUstream) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(hStream) })
    }

    [base: "cuEventQuery", since: 2000, ptds: false, family: "synchronize", policy: "as cuStreamQuery"]
    fn cuEventQuery(hEvent: CUevent) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(hEvent) })
    }

    [base: "cuMemcpyHtoD", since: 3020, ptds: false, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstDevice, srcHost, ByteCount) })
    }

    [base: "cuMemcpyHtoD", since: 7000, ptds: true, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyHtoD_v2_ptds(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstDevice, srcHost, ByteCount) })
    }

    [base: "cuMemcpyDtoH", since: 3020, ptds: false, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstHost, srcDevice, ByteCount) })
    }

    [base: "cuMemcpyDtoH", since: 7000, ptds: true, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyDtoH_v2_ptds(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstHost, srcDevice, ByteCount) })
    }

    [base: "cuMemcpyDtoD", since: 3020, ptds: false, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyDtoD_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstDevice, srcDevice, ByteCount) })
    }

    [base: "cuMemcpyDtoD", since: 7000, ptds: true, family: "synchronize", policy: "blocking copy: as cuStreamQuery"]
    fn cuMemcpyDtoD_v2_ptds(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult |real| {
        // SAFETY: forwarding the caller's arguments.
        sync_call(|| unsafe { real(dstDevice, srcDevice, ByteCount) })
    }
}

/// A graph upload or launch (`launch`) of `exec` on `stream`: admitted and
/// settled by the graph-memory policy, unless `stream` is being captured
/// (the graph becomes a node of the capture and runs later).
fn graph_run(
    exec: CUgraphExec,
    stream: CUstream,
    per_thread: bool,
    launch: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if limiter::captured(stream, per_thread) {
        return call();
    }
    attached(call, |m, call| m.graph_run(exec, launch, call))
}

/// A synchronizing call: the limiter's bursts close before it and what
/// finished is read after it.
fn sync_call(call: impl FnOnce() -> CUresult) -> CUresult {
    limiter::before_sync();
    let r = call();
    limiter::after_sync();
    r
}

/// A byte count for a 32-bit out-parameter (the v1 ABI): saturated.
fn u32_sat(v: u64) -> c_uint {
    c_uint::try_from(v).unwrap_or(c_uint::MAX)
}

/// After a synchronize: pool charges follow what the pools gave back.
fn synchronized(r: CUresult) -> CUresult {
    if let Some(m) = memory::limited_attached() {
        m.synchronized(r);
    }
    r
}

/// Arrays: formats vgpu does not size are not charged (said at debug).
fn array_create(
    bytes: Option<u64>,
    out: impl Fn() -> Option<usize>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(bytes) = bytes else {
        crate::debug!("array of a format vgpu does not size: not charged");
        return call();
    };
    limited(call, |m, call| m.array_create(bytes, out, call))
}
