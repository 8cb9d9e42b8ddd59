//! `vgpu run`: run a command under libvgpu.so with a memory budget / SM
//! share, on the real NVIDIA driver when present, else on a private
//! simulated GPU (said on stderr). The limits go into a limits file
//! (docs/limits.md) the command finds through `LIBVGPU_LIMITS_FILE`, and
//! into HAMi's environment for interposers that read only that.
use std::ffi::CString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use std::os::unix::fs::PermissionsExt;

use anyhow::{bail, Context};
use vgpu_region::limits;
use vgpu_region::{Region, Unusable};

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
    /// An existing region keeps its limits: --memory/--sm must agree with
    /// them (change them with `vgpu limit`).
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

/// Characters `ld.so` splits `LD_PRELOAD` on: a library path holding one
/// would be cut in pieces and the command would run without it.
const PRELOAD_SEPARATORS: &[char] = &[' ', ':', '\t', '\n'];

/// A path `LD_PRELOAD` can carry as one entry: `lib` itself, or a symlink
/// to it in `dir` (ld.so has no quoting).
pub fn preload_path(lib: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let clean = |p: &Path| !p.to_string_lossy().contains(PRELOAD_SEPARATORS);
    if clean(lib) {
        return Ok(lib.to_owned());
    }
    let link = dir.join("libvgpu.so");
    if !clean(&link) {
        bail!(
            "the interposer path {:?} holds a space, colon, tab or newline (LD_PRELOAD splits on them) and so does the temporary directory {:?}",
            lib,
            dir
        );
    }
    std::os::unix::fs::symlink(lib, &link)
        .with_context(|| format!("linking {} at {}", lib.display(), link.display()))?;
    Ok(link)
}

/// The environment that puts a process under libvgpu.so. `lib` must be a
/// single `LD_PRELOAD` entry (see `preload_path`).
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

/// What `--memory`/`--sm` ask for, as a limit on every device.
fn requested(memory: Option<u64>, sm: Option<u32>) -> limits::DeviceLimit {
    limits::DeviceLimit {
        memory: memory.filter(|&m| m != 0),
        sm: sm.filter(|&s| s != 0 && s < 100),
    }
}

fn describe(l: limits::DeviceLimit) -> String {
    format!(
        "memory {}, SM {}",
        l.memory.map_or_else(|| "none".into(), |m| format!("{m} B")),
        l.sm.map_or_else(|| "none".into(), |s| format!("{s}%"))
    )
}

/// Where the limits of this run come from.
#[derive(Debug, PartialEq, Eq)]
pub enum LimitsPlan {
    /// Write this file (the run's own, or a fresh region's) and name it.
    Write(PathBuf),
    /// An existing limits file applies; name it.
    Use(PathBuf),
    /// No limits file: the environment (and an existing region's header)
    /// apply.
    EnvOnly,
}

/// For `--cache`: what applies to the region there, refusing a request
/// that would be silently ignored (an existing region keeps its limits).
pub fn plan_for_cache(
    cache: &Path,
    memory: Option<u64>,
    sm: Option<u32>,
) -> anyhow::Result<LimitsPlan> {
    let asked = memory.is_some() || sm.is_some();
    let want = requested(memory, sm);
    let file = limits::path_for_region(cache);
    let differs = |have: limits::DeviceLimit| {
        (memory.is_some() && have.memory != want.memory) || (sm.is_some() && have.sm != want.sm)
    };
    if let Some(l) = crate::cmd_limit::read_existing(&file)? {
        let mut lines: Vec<limits::DeviceLimit> = l
            .devices
            .iter()
            .map(|d| l.for_device(d.device.as_str()))
            .collect();
        lines.push(l.for_device("*"));
        if let Some(bad) = lines.into_iter().find(|&h| differs(h)) {
            bail!(
                "--cache {}: its limits file {} says {}, which applies to every process sharing the region; \
                 change it with `vgpu limit {} ...`, or omit --cache for a private region",
                cache.display(),
                file.display(),
                describe(bad),
                cache.display()
            );
        }
        eprintln!(
            "vgpu: --cache {}: limits from {}",
            cache.display(),
            file.display()
        );
        return Ok(LimitsPlan::Use(file));
    }
    match Region::open_read_only(cache) {
        Ok(r) => {
            for d in 0..r.device_count() {
                let have = limits::DeviceLimit::from_region(r.limits(d));
                if differs(have) {
                    bail!(
                        "--cache {}: the region records {} for device {d}, which applies to every process sharing it; \
                         change it with `vgpu limit {} ...`, or omit --cache for a private region",
                        cache.display(),
                        describe(have),
                        cache.display()
                    );
                }
            }
            eprintln!(
                "vgpu: --cache {}: the limits the region recorded apply (no limits file at {})",
                cache.display(),
                file.display()
            );
            Ok(LimitsPlan::EnvOnly)
        }
        Err(e) if e.unusable() == Unusable::Missing => {
            // A fresh region: its limits file goes next to it, unless that
            // directory is shared with others (/tmp), where a file named
            // "limits" is anyone's to plant.
            let dir = file.parent().unwrap_or(Path::new("."));
            let private = std::fs::metadata(dir)
                .map(|m| m.permissions().mode() & 0o022 == 0)
                .unwrap_or(false);
            if private {
                Ok(LimitsPlan::Write(file))
            } else {
                if asked {
                    eprintln!(
                        "vgpu: --cache {}: {} is writable by others, so no limits file is written there; the limits come from the environment",
                        cache.display(),
                        dir.display()
                    );
                }
                Ok(LimitsPlan::EnvOnly)
            }
        }
        Err(e) => Err(e).context(format!("--cache {}", cache.display())),
    }
}

/// The limits file `vgpu run` writes: `device *` with the requested values.
pub fn run_limits(memory: Option<u64>, sm: Option<u32>) -> limits::Limits {
    let want = requested(memory, sm);
    let mut l = limits::Limits::default();
    if want != limits::DeviceLimit::default() {
        l.devices.push(limits::DeviceLine {
            device: limits::Device::Any,
            memory: want.memory,
            sm: want.sm,
        });
    }
    l
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
    let memory = match &args.memory {
        Some(m) => {
            Some(vgpu_region::units::parse_mem_size(m).with_context(|| format!("--memory {m:?}"))?)
        }
        None => None,
    };
    let sm = match &args.sm {
        Some(s) => {
            Some(vgpu_region::units::parse_sm_percent(s).with_context(|| format!("--sm {s:?}"))?)
        }
        None => None,
    };
    let lib = locate_lib(args.lib.clone())?;
    if CString::new(args.cmd[0].as_bytes()).is_err() {
        bail!("command contains a NUL byte");
    }
    let plan = match &args.cache {
        Some(c) => plan_for_cache(c, memory, sm)?,
        None => LimitsPlan::EnvOnly,
    };
    // Always a private directory: the run's region and limits file unless
    // --cache, and the interposer's link when its path needs one.
    let tmp = private_dir("vgpu-run")?;
    let result = run_in(&args, &lib, &tmp, plan, memory, sm);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn run_in(
    args: &Args,
    lib: &Path,
    tmp: &Path,
    plan: LimitsPlan,
    memory: Option<u64>,
    sm: Option<u32>,
) -> anyhow::Result<ExitCode> {
    let lib = preload_path(lib, tmp)?;
    let (cache, plan) = match &args.cache {
        Some(c) => (c.clone(), plan),
        None => (
            tmp.join("region.cache"),
            LimitsPlan::Write(tmp.join("limits")),
        ),
    };
    let cmd_line = &args.cmd;
    let force_sim = args.sim;
    let limits_file = match plan {
        LimitsPlan::Write(f) => {
            limits::write_limits_file_atomic(&f, &run_limits(memory, sm))
                .with_context(|| format!("writing the limits file {}", f.display()))?;
            Some(f)
        }
        LimitsPlan::Use(f) => Some(f),
        LimitsPlan::EnvOnly => None,
    };
    let mut sim = None;
    let driver = if force_sim {
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
            if force_sim {
                eprintln!("vgpu: --sim: running on a simulated GPU (vgpu-sim, a test double)");
            } else {
                eprintln!("vgpu: no NVIDIA driver found; running on a simulated GPU (vgpu-sim, a test double)");
            }
            sim = Some(h);
        }
    }
    let mut cmd = Command::new(&cmd_line[0]);
    cmd.args(&cmd_line[1..]);
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
    match &limits_file {
        Some(f) => {
            cmd.env(limits::PATH_ENV, f);
        }
        None => {
            cmd.env_remove(limits::PATH_ENV);
        }
    }
    let st = cmd
        .status()
        .with_context(|| format!("cannot run {:?}", cmd_line[0]));
    drop(sim);
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
