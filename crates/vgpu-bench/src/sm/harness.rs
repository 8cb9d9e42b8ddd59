//! Running a row with real processes: a fresh simulated machine with the
//! row's SM count (or the real GPU), one tenant process per container
//! (own region file, own `CUDA_DEVICE_SM_LIMIT`), a common start time, a
//! live limit change where the row has one, the truth from the device,
//! and every failure counted.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::metrics::{figures, per_second};
use super::report::{Overhead, RowResult, TenantResult};
use super::rows::{Row, RowKind};
use super::tenant::{Mode, TenantArgs, TenantReport};
use super::Engine;

/// What a run needs.
pub struct Setup {
    /// sim or gpu.
    pub engine: Engine,
    /// `vgpu-bench-sm-tenant`.
    pub tenant_exe: PathBuf,
    /// libvgpu.so to preload (`None`: the bare driver).
    pub preload: Option<PathBuf>,
    /// libvgpu.so for the overhead row's preloaded runs (always set when
    /// it exists, even for a native accuracy run).
    pub vgpu_lib: Option<PathBuf>,
    /// Seconds measured per row.
    pub seconds: usize,
    /// Scratch directory (regions).
    pub dir: PathBuf,
    /// Time from spawning the tenants to their common start (their cuInit,
    /// context and module load happen before it).
    pub start_delay: Duration,
    /// Interleaved runs of each configuration in the overhead row (one
    /// process's figure can sit 100+ ns from the next one's on a VM).
    pub overhead_runs: usize,
}

/// A scratch directory for a run's region files (removed on drop).
pub fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("vgpu-bench-sm-").tempdir()
}

fn now_ns() -> u64 {
    crate::slots::monotonic_ns()
}

/// The device for one row.
enum Device {
    Sim(vgpu_sim::SimHandle),
    Gpu,
}

impl Device {
    fn start(engine: Engine, sms: u32) -> Result<Device, String> {
        match engine {
            Engine::Gpu => Ok(Device::Gpu),
            _ => {
                let text = format!("profile = \"zero\"\ndevices = 1\n[device]\nsms = {sms}\n");
                let opts = vgpu_sim::SimOptions::from_toml(&text).map_err(|e| e.to_string())?;
                vgpu_sim::SimHandle::start(opts)
                    .map(Device::Sim)
                    .map_err(|e| format!("cannot start the simulated machine: {e}"))
            }
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            Device::Sim(h) => h.env(),
            Device::Gpu => Vec::new(),
        }
    }
}

struct Running {
    child: Child,
    cache: PathBuf,
}

/// The limits file of a tenant's container: `device * sm=N` (none:
/// unlimited), as the operator writes it (docs/limits.md).
fn limits_for(limit: Option<u32>) -> vgpu_region::limits::Limits {
    let mut l = vgpu_region::limits::Limits::default();
    if let Some(n) = limit {
        l.line_mut(&vgpu_region::limits::Device::Any).sm = Some(n);
    }
    l
}

/// A lending row's container: its guarantee, `sm-ceiling * C`, and
/// `board <dir> <name>`.
fn lending_limits(
    limit: Option<u32>,
    ceiling: Option<u32>,
    board: Option<(&Path, &str)>,
) -> vgpu_region::limits::Limits {
    let mut l = limits_for(limit);
    if let Some(c) = ceiling {
        l.set_ceiling(&vgpu_region::limits::Device::Any, Some(c));
    }
    if let Some((dir, name)) = board {
        l.board = Some(vgpu_region::limits::BoardRef {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        });
    }
    l
}

/// A tenant's container: its own directory with its region and the
/// limits file next to it (where `vgpu limit` writes).
fn container_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let d = dir.join(name);
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::create_dir_all(&d);
    let cache = d.join("region.cache");
    let file = vgpu_region::limits::path_for_region(&cache);
    (cache, file)
}

fn spawn(
    s: &Setup,
    dev: &Device,
    preload: Option<&Path>,
    limits: &vgpu_region::limits::Limits,
    cache: PathBuf,
    args: &TenantArgs,
) -> Result<Running, String> {
    let file = vgpu_region::limits::path_for_region(&cache);
    vgpu_region::limits::write_limits_file_atomic(&file, limits)
        .map_err(|e| format!("cannot write the limits file {}: {e}", file.display()))?;
    let mut c = Command::new(&s.tenant_exe);
    c.args(args.to_args())
        .envs(dev.env())
        .env_remove("LD_PRELOAD")
        .env_remove("CUDA_DEVICE_SM_LIMIT")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache)
        .env(vgpu_region::limits::PATH_ENV, &file)
        .env("CUDA_VISIBLE_DEVICES", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(lib) = preload {
        c.env("LD_PRELOAD", lib);
    }
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", s.tenant_exe.display()))?;
    Ok(Running { child, cache })
}

/// Waits for a tenant until `deadline`; kills it past that. The report, or
/// why there is none.
fn finish(mut r: Running, deadline: Instant) -> (Result<TenantReport, String>, PathBuf) {
    let status = loop {
        match r.child.try_wait() {
            Ok(Some(st)) => break Ok(st),
            Ok(None) if Instant::now() >= deadline => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                break Err("overran its deadline and was killed".to_string());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("wait: {e}")),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = r.child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = r.child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let tail = || {
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    };
    let res = match status {
        Err(e) => Err(e),
        Ok(st) if !st.success() => Err(format!("exited with {st}: {}", tail())),
        Ok(_) => out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| format!("printed no report: {}", tail()))
            .and_then(|l| serde_json::from_str(l).map_err(|e| format!("bad report {l:?}: {e}"))),
    };
    (res, r.cache)
}

/// The truth: busy intervals `(pid, start, end)` (CLOCK_MONOTONIC ns) in
/// `[from, to)`.
fn sim_truth(dev: &Device, from: u64, to: u64) -> Result<Vec<(u32, u64, u64)>, String> {
    match dev {
        Device::Sim(h) => h
            .state()
            .map(|st| st.kernels(0, from, to))
            .map_err(|e| format!("cannot read the simulated timeline: {e}")),
        Device::Gpu => Ok(Vec::new()),
    }
}

/// NVML samples: (pid, smUtil %, wall µs).
type Samples = Vec<(u32, u32, u64)>;

/// NVML's per-process samples during the run, as per-second shares.
struct NvmlTruth {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Result<Samples, String>>,
}

impl NvmlTruth {
    fn start() -> NvmlTruth {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let nvml = super::ffi::Nvml::open()?;
            let mut all = Vec::new();
            let mut last = 0u64;
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                for s in nvml.samples(last) {
                    last = last.max(s.2);
                    all.push(s);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(all)
        });
        NvmlTruth { stop, thread }
    }

    /// Mean smUtil of each pid's samples per second from `t0_us` (wall µs).
    fn finish(self, pids: &[u32], t0_us: u64, seconds: usize) -> Result<Vec<Vec<f64>>, String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let samples = self
            .thread
            .join()
            .map_err(|_| "the NVML sampler panicked".to_string())??;
        let mut sum = vec![vec![(0.0, 0u32); seconds]; pids.len()];
        for (pid, util, ts) in samples {
            let Some(k) = pids.iter().position(|p| *p == pid) else {
                continue;
            };
            if ts < t0_us {
                continue;
            }
            let i = ((ts - t0_us) / 1_000_000) as usize;
            if i < seconds {
                sum[k][i].0 += util as f64;
                sum[k][i].1 += 1;
            }
        }
        Ok(sum
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|(s, n)| if n == 0 { 0.0 } else { s / n as f64 })
                    .collect()
            })
            .collect())
    }
}

/// Runs one accuracy row.
pub fn run_accuracy(s: &Setup, row: &Row) -> RowResult {
    let seconds = row.seconds.unwrap_or(s.seconds);
    let s = &Setup {
        engine: s.engine,
        tenant_exe: s.tenant_exe.clone(),
        preload: s.preload.clone(),
        vgpu_lib: s.vgpu_lib.clone(),
        seconds,
        dir: s.dir.clone(),
        start_delay: s.start_delay,
        overhead_runs: s.overhead_runs,
    };
    let mut res = RowResult {
        name: row.name.clone(),
        what: row.what.clone(),
        engine: s.engine.as_str().into(),
        sms: row.sms,
        seconds: s.seconds,
        ..RowResult::default()
    };
    let dev = match Device::start(s.engine, row.sms) {
        Ok(d) => d,
        Err(e) => {
            res.failures = row.tenants.len();
            res.notes.push(e);
            return res;
        }
    };
    let run_ns = s.seconds as u64 * 1_000_000_000;
    // Room for every tenant's cuInit, context and module before the start.
    let start_at = now_ns() + s.start_delay.as_nanos() as u64;
    let nvml = (s.engine == Engine::Gpu).then(NvmlTruth::start);
    let mut running = Vec::new();
    let board = row
        .board
        .then(|| s.dir.join(format!("{}-boards", row.name)));
    if let Some(b) = &board {
        let _ = std::fs::remove_dir_all(b);
        if let Err(e) = std::fs::create_dir_all(b) {
            res.failures += 1;
            res.notes
                .push(format!("cannot make the board {}: {e}", b.display()));
        }
    }
    let sec_ns = |x: f64| (x * 1e9) as u64;
    for t in &row.tenants {
        let (idle_from_ns, idle_until_ns) = t.idle.map_or((0, 0), |(a, b)| (sec_ns(a), sec_ns(b)));
        let args = TenantArgs {
            mode: t.mode,
            kernel_ns: t.kernel_ns,
            start_at_ns: start_at,
            run_ns,
            nodes: 8,
            idle_from_ns,
            idle_until_ns,
        };
        let name = format!("{}-{}", row.name, t.label);
        let (cache, _) = container_paths(&s.dir, &name);
        let limits = lending_limits(
            t.limit,
            t.ceiling,
            board.as_deref().map(|b| (b, name.as_str())),
        );
        running.push(spawn(s, &dev, s.preload.as_deref(), &limits, cache, &args));
    }
    // Kills, as planned (a container that dies mid-loan).
    let mut kills: Vec<(u64, usize)> = row
        .tenants
        .iter()
        .enumerate()
        .filter_map(|(k, t)| t.kill_at.map(|x| (start_at + sec_ns(x), k)))
        .collect();
    kills.sort_unstable();
    for (at, k) in kills {
        let now = now_ns();
        if at > now {
            std::thread::sleep(Duration::from_nanos(at - now));
        }
        if let Some(Ok(r)) = running.get_mut(k) {
            let _ = r.child.kill();
            res.notes.push(format!(
                "{}: SIGKILLed at {:.1} s as planned",
                row.tenants[k].label,
                (now_ns() - start_at) as f64 / 1e9
            ));
        }
    }
    // Live changes, as `vgpu limit` makes them: the limits file, then the
    // region's display copy and its limits-generation bump.
    let mut change_s = None;
    for (t, r) in row.tenants.iter().zip(&running) {
        let (Some((frac, to)), Ok(r)) = (t.change, r.as_ref()) else {
            continue;
        };
        let sec = super::rows::change_second(frac, s.seconds);
        let at = start_at + sec as u64 * 1_000_000_000;
        let now = now_ns();
        if at > now {
            std::thread::sleep(Duration::from_nanos(at - now));
        }
        change_s = Some(sec);
        let file = vgpu_region::limits::path_for_region(&r.cache);
        let l = limits_for(to);
        let applied = vgpu_region::limits::write_limits_file_atomic(&file, &l)
            .map_err(|e| e.to_string())
            .and_then(|()| vgpu_region::Region::open(&r.cache).map_err(|e| e.to_string()))
            .and_then(|reg| reg.write_display_copy(&l).map_err(|e| e.to_string()))
            .map(|_| ());
        match applied {
            Ok(()) => res.notes.push(format!(
                "{}: limit changed live to {} at {sec} s",
                t.label,
                to.map_or("none".into(), |x| format!("{x} %")),
            )),
            Err(e) => {
                res.failures += 1;
                res.notes.push(format!(
                    "{}: the live change could not be applied: {e}",
                    t.label
                ));
            }
        }
    }
    let deadline = Instant::now()
        + Duration::from_nanos((start_at + run_ns).saturating_sub(now_ns()))
        + Duration::from_secs(20);
    let t0_wall_us = (vgpu_region::realtime_ns() - (now_ns().saturating_sub(start_at))) / 1000;
    let mut reports = Vec::new();
    let mut pids = Vec::new();
    for (t, r) in row.tenants.iter().zip(running) {
        pids.push(r.as_ref().map_or(0, |x| x.child.id()));
        reports.push(match r {
            // A planned kill leaves no report; its share is still the
            // device's to tell.
            Ok(r) if t.kill_at.is_some() => {
                let _ = finish(r, deadline);
                Ok(TenantReport::default())
            }
            Ok(r) => finish(r, deadline).0,
            Err(e) => Err(e),
        });
    }
    let shares = match (&nvml, s.engine) {
        (_, Engine::Gpu) => match nvml.map(|n| n.finish(&pids, t0_wall_us, s.seconds)) {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                res.failures += 1;
                res.notes.push(format!("no truth from NVML: {e}"));
                vec![vec![0.0; s.seconds]; pids.len()]
            }
            None => vec![vec![0.0; s.seconds]; pids.len()],
        },
        _ => match sim_truth(&dev, start_at, start_at + run_ns) {
            Ok(iv) => per_second(&iv, &pids, start_at, s.seconds),
            Err(e) => {
                res.failures += 1;
                res.notes.push(e);
                vec![vec![0.0; s.seconds]; pids.len()]
            }
        },
    };
    for ((t, rep), share) in row.tenants.iter().zip(reports).zip(shares) {
        let targets = super::rows::targets(t, s.seconds);
        let f = figures(&share, &targets, change_s);
        let after = change_s.map(|c| super::metrics::after_change(&share, &targets, c));
        let (failed, error, launches, pid) = match &rep {
            Ok(r) => {
                if s.engine == Engine::Gpu {
                    res.sms = r.sms;
                }
                (false, None, r.launches, r.pid)
            }
            Err(e) => (true, Some(e.clone()), 0, 0),
        };
        if let Some(e) = &error {
            res.notes.push(format!("{} failed: {e}", t.label));
        }
        res.tenants.push(TenantResult {
            label: t.label.clone(),
            target: t.limit.map(f64::from),
            targets,
            mode: t.mode.as_str().into(),
            kernel_ns: t.kernel_ns,
            pid,
            per_second: share,
            figures: f,
            after_change: after,
            target_met: None,
            launches,
            launches_per_s: launches as f64 / s.seconds.max(1) as f64,
            failed,
            error,
        });
    }
    drop(dev);
    res.summarize(change_s);
    res.judge_checks(&row.checks, row.informational);
    res
}

/// The overhead row: one launcher of zero-length kernels for a second, in
/// three configurations interleaved `overhead_runs` times (bare driver,
/// libvgpu.so unlimited, libvgpu.so with a 50 % limit).
pub fn run_overhead(s: &Setup, row: &Row) -> RowResult {
    let mut res = RowResult {
        name: row.name.clone(),
        what: row.what.clone(),
        engine: s.engine.as_str().into(),
        sms: row.sms,
        seconds: 1,
        ..RowResult::default()
    };
    let dev = match Device::start(s.engine, row.sms) {
        Ok(d) => d,
        Err(e) => {
            res.failures = 1;
            res.notes.push(e);
            return res;
        }
    };
    let configs: Vec<(&str, Option<&Path>, Option<u32>)> = match &s.vgpu_lib {
        Some(lib) => vec![
            ("bare", None, None),
            ("unlimited", Some(lib.as_path()), None),
            ("limited", Some(lib.as_path()), Some(50)),
        ],
        None => {
            res.notes
                .push("libvgpu.so not found: only the bare driver measured".into());
            vec![("bare", None, None)]
        }
    };
    let mut o = Overhead::default();
    for rep in 0..s.overhead_runs.max(1) {
        for (name, lib, limit) in &configs {
            let args = TenantArgs {
                mode: Mode::Overhead,
                kernel_ns: 0,
                start_at_ns: 0,
                run_ns: 1_000_000_000,
                nodes: 1,
                idle_from_ns: 0,
                idle_until_ns: 0,
            };
            let (cache, _) = container_paths(&s.dir, &format!("overhead-{name}-{rep}"));
            let r = spawn(s, &dev, *lib, &limits_for(*limit), cache, &args)
                .map(|r| finish(r, Instant::now() + Duration::from_secs(30)).0);
            match r {
                Ok(Ok(t)) if t.timed > 0 => {
                    o.runs.push((name.to_string(), t.launch_ns_p50, t.timed));
                    match (lib, t.direct_ns_p50) {
                        (Some(_), Some(d)) => o.paired.push((name.to_string(), t.launch_ns_p50, d)),
                        (Some(_), None) => {
                            // The interposer did not win the default scope:
                            // nothing it adds was timed.
                            res.failures += 1;
                            res.notes.push(format!(
                                "{name}: the launches did not go through libvgpu.so"
                            ));
                        }
                        (None, _) => {}
                    }
                }
                Ok(Ok(_)) => {
                    res.failures += 1;
                    res.notes.push(format!("{name}: timed no launch"));
                }
                Ok(Err(e)) | Err(e) => {
                    res.failures += 1;
                    res.notes.push(format!("{name} failed: {e}"));
                }
            }
        }
    }
    let median = |name: &str| {
        let mut v: Vec<f64> = o.runs.iter().filter(|r| r.0 == name).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    o.bare_ns = median("bare");
    o.unlimited_ns = median("unlimited");
    o.limited_ns = median("limited");
    o.added_unlimited_ns = o.unlimited_ns.zip(o.bare_ns).map(|(a, b)| a - b);
    o.added_limited_ns = o.limited_ns.zip(o.bare_ns).map(|(a, b)| a - b);
    let paired = |name: &str| {
        let mut v: Vec<f64> = o
            .paired
            .iter()
            .filter(|r| r.0 == name)
            .map(|r| r.1 - r.2)
            .collect();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    o.paired_unlimited_ns = paired("unlimited");
    o.paired_limited_ns = paired("limited");
    res.overhead = Some(o);
    res.target_met = false;
    res
}

/// Runs one row on a process engine.
pub fn run_row(s: &Setup, row: &Row) -> RowResult {
    match row.kind {
        RowKind::Accuracy => run_accuracy(s, row),
        RowKind::Overhead => run_overhead(s, row),
    }
}
