//! `vgpu demo` (not built yet).
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`vgpu demo` is not implemented yet")
}
