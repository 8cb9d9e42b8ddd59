//! Shared helpers: a private simulated GPU, the built libvgpu.so, the C
//! client compiled against NVIDIA's headers, and processes run under the
//! interposer.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub use vgpu_sim::{SimHandle, SimOptions};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn sim(devices: u32) -> SimHandle {
    SimHandle::start(SimOptions::default().devices(devices))
        .unwrap_or_else(|e| panic!("start sim: {e} ({e:?})"))
}

pub fn physical_total() -> u64 {
    SimOptions::default().config.device.memory_bytes
}

pub fn libvgpu() -> PathBuf {
    vgpu_sim::locate_artifact("libvgpu.so").expect("libvgpu.so is built with this crate's tests")
}

pub fn tenant() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vgpu-demo-tenant"))
}

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("vgpu-preload")
}

/// Compiles `tests/c/<name>.c` to `out` with gcc (`$CC`), warnings as
/// errors, NVIDIA's headers on the include path, and `extra` arguments
/// (defines, `-shared`, libraries) after the source.
fn compile_c(name: &str, out: &Path, extra: &[&std::ffi::OsStr]) {
    let inc =
        vgpu_conformance::nvidia_include().expect("NVIDIA headers (scripts/fetch-nvidia-headers)");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let r = Command::new(std::env::var_os("CC").unwrap_or_else(|| "gcc".into()))
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(&inc)
        .arg("-I")
        .arg(vgpu_conformance::conformance_dir())
        .arg("-o")
        .arg(out)
        .arg(&src)
        .args(extra)
        .output()
        .expect("run gcc");
    assert!(
        r.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&r.stderr)
    );
}

/// `tests/c/<name>.c` compiled with gcc against NVIDIA's cuda.h/nvml.h and
/// linked `-lcuda -lnvidia-ml` (against the simulated driver's dev links).
pub fn c_program(name: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let m = BUILT.get_or_init(Default::default);
    let mut m = m.lock().unwrap();
    if let Some(p) = m.get(name) {
        return p.clone();
    }
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let links = tempfile::Builder::new()
        .prefix(".links-")
        .tempdir_in(&dir)
        .unwrap();
    let lib = vgpu_sim::link_libs(links.path())
        .expect("simulated driver built (cargo build -p vgpu-sim-cuda -p vgpu-sim-nvml)");
    let tmp = links.path().join(name);
    compile_c(
        name,
        &tmp,
        &[
            "-L".as_ref(),
            lib.as_os_str(),
            "-lcuda".as_ref(),
            "-lnvidia-ml".as_ref(),
            "-ldl".as_ref(),
        ],
    );
    let exe = dir.join(name);
    std::fs::rename(&tmp, &exe).unwrap();
    m.insert(name.to_string(), exe.clone());
    exe
}

/// `tests/c/<name>.c` as a shared library (for chained-preload tests).
pub fn c_shared(name: &str) -> PathBuf {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix(".so-")
        .tempdir_in(&dir)
        .unwrap();
    let so = tmp.path().join(format!("lib{name}.so"));
    compile_c(
        name,
        &so,
        &["-shared".as_ref(), "-fPIC".as_ref(), "-ldl".as_ref()],
    );
    let dest = dir.join(format!("lib{name}.so"));
    std::fs::rename(&so, &dest).unwrap();
    dest
}

/// `tests/c/<name>.c` linked against nothing but libc (a program that
/// `dlopen`s the driver itself), with `defines` (`-DNAME`), into `dir`.
pub fn c_program_unlinked(name: &str, defines: &[&str], dir: &Path) -> PathBuf {
    let exe = dir.join(format!("{name}-unlinked"));
    let mut extra: Vec<&std::ffi::OsStr> = defines.iter().map(|d| d.as_ref()).collect();
    extra.push("-ldl".as_ref());
    compile_c(name, &exe, &extra);
    exe
}

/// The environment of a process in a container with region `cache`.
pub fn env(sim: &SimHandle, cache: Option<&Path>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = sim.env();
    e.push(("LD_PRELOAD".into(), libvgpu().display().to_string()));
    if let Some(c) = cache {
        e.push((
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            c.display().to_string(),
        ));
    }
    for (k, v) in extra {
        e.push((k.to_string(), v.to_string()));
    }
    e
}

/// A command with a clean vgpu environment (the test's own env may carry
/// variables of the contract) plus `env`.
pub fn command(exe: &Path, args: &[&str], env: &[(String, String)]) -> Command {
    let mut c = Command::new(exe);
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUDA_")
            || k.starts_with("LIBVGPU_")
            || k == "LD_PRELOAD"
            || k == "LIBCUDA_LOG_LEVEL"
        {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    c
}

pub fn run(exe: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    command(exe, args, env).output().expect("spawn")
}

/// `key=value` lines of a program's stdout.
pub fn facts(out: &Output) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

pub fn num(f: &BTreeMap<String, String>, k: &str) -> u64 {
    f.get(k)
        .unwrap_or_else(|| panic!("missing {k} in {f:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{k} not a number: {f:?}"))
}

/// The C client's PASS/FAIL report must be all PASS with the summary line.
pub fn assert_passed(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    let passed = stdout.lines().filter(|l| l.starts_with("PASS")).count();
    assert!(
        out.status.success()
            && fails.is_empty()
            && passed > 0
            && stdout.contains(&format!("{passed} passed, 0 failed")),
        "status {:?}\nfailures: {fails:#?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn region_at(path: &Path, limits: &[u64]) -> vgpu_region::Region {
    let opts = vgpu_region::CreateOptions {
        slots: 64,
        devices: limits
            .iter()
            .enumerate()
            .map(|(i, &l)| vgpu_region::DeviceConfig {
                // The simulated device's own UUID: processes bind their
                // CUDA ordinals to region devices by UUID.
                uuid: vgpu_sim::Machine::device_uuid_string(i),
                mem_limit: l,
                sm_limit: 0,
            })
            .collect(),
    };
    vgpu_region::Region::open_or_create(path, &opts)
        .expect("create region")
        .0
}
