//! Links libgcc's unwinder statically (`libgcc_eh.a`, hidden symbols) so
//! that libvgpu.so does not pull `libgcc_s.so.1` into every process of the
//! container: loading it costs each process (shells, `ls`, Python) a second
//! library to map and relocate and libgcc_s's constructor (`cpuid`s, which
//! trap in a VM): measured ~80 µs of the ~160 µs libvgpu.so added to
//! `/bin/true` here. Panics still unwind to the `catch_unwind` at every
//! export. Where `libgcc_eh.a` is not found (another toolchain), std's
//! default (`libgcc_s`) stays.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let found = Command::new(&cc)
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
        }
        None => println!(
            "cargo:warning=libgcc_eh.a not found via {cc}; libvgpu.so will need libgcc_s.so.1"
        ),
    }
}
