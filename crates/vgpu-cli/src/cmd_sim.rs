//! `vgpu sim …` (not built yet).
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum SimCmd {
    /// Placeholder until the subcommands land.
    Placeholder,
}

pub fn run(_cmd: SimCmd) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`vgpu sim` is not implemented yet")
}
