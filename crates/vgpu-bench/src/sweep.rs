//! Sweeps: several modes × worker counts × repeats, run in a randomized
//! order (so drift of a noisy machine does not line up with N or mode), plus
//! the header that says where the numbers came from.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::{self, HarnessError, Mode, RunConfig};
use crate::report::{Header, Run, SweepReport};
use crate::worker::{Resolve, Then};

/// Default cost profile of the simulated driver for the bench.
pub const DEFAULT_SIM_PROFILE: &str = "a100-burst";

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("unknown mode {0:?} (expected native, vgpu, legacy or preload:PATH)")]
    UnknownMode(String),
    #[error("{what} not found: {path} (build the workspace: cargo build --workspace)")]
    MissingLibrary { what: &'static str, path: String },
    #[error("cannot start the simulated driver")]
    Sim(#[source] vgpu_sim::SimError),
    #[error("bad sim profile")]
    Profile(#[source] vgpu_sim::ConfigError),
    #[error("run {mode}@{workers} failed")]
    Run {
        mode: String,
        workers: usize,
        #[source]
        source: HarnessError,
    },
    #[error("no worker counts given")]
    NoConditions,
}

/// Find a built artifact (`libvgpu.so`, `vgpu-bench-worker`, …) the way the
/// rest of the workspace does.
pub fn artifact(name: &'static str) -> Result<PathBuf, SweepError> {
    vgpu_sim::locate_artifact(name)
        .ok()
        .or_else(|| harness::locate_artifact(name))
        .ok_or(SweepError::MissingLibrary {
            what: name,
            path: name.to_string(),
        })
}

/// Parse one `--mode` value. `legacy` is the test-only serialized-probe
/// interposer (`libvgpu_legacy_probe.so`), reported as `legacy-probe`.
pub fn parse_mode(s: &str) -> Result<Mode, SweepError> {
    match s {
        "native" => Ok(Mode::Native),
        "vgpu" => Ok(Mode::Vgpu {
            lib: artifact("libvgpu.so")?,
        }),
        "legacy" | "legacy-probe" => Ok(Mode::Preload {
            label: "legacy-probe".into(),
            lib: artifact("libvgpu_legacy_probe.so")?,
        }),
        _ => match s.strip_prefix("preload:") {
            Some(p) if !p.is_empty() => {
                let lib = std::fs::canonicalize(p).map_err(|_| SweepError::MissingLibrary {
                    what: "preload library",
                    path: p.to_string(),
                })?;
                let name = lib
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Ok(Mode::Preload {
                    label: format!("preload:{name}"),
                    lib,
                })
            }
            _ => Err(SweepError::UnknownMode(s.to_string())),
        },
    }
}

/// The driver the workers run on.
pub enum Driver {
    /// The machine's NVIDIA driver.
    Real { description: String },
    /// A private simulated machine (a test double), alive while this is.
    Sim {
        profile: String,
        handle: vgpu_sim::SimHandle,
    },
}

impl Driver {
    /// `sim`: `Some(profile)` forces the simulated driver. Otherwise the real
    /// driver when one is present, else the simulator with the default
    /// profile; the returned note says which and why.
    pub fn select(sim: Option<&str>) -> Result<(Driver, String), SweepError> {
        let start = |profile: &str| -> Result<Driver, SweepError> {
            let opts = vgpu_sim::SimOptions::profile(profile).map_err(SweepError::Profile)?;
            let handle = vgpu_sim::SimHandle::start(opts).map_err(SweepError::Sim)?;
            Ok(Driver::Sim {
                profile: profile.to_string(),
                handle,
            })
        };
        if let Some(p) = sim {
            let d = start(p)?;
            return Ok((d, format!("running on the simulated driver (vgpu-sim, profile {p}; a test double), as asked")));
        }
        match real_driver() {
            Some(description) => {
                let note = format!("running on the NVIDIA driver: {description}");
                Ok((Driver::Real { description }, note))
            }
            None => {
                let d = start(DEFAULT_SIM_PROFILE)?;
                Ok((
                    d,
                    format!(
                        "no NVIDIA driver found (/proc/driver/nvidia/version absent, nvidia-smi unavailable): running on the simulated driver (vgpu-sim, profile {DEFAULT_SIM_PROFILE}; a test double)"
                    ),
                ))
            }
        }
    }

    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            Driver::Real { .. } => Vec::new(),
            Driver::Sim { handle, .. } => handle.env(),
        }
    }

    pub fn description(&self) -> String {
        match self {
            Driver::Real { description } => description.clone(),
            Driver::Sim { profile, .. } => {
                format!("simulated (vgpu-sim, profile {profile}; a test double)")
            }
        }
    }

    pub fn sim_profile(&self) -> Option<String> {
        match self {
            Driver::Real { .. } => None,
            Driver::Sim { profile, .. } => Some(profile.clone()),
        }
    }
}

/// GPU/driver line from nvidia-smi, when an NVIDIA driver is present.
pub fn real_driver() -> Option<String> {
    let present = Path::new("/proc/driver/nvidia/version").exists();
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success());
    match out {
        Some(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let first = lines.first()?.trim().to_string();
            Some(format!(
                "{} GPU(s): {first} (name, driver, memory)",
                lines.len()
            ))
        }
        None if present => Some("NVIDIA driver present (nvidia-smi unavailable)".into()),
        None => None,
    }
}

/// Sweep parameters.
pub struct SweepConfig {
    pub modes: Vec<Mode>,
    pub workers: Vec<usize>,
    pub repeat: usize,
    pub then: Then,
    pub resolve: Resolve,
    pub worker_exe: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub seed: u64,
    pub crash: Vec<usize>,
}

/// Run every condition in a seeded random order. `progress` gets one line
/// per finished run.
pub fn run(
    cfg: &SweepConfig,
    mut header: Header,
    progress: &mut dyn FnMut(&str),
) -> Result<SweepReport, SweepError> {
    if cfg.workers.is_empty() || cfg.modes.is_empty() {
        return Err(SweepError::NoConditions);
    }
    let mut conds: Vec<(usize, usize, usize)> = Vec::new(); // (mode idx, workers, repeat)
    for (mi, _) in cfg.modes.iter().enumerate() {
        for &n in &cfg.workers {
            for r in 0..cfg.repeat.max(1) {
                conds.push((mi, n, r));
            }
        }
    }
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    rng.shuffle(&mut conds);
    header.seed = cfg.seed;
    header.order = conds
        .iter()
        .map(|&(mi, n, r)| format!("{}@{n}#{r}", cfg.modes[mi].label()))
        .collect();
    let mut runs = Vec::new();
    for (k, &(mi, n, r)) in conds.iter().enumerate() {
        let rc = RunConfig {
            mode: cfg.modes[mi].clone(),
            workers: n,
            then: cfg.then,
            resolve: cfg.resolve,
            worker_exe: cfg.worker_exe.clone(),
            env: cfg.env.clone(),
            crash: cfg.crash.clone(),
            timeout: cfg.timeout,
        };
        let res = harness::run(&rc).map_err(|source| SweepError::Run {
            mode: rc.mode.label(),
            workers: n,
            source,
        })?;
        let s = &res.summary;
        progress(&format!(
            "[{}/{}] {}@{} #{}: ok {} failed {} p50 {} p99 {} max {} ms",
            k + 1,
            conds.len(),
            s.mode,
            n,
            r,
            s.ok,
            s.failed,
            s.p50_ms.map_or("-".into(), |v| format!("{v:.2}")),
            s.p99_ms.map_or("-".into(), |v| format!("{v:.2}")),
            s.max_ms.map_or("-".into(), |v| format!("{v:.2}")),
        ));
        runs.push(Run {
            repeat: r,
            result: res,
        });
        // Let the driver finish tearing down the last burst's processes.
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(SweepReport::new(header, runs))
}

/// Header fields that describe this machine and checkout.
pub fn machine_header(command: String, driver: &Driver) -> Header {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    Header {
        command,
        revision: git_revision(),
        driver: driver.description(),
        sim_profile: driver.sim_profile(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model,
        kernel,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        seed: 0,
        order: Vec::new(),
    }
}

/// `git rev-parse --short HEAD` (+ "-dirty" when tracked files changed).
pub fn git_revision() -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}-dirty")
            } else {
                rev
            }
        }
        None => "unknown (not a git checkout)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_or_name_what_is_wrong() {
        assert_eq!(parse_mode("native").unwrap(), Mode::Native);
        let e = parse_mode("fast").unwrap_err().to_string();
        assert!(e.contains("\"fast\"") && e.contains("preload:PATH"), "{e}");
        let e = parse_mode("preload:/nonexistent/libx.so")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/libx.so"), "{e}");
        assert!(parse_mode("preload:").is_err());
        // Any existing file is accepted and labelled by its name.
        let f = tempfile::Builder::new().suffix(".so").tempfile().unwrap();
        match parse_mode(&format!("preload:{}", f.path().display())).unwrap() {
            Mode::Preload { label, lib } => {
                assert!(
                    label.starts_with("preload:") && label.ends_with(".so"),
                    "{label}"
                );
                assert!(lib.is_absolute());
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn sweep_without_conditions_is_refused() {
        let cfg = SweepConfig {
            modes: vec![Mode::Native],
            workers: vec![],
            repeat: 1,
            then: Then::None,
            resolve: Resolve::Default,
            worker_exe: PathBuf::from("/nonexistent"),
            env: vec![],
            timeout: Duration::from_secs(1),
            seed: 1,
            crash: vec![],
        };
        let r = run(&cfg, Header::default(), &mut |_| {});
        assert!(matches!(r, Err(SweepError::NoConditions)));
    }
}
