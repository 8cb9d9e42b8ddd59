//! The SM bench's results: one `RowResult` per row and engine, rendered as
//! JSON (a `rows` array) and a text table. Failures stay in the numbers.

use std::fmt::Write as _;

use super::metrics::{Figures, Ratio};

/// JSON schema name; bump when a key changes meaning or disappears.
pub const SCHEMA: &str = "vgpu-bench-sm/1";

/// One tenant of a row.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TenantResult {
    /// Its label.
    pub label: String,
    /// Its limit at the start, percent (`None`: unlimited).
    pub target: Option<f64>,
    /// Its limit in each second (a live change shows here).
    pub targets: Vec<Option<f64>>,
    /// How it launched.
    pub mode: String,
    /// Kernel length, ns.
    pub kernel_ns: u64,
    /// Its PID (0 on the model).
    pub pid: u32,
    /// Share of each second, percent (the device's own accounting).
    pub per_second: Vec<f64>,
    /// Figures (over the whole run).
    #[serde(flatten)]
    pub figures: Figures,
    /// Figures over the seconds after a live change (the new target).
    pub after_change: Option<Figures>,
    /// Met the targets (limited tenants only).
    pub target_met: Option<bool>,
    /// Launch calls that returned success.
    pub launches: u64,
    /// Launch calls per second.
    pub launches_per_s: f64,
    /// It failed (exit, signal, no report, deadline).
    pub failed: bool,
    /// Why.
    pub error: Option<String>,
}

/// ns per launch call, from the overhead row.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Overhead {
    /// Median (of runs) of each run's median call time, bare driver.
    pub bare_ns: Option<f64>,
    /// Under libvgpu.so, no limit.
    pub unlimited_ns: Option<f64>,
    /// Under libvgpu.so with a 50 % limit (zero-length kernels: budget
    /// always available).
    pub limited_ns: Option<f64>,
    /// unlimited − bare.
    pub added_unlimited_ns: Option<f64>,
    /// limited − bare.
    pub added_limited_ns: Option<f64>,
    /// Every run: (configuration, median ns, calls timed).
    pub runs: Vec<(String, f64, u64)>,
    /// Median (of runs) of one run's interposed median minus its own
    /// direct median (the driver's entry point past the interposer, timed
    /// in alternating batches in the same process), no limit. Free of the
    /// spread between processes that the differences of medians above
    /// carry.
    pub paired_unlimited_ns: Option<f64>,
    /// The same with the 50 % limit.
    pub paired_limited_ns: Option<f64>,
    /// Every interposed run: (configuration, median ns interposed, median
    /// ns direct).
    pub paired: Vec<(String, f64, f64)>,
}

/// One row on one engine.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RowResult {
    /// Row name.
    pub name: String,
    /// What it shows.
    pub what: String,
    /// sim, gpu or model.
    pub engine: String,
    /// SM count the tenants saw.
    pub sms: u32,
    /// Seconds measured.
    pub seconds: usize,
    /// The first limited tenant's target, percent.
    pub target: Option<f64>,
    /// Its achieved share, percent.
    pub achieved: Option<f64>,
    /// Its mean absolute error, points.
    pub mae_points: Option<f64>,
    /// Its settling time, s.
    pub settled_s: Option<f64>,
    /// Every limited tenant met the targets, the ratio too, no failure.
    pub target_met: bool,
    /// Two limited tenants: their ratio.
    pub ratio: Option<Ratio>,
    /// Tenants.
    pub tenants: Vec<TenantResult>,
    /// Failed tenants (or harness steps).
    pub failures: usize,
    /// The overhead row's figures.
    pub overhead: Option<Overhead>,
    /// Anything the reader must know (a live change that could not be
    /// applied, a failure's first lines).
    pub notes: Vec<String>,
    /// The device's busy share of each second (every tenant's summed).
    pub busy_per_second: Vec<f64>,
    /// Its mean over the counted seconds (all but the first).
    pub busy_mean: Option<f64>,
    /// Lending rows: each band and what the seconds showed.
    pub checks: Vec<CheckResult>,
    /// Shown for comparison (a lending row's fixed-cap twin).
    pub informational: bool,
}

/// One band of a lending row, judged.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckResult {
    /// What it shows.
    pub what: String,
    /// Seconds `[from, to)`.
    pub seconds: (usize, usize),
    /// The band.
    pub min: f64,
    /// The band.
    pub max: f64,
    /// Lowest and highest share seen in those seconds.
    pub seen: (f64, f64),
    /// Every second in the band.
    pub met: bool,
}

impl RowResult {
    /// Busy time per second, and the checks of a lending row (which then
    /// decide `target_met`, with the failures).
    pub fn judge_checks(&mut self, checks: &[super::rows::Check], informational: bool) {
        let n = self.seconds;
        self.informational = informational;
        self.busy_per_second = (0..n)
            .map(|i| {
                self.tenants
                    .iter()
                    .map(|t| t.per_second.get(i).copied().unwrap_or(0.0))
                    .sum()
            })
            .collect();
        if n > 1 {
            self.busy_mean = Some(self.busy_per_second[1..].iter().sum::<f64>() / (n - 1) as f64);
        }
        if checks.is_empty() {
            return;
        }
        self.checks = checks
            .iter()
            .map(|c| {
                let vals: Vec<f64> = (c.from_s..c.to_s.min(n))
                    .map(|i| match c.who {
                        super::rows::Who::Busy => self.busy_per_second[i],
                        super::rows::Who::Tenant(k) => self
                            .tenants
                            .get(k)
                            .and_then(|t| t.per_second.get(i).copied())
                            .unwrap_or(0.0),
                    })
                    .collect();
                let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
                let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                CheckResult {
                    what: c.what.clone(),
                    seconds: (c.from_s, c.to_s),
                    min: c.min,
                    max: c.max,
                    seen: (lo, hi),
                    met: !vals.is_empty() && lo >= c.min && hi <= c.max,
                }
            })
            .collect();
        for t in &mut self.tenants {
            t.target_met = None;
        }
        self.ratio = None;
        self.target_met = self.failures == 0 && self.checks.iter().all(|c| c.met);
    }

    /// Fills the row-level figures from its tenants.
    pub fn summarize(&mut self, change_s: Option<usize>) {
        for t in self.tenants.iter_mut().filter(|t| t.target.is_some()) {
            t.target_met = Some(super::metrics::met(&t.figures, change_s) && !t.failed);
        }
        let limited: Vec<&TenantResult> =
            self.tenants.iter().filter(|t| t.target.is_some()).collect();
        if let Some(p) = limited.first() {
            // A live change: the row is judged on the new target.
            let (target, f) = match &p.after_change {
                Some(a) => (p.targets.last().copied().flatten(), a),
                None => (p.target, &p.figures),
            };
            self.target = target;
            self.achieved = Some(f.achieved);
            self.mae_points = f.mae_points;
            self.settled_s = f.settled_s;
        }
        self.ratio = match limited.as_slice() {
            [a, b] if self.tenants.len() == 2 => Some(super::metrics::ratio(
                a.target.unwrap_or(0.0),
                a.figures.achieved,
                b.target.unwrap_or(0.0),
                b.figures.achieved,
            )),
            _ => None,
        };
        let any_limited = !limited.is_empty();
        self.failures += self.tenants.iter().filter(|t| t.failed).count();
        self.target_met = self.failures == 0
            && any_limited
            && self.tenants.iter().all(|t| t.target_met != Some(false))
            && self.ratio.as_ref().is_none_or(|r| r.within_target);
    }
}

/// Where and how the numbers were taken.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Header {
    /// The command line.
    pub command: String,
    /// git revision.
    pub revision: String,
    /// Driver(s).
    pub driver: String,
    /// The interposer the tenants ran under ("none" for native).
    pub preload: String,
    /// CPUs.
    pub cpus: usize,
    /// CPU model.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Unix time at the start.
    pub started_unix: u64,
    /// Seconds per row.
    pub seconds: usize,
    /// How the error figures are defined.
    pub mae_definition: &'static str,
}

/// The whole report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SmReport {
    /// Schema.
    pub schema: &'static str,
    /// Header.
    pub header: Header,
    /// Rows (every engine's, in run order).
    pub rows: Vec<RowResult>,
}

impl SmReport {
    /// Failed tenants over all rows.
    pub fn failures(&self) -> usize {
        self.rows.iter().map(|r| r.failures).sum()
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// The text table.
pub fn text(rep: &SmReport) -> String {
    let mut s = String::new();
    let h = &rep.header;
    let _ = writeln!(s, "vgpu bench sm: {}", h.command);
    let _ = writeln!(
        s,
        "revision {} · {} · preload {} · {} CPUs ({}) · kernel {} · {} s per row",
        h.revision, h.driver, h.preload, h.cpus, h.cpu_model, h.kernel, h.seconds
    );
    let _ = writeln!(s, "error figures: {}", h.mae_definition);
    let _ = writeln!(
        s,
        "\n{:<14} {:<6} {:>4} {:>7} {:>9} {:>7} {:>8} {:>4}  tenants (label target→achieved, launches/s)",
        "row", "engine", "SMs", "target", "achieved", "mae", "settled", "met"
    );
    for r in &rep.rows {
        if let Some(o) = &r.overhead {
            let _ = writeln!(
                s,
                "{:<14} {:<6} {:>4}  ns/launch: bare {}, unlimited {} (+{}), limited {} (+{}); {} runs, {} failed",
                r.name,
                r.engine,
                r.sms,
                opt(o.bare_ns, 0),
                opt(o.unlimited_ns, 0),
                opt(o.added_unlimited_ns, 0),
                opt(o.limited_ns, 0),
                opt(o.added_limited_ns, 0),
                o.runs.len(),
                r.failures
            );
            if !o.paired.is_empty() {
                let _ = writeln!(
                    s,
                    "{:<14} {:<6} {:>4}  added within a process (interposed − the driver's own entry point, alternating batches; median of runs): unlimited +{}, limited +{}",
                    "", "", "",
                    opt(o.paired_unlimited_ns, 0),
                    opt(o.paired_limited_ns, 0),
                );
            }
            continue;
        }
        let tenants: Vec<String> = r
            .tenants
            .iter()
            .map(|t| {
                let target = match (&t.after_change, t.targets.last().copied().flatten()) {
                    (Some(_), Some(to)) => format!("{:.0}⇒{to:.0}", t.target.unwrap_or(0.0)),
                    _ => t.target.map_or("free".into(), |x| format!("{x:.0}")),
                };
                let achieved = t.after_change.as_ref().unwrap_or(&t.figures).achieved;
                format!(
                    "{} {target}→{achieved:.1}{} {:.0}/s",
                    t.label,
                    if t.failed { " FAILED" } else { "" },
                    t.launches_per_s
                )
            })
            .collect();
        let ratio = r.ratio.as_ref().map_or(String::new(), |x| {
            format!(
                " ratio {:.3}/{:.3} ({:+.1} %)",
                x.achieved,
                x.asked,
                (x.achieved / x.asked - 1.0) * 100.0
            )
        });
        let _ = writeln!(
            s,
            "{:<14} {:<6} {:>4} {:>7} {:>9} {:>7} {:>8} {:>4}  {}{}",
            r.name,
            r.engine,
            r.sms,
            opt(r.target, 0),
            opt(r.achieved, 1),
            opt(r.mae_points, 2),
            r.settled_s.map_or("never".into(), |x| format!("{x:.0} s")),
            match (r.informational, r.target_met) {
                (true, _) => "info",
                (false, true) => "yes",
                (false, false) => "no",
            },
            tenants.join(", "),
            ratio
        );
        if let Some(b) = r.busy_mean {
            let per: Vec<String> = r
                .busy_per_second
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect();
            let _ = writeln!(
                s,
                "{:<14}   GPU busy {b:.1} % (per second: {}); per tenant per second: {}",
                "",
                per.join(" "),
                r.tenants
                    .iter()
                    .map(|t| format!(
                        "{} [{}]",
                        t.label,
                        t.per_second
                            .iter()
                            .map(|x| format!("{x:.0}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for c in &r.checks {
            let _ = writeln!(
                s,
                "{:<14}   {} {}: s{}-{} in [{:.0}, {:.0}], seen {:.1}-{:.1}",
                "",
                if c.met { "ok  " } else { "MISS" },
                c.what,
                c.seconds.0,
                c.seconds.1.saturating_sub(1),
                c.min,
                c.max,
                c.seen.0,
                c.seen.1
            );
        }
        for n in &r.notes {
            let _ = writeln!(s, "{:<14}   note: {n}", "");
        }
    }
    for engine in ["sim", "gpu", "model"] {
        let rows: Vec<&RowResult> = rep
            .rows
            .iter()
            .filter(|r| r.engine == engine && r.overhead.is_none() && !r.informational)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let met = rows.iter().filter(|r| r.target_met).count();
        let failed: usize = rep
            .rows
            .iter()
            .filter(|r| r.engine == engine)
            .map(|r| r.failures)
            .sum();
        let _ = writeln!(
            s,
            "{engine}: targets met in {met}/{} rows; {failed} tenant(s) failed{}",
            rows.len(),
            match rep
                .rows
                .iter()
                .filter(|r| r.engine == engine && r.informational)
                .count()
            {
                0 => String::new(),
                n => format!(" ({n} fixed-cap comparison rows shown, not judged)"),
            }
        );
    }
    s
}

/// The JSON document.
pub fn json(rep: &SmReport) -> String {
    serde_json::to_string_pretty(rep).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
