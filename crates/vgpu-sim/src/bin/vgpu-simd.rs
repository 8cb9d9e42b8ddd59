//! `vgpu-simd`: the simulated machine's daemon.
//!
//! `vgpu-simd [--dir DIR] [--profile NAME] [--devices N] [--config FILE]`;
//! unset flags fall back to `VGPU_SIM_DIR`, `VGPU_SIM_PROFILE`,
//! `VGPU_SIM_DEVICES`, `VGPU_SIM_CONFIG`.
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut profile = std::env::var("VGPU_SIM_PROFILE")
        .ok()
        .filter(|v| !v.is_empty());
    let mut devices = std::env::var("VGPU_SIM_DEVICES")
        .ok()
        .filter(|v| !v.is_empty());
    let mut config = std::env::var_os("VGPU_SIM_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    while let Some(a) = args.next() {
        let mut val = |flag: &str| match args.next() {
            Some(v) => Ok(v),
            None => Err(format!("{flag} needs a value")),
        };
        let r = match a.as_str() {
            "--dir" => val("--dir").map(|v| dir = Some(PathBuf::from(v))),
            "--profile" => val("--profile").map(|v| profile = Some(v)),
            "--devices" => val("--devices").map(|v| devices = Some(v)),
            "--config" => val("--config").map(|v| config = Some(PathBuf::from(v))),
            "-h" | "--help" => {
                println!(
                    "usage: vgpu-simd [--dir DIR] [--profile NAME] [--devices N] [--config FILE]"
                );
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument `{other}`")),
        };
        if let Err(e) = r {
            eprintln!("vgpu-simd: {e}");
            return ExitCode::from(2);
        }
    }
    let dir = dir.unwrap_or_else(vgpu_sim::client::sim_dir);
    let cfg = match vgpu_sim::SimConfig::resolve(
        profile.as_deref(),
        config.as_deref(),
        devices.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vgpu-simd: {}", chain(&e));
            return ExitCode::from(2);
        }
    };
    match vgpu_sim::daemon::run(&dir, &cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-simd: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}
