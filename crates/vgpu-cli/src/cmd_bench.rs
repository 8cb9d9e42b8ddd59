//! `vgpu bench …` (not built yet).
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Placeholder until the subcommands land.
    Placeholder,
}

pub fn run(_cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`vgpu bench` is not implemented yet")
}
