//! `vgpu run`, `vgpu demo` and `vgpu hooks` (the CLI binary, built by
//! `cargo build --workspace`).
use crate::common;

use std::path::PathBuf;

use common::*;

fn vgpu() -> PathBuf {
    vgpu_sim::locate_artifact("vgpu").expect("the vgpu CLI is built (cargo build --workspace)")
}

#[test]
fn hooks_lists_every_declared_hook() {
    let out = run(
        &vgpu(),
        &["hooks", "--lib", libvgpu().to_str().unwrap()],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for h in vgpu_core::ffi::all() {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(h.name)),
            "{} missing:\n{text}",
            h.name
        );
    }
    let tsv = run(
        &vgpu(),
        &["hooks", "--tsv", "--lib", libvgpu().to_str().unwrap()],
        &[],
    );
    assert_eq!(
        String::from_utf8_lossy(&tsv.stdout),
        vgpu_core::ffi::coverage::tsv()
    );
    let bad = run(&vgpu(), &["hooks", "--lib", "/nonexistent/libvgpu.so"], &[]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent/libvgpu.so"));
}

#[test]
fn run_limits_a_command_on_the_simulated_gpu() {
    let prog = c_program("limits");
    let lib = libvgpu();
    let out = run(
        &vgpu(),
        &[
            "run",
            "--sim",
            "--memory",
            "256m",
            "--lib",
            lib.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "fill",
            &(256 * MIB).to_string(),
        ],
        &[("LIBVGPU_CONTEXT_MEMORY".into(), "0".into())],
    );
    assert_passed(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("simulated GPU"))
            .count(),
        1,
        "one notice line: {stderr}"
    );
    // The view inside is the budget; --device picks the visible device.
    let out = run(
        &vgpu(),
        &[
            "run",
            "--sim",
            "--memory",
            "3GiB",
            "--device",
            "0",
            "--",
            prog.to_str().unwrap(),
            "view",
        ],
        &[],
    );
    let f = facts(&out);
    assert_eq!(num(&f, "cuda.0.total_mem"), 3 * GIB);
    assert_eq!(num(&f, "nvml.0.total"), 3 * GIB);
}

#[test]
fn run_passes_the_exit_status_and_refuses_bad_sizes() {
    let out = run(
        &vgpu(),
        &["run", "--sim", "--memory", "1g", "--", "sh", "-c", "exit 7"],
        &[],
    );
    assert_eq!(out.status.code(), Some(7));
    let out = run(
        &vgpu(),
        &["run", "--sim", "--memory", "lots", "--", "true"],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lots"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn demo_shows_one_tenant_under_and_one_refused() {
    let out = run(&vgpu(), &["demo"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("alice stayed under her budget"), "{stdout}");
    assert!(
        stdout.contains("bob was refused with CUDA_ERROR_OUT_OF_MEMORY"),
        "{stdout}"
    );
    assert!(stdout.contains("Both see a 2.00 GiB GPU"), "{stdout}");
    assert!(
        stdout.contains("limit 2.00 GiB, in use"),
        "the ledger: {stdout}"
    );
}
