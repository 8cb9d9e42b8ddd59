//! CUDA 12's library management (`cuLibrary*`, `cuKernel*`): images
//! loaded once for every context. The raw-pointer work of their C
//! contracts is here; the logic is `crate::driver::module`'s.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use vgpu_cuda_abi::*;

use super::query::{image_bytes, intern, read_image_file};
use super::{cstr, h, out, p, run};
use crate::driver::{drv, parse_image, Kernel, R};
use crate::image::{self, Format};
use crate::query::image_kernels;

/// Options of a `cuLibraryLoad*` call: JIT options change nothing here
/// (as for `cuModuleLoadDataEx`); library options must be known ones.
///
/// Safety: each array is null or holds its count of entries.
unsafe fn check_options(
    jit: *mut CUjit_option,
    jit_vals: *mut *mut c_void,
    njit: c_uint,
    lib: *mut CUlibraryOption,
    lib_vals: *mut *mut c_void,
    nlib: c_uint,
    from_file: bool,
) -> R {
    if njit > 0 && (jit.is_null() || jit_vals.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if nlib > 0 && (lib.is_null() || lib_vals.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..nlib as usize {
        // SAFETY: `lib` holds `nlib` options (C contract), checked non-null.
        let o = unsafe { *lib.add(i) };
        // cuda.h: preserving the binary is meaningless for a file.
        if o >= CU_LIBRARY_NUM_OPTIONS || (from_file && o == CU_LIBRARY_BINARY_IS_PRESERVED) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// A library of a whole image: the kernels it names, as a module load
/// would offer them.
fn library_of_bytes(b: &[u8]) -> R<u64> {
    let d = drv()?;
    let (kernels, open) = match image::format(&b[..b.len().min(64)]) {
        Some(Format::SimText) => {
            let t = std::str::from_utf8(b).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)?;
            let all = parse_image(t).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
            let open = all.iter().any(|k| k.name == "*");
            (all.into_iter().filter(|k| k.name != "*").collect(), open)
        }
        Some(f @ (Format::Ptx | Format::Cubin | Format::Fatbin)) => {
            let k = image_kernels(f, b)?;
            let block = d.m.header().image_block_ns;
            let defs = k
                .names
                .into_iter()
                .map(|name| Kernel {
                    name,
                    block_ns: Some(block),
                })
                .collect();
            (defs, k.open)
        }
        _ => return Err(CUresult::CUDA_ERROR_INVALID_IMAGE),
    };
    d.library_load(kernels, open)
}

cu! {
    fn cuLibraryLoadData(
        library: *mut CUlibrary, code: *const c_void,
        jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint,
        libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint
    ) {
        if library.is_null() || code.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: option arrays per the C contract; nulls are rejected.
        unsafe { check_options(jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions, false) }?;
        drv()?;
        // SAFETY: an image in memory, per the C contract (as cuModuleLoadData).
        let lib = unsafe { image_bytes(code, &mut library_of_bytes) }?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(library, CUlibrary(p(lib))) }
    }
    fn cuLibraryLoadFromFile(
        library: *mut CUlibrary, fileName: *const c_char,
        jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint,
        libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint
    ) {
        if library.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: option arrays per the C contract; nulls are rejected.
        unsafe { check_options(jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions, true) }?;
        // SAFETY: NUL-terminated path from the caller; null rejected.
        let path = unsafe { cstr(fileName) }?;
        drv()?;
        let lib = library_of_bytes(&read_image_file(path)?)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(library, CUlibrary(p(lib))) }
    }
    fn cuLibraryUnload(library: CUlibrary) { drv()?.library_unload(h(library.0)) }
    fn cuLibraryGetKernel(pKernel: *mut CUkernel, library: CUlibrary, name: *const c_char) {
        if pKernel.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NUL-terminated name from the caller; null rejected.
        let n = unsafe { cstr(name) }?;
        let k = drv()?.library_kernel(h(library.0), n)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pKernel, CUkernel(p(k))) }
    }
    fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) {
        if count.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = drv()?.library_kernels(h(lib.0))?.len();
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(count, n as c_uint) }
    }
    fn cuLibraryEnumerateKernels(kernels: *mut CUkernel, numKernels: c_uint, lib: CUlibrary) {
        let all = drv()?.library_kernels(h(lib.0))?;
        // cuda.h: numKernels must be the count cuLibraryGetKernelCount gives.
        if kernels.is_null() || numKernels as usize != all.len() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for (i, k) in all.iter().enumerate() {
            // SAFETY: `kernels` holds `numKernels` entries (C contract).
            unsafe { kernels.add(i).write(CUkernel(p(*k))) };
        }
        Ok(())
    }
    fn cuLibraryGetModule(pMod: *mut CUmodule, library: CUlibrary) {
        if pMod.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let m = drv()?.library_module(h(library.0))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pMod, CUmodule(p(m))) }
    }
    fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) {
        // SAFETY: NUL-terminated name from the caller; null rejected.
        let n = unsafe { cstr(name) }?;
        let (a, size) = drv()?.library_global(h(library.0), n)?;
        // SAFETY: optional out-pointers from the caller (cuda.h: either
        // may be NULL to skip it).
        unsafe {
            if !dptr.is_null() {
                out(dptr, a)?;
            }
            if !bytes.is_null() {
                out(bytes, size as usize)?;
            }
        }
        Ok(())
    }
    fn cuKernelGetFunction(pFunc: *mut CUfunction, kernel: CUkernel) {
        if pFunc.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let f = drv()?.kernel_function(h(kernel.0))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pFunc, CUfunction(p(f))) }
    }
    fn cuKernelGetLibrary(pLib: *mut CUlibrary, kernel: CUkernel) {
        if pLib.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let k = drv()?.lib_kernel(h(kernel.0))?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pLib, CUlibrary(p(k.lib))) }
    }
    fn cuKernelGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, kernel: CUkernel, dev: CUdevice) {
        if pi.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = drv()?.kernel_attribute(h(kernel.0), attrib, dev)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(pi, v) }
    }
    fn cuKernelGetName(name: *mut *const c_char, hfunc: CUkernel) {
        if name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let k = drv()?.lib_kernel(h(hfunc.0))?;
        // Interned for the life of the process, as the driver's own names are.
        let c = intern(&k.def.name);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(name, c) }
    }
}
