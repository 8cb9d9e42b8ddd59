//! Our `dlsym`: programs that `dlopen` the driver and look entry points up
//! by name get the hooks, exactly like programs linked against it.
use std::ffi::{c_char, c_void};

use super::route;
use crate::process::{Inside, Section};
use crate::sys;

/// `dlsym(3)`, interposed: a trampoline so that glibc still sees the
/// original caller. `RTLD_NEXT` lookups are relative to the object that
/// calls `dlsym` (glibc reads its own return address), so they jump straight
/// into glibc's `dlsym` with the caller's frame untouched: another
/// interposer loaded after libvgpu.so gets its true next definition instead
/// of itself. Every other lookup goes to [`dlsym_impl`].
///
/// # Safety
/// The C contract of `dlsym`.
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // No Rust runs before the jumps, so the stack and argument registers are
    // exactly the caller's. The resolve path keeps the stack 16-byte aligned
    // for its call (entry rsp = 8 mod 16; two pushes and 8 more: 0 mod 16)
    // and restores rdi/rsi before jumping on.
    std::arch::naked_asm!(
        "cmp rdi, -1",
        "je 2f",
        "jmp {imp}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "ret",
        imp = sym dlsym_impl,
        real = sym crate::sys::REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}

/// aarch64: the same trampoline. `x30` (the return address glibc reads)
/// is unchanged on every path that jumps on; `x16` is the veneer scratch
/// register the procedure-call standard sets aside.
///
/// # Safety
/// The C contract of `dlsym`.
#[cfg(target_arch = "aarch64")]
#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // No Rust runs before the jumps. The resolve path saves x29/x30 and the
    // two arguments in a 32-byte (16-aligned) frame and restores them
    // before jumping on.
    std::arch::naked_asm!(
        "cmn x0, #1",
        "b.eq 2f",
        "b {imp}",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {resolve}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 4f",
        "br x16",
        "4:",
        "mov x0, #0",
        "ret",
        imp = sym dlsym_impl,
        real = sym crate::sys::REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}

/// Other architectures: the plain hook (`RTLD_NEXT` is then answered
/// relative to libvgpu.so; documented in docs/interposer.md).
///
/// # Safety
/// The C contract of `dlsym`.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments under the same contract.
    unsafe { dlsym_impl(handle, symbol) }
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
extern "C" fn resolve_real_dlsym() -> *mut c_void {
    sys::real_dlsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void)
}

/// The lookup behind `dlsym` for every handle but `RTLD_NEXT`: glibc's
/// answer, with a hook substituted when it is the driver function the hook
/// wraps.
///
/// # Safety
/// The C contract of `dlsym`.
unsafe extern "C" fn dlsym_impl(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = sys::real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, forwarded unchanged to glibc.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: `symbol` is the caller's non-null, NUL-terminated name.
    unsafe { route_found(symbol, found) }
}

/// Routes a lookup glibc answered with `found` (also the front object's
/// entry). Re-entry on this thread (std's lazy libc lookups, the driver's
/// constructors during our dlopen) passes the answer straight through.
///
/// # Safety
/// `symbol` is a non-null, NUL-terminated name.
pub unsafe fn route_found(symbol: *const c_char, found: *mut c_void) -> *mut c_void {
    let Some(_inside) = Inside::enter(Section::Dlsym) else {
        return found;
    };
    // SAFETY: per this function's contract.
    std::panic::catch_unwind(|| unsafe { route::route_dlsym(symbol, found) }).unwrap_or(found)
}

/// The coverage table for `vgpu hooks` (which dlopens this library rather
/// than linking it): one line per hook,
/// `name<TAB>base<TAB>since<TAB>ptds<TAB>lib<TAB>family<TAB>policy`,
/// NUL-terminated, in static memory owned by the library.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn vgpu_hook_table() -> *const c_char {
    static TABLE: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    std::panic::catch_unwind(|| {
        TABLE
            .get_or_init(|| std::ffi::CString::new(super::coverage::tsv()).unwrap_or_default())
            .as_ptr()
    })
    .unwrap_or(std::ptr::null())
}
