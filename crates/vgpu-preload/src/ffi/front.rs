//! The binding between `libvgpu.so` proper (a small front object: the
//! exports, as jump slots, and nothing else) and this library, which the
//! front loads at its first CUDA, NVML or driver-`dlsym` call.
//!
//! A process that never uses CUDA (a shell, `ls`, a data-loader worker)
//! then pays only for loading the front; everything here loads on first
//! use. This library stays a complete interposer on its own (its own
//! exports work when it is preloaded directly).
//!
//! The front calls [`vgpu_core_bind`] once with its export table; from
//! then on the routes hand out the front's exports (the addresses the
//! application also reaches by direct calls), and the front's slots jump
//! into this library's hooks.
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use super::HookInfo;

// BIND_ABI: the version of the binding; the front passes the one it was
// built for (build.rs compiles it in from the same file).
include!("front_abi.rs");

/// The front's export of each hook, in [`super::all`] order.
static FRONT: OnceLock<Vec<usize>> = OnceLock::new();

/// The front's export of `hk`, when a front bound this library.
pub fn export_of(hk: &HookInfo) -> Option<*mut c_void> {
    let f = FRONT.get()?;
    let i = super::all().position(|h| std::ptr::eq(h, hk))?;
    f.get(i)
        .copied()
        .filter(|&p| p != 0)
        .map(|p| p as *mut c_void)
}

/// Whether a front object bound this library.
pub fn bound() -> bool {
    FRONT.get().is_some()
}

/// The front's entry: binds its exports (`names[i]` exported at
/// `exports[i]`, `n` of them) and returns this library's hook for each
/// name in the same order (null where it has none), or null when the
/// binding ABI differs. `real_dlsym` is glibc's `dlsym` as the front found
/// it (this library, loaded privately by the front, must not look it up
/// relative to itself). Called once, from the front's loader.
///
/// # Safety
/// `names` and `exports` point at `n` valid entries; each name is
/// NUL-terminated and lives as long as the process (the front is never
/// unloaded); `real_dlsym` is null or glibc's `dlsym`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn vgpu_core_bind(
    abi: u32,
    names: *const *const c_char,
    exports: *const *mut c_void,
    n: usize,
    real_dlsym: *mut c_void,
) -> *const *mut c_void {
    let run = || {
        if abi != BIND_ABI || names.is_null() || exports.is_null() {
            crate::error!("libvgpu.so front and core disagree (binding {abi}, core {BIND_ABI}); reinstall both");
            return std::ptr::null();
        }
        if !real_dlsym.is_null() {
            crate::sys::set_real_dlsym(real_dlsym);
        }
        // SAFETY: per this function's contract, `n` entries each.
        let (names, exports) = unsafe {
            (
                std::slice::from_raw_parts(names, n),
                std::slice::from_raw_parts(exports, n),
            )
        };
        let hooks: Vec<&HookInfo> = super::all().collect();
        let mut impls: Vec<*mut c_void> = Vec::with_capacity(n);
        let mut front = vec![0usize; hooks.len()];
        for (k, (&name, &export)) in names.iter().zip(exports).enumerate() {
            // SAFETY: NUL-terminated and static per the contract.
            let name = unsafe { CStr::from_ptr(name) }.to_bytes();
            // Both lists come from the same table, so the same index is
            // almost always the answer; a search only when it is not.
            let i = match hooks.get(k) {
                Some(h) if h.name.as_bytes() == name => Some(k),
                _ => hooks.iter().position(|h| h.name.as_bytes() == name),
            };
            match i {
                Some(i) => {
                    front[i] = export as usize;
                    impls.push((hooks[i].own)());
                }
                None => {
                    let name = String::from_utf8_lossy(name);
                    crate::error!("libvgpu.so front exports {name}, which this core lacks; it fails as missing");
                    impls.push(std::ptr::null_mut());
                }
            }
        }
        if let Some(&first) = exports.first() {
            crate::sys::set_front(first as usize);
        }
        let _ = FRONT.set(front);
        crate::driver::table::warm(crate::driver::api::Fn::cuInit);
        Box::leak(impls.into_boxed_slice()).as_ptr()
    };
    std::panic::catch_unwind(run).unwrap_or(std::ptr::null())
}

/// The front's `dlsym` (for every handle but `RTLD_NEXT`, which it answers
/// itself) after glibc answered `found`: the routed answer.
///
/// # Safety
/// `symbol` is null or a NUL-terminated name.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn vgpu_core_route_dlsym(
    symbol: *const c_char,
    found: *mut c_void,
) -> *mut c_void {
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: per this function's contract (non-null checked above).
    unsafe { super::dlsym::route_found(symbol, found) }
}

/// `front/hooks.h`: the front's list of exports, generated from the hook
/// table (X-macro `HOOKS(X)` with `X(index, name, lib)`, lib `c`/`n`).
pub fn front_header() -> String {
    let mut s = String::from(
        "/* Generated from the hook table (crates/vgpu-preload/src/ffi); do not edit.\n \
         * `cargo test -p vgpu-preload` fails when this file is stale; regenerate\n \
         * with `VGPU_BLESS=1 cargo test -p vgpu-preload front_header`. */\n\
         #ifndef VGPU_FRONT_HOOKS_H\n#define VGPU_FRONT_HOOKS_H\n\n",
    );
    let hooks: Vec<&HookInfo> = super::all().collect();
    s.push_str(&format!(
        "#define HOOK_COUNT {}\n\n#define HOOKS(X) \\\n",
        hooks.len()
    ));
    for (i, h) in hooks.iter().enumerate() {
        let lib = match h.lib() {
            crate::driver::Lib::Cuda => 'c',
            crate::driver::Lib::Nvml => 'n',
        };
        s.push_str(&format!("    X({i}, {}, {lib}) \\\n", h.name));
    }
    s.push_str(
        "\n#define HOOK_NAME(i, name, lib) #name \"\\0\"\n\
         #define HOOK_LIB(i, name, lib) #lib\n\n#endif\n",
    );
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn front_header_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("front/hooks.h");
        let want = super::front_header();
        if std::env::var_os("VGPU_BLESS").is_some() {
            std::fs::write(&path, &want).expect("write front/hooks.h");
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "front/hooks.h is stale; run VGPU_BLESS=1 cargo test -p vgpu-preload front_header"
        );
    }
}
