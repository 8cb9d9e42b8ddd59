//! `vgpu`: the one command-line tool. Each subcommand lives in its own
//! module (`cmd_<name>.rs`) with its own clap `Args`.
use clap::{Parser, Subcommand};

mod cmd_bench;
mod cmd_broker;
mod cmd_demo;
mod cmd_hooks;
mod cmd_inspect;
mod cmd_limit;
mod cmd_node;
mod cmd_run;
mod cmd_scheduler;
mod cmd_sim;

#[derive(Parser)]
#[command(
    name = "vgpu",
    version,
    about = "GPU sharing: memory budgets and SM shares per container"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command under the interposer with a memory budget / SM share.
    Run(cmd_run::Args),
    /// Two tenants on a simulated GPU: the README's main job.
    Demo(cmd_demo::Args),
    /// Show a shared region: header, limits, live slots.
    Inspect(cmd_inspect::Args),
    /// Change a region's limits live.
    Limit(cmd_limit::Args),
    /// Suspend a container: its new launches wait until `vgpu resume`.
    Suspend(cmd_limit::SuspendArgs),
    /// Resume a suspended container.
    Resume(cmd_limit::SuspendArgs),
    /// Benchmarks (burst init, region, wrapper overhead).
    #[command(subcommand)]
    Bench(cmd_bench::BenchCmd),
    /// The host-PID broker server.
    Broker(cmd_broker::Args),
    /// The simulated GPU driver (a test double).
    #[command(subcommand)]
    Sim(cmd_sim::SimCmd),
    /// The interposer's hook coverage table.
    Hooks(cmd_hooks::Args),
    /// The Kubernetes node agent (device plugin, monitor, watchdog, broker).
    // Boxed: its many flags would make every other variant as large.
    Node(Box<cmd_node::Args>),
    /// The Kubernetes scheduler extender and admission webhook.
    Scheduler(Box<cmd_scheduler::Args>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run(a) => cmd_run::run(a),
        Cmd::Demo(a) => cmd_demo::run(a),
        Cmd::Inspect(a) => cmd_inspect::run(a),
        Cmd::Limit(a) => cmd_limit::run(a),
        Cmd::Suspend(a) => cmd_limit::suspend(a, true),
        Cmd::Resume(a) => cmd_limit::suspend(a, false),
        Cmd::Bench(c) => cmd_bench::run(c),
        Cmd::Broker(a) => cmd_broker::run(a),
        Cmd::Sim(c) => cmd_sim::run(c),
        Cmd::Hooks(a) => cmd_hooks::run(a),
        Cmd::Node(a) => cmd_node::run(*a),
        Cmd::Scheduler(a) => cmd_scheduler::run(*a),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vgpu: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
