//! `vgpu inspect` at the default path, where any local user can plant a
//! FIFO: it must answer at once, in a private mount namespace with its own
//! /tmp so nothing real is touched.
use std::process::Command;

#[test]
fn a_fifo_at_the_default_region_path_does_not_hang_inspect() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Under CI (root) a skip would let the test pass by not running.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root"
        );
        eprintln!("SKIP: needs root (a private mount namespace)");
        return;
    }
    // The binary is held open on fd 3 and run through it: the new /tmp
    // hides the checkout when it lives under /tmp (a CI clone may).
    let script = "exec 3<\"$0\" && mount -t tmpfs tmpfs /tmp && mkdir -m 1777 /tmp/vgpu \
                  && mkfifo -m 0666 /tmp/vgpu/region.cache \
                  && timeout 60 /proc/self/fd/3 inspect; echo \"rc=$?\"";
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script, env!("CARGO_BIN_EXE_vgpu")])
        .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // 1: refused with its cause (124 would be timeout's: it hung).
    assert!(o.contains("rc=1"), "{o}{e}");
    assert!(
        e.contains("/tmp/vgpu/region.cache: not a regular file (FIFO) [not-regular-file]"),
        "{e}"
    );
}
