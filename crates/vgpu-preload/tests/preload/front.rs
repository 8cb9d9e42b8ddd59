//! The front object `libvgpu.so`: a process that never uses CUDA never
//! loads the interposer proper (`libvgpu_core.so`); the first CUDA call
//! does; without the core every hooked call fails (never a silent pass
//! past the limits); and the core preloaded directly is still a complete
//! interposer.
use crate::common;

use std::path::PathBuf;

use common::*;

fn core() -> PathBuf {
    vgpu_sim::locate_artifact("libvgpu_core.so").expect("libvgpu_core.so is built with this crate")
}

#[test]
fn a_process_that_never_calls_cuda_never_loads_the_core() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let env = env(&s, Some(&cache), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
    // The shell's own mappings, from inside it.
    let out = run(
        std::path::Path::new("/bin/sh"),
        &["-c", "cat /proc/$$/maps"],
        &env,
    );
    let maps = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        maps.contains("/libvgpu.so"),
        "the front is preloaded:\n{maps}"
    );
    assert!(
        !maps.contains("libvgpu_core.so"),
        "the core stays out:\n{maps}"
    );
    assert!(!maps.contains("libcuda"), "and so does the driver:\n{maps}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_first_cuda_call_loads_the_core_and_every_route_reaches_the_hooks() {
    // The routes test through the front (as every other test here does):
    // direct calls, dlsym and cuGetProcAddress all hit the ledger.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("LIBVGPU_CONTEXT_MEMORY", "8m"),
        ],
    );
    let out = run(
        &c_program("limits"),
        &["routes", &(512 * MIB).to_string()],
        &env,
    );
    assert_passed(&out);
}

#[test]
fn the_core_is_loaded_before_the_first_call_of_a_process_that_uses_the_driver() {
    // Start-up latency: the core's load happens before cuInit, in the
    // front's constructor for a program linked against the driver, at the
    // dlsym that precedes cuInit for one that dlopens it (libcudart,
    // PyTorch).
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let env = env(&s, Some(&cache), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
    let out = run(&c_program("early"), &[], &env);
    assert_passed(&out);
    // The same source, not linked against the driver.
    let bare = c_program_unlinked("early", &["-DEARLY_DLOPEN"], dir.path());
    let out = run(&bare, &[], &env);
    assert_passed(&out);
}

#[test]
fn the_core_preloaded_directly_is_a_complete_interposer() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let mut env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("LIBVGPU_CONTEXT_MEMORY", "8m"),
        ],
    );
    for (k, v) in env.iter_mut() {
        if k == "LD_PRELOAD" {
            *v = core().display().to_string();
        }
    }
    let out = run(
        &c_program("limits"),
        &["routes", &(512 * MIB).to_string()],
        &env,
    );
    assert_passed(&out);
}

#[test]
fn without_the_core_every_hooked_call_fails_with_one_line() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    // The front alone, in a directory without libvgpu_core.so.
    let front = dir.path().join("libvgpu.so");
    std::fs::copy(libvgpu(), &front).unwrap();
    let cache = dir.path().join("r.cache");
    let mut env = env(&s, Some(&cache), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
    for (k, v) in env.iter_mut() {
        if k == "LD_PRELOAD" {
            *v = front.display().to_string();
        }
    }
    let out = run(&c_program("fork_hold"), &["0"], &env);
    let f = facts(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    // CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, not the driver's success.
    assert_eq!(f.get("rc").map(String::as_str), Some("303"), "{f:?} {err}");
    assert!(
        err.contains("cannot load the interposer") && err.contains("libvgpu_core.so"),
        "{err}"
    );
    assert_eq!(
        err.matches("cannot load the interposer").count(),
        1,
        "one line per process: {err}"
    );
    // NVML's hooked calls fail too (NVML_ERROR_LIBRARY_NOT_FOUND).
    let out = run(&c_program("fork_nvml"), &["0"], &env);
    let f = facts(&out);
    assert_eq!(f.get("thread_rc").map(String::as_str), Some("12"), "{f:?}");
}

#[test]
fn a_truncated_core_fails_closed_with_one_line_not_sigbus() {
    // Before: dlopen mapped the truncated file and the first CUDA or NVML
    // call died of SIGBUS (exit 135).
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let front = dir.path().join("libvgpu.so");
    std::fs::copy(libvgpu(), &front).unwrap();
    let bytes = std::fs::read(core()).unwrap();
    std::fs::write(
        dir.path().join("libvgpu_core.so"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let cache = dir.path().join("r.cache");
    let mut env = env(&s, Some(&cache), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
    for (k, v) in env.iter_mut() {
        if k == "LD_PRELOAD" {
            *v = front.display().to_string();
        }
    }
    let out = run(&c_program("fork_hold"), &["0"], &env);
    let f = facts(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        f.get("rc").map(String::as_str),
        Some("303"),
        "{:?} {f:?} {err}",
        out.status
    );
    assert_eq!(
        err.matches("cannot load the interposer").count(),
        1,
        "{err}"
    );
    assert!(err.contains("truncated"), "{err}");
    let out = run(&c_program("fork_nvml"), &["0"], &env);
    let f = facts(&out);
    assert_eq!(
        f.get("thread_rc").map(String::as_str),
        Some("12"),
        "{:?} {f:?}",
        out.status
    );
}

#[test]
fn the_core_is_found_beside_the_real_file_of_a_symlinked_front() {
    // `vgpu run --lib "<dir with a space>/libvgpu.so"` preloads a symlink
    // in a clean directory; before, the front looked for the core beside
    // the symlink and every CUDA call failed (303).
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let spaced = dir.path().join("with space");
    std::fs::create_dir(&spaced).unwrap();
    std::fs::copy(libvgpu(), spaced.join("libvgpu.so")).unwrap();
    std::fs::copy(core(), spaced.join("libvgpu_core.so")).unwrap();
    let clean = dir.path().join("clean");
    std::fs::create_dir(&clean).unwrap();
    let link = clean.join("libvgpu.so");
    std::os::unix::fs::symlink(spaced.join("libvgpu.so"), &link).unwrap();
    let cache = dir.path().join("r.cache");
    let mut env = env(&s, Some(&cache), &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
    for (k, v) in env.iter_mut() {
        if k == "LD_PRELOAD" {
            *v = link.display().to_string();
        }
    }
    let out = run(&c_program("fork_hold"), &["0"], &env);
    let f = facts(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(f.get("rc").map(String::as_str), Some("0"), "{f:?} {err}");
    assert!(!err.contains("cannot load the interposer"), "{err}");
}

/// The core's `DT_NEEDED` entries, from `readelf -d` (binutils comes with
/// the C compiler the suite needs anyway).
fn needed(lib: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .expect("readelf runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next().map(str::to_owned))
        .collect()
}

#[test]
fn the_core_needs_nothing_beyond_glibc() {
    // Every extra library is mapped and relocated in each process at its
    // first CUDA call; libgcc_s also runs a constructor whose cpuid
    // instructions trap in a VM. Its unwinder and helpers are linked in
    // statically (build.rs). libm is glibc's own (a workspace build links
    // it where a feature-unified dependency does floating-point math).
    let libs = needed(&core());
    assert!(libs.iter().any(|l| l == "libc.so.6"), "{libs:?}");
    for l in &libs {
        assert!(
            l == "libc.so.6" || l == "libm.so.6" || l.starts_with("ld-linux"),
            "libvgpu_core.so needs {l}: {libs:?}"
        );
    }
    // The front likewise needs libc alone.
    let front = vgpu_sim::locate_artifact("libvgpu.so").unwrap();
    assert_eq!(needed(&front), ["libc.so.6"]);
}
