//! The exports: the only code that C calls. Every interposed entry point
//! is declared once with [`hooks!`], and from that declaration come its
//! exported symbol, its `dlsym` route, its `cuGetProcAddress` route and its
//! row in the coverage table (`docs/hooks.md`, `vgpu hooks`); its C type
//! and its real-function slot are the signature list's (`driver::api`),
//! and a compile-time check makes the export's type exactly that entry's.
//!
//! - [`cuda`], [`nvml`]: the declarations (thin: decode the C arguments,
//!   call the policy layers, forward).
//! - [`route`]: the `dlsym` and `cuGetProcAddress` routes.
//! - [`dlsym`]: our `dlsym` export.
//! - [`front`]: the binding a small front object (`libvgpu.so` proper)
//!   uses to hand its exports over to this library on first use.
//! - [`coverage`]: the generated table.
//!
//! Nothing imports this module. Must never let a panic unwind into C
//! (every export runs under `catch_unwind`) or hold state of its own
//! beyond the tables below.
use std::ffi::c_void;

use vgpu_cuda_abi::{nvmlReturn_t, CUresult};

use crate::driver::api::Fn;
use crate::driver::Lib;

pub mod coverage;
pub mod cuda;
pub mod dlsym;
pub mod front;
pub mod nvml;
pub mod route;

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
    pub family: &'static str,
    pub policy: &'static str,
    /// The real driver function's slot in the table.
    pub real: Fn,
    /// Our export's address in this library.
    pub own: fn() -> *mut c_void,
}

impl HookInfo {
    pub fn lib(&self) -> Lib {
        self.real.lib()
    }

    /// The address callers should get for this hook: the front object's
    /// export when one bound this library, else ours.
    pub fn export(&self) -> *mut c_void {
        front::export_of(self).unwrap_or_else(|| (self.own)())
    }

    /// Whether `p` is this hook's export (ours or the front's).
    pub fn is_export(&self, p: *mut c_void) -> bool {
        p == (self.own)() || front::export_of(self) == Some(p)
    }

    /// The driver's function behind this hook, resolving it if needed.
    pub fn driver(&self) -> *mut c_void {
        crate::driver::table::address(self.real)
    }

    /// The driver's function if already resolved (no load, no lookup).
    pub fn driver_loaded(&self) -> *mut c_void {
        crate::driver::table::peek(self.real)
    }
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
///
/// ```text
/// [base: "cuMemAlloc", since: 3020, ptds: false, family: "memory", policy: "what it does"]
/// fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult |real| { body }
/// ```
///
/// `real` is the typed driver function inside `body`. The name must be an
/// entry of `driver::api` and the parameter types exactly that entry's (a
/// compile error otherwise).
#[macro_export]
macro_rules! hooks {
    ($table:ident; $(
        $(#[doc = $doc:literal])*
        [base: $base:literal, since: $since:literal, ptds: $ptds:literal, family: $family:literal, policy: $policy:literal]
        fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty |$real:ident| $body:block
    )*) => {
        $(
            // The shared guarded export (vgpu_cuda_abi::guarded_export!):
            // the C type tied to the list's entry, panics caught by
            // `ffi::guard`.
            ::vgpu_cuda_abi::guarded_export! {
                $(#[doc = $doc])*
                #[doc = ""]
                #[doc = "# Safety"]
                #[doc = "The C contract of the function of the same name in the driver."]
                #[cfg_attr(not(test), no_mangle)]
                #[allow(non_snake_case, clippy::missing_safety_doc)]
                guard: $crate::ffi::guard, result: $ret;
                fn $name($($arg: $ty),*) -> $ret {
                    #[cfg(feature = "failpoints")]
                    $crate::ffi::failpoint(stringify!($name));
                    let Some($real) = $crate::driver::api::$name() else {
                        return <$ret as $crate::ffi::HookRet>::MISSING;
                    };
                    $body
                }
            }
        )*

        pub static $table: &[$crate::ffi::HookInfo] = &[
            $($crate::ffi::HookInfo {
                name: stringify!($name),
                base: $base,
                since: $since,
                ptds: $ptds,
                family: $family,
                policy: $policy,
                real: $crate::driver::api::Fn::$name,
                own: || $name as *mut ::std::ffi::c_void,
            },)*
        ];
    };
}

/// Every hook, CUDA first (the order the front object's slots follow).
pub fn all() -> impl Iterator<Item = &'static HookInfo> {
    cuda::TABLE.iter().chain(nvml::TABLE.iter())
}

pub fn by_name(name: &str) -> Option<&'static HookInfo> {
    all().find(|h| h.name == name)
}

/// Test-only (feature `failpoints`): panics when `LIBVGPU_FAILPOINT_PANIC`
/// names this hook (or `dlsym`). Off (no variable) costs one load, so
/// `cargo bench` (which builds the dev-dependency features too) measures
/// the same hot paths.
#[cfg(feature = "failpoints")]
pub fn failpoint(name: &str) {
    if crate::config::failpoint_panic() == Some(name) {
        panic!("failpoint in {name}");
    }
}

/// Runs a hook's body; a panic becomes the hook's `PANICKED` code (logged),
/// never an unwind into C. Inlined, so the hot path is the body itself.
#[inline(always)]
pub fn guard<R: HookRet>(name: &'static str, run: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(_) => {
            note_panic(name);
            R::PANICKED
        }
    }
}

pub fn note_panic(name: &str) {
    crate::error!(
        "internal error (panic) in {name}; returned an error code instead of unwinding into C"
    );
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
            if h.lib() == Lib::Cuda {
                assert!(h.since >= 2000, "{} lacks a cudaVersion", h.name);
            }
            assert!(!h.policy.is_empty());
            assert_eq!(
                h.ptds,
                h.name.ends_with("_ptsz") || h.name.ends_with("_ptds"),
                "{}",
                h.name
            );
            assert_eq!(h.real.name(), h.name, "slot of {}", h.name);
        }
    }
}
