//! Thin FFI wrappers over libc for the loader and stderr. Unsafe lives here
//! (and in `dl.rs` / the hook exports), each block with why it holds.
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Writes all of `buf` to fd 2, through EINTR and short writes; errors are
/// dropped (there is nowhere left to report them).
pub fn write_stderr(mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: `buf` is a live slice; write(2) reads at most its length.
        let n = unsafe { libc::write(2, buf.as_ptr().cast(), buf.len()) };
        if n > 0 {
            buf = &buf[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym` once found (read by the `dlsym` trampoline in `dl.rs`).
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's own `dlsym`, found with `dlvsym(RTLD_NEXT, ..)` so that our
/// exported `dlsym` never calls itself. Newer glibc versions `dlsym` at
/// GLIBC_2.34; older ones only at GLIBC_2.2.5.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: both strings are NUL-terminated literals; dlvsym does
            // not go through our `dlsym` export.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's `dlsym`, whose C type is `DlsymFn`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// Looks `name` up in `handle` with the real `dlsym`; null when absent.
pub(crate) fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `name` is NUL-terminated; `handle` came from dlopen (or is
        // a pseudo-handle), as dlsym requires.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// `dlopen(name, RTLD_NOW | RTLD_NODELETE)`; the error text on failure.
pub fn dlopen_now(name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `name` is NUL-terminated; flags are valid dlopen flags.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
    if h.is_null() {
        Err(dlerror_text())
    } else {
        Ok(h)
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null and NUL-terminated per dlerror's contract.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

extern "C" {
    /// The process environment (POSIX `environ`).
    static environ: *const *const c_char;
}

/// The environment entries whose name starts with one of `prefixes`, as
/// raw `(name, value)` bytes. Reads `environ` directly: `std::env::vars_os`
/// copies every variable of the process (two allocations each) to keep a
/// handful, inside `cuInit`.
pub fn env_with_prefixes(prefixes: &[&str]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated
    // strings maintained by libc. Reading it has the same contract as
    // getenv(3) (which the driver itself calls): valid unless another
    // thread modifies the environment at the same time.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return out;
        }
        while !(*p).is_null() {
            let entry = CStr::from_ptr(*p).to_bytes();
            p = p.add(1);
            if !prefixes.iter().any(|pre| entry.starts_with(pre.as_bytes())) {
                continue;
            }
            let Some(eq) = entry.iter().position(|&b| b == b'=') else {
                continue;
            };
            out.push((entry[..eq].to_vec(), entry[eq + 1..].to_vec()));
        }
    }
    out
}

/// `cuDeviceGetCount` of the loaded driver, looked up alone: `cuInit` needs
/// only this one, not the whole set `aux::cuda` resolves (a `dlsym` each).
pub fn cuda_device_count() -> Option<u32> {
    type GetCount = unsafe extern "C" fn(*mut c_int) -> vgpu_cuda_abi::CUresult;
    let h = crate::hooks::handle(crate::hooks::Lib::Cuda);
    if h.is_null() {
        return None;
    }
    let p = lookup(h, c"cuDeviceGetCount");
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is the driver's cuDeviceGetCount, whose C type is `GetCount`.
    let f = unsafe { std::mem::transmute::<*mut c_void, GetCount>(p) };
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-parameter.
    let r = unsafe { f(&mut n) };
    (r.is_success() && n >= 0).then_some(n as u32)
}

/// Registers `f` to run at normal process exit.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain extern "C" function living as long as the
    // process (the library is preloaded / RTLD_NODELETE).
    unsafe { libc::atexit(f) == 0 }
}

/// Registers a child-side fork handler.
pub fn at_fork_child(f: unsafe extern "C" fn()) -> bool {
    // SAFETY: `f` lives as long as the process; no prepare/parent handlers.
    unsafe { libc::pthread_atfork(None, None, Some(f)) == 0 }
}

pub fn getpid() -> c_int {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Writes `v` through a caller-supplied out-pointer; false when it is null.
///
/// # Safety
/// A non-null `p` must be valid for a write of `T` (the C API's contract
/// with its caller).
pub unsafe fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null and writable per this function's contract.
    unsafe { p.write(v) };
    true
}

/// Reads through a caller-supplied pointer; `None` when it is null.
///
/// # Safety
/// A non-null `p` must be valid for a read of `T`.
pub unsafe fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null and readable per this function's contract.
        Some(unsafe { p.read() })
    }
}

/// A C string argument as `&str` (None when null or not UTF-8).
///
/// # Safety
/// A non-null `p` must point at a NUL-terminated string that outlives `'a`.
pub unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}
