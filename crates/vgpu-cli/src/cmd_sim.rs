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

/// What the caller asked for, and who asked: flags win over
/// `VGPU_SIM_PROFILE` / `VGPU_SIM_CONFIG` / `VGPU_SIM_DEVICES`.
struct Request {
    profile: Option<(String, &'static str)>,
    config: Option<(PathBuf, &'static str)>,
    devices: Option<(String, &'static str)>,
}

impl Request {
    fn of(a: &EnvArgs) -> Request {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let pick = |flag: Option<String>, flag_name: &'static str, var: &'static str| {
            flag.map(|v| (v, flag_name))
                .or_else(|| env(var).map(|v| (v, var)))
        };
        Request {
            profile: pick(a.profile.clone(), "--profile", "VGPU_SIM_PROFILE"),
            config: pick(
                a.config.as_ref().map(|p| p.display().to_string()),
                "--config",
                "VGPU_SIM_CONFIG",
            )
            .map(|(p, by)| (PathBuf::from(p), by)),
            devices: pick(a.devices.clone(), "--devices", "VGPU_SIM_DEVICES"),
        }
    }

    fn any(&self) -> bool {
        self.profile.is_some() || self.config.is_some() || self.devices.is_some()
    }

    /// The configuration asked for, and the config file's text (read once,
    /// bounded: this is what the daemon gets).
    fn resolve(&self) -> anyhow::Result<(SimConfig, Option<String>)> {
        let text = match &self.config {
            Some((p, _)) => Some(vgpu_sim::config::read_config_file(p)?),
            None => None,
        };
        let mut cfg = match (&text, &self.config) {
            (Some(t), Some((p, _))) => SimConfig::parse_toml(
                t,
                &p.display().to_string(),
                self.profile.as_ref().map(|(v, _)| v.as_str()),
            )?,
            _ => {
                SimConfig::with_profile(self.profile.as_ref().map_or("zero", |(v, _)| v.as_str()))?
            }
        };
        if let Some((d, by)) = &self.devices {
            cfg.devices = SimConfig::resolve(None, None, Some(d))
                .with_context(|| format!("{by} {d}"))?
                .devices;
        }
        Ok((cfg, text))
    }

    /// Where the asked configuration and the running machine disagree, on
    /// what was asked: a config file asks for a whole machine, a profile for
    /// its costs, a device count for that count.
    fn conflicts(&self, asked: &SimConfig, running: &SimConfig) -> Vec<String> {
        let mut asked = asked.clone();
        asked.device.name = vgpu_sim::state::State::device_label_text(&asked.device.name);
        asked
            .differences(running)
            .into_iter()
            .filter_map(|(field, want, have)| {
                let by = if let Some((p, by)) = &self.config {
                    format!("{by} {}", p.display())
                } else if field.starts_with("cost.") {
                    let (p, by) = self.profile.as_ref()?;
                    format!("{by} {p}")
                } else if field == "devices" {
                    let (d, by) = self.devices.as_ref()?;
                    format!("{by} {d}")
                } else {
                    return None;
                };
                Some(format!("{field}: running {have}, asked {want} ({by})"))
            })
            .collect()
    }
}

fn resolve(a: &EnvArgs) -> anyhow::Result<SimConfig> {
    Ok(Request::of(a).resolve()?.0)
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

fn env(a: EnvArgs) -> anyhow::Result<ExitCode> {
    let dir = dir_of(a.dir.clone());
    // Bad options fail here, with the field named, before anything starts.
    let req = Request::of(&a);
    let (cfg, config_text) = req.resolve()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().unwrap_or(dir);
    match client::ping(&dir) {
        Ok(pid) => {
            if req.any() {
                // Reuse only a machine that is what was asked for, by flag
                // or environment alike.
                let running = vgpu_sim::Machine::connect_dir(&dir, false)
                    .with_context(|| format!("reading the running machine at {}", dir.display()))?
                    .state
                    .config();
                let conflicts = req.conflicts(&cfg, &running);
                if !conflicts.is_empty() {
                    bail!(
                        "a vgpu-sim daemon (pid {pid}) already serves {} with another configuration:\n  {}\n`vgpu sim stop --dir {}` first to change it, or ask for what runs",
                        dir.display(),
                        conflicts.join("\n  "),
                        dir.display()
                    )
                }
            }
            eprintln!(
                "vgpu sim: reusing the daemon (pid {pid}) at {}",
                dir.display()
            );
            // Pick up a rebuild; running processes keep the files they have.
            vgpu_sim::link_libs(&dir).context("linking the simulated driver libraries")?;
        }
        Err(_) => {
            vgpu_sim::link_libs(&dir).context("linking the simulated driver libraries")?;
            let config = match &config_text {
                // The daemon reads the very text validated here.
                Some(t) => {
                    let copy = dir.join("config.toml");
                    std::fs::write(&copy, t)
                        .with_context(|| format!("writing {}", copy.display()))?;
                    Some(copy)
                }
                None => None,
            };
            start_daemon(&dir, config.as_deref(), &cfg)?;
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

fn start_daemon(dir: &Path, config: Option<&Path>, cfg: &SimConfig) -> anyhow::Result<()> {
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
    if let Some(c) = config {
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
