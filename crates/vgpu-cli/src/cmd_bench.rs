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
    /// SM limiter accuracy: tenants at set shares on a simulated or real
    /// GPU; per-second share vs target, error, settling, throughput, ns
    /// per launch (docs/limiter.md).
    Sm(SmArgs),
}

#[derive(clap::Args)]
pub struct SmArgs {
    /// Rows to run (comma-separated names; default: every row).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
    /// Seconds measured per row.
    #[arg(long, default_value_t = 5)]
    seconds: usize,
    /// Engines (comma-separated): sim (vgpu-sim, a machine per row), gpu
    /// (the real NVIDIA driver), model (the control law alone on its
    /// deterministic model). Default: gpu,model when an NVIDIA driver is
    /// present, else sim,model.
    #[arg(long, value_delimiter = ',')]
    engine: Vec<String>,
    /// Interposer for the tenants: vgpu (libvgpu.so) or native (none).
    #[arg(long, default_value = "vgpu")]
    mode: String,
    /// Write the JSON (a `rows` array).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Also write the text report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Exit 1 when a row misses its targets (failed tenants always do).
    #[arg(long)]
    strict: bool,
    /// Interleaved runs of each configuration in the `overhead` row (a
    /// second each; the row reports the medians).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    overhead_runs: u32,
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
        BenchCmd::Sm(a) => sm(a),
    }
}

fn sm(a: SmArgs) -> anyhow::Result<ExitCode> {
    use vgpu_bench::sm::{self, Engine};
    let command = std::iter::once("vgpu".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    if a.seconds < 2 {
        anyhow::bail!("--seconds must be at least 2 (the first second is the settling allowance)");
    }
    let rows = sm::rows::select(&a.rows).map_err(anyhow::Error::msg)?;
    let real = sweep::real_driver();
    let engines: Vec<Engine> = if a.engine.is_empty() {
        vec![
            if real.is_some() {
                Engine::Gpu
            } else {
                Engine::Sim
            },
            Engine::Model,
        ]
    } else {
        a.engine
            .iter()
            .map(|e| match e.as_str() {
                "sim" => Ok(Engine::Sim),
                "gpu" => Ok(Engine::Gpu),
                "model" => Ok(Engine::Model),
                _ => Err(anyhow::anyhow!("unknown --engine {e:?} (sim, gpu, model)")),
            })
            .collect::<anyhow::Result<_>>()?
    };
    if engines.contains(&Engine::Gpu) && real.is_none() {
        anyhow::bail!(
            "--engine gpu: no NVIDIA driver found (/proc/driver/nvidia/version, nvidia-smi)"
        );
    }
    let vgpu_lib = sweep::artifact("libvgpu.so").ok();
    let preload = match a.mode.as_str() {
        "vgpu" => Some(
            vgpu_lib
                .clone()
                .context("libvgpu.so not built (cargo build -p vgpu-preload)")?,
        ),
        "native" => None,
        m => anyhow::bail!("unknown --mode {m:?} (vgpu, native)"),
    };
    let procs = engines.iter().any(|e| *e != Engine::Model);
    let tenant_exe = if procs {
        Some(sweep::artifact("vgpu-bench-sm-tenant")?)
    } else {
        None
    };
    let dir = sm::harness::scratch_dir().context("cannot create a scratch directory")?;
    let mut header = {
        let h = sweep::machine_header(
            command,
            &sweep::Driver::Real {
                description: String::new(),
            },
        );
        sm::report::Header {
            command: h.command,
            revision: h.revision,
            driver: String::new(),
            preload: preload
                .as_ref()
                .map_or("none (native)".into(), |p| p.display().to_string()),
            cpus: h.cpus,
            cpu_model: h.cpu_model,
            kernel: h.kernel,
            started_unix: h.started_unix,
            seconds: a.seconds,
            mae_definition: sm::metrics::MAE_DEFINITION,
        }
    };
    header.driver = engines
        .iter()
        .map(|e| match e {
            Engine::Sim => {
                "vgpu-sim (a test double; profile zero, 1 ms time slices, a machine per row)"
                    .to_string()
            }
            Engine::Gpu => format!("NVIDIA driver: {}", real.clone().unwrap_or_default()),
            Engine::Model => "vgpu-limiter model (the law alone, simulated time)".to_string(),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut results = Vec::new();
    for e in &engines {
        for r in &rows {
            let res = match e {
                Engine::Model => match sm::model::run_row(r, a.seconds) {
                    Some(x) => x,
                    None => continue,
                },
                _ => {
                    let setup = sm::harness::Setup {
                        engine: *e,
                        tenant_exe: tenant_exe.clone().context("tenant binary")?,
                        preload: preload.clone(),
                        vgpu_lib: vgpu_lib.clone(),
                        seconds: a.seconds,
                        dir: dir.path().to_path_buf(),
                        start_delay: Duration::from_secs(2),
                        overhead_runs: a.overhead_runs as usize,
                    };
                    sm::harness::run_row(&setup, r)
                }
            };
            eprintln!(
                "vgpu bench sm: {} on {}: {}",
                res.name,
                res.engine,
                match (&res.overhead, res.achieved) {
                    (Some(o), _) => format!(
                        "bare {:.0} ns, +{:.0} unlimited, +{:.0} limited; within a process +{:.0} unlimited, +{:.0} limited",
                        o.bare_ns.unwrap_or(f64::NAN),
                        o.added_unlimited_ns.unwrap_or(f64::NAN),
                        o.added_limited_ns.unwrap_or(f64::NAN),
                        o.paired_unlimited_ns.unwrap_or(f64::NAN),
                        o.paired_limited_ns.unwrap_or(f64::NAN)
                    ),
                    (None, Some(x)) => format!(
                        "target {:.0} %, achieved {x:.1} %, {} failed",
                        res.target.unwrap_or(f64::NAN),
                        res.failures
                    ),
                    (None, None) => format!("{} failed", res.failures),
                }
            );
            results.push(res);
        }
    }
    let rep = sm::report::SmReport {
        schema: sm::report::SCHEMA,
        header,
        rows: results,
    };
    let text = sm::report::text(&rep);
    print!("{text}");
    let write = |path: &Option<PathBuf>, body: String| -> anyhow::Result<()> {
        if let Some(p) = path {
            std::fs::write(p, body).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    };
    write(&a.report, text.clone())?;
    write(&a.json, sm::report::json(&rep))?;
    write(&a.plot, sm::plot::svg(&rep))?;
    let failed = rep.failures();
    if failed > 0 {
        eprintln!("vgpu bench sm: {failed} tenant(s) or step(s) failed (see notes above)");
        return Ok(ExitCode::from(1));
    }
    let missed = rep
        .rows
        .iter()
        .filter(|r| r.overhead.is_none() && !r.informational && !r.target_met)
        .count();
    if a.strict && missed > 0 {
        eprintln!("vgpu bench sm: {missed} row(s) missed their targets (--strict)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
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
