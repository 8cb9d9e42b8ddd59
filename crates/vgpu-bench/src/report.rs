//! Text, JSON and raw (CSV) renderings of a sweep (a single run is a sweep
//! of one condition).
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::harness::RunResult;
use crate::phases::PHASE_NAMES;
use crate::stats::{self, Fit, PERCENTILE_DEFINITION};

/// JSON schema name; bump when a key changes meaning or disappears.
pub const SCHEMA: &str = "vgpu-bench-init/1";

/// Where and how the numbers were taken.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Header {
    pub command: String,
    pub revision: String,
    /// "simulated (vgpu-sim, profile a100-burst)" or the GPU/driver line.
    pub driver: String,
    pub sim_profile: Option<String>,
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub started_unix: u64,
    pub seed: u64,
    /// Conditions in the order they ran (`mode@N#repeat`).
    pub order: Vec<String>,
}

/// One condition of a sweep.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    pub repeat: usize,
    #[serde(flatten)]
    pub result: RunResult,
}

/// Least-squares line of p99 against N for one mode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModeFit {
    pub mode: String,
    pub intercept_ms: f64,
    pub slope_ms_per_process: f64,
    pub r2: f64,
    pub points: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SweepReport {
    pub schema: &'static str,
    pub header: Header,
    pub percentile_definition: &'static str,
    pub phase_names: [&'static str; 10],
    pub runs: Vec<Run>,
    pub fits: Vec<ModeFit>,
}

impl SweepReport {
    pub fn new(header: Header, runs: Vec<Run>) -> SweepReport {
        let fits = fits(&runs);
        SweepReport {
            schema: SCHEMA,
            header,
            percentile_definition: PERCENTILE_DEFINITION,
            phase_names: PHASE_NAMES,
            runs,
            fits,
        }
    }

    /// Modes in first-seen order of the configured list (runs are shuffled).
    pub fn modes(&self) -> Vec<String> {
        let mut m: Vec<String> = Vec::new();
        for r in &self.runs {
            if !m.contains(&r.result.summary.mode) {
                m.push(r.result.summary.mode.clone());
            }
        }
        // Stable, readable order: native first, vgpu second, others after.
        m.sort_by_key(|x| match x.as_str() {
            "native" => (0, x.clone()),
            "vgpu" => (1, x.clone()),
            _ => (2, x.clone()),
        });
        m
    }

    /// Runs of one mode sorted by worker count then repeat.
    pub fn runs_of(&self, mode: &str) -> Vec<&Run> {
        let mut v: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.result.summary.mode == mode)
            .collect();
        v.sort_by_key(|r| (r.result.summary.workers, r.repeat));
        v
    }

    /// The run of `mode` at its largest N whose p99 is the median
    /// (nearest-rank) of that N's repeats: what the composition and the plot
    /// show.
    pub fn representative(&self, mode: &str) -> Option<&Run> {
        let runs = self.runs_of(mode);
        let n = runs.last()?.result.summary.workers;
        let mut at: Vec<&Run> = runs
            .into_iter()
            .filter(|r| r.result.summary.workers == n)
            .collect();
        at.sort_by(|a, b| {
            let k = |r: &Run| r.result.summary.p99_ms.unwrap_or(f64::INFINITY);
            k(a).total_cmp(&k(b))
        });
        let i = stats::nearest_rank_index(at.len(), 50.0)?;
        Some(at[i])
    }

    pub fn total_failed(&self) -> usize {
        self.runs.iter().map(|r| r.result.summary.failed).sum()
    }
}

fn fits(runs: &[Run]) -> Vec<ModeFit> {
    let mut by_mode: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in runs {
        if let Some(p99) = r.result.summary.p99_ms {
            by_mode
                .entry(r.result.summary.mode.clone())
                .or_default()
                .push((r.result.summary.workers as f64, p99));
        }
    }
    by_mode
        .into_iter()
        .filter_map(|(mode, pts)| {
            stats::least_squares(&pts).map(
                |Fit {
                     intercept,
                     slope,
                     r2,
                     points,
                 }| ModeFit {
                    mode,
                    intercept_ms: intercept,
                    slope_ms_per_process: slope,
                    r2,
                    points,
                },
            )
        })
        .collect()
}

fn f(v: Option<f64>) -> String {
    match v {
        Some(x) if x >= 1000.0 => format!("{x:.0}"),
        Some(x) if x >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    }
}

/// The human-readable report.
pub fn text(rep: &SweepReport) -> String {
    let mut o = String::new();
    let h = &rep.header;
    let _ = writeln!(o, "# vgpu bench init");
    let _ = writeln!(o, "# command:  {}", h.command);
    let _ = writeln!(o, "# revision: {}", h.revision);
    let _ = writeln!(o, "# driver:   {}", h.driver);
    let _ = writeln!(
        o,
        "# machine:  {} CPUs, {}, kernel {}",
        h.cpus, h.cpu_model, h.kernel
    );
    if h.order.len() > 1 {
        let _ = writeln!(
            o,
            "# order (randomized, seed {}): {}",
            h.seed,
            h.order.join(" ")
        );
    }
    let _ = writeln!(
        o,
        "# latency = cuInit entry to return of the measured calls, per worker, ms"
    );
    let _ = writeln!(o, "# percentiles: {}", rep.percentile_definition);
    let _ = writeln!(
        o,
        "# failed workers are counted, never part of a percentile"
    );
    let _ = writeln!(o, "# wall = broadcast release to the last worker's return; cpu = summed user+sys of all workers; call_cpu = summed CPU time (all threads) inside the measured calls");
    for mode in rep.modes() {
        let _ = writeln!(o);
        let _ = writeln!(o, "mode {mode}");
        let _ = writeln!(
            o,
            "  {:>7} {:>3} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}  failures",
            "workers",
            "rep",
            "ok",
            "failed",
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "mean_ms",
            "wall_ms",
            "cpu_ms",
            "call_cpu"
        );
        for r in rep.runs_of(&mode) {
            let s = &r.result.summary;
            let fails: Vec<String> = s
                .failures
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(
                o,
                "  {:>7} {:>3} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10.1} {:>9.1}  {}",
                s.workers,
                r.repeat,
                s.ok,
                s.failed,
                f(s.p50_ms),
                f(s.p95_ms),
                f(s.p99_ms),
                f(s.max_ms),
                f(s.mean_ms),
                f(s.wall_ms),
                s.cpu_ms_total,
                s.call_cpu_ms_total,
                if fails.is_empty() {
                    "-".into()
                } else {
                    fails.join(", ")
                }
            );
        }
        if let Some(fit) = rep.fits.iter().find(|x| x.mode == mode) {
            let _ = writeln!(
                o,
                "  fit p99 = {:.2} ms + {:.3} ms/process x N   (R² {:.3}, {} points)",
                fit.intercept_ms, fit.slope_ms_per_process, fit.r2, fit.points
            );
        }
        // Phase composition and region counts of the representative run at
        // the largest N (median p99 over its repeats).
        if let Some(r) = rep.representative(&mode) {
            let res = &r.result;
            let _ = writeln!(
                o,
                "  phase composition at N={} (repeat {}, the median p99 of its repeats) (ms):",
                res.summary.workers, r.repeat
            );
            for c in &res.compositions {
                let segs: Vec<String> = c
                    .segments
                    .iter()
                    .map(|s| format!("{} {:.3}", s.name, s.ms))
                    .collect();
                let _ = writeln!(
                    o,
                    "    {:>4} worker #{:<4} {:>10.3}  = {}",
                    c.rank,
                    c.index,
                    c.latency_ms,
                    segs.join(" | ")
                );
            }
            if let Some(reg) = &res.region {
                match &reg.error {
                    Some(e) => {
                        let _ = writeln!(o, "  region: not read: {e}");
                    }
                    None => {
                        let list = |m: &BTreeMap<String, usize>| -> String {
                            let v: Vec<String> =
                                m.iter().map(|(k, v)| format!("{k} {v}")).collect();
                            if v.is_empty() {
                                "-".into()
                            } else {
                                v.join(", ")
                            }
                        };
                        let kinds: Vec<String> = reg
                            .fallback_kinds
                            .iter()
                            .map(|(k, v)| format!("{k} {v}"))
                            .collect();
                        let _ = writeln!(
                            o,
                            "  region: {} slots, {} workers matched; identity tier: {}; identity state: {}",
                            reg.slots_seen,
                            reg.workers_matched,
                            list(&reg.by_identity_tier),
                            list(&reg.by_identity_state),
                        );
                        let _ = writeln!(
                            o,
                            "  region: fallbacks {}{}; post-init waits (identity inside cuInit) {}; phase vectors monotonic {}/{}",
                            reg.fallbacks,
                            if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) },
                            reg.post_init_waits,
                            reg.phases_monotonic,
                            reg.phases_monotonic + reg.phases_not_monotonic
                        );
                    }
                }
            }
            if !res.worker_log.is_empty() {
                let _ = writeln!(o, "  worker stderr (first distinct lines):");
                for l in &res.worker_log {
                    let _ = writeln!(o, "    {l}");
                }
            }
        }
    }
    comparison(rep, &mut o);
    o
}

/// Side-by-side ratios against native at each N (p99) and slope deltas.
fn comparison(rep: &SweepReport, o: &mut String) {
    let modes = rep.modes();
    if !modes.iter().any(|m| m == "native") || modes.len() < 2 {
        return;
    }
    let p99 = |mode: &str, n: usize| -> Option<f64> {
        let v: Vec<f64> = rep
            .runs_of(mode)
            .iter()
            .filter(|r| r.result.summary.workers == n)
            .filter_map(|r| r.result.summary.p99_ms)
            .collect();
        let mut v = v;
        v.sort_by(f64::total_cmp);
        stats::nearest_rank(&v, 50.0)
    };
    let mut ns: Vec<usize> = rep.runs.iter().map(|r| r.result.summary.workers).collect();
    ns.sort_unstable();
    ns.dedup();
    let _ = writeln!(o);
    let _ = writeln!(o, "p99 relative to native (median p99 over repeats):");
    let _ = write!(o, "  {:>7}", "workers");
    for m in modes.iter().filter(|m| *m != "native") {
        let _ = write!(o, " {:>16}", m);
    }
    let _ = writeln!(o);
    for n in ns {
        let _ = write!(o, "  {:>7}", n);
        for m in modes.iter().filter(|m| *m != "native") {
            let cell = match (p99(m, n), p99("native", n)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.3}x", a / b),
                _ => "-".into(),
            };
            let _ = write!(o, " {:>16}", cell);
        }
        let _ = writeln!(o);
    }
    if let Some(native) = rep.fits.iter().find(|f| f.mode == "native") {
        for fit in rep.fits.iter().filter(|f| f.mode != "native") {
            let _ = writeln!(
                o,
                "  slope added by {}: {:+.3} ms/process",
                fit.mode,
                fit.slope_ms_per_process - native.slope_ms_per_process
            );
        }
    }
}

/// JSON of the whole report (compact, one line).
pub fn json(rep: &SweepReport) -> String {
    // Compact: a sweep holds thousands of raw worker records.
    let mut s = serde_json::to_string(rep).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// One CSV line per worker of every run.
pub fn raw_csv(rep: &SweepReport) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "mode,workers,repeat,index,pid,ok,reason,exit_code,signal,init_result,then_result,state,resolve_ms,release_offset_ms,latency_ms,init_ms,return_offset_ms,cpu_ms,cpu_before_ms,call_cpu_ms,cpu_after_ms,t_ready_ns,t_released_ns,t_entry_ns,t_init_return_ns,t_return_ns,identity_tier,fallbacks,post_init_waits,phases_monotonic"
    );
    for p in PHASE_NAMES {
        let _ = write!(o, ",{p}_ns");
    }
    let _ = writeln!(o);
    let opt = |v: Option<String>| v.unwrap_or_default();
    for r in &rep.runs {
        for w in &r.result.workers {
            let reason = w
                .reason
                .clone()
                .unwrap_or_default()
                .replace([',', '"', '\n'], " ");
            let _ = write!(
                o,
                "{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.result.summary.mode,
                r.result.summary.workers,
                r.repeat,
                w.index,
                opt(w.pid.map(|v| v.to_string())),
                w.ok,
                reason,
                opt(w.exit_code.map(|v| v.to_string())),
                opt(w.signal.map(|v| v.to_string())),
                opt(w.init_result.map(|v| v.to_string())),
                opt(w.then_result.map(|v| v.to_string())),
                w.state,
                w.resolve_ms,
                opt(w.release_offset_ms.map(|v| format!("{v:.6}"))),
                opt(w.latency_ms.map(|v| format!("{v:.6}"))),
                opt(w.init_ms.map(|v| format!("{v:.6}"))),
                opt(w.return_offset_ms.map(|v| format!("{v:.6}"))),
                opt(w.cpu_ms.map(|v| format!("{v:.3}"))),
                opt(w.cpu_before_ms.map(|v| format!("{v:.3}"))),
                opt(w.call_cpu_ms.map(|v| format!("{v:.3}"))),
                opt(w.cpu_after_ms.map(|v| format!("{v:.3}"))),
                w.t_ready_ns,
                w.t_released_ns,
                w.t_entry_ns,
                w.t_init_return_ns,
                w.t_return_ns,
                opt(w.identity_tier.clone()),
                opt(w.fallbacks.map(|v| v.to_string())),
                opt(w.post_init_waits.map(|v| v.to_string())),
                opt(w.phases_monotonic.map(|v| v.to_string())),
            );
            for i in 0..PHASE_NAMES.len() {
                let _ = write!(o, ",{}", opt(w.phases_ns.map(|p| p[i].to_string())));
            }
            let _ = writeln!(o);
        }
    }
    o
}
