//! `vgpu bench …`: benchmarks. `init` is the burst-init instrument (issue 5,
//! docs/bench.md).
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use vgpu_bench::{plot, report, sweep, worker};

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Burst cuInit: N fresh processes released at once; latency percentiles,
    /// failures by reason, phase composition, p99-vs-N fit.
    Init(InitArgs),
}

#[derive(clap::Args)]
pub struct InitArgs {
    /// Workers per run (ignored with --sweep).
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Comma-separated worker counts, e.g. 1,2,8,32,128,240,300.
    #[arg(long, value_delimiter = ',')]
    sweep: Option<Vec<usize>>,
    /// Runs per condition.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Modes (comma-separated or repeated): native, vgpu, legacy (the
    /// test-only serialized-probe interposer), preload:PATH.
    #[arg(long = "mode", value_delimiter = ',', default_value = "native")]
    modes: Vec<String>,
    /// Use the simulated driver with this cost profile (default profile
    /// a100-burst; the default anyway when no NVIDIA driver is present).
    #[arg(long, num_args = 0..=1, default_missing_value = sweep::DEFAULT_SIM_PROFILE)]
    sim: Option<String>,
    /// Calls after cuInit inside the measured span: none, ctx, alloc.
    #[arg(long, default_value = "none")]
    then: worker::Then,
    /// How workers resolve cuInit: default (like -lcuda) or handle (dlsym on
    /// the libcuda handle, like libcudart).
    #[arg(long, default_value = "default")]
    resolve: worker::Resolve,
    /// Write the full JSON (header, summaries, raw per-worker records).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one CSV line per worker.
    #[arg(long)]
    raw: Option<PathBuf>,
    /// Write the SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Also write the text report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Per-run deadline in seconds; stragglers are killed and counted failed.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Seed of the randomized condition order (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// vgpu mode: resolve the host PID inside cuInit (`LIBVGPU_IDENTITY=eager`)
    /// with only this tier, to measure its cost on the path: broker (a
    /// broker is served for the run), procfs (the host's /proc), probe (the
    /// NVML probe, lock in the run's temp dir). Default: identity stays off
    /// the cuInit path (lazy).
    #[arg(long)]
    identity: Option<IdentityTier>,
    /// Test hook: these worker indices abort right after the release.
    #[arg(long, value_delimiter = ',', hide = true)]
    crash_worker: Vec<usize>,
}

/// A tier `--identity` forces.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum IdentityTier {
    Broker,
    Procfs,
    Probe,
}

/// What `--identity` set up for the run: the workers' environment and, for
/// the broker tier, a broker served on a thread until drop.
struct IdentitySetup {
    env: Vec<(String, String)>,
    broker: Option<(
        vgpu_identity::server::ShutdownHandle,
        std::thread::JoinHandle<()>,
    )>,
    dir: PathBuf,
}

impl IdentitySetup {
    fn start(tier: IdentityTier) -> anyhow::Result<IdentitySetup> {
        // Root-owned 0700 directory: what the broker client demands of the
        // socket's parent.
        let dir = std::env::temp_dir().join(format!(
            "vgpu-bench-identity-{}-{}",
            std::process::id(),
            vgpu_region::monotonic_ns()
        ));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut env = vec![("LIBVGPU_IDENTITY".to_string(), "eager".to_string())];
        let mut broker = None;
        let name = match tier {
            IdentityTier::Broker => {
                let socket = dir.join("hostpid.sock");
                let b = vgpu_identity::server::Broker::bind(vgpu_identity::server::BrokerConfig {
                    socket: socket.clone(),
                    ..Default::default()
                })
                .with_context(|| format!("cannot serve a broker on {}", socket.display()))?;
                let stop = b.shutdown_handle();
                let t = std::thread::spawn(move || {
                    if let Err(e) = b.serve() {
                        eprintln!("vgpu bench init: broker stopped: {e}");
                    }
                });
                broker = Some((stop, t));
                env.push((
                    "LIBVGPU_HOSTPID_BROKER".into(),
                    socket.display().to_string(),
                ));
                "broker"
            }
            IdentityTier::Procfs => {
                env.push(("LIBVGPU_HOST_PROCFS".into(), "/proc".into()));
                "procfs"
            }
            IdentityTier::Probe => {
                env.push((
                    "LIBVGPU_HOSTPID_LOCK".into(),
                    dir.join("hostpid.lock").display().to_string(),
                ));
                "probe"
            }
        };
        env.push(("LIBVGPU_IDENTITY_TIERS".into(), name.into()));
        Ok(IdentitySetup { env, broker, dir })
    }
}

impl Drop for IdentitySetup {
    fn drop(&mut self) {
        if let Some((stop, t)) = self.broker.take() {
            stop.shutdown();
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCmd::Init(a) => init(a),
    }
}

fn init(a: InitArgs) -> anyhow::Result<ExitCode> {
    let command = std::iter::once("vgpu".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let modes = a
        .modes
        .iter()
        .map(|m| sweep::parse_mode(m))
        .collect::<Result<Vec<_>, _>>()?;
    let workers = a.sweep.clone().unwrap_or_else(|| vec![a.workers]);
    if workers.contains(&0) {
        anyhow::bail!("worker counts must be at least 1 (got 0)");
    }
    let worker_exe = sweep::artifact("vgpu-bench-worker")?;
    let (driver, note) = sweep::Driver::select(a.sim.as_deref())?;
    eprintln!("vgpu bench init: {note}");
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let identity = a.identity.map(IdentitySetup::start).transpose()?;
    let mut env = driver.env();
    if let Some(id) = &identity {
        eprintln!(
            "vgpu bench init: identity forced inside cuInit: {}",
            id.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        env.extend(id.env.iter().cloned());
    }
    let cfg = sweep::SweepConfig {
        modes,
        workers,
        repeat: a.repeat,
        then: a.then,
        resolve: a.resolve,
        worker_exe,
        env,
        timeout: Duration::from_secs(a.timeout_s),
        seed,
        crash: a.crash_worker.clone(),
    };
    let header = sweep::machine_header(command, &driver);
    let rep = sweep::run(&cfg, header, &mut |line| {
        eprintln!("vgpu bench init: {line}")
    })?;
    let text = report::text(&rep);
    print!("{text}");
    let write = |path: &Option<PathBuf>, body: String| -> anyhow::Result<()> {
        if let Some(p) = path {
            std::fs::write(p, body).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    };
    write(&a.report, text.clone())?;
    write(&a.json, report::json(&rep))?;
    write(&a.raw, report::raw_csv(&rep))?;
    write(&a.plot, plot::svg(&rep))?;
    drop(identity);
    drop(driver);
    let failed = rep.total_failed();
    if failed > 0 {
        eprintln!("vgpu bench init: {failed} worker(s) failed (see failures above)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
