//! `vgpu run` as a user types it: an interposer path LD_PRELOAD would split,
//! `--cache` on a region whose limits are already set, the limits file it
//! writes and names. Needs the built libvgpu.so (`cargo build --workspace`).
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vgpu_region::{CreateOptions, DeviceConfig, Region};

fn libvgpu() -> PathBuf {
    vgpu_sim::locate_artifact("libvgpu.so").expect("libvgpu.so is built (cargo build --workspace)")
}

fn vgpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove(vgpu_region::limits::PATH_ENV)
        .env_remove("VGPU_SIM_DIR")
        .output()
        .expect("run vgpu")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What the command sees: whether libvgpu.so is mapped into it, its
/// LD_PRELOAD, and the limits file it is told about.
const PROBE: &str = "grep -c libvgpu /proc/self/maps; echo \"PRELOAD=$LD_PRELOAD\"; \
                     echo \"FILE=$LIBVGPU_LIMITS_FILE\"; \
                     [ -n \"$LIBVGPU_LIMITS_FILE\" ] && cat \"$LIBVGPU_LIMITS_FILE\"; true";

#[test]
fn an_interposer_path_with_spaces_or_colons_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["with space", "with:colon"] {
        let d = dir.path().join(sub);
        std::fs::create_dir(&d).unwrap();
        let lib = d.join("libvgpu.so");
        std::fs::copy(libvgpu(), &lib).unwrap();
        let out = vgpu(&[
            "run",
            "--sim",
            "--memory",
            "256m",
            "--lib",
            lib.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            PROBE,
        ]);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{sub}: {o}{e}");
        assert!(!e.contains("cannot be preloaded"), "{sub}: {e}");
        let mapped: u32 = o.lines().next().unwrap_or("0").trim().parse().unwrap_or(0);
        assert!(
            mapped > 0,
            "{sub}: libvgpu.so not loaded into the command:\n{o}{e}"
        );
        let pre = o.lines().find_map(|l| l.strip_prefix("PRELOAD=")).unwrap();
        assert!(!pre.contains(' ') && !pre.contains(':'), "{sub}: {pre}");
        // The run's own limits file, named to the command.
        assert!(
            o.contains("vgpu-limits 1\ndevice * memory=268435456\n"),
            "{sub}: {o}"
        );
    }
}

fn region_with(dir: &Path, mem: u64) -> PathBuf {
    let p = dir.join("region.cache");
    Region::open_or_create(
        &p,
        &CreateOptions {
            slots: 4,
            devices: vec![DeviceConfig {
                uuid: "GPU-run-0".into(),
                mem_limit: mem,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    p
}

fn run_on(cache: &Path, memory: &str) -> Output {
    vgpu(&[
        "run",
        "--sim",
        "--memory",
        memory,
        "--cache",
        cache.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        PROBE,
    ])
}

/// `--memory` on an existing region used to be ignored silently (the
/// region's recorded limit applied): now what applies is said, and a
/// request that would be ignored is refused.
#[test]
fn memory_with_an_existing_region_says_what_applies() {
    let dir = tempfile::tempdir().unwrap();
    let cache = region_with(dir.path(), 2 << 30);
    let out = run_on(&cache, "1g");
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("the region records memory 2147483648 B") && e.contains("vgpu limit"),
        "{e}"
    );
    let out = run_on(&cache, "2g");
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    assert!(e.contains("the limits the region recorded apply"), "{e}");
    assert!(o.contains("FILE=\n"), "no limits file named: {o}");
    // With a limits file next to it, the file is what applies.
    std::fs::write(
        dir.path().join("limits"),
        "vgpu-limits 1\ndevice * memory=1073741824\n",
    )
    .unwrap();
    let out = run_on(&cache, "2g");
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("its limits file") && e.contains("1073741824"),
        "{e}"
    );
    let out = run_on(&cache, "1g");
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    assert!(
        o.contains(&format!("FILE={}\n", dir.path().join("limits").display())),
        "{o}"
    );
}

#[test]
fn a_fresh_cache_gets_its_limits_file_unless_the_directory_is_shared() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("region.cache");
    let out = run_on(&cache, "512m");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let l = vgpu_region::limits::read_limits_file(&dir.path().join("limits")).unwrap();
    assert_eq!(l.for_device("GPU-any").memory, Some(512 << 20));
    // A directory others can write: no file named "limits" is planted.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run_on(&shared.join("region.cache"), "512m");
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    assert!(e.contains("writable by others"), "{e}");
    assert!(!shared.join("limits").exists());
    assert!(o.contains("FILE=\n"), "{o}");
}
