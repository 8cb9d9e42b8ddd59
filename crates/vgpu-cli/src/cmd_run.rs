//! `vgpu run`: run a command under libvgpu.so with a memory budget / SM
//! share, on the real NVIDIA driver when present, else on a private
//! simulated GPU (said on stderr).
use std::ffi::CString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Device-memory budget per visible device (bytes or k/m/g, KiB/MiB/GiB).
    #[arg(long)]
    memory: Option<String>,
    /// SM share in percent.
    #[arg(long)]
    sm: Option<String>,
    /// Make only this device visible (CUDA index or UUID; repeat for more).
    #[arg(long)]
    device: Vec<String>,
    /// The shared-region file (default: a fresh private one for this run).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Use the simulated GPU even if an NVIDIA driver is present.
    #[arg(long)]
    sim: bool,
    /// The interposer library (default: the built libvgpu.so next to `vgpu`).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// Where `libcuda.so.1` comes from, if anywhere.
pub enum Driver {
    /// A real driver (not vgpu-sim).
    Real(String),
    /// The environment already points at a simulated machine (`VGPU_SIM_DIR`).
    SimFromEnv,
    None,
}

/// Finds `libcuda.so.1` without loading it (`vgpu` itself never loads a
/// driver): real when present and not vgpu-sim's.
pub fn detect_driver() -> Driver {
    if std::env::var_os("VGPU_SIM_DIR").is_some_and(|d| !d.is_empty()) {
        return Driver::SimFromEnv;
    }
    // Look, do not load: the usual driver locations, then the loader cache.
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/cuda/compat",
    ] {
        let p = Path::new(dir).join("libcuda.so.1");
        if let Ok(real) = std::fs::canonicalize(&p) {
            let name = real
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !name.contains("vgpu_sim") {
                return Driver::Real(real.display().to_string());
            }
        }
    }
    if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(l) = text
            .lines()
            .find(|l| l.trim_start().starts_with("libcuda.so.1 "))
        {
            if let Some(path) = l.split("=>").nth(1) {
                let real = std::fs::canonicalize(path.trim())
                    .unwrap_or_else(|_| PathBuf::from(path.trim()));
                if !real.to_string_lossy().contains("vgpu_sim") {
                    return Driver::Real(real.display().to_string());
                }
            }
        }
    }
    Driver::None
}

/// libvgpu.so: `--lib`, else next to this executable.
pub fn locate_lib(lib: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let p = match lib {
        Some(p) => p,
        None => vgpu_sim::locate_artifact("libvgpu.so")
            .context("libvgpu.so not found (cargo build -p vgpu-preload, or pass --lib)")?,
    };
    std::fs::canonicalize(&p).with_context(|| format!("interposer {}", p.display()))
}

/// The environment that puts a process under libvgpu.so.
pub fn preload_env(
    lib: &Path,
    cache: &Path,
    memory: Option<&str>,
    sm: Option<&str>,
    devices: &[String],
) -> Vec<(String, String)> {
    let mut env = vec![(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
        cache.display().to_string(),
    )];
    let pre = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    env.push(("LD_PRELOAD".into(), pre));
    if let Some(m) = memory {
        env.push(("CUDA_DEVICE_MEMORY_LIMIT".into(), m.to_string()));
    }
    if let Some(s) = sm {
        env.push(("CUDA_DEVICE_SM_LIMIT".into(), s.to_string()));
    }
    if !devices.is_empty() {
        env.push(("CUDA_VISIBLE_DEVICES".into(), devices.join(",")));
    }
    env
}

/// The exit code a shell would report for a finished child.
pub fn exit_code(st: std::process::ExitStatus) -> ExitCode {
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        _ => ExitCode::from(1),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(m) = &args.memory {
        vgpu_region::units::parse_mem_size(m).with_context(|| format!("--memory {m:?}"))?;
    }
    if let Some(s) = &args.sm {
        vgpu_region::units::parse_sm_percent(s).with_context(|| format!("--sm {s:?}"))?;
    }
    let lib = locate_lib(args.lib)?;
    if CString::new(args.cmd[0].as_bytes()).is_err() {
        bail!("command contains a NUL byte");
    }
    let (cache, tmp) = match args.cache {
        Some(c) => (c, None),
        None => {
            let d = private_dir("vgpu-run")?;
            (d.join("region.cache"), Some(d))
        }
    };
    let mut sim = None;
    let driver = if args.sim {
        Driver::None
    } else {
        detect_driver()
    };
    match driver {
        Driver::Real(p) => tracing_free_note(&format!("using the NVIDIA driver {p}")),
        Driver::SimFromEnv => {}
        Driver::None => {
            let h = vgpu_sim::SimHandle::start(vgpu_sim::SimOptions::default())
                .context("starting the simulated GPU")?;
            if args.sim {
                eprintln!("vgpu: --sim: running on a simulated GPU (vgpu-sim, a test double)");
            } else {
                eprintln!("vgpu: no NVIDIA driver found; running on a simulated GPU (vgpu-sim, a test double)");
            }
            sim = Some(h);
        }
    }
    let mut cmd = Command::new(&args.cmd[0]);
    cmd.args(&args.cmd[1..]);
    if let Some(h) = &sim {
        cmd.envs(h.env());
    }
    cmd.envs(preload_env(
        &lib,
        &cache,
        args.memory.as_deref(),
        args.sm.as_deref(),
        &args.device,
    ));
    let st = cmd
        .status()
        .with_context(|| format!("cannot run {:?}", args.cmd[0]));
    drop(sim);
    if let Some(d) = tmp {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(exit_code(st?))
}

/// A fresh directory under the temp dir, private to this user.
pub fn private_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let d = base.join(format!("{prefix}-{}-{nanos:x}{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", d.display())),
        }
    }
    bail!("cannot create a private directory under {}", base.display())
}

fn tracing_free_note(msg: &str) {
    if std::env::var_os("VGPU_VERBOSE").is_some() {
        eprintln!("vgpu: {msg}");
    }
}
