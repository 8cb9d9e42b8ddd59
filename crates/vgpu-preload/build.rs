//! Two things the crate's own targets cannot do:
//!
//! 1. The front object `libvgpu.so` (`front/front.c`, x86_64 and aarch64
//!    Linux): a few
//!    kilobytes of jump slots and no load-time symbol relocations, so a
//!    process that never uses CUDA pays ~nothing for the preload; it loads
//!    this crate's cdylib (`libvgpu_core.so`, next to it) at its first CUDA
//!    or NVML call. Compiled here with the C compiler and placed beside the
//!    crate's other artifacts (`target/<profile>/` and its `deps/`, where
//!    test executables look first), written atomically.
//!    Elsewhere no front is built and `libvgpu_core.so` is the interposer.
//! 2. The core linked `-Bsymbolic-functions`: its hook table must hold its
//!    own functions even though the front exports the same names first.
//! 3. libgcc's unwinder linked statically (`libgcc_eh.a`, hidden symbols)
//!    so the core does not pull `libgcc_s.so.1` into a process at its first
//!    CUDA call (a second library to map and relocate, and a constructor
//!    with `cpuid`s, which trap in a VM). Panics still unwind to the
//!    `catch_unwind` at every export. Where `libgcc_eh.a` is not found
//!    (another toolchain), std's default (`libgcc_s`) stays.
use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_cuda_abi::{nvmlReturn_t, CUresult};

include!("src/ffi/front_abi.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=front/front.c");
    println!("cargo:rerun-if-changed=front/hooks.h");
    println!("cargo:rerun-if-changed=src/ffi/front_abi.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        return;
    }
    let cc = c_compiler(&target);
    static_unwinder(&cc);
    // The core's references to its own exports bind to itself, not to the
    // front's exports of the same names (which jump into the core: a loop).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    if target.starts_with("x86_64-") || target.starts_with("aarch64-") {
        front(&cc);
    } else {
        println!(
            "cargo:warning=no libvgpu.so front for {target}: preload libvgpu_core.so directly"
        );
    }
}

/// The C compiler for `target`, by the `cc` crate's convention:
/// `CC_<target>` (dashes as underscores), `TARGET_CC` when cross
/// compiling, `CC`, then `cc` natively or Debian's `<arch>-linux-gnu-gcc`
/// across (`aarch64-unknown-linux-gnu` → `aarch64-linux-gnu-gcc`).
fn c_compiler(target: &str) -> String {
    let host = std::env::var("HOST").unwrap_or_default();
    let per_target = format!("CC_{}", target.replace('-', "_"));
    for v in [per_target.as_str(), "TARGET_CC", "CC"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let cross = host != target;
    let set = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    set(&per_target)
        .or_else(|| if cross { set("TARGET_CC") } else { None })
        .or_else(|| set("CC"))
        .unwrap_or_else(|| {
            if cross {
                let arch = target.split('-').next().unwrap_or_default();
                format!("{arch}-linux-gnu-gcc")
            } else {
                "cc".into()
            }
        })
}

fn static_unwinder(cc: &str) {
    let found = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_absolute() && p.is_file());
    match found.as_ref().and_then(|p| p.parent()) {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            // Not bundled into the rlib: each final link (the cdylib, the
            // tests, the tenant) takes it from the toolchain, ahead of
            // std's -lgcc_s, which --as-needed then drops.
            println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
            // libgcc.a beside it: the few helpers std and compiler code
            // still take from libgcc_s (`__udivti3`, the f16 conversions
            // `__extendhfsf2`/`__truncsfhf2`) come from the archive, so
            // nothing is left for libgcc_s and --as-needed drops it
            // (tests/preload/front.rs checks the core's NEEDED list).
            println!("cargo:rustc-link-lib=static:-bundle=gcc");
        }
        None => println!(
            "cargo:warning=libgcc_eh.a not found via {cc}; libvgpu_core.so will need libgcc_s.so.1"
        ),
    }
}

/// Compiles the front into OUT_DIR and places it in the profile directory
/// (OUT_DIR is `<target>/<profile>/build/<pkg>-<hash>/out`).
fn front(cc: &str) {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    let built = out_dir.join("libvgpu.so");
    let status = Command::new(cc)
        .args([
            "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror",
        ])
        // No start files: no _init/_fini, no __cxa_finalize (its one
        // constructor, in .init_array, needs none).
        .args([
            "-nostartfiles",
            "-fno-stack-protector",
            "-fvisibility=hidden",
        ])
        // Lazy binding: its few libc imports resolve at first use, not in
        // every process that loads it. Two segments (code, data) and no
        // RELRO: fewer mmap/mprotect calls and page faults per process
        // (strace: 36 syscalls for /bin/true here, an empty preload 39,
        // none 30); its only writable data are the slots, written once at
        // bind, and the lazy GOT, writable under lazy binding anyway.
        .args([
            "-Wl,-soname,libvgpu.so",
            "-Wl,-z,lazy",
            "-Wl,--as-needed",
            "-Wl,-z,noseparate-code",
            "-Wl,-z,norelro",
        ])
        // The numbers the front shares with the Rust side, from their one
        // definition each.
        .arg(format!("-DVGPU_BIND_ABI={BIND_ABI}"))
        .arg(format!(
            "-DVGPU_FAIL_CUDA={}",
            CUresult::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED.0
        ))
        .arg(format!(
            "-DVGPU_FAIL_NVML={}",
            nvmlReturn_t::NVML_ERROR_LIBRARY_NOT_FOUND.0
        ))
        .arg("-o")
        .arg(&built)
        .arg("front/front.c")
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!("cannot build the libvgpu.so front with {cc}: {other:?}"),
    }
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        panic!("unexpected OUT_DIR {}", out_dir.display());
    };
    install(&built, &profile_dir.join("libvgpu.so"));
    // Test executables live in deps/ and look beside themselves first; a
    // libvgpu.so there from before the core was renamed must not shadow
    // the front.
    if profile_dir.join("deps").is_dir() {
        install(&built, &profile_dir.join("deps/libvgpu.so"));
    }
}

/// Copies `from` to `to` through a temporary name and a rename, so a
/// process that has the old file mapped keeps it.
fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("so.tmp{}", std::process::id()));
    if let Err(e) = std::fs::copy(from, &tmp).and_then(|_| std::fs::rename(&tmp, to)) {
        let _ = std::fs::remove_file(&tmp);
        panic!("cannot place {}: {e}", to.display());
    }
}
