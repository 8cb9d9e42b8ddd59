//! Exports that move bytes (`cuMemcpy*`, `cuMemset*`) and share memory
//! between processes (`cuIpc*`), with pointer attributes. The host side of
//! each copy is a caller's raw pointer: that work, and only that, is here;
//! where bytes live and when a copy may run is `crate::data`'s.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};

use vgpu_cuda_abi::*;

use super::{h, inp, out, p, run};
use crate::data::{Side, Target};
use crate::driver::{drv, R};

/// When a copy or set runs relative to the kernel model.
#[derive(Clone, Copy)]
enum Order {
    /// Synchronous: after the context's queued work.
    Sync,
    /// On a stream (`per_thread`: the per-thread default stream for 0).
    Stream(u64, bool),
}

fn order(o: Order) -> R {
    let d = drv()?;
    match o {
        Order::Sync => d.before_sync_op(),
        Order::Stream(s, pt) => d.before_stream_op(s, pt),
    }
}

/// Copy `n` bytes between two resolved places.
///
/// Safety: a `Target::Host` address is valid for `n` bytes (read for the
/// source, written for the destination), per the entry point's C contract.
unsafe fn copy_targets(dst: &Target, src: &Target, n: u64) -> R {
    let io = |_| CUresult::CUDA_ERROR_INVALID_VALUE;
    let len = usize::try_from(n).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    match (dst, src) {
        (Target::Host(d), Target::Host(s)) => {
            // SAFETY: both valid for `len` bytes (contract); `copy` allows
            // overlap, as host-to-host through the driver may.
            unsafe { std::ptr::copy(*s as *const u8, *d as *mut u8, len) };
            Ok(())
        }
        (Target::Device(b, off), Target::Host(s)) => {
            // SAFETY: the source is valid for reads of `len` bytes.
            let src = unsafe { std::slice::from_raw_parts(*s as *const u8, len) };
            b.write(*off, src).map_err(io)
        }
        (Target::Host(d), Target::Device(b, off)) => {
            // SAFETY: the destination is valid for writes of `len` bytes
            // and nothing else in this process reads it during the call.
            let dst = unsafe { std::slice::from_raw_parts_mut(*d as *mut u8, len) };
            b.read(*off, dst).map_err(io)
        }
        (Target::Device(bd, od), Target::Device(bs, os)) => bs.copy_to(*os, bd, *od, n).map_err(io),
    }
}

/// One linear copy: `dst`/`src` as the entry point names them.
///
/// Safety: host pointers valid for `n` bytes per the C contract.
unsafe fn copy(dst: u64, dside: Side, src: u64, sside: Side, n: usize, o: Order) -> R {
    let d = drv()?;
    d.ctx()?;
    if n == 0 {
        return Ok(());
    }
    let n = n as u64;
    let dt = d.target(dst, n, dside)?;
    let st = d.target(src, n, sside)?;
    order(o)?;
    // SAFETY: per this function's contract.
    unsafe { copy_targets(&dt, &st, n) }
}

/// `count` elements of `pattern` from `dst`, `rows` rows `pitch` apart.
///
/// Safety: host (managed) destinations are valid for the whole range.
unsafe fn set(dst: u64, pitch: usize, pattern: &[u8], count: usize, rows: usize, o: Order) -> R {
    let d = drv()?;
    d.ctx()?;
    let width = (count as u64)
        .checked_mul(pattern.len() as u64)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if width == 0 || rows == 0 {
        return Ok(());
    }
    if rows > 1 && (pitch as u64) < width {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if !dst.is_multiple_of(pattern.len() as u64) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut targets = Vec::with_capacity(rows);
    for r in 0..rows as u64 {
        let at = dst
            .checked_add(r * pitch as u64)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        targets.push(d.target(at, width, Side::Device)?);
    }
    order(o)?;
    for t in targets {
        match t {
            Target::Device(b, off) => b
                .fill(off, pattern, count as u64)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
            Target::Host(a) => {
                for i in 0..count {
                    // SAFETY: managed/host memory valid for `width` bytes
                    // (resolved above); unaligned writes are fine.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            pattern.as_ptr(),
                            (a as *mut u8).add(i * pattern.len()),
                            pattern.len(),
                        )
                    };
                }
            }
        }
    }
    Ok(())
}

/// One side of a 2D/3D copy: (pointer, side) from its memory type.
fn side_of(ty: CUmemorytype, host: u64, dev: u64, array: CUarray) -> R<(u64, Side)> {
    match ty {
        CU_MEMORYTYPE_HOST => Ok((host, Side::Host)),
        CU_MEMORYTYPE_DEVICE => Ok((dev, Side::Device)),
        CU_MEMORYTYPE_UNIFIED => Ok((dev, Side::Any)),
        // Array contents are not simulated.
        CU_MEMORYTYPE_ARRAY if !array.is_null() => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A 3D copy (a 2D one is depth 1): row by row.
///
/// Safety: host pointers valid for their described ranges (C contract).
#[allow(clippy::type_complexity)]
unsafe fn copy_3d(
    dst: (u64, Side, usize, usize, usize, usize, usize),
    src: (u64, Side, usize, usize, usize, usize, usize),
    width: usize,
    height: usize,
    depth: usize,
    o: Order,
) -> R {
    let d = drv()?;
    d.ctx()?;
    if width == 0 || height == 0 || depth == 0 {
        return Ok(());
    }
    // (base, side, x, y, z, pitch, slice height)
    let at = |s: &(u64, Side, usize, usize, usize, usize, usize), y: usize, z: usize| -> R<u64> {
        let (base, _, x, y0, z0, pitch, sh) = *s;
        if pitch < x + width && (height > 1 || depth > 1) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let row = (z0 + z)
            .checked_mul(sh.max(height))
            .and_then(|r| r.checked_add(y0 + y))
            .and_then(|r| r.checked_mul(pitch))
            .and_then(|r| r.checked_add(x))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        base.checked_add(row as u64)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };
    let mut rows = Vec::with_capacity(height * depth);
    for z in 0..depth {
        for y in 0..height {
            let dt = d.target(at(&dst, y, z)?, width as u64, dst.1)?;
            let st = d.target(at(&src, y, z)?, width as u64, src.1)?;
            rows.push((dt, st));
        }
    }
    order(o)?;
    for (dt, st) in rows {
        // SAFETY: per this function's contract.
        unsafe { copy_targets(&dt, &st, width as u64) }?;
    }
    Ok(())
}

/// Safety: `c` is null or a valid `CUDA_MEMCPY2D`, its host pointers valid.
unsafe fn copy_2d(c: *const CUDA_MEMCPY2D, o: Order) -> R {
    // SAFETY: per the contract; null rejected.
    let c = unsafe { inp(c) }?;
    let (s, ss) = side_of(c.srcMemoryType, c.srcHost as u64, c.srcDevice, c.srcArray)?;
    let (d, ds) = side_of(c.dstMemoryType, c.dstHost as u64, c.dstDevice, c.dstArray)?;
    // SAFETY: as above.
    unsafe {
        copy_3d(
            (d, ds, c.dstXInBytes, c.dstY, 0, c.dstPitch, c.Height),
            (s, ss, c.srcXInBytes, c.srcY, 0, c.srcPitch, c.Height),
            c.WidthInBytes,
            c.Height,
            1,
            o,
        )
    }
}

/// Safety: `c` is null or a valid `CUDA_MEMCPY3D`, its host pointers valid.
unsafe fn copy_3d_desc(c: *const CUDA_MEMCPY3D, o: Order) -> R {
    // SAFETY: per the contract; null rejected.
    let c = unsafe { inp(c) }?;
    if c.srcLOD != 0 || c.dstLOD != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (s, ss) = side_of(c.srcMemoryType, c.srcHost as u64, c.srcDevice, c.srcArray)?;
    let (d, ds) = side_of(c.dstMemoryType, c.dstHost as u64, c.dstDevice, c.dstArray)?;
    // SAFETY: as above.
    unsafe {
        copy_3d(
            (
                d,
                ds,
                c.dstXInBytes,
                c.dstY,
                c.dstZ,
                c.dstPitch,
                c.dstHeight,
            ),
            (
                s,
                ss,
                c.srcXInBytes,
                c.srcY,
                c.srcZ,
                c.srcPitch,
                c.srcHeight,
            ),
            c.WidthInBytes,
            c.Height,
            c.Depth,
            o,
        )
    }
}

/// `cuMemcpyPeer`: contexts name the devices; addresses are unified.
///
/// Safety: as `copy`.
unsafe fn copy_peer(dst: u64, dctx: CUcontext, src: u64, sctx: CUcontext, n: usize, o: Order) -> R {
    let d = drv()?;
    d.ctx_of(h(dctx.0))?;
    d.ctx_of(h(sctx.0))?;
    // SAFETY: per the contract.
    unsafe { copy(dst, Side::Device, src, Side::Device, n, o) }
}

/// Write one pointer attribute for `ptr` into `data`.
///
/// Safety: `data` is valid for the attribute's type (cuda.h's table).
unsafe fn pointer_attribute(data: *mut c_void, attr: c_uint, ptr: CUdeviceptr, strict: bool) -> R {
    let d = drv()?;
    let info = d.ptr_info(ptr);
    let Some(i) = info else {
        if strict {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // cuPointerGetAttributes: not a CUDA pointer -> zero/NULL values.
        // SAFETY: sized per attribute as below.
        return unsafe { pointer_default(data, attr) };
    };
    // SAFETY: `data` sized per attribute (contract); each arm writes its
    // attribute's documented type.
    unsafe {
        match attr {
            CU_POINTER_ATTRIBUTE_CONTEXT => out(data.cast::<CUcontext>(), CUcontext(p(i.ctx))),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => out(data.cast::<c_uint>(), i.memory_type),
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER => out(data.cast::<u64>(), ptr),
            CU_POINTER_ATTRIBUTE_HOST_POINTER => match i.host_ptr {
                Some(base) => out(data.cast::<u64>(), base + (ptr - i.base)),
                None => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            },
            CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => out(data.cast::<u8>(), 1),
            CU_POINTER_ATTRIBUTE_BUFFER_ID | CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => {
                out(data.cast::<u64>(), i.buffer_id)
            }
            CU_POINTER_ATTRIBUTE_IS_MANAGED => out(data.cast::<u8>(), u8::from(i.managed)),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                out(data.cast::<c_uint>(), d.ordinal(i.dev).max(0) as c_uint)
            }
            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => {
                out(data.cast::<u8>(), u8::from(i.ipc_capable))
            }
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR | CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR => {
                out(data.cast::<u64>(), i.base)
            }
            CU_POINTER_ATTRIBUTE_RANGE_SIZE | CU_POINTER_ATTRIBUTE_MAPPING_SIZE => {
                out(data.cast::<usize>(), i.size as usize)
            }
            CU_POINTER_ATTRIBUTE_MAPPED => out(data.cast::<u8>(), 1),
            CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
            | CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE => out(data.cast::<c_uint>(), 0),
            CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => out(
                data.cast::<c_uint>(),
                CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE,
            ),
            CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => out(
                data.cast::<CUmemoryPool>(),
                CUmemoryPool(p(i.pool.unwrap_or(0))),
            ),
            CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => out(data.cast::<u8>(), 0),
            // Tokens for the nv-p2p kernel interface: no such interface.
            CU_POINTER_ATTRIBUTE_P2P_TOKENS => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
}

/// Safety: as `pointer_attribute`.
unsafe fn pointer_default(data: *mut c_void, attr: c_uint) -> R {
    // SAFETY: sized per attribute (contract).
    unsafe {
        match attr {
            CU_POINTER_ATTRIBUTE_CONTEXT
            | CU_POINTER_ATTRIBUTE_DEVICE_POINTER
            | CU_POINTER_ATTRIBUTE_HOST_POINTER
            | CU_POINTER_ATTRIBUTE_BUFFER_ID
            | CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
            | CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
            | CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
            | CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => out(data.cast::<u64>(), 0),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE | CU_POINTER_ATTRIBUTE_MAPPING_SIZE => {
                out(data.cast::<usize>(), 0)
            }
            CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
            | CU_POINTER_ATTRIBUTE_IS_MANAGED
            | CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
            | CU_POINTER_ATTRIBUTE_MAPPED
            | CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => out(data.cast::<u8>(), 0),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE
            | CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
            | CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
            | CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
            | CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => out(data.cast::<c_uint>(), 0),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
}

unsafe fn address_range(base: *mut u64, size: *mut usize, ptr: u64) -> R {
    let i = drv()?
        .ptr_info(ptr)
        .filter(|i| i.memory_type == CU_MEMORYTYPE_DEVICE || i.managed)
        .ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
    // Both out-pointers are optional.
    if !base.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(base, i.base) }?;
    }
    if !size.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(size, i.size as usize) }?;
    }
    Ok(())
}

const S: Side = Side::Host;
const D: Side = Side::Device;
const A: Side = Side::Any;
const SYNC: Order = Order::Sync;

cu! {
    // ---- linear copies ----
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        // SAFETY: `src` holds `n` bytes (C contract).
        unsafe { copy(dst, D, src as u64, S, n, SYNC) }
    }
    fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) {
        // SAFETY: as cuMemcpyHtoD_v2.
        unsafe { copy(dst, D, src as u64, S, n, SYNC) }
    }
    fn cuMemcpyHtoD(dst: c_uint, src: *const c_void, n: c_uint) {
        // SAFETY: as cuMemcpyHtoD_v2 (v1: 32-bit address and size).
        unsafe { copy(u64::from(dst), D, src as u64, S, n as usize, SYNC) }
    }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        // SAFETY: `dst` holds `n` bytes (C contract).
        unsafe { copy(dst as u64, S, src, D, n, SYNC) }
    }
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        // SAFETY: as cuMemcpyDtoH_v2.
        unsafe { copy(dst as u64, S, src, D, n, SYNC) }
    }
    fn cuMemcpyDtoH(dst: *mut c_void, src: c_uint, n: c_uint) {
        // SAFETY: as cuMemcpyDtoH_v2.
        unsafe { copy(dst as u64, S, u64::from(src), D, n as usize, SYNC) }
    }
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        // SAFETY: device pointers only.
        unsafe { copy(dst, D, src, D, n, SYNC) }
    }
    fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        // SAFETY: device pointers only.
        unsafe { copy(dst, D, src, D, n, SYNC) }
    }
    fn cuMemcpyDtoD(dst: c_uint, src: c_uint, n: c_uint) {
        // SAFETY: device pointers only.
        unsafe { copy(u64::from(dst), D, u64::from(src), D, n as usize, SYNC) }
    }
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpyHtoD_v2.
        unsafe { copy(dst, D, src as u64, S, n, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpyHtoD_v2.
        unsafe { copy(dst, D, src as u64, S, n, Order::Stream(h(s.0), true)) }
    }
    fn cuMemcpyHtoDAsync(dst: c_uint, src: *const c_void, n: c_uint, s: CUstream) {
        // SAFETY: as cuMemcpyHtoD_v2.
        unsafe { copy(u64::from(dst), D, src as u64, S, n as usize, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpyDtoH_v2.
        unsafe { copy(dst as u64, S, src, D, n, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpyDtoH_v2.
        unsafe { copy(dst as u64, S, src, D, n, Order::Stream(h(s.0), true)) }
    }
    fn cuMemcpyDtoHAsync(dst: *mut c_void, src: c_uint, n: c_uint, s: CUstream) {
        // SAFETY: as cuMemcpyDtoH_v2.
        unsafe { copy(dst as u64, S, u64::from(src), D, n as usize, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: device pointers only.
        unsafe { copy(dst, D, src, D, n, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: device pointers only.
        unsafe { copy(dst, D, src, D, n, Order::Stream(h(s.0), true)) }
    }
    fn cuMemcpyDtoDAsync(dst: c_uint, src: c_uint, n: c_uint, s: CUstream) {
        // SAFETY: device pointers only.
        unsafe { copy(u64::from(dst), D, u64::from(src), D, n as usize, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        // SAFETY: unified addresses; host ones hold `n` bytes (C contract).
        unsafe { copy(dst, A, src, A, n, SYNC) }
    }
    fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        // SAFETY: as cuMemcpy.
        unsafe { copy(dst, A, src, A, n, SYNC) }
    }
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpy.
        unsafe { copy(dst, A, src, A, n, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        // SAFETY: as cuMemcpy.
        unsafe { copy(dst, A, src, A, n, Order::Stream(h(s.0), true)) }
    }
    fn cuMemcpyPeer(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) {
        // SAFETY: device pointers only.
        unsafe { copy_peer(dst, dctx, src, sctx, n, SYNC) }
    }
    fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) {
        // SAFETY: device pointers only.
        unsafe { copy_peer(dst, dctx, src, sctx, n, SYNC) }
    }
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) {
        // SAFETY: device pointers only.
        unsafe { copy_peer(dst, dctx, src, sctx, n, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) {
        // SAFETY: device pointers only.
        unsafe { copy_peer(dst, dctx, src, sctx, n, Order::Stream(h(s.0), true)) }
    }

    // ---- 2D / 3D copies (host, device and unified memory; not arrays) ----
    fn cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, SYNC) }
    }
    fn cuMemcpy2D_v2_ptds(c: *const CUDA_MEMCPY2D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, SYNC) }
    }
    fn cuMemcpy2DUnaligned_v2(c: *const CUDA_MEMCPY2D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, SYNC) }
    }
    fn cuMemcpy2DUnaligned_v2_ptds(c: *const CUDA_MEMCPY2D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, SYNC) }
    }
    fn cuMemcpy2DAsync_v2(c: *const CUDA_MEMCPY2D, s: CUstream) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpy2DAsync_v2_ptsz(c: *const CUDA_MEMCPY2D, s: CUstream) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_2d(c, Order::Stream(h(s.0), true)) }
    }
    fn cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_3d_desc(c, SYNC) }
    }
    fn cuMemcpy3D_v2_ptds(c: *const CUDA_MEMCPY3D) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_3d_desc(c, SYNC) }
    }
    fn cuMemcpy3DAsync_v2(c: *const CUDA_MEMCPY3D, s: CUstream) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_3d_desc(c, Order::Stream(h(s.0), false)) }
    }
    fn cuMemcpy3DAsync_v2_ptsz(c: *const CUDA_MEMCPY3D, s: CUstream) {
        // SAFETY: descriptor per the C contract.
        unsafe { copy_3d_desc(c, Order::Stream(h(s.0), true)) }
    }

    // ---- sets ----
    fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) {
        // SAFETY: device (or managed) memory resolved by the driver.
        unsafe { set(dst, 0, &[v], n, 1, SYNC) }
    }
    fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &[v], n, 1, SYNC) }
    }
    fn cuMemsetD8(dst: c_uint, v: u8, n: c_uint) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(u64::from(dst), 0, &[v], n as usize, 1, SYNC) }
    }
    fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, SYNC) }
    }
    fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, v: u16, n: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, SYNC) }
    }
    fn cuMemsetD16(dst: c_uint, v: u16, n: c_uint) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(u64::from(dst), 0, &v.to_ne_bytes(), n as usize, 1, SYNC) }
    }
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, SYNC) }
    }
    fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, SYNC) }
    }
    fn cuMemsetD32(dst: c_uint, v: c_uint, n: c_uint) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(u64::from(dst), 0, &v.to_ne_bytes(), n as usize, 1, SYNC) }
    }
    fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &[v], n, 1, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &[v], n, 1, Order::Stream(h(s.0), true)) }
    }
    fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, v: u16, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, Order::Stream(h(s.0), true)) }
    }
    fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, 0, &v.to_ne_bytes(), n, 1, Order::Stream(h(s.0), true)) }
    }
    fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &[v], w, rows, SYNC) }
    }
    fn cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &[v], w, rows, SYNC) }
    }
    fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, SYNC) }
    }
    fn cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, SYNC) }
    }
    fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, SYNC) }
    }
    fn cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, SYNC) }
    }
    fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &[v], w, rows, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &[v], w, rows, Order::Stream(h(s.0), true)) }
    }
    fn cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, Order::Stream(h(s.0), true)) }
    }
    fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, Order::Stream(h(s.0), false)) }
    }
    fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, rows: usize, s: CUstream) {
        // SAFETY: as cuMemsetD8_v2.
        unsafe { set(dst, pitch, &v.to_ne_bytes(), w, rows, Order::Stream(h(s.0), true)) }
    }

    // ---- pointers ----
    fn cuPointerGetAttribute(data: *mut c_void, attr: CUpointer_attribute, ptr: CUdeviceptr) {
        if data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `data` sized per the attribute (C contract).
        unsafe { pointer_attribute(data, attr, ptr, true) }
    }
    fn cuPointerGetAttributes(n: c_uint, attrs: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: CUdeviceptr) {
        if n == 0 || attrs.is_null() || data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: both arrays hold `n` entries (C contract).
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            if d.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `d` sized per its attribute (C contract).
            unsafe { pointer_attribute(d, a, ptr, false) }?;
        }
        Ok(())
    }
    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) {
        // SAFETY: optional out-pointers from the caller.
        unsafe { address_range(base, size, ptr) }
    }
    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, host: *mut c_void, flags: c_uint) {
        if flags != 0 || dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Unified addressing: the device sees host memory at its address.
        let i = drv()?
            .ptr_info(host as u64)
            .filter(|i| i.memory_type == CU_MEMORYTYPE_HOST)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let _ = i;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, host as u64) }
    }

    // ---- IPC ----
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, ptr: CUdeviceptr) {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.ipc_get_mem(ptr)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(handle, CUipcMemHandle { reserved: v }) }
    }
    fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.ipc_open_mem(&handle.reserved, flags)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, v) }
    }
    fn cuIpcOpenMemHandle(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.ipc_open_mem(&handle.reserved, flags)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, v) }
    }
    fn cuIpcCloseMemHandle(ptr: CUdeviceptr) { drv()?.ipc_close_mem(ptr) }
    fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, e: CUevent) {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.ipc_get_event(h(e.0))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(handle, CUipcEventHandle { reserved: v }) }
    }
    fn cuIpcOpenEventHandle(e: *mut CUevent, handle: CUipcEventHandle) {
        if e.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.ipc_open_event(&handle.reserved)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(e, CUevent(p(v))) }
    }
}
