//! One burst: N fresh worker processes, one broadcast release, every worker
//! accounted for.
//!
//! Protocol (all pipes close-on-exec in the harness; each worker inherits
//! only its ends, see `sys::spawn_with_fds`):
//! 1. result table (memfd, all slots "no result") + ready, release, done and
//!    hold pipes;
//! 2. fork+exec N workers; the harness drops its copies of the worker ends;
//! 3. read the ready pipe to EOF (every worker wrote its byte and closed, or
//!    died); take `t_release`; close the release write end: one broadcast;
//! 4. read the done pipe to EOF; snapshot the vgpu region while every worker
//!    still holds its slot;
//! 5. close the hold write end; `wait4` every worker (exit status + rusage).
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::phases::{self, PhaseVector, Segment};
use crate::region_view::{self, RegionSnapshot};
use crate::slots::{self, ResultTable, SlotCopy};
use crate::stats::{self, Summary};
use crate::sys;
use crate::worker::{self, Resolve, Then, WorkerArgs};

/// Which library (if any) the workers run under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No preload: the driver alone.
    Native,
    /// `LD_PRELOAD=libvgpu.so`, a fresh region per run.
    Vgpu { lib: PathBuf },
    /// Any other interposer; `label` names it in reports.
    Preload { label: String, lib: PathBuf },
}

impl Mode {
    pub fn label(&self) -> String {
        match self {
            Mode::Native => "native".into(),
            Mode::Vgpu { .. } => "vgpu".into(),
            Mode::Preload { label, .. } => label.clone(),
        }
    }
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub mode: Mode,
    pub workers: usize,
    pub then: Then,
    pub resolve: Resolve,
    /// Path of `vgpu-bench-worker`.
    pub worker_exe: PathBuf,
    /// Extra environment for every worker (e.g. the simulated driver's).
    pub env: Vec<(String, String)>,
    /// Worker indices told to abort right after the release (tests).
    pub crash: Vec<usize>,
    /// Whole-run deadline; stragglers are SIGKILLed and reported as timeouts.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("cannot set up the result table")]
    Table(#[source] slots::SlotsError),
    #[error("cannot create a harness pipe")]
    Pipe(#[source] std::io::Error),
    #[error("cannot create the run directory")]
    TempDir(#[source] std::io::Error),
    #[error("cannot open the worker log {0}")]
    Log(PathBuf, #[source] std::io::Error),
    #[error("reading the {0} pipe failed")]
    Read(&'static str, #[source] std::io::Error),
    #[error("worker program {0} not found (build it: cargo build -p vgpu-bench)")]
    NoWorker(PathBuf),
    #[error("--workers must be at least 1")]
    NoWorkers,
}

/// Everything known about one worker after the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkerRecord {
    pub index: usize,
    pub pid: Option<u32>,
    pub ok: bool,
    /// Why it failed (None when ok).
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub init_result: Option<u32>,
    pub then_result: Option<u32>,
    /// Last protocol state the worker reached (`empty` = never wrote).
    pub state: &'static str,
    pub resolve_ms: f64,
    /// Worker's wake-up after the broadcast, relative to `t_release`.
    pub release_offset_ms: Option<f64>,
    /// `t_return - t_entry`: the measured call sequence.
    pub latency_ms: Option<f64>,
    /// `t_init_return - t_entry`: `cuInit` alone.
    pub init_ms: Option<f64>,
    /// `t_return - t_release`.
    pub return_offset_ms: Option<f64>,
    /// user + system CPU time of the whole worker process.
    pub cpu_ms: Option<f64>,
    /// CPU time (all threads) from exec to ready: loader, interposer
    /// setup, resolving `cuInit`.
    pub cpu_before_ms: Option<f64>,
    /// CPU time (all threads) inside the measured calls.
    pub call_cpu_ms: Option<f64>,
    /// CPU time from return to exit (holding, then teardown).
    pub cpu_after_ms: Option<f64>,
    pub t_ready_ns: u64,
    pub t_released_ns: u64,
    pub t_entry_ns: u64,
    pub t_init_return_ns: u64,
    pub t_return_ns: u64,
    /// Phase timestamps from the region (vgpu mode), order of `phase_names`.
    pub phases_ns: Option<PhaseVector>,
    pub phases_monotonic: Option<bool>,
    pub identity_tier: Option<String>,
    pub fallbacks: Option<u64>,
    pub post_init_waits: Option<u64>,
}

/// Summary of one run (keys are a stable schema: see the golden test).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub mode: String,
    pub workers: usize,
    pub ok: usize,
    pub failed: usize,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    /// Release to the last worker's return.
    pub wall_ms: Option<f64>,
    /// Latest wake-up after the broadcast.
    pub release_spread_ms: Option<f64>,
    /// Summed user+system time of all workers.
    pub cpu_ms_total: f64,
    /// Summed CPU time inside the measured calls.
    pub call_cpu_ms_total: f64,
    pub failures: BTreeMap<String, usize>,
    pub then: &'static str,
    pub resolve: &'static str,
}

/// Phase composition of one ranked worker (p50/p95/p99/max).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Composition {
    pub rank: &'static str,
    pub index: usize,
    pub latency_ms: f64,
    pub segments: Vec<Segment>,
}

/// What the region said (vgpu mode).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RegionCounts {
    pub slots_seen: usize,
    pub workers_matched: usize,
    pub by_identity_tier: BTreeMap<String, usize>,
    pub by_identity_state: BTreeMap<String, usize>,
    pub fallbacks: u64,
    pub fallback_kinds: BTreeMap<String, u64>,
    pub post_init_waits: u64,
    pub phases_monotonic: usize,
    pub phases_not_monotonic: usize,
    pub error: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    pub summary: RunSummary,
    pub compositions: Vec<Composition>,
    pub region: Option<RegionCounts>,
    /// First distinct lines the workers wrote to stderr (when any failed).
    pub worker_log: Vec<String>,
    pub workers: Vec<WorkerRecord>,
}

/// `e: source: source…` on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn state_name(s: u32) -> &'static str {
    match s {
        slots::STATE_EMPTY => "empty",
        slots::STATE_READY => "ready",
        slots::STATE_RELEASED => "released",
        slots::STATE_ENTERED => "entered",
        slots::STATE_DONE => "done",
        _ => "corrupt",
    }
}

fn cu_name(r: u32) -> String {
    match vgpu_cuda_abi::CUresult(r).name() {
        Some(n) => n.to_string(),
        None => format!("CUresult({r})"),
    }
}

/// Locate `vgpu-bench-worker` next to the running program (or its parent
/// directory, for test binaries in `deps/`), or in `$VGPU_ARTIFACT_DIR`.
pub fn locate_artifact(name: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("VGPU_ARTIFACT_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if let Some(p) = d.parent() {
                dirs.push(p.to_path_buf());
            }
        }
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Run one burst.
pub fn run(cfg: &RunConfig) -> Result<RunResult, HarnessError> {
    if cfg.workers == 0 {
        return Err(HarnessError::NoWorkers);
    }
    if !cfg.worker_exe.is_file() {
        return Err(HarnessError::NoWorker(cfg.worker_exe.clone()));
    }
    let n = cfg.workers;
    let dir = tempfile::Builder::new()
        .prefix("vgpu-bench-")
        .tempdir()
        .map_err(HarnessError::TempDir)?;
    let region_path = dir.path().join("vgpu.cache");
    let log_path = dir.path().join("workers.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| HarnessError::Log(log_path.clone(), e))?;

    let table = ResultTable::create(n).map_err(HarnessError::Table)?;
    let (ready_r, ready_w) = sys::pipe().map_err(HarnessError::Pipe)?;
    let (release_r, release_w) = sys::pipe().map_err(HarnessError::Pipe)?;
    let (done_r, done_w) = sys::pipe().map_err(HarnessError::Pipe)?;
    let (hold_r, hold_w) = sys::pipe().map_err(HarnessError::Pipe)?;

    let mut pids: Vec<Option<u32>> = Vec::with_capacity(n);
    let mut spawn_errors: Vec<Option<String>> = vec![None; n];
    for (i, spawn_error) in spawn_errors.iter_mut().enumerate() {
        let args = WorkerArgs {
            table_fd: std::os::fd::AsRawFd::as_raw_fd(&table.fd()),
            ready_w: sys::raw(&ready_w),
            release_r: sys::raw(&release_r),
            done_w: sys::raw(&done_w),
            hold_r: sys::raw(&hold_r),
            index: i,
            then: cfg.then,
            resolve: cfg.resolve,
            abort: cfg.crash.contains(&i),
        };
        let mut cmd = Command::new(&cfg.worker_exe);
        cmd.args(args.to_args());
        cmd.stdout(Stdio::null());
        match log.try_clone() {
            Ok(f) => {
                cmd.stderr(f);
            }
            Err(_) => {
                cmd.stderr(Stdio::null());
            }
        }
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        match &cfg.mode {
            Mode::Native => {
                cmd.env_remove("LD_PRELOAD");
            }
            Mode::Vgpu { lib } => {
                cmd.env("LD_PRELOAD", lib);
                cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region_path);
                // The phase breakdown needs the slot claimed inside
                // cuInit: by default the interposer attaches later, at the
                // first call that needs the region.
                cmd.env("LIBVGPU_ATTACH", "eager");
            }
            Mode::Preload { lib, .. } => {
                // The same region as `vgpu`, so another build of libvgpu.so
                // (e.g. the previous one, for a before/after sweep) does the
                // same work; an interposer that ignores the variable is
                // unaffected.
                cmd.env("LD_PRELOAD", lib);
                cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region_path);
            }
        }
        let fds = [
            args.table_fd,
            args.ready_w,
            args.release_r,
            args.done_w,
            args.hold_r,
        ];
        match sys::spawn_with_fds(&mut cmd, &fds) {
            Ok(pid) => pids.push(Some(pid)),
            Err(e) => {
                *spawn_error = Some(format!("spawn: {e}"));
                pids.push(None);
            }
        }
    }
    // Only workers hold these ends now: EOF on ready/done means every
    // worker either wrote its byte and closed, or died.
    drop((ready_w, release_r, done_w, hold_r));

    let deadline = Instant::now() + cfg.timeout;
    let mut timed_out = vec![false; n];
    let kill_unfinished = |timed_out: &mut Vec<bool>| {
        for (i, pid) in pids.iter().enumerate() {
            let done = table
                .read(i)
                .map(|s| s.state == slots::STATE_DONE)
                .unwrap_or(false);
            if let (Some(pid), false) = (pid, done) {
                sys::kill(*pid);
                timed_out[i] = true;
            }
        }
    };
    let (_, ready_eof) =
        sys::drain_until_eof(&ready_r, deadline).map_err(|e| HarnessError::Read("ready", e))?;
    if !ready_eof {
        kill_unfinished(&mut timed_out);
    }
    let t_release = slots::monotonic_ns();
    drop(release_w); // the broadcast
    let (_, done_eof) =
        sys::drain_until_eof(&done_r, deadline).map_err(|e| HarnessError::Read("done", e))?;
    if !done_eof {
        kill_unfinished(&mut timed_out);
    }

    // Every surviving worker still holds its region slot here.
    let snapshot = match &cfg.mode {
        Mode::Vgpu { .. } => Some(region_view::snapshot(&region_path).map_err(|e| error_chain(&e))),
        _ => None,
    };
    drop(hold_w);

    let mut exits = Vec::with_capacity(n);
    for pid in &pids {
        exits.push(pid.and_then(|p| sys::wait_child(p).ok()));
    }

    let mut records = Vec::with_capacity(n);
    for (i, spawn_error) in spawn_errors.into_iter().enumerate() {
        let s = table.read(i).unwrap_or_default();
        records.push(record(
            i,
            pids[i],
            &s,
            exits[i],
            timed_out[i],
            spawn_error,
            t_release,
        ));
    }
    let region = snapshot.map(|snap| attach_region(&mut records, snap));
    let worker_log = if records.iter().any(|r| !r.ok) {
        read_log(&log_path)
    } else {
        Vec::new()
    };
    Ok(summarize(cfg, records, region, worker_log, t_release))
}

fn record(
    index: usize,
    pid: Option<u32>,
    s: &SlotCopy,
    exit: Option<sys::Exit>,
    timed_out: bool,
    spawn_error: Option<String>,
    t_release: u64,
) -> WorkerRecord {
    let done = s.state == slots::STATE_DONE;
    let reason = if let Some(e) = spawn_error {
        Some(e)
    } else if timed_out {
        Some("timeout (killed)".to_string())
    } else if let Some(sig) = exit.and_then(|e| e.signal) {
        Some(format!("signal {}", sys::signal_name(sig)))
    } else if exit.is_none() {
        Some("not reaped".to_string())
    } else if done && s.init_result != 0 {
        Some(format!("cuInit {}", cu_name(s.init_result)))
    } else if done && s.then_result != 0 {
        Some(format!("then {}", cu_name(s.then_result)))
    } else if let Some(code) = exit.and_then(|e| e.code).filter(|&c| c != 0) {
        Some(match code {
            worker::EXIT_NO_DRIVER => "exit 5 (libcuda.so.1 not loadable)".to_string(),
            worker::EXIT_USAGE => "exit 2 (worker usage)".to_string(),
            worker::EXIT_PROTOCOL => "exit 6 (harness protocol)".to_string(),
            c => format!("exit {c}"),
        })
    } else if !done {
        Some("missing result".to_string())
    } else {
        None
    };
    let rel = |t: u64| (t != 0 && t >= t_release).then(|| ms(t - t_release));
    let span = |a: u64, b: u64| (done && a != 0 && b >= a).then(|| ms(b - a));
    WorkerRecord {
        index,
        pid: pid.or((s.pid != 0).then_some(s.pid)),
        ok: reason.is_none(),
        reason,
        exit_code: exit.and_then(|e| e.code),
        signal: exit.and_then(|e| e.signal),
        init_result: done.then_some(s.init_result),
        then_result: done.then_some(s.then_result),
        state: state_name(s.state),
        resolve_ms: ms(s.resolve_ns),
        release_offset_ms: rel(s.t_released),
        latency_ms: span(s.t_entry, s.t_return),
        init_ms: span(s.t_entry, s.t_init_return),
        return_offset_ms: if done { rel(s.t_return) } else { None },
        cpu_ms: exit.map(|e| (e.utime_us + e.stime_us) as f64 / 1e3),
        cpu_before_ms: (s.cpu_ready_ns != 0).then(|| ms(s.cpu_ready_ns)),
        call_cpu_ms: span(s.cpu_entry_ns, s.cpu_return_ns),
        cpu_after_ms: match (exit, done && s.cpu_return_ns != 0) {
            (Some(e), true) => {
                Some(((e.utime_us + e.stime_us) as f64 / 1e3 - ms(s.cpu_return_ns)).max(0.0))
            }
            _ => None,
        },
        t_ready_ns: s.t_ready,
        t_released_ns: s.t_released,
        t_entry_ns: s.t_entry,
        t_init_return_ns: s.t_init_return,
        t_return_ns: s.t_return,
        phases_ns: None,
        phases_monotonic: None,
        identity_tier: None,
        fallbacks: None,
        post_init_waits: None,
    }
}

fn attach_region(
    records: &mut [WorkerRecord],
    snap: Result<RegionSnapshot, String>,
) -> RegionCounts {
    let snap = match snap {
        Ok(s) => s,
        Err(e) => {
            return RegionCounts {
                error: Some(e),
                ..Default::default()
            }
        }
    };
    let mut c = RegionCounts {
        slots_seen: snap.slots.len(),
        ..Default::default()
    };
    let by_pid: BTreeMap<u32, &region_view::SlotTelemetry> =
        snap.slots.iter().map(|s| (s.pid, s)).collect();
    for r in records.iter_mut() {
        let Some(t) = r.pid.and_then(|p| by_pid.get(&p)) else {
            continue;
        };
        c.workers_matched += 1;
        *c.by_identity_tier
            .entry(t.identity_tier.clone())
            .or_default() += 1;
        *c.by_identity_state
            .entry(t.identity_state.clone())
            .or_default() += 1;
        c.fallbacks += t.fallbacks;
        for (k, n) in &t.fallback_kinds {
            *c.fallback_kinds.entry(k.clone()).or_default() += n;
        }
        c.post_init_waits += t.post_init_waits;
        r.phases_ns = Some(t.phases);
        r.identity_tier = Some(t.identity_tier.clone());
        r.fallbacks = Some(t.fallbacks);
        r.post_init_waits = Some(t.post_init_waits);
        if r.t_return_ns != 0 {
            let m = phases::monotonic(
                r.t_ready_ns,
                r.t_released_ns,
                r.t_entry_ns,
                r.t_init_return_ns,
                r.t_return_ns,
                &t.phases,
            );
            r.phases_monotonic = Some(m);
            if m {
                c.phases_monotonic += 1;
            } else {
                c.phases_not_monotonic += 1;
            }
        }
    }
    c
}

fn read_log(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if out.len() >= 20 {
            break;
        }
        if seen.insert(line.to_string()) {
            out.push(line.chars().take(300).collect());
        }
    }
    out
}

fn summarize(
    cfg: &RunConfig,
    records: Vec<WorkerRecord>,
    region: Option<RegionCounts>,
    worker_log: Vec<String>,
    _t_release: u64,
) -> RunResult {
    let ok: Vec<&WorkerRecord> = records.iter().filter(|r| r.ok).collect();
    let lat: Vec<f64> = ok.iter().filter_map(|r| r.latency_ms).collect();
    let s = Summary::of(&lat);
    let mut failures = BTreeMap::new();
    for r in records.iter().filter(|r| !r.ok) {
        *failures
            .entry(r.reason.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    let wall_ms = records
        .iter()
        .filter_map(|r| r.return_offset_ms)
        .reduce(f64::max);
    let release_spread_ms = records
        .iter()
        .filter_map(|r| r.release_offset_ms)
        .reduce(f64::max);
    let cpu_ms_total = records.iter().filter_map(|r| r.cpu_ms).sum();
    let call_cpu_ms_total = records.iter().filter_map(|r| r.call_cpu_ms).sum();

    // Ranked workers for the phase composition.
    let mut ranked: Vec<&WorkerRecord> = ok
        .iter()
        .copied()
        .filter(|r| r.latency_ms.is_some())
        .collect();
    ranked.sort_by(|a, b| {
        a.latency_ms
            .unwrap_or(0.0)
            .total_cmp(&b.latency_ms.unwrap_or(0.0))
    });
    let mut compositions = Vec::new();
    for (rank, p) in [("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("max", 100.0)] {
        if let Some(i) = stats::nearest_rank_index(ranked.len(), p) {
            let r = ranked[i];
            compositions.push(Composition {
                rank,
                index: r.index,
                latency_ms: r.latency_ms.unwrap_or(0.0),
                segments: phases::compose(
                    r.t_entry_ns,
                    r.t_init_return_ns,
                    r.t_return_ns,
                    r.phases_ns.as_ref(),
                    cfg.then != Then::None,
                ),
            });
        }
    }
    let summary = RunSummary {
        mode: cfg.mode.label(),
        workers: cfg.workers,
        ok: ok.len(),
        failed: records.len() - ok.len(),
        p50_ms: s.p50_ms,
        p95_ms: s.p95_ms,
        p99_ms: s.p99_ms,
        max_ms: s.max_ms,
        min_ms: s.min_ms,
        mean_ms: s.mean_ms,
        wall_ms,
        release_spread_ms,
        cpu_ms_total,
        call_cpu_ms_total,
        failures,
        then: cfg.then.as_str(),
        resolve: cfg.resolve.as_str(),
    };
    RunResult {
        summary,
        compositions,
        region,
        worker_log,
        workers: records,
    }
}
