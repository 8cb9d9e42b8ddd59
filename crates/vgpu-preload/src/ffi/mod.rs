//! The hook table: every interposed entry point is declared once with
//! [`hooks!`], and from that one declaration come its exported symbol, its
//! real-pointer slot, its `dlsym` route, its `cuGetProcAddress` route and its
//! row in the coverage table (`docs/hooks.md`, `vgpu hooks`).
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Once;

use vgpu_cuda_abi::{nvmlReturn_t, CUresult};

use crate::sys;

pub mod cuda;
pub mod nvml;

/// Which driver library a hook forwards to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    pub fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }
}

/// One row of the coverage table.
pub struct HookInfo {
    /// The exported (versioned) symbol, as `cuda.h`/`nvml.h` spell it.
    pub name: &'static str,
    /// The name `cuGetProcAddress` is asked for (`cuMemAlloc` for `cuMemAlloc_v2`).
    pub base: &'static str,
    /// The lowest cudaVersion whose request selects this ABI (0: not a
    /// `cuGetProcAddress` entry).
    pub since: u32,
    /// A per-thread-default-stream variant (`_ptds`/`_ptsz`, requested with
    /// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`).
    pub ptds: bool,
    pub lib: Lib,
    pub family: &'static str,
    pub policy: &'static str,
    /// The real driver function (null until the library is loaded, or when
    /// the driver lacks it).
    pub real: &'static AtomicPtr<c_void>,
    /// Our export's address.
    pub export: fn() -> *mut c_void,
}

/// Values a hook returns when it cannot forward (driver or symbol missing)
/// or when its policy panicked (the panic never crosses into C).
pub trait HookRet: Copy {
    const MISSING: Self;
    const PANICKED: Self;
}
impl HookRet for CUresult {
    const MISSING: Self = CUresult::CUDA_ERROR_NOT_FOUND;
    const PANICKED: Self = CUresult::CUDA_ERROR_UNKNOWN;
}
impl HookRet for nvmlReturn_t {
    const MISSING: Self = nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND;
    const PANICKED: Self = nvmlReturn_t::NVML_ERROR_UNKNOWN;
}

/// Declares hooks. Each entry:
/// `[lib, "base", since, ptds, "family", "policy"] fn name(args) -> Ret |real| { body }`
/// where `real` is the typed driver function inside `body`.
#[macro_export]
macro_rules! hooks {
    ($table:ident; $(
        $(#[doc = $doc:literal])*
        [$lib:ident, $base:literal, $since:literal, $ptds:literal, $family:literal, $policy:literal]
        fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty |$real:ident| $body:block
    )*) => {
        $(
            #[allow(non_snake_case, non_upper_case_globals, dead_code)]
            pub mod $name {
                #[allow(unused_imports)]
                use super::*;
                /// The real driver function.
                pub static REAL: ::std::sync::atomic::AtomicPtr<::std::ffi::c_void> =
                    ::std::sync::atomic::AtomicPtr::new(::std::ptr::null_mut());
                pub type Fn = unsafe extern "C" fn($($ty),*) -> $ret;
            }

            $(#[doc = $doc])*
            ///
            /// # Safety
            /// The C contract of the function of the same name in the driver.
            #[cfg_attr(not(test), no_mangle)]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                let run = || -> $ret {
                    #[cfg(feature = "failpoints")]
                    $crate::hooks::failpoint(stringify!($name));
                    let Some($real) = $crate::hooks::real::<$name::Fn>(&$name::REAL, $crate::hooks::Lib::$lib) else {
                        return <$ret as $crate::hooks::HookRet>::MISSING;
                    };
                    $body
                };
                match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(run)) {
                    Ok(r) => r,
                    Err(_) => {
                        $crate::hooks::note_panic(stringify!($name));
                        <$ret as $crate::hooks::HookRet>::PANICKED
                    }
                }
            }
        )*

        pub static $table: &[$crate::hooks::HookInfo] = &[
            $($crate::hooks::HookInfo {
                name: stringify!($name),
                base: $base,
                since: $since,
                ptds: $ptds,
                lib: $crate::hooks::Lib::$lib,
                family: $family,
                policy: $policy,
                real: &$name::REAL,
                export: || $name as *mut ::std::ffi::c_void,
            },)*
        ];
    };
}

/// Every hook, CUDA first.
pub fn all() -> impl Iterator<Item = &'static HookInfo> {
    cuda::TABLE.iter().chain(nvml::TABLE.iter())
}

pub fn by_name(name: &str) -> Option<&'static HookInfo> {
    all().find(|h| h.name == name)
}

struct LibState {
    once: Once,
    ready: AtomicBool,
    handle: AtomicPtr<c_void>,
    /// Every hook of the library has been looked up (`resolve_all`).
    resolved: AtomicBool,
}

static CUDA: LibState = LibState {
    once: Once::new(),
    ready: AtomicBool::new(false),
    handle: AtomicPtr::new(std::ptr::null_mut()),
    resolved: AtomicBool::new(false),
};
static NVML: LibState = LibState {
    once: Once::new(),
    ready: AtomicBool::new(false),
    handle: AtomicPtr::new(std::ptr::null_mut()),
    resolved: AtomicBool::new(false),
};

thread_local! {
    /// Set while this thread loads a driver library, so that a hook reached
    /// from inside that load (the driver's constructors) passes through
    /// instead of deadlocking on the once-flag.
    static LOADING: Cell<bool> = const { Cell::new(false) };
}

fn state(lib: Lib) -> &'static LibState {
    match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvml => &NVML,
    }
}

/// Loads the real library once (`RTLD_NOW | RTLD_NODELETE`). Its hooks'
/// real-pointer slots fill lazily, each at its first call (`real`), or all
/// at once when a route must compare against every one (`resolve_all`):
/// `cuInit` then costs one `dlsym`, not one per hook (each a walk of the
/// driver's symbol tables, page faults included, in a fresh process). False
/// when the library is missing (logged once) or when called re-entrantly
/// from that load.
pub fn ensure(lib: Lib) -> bool {
    let st = state(lib);
    if st.ready.load(Ordering::Acquire) {
        return true;
    }
    if LOADING.with(Cell::get) {
        return false;
    }
    LOADING.with(|l| l.set(true));
    st.once.call_once(|| load(lib, st));
    LOADING.with(|l| l.set(false));
    st.ready.load(Ordering::Acquire)
}

fn load(lib: Lib, st: &LibState) {
    if lib == Lib::Cuda {
        crate::state::note_loader_ready();
    }
    let h = match sys::dlopen_now(lib.soname()) {
        Ok(h) => h,
        Err(e) => {
            crate::warn!(
                "cannot load {}: {e}; its calls fail as missing",
                lib.soname().to_string_lossy()
            );
            return;
        }
    };
    st.handle.store(h, Ordering::Release);
    crate::debug!("loaded {}", lib.soname().to_string_lossy());
    st.ready.store(true, Ordering::Release);
}

/// Looks `hk` up in its loaded library by exact versioned name and fills its
/// slot; null when the driver lacks it (or resolves to ourselves).
fn resolve(hk: &HookInfo, h: *mut c_void) -> *mut c_void {
    let mut buf = [0u8; 128];
    let n = hk.name.len();
    if n >= buf.len() {
        return std::ptr::null_mut();
    }
    buf[..n].copy_from_slice(hk.name.as_bytes());
    let Ok(cname) = CStr::from_bytes_with_nul(&buf[..=n]) else {
        return std::ptr::null_mut();
    };
    let mut p = sys::lookup(h, cname);
    if p == (hk.export)() {
        // The "driver" resolved to ourselves: never forward into a loop.
        crate::error!(
            "{} resolves to libvgpu.so itself; refusing to forward",
            hk.name
        );
        p = std::ptr::null_mut();
    }
    if !p.is_null() {
        hk.real.store(p, Ordering::Release);
    }
    p
}

/// Fills every hook slot of `lib` if the library is loaded (routes compare
/// a driver pointer against all of them). Does nothing before the load.
pub fn resolve_all(lib: Lib) {
    let st = state(lib);
    if st.resolved.load(Ordering::Acquire) || !st.ready.load(Ordering::Acquire) {
        return;
    }
    let h = st.handle.load(Ordering::Acquire);
    let mut missing = 0;
    for hk in all().filter(|hk| hk.lib == lib) {
        if hk.real.load(Ordering::Acquire).is_null() && resolve(hk, h).is_null() {
            missing += 1;
        }
    }
    crate::debug!(
        "resolved the hooks of {} ({missing} hooked names absent there)",
        lib.soname().to_string_lossy()
    );
    st.resolved.store(true, Ordering::Release);
}

/// The loaded library's handle (null when not loaded).
pub fn handle(lib: Lib) -> *mut c_void {
    state(lib).handle.load(Ordering::Acquire)
}

/// The typed real function behind `slot`, loading its library and looking
/// the symbol up on first use.
#[inline]
pub fn real<F: Copy>(slot: &AtomicPtr<c_void>, lib: Lib) -> Option<F> {
    let mut p = slot.load(Ordering::Acquire);
    if p.is_null() {
        p = resolve_slot(slot, lib);
        if p.is_null() {
            return None;
        }
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `F` is the `extern "C" fn` type the hook declared for this
    // exact versioned symbol, and `p` is that symbol in the driver; function
    // pointers and data pointers have one size and representation here.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

#[cold]
fn resolve_slot(slot: &AtomicPtr<c_void>, lib: Lib) -> *mut c_void {
    if !ensure(lib) {
        return std::ptr::null_mut();
    }
    let p = slot.load(Ordering::Acquire);
    let st = state(lib);
    if !p.is_null() || st.resolved.load(Ordering::Acquire) {
        return p;
    }
    match all().find(|hk| std::ptr::eq(hk.real, slot)) {
        Some(hk) => resolve(hk, st.handle.load(Ordering::Acquire)),
        None => std::ptr::null_mut(),
    }
}

/// Test-only (feature `failpoints`): panics when `LIBVGPU_FAILPOINT_PANIC`
/// names this hook (or `dlsym`), read once.
/// Off (no variable) costs one relaxed load, so `cargo bench` (which builds
/// the dev-dependency features too) measures the same hot paths.
#[cfg(feature = "failpoints")]
pub fn failpoint(name: &str) {
    use std::sync::atomic::AtomicU8;
    static STATE: AtomicU8 = AtomicU8::new(0); // 0 unread, 1 off, 2 on
    static WHICH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    match STATE.load(Ordering::Relaxed) {
        1 => {}
        0 => {
            let on = std::env::var("LIBVGPU_FAILPOINT_PANIC")
                .ok()
                .map(|v| WHICH.get_or_init(|| v))
                .is_some();
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            failpoint(name);
        }
        _ => {
            if WHICH.get().map(String::as_str) == Some(name) {
                panic!("failpoint in {name}");
            }
        }
    }
}

pub fn note_panic(name: &str) {
    crate::error!(
        "internal error (panic) in {name}; returned an error code instead of unwinding into C"
    );
}

/// `dlsym` route: when the real lookup found the very driver function one of
/// our hooks wraps (or our own export), hand out the hook instead.
///
/// # Safety
/// `name` is null or a NUL-terminated string (the `dlsym` contract).
pub unsafe fn route_dlsym(name: *const c_char, found: *mut c_void) -> *mut c_void {
    #[cfg(feature = "failpoints")]
    failpoint("dlsym");
    // SAFETY: per this function's contract.
    let Some(name) = (unsafe { sys::cstr(name) }) else {
        return found;
    };
    if !(name.starts_with("cu") || name.starts_with("nvml")) {
        return found;
    }
    let Some(hk) = by_name(name) else {
        return found;
    };
    if found == (hk.export)() {
        return found;
    }
    if !ensure(hk.lib) {
        return found;
    }
    let mut real = hk.real.load(Ordering::Acquire);
    if real.is_null() {
        real = resolve_slot(hk.real, hk.lib);
    }
    if found == real {
        (hk.export)()
    } else {
        found
    }
}

/// The hook whose ABI a `cuGetProcAddress` request selects by name and
/// version alone: the newest declared ABI of `symbol` with `since <=
/// cudaVersion`, the per-thread-stream variant when `flags` asks for it and
/// one is declared. Every hooked name declares all its ABIs from its first
/// hooked one on (checked against the headers' map in the tests), so a
/// version below that selects an unhooked ABI and gets `None`.
pub fn select(symbol: &str, version: i32, flags: u64) -> Option<&'static HookInfo> {
    let ptds = flags & vgpu_cuda_abi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let pick = |want_ptds: bool| {
        cuda::TABLE
            .iter()
            .filter(|h| {
                h.base == symbol && h.ptds == want_ptds && i64::from(h.since) <= i64::from(version)
            })
            .max_by_key(|h| h.since)
    };
    if ptds {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }
}

/// `cuGetProcAddress` route: the driver already chose the ABI for
/// (symbol, cudaVersion, flags) and filled `symbolStatus`; substitute our
/// hook when its answer is exactly the driver function a hook wraps. When
/// the driver answers with a pointer none of our slots holds (a driver may
/// hand out internal entry points), the name-and-version rule of
/// [`select`] decides, but only if that hook's driver function exists.
/// Anything else (an ABI we do not hook, an unknown name) is the driver's.
pub fn route_proc(symbol: &str, found: *mut c_void, version: i32, flags: u64) -> *mut c_void {
    if found.is_null() {
        return found;
    }
    let mut same_name = cuda::TABLE.iter().filter(|hk| hk.base == symbol).peekable();
    if same_name.peek().is_none() {
        return found;
    }
    // The comparisons below need every hook's driver pointer.
    resolve_all(Lib::Cuda);
    let mut known = false;
    for hk in same_name {
        let real = hk.real.load(Ordering::Acquire);
        if real == found {
            return (hk.export)();
        }
        known |= found == (hk.export)();
    }
    if known {
        return found;
    }
    match select(symbol, version, flags) {
        Some(hk) if !hk.real.load(Ordering::Acquire).is_null() && !driver_slot(found) => {
            (hk.export)()
        }
        _ => found,
    }
}

/// Whether `p` is the driver function behind any hook (another ABI).
fn driver_slot(p: *mut c_void) -> bool {
    cuda::TABLE
        .iter()
        .any(|hk| hk.real.load(Ordering::Acquire) == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_versions_sane() {
        let mut seen = std::collections::HashSet::new();
        for h in all() {
            assert!(seen.insert(h.name), "duplicate hook {}", h.name);
            assert!(
                h.name.starts_with(h.base),
                "{} does not extend {}",
                h.name,
                h.base
            );
            if h.lib == Lib::Cuda {
                assert!(h.since >= 2000, "{} lacks a cudaVersion", h.name);
            }
            assert!(!h.policy.is_empty());
            assert_eq!(
                h.ptds,
                h.name.ends_with("_ptsz") || h.name.ends_with("_ptds"),
                "{}",
                h.name
            );
        }
    }

    #[test]
    fn proc_route_substitutes_only_the_wrapped_pointer() {
        let hk = by_name("cuMemAlloc_v2").expect("declared");
        let fake = 0x1000 as *mut c_void;
        hk.real.store(fake, Ordering::Release);
        assert_eq!(route_proc("cuMemAlloc", fake, 12090, 0), (hk.export)());
        // An internal pointer for a version selecting the hooked ABI.
        let internal = 0x2000 as *mut c_void;
        assert_eq!(route_proc("cuMemAlloc", internal, 3020, 0), (hk.export)());
        // Another ABI of the same name (the v1 `cuMemAlloc`) passes through.
        assert_eq!(route_proc("cuMemAlloc", internal, 2000, 0), internal);
        // A name without hooks passes through.
        assert_eq!(route_proc("cuGraphLaunch", fake, 12090, 0), fake);
        assert!(route_proc("cuMemAlloc", std::ptr::null_mut(), 12090, 0).is_null());
        hk.real.store(std::ptr::null_mut(), Ordering::Release);
        // Without the driver function behind the hook, never substitute.
        assert_eq!(route_proc("cuMemAlloc", internal, 3020, 0), internal);
    }

    /// The name-and-version rule agrees with the map generated from
    /// NVIDIA's headers for every cudart request of a hooked name.
    #[test]
    fn version_rule_matches_the_headers_map() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../conformance/data/cudart-12.9-procaddress-expected.txt");
        let text = std::fs::read_to_string(&p).expect("conformance/data map");
        let mut checked = 0;
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let f: Vec<&str> = l.split('|').collect();
            let (name, ver, flags, export) = (
                f[0],
                f[1].parse::<i32>().unwrap(),
                f[2].parse::<u64>().unwrap(),
                f[3],
            );
            if !cuda::TABLE.iter().any(|h| h.base == name) {
                continue;
            }
            let got = select(name, ver, flags).map(|h| h.name);
            let hooked = cuda::TABLE.iter().any(|h| h.name == export);
            assert_eq!(got, hooked.then_some(export), "{l}");
            checked += 1;
        }
        assert!(checked >= 25, "only {checked} hooked requests in the map");
    }
}
