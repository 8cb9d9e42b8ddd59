//! The driver functions this library calls or exports: the entries of
//! `vgpu_cuda_abi::interposer_functions!`, the workspace's one list, with
//! their C types as `cuda.h` / `nvml.h` spell them.
//!
//! From that list come the function-pointer types ([`sig`], shared with
//! every other user), the real-function table's slots ([`Fn`], one per
//! entry, with its symbol and library as code rather than relocated data),
//! the typed getters (`api::cuMemAlloc_v2()`), and the hook exports in
//! `ffi/`, which a compile-time check ties to the entry of the same name.
//! `tests/preload/signatures.rs` compiles every entry's prototype against
//! NVIDIA's headers, so a wrong parameter type fails a test instead of
//! running. Add an entry to the list before calling or hooking a new
//! driver function.
//!
//! Owns no state and never calls anything: [`super::table`] resolves.
#![allow(non_camel_case_types, non_snake_case, clippy::too_many_arguments)]
use std::ffi::CStr;

pub use vgpu_cuda_abi::sig;

use super::table::{self, Lib};

/// A NUL-terminated literal as a `CStr`, checked at compile time.
const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("symbol names are NUL-terminated literals"),
    }
}

macro_rules! lib_of {
    (cuda) => {
        Lib::Cuda
    };
    (nvml) => {
        Lib::Nvml
    };
}

macro_rules! driver_api {
    ($( $lib:ident fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// The table slot of every entry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Fn { $($name),* }

        /// Number of entries (and table slots).
        pub const COUNT: usize = [$(Fn::$name),*].len();

        /// Every slot in order (`FNS[i] as usize == i`).
        static FNS: [Fn; COUNT] = [$(Fn::$name),*];

        impl Fn {
            /// The exact (versioned) symbol, for `dlsym`.
            pub fn symbol(self) -> &'static CStr {
                match self {
                    $(Fn::$name => {
                        const C: &CStr = cstr(concat!(stringify!($name), "\0"));
                        C
                    })*
                }
            }

            pub fn lib(self) -> Lib {
                match self { $(Fn::$name => lib_of!($lib),)* }
            }
        }

        $(
            /// The real driver function, resolved on first use (`None`:
            /// library or symbol missing).
            #[inline]
            pub fn $name() -> Option<sig::$name> {
                // SAFETY: `sig::$name` is the C type of the symbol this slot
                // resolves, by construction of this list (and checked against
                // the headers by tests/signatures.rs).
                unsafe { table::get::<sig::$name>(Fn::$name) }
            }
        )*
    };
}

vgpu_cuda_abi::interposer_functions!(driver_api);

/// The entry of a symbol name, if the list has it.
pub fn by_name(name: &str) -> Option<Fn> {
    Fn::all().find(|f| f.name() == name)
}

/// Every entry's signature, in slot order.
pub fn entries() -> impl Iterator<Item = &'static vgpu_cuda_abi::Signature> {
    vgpu_cuda_abi::signatures().filter(|s| s.interposed)
}

impl Fn {
    pub fn name(self) -> &'static str {
        self.symbol().to_str().unwrap_or("")
    }

    pub fn all() -> impl Iterator<Item = Fn> {
        FNS.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_names_agree() {
        assert_eq!(COUNT, entries().count());
        let mut seen = std::collections::HashSet::new();
        for (f, e) in Fn::all().zip(entries()) {
            assert_eq!(FNS[f as usize], f);
            assert_eq!(f.name(), e.name, "slot order is the list's");
            assert!(seen.insert(e.name), "duplicate {}", e.name);
            assert_eq!(by_name(e.name), Some(f));
            let cuda = e.lib == "cuda";
            assert_eq!(f.lib() == Lib::Cuda, cuda, "{}", e.name);
            assert_eq!(e.ret, if cuda { "CUresult" } else { "nvmlReturn_t" });
        }
        assert_eq!(by_name("cuNotAFunction"), None);
        // Entries only others call get no slot.
        assert_eq!(by_name("cuModuleLoadData"), None);
    }
}
