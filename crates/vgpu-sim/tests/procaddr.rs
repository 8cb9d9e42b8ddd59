//! `cuGetProcAddress_v2` of the built `libcuda.so.1`, through dlopen, for
//! every request libcudart 12.9 makes: a request whose expected export (from
//! NVIDIA's headers, `conformance/data/…-expected.txt`) the library exports
//! gets exactly that symbol's address; every other request is reported not
//! found with a NULL pointer. No daemon needed: entry-point lookup works
//! before `cuInit`, as on the real driver.
use std::ffi::{c_int, c_void, CString};

use libloading::Library;
use vgpu_cuda_abi::*;

fn address(lib: &Library, name: &str) -> Option<*mut c_void> {
    // SAFETY: only the symbol's address is read, never called through here.
    unsafe { lib.get::<*mut c_void>(name.as_bytes()) }
        .ok()
        .map(|s| *s)
}

#[test]
fn every_cudart_request_routes_to_the_export_the_headers_name() {
    let path = vgpu_sim::locate_artifact("libvgpu_sim_cuda.so").expect("built cdylib");
    // SAFETY: the simulated driver has no library constructors.
    let lib = unsafe { Library::new(&path) }.expect("dlopen");
    // SAFETY: cuGetProcAddress_v2's signature per cuda.h.
    let gpa = unsafe { lib.get::<sig::cuGetProcAddress_v2>(b"cuGetProcAddress_v2") }
        .expect("cuGetProcAddress_v2");
    let map = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/data/cudart-12.9-procaddress-expected.txt"
    );
    let text = std::fs::read_to_string(map).expect("expected map");
    let (mut found, mut absent) = (0, 0);
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split('|').collect();
        let (name, ver, flags, want) = (
            f[0],
            f[1].parse::<c_int>().unwrap(),
            f[2].parse::<u64>().unwrap(),
            f[3],
        );
        let c = CString::new(name).unwrap();
        let mut pfn: *mut c_void = std::ptr::dangling_mut::<c_void>();
        let mut st: c_int = -1;
        // SAFETY: valid NUL-terminated name and local out-pointers.
        let r = unsafe { gpa(c.as_ptr(), &mut pfn, ver, flags, &mut st) };
        match (want != "-").then(|| address(&lib, want)).flatten() {
            Some(addr) => {
                assert_eq!(
                    (r, st),
                    (CUresult::CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
                    "{line}"
                );
                assert_eq!(pfn, addr, "{line}: not the address of {want}");
                found += 1;
            }
            None => {
                assert_eq!(r, CUresult::CUDA_ERROR_NOT_FOUND, "{line}");
                assert_eq!(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "{line}");
                assert!(pfn.is_null(), "{line}: *pfn must be NULL");
                absent += 1;
            }
        }
    }
    assert!(
        found >= 80 && found + absent >= 419,
        "{found} found, {absent} absent"
    );

    // VERSION_NOT_SUFFICIENT, bad arguments, and the v1 entry.
    let mut pfn: *mut c_void = std::ptr::dangling_mut::<c_void>();
    let mut st: c_int = -1;
    // SAFETY: as above.
    let r = unsafe { gpa(c"cuMemAllocAsync".as_ptr(), &mut pfn, 11000, 0, &mut st) };
    assert_eq!(
        (r, st),
        (
            CUresult::CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        )
    );
    assert!(pfn.is_null());
    // SAFETY: a NULL name is an error the entry must report, not follow.
    let r = unsafe { gpa(std::ptr::null(), &mut pfn, 12090, 0, &mut st) };
    assert_eq!(r, CUresult::CUDA_ERROR_INVALID_VALUE);
    // SAFETY: as above; flags outside the documented set.
    let r = unsafe { gpa(c"cuInit".as_ptr(), &mut pfn, 12090, 8, &mut st) };
    assert_eq!(r, CUresult::CUDA_ERROR_INVALID_VALUE);
    // SAFETY: cuGetProcAddress (v1, 11.3 ABI) per cudaTypedefs.h.
    let v1 =
        unsafe { lib.get::<sig::cuGetProcAddress>(b"cuGetProcAddress") }.expect("cuGetProcAddress");
    // SAFETY: valid name and out-pointer.
    let r = unsafe { v1(c"cuCtxCreate".as_ptr(), &mut pfn, 3020, 0) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    assert_eq!(Some(pfn), address(&lib, "cuCtxCreate_v2"));
    // SAFETY: as above; the per-thread flag picks the _ptsz export.
    let r = unsafe { v1(c"cuLaunchKernel".as_ptr(), &mut pfn, 12090, 2) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    assert_eq!(Some(pfn), address(&lib, "cuLaunchKernel_ptsz"));
}

/// docs/sim.md states how many entry points the simulated `libcuda.so.1`
/// exports; the count is the built library's, so the doc cannot drift.
#[test]
fn docs_state_the_exported_entry_point_count() {
    let path = vgpu_sim::locate_artifact("libvgpu_sim_cuda.so").expect("built cdylib");
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output()
        .expect("run nm (binutils)");
    assert!(out.status.success(), "nm failed on {}", path.display());
    let exports = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("T"))
        .count();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/sim.md"))
        .expect("docs/sim.md");
    let stated = format!("`libcuda.so.1` exports {exports} entry points");
    assert!(
        doc.contains(&stated),
        "docs/sim.md must say \"{stated}\" (the built library exports {exports})"
    );
}
