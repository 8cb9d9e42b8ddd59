//! Exports bindings and JIT-compiling clients call besides allocating and
//! launching: stream and context queries, limits, peers, function
//! attributes, occupancy, images in NVIDIA's formats and linking, graph
//! memory nodes. The raw-pointer work of their C contracts is here; the
//! logic is `crate::query`'s.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use vgpu_cuda_abi::*;

use super::{cstr, h, inp, out, p, run};
use crate::driver::{self, drv, GraphNode, CU_STREAM_PER_THREAD, R};
use crate::image::{self, Format};
use crate::query::image_kernels;

/// The most an image or link input may be (a bound on what is read).
const MAX_IMAGE: u64 = 1 << 30;

/// Read `n` bytes at `p`.
///
/// Safety: `p` is valid for `n` bytes.
unsafe fn bytes<'a>(p: *const c_void, n: u64) -> R<&'a [u8]> {
    if p.is_null() || n > MAX_IMAGE {
        return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n as usize) })
}

/// Load a module from an image in memory of unknown length.
///
/// Safety: `image` is a valid image per `cuModuleLoadData`'s contract.
pub(super) unsafe fn load_image(image: *const c_void) -> R<u64> {
    // SAFETY: per this function's contract.
    unsafe { image_bytes(image, &mut load_image_bytes) }
}

/// Hand `load` the whole of an image in memory of unknown length: the
/// sim's text, PTX (NUL-terminated), a cubin (length from its ELF header)
/// or a fatbin (from its header), or a fatbin wrapper pointing at one.
///
/// Safety: `image` is a valid image per `cuModuleLoadData`'s contract.
pub(super) unsafe fn image_bytes(
    image: *const c_void,
    load: &mut dyn FnMut(&[u8]) -> R<u64>,
) -> R<u64> {
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    drv()?;
    // Up to 4 bytes, stopping at a NUL (a short text image ends there).
    let mut head = [0u8; 4];
    for (i, b) in head.iter_mut().enumerate() {
        // SAFETY: the image is readable up to its NUL or its own length;
        // neither binary magic contains a NUL, so no read passes either.
        *b = unsafe { *image.cast::<u8>().add(i) };
        if *b == 0 {
            break;
        }
    }
    match image::format(&head) {
        Some(Format::Cubin) => {
            // SAFETY: a cubin starts with a 64-byte ELF header.
            let hdr = unsafe { bytes(image, 64) }?;
            let read = |o: u64, n: usize| {
                // SAFETY: the section table lies within the cubin, whose
                // header says where (bounded by MAX_IMAGE).
                unsafe { bytes(image, o.checked_add(n as u64)?) }
                    .ok()
                    .map(|b| b[o as usize..].to_vec())
            };
            let len = image::elf_len(hdr, read).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
            // SAFETY: the cubin's extent from its own headers.
            let all = unsafe { bytes(image, len) }?;
            load(all)
        }
        Some(Format::Fatbin) => {
            // SAFETY: a fatbin starts with a 16-byte header.
            let hdr = unsafe { bytes(image, 16) }?;
            let len = image::fatbin_len(hdr).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
            // SAFETY: the fatbin's extent from its own header.
            let all = unsafe { bytes(image, len) }?;
            load(all)
        }
        Some(Format::FatbinWrapper) => {
            // SAFETY: `{ int magic; int version; const void *data; ... }`.
            let data = unsafe {
                image
                    .cast::<u8>()
                    .add(8)
                    .cast::<*const c_void>()
                    .read_unaligned()
            };
            if data.is_null() || data == image {
                return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
            }
            // SAFETY: the wrapper's data pointer names the fatbin.
            unsafe { image_bytes(data, load) }
        }
        _ => {
            // SAFETY: text images are NUL-terminated.
            let t = unsafe { CStr::from_ptr(image.cast::<c_char>()) };
            load(t.to_bytes())
        }
    }
}

/// Load a module from a whole image.
pub(super) fn load_image_bytes(b: &[u8]) -> R<u64> {
    let d = drv()?;
    match image::format(&b[..b.len().min(64)]) {
        Some(Format::SimText) => {
            let t = std::str::from_utf8(b).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)?;
            d.module_load(t)
        }
        Some(f @ (Format::Ptx | Format::Cubin | Format::Fatbin)) => {
            d.module_from_kernels(image_kernels(f, b)?)
        }
        _ => Err(CUresult::CUDA_ERROR_INVALID_IMAGE),
    }
}

/// An image or link input from a file, bounded.
pub(super) fn read_image_file(path: &str) -> R<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err(CUresult::CUDA_ERROR_FILE_NOT_FOUND);
    }
    let mut v = Vec::new();
    f.take(MAX_IMAGE)
        .read_to_end(&mut v)
        .map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
    Ok(v)
}

/// Stream -> (priority, flags, context, device ordinal, id).
fn stream_facts(s: CUstream) -> R<(i32, u32, u64, i32, u64)> {
    let d = drv()?;
    let sid = h(s.0);
    let (ctx, dev) = d.stream_ctx(sid)?;
    let (prio, flags) =
        if sid == 0 || sid == driver::CU_STREAM_LEGACY || sid == CU_STREAM_PER_THREAD {
            (0, 0)
        } else {
            let g = d.lock();
            let st = g
                .streams
                .get(&sid)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (st.priority, st.flags)
        };
    Ok((prio, flags, ctx, d.ordinal(dev), sid))
}

/// Safety: `deps` holds `n` node handles (C contract).
unsafe fn deps_of(deps: *const CUgraphNode, n: usize) -> R<Vec<u64>> {
    if n > 0 && deps.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `deps` holds `n` handles, checked non-null.
    Ok((0..n).map(|i| h(unsafe { *deps.add(i) }.0)).collect())
}

unsafe fn link_add_data(state: CUlinkState, ty: c_uint, data: *mut c_void, size: usize) -> R {
    drv()?;
    // SAFETY: `data` holds `size` bytes (C contract).
    let b = unsafe { bytes(data, size as u64) }?;
    drv()?.link_add(h(state.0), ty, b)
}

unsafe fn link_add_file(state: CUlinkState, ty: c_uint, path: *const c_char) -> R {
    // SAFETY: NUL-terminated path from the caller; null rejected.
    let path = unsafe { cstr(path) }?;
    let d = drv()?;
    let b = read_image_file(path)?;
    d.link_add(h(state.0), ty, &b)
}

unsafe fn link_create(state: *mut CUlinkState) -> R {
    if state.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // JIT options (log buffers, optimization level) change nothing here.
    let id = drv()?.link_create()?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(state, CUlinkState(p(id))) }
}

cu! {
    // ---- streams and contexts ----
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        drv()?.ctx()?;
        // As an A100: priorities 0 (lowest) to -5 (highest); either
        // pointer may be NULL.
        if !least.is_null() {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { out(least, 0) }?;
        }
        if !greatest.is_null() {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { out(greatest, -5) }?;
        }
        Ok(())
    }
    fn cuStreamGetPriority(s: CUstream, prio: *mut c_int) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(prio, f.0) }
    }
    fn cuStreamGetPriority_ptsz(s: CUstream, prio: *mut c_int) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(prio, f.0) }
    }
    fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(flags, f.1) }
    }
    fn cuStreamGetFlags_ptsz(s: CUstream, flags: *mut c_uint) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(flags, f.1) }
    }
    fn cuStreamGetCtx(s: CUstream, ctx: *mut CUcontext) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(ctx, CUcontext(p(f.2))) }
    }
    fn cuStreamGetCtx_ptsz(s: CUstream, ctx: *mut CUcontext) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(ctx, CUcontext(p(f.2))) }
    }
    fn cuStreamGetCtx_v2(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) {
        let f = stream_facts(s)?;
        if ctx.is_null() && green.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // No green contexts: a stream belongs to a regular context.
        // SAFETY: non-null optional out-pointers from the caller.
        unsafe {
            if !ctx.is_null() {
                out(ctx, CUcontext(p(f.2)))?;
            }
            if !green.is_null() {
                out(green, CUgreenCtx::NULL)?;
            }
        }
        Ok(())
    }
    fn cuStreamGetCtx_v2_ptsz(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) {
        // SAFETY: as cuStreamGetCtx_v2.
        unsafe { cuStreamGetCtx_v2_impl(s, ctx, green) }
    }
    fn cuStreamGetDevice(s: CUstream, dev: *mut CUdevice) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(dev, f.3) }
    }
    fn cuStreamGetDevice_ptsz(s: CUstream, dev: *mut CUdevice) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(dev, f.3) }
    }
    fn cuStreamGetId(s: CUstream, id: *mut u64) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(id, f.4) }
    }
    fn cuStreamGetId_ptsz(s: CUstream, id: *mut u64) {
        let f = stream_facts(s)?;
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(id, f.4) }
    }
    fn cuCtxGetLimit(v: *mut usize, limit: CUlimit) {
        if v.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let x = drv()?.ctx_limit(limit)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(v, x as usize) }
    }
    fn cuCtxSetLimit(limit: CUlimit, v: usize) { drv()?.set_ctx_limit(limit, v as u64) }
    fn cuCtxGetCacheConfig(cfg: *mut CUfunc_cache) {
        if cfg.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let c = drv()?.cache_config()?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(cfg, c) }
    }
    fn cuCtxSetCacheConfig(cfg: CUfunc_cache) { drv()?.set_cache_config(cfg) }
    fn cuCtxGetSharedMemConfig(cfg: *mut c_uint) {
        drv()?.ctx()?;
        // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE, fixed since Maxwell.
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(cfg, 1) }
    }

    // ---- devices and peers ----
    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        if can.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.can_access_peer(dev, peer)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(can, c_int::from(v)) }
    }
    fn cuDeviceGetP2PAttribute(v: *mut c_int, attr: CUdevice_P2PAttribute, src: CUdevice, dst: CUdevice) {
        if v.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?;
        if d.device(src)? == d.device(dst)? {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        // NVLink through NVSwitch: access, atomics and array access, rank 0.
        let x = match attr {
            CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK => 0,
            CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED
            | CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
            | CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED => 1,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(v, x) }
    }
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        drv()?.enable_peer(h(peer.0), true)
    }
    fn cuCtxDisablePeerAccess(peer: CUcontext) { drv()?.enable_peer(h(peer.0), false) }
    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
        if dev.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated string from the caller; null rejected.
        let want = unsafe { cstr(id) }?.trim().to_ascii_lowercase();
        let d = drv()?;
        let hit = (0..d.device_count() as i32).find(|o| {
            d.device(*o).is_ok_and(|phys| {
                let full = vgpu_sim::machine::pci_bus_id(phys);
                want == full || want == full[5..] || want == format!("0000{full}")
            })
        });
        let o = hit.ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dev, o) }
    }

    // ---- functions and occupancy ----
    fn cuFuncGetAttribute(v: *mut c_int, attr: CUfunction_attribute, f: CUfunction) {
        if v.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let x = drv()?.func_attribute(h(f.0), attr)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(v, x) }
    }
    fn cuFuncSetAttribute(f: CUfunction, attr: CUfunction_attribute, v: c_int) {
        drv()?.set_func_attribute(h(f.0), attr, v)
    }
    fn cuFuncSetCacheConfig(f: CUfunction, cfg: CUfunc_cache) {
        let d = drv()?;
        d.func_name(h(f.0))?;
        if cfg > CU_FUNC_CACHE_PREFER_EQUAL {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) {
        if name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = drv()?.func_name(h(f.0))?;
        // Interned for the life of the process, as the driver's own names are.
        let c = intern(&n);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(name, c) }
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize) {
        if n.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.occupancy(h(f.0), block, smem)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(n, v) }
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: CUfunction, block: c_int, smem: usize, flags: c_uint) {
        // CU_OCCUPANCY_DEFAULT or _DISABLE_CACHING_OVERRIDE.
        if n.is_null() || flags > 1 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.occupancy(h(f.0), block, smem)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(n, v) }
    }

    // ---- images and linking ----
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, nopts: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) {
        if module.is_null() || (nopts > 0 && (opts.is_null() || vals.is_null())) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // JIT options (log buffers, optimization level) change nothing here.
        // SAFETY: an image in memory, per the C contract.
        let m = unsafe { load_image(image) }?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(module, CUmodule(p(m))) }
    }
    fn cuModuleLoadFatBinary(module: *mut CUmodule, fat: *const c_void) {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fatbin (or its wrapper) in memory, per the C contract.
        let m = unsafe { load_image(fat) }?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(module, CUmodule(p(m))) }
    }
    fn cuLinkCreate(n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void, state: *mut CUlinkState) {
        let _ = (n, opts, vals);
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { link_create(state) }
    }
    fn cuLinkCreate_v2(n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void, state: *mut CUlinkState) {
        let _ = (n, opts, vals);
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { link_create(state) }
    }
    fn cuLinkAddData(state: CUlinkState, ty: CUjitInputType, data: *mut c_void, size: usize, name: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) {
        let _ = (name, n, opts, vals);
        // SAFETY: `data` holds `size` bytes (C contract).
        unsafe { link_add_data(state, ty, data, size) }
    }
    fn cuLinkAddData_v2(state: CUlinkState, ty: CUjitInputType, data: *mut c_void, size: usize, name: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) {
        let _ = (name, n, opts, vals);
        // SAFETY: `data` holds `size` bytes (C contract).
        unsafe { link_add_data(state, ty, data, size) }
    }
    fn cuLinkAddFile(state: CUlinkState, ty: CUjitInputType, path: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) {
        let _ = (n, opts, vals);
        // SAFETY: NUL-terminated path (C contract).
        unsafe { link_add_file(state, ty, path) }
    }
    fn cuLinkAddFile_v2(state: CUlinkState, ty: CUjitInputType, path: *const c_char, n: c_uint, opts: *mut c_uint, vals: *mut *mut c_void) {
        let _ = (n, opts, vals);
        // SAFETY: NUL-terminated path (C contract).
        unsafe { link_add_file(state, ty, path) }
    }
    fn cuLinkComplete(state: CUlinkState, cubin: *mut *mut c_void, size: *mut usize) {
        if cubin.is_null() || size.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (addr, len) = drv()?.link_complete(h(state.0))?;
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            out(cubin, addr as *mut c_void)?;
            out(size, len)
        }
    }
    fn cuLinkDestroy(state: CUlinkState) { drv()?.link_destroy(h(state.0)) }

    // ---- graph memory nodes ----
    fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
        if node.is_null() || params.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null in/out struct from the caller.
        let prm = unsafe { inp(params) }?;
        // SAFETY: `deps` holds `n` handles (C contract).
        let deps = unsafe { deps_of(deps, n) }?;
        let pr = prm.poolProps;
        if pr.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || pr.handleTypes != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (id, dptr) = drv()?.graph_add_mem_alloc(h(g.0), &deps, pr.location.type_, pr.location.id, prm.bytesize as u64)?;
        // SAFETY: non-null out-pointers from the caller (dptr is an out field).
        unsafe {
            (*params).dptr = dptr;
            out(node, CUgraphNode(p(id)))
        }
    }
    fn cuGraphAddMemFreeNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, dptr: CUdeviceptr) {
        if node.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `deps` holds `n` handles (C contract).
        let deps = unsafe { deps_of(deps, n) }?;
        let id = drv()?.graph_add_mem_free(h(g.0), &deps, dptr)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(node, CUgraphNode(p(id))) }
    }
    fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
        if params.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let GraphNode::MemAlloc { dptr, size, dev } = drv()?.graph_node(h(node.0))? else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let ord = drv()?.ordinal(dev);
        // SAFETY: non-null out-struct from the caller; zeroed is a valid
        // value of this plain C struct.
        unsafe {
            let mut v: CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
            v.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            v.poolProps.location.type_ = CU_MEM_LOCATION_TYPE_DEVICE;
            v.poolProps.location.id = ord;
            v.bytesize = size as usize;
            v.dptr = dptr;
            out(params, v)
        }
    }
    fn cuGraphMemFreeNodeGetParams(node: CUgraphNode, dptr: *mut CUdeviceptr) {
        let GraphNode::MemFree { dptr: d } = drv()?.graph_node(h(node.0))? else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: out-pointer from the caller; null rejected.
        unsafe { out(dptr, d) }
    }
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, v: *mut c_void) {
        if v.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let x = drv()?.graph_mem_attr(dev, attr)?;
        // SAFETY: a cuuint64_t per cuda.h; non-null.
        unsafe { out(v.cast::<u64>(), x) }
    }
    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, v: *mut c_void) {
        // SAFETY: a cuuint64_t per cuda.h; null rejected.
        let x = unsafe { inp(v.cast::<u64>()) }?;
        drv()?.reset_graph_mem_high(dev, attr, x)
    }
    fn cuDeviceGraphMemTrim(dev: CUdevice) { drv()?.graph_trim(dev) }
}

unsafe fn cuStreamGetCtx_v2_impl(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) -> R {
    // SAFETY: same contract as the exported entry.
    match unsafe { cuStreamGetCtx_v2(s, ctx, green) } {
        CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// A NUL-terminated copy of `s` that lives as long as the process.
pub(super) fn intern(s: &str) -> *const c_char {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashMap<String, std::ffi::CString>>> = Mutex::new(None);
    let mut g = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    m.entry(s.to_string())
        .or_insert_with(|| std::ffi::CString::new(s.replace('\0', "")).unwrap_or_default())
        .as_ptr()
}
