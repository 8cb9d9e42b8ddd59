//! `dlopen`/`dlsym` for the bench's worker processes (the burst worker and
//! the SM tenant): load a driver library as a program linked against it
//! would, and look entry points up with the loader's own error text.

use std::ffi::{c_void, CStr};

/// The loader's last error, copied.
pub fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string
    // valid until the next dl* call on this thread; copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dl error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (dlerror contract).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A library loaded for good (never closed).
#[derive(Clone, Copy, Debug)]
pub struct Lib(*mut c_void);

/// `dlopen(lib, RTLD_NOW | RTLD_GLOBAL)`, like a program linked against it.
pub fn open_global(lib: &CStr) -> Result<Lib, String> {
    // SAFETY: a NUL-terminated name; the handle is never closed.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(format!("dlopen({}): {}", lib.to_string_lossy(), dlerror()))
    } else {
        Ok(Lib(h))
    }
}

/// `dlsym` in `lib`, or in the default scope (`None`: what a program
/// linked against the library resolves, a preloaded interposer first).
pub fn sym(lib: Option<Lib>, name: &CStr) -> Result<*mut c_void, String> {
    let scope = lib.map_or(libc::RTLD_DEFAULT, |l| l.0);
    // SAFETY: scope is RTLD_DEFAULT or a handle dlopen returned and that is
    // never closed; name is NUL-terminated.
    let p = unsafe { libc::dlsym(scope, name.as_ptr()) };
    if p.is_null() {
        Err(format!("dlsym({}): {}", name.to_string_lossy(), dlerror()))
    } else {
        Ok(p)
    }
}

/// `name` as `lib` itself defines it, never a preloaded interposer's: the
/// driver's own entry point, for timing a call with and without the
/// interposer in one process (`vgpu_cuda_abi::elf::own_symbol`: an
/// interposer may answer every `dlsym`/`dlvsym` lookup of a driver name
/// with its hook, as libvgpu.so does).
pub fn own_sym(lib: Lib, name: &str) -> Result<*mut c_void, String> {
    // SAFETY: a handle dlopen returned, never closed.
    unsafe { vgpu_cuda_abi::elf::own_symbol(lib.0, name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_librarys_own_symbol_is_where_the_loader_put_it() {
        let libc = open_global(c"libc.so.6").unwrap();
        let own = own_sym(libc, "malloc").unwrap();
        assert_eq!(own, sym(None, c"malloc").unwrap());
        assert!(own_sym(libc, "no_such_symbol_here").is_err());
    }
}
