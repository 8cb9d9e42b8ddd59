//! The exported C ABI (`cuda.h`, CUDA 12.9 names and versions). Every
//! export is `catch_unwind`-guarded and thin over `driver`; the raw-pointer
//! work of the C contract lives here and only here.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vgpu_cuda_abi::*;
use vgpu_sim::log;

use crate::driver::{self, drv, Driver, KernelNode, DRIVER_VERSION, R, T_ARRAY, T_MIPMAP};

fn run(name: &str, f: impl FnOnce() -> R) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => {
            if log::enabled(log::DEBUG) {
                log::log(log::DEBUG, &format!("{name} -> {e:?}"));
            }
            e
        }
        Err(_) => {
            log::log(
                log::ERROR,
                &format!("{name}: internal panic caught; returning CUDA_ERROR_UNKNOWN"),
            );
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Guarded exports of the list's entries (`vgpu_cuda_abi::guarded_exports!`).
macro_rules! cu {
    ($($t:tt)*) => {
        vgpu_cuda_abi::guarded_exports! { guard: run, returns: CUresult, result: R; $($t)* }
    };
}

/// Write `v` through an out-pointer from the caller.
///
/// Safety: `p` is null or valid for a write of `T` (the C contract).
unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes per this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Read an in-struct from the caller.
///
/// Safety: `p` is null or valid for a read of `T`.
unsafe fn inp<T: Copy>(p: *const T) -> R<T> {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for reads per this function's contract.
    Ok(unsafe { p.read() })
}

/// Safety: `p` is null or a NUL-terminated string.
unsafe fn cstr<'a>(p: *const c_char) -> R<&'a str> {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Copy `s` into a caller buffer of `len` bytes, truncating, NUL-terminated.
///
/// Safety: `buf` is null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_int, s: &str) -> R {
    if buf.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `buf` holds `len` bytes and we write n + 1 <= len of them;
    // `s` and `buf` cannot overlap (`s` is ours).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// The per-block time a "spin"-style kernel takes from its first parameter.
///
/// Safety: `params` is null or the kernelParams array of a launch, whose
/// first entry (if any) points at the kernel's first argument.
unsafe fn time_param(f: u64, params: *mut *mut c_void) -> R<Option<u64>> {
    let d = drv()?;
    if params.is_null() || !d.takes_time_param(f) {
        return Ok(None);
    }
    // SAFETY: per contract, params[0] is readable when params is non-null.
    let first = unsafe { *params };
    if first.is_null() {
        return Ok(None);
    }
    // SAFETY: the kernel's declared first parameter is a u64 (docs/sim.md);
    // read unaligned since C may pack it anywhere.
    Ok(Some(unsafe { first.cast::<u64>().read_unaligned() }))
}

fn h(p: *mut c_void) -> u64 {
    p as u64
}

fn p(v: u64) -> *mut c_void {
    v as *mut c_void
}

fn attribute(dev: usize, attr: c_int) -> R<c_int> {
    let d = drv()?;
    let rec = d.m.device(dev).map_err(driver::machine_err)?;
    let v: i64 = match attr {
        1 => 1024,                                        // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                    // MAX_BLOCK_DIM_X/Y
        4 => 64,                                          // MAX_BLOCK_DIM_Z
        5 => i32::MAX as i64,                             // MAX_GRID_DIM_X
        6 | 7 => 65535,                                   // MAX_GRID_DIM_Y/Z
        8 => 49152,                                       // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                                       // TOTAL_CONSTANT_MEMORY
        10 => 32,                                         // WARP_SIZE
        11 => i32::MAX as i64,                            // MAX_PITCH
        12 => 65536,                                      // MAX_REGISTERS_PER_BLOCK
        13 => 1_410_000,                                  // CLOCK_RATE (kHz)
        14 => 512,                                        // TEXTURE_ALIGNMENT
        15 => 1,                                          // GPU_OVERLAP
        16 => i64::from(rec.sms),                         // MULTIPROCESSOR_COUNT
        17 | 18 => 0,                                     // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,                                          // CAN_MAP_HOST_MEMORY
        20 => 0,                                          // COMPUTE_MODE default
        31 | 32 => 1,                                     // CONCURRENT_KERNELS, ECC_ENABLED
        33 => i64::from(vgpu_sim::machine::pci_bus(dev)), // PCI_BUS_ID
        34 => 0,                                          // PCI_DEVICE_ID (slot)
        35 => 0,                                          // TCC_DRIVER
        36 => 1_593_000,                                  // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                                       // GLOBAL_MEMORY_BUS_WIDTH
        38 => 40 << 20,                                   // L2_CACHE_SIZE
        39 => i64::from(rec.max_threads_per_sm),          // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,                                          // ASYNC_ENGINE_COUNT
        41 => 1,                                          // UNIFIED_ADDRESSING
        50 => 0,                                          // PCI_DOMAIN_ID
        75 => i64::from(rec.cc_major),                    // COMPUTE_CAPABILITY_MAJOR
        76 => i64::from(rec.cc_minor),                    // COMPUTE_CAPABILITY_MINOR
        81 => 167_936,                                    // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                                      // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                                          // MANAGED_MEMORY
        84 => 0,                                          // MULTI_GPU_BOARD
        89 | 95 => 1,   // CONCURRENT_MANAGED_ACCESS, COOPERATIVE_LAUNCH
        97 => 166_912,  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 | 115 => 1, // VMM supported, MEMORY_POOLS_SUPPORTED
        106 => 32,      // MAX_BLOCKS_PER_MULTIPROCESSOR
        // Other attributes of cuda.h 12.9 read as 0 ("not supported").
        a if (1..=150).contains(&a) => 0,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(v as c_int)
}

/// (code, name, description) for `cuGetErrorName` / `cuGetErrorString`.
static ERRORS: &[(u32, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        34,
        c"CUDA_ERROR_STUB_LIBRARY",
        c"CUDA driver is a stub library",
    ),
    (
        46,
        c"CUDA_ERROR_DEVICE_UNAVAILABLE",
        c"CUDA-capable device(s) is/are busy or unavailable",
    ),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        200,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        202,
        c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
        c"context already current",
    ),
    (
        205,
        c"CUDA_ERROR_MAP_FAILED",
        c"mapping of buffer object failed",
    ),
    (
        206,
        c"CUDA_ERROR_UNMAP_FAILED",
        c"unmapping of buffer object failed",
    ),
    (
        208,
        c"CUDA_ERROR_ALREADY_MAPPED",
        c"resource already mapped",
    ),
    (211, c"CUDA_ERROR_NOT_MAPPED", c"resource not mapped"),
    (
        300,
        c"CUDA_ERROR_INVALID_SOURCE",
        c"device kernel image is invalid",
    ),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (
        302,
        c"CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
        c"shared object symbol not found",
    ),
    (
        303,
        c"CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
        c"shared object initialization failed",
    ),
    (
        304,
        c"CUDA_ERROR_OPERATING_SYSTEM",
        c"OS call failed or operation not supported on this OS",
    ),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        401,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        701,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        708,
        c"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        c"primary context active",
    ),
    (
        709,
        c"CUDA_ERROR_CONTEXT_IS_DESTROYED",
        c"context is destroyed",
    ),
    (
        712,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        713,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        720,
        c"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
        c"too many blocks in cooperative launch",
    ),
    (800, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (
        802,
        c"CUDA_ERROR_SYSTEM_NOT_READY",
        c"system not yet initialized",
    ),
    (
        803,
        c"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        c"system has unsupported display driver / cuda driver combination",
    ),
    (909, c"CUDA_ERROR_TIMEOUT", c"timeout"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// Safety: `ps` is null or valid for a pointer write.
unsafe fn error_str(e: CUresult, ps: *mut *const c_char, name: bool) -> R {
    if ps.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let hit = ERRORS.iter().find(|(c, _, _)| *c == e.0);
    let s = hit.map(|(_, n, d)| if name { n.as_ptr() } else { d.as_ptr() });
    // SAFETY: `ps` is non-null and valid for a write per the contract.
    unsafe { out(ps, s.unwrap_or(std::ptr::null())) }?;
    hit.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

fn array_bytes(w: u64, h: u64, d: u64, format: c_uint, channels: c_uint) -> Option<u64> {
    let elem = array_format_bytes(format)?;
    if w == 0 || !matches!(channels, 1 | 2 | 4) {
        return None;
    }
    w.checked_mul(h.max(1))?
        .checked_mul(d.max(1))?
        .checked_mul(elem * u64::from(channels))
}

fn mipmap_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> Option<u64> {
    if levels == 0 || levels > 32 {
        return None;
    }
    let (w, h, z) = (d.Width as u64, d.Height as u64, d.Depth as u64);
    let mut total = 0u64;
    for l in 0..levels {
        let lw = (w >> l).max(1);
        let lh = if h == 0 { 0 } else { (h >> l).max(1) };
        let lz = if z == 0 { 0 } else { (z >> l).max(1) };
        total = total.checked_add(array_bytes(lw, lh, lz, d.Format, d.NumChannels)?)?;
    }
    Some(total)
}

// Shared bodies of entries that have several exported versions.

unsafe fn launch_kernel(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    params: *mut *mut c_void,
    pt: bool,
    cooperative: bool,
) -> R {
    let d = drv()?;
    let fid = h(f.0);
    // SAFETY: `params` is the launch's kernelParams array (C contract).
    let t = unsafe { time_param(fid, params) }?;
    let k = KernelNode {
        func: fid,
        grid,
        block,
        param_ns: t,
    };
    d.launch(&k, h(stream.0), pt, cooperative)
}

fn end_capture(s: CUstream, g: *mut CUgraph) -> R {
    if g.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let graph = drv()?.end_capture(h(s.0))?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(g, CUgraph(p(graph))) }
}

fn is_capturing(s: CUstream, st: *mut CUstreamCaptureStatus) -> R {
    if st.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let on = drv()?.is_capturing(h(s.0))?;
    let v = if on {
        CU_STREAM_CAPTURE_STATUS_ACTIVE
    } else {
        CU_STREAM_CAPTURE_STATUS_NONE
    };
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(st, v) }
}

unsafe fn launch_kernel_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    pt: bool,
) -> R {
    // SAFETY: `config` is null or a valid CUlaunchConfig (C contract).
    let c = unsafe { inp(config) }?;
    // SAFETY: as for cuLaunchKernel.
    unsafe {
        launch_kernel(
            f,
            [c.gridDimX, c.gridDimY, c.gridDimZ],
            [c.blockDimX, c.blockDimY, c.blockDimZ],
            c.hStream,
            params,
            pt,
            false,
        )
    }
}

unsafe fn mem_alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<CUmemoryPool>,
    s: CUstream,
) -> R {
    if dptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    let pool = match pool {
        Some(pl) if pl.is_null() => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        Some(pl) => Some(h(pl.0)),
        None => None,
    };
    let v = d.pool_alloc(size as u64, pool, h(s.0))?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(dptr, v) }
}

unsafe fn ctx_pop(pctx: *mut CUcontext) -> R {
    drv()?;
    let c = driver::pop_current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pctx, CUcontext(p(c))) }?;
    }
    Ok(())
}

unsafe fn graph_add_kernel(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    n: KernelNode,
    params: *mut *mut c_void,
) -> R {
    if node.is_null() || (ndeps > 0 && deps.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    let deps: Vec<u64> = (0..ndeps)
        // SAFETY: `deps` holds `ndeps` handles (C contract), checked non-null.
        .map(|i| h(unsafe { *deps.add(i) }.0))
        .collect();
    // SAFETY: `params` is the node's kernelParams array (C contract).
    let t = unsafe { time_param(n.func, params) }?;
    let id = d.graph_add_kernel(h(graph.0), &deps, KernelNode { param_ns: t, ..n })?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(node, CUgraphNode(p(id))) }
}

unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> R {
    if symbol.is_null() || pfn.is_null() || flags > 3 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, NUL-terminated per the C contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (addr, st) = match crate::procaddr::lookup(name, version, flags) {
        Ok(e) => (e.addr as *mut c_void, CU_GET_PROC_ADDRESS_SUCCESS),
        Err(st) => (std::ptr::null_mut(), st),
    };
    // SAFETY: `pfn` non-null; `status` optional (checked inside `out`).
    unsafe { out(pfn, addr) }?;
    if !status.is_null() {
        // SAFETY: non-null optional out-pointer.
        unsafe { out(status, st) }?;
    }
    if st == CU_GET_PROC_ADDRESS_SUCCESS {
        Ok(())
    } else {
        // What the 12.x driver returns (and cudart expects) for both
        // not-found and version-not-sufficient.
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    }
}

cu! {
    // ---- init, version, errors, entry points ----
    fn cuInit(flags: c_uint) { driver::init(flags) }
    fn cuDriverGetVersion(v: *mut c_int) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(v, DRIVER_VERSION) }
    }
    fn cuGetErrorName(e: CUresult, ps: *mut *const c_char) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { error_str(e, ps, true) }
    }
    fn cuGetErrorString(e: CUresult, ps: *mut *const c_char) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { error_str(e, ps, false) }
    }
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        // SAFETY: pointers per cuda.h's contract; nulls are rejected.
        unsafe { get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
    }
    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        status: *mut CUdriverProcAddressQueryResult
    ) {
        // SAFETY: pointers per cuda.h's contract; nulls are rejected.
        unsafe { get_proc_address(symbol, pfn, version, flags, status) }
    }

    // ---- devices ----
    fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
        if dev.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        drv()?.device(ordinal)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dev, ordinal as CUdevice) }
    }
    fn cuDeviceGetCount(n: *mut c_int) {
        let c = drv()?.device_count() as c_int;
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(n, c) }
    }
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = drv()?;
        let s = d.m.device_name(d.device(dev)?).map_err(driver::machine_err)?;
        // SAFETY: `name` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(name, len, &s) }
    }
    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let d = drv()?.device(dev)?;
        let b = vgpu_sim::Machine::device_uuid(d).map(|x| x as c_char);
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(uuid, CUuuid { bytes: b }) }
    }
    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        // SAFETY: same contract as the v1 entry.
        unsafe { cuDeviceGetUuid_impl(uuid, dev) }
    }
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let d = drv()?;
        let m = d.m.device(d.device(dev)?).map_err(driver::machine_err)?.memory_bytes;
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(bytes, m as usize) }
    }
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
        let d = drv()?;
        let m = d.m.device(d.device(dev)?).map_err(driver::machine_err)?.memory_bytes;
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(bytes, m.min(u64::from(c_uint::MAX)) as c_uint) }
    }
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        if pi.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?.device(dev)?;
        let v = attribute(d, attrib)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pi, v) }
    }
    fn cuDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: CUdevice) {
        let d = drv()?.device(dev)?;
        // SAFETY: `buf` holds `len` bytes (C contract); null rejected.
        unsafe { put_str(buf, len, &vgpu_sim::machine::pci_bus_id(d)) }
    }
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        if pool.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.default_pool(dev)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pool, CUmemoryPool(p(id))) }
    }

    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        if pool.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.current_pool(dev)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pool, CUmemoryPool(p(id))) }
    }
    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) {
        drv()?.set_current_pool(dev, h(pool.0))
    }
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) {
        // SAFETY: in-struct from the caller; null is rejected.
        let pr = unsafe { inp(props) }?;
        if pool.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.pool_create(pr.allocType, pr.location.type_, pr.location.id, pr.maxSize as u64)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pool, CUmemoryPool(p(id))) }
    }
    fn cuMemPoolSetAccess(pool: CUmemoryPool, map: *const CUmemAccessDesc, count: usize) {
        if map.is_null() || count == 0 || count > 64 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let locs: Vec<(u32, i32, u32)> = (0..count)
            .map(|i| {
                // SAFETY: `map` holds `count` descriptors (C contract).
                let d = unsafe { map.add(i).read() };
                (d.location.type_, d.location.id, d.flags)
            })
            .collect();
        drv()?.pool_set_access(h(pool.0), &locs)
    }
    fn cuMemPoolGetAccess(flags: *mut c_uint, pool: CUmemoryPool, location: *mut CUmemLocation) {
        // SAFETY: in-struct from the caller; null is rejected.
        let loc = unsafe { inp(location) }?;
        if flags.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let f = drv()?.pool_get_access(h(pool.0), loc.type_, loc.id)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(flags, f) }
    }
    fn cuMemPoolDestroy(pool: CUmemoryPool) { drv()?.pool_destroy(h(pool.0)) }
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) { drv()?.pool_trim(h(pool.0), keep as u64) }

    // ---- primary contexts ----
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let c = drv()?.primary_retain(dev)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pctx, CUcontext(p(c))) }
    }
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { drv()?.primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { drv()?.primary_release(dev) }
    fn cuDevicePrimaryCtxReset(dev: CUdevice) { drv()?.primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) { drv()?.primary_reset(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) { drv()?.primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) { drv()?.primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        if flags.is_null() || active.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (f, a) = drv()?.primary_state(dev)?;
        // SAFETY: both out-pointers are non-null, from the caller.
        unsafe {
            out(flags, f)?;
            out(active, c_int::from(a))
        }
    }

    // ---- contexts ----
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        // SAFETY: same contract as _v2.
        unsafe { ctx_create(pctx, flags, dev) }
    }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { ctx_create(pctx, flags, dev) }
    }
    fn cuCtxCreate_v3(
        pctx: *mut CUcontext,
        params: *mut CUexecAffinityParam,
        nparams: c_int,
        flags: c_uint,
        dev: CUdevice
    ) {
        if nparams < 0 || (nparams > 0 && params.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Execution affinity (SM partitions) is not simulated.
        if nparams > 0 {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { ctx_create(pctx, flags, dev) }
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) {
        if !params.is_null() {
            // SAFETY: non-null, a CUctxCreateParams per the C contract.
            let prm = unsafe { inp(params) }?;
            if prm.numExecAffinityParams > 0 || !prm.cigParams.is_null() {
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { ctx_create(pctx, flags, dev) }
    }
    fn cuCtxDestroy(ctx: CUcontext) { drv()?.ctx_destroy(h(ctx.0)) }
    fn cuCtxDestroy_v2(ctx: CUcontext) { drv()?.ctx_destroy(h(ctx.0)) }
    fn cuCtxSetCurrent(ctx: CUcontext) {
        let d = drv()?;
        if ctx.is_null() {
            driver::set_current(None);
            return Ok(());
        }
        d.ctx_of(h(ctx.0))?;
        driver::set_current(Some(h(ctx.0)));
        Ok(())
    }
    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        drv()?;
        let c = driver::current_ctx().unwrap_or(0);
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(pctx, CUcontext(p(c))) }
    }
    fn cuCtxPushCurrent(ctx: CUcontext) { drv()?.ctx_of(h(ctx.0))?; driver::push_current(h(ctx.0)) }
    fn cuCtxPushCurrent_v2(ctx: CUcontext) { drv()?.ctx_of(h(ctx.0))?; driver::push_current(h(ctx.0)) }
    fn cuCtxPopCurrent(pctx: *mut CUcontext) {
        // SAFETY: optional out-pointer from the caller.
        unsafe { ctx_pop(pctx) }
    }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        // SAFETY: optional out-pointer from the caller.
        unsafe { ctx_pop(pctx) }
    }
    fn cuCtxGetDevice(dev: *mut CUdevice) {
        if dev.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let drv = drv()?;
        let (_, d) = drv.ctx()?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dev, drv.ordinal(d) as CUdevice) }
    }
    fn cuCtxGetFlags(flags: *mut c_uint) {
        if flags.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?;
        let (c, _) = d.ctx()?;
        let f = d.ctx_of(c)?.flags;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(flags, f) }
    }
    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) {
        if version.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?;
        if ctx.is_null() { d.ctx()?; } else { d.ctx_of(h(ctx.0))?; }
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(version, 3020) }
    }
    fn cuCtxSynchronize() { drv()?.ctx_synchronize() }

    // ---- memory ----
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        if free.is_null() || total.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = drv()?.mem_info()?;
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    }
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        if free.is_null() || total.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = drv()?.mem_info()?;
        let c = |v: u64| v.min(u64::from(c_uint::MAX)) as c_uint;
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            out(free, c(f))?;
            out(total, c(t))
        }
    }
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.mem_alloc(size as u64, false)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, v) }
    }
    fn cuMemAlloc(dptr: *mut c_uint, size: c_uint) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.mem_alloc(u64::from(size), true)?;
        // SAFETY: non-null out-pointer; v1 addresses fit 32 bits.
        unsafe { out(dptr, v as c_uint) }
    }
    fn cuMemFree_v2(dptr: CUdeviceptr) { drv()?.mem_free(dptr) }
    fn cuMemFree(dptr: c_uint) { drv()?.mem_free(u64::from(dptr)) }
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let pt = (width as u64).div_ceil(512) * 512;
        let size = pt.checked_mul(height as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let v = drv()?.mem_alloc(size, false)?;
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            out(dptr, v)?;
            out(pitch, pt as usize)
        }
    }
    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) {
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let pt = u64::from(width).div_ceil(512) * 512;
        let v = drv()?.mem_alloc(pt * u64::from(height), true)?;
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            out(dptr, v as c_uint)?;
            out(pitch, pt as c_uint)
        }
    }
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.mem_alloc_managed(size as u64, flags)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(dptr, v) }
    }
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
        if pp.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.host_alloc(size as u64)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pp, v as *mut c_void) }
    }
    fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) {
        if pp.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.host_alloc(u64::from(size))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pp, v as *mut c_void) }
    }
    fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) {
        if pp.is_null() || flags & !0x7 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.host_alloc(size as u64)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pp, v as *mut c_void) }
    }
    fn cuMemFreeHost(ptr: *mut c_void) { drv()?.host_free(ptr as usize) }
    fn cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: c_uint) {
        drv()?.host_register(ptr as usize, size, flags)
    }
    fn cuMemHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) {
        drv()?.host_register(ptr as usize, size, flags)
    }
    fn cuMemHostUnregister(ptr: *mut c_void) { drv()?.host_unregister(ptr as usize) }

    // ---- stream-ordered allocation ----
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { mem_alloc_async(dptr, size, None, s) }
    }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        // SAFETY: as cuMemAllocAsync.
        unsafe { mem_alloc_async(dptr, size, None, s) }
    }
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { mem_alloc_async(dptr, size, Some(pool), s) }
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        // SAFETY: as cuMemAllocFromPoolAsync.
        unsafe { mem_alloc_async(dptr, size, Some(pool), s) }
    }
    fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) { drv()?.pool_free(dptr, h(s.0)) }
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) { drv()?.pool_free(dptr, h(s.0)) }
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_uint, value: *mut c_void) {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?;
        let mut g = d.lock();
        let pl = Driver::pool_mut(&mut g, h(pool.0))?;
        let v64 = match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                let v = pl.reuse[(attr - 1) as usize];
                // SAFETY: the reuse attributes are `int` (cuda.h); non-null.
                return unsafe { out(value.cast::<c_int>(), v) };
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.release_threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => pl.reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => pl.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => pl.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => pl.used_high,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: these attributes are `cuuint64_t` (cuda.h); non-null.
        unsafe { out(value.cast::<u64>(), v64) }
    }
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_uint, value: *mut c_void) {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = drv()?;
        let mut g = d.lock();
        let pl = Driver::pool_mut(&mut g, h(pool.0))?;
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: `int` per cuda.h; non-null.
                pl.reuse[(attr - 1) as usize] = unsafe { inp(value.cast::<c_int>()) }?;
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                // SAFETY: `cuuint64_t` per cuda.h; non-null.
                pl.release_threshold = unsafe { inp(value.cast::<u64>()) }?;
            }
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                // SAFETY: `cuuint64_t` per cuda.h; non-null.
                let v = unsafe { inp(value.cast::<u64>()) }?;
                // Only a reset to zero is allowed; it resets to the current value.
                if v != 0 {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                if attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH {
                    pl.used_high = pl.used;
                } else {
                    pl.reserved_high = pl.reserved;
                }
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    // ---- virtual memory management ----
    fn cuMemGetAllocationGranularity(gran: *mut usize, prop: *const CUmemAllocationProp, option: c_uint) {
        // SAFETY: in-struct from the caller; null is rejected.
        let pr = unsafe { inp(prop) }?;
        if gran.is_null() || option > 1 || pr.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || pr.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        drv()?.device(pr.location.id)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(gran, driver::GRANULARITY as usize) }
    }
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        // SAFETY: in-struct from the caller; null is rejected.
        let pr = unsafe { inp(prop) }?;
        if handle.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.vmm_create(size as u64, pr.location.type_, pr.location.id, pr.type_)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(handle, v) }
    }
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) { drv()?.vmm_release(handle) }
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, _addr: CUdeviceptr, flags: u64) {
        if ptr.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // The address hint is only a hint; the simulation ignores it.
        let v = drv()?.va_reserve(size as u64, alignment as u64)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(ptr, v) }
    }
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) { drv()?.va_free(ptr, size as u64) }
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        drv()?.vmm_map(ptr, size as u64, offset as u64, handle)
    }
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) { drv()?.vmm_unmap(ptr, size as u64) }
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        if desc.is_null() || count == 0 || count > 64 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let locs: Vec<(u32, i32, u32)> = (0..count)
            .map(|i| {
                // SAFETY: `desc` holds `count` descriptors (C contract).
                let d = unsafe { desc.add(i).read() };
                (d.location.type_, d.location.id, d.flags)
            })
            .collect();
        drv()?.vmm_set_access(ptr, size as u64, &locs)
    }

    // ---- arrays ----
    fn cuArrayCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) {
        // SAFETY: in-struct from the caller; null is rejected.
        let d = unsafe { inp(desc) }?;
        if arr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = array_bytes(d.Width as u64, d.Height as u64, 0, d.Format, d.NumChannels);
        let id = drv()?.array_create(bytes, T_ARRAY)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(arr, CUarray(p(id))) }
    }
    fn cuArrayCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) {
        // SAFETY: in-struct from the caller; null is rejected.
        let d = unsafe { inp(desc) }?;
        if arr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = array_bytes(u64::from(d.Width), u64::from(d.Height), 0, d.Format, d.NumChannels);
        let id = drv()?.array_create(bytes, T_ARRAY)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(arr, CUarray(p(id))) }
    }
    fn cuArray3DCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) {
        // SAFETY: in-struct from the caller; null is rejected.
        let d = unsafe { inp(desc) }?;
        if arr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = array_bytes(d.Width as u64, d.Height as u64, d.Depth as u64, d.Format, d.NumChannels);
        let id = drv()?.array_create(bytes, T_ARRAY)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(arr, CUarray(p(id))) }
    }
    fn cuArray3DCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) {
        // SAFETY: in-struct from the caller; null is rejected.
        let d = unsafe { inp(desc) }?;
        if arr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = array_bytes(u64::from(d.Width), u64::from(d.Height), u64::from(d.Depth), d.Format, d.NumChannels);
        let id = drv()?.array_create(bytes, T_ARRAY)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(arr, CUarray(p(id))) }
    }
    fn cuArrayDestroy(arr: CUarray) { drv()?.array_destroy(h(arr.0), T_ARRAY) }
    fn cuMipmappedArrayCreate(mm: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) {
        // SAFETY: in-struct from the caller; null is rejected.
        let d = unsafe { inp(desc) }?;
        if mm.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.array_create(mipmap_bytes(&d, levels), T_MIPMAP)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(mm, CUmipmappedArray(p(id))) }
    }
    fn cuMipmappedArrayDestroy(mm: CUmipmappedArray) { drv()?.array_destroy(h(mm.0), T_MIPMAP) }

    // ---- modules ----
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: an image in memory, per the C contract; null rejected.
        let m = unsafe { query::load_image(image) }?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(module, CUmodule(p(m))) }
    }
    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated path from the caller; null rejected.
        let path = unsafe { cstr(fname) }?;
        drv()?;
        let bytes = query::read_image_file(path)?;
        let m = query::load_image_bytes(&bytes)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(module, CUmodule(p(m))) }
    }
    fn cuModuleUnload(module: CUmodule) { drv()?.module_unload(h(module.0)) }
    fn cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char) {
        if f.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated name from the caller; null rejected.
        let n = unsafe { cstr(name) }?;
        let id = drv()?.module_function(h(module.0), n)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(f, CUfunction(p(id))) }
    }

    // ---- launches ----
    fn cuLaunchKernel(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shmem: c_uint, s: CUstream, params: *mut *mut c_void, _extra: *mut *mut c_void
    ) {
        // SAFETY: kernelParams per the C contract.
        unsafe { launch_kernel(f, [gx, gy, gz], [bx, by, bz], s, params, false, false) }
    }
    fn cuLaunchKernel_ptsz(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shmem: c_uint, s: CUstream, params: *mut *mut c_void, _extra: *mut *mut c_void
    ) {
        // SAFETY: kernelParams per the C contract.
        unsafe { launch_kernel(f, [gx, gy, gz], [bx, by, bz], s, params, true, false) }
    }
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        // SAFETY: config and kernelParams per the C contract.
        unsafe { launch_kernel_ex(config, f, params, false) }
    }
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, _extra: *mut *mut c_void) {
        // SAFETY: config and kernelParams per the C contract.
        unsafe { launch_kernel_ex(config, f, params, true) }
    }
    fn cuLaunchCooperativeKernel(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shmem: c_uint, s: CUstream, params: *mut *mut c_void
    ) {
        // SAFETY: kernelParams per the C contract.
        unsafe { launch_kernel(f, [gx, gy, gz], [bx, by, bz], s, params, false, true) }
    }
    fn cuLaunchCooperativeKernel_ptsz(
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shmem: c_uint, s: CUstream, params: *mut *mut c_void
    ) {
        // SAFETY: kernelParams per the C contract.
        unsafe { launch_kernel(f, [gx, gy, gz], [bx, by, bz], s, params, true, true) }
    }

    fn cuLaunchCooperativeKernelMultiDevice(
        list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, _flags: c_uint
    ) {
        if list.is_null() || n == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: the caller's array of `n` launch parameters (C contract).
            let l = unsafe { *list.add(i) };
            // SAFETY: kernelParams per the C contract.
            unsafe {
                launch_kernel(
                    l.function,
                    [l.gridDimX, l.gridDimY, l.gridDimZ],
                    [l.blockDimX, l.blockDimY, l.blockDimZ],
                    l.hStream,
                    l.kernelParams,
                    false,
                    true,
                )
            }?;
        }
        Ok(())
    }

    // ---- streams ----
    fn cuStreamCreate(s: *mut CUstream, flags: c_uint) {
        if s.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.stream_create(flags, 0)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(s, CUstream(p(id))) }
    }
    fn cuStreamCreateWithPriority(s: *mut CUstream, flags: c_uint, priority: c_int) {
        if s.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.stream_create(flags, priority)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(s, CUstream(p(id))) }
    }
    fn cuStreamDestroy(s: CUstream) { drv()?.stream_destroy(h(s.0)) }
    fn cuStreamDestroy_v2(s: CUstream) { drv()?.stream_destroy(h(s.0)) }
    fn cuStreamSynchronize(s: CUstream) { drv()?.stream_synchronize(h(s.0), false) }
    fn cuStreamSynchronize_ptsz(s: CUstream) { drv()?.stream_synchronize(h(s.0), true) }
    fn cuStreamQuery(s: CUstream) { drv()?.stream_query(h(s.0), false) }
    fn cuStreamQuery_ptsz(s: CUstream) { drv()?.stream_query(h(s.0), true) }
    fn cuStreamBeginCapture(s: CUstream) { drv()?.begin_capture(h(s.0)) }
    fn cuStreamBeginCapture_ptsz(s: CUstream) { drv()?.begin_capture(h(s.0)) }
    fn cuStreamBeginCapture_v2(s: CUstream, _mode: CUstreamCaptureMode) { drv()?.begin_capture(h(s.0)) }
    fn cuStreamBeginCapture_v2_ptsz(s: CUstream, _mode: CUstreamCaptureMode) { drv()?.begin_capture(h(s.0)) }
    fn cuStreamBeginCaptureToGraph(s: CUstream, g: CUgraph, deps: *const CUgraphNode, _data: *const CUgraphEdgeData, n: usize, _mode: CUstreamCaptureMode) {
        // SAFETY: `deps` holds `n` handles (C contract).
        unsafe { begin_capture_to_graph(s, g, deps, n) }
    }
    fn cuStreamBeginCaptureToGraph_ptsz(s: CUstream, g: CUgraph, deps: *const CUgraphNode, _data: *const CUgraphEdgeData, n: usize, _mode: CUstreamCaptureMode) {
        // SAFETY: as cuStreamBeginCaptureToGraph.
        unsafe { begin_capture_to_graph(s, g, deps, n) }
    }
    fn cuStreamEndCapture(s: CUstream, g: *mut CUgraph) { end_capture(s, g) }
    fn cuStreamEndCapture_ptsz(s: CUstream, g: *mut CUgraph) { end_capture(s, g) }
    fn cuStreamIsCapturing(s: CUstream, st: *mut CUstreamCaptureStatus) { is_capturing(s, st) }
    fn cuStreamIsCapturing_ptsz(s: CUstream, st: *mut CUstreamCaptureStatus) { is_capturing(s, st) }
    fn cuStreamWaitEvent(s: CUstream, e: CUevent, _flags: c_uint) { drv()?.stream_wait_event(h(s.0), h(e.0), false) }
    fn cuStreamWaitEvent_ptsz(s: CUstream, e: CUevent, _flags: c_uint) { drv()?.stream_wait_event(h(s.0), h(e.0), true) }

    // ---- events ----
    fn cuEventCreate(e: *mut CUevent, flags: c_uint) {
        if e.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.event_create(flags)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(e, CUevent(p(id))) }
    }
    fn cuEventRecord(e: CUevent, s: CUstream) { drv()?.event_record(h(e.0), h(s.0), false) }
    fn cuEventRecord_ptsz(e: CUevent, s: CUstream) { drv()?.event_record(h(e.0), h(s.0), true) }
    fn cuEventRecordWithFlags(e: CUevent, s: CUstream, _flags: c_uint) { drv()?.event_record(h(e.0), h(s.0), false) }
    fn cuEventRecordWithFlags_ptsz(e: CUevent, s: CUstream, _flags: c_uint) { drv()?.event_record(h(e.0), h(s.0), true) }
    fn cuEventSynchronize(e: CUevent) { drv()?.event_synchronize(h(e.0)) }
    fn cuEventQuery(e: CUevent) { drv()?.event_query(h(e.0)) }
    fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) {
        if ms.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.event_elapsed(h(a.0), h(b.0))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(ms, v) }
    }
    fn cuEventElapsedTime_v2(ms: *mut f32, a: CUevent, b: CUevent) {
        // SAFETY: same contract as the v1 entry.
        unsafe { cuEventElapsedTime_impl(ms, a, b) }
    }
    fn cuEventDestroy(e: CUevent) { drv()?.event_destroy(h(e.0)) }
    fn cuEventDestroy_v2(e: CUevent) { drv()?.event_destroy(h(e.0)) }

    // ---- graphs ----
    fn cuGraphCreate(g: *mut CUgraph, flags: c_uint) {
        if g.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = drv()?.graph_create(flags)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(g, CUgraph(p(id))) }
    }
    fn cuGraphAddKernelNode(
        node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize,
        params: *const CUDA_KERNEL_NODE_PARAMS_v1
    ) {
        // SAFETY: in-struct from the caller; null is rejected.
        let k = unsafe { inp(params) }?;
        let n = KernelNode {
            func: h(k.func.0),
            grid: [k.gridDimX, k.gridDimY, k.gridDimZ],
            block: [k.blockDimX, k.blockDimY, k.blockDimZ],
            param_ns: None,
        };
        // SAFETY: node/deps/kernelParams per the C contract.
        unsafe { graph_add_kernel(node, g, deps, ndeps, n, k.kernelParams) }
    }
    fn cuGraphAddKernelNode_v2(
        node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize,
        params: *const CUDA_KERNEL_NODE_PARAMS_v2
    ) {
        // SAFETY: in-struct from the caller; null is rejected.
        let k = unsafe { inp(params) }?;
        // 12.0 on, a library's kernel goes in `kern` (with `func` NULL).
        let func = if k.func.0.is_null() { h(k.kern.0) } else { h(k.func.0) };
        let n = KernelNode {
            func,
            grid: [k.gridDimX, k.gridDimY, k.gridDimZ],
            block: [k.blockDimX, k.blockDimY, k.blockDimZ],
            param_ns: None,
        };
        // SAFETY: node/deps/kernelParams per the C contract.
        unsafe { graph_add_kernel(node, g, deps, ndeps, n, k.kernelParams) }
    }
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, g: CUgraph, flags: u64) {
        // SAFETY: same out-pointer contract.
        unsafe { cuGraphInstantiateWithFlags_impl(exec, g, flags) }
    }
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, g: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) {
        // SAFETY: out-pointer and in/out struct from the caller.
        unsafe { graph_instantiate_with_params(exec, g, params) }
    }
    fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, g: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) {
        // SAFETY: as cuGraphInstantiateWithParams.
        unsafe { graph_instantiate_with_params(exec, g, params) }
    }
    fn cuGraphUpload(exec: CUgraphExec, s: CUstream) { drv()?.graph_upload(h(exec.0), h(s.0)) }
    fn cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) { drv()?.graph_upload(h(exec.0), h(s.0)) }
    fn cuGraphGetNodes(g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) {
        // SAFETY: `n` and `nodes` per the C contract.
        unsafe { graph_get_nodes(g, nodes, n) }
    }
    fn cuGraphNodeGetType(node: CUgraphNode, t: *mut CUgraphNodeType) {
        let v = drv()?.graph_node_type(h(node.0))?;
        // SAFETY: out-pointer from the caller; null is rejected.
        unsafe { out(t, v) }
    }
    fn cuGraphInstantiate(exec: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _size: usize) {
        // SAFETY: same out-pointer contract.
        unsafe { cuGraphInstantiateWithFlags_impl(exec, g, 0) }
    }
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, g: CUgraph, _err: *mut CUgraphNode, _log: *mut c_char, _size: usize) {
        // SAFETY: same out-pointer contract.
        unsafe { cuGraphInstantiateWithFlags_impl(exec, g, 0) }
    }
    fn cuGraphLaunch(exec: CUgraphExec, s: CUstream) { drv()?.graph_launch(h(exec.0), h(s.0), false) }
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) { drv()?.graph_launch(h(exec.0), h(s.0), true) }
    fn cuGraphExecDestroy(exec: CUgraphExec) { drv()?.graph_exec_destroy(h(exec.0)) }
    fn cuGraphDestroy(g: CUgraph) { drv()?.graph_destroy(h(g.0)) }
}

unsafe fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> R {
    if pctx.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let c = drv()?.ctx_create(flags, dev)?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(pctx, CUcontext(p(c))) }
}

unsafe fn cuDeviceGetUuid_impl(uuid: *mut CUuuid, dev: CUdevice) -> R {
    let d = drv()?.device(dev)?;
    let b = vgpu_sim::Machine::device_uuid(d).map(|x| x as c_char);
    // SAFETY: out-pointer from the caller; null is rejected.
    unsafe { out(uuid, CUuuid { bytes: b }) }
}

unsafe fn cuEventElapsedTime_impl(ms: *mut f32, a: CUevent, b: CUevent) -> R {
    if ms.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let v = drv()?.event_elapsed(h(a.0), h(b.0))?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(ms, v) }
}

unsafe fn cuGraphInstantiateWithFlags_impl(exec: *mut CUgraphExec, g: CUgraph, flags: u64) -> R {
    if exec.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let id = drv()?.graph_instantiate(h(g.0), flags)?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(exec, CUgraphExec(p(id))) }
}

/// `cuGraphInstantiateWithParams`: flags and upload stream from the
/// struct, result written back.
///
/// Safety: `exec` is null or writable; `params` null or a valid struct.
unsafe fn graph_instantiate_with_params(
    exec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> R {
    // SAFETY: in-struct from the caller; null is rejected.
    let prm = unsafe { inp(params) }?;
    if exec.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    let id = d.graph_instantiate(h(g.0), prm.flags)?;
    if prm.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
        if let Err(e) = d.graph_upload(id, h(prm.hUploadStream.0)) {
            let _ = d.graph_exec_destroy(id);
            return Err(e);
        }
    }
    // SAFETY: non-null out-pointer and struct from the caller.
    unsafe {
        (*params).hErrNode_out = CUgraphNode(std::ptr::null_mut());
        (*params).result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
        out(exec, CUgraphExec(p(id)))
    }
}

/// `cuGraphGetNodes`: with `nodes` null, the count; else up to `*n`
/// nodes, and `*n` set to how many were written.
///
/// Safety: `n` is null or valid; `nodes` null or valid for `*n` writes.
unsafe fn graph_get_nodes(g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) -> R {
    // SAFETY: in/out count from the caller; null is rejected.
    let room = unsafe { inp(n) }?;
    let all = drv()?.graph_nodes(h(g.0))?;
    if nodes.is_null() {
        // SAFETY: checked non-null above.
        return unsafe { out(n, all.len()) };
    }
    let k = room.min(all.len());
    for (i, id) in all.iter().take(k).enumerate() {
        // SAFETY: `nodes` holds `*n` >= k entries (C contract).
        unsafe { nodes.add(i).write(CUgraphNode(p(*id))) };
    }
    // SAFETY: checked non-null above.
    unsafe { out(n, k) }
}

/// Safety: `deps` holds `n` node handles (C contract).
unsafe fn begin_capture_to_graph(s: CUstream, g: CUgraph, deps: *const CUgraphNode, n: usize) -> R {
    if n > 0 && deps.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    drv()?.begin_capture_into(h(s.0), Some(h(g.0)))
}

mod data;
mod library;
mod query;
pub use data::*;
pub use library::*;
pub use query::*;
