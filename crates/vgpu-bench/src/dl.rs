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

/// The start of glibc's `struct link_map` (link.h), which is public ABI.
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const std::ffi::c_char,
}

/// `name` as `lib` itself defines it, never a preloaded interposer's: the
/// driver's own entry point, for timing a call with and without the
/// interposer in one process. Read from the library file's dynamic symbol
/// table at the address the loader mapped it, since an interposer may
/// answer every `dlsym`/`dlvsym` lookup of a driver name with its hook
/// (libvgpu.so does).
pub fn own_sym(lib: Lib, name: &str) -> Result<*mut c_void, String> {
    let mut lm: *const LinkMapHead = std::ptr::null();
    // SAFETY: a handle dlopen returned; RTLD_DI_LINKMAP writes one
    // `struct link_map *` through the pointer.
    let r = unsafe {
        libc::dlinfo(
            lib.0,
            libc::RTLD_DI_LINKMAP,
            (&mut lm as *mut *const LinkMapHead).cast(),
        )
    };
    if r != 0 || lm.is_null() {
        return Err(format!("dlinfo(RTLD_DI_LINKMAP): {}", dlerror()));
    }
    // SAFETY: the loader's link map of a library never closed; `l_name` is
    // a NUL-terminated path it keeps for the map's life.
    let (base, path) = unsafe {
        let m = &*lm;
        (
            m.l_addr,
            CStr::from_ptr(m.l_name).to_string_lossy().into_owned(),
        )
    };
    let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: read-only map of a library file that is not rewritten while
    // it is loaded.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{path}: {e}"))?;
    let value = vgpu_cuda_abi::elf::dynsym_value(&map, name)
        .ok_or_else(|| format!("{path} defines no {name}"))?;
    Ok(base.wrapping_add(value as usize) as *mut c_void)
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
