//! Thin FFI wrappers over libc: the loader (`dlopen`, the real `dlsym`,
//! `dl_iterate_phdr`), stderr, the raw environment, futexes, fork/exit handler
//! registration, and reading/writing C out-pointers. The bottom layer:
//! imports nothing of this crate. Each unsafe block says why it holds.
//!
//! Must never allocate on the paths the log and the fork handler use
//! (`write_stderr`, `futex_*`).
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
/// GLIBC_2.34; older ones only at their baseline version.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        // 2.2.5: the x86_64 baseline; 2.17: the aarch64 baseline.
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
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

/// Sets glibc's `dlsym` as a front object found it (before anything here
/// asks for it: this library is then loaded privately, and a lookup
/// relative to it would not find glibc's).
pub fn set_real_dlsym(p: *mut c_void) {
    REAL_DLSYM.store(p, Ordering::Release);
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

/// Whether the library `name` is already loaded in this process (never
/// loads it: `RTLD_NOLOAD`, and the reference taken is given back).
pub fn is_loaded(name: &CStr) -> bool {
    // SAFETY: `name` is NUL-terminated; RTLD_NOLOAD only looks.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return false;
    }
    // SAFETY: `h` is the handle just returned; closing it drops only the
    // reference this call took.
    unsafe { libc::dlclose(h) };
    true
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

/// The value of environment variable `name` (exact match), as bytes.
pub fn env_var(name: &str) -> Option<Vec<u8>> {
    env_with_prefixes(&[name])
        .into_iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| v)
}

/// Whether environment variable `name` is set to a value `pred` accepts,
/// through getenv(3) (glibc's scan compares two bytes at a time; no copy
/// of the environment): for the few checks inside `cuInit`.
pub fn env_matches(name: &CStr, pred: impl Fn(&[u8]) -> bool) -> bool {
    // SAFETY: `name` is NUL-terminated; getenv returns null or a pointer
    // into the environment, valid under getenv's own contract (no thread
    // modifying the environment meanwhile), read here before returning.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: non-null: a NUL-terminated value in the environment.
    !v.is_null() && pred(unsafe { CStr::from_ptr(v) }.to_bytes())
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

/// Who process `pid` (as this process's procfs names it) is: its start
/// time in clock ticks since boot, its PID-namespace inode and its PID in
/// that namespace (the last `NStgid` field); `None` when it cannot be read
/// (gone, another user's, not in our procfs).
pub fn proc_identity(pid: u32) -> Option<ProcId> {
    use std::os::unix::fs::MetadataExt;
    let st = vgpu_region::ident::stat_of(pid).ok()?;
    if st.pid != pid {
        return None;
    }
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let inner = status
        .lines()
        .find_map(|l| l.strip_prefix("NStgid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(pid);
    Some(ProcId {
        start_ticks: st.start_ticks,
        pid_ns: ns,
        inner_pid: inner,
    })
}

/// See [`proc_identity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId {
    pub start_ticks: u64,
    pub pid_ns: u64,
    pub inner_pid: u32,
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

/// Blocks while `*word == expected`, at most `timeout` (None: forever);
/// returns on a wake, a timeout, a signal or a changed value alike.
pub fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Option<std::time::Duration>,
) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 for the whole call; the kernel
    // only reads it and the (optional) relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        )
    };
}

/// Wakes up to `n` waiters of `word`.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32, n: i32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        )
    };
}

/// The loadable segments (`[start, end)`, at most 8) of one loaded object.
#[derive(Clone, Copy, Default)]
struct Segments {
    n: usize,
    r: [(usize, usize); 8],
}

impl Segments {
    fn contains(&self, a: usize) -> bool {
        self.r[..self.n].iter().any(|&(s, e)| s <= a && a < e)
    }
}

/// The segments of the loaded object that contains `addr` (empty: none),
/// from the loader's program headers: one walk of the loaded objects,
/// where `dladdr` searched symbol tables (~5,000 instructions a call, two
/// calls per driver entry point resolved, `cuInit`'s own included).
fn segments_of(addr: usize) -> Segments {
    struct Find {
        addr: usize,
        out: Segments,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid `info` for the duration of
        // this call and our `data`, the `Find` it was given below.
        let (info, find) = unsafe { (&*info, &mut *data.cast::<Find>()) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: the loader's program headers of this object: `dlpi_phnum`
        // entries at `dlpi_phdr`, mapped while the object is loaded.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let mut seg = Segments::default();
        for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
            if seg.n == seg.r.len() {
                break;
            }
            let start = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
            seg.r[seg.n] = (start, start.wrapping_add(ph.p_memsz as usize));
            seg.n += 1;
        }
        if seg.contains(find.addr) {
            find.out = seg;
            1
        } else {
            0
        }
    }
    let mut find = Find {
        addr,
        out: Segments::default(),
    };
    // SAFETY: `each` only reads what the loader hands it and writes `find`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut find as *mut Find).cast()) };
    find.out
}

/// This library's segments, found at first need.
static OWN: std::sync::OnceLock<Segments> = std::sync::OnceLock::new();
/// The segments of a front object that loaded this library (unset: none),
/// set once when it binds.
static FRONT: std::sync::OnceLock<Segments> = std::sync::OnceLock::new();

/// Records the front object that loaded this library, by the address of
/// one of its exports.
pub fn set_front(export: usize) {
    let _ = FRONT.set(segments_of(export));
}

/// Whether `p` is code of this library (or of the front that loaded it):
/// a "driver" symbol that resolves here would forward into itself.
pub fn is_own_code(p: *const c_void) -> bool {
    let a = p as usize;
    OWN.get_or_init(|| segments_of(is_own_code as *const () as usize))
        .contains(a)
        || FRONT.get().is_some_and(|f| f.contains(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_code_is_this_object_and_nothing_else() {
        let own = own_code_is_this_object_and_nothing_else as *const c_void;
        assert!(is_own_code(own));
        assert!(
            is_own_code(std::ptr::addr_of!(FRONT).cast()),
            "its data too"
        );
        let getpid = libc::getpid as *const c_void;
        assert!(!is_own_code(getpid), "libc's code is not ours");
        assert!(!is_own_code(std::ptr::null()));
        let heap = Box::new(0u64);
        assert!(!is_own_code((&*heap as *const u64).cast()));
        // The object found by an address is the one that holds it.
        let libc_segs = segments_of(getpid as usize);
        assert!(libc_segs.n > 0 && libc_segs.contains(getpid as usize));
        assert!(!libc_segs.contains(own as usize));
        assert_eq!(segments_of(0).n, 0, "no object at 0");
    }

    #[test]
    fn is_loaded_looks_and_never_loads() {
        assert!(is_loaded(c"libc.so.6"));
        let absent = c"libvgpu-test-never-there.so";
        assert!(!is_loaded(absent));
        assert!(!is_loaded(absent), "the look loaded nothing");
    }
}
