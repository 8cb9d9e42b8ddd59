//! `vgpu sim …`: the simulated GPU machine (a test double; see docs/sim.md).
//!
//! `vgpu sim env` starts the machine's daemon for a directory (detached),
//! links the simulated `libcuda.so.1` / `libnvidia-ml.so.1` into `<dir>/lib`
//! and prints the `export` lines that point programs at it:
//! `eval "$(vgpu sim env)"`. `vgpu sim stop` stops it.
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

use anyhow::{bail, Context};
use vgpu_sim::{client, daemon, SimConfig};

#[derive(clap::Subcommand)]
pub enum SimCmd {
    /// Start the simulated machine (if needed) and print `export` lines.
    Env(EnvArgs),
    /// Stop the simulated machine's daemon.
    Stop(DirArg),
    /// Show the machine: devices, memory, utilization, processes.
    Status(DirArg),
    /// Run the daemon in the foreground (what `env` starts detached).
    #[command(hide = true)]
    Daemon(EnvArgs),
}

#[derive(clap::Args)]
pub struct EnvArgs {
    /// Cost profile: `zero` (default) or `a100-burst`.
    #[arg(long)]
    profile: Option<String>,
    /// Number of simulated devices (1-16).
    #[arg(long)]
    devices: Option<String>,
    /// A `config.toml` (see docs/sim.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The machine's directory [default: $VGPU_SIM_DIR, else /tmp/vgpu-sim].
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct DirArg {
    /// The machine's directory [default: $VGPU_SIM_DIR, else /tmp/vgpu-sim].
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(cmd: SimCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        SimCmd::Env(a) => env(a),
        SimCmd::Stop(a) => stop(&dir_of(a.dir)),
        SimCmd::Status(a) => status(&dir_of(a.dir)),
        SimCmd::Daemon(a) => {
            let dir = dir_of(a.dir.clone());
            let cfg = resolve(&a)?;
            daemon::run(&dir, &cfg).with_context(|| format!("sim daemon for {}", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn dir_of(d: Option<PathBuf>) -> PathBuf {
    d.unwrap_or_else(client::sim_dir)
}

/// Flags win over `VGPU_SIM_PROFILE` / `VGPU_SIM_CONFIG` / `VGPU_SIM_DEVICES`.
fn resolve(a: &EnvArgs) -> anyhow::Result<SimConfig> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = a.profile.clone().or_else(|| env("VGPU_SIM_PROFILE"));
    let config = a
        .config
        .clone()
        .or_else(|| env("VGPU_SIM_CONFIG").map(PathBuf::from));
    let devices = a.devices.clone().or_else(|| env("VGPU_SIM_DEVICES"));
    Ok(SimConfig::resolve(
        profile.as_deref(),
        config.as_deref(),
        devices.as_deref(),
    )?)
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

fn env(a: EnvArgs) -> anyhow::Result<ExitCode> {
    let dir = dir_of(a.dir.clone());
    // Bad options fail here, with the field named, before anything starts.
    let cfg = resolve(&a)?;
    let explicit = a.profile.is_some() || a.devices.is_some() || a.config.is_some();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().unwrap_or(dir);
    match client::ping(&dir) {
        Ok(pid) if explicit => {
            bail!(
                "a vgpu-sim daemon (pid {pid}) already serves {}; `vgpu sim stop --dir {}` first to change its configuration",
                dir.display(),
                dir.display()
            )
        }
        Ok(pid) => {
            eprintln!(
                "vgpu sim: reusing the daemon (pid {pid}) at {}",
                dir.display()
            );
            // Pick up a rebuild; running processes keep the files they have.
            vgpu_sim::link_libs(&dir).context("linking the simulated driver libraries")?;
        }
        Err(_) => {
            vgpu_sim::link_libs(&dir).context("linking the simulated driver libraries")?;
            if let Some(c) = &a.config {
                std::fs::copy(c, dir.join("config.toml"))
                    .with_context(|| format!("copying {}", c.display()))?;
            }
            start_daemon(&dir, &a, &cfg)?;
        }
    }
    let lib = dir.join("lib");
    println!("export VGPU_SIM_DIR={}", quote(&dir));
    println!(
        "export LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
        quote(&lib)
    );
    Ok(ExitCode::SUCCESS)
}

fn start_daemon(dir: &Path, a: &EnvArgs, cfg: &SimConfig) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the vgpu binary")?;
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(["sim", "daemon", "--dir"]).arg(dir);
    cmd.args([
        "--profile",
        &cfg.profile,
        "--devices",
        &cfg.devices.to_string(),
    ]);
    if let Some(c) = &a.config {
        cmd.arg("--config").arg(c);
    }
    // Detached: own process group (no terminal signals), no inherited
    // pipes (a `$(vgpu sim env)` must not wait for it).
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    // Descriptors the caller inherited to us (a `tee`, a process
    // substitution) must not live on in the daemon, or whoever reads that
    // pipe waits for the daemon to exit. CLOEXEC rather than close, so
    // std's own exec-error pipe keeps working.
    // SAFETY: the closure runs between fork and exec and only makes one
    // async-signal-safe syscall; its failure (old kernel) is harmless.
    unsafe {
        cmd.pre_exec(|| {
            libc::close_range(
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            );
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the sim daemon")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if client::ping(dir).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the sim daemon exited ({status}): {}", log.trim());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!(
                "the sim daemon did not answer on {} within 10 s",
                daemon::sock_path(dir).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(dir: &Path) -> anyhow::Result<ExitCode> {
    client::request(dir, daemon::CMD_QUIT)
        .with_context(|| format!("stopping the sim daemon at {}", dir.display()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon::sock_path(dir).exists() {
        if Instant::now() > deadline {
            bail!(
                "the sim daemon at {} did not exit within 5 s",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("vgpu sim: stopped the daemon at {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

fn status(dir: &Path) -> anyhow::Result<ExitCode> {
    let m = vgpu_sim::Machine::connect_dir(dir, false)
        .with_context(|| format!("sim at {}", dir.display()))?;
    let h = m.header();
    println!(
        "vgpu-sim machine at {} (daemon pid {}) — simulated, not a GPU",
        dir.display(),
        h.daemon_pid
    );
    for d in 0..m.device_count() {
        let rec = m.device(d)?;
        println!(
            "  GPU {d}  {}  {}  memory {} / {} MiB  SMs {}  util {} %",
            m.device_name(d)?,
            vgpu_sim::Machine::device_uuid_string(d),
            m.used(d) >> 20,
            rec.memory_bytes >> 20,
            rec.sms,
            m.utilization(d)
        );
        let sm = m.process_utilization(d, 0);
        for (pid, mem) in m.state.live_procs().into_iter().filter_map(|(i, pid)| {
            let r = m.state.proc_rec(i);
            (r.contexts[d].load(std::sync::atomic::Ordering::SeqCst) > 0)
                .then(|| (pid, r.mem[d].load(std::sync::atomic::Ordering::SeqCst)))
        }) {
            let u = sm.iter().find(|s| s.0 == pid).map_or(0, |s| s.1);
            println!("    pid {pid:>8}  {:>8} MiB  SM {u:>3} %", mem >> 20);
        }
    }
    Ok(ExitCode::SUCCESS)
}
