//! The ONE real-function table: the driver libraries' handles and a slot
//! per entry of [`super::api`], each resolved by its exact versioned name
//! at first use. Every real driver call of the library goes through here.
//!
//! Must never resolve a symbol to this library itself (a loop), hold a
//! lock across a driver call, or load a library before a hook needs it.
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Once;

use super::api::{Fn, COUNT};
use crate::process::{self, Section};
use crate::sys;

/// Which driver library an entry lives in.
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

struct LibState {
    once: Once,
    ready: AtomicBool,
    handle: AtomicPtr<c_void>,
    /// Every entry of the library has been looked up ([`resolve_all`]).
    resolved: AtomicBool,
}

impl LibState {
    const fn new() -> LibState {
        LibState {
            once: Once::new(),
            ready: AtomicBool::new(false),
            handle: AtomicPtr::new(std::ptr::null_mut()),
            resolved: AtomicBool::new(false),
        }
    }
}

static CUDA: LibState = LibState::new();
static NVML: LibState = LibState::new();

/// One slot per entry (null: not resolved yet, or absent from the driver).
static SLOTS: [AtomicPtr<c_void>; COUNT] = [const { AtomicPtr::new(std::ptr::null_mut()) }; COUNT];

/// CLOCK_MONOTONIC ns of the first driver load (the `LoaderReady` phase).
static FIRST_LOAD_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn state(lib: Lib) -> &'static LibState {
    match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvml => &NVML,
    }
}

/// When the library first entered the driver layer (0: not yet).
pub fn first_load_ns() -> u64 {
    FIRST_LOAD_NS.load(Ordering::Relaxed)
}

/// Loads the real library once (`RTLD_NOW | RTLD_NODELETE`). Its slots
/// fill lazily, each at its first call, or all at once when a route must
/// compare against every one ([`resolve_all`]): `cuInit` then costs one
/// `dlsym`, not one per entry. False when the library is missing (logged
/// once) or when called re-entrantly from that very load.
pub fn ensure(lib: Lib) -> bool {
    let st = state(lib);
    if st.ready.load(Ordering::Acquire) {
        return true;
    }
    let Some(_inside) = process::Inside::enter(Section::LoadingDriver) else {
        return false; // the driver's own constructors calling back in
    };
    st.once.call_once(|| load(lib, st));
    st.ready.load(Ordering::Acquire)
}

fn load(lib: Lib, st: &LibState) {
    if lib == Lib::Cuda {
        let _ = FIRST_LOAD_NS.compare_exchange(
            0,
            vgpu_region::monotonic_ns(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
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

/// The loaded library's handle (null when not loaded).
pub fn handle(lib: Lib) -> *mut c_void {
    state(lib).handle.load(Ordering::Acquire)
}

/// Looks `f` up in its loaded library by exact name and fills its slot;
/// null when the driver lacks it or it resolves into this library.
fn lookup(f: Fn) -> *mut c_void {
    let h = handle(f.lib());
    if h.is_null() {
        return std::ptr::null_mut();
    }
    let mut p = sys::lookup(h, f.symbol());
    if !p.is_null() && sys::is_own_code(p) {
        // The "driver" resolved to ourselves: never forward into a loop.
        crate::error!(
            "{} resolves to libvgpu.so itself; refusing to forward",
            f.name()
        );
        p = std::ptr::null_mut();
    }
    if !p.is_null() {
        SLOTS[f as usize].store(p, Ordering::Release);
    }
    p
}

/// The driver's address of `f`, loading its library and looking it up on
/// first use (null: absent).
#[inline]
pub fn address(f: Fn) -> *mut c_void {
    let p = SLOTS[f as usize].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve_slow(f)
}

#[cold]
fn resolve_slow(f: Fn) -> *mut c_void {
    let lib = f.lib();
    if !ensure(lib) {
        return std::ptr::null_mut();
    }
    let p = SLOTS[f as usize].load(Ordering::Acquire);
    if !p.is_null() || state(lib).resolved.load(Ordering::Acquire) {
        return p;
    }
    lookup(f)
}

/// Resolves `f` now when its library is already in the process (never
/// loads it). The front binds at the process's first lookup of a driver
/// name, before its first call: resolving `cuInit` there keeps the load
/// reference and the lookup (and the log level's first read) out of
/// `cuInit` itself, where a burst of starting processes queues on them.
pub fn warm(f: Fn) {
    if peek(f).is_null() && sys::is_loaded(f.lib().soname()) {
        let _ = address(f);
    }
}

/// The slot's current value without loading or resolving anything.
#[inline]
pub fn peek(f: Fn) -> *mut c_void {
    SLOTS[f as usize].load(Ordering::Acquire)
}

/// The typed real function of `f`.
///
/// # Safety
/// `F` must be the `extern "C" fn` type [`super::api`] declares for `f`
/// (`api::sig::<name>`): the generated getters are the only callers.
#[inline]
pub unsafe fn get<F: Copy>(f: Fn) -> Option<F> {
    let p = address(f);
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: per this function's contract `F` is the C type of the symbol
    // `p` was resolved from; function and data pointers share one size and
    // representation on the platforms this library supports.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Fills every slot of `lib` if the library is loaded (routes compare a
/// driver pointer against all of them). Does nothing before the load.
pub fn resolve_all(lib: Lib) {
    let st = state(lib);
    if st.resolved.load(Ordering::Acquire) || !st.ready.load(Ordering::Acquire) {
        return;
    }
    let mut missing = 0;
    for f in Fn::all().filter(|f| f.lib() == lib) {
        if peek(f).is_null() && lookup(f).is_null() {
            missing += 1;
        }
    }
    crate::debug!(
        "resolved the driver table for {} ({missing} listed names absent there)",
        lib.soname().to_string_lossy()
    );
    st.resolved.store(true, Ordering::Release);
}

/// Whether `p` is the driver's address of any entry (loaded slots only).
pub fn is_driver_address(p: *mut c_void) -> bool {
    !p.is_null() && SLOTS.iter().any(|s| s.load(Ordering::Acquire) == p)
}

/// Test-only: sets a slot (unit tests of the routes use made-up pointers).
#[cfg(test)]
pub fn set_for_test(f: Fn, p: *mut c_void) {
    SLOTS[f as usize].store(p, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_resolves_only_what_is_already_loaded() {
        // This test binary does not have the driver loaded (unless another
        // test loaded it: then it stays loaded); warming never loads it.
        let before = sys::is_loaded(Lib::Cuda.soname());
        warm(Fn::cuInit);
        assert_eq!(sys::is_loaded(Lib::Cuda.soname()), before);
        if !before {
            assert!(peek(Fn::cuInit).is_null(), "nothing to resolve from");
        }
    }
}
