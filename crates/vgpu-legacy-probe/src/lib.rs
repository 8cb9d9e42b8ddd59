//! **TEST-ONLY.** An `LD_PRELOAD` library that reproduces HAMi-core's
//! `postInit` host-PID probe on the `cuInit` path, so `vgpu bench init
//! --mode legacy` can show the burst-init problem (issue 5) beside vgpu and
//! native in one run. Never ship or deploy it: it serializes every process of
//! the node on purpose.
//!
//! `cuInit` here: real `cuInit`; then, once per process, take a node-global
//! `flock`, NVML running-process snapshot, retain the primary context of
//! device 0, snapshot again, release the primary context, unlock — exactly
//! the shape of HAMi-core's `try_lock_unified_lock` + `set_task_pid`.
//!
//! Environment:
//! - `VGPU_LEGACY_PROBE_LOCK`: lock file (default `$VGPU_SIM_DIR/legacy-probe.lock`
//!   on the simulated driver, else `/tmp/vgpu-legacy-probe.lock`).
//! - `VGPU_LEGACY_PROBE_TRACE`: file to append one line per probe:
//!   `pid locked_ns unlocked_ns new_pid` (CLOCK_MONOTONIC), for tests.
//!
//! The whole crate is FFI: every function is called from C or calls C.
use std::ffi::{c_uint, c_void, CStr, CString};
use std::sync::Once;

use vgpu_cuda_abi::{nvmlDevice_t, nvmlProcessInfo_t, sig, CUcontext, CUresult};

/// nvmlDeviceGetComputeRunningProcesses_v3 or its _v2 (same C type).
type NvmlProcs = sig::nvmlDeviceGetComputeRunningProcesses_v3;

static PROBE: Once = Once::new();

fn next_sym(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NEXT from this object finds the driver loaded after us;
    // `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded driver.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: live handle, NUL-terminated name.
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

fn log(msg: &str) {
    let line = format!("[vgpu-legacy-probe] {msg}\n");
    // SAFETY: writing a valid buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `cuInit` as HAMi-core's wrapper shapes it.
///
/// # Safety
/// Called by applications through the C ABI, like the driver's `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    let real = next_sym(c"cuInit");
    if real.is_null() {
        log("real cuInit not found");
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    }
    // SAFETY: the driver's cuInit has this signature.
    let real = unsafe { std::mem::transmute::<*mut c_void, sig::cuInit>(real) };
    // SAFETY: forwarding the caller's argument to the real driver.
    let r = unsafe { real(flags) };
    if r.is_success() {
        PROBE.call_once(probe);
    }
    r
}

// The export has the list's type of the driver's cuInit.
const _: sig::cuInit = cuInit;

fn lock_path() -> CString {
    let p = std::env::var("VGPU_LEGACY_PROBE_LOCK")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::env::var("VGPU_SIM_DIR")
                .ok()
                .filter(|s| !s.is_empty())
                .map(|d| format!("{d}/legacy-probe.lock"))
        })
        .unwrap_or_else(|| "/tmp/vgpu-legacy-probe.lock".into());
    CString::new(p).unwrap_or_else(|_| c"/tmp/vgpu-legacy-probe.lock".to_owned())
}

struct Nvml {
    handle: nvmlDevice_t,
    procs: NvmlProcs,
}

fn nvml() -> Option<Nvml> {
    // SAFETY: constant NUL-terminated library name.
    let h = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        return None;
    }
    let sym = |n: &CStr| {
        // SAFETY: live handle, NUL-terminated name.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let init = sym(c"nvmlInit_v2")?;
    let get = sym(c"nvmlDeviceGetHandleByIndex_v2")?;
    let procs = sym(c"nvmlDeviceGetComputeRunningProcesses_v3")
        .or_else(|| sym(c"nvmlDeviceGetComputeRunningProcesses_v2"))?;
    // SAFETY: nvml.h signatures: nvmlReturn_t nvmlInit_v2(void),
    // nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t*),
    // nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*).
    let (init, get, procs) = unsafe {
        (
            std::mem::transmute::<*mut c_void, sig::nvmlInit_v2>(init),
            std::mem::transmute::<*mut c_void, sig::nvmlDeviceGetHandleByIndex_v2>(get),
            std::mem::transmute::<*mut c_void, NvmlProcs>(procs),
        )
    };
    let mut dev = nvmlDevice_t(std::ptr::null_mut());
    // SAFETY: valid out-pointer; functions resolved above.
    if unsafe { init() }.0 != 0 || unsafe { get(0, &mut dev) }.0 != 0 {
        return None;
    }
    Some(Nvml { handle: dev, procs })
}

fn snapshot(n: &Nvml) -> Vec<u32> {
    let mut buf = vec![nvmlProcessInfo_t::default(); 1024];
    let mut count = buf.len() as c_uint;
    // SAFETY: buffer of `count` elements; device handle from NVML.
    let r = unsafe { (n.procs)(n.handle, &mut count, buf.as_mut_ptr()) };
    if r.0 != 0 {
        return Vec::new();
    }
    buf.iter().take(count as usize).map(|p| p.pid).collect()
}

fn probe() {
    let path = lock_path();
    // SAFETY: NUL-terminated path; flags and mode are plain values.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666 as c_uint,
        )
    };
    if fd < 0 {
        log("cannot open the probe lock; probing unlocked");
    } else {
        // SAFETY: fd is open; the kernel releases the lock if we die.
        while unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
    }
    let locked = now_ns();
    let mut new_pid = 0u32;
    let retain = next_sym(c"cuDevicePrimaryCtxRetain");
    let release = next_sym(c"cuDevicePrimaryCtxRelease_v2");
    match (nvml(), retain.is_null(), release.is_null()) {
        (Some(n), false, false) => {
            // SAFETY: cuda.h signatures of the two primary-context calls.
            let (retain, release) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, sig::cuDevicePrimaryCtxRetain>(retain),
                    std::mem::transmute::<*mut c_void, sig::cuDevicePrimaryCtxRelease_v2>(release),
                )
            };
            let before = snapshot(&n);
            let mut ctx = CUcontext::NULL;
            // SAFETY: valid out-pointer, device 0 (cuInit succeeded).
            let r = unsafe { retain(&mut ctx, 0) };
            let after = snapshot(&n);
            if r.is_success() {
                // SAFETY: releasing the retain above.
                unsafe { release(0) };
            }
            let fresh: Vec<u32> = after.into_iter().filter(|p| !before.contains(p)).collect();
            if fresh.len() == 1 {
                new_pid = fresh[0];
            }
        }
        _ => log("NVML or primary-context entry points missing; probe skipped"),
    }
    let unlocked = now_ns();
    if fd >= 0 {
        // SAFETY: closing our own fd releases the flock.
        unsafe { libc::close(fd) };
    }
    if let Some(trace) = std::env::var_os("VGPU_LEGACY_PROBE_TRACE") {
        let line = format!("{} {locked} {unlocked} {new_pid}\n", std::process::id());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(trace)
        {
            // One write(2) with O_APPEND: lines from many processes never interleave.
            let _ = std::io::Write::write_all(&mut f, line.as_bytes());
        }
    }
}
