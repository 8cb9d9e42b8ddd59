//! Our `dlsym`: programs that `dlopen` the driver and look entry points up
//! by name get the hooks, exactly like programs linked against it.
use std::cell::Cell;
use std::ffi::{c_char, c_void};

use crate::{hooks, sys};

thread_local! {
    /// Re-entry guard: std and the loader may call `dlsym` while we route
    /// (lazy libc lookups, the driver's own constructors during our dlopen).
    static IN_DLSYM: Cell<bool> = const { Cell::new(false) };
}

/// `dlsym(3)`, interposed.
///
/// Known limit: a `RTLD_NEXT` lookup is answered relative to libvgpu.so
/// (first in the search order) rather than to the calling object.
///
/// # Safety
/// The C contract of `dlsym`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = sys::real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, forwarded unchanged to glibc.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || symbol.is_null() || IN_DLSYM.with(Cell::get) {
        return found;
    }
    IN_DLSYM.with(|g| g.set(true));
    // SAFETY: `symbol` is the caller's non-null, NUL-terminated name.
    let out =
        std::panic::catch_unwind(|| unsafe { hooks::route_dlsym(symbol, found) }).unwrap_or(found);
    IN_DLSYM.with(|g| g.set(false));
    out
}

/// The coverage table for `vgpu hooks` (which dlopens this library rather
/// than linking it): one line per hook,
/// `name<TAB>base<TAB>since<TAB>ptds<TAB>lib<TAB>family<TAB>policy`,
/// NUL-terminated, in static memory owned by the library.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn vgpu_hook_table() -> *const c_char {
    static TABLE: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    TABLE
        .get_or_init(|| std::ffi::CString::new(crate::coverage::tsv()).unwrap_or_default())
        .as_ptr()
}
