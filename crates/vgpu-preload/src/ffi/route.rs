//! The escape routes: a driver pointer handed out by `dlsym` or
//! `cuGetProcAddress` is replaced by our hook exactly when it is the driver
//! function the hook wraps, so every route reaches the same hooks.
use std::ffi::{c_char, c_void};

use super::{by_name, cuda, HookInfo};
use crate::driver::{table, Lib};
use crate::sys;

/// `dlsym` route: when the real lookup found the very driver function one
/// of our hooks wraps (or our own export), hand out the hook instead.
///
/// # Safety
/// `name` is null or a NUL-terminated string (the `dlsym` contract).
pub unsafe fn route_dlsym(name: *const c_char, found: *mut c_void) -> *mut c_void {
    #[cfg(feature = "failpoints")]
    super::failpoint("dlsym");
    // SAFETY: per this function's contract.
    let Some(name) = (unsafe { sys::cstr(name) }) else {
        return found;
    };
    if !(name.starts_with("cu") || name.starts_with("nvml")) {
        return found;
    }
    let Some(hk) = by_name(name) else {
        return found;
    };
    if hk.is_export(found) {
        return hk.export();
    }
    if !table::ensure(hk.lib()) {
        return found;
    }
    if found == hk.driver() {
        hk.export()
    } else {
        found
    }
}

/// The hook whose ABI a `cuGetProcAddress` request selects by name and
/// version alone: the newest declared ABI of `symbol` with `since <=
/// cudaVersion`, the per-thread-stream variant when `flags` asks for it and
/// one is declared. Every hooked name declares all its ABIs from its first
/// hooked one on (checked against the headers' map in the tests), so a
/// version below that selects an unhooked ABI and gets `None`.
pub fn select(symbol: &str, version: i32, flags: u64) -> Option<&'static HookInfo> {
    let ptds = flags & vgpu_cuda_abi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let pick = |want_ptds: bool| {
        cuda::TABLE
            .iter()
            .filter(|h| {
                h.base == symbol && h.ptds == want_ptds && i64::from(h.since) <= i64::from(version)
            })
            .max_by_key(|h| h.since)
    };
    if ptds {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }
}

/// `cuGetProcAddress` route: the driver already chose the ABI for
/// (symbol, cudaVersion, flags) and filled `symbolStatus`; substitute our
/// hook when its answer is exactly the driver function a hook wraps. When
/// the driver answers with a pointer none of our slots holds (a driver may
/// hand out internal entry points), the name-and-version rule of
/// [`select`] decides, but only if that hook's driver function exists.
/// Anything else (an ABI we do not hook, an unknown name) is the driver's.
pub fn route_proc(symbol: &str, found: *mut c_void, version: i32, flags: u64) -> *mut c_void {
    if found.is_null() {
        return found;
    }
    let mut same_name = cuda::TABLE.iter().filter(|hk| hk.base == symbol).peekable();
    if same_name.peek().is_none() {
        return found;
    }
    // The comparisons below need every hook's driver pointer.
    table::resolve_all(Lib::Cuda);
    let mut known = false;
    for hk in same_name {
        if hk.driver_loaded() == found {
            return hk.export();
        }
        known |= hk.is_export(found);
    }
    if known {
        return found;
    }
    match select(symbol, version, flags) {
        Some(hk) if !hk.driver_loaded().is_null() && !table::is_driver_address(found) => {
            hk.export()
        }
        _ => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::api::Fn;

    #[test]
    fn proc_route_substitutes_only_the_wrapped_pointer() {
        let hk = by_name("cuMemAlloc_v2").expect("declared");
        let fake = 0x1000 as *mut c_void;
        table::set_for_test(Fn::cuMemAlloc_v2, fake);
        assert_eq!(route_proc("cuMemAlloc", fake, 12090, 0), hk.export());
        // An internal pointer for a version selecting the hooked ABI.
        let internal = 0x2000 as *mut c_void;
        assert_eq!(route_proc("cuMemAlloc", internal, 3020, 0), hk.export());
        // Another ABI of the same name (the v1 `cuMemAlloc`) passes through.
        assert_eq!(route_proc("cuMemAlloc", internal, 2000, 0), internal);
        // A name without hooks passes through.
        assert_eq!(route_proc("cuGraphLaunch", fake, 12090, 0), fake);
        assert!(route_proc("cuMemAlloc", std::ptr::null_mut(), 12090, 0).is_null());
        table::set_for_test(Fn::cuMemAlloc_v2, std::ptr::null_mut());
        // Without the driver function behind the hook, never substitute.
        assert_eq!(route_proc("cuMemAlloc", internal, 3020, 0), internal);
    }

    /// The name-and-version rule agrees with the map generated from
    /// NVIDIA's headers for every cudart request of a hooked name.
    #[test]
    fn version_rule_matches_the_headers_map() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../conformance/data/cudart-12.9-procaddress-expected.txt");
        let text = std::fs::read_to_string(&p).expect("conformance/data map");
        let mut checked = 0;
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let f: Vec<&str> = l.split('|').collect();
            let (name, ver, flags, export) = (
                f[0],
                f[1].parse::<i32>().unwrap(),
                f[2].parse::<u64>().unwrap(),
                f[3],
            );
            if !cuda::TABLE.iter().any(|h| h.base == name) {
                continue;
            }
            let got = select(name, ver, flags).map(|h| h.name);
            let hooked = cuda::TABLE.iter().any(|h| h.name == export);
            assert_eq!(got, hooked.then_some(export), "{l}");
            checked += 1;
        }
        assert!(checked >= 25, "only {checked} hooked requests in the map");
    }
}
