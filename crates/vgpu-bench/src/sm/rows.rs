//! The rows of `vgpu bench sm` (issue 11's list): what each runs. Pure
//! data; the harness and the model runner read it.

use super::tenant::Mode;

/// A short kernel (≤ 50 µs).
pub const SHORT_NS: u64 = 40_000;
/// A long kernel (≥ 10 ms).
pub const LONG_NS: u64 = 12_000_000;
/// The synchronizing loop's kernel.
pub const SYNC_NS: u64 = 1_000_000;

/// One tenant of a row (its own container: own region, own limit).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TenantRow {
    /// Its name in the report.
    pub label: String,
    /// SM limit, percent (`None`: unlimited).
    pub limit: Option<u32>,
    /// How it launches.
    pub mode: Mode,
    /// Kernel (graph node) length, GPU-ns.
    pub kernel_ns: u64,
    /// A live change: at this fraction of the run (rounded down to a whole
    /// second), the limit becomes this.
    pub change: Option<(f64, Option<u32>)>,
    /// SM ceiling, percent (`sm-ceiling` in its limits file; lending rows).
    pub ceiling: Option<u32>,
    /// Idle (launches nothing) over this span, seconds from the start.
    pub idle: Option<(f64, f64)>,
    /// SIGKILLed this many seconds after the start.
    pub kill_at: Option<f64>,
}

/// Whose share a check reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Who {
    /// Tenant number k of the row.
    Tenant(usize),
    /// The device: every tenant's share summed (its busy time).
    Busy,
}

/// A band every whole second in `[from_s, to_s)` must be in.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Check {
    /// What it shows.
    pub what: String,
    /// Whose share.
    pub who: Who,
    /// First second.
    pub from_s: usize,
    /// Past the last second.
    pub to_s: usize,
    /// Least share, percent.
    pub min: f64,
    /// Most share, percent.
    pub max: f64,
}

fn check(what: &str, who: Who, secs: std::ops::Range<usize>, min: f64, max: f64) -> Check {
    Check {
        what: what.into(),
        who,
        from_s: secs.start,
        to_s: secs.end,
        min,
        max,
    }
}

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKind {
    /// Achieved share against target.
    Accuracy,
    /// Nanoseconds added per launch call.
    Overhead,
}

/// One row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    /// Name (`--rows` selects by it).
    pub name: String,
    /// What it shows, for the report.
    pub what: String,
    /// Simulated SM count (a real GPU has its own).
    pub sms: u32,
    /// Tenants.
    pub tenants: Vec<TenantRow>,
    /// Kind.
    pub kind: RowKind,
    /// Its tenants share a lending board (guarantees and ceilings).
    pub board: bool,
    /// Its own length, seconds (`None`: the run's).
    pub seconds: Option<usize>,
    /// Bands judged instead of each tenant's target (lending rows).
    pub checks: Vec<Check>,
    /// Shown beside its twin for comparison, not judged (the fixed-cap
    /// mode of a lending row).
    pub informational: bool,
}

fn t(label: &str, limit: Option<u32>, mode: Mode, kernel_ns: u64) -> TenantRow {
    TenantRow {
        label: label.into(),
        limit,
        mode,
        kernel_ns,
        change: None,
        ceiling: None,
        idle: None,
        kill_at: None,
    }
}

fn row(name: &str, what: &str, sms: u32, tenants: Vec<TenantRow>) -> Row {
    Row {
        name: name.into(),
        what: what.into(),
        sms,
        tenants,
        kind: RowKind::Accuracy,
        board: false,
        seconds: None,
        checks: Vec::new(),
        informational: false,
    }
}

fn lending(
    name: &str,
    what: &str,
    sms: u32,
    seconds: usize,
    tenants: Vec<TenantRow>,
    checks: Vec<Check>,
) -> Row {
    Row {
        board: true,
        seconds: Some(seconds),
        checks,
        ..row(name, what, sms, tenants)
    }
}

/// The same row in the fixed-cap mode (no ceiling, no board: each
/// guarantee is a cap and a tenant without one is unpaced, as before
/// lending), for the busy time the cap achieves on the same load. Its
/// check: no tenant above its cap (+5).
fn capped(r: &Row) -> Row {
    let tenants: Vec<TenantRow> = r
        .tenants
        .iter()
        .map(|t| TenantRow {
            ceiling: None,
            ..t.clone()
        })
        .collect();
    let n = r.seconds.unwrap_or(5);
    let checks = tenants
        .iter()
        .enumerate()
        .filter_map(|(k, t)| {
            t.limit.map(|l| {
                check(
                    &format!("{} at most its cap", t.label),
                    Who::Tenant(k),
                    1..n,
                    0.0,
                    l as f64 + 5.0,
                )
            })
        })
        .collect();
    Row {
        name: format!("{}-cap", r.name),
        what: format!("{} (fixed caps, no lending)", r.what),
        tenants,
        checks,
        informational: true,
        board: false,
        ..r.clone()
    }
}

fn with(mut t: TenantRow, ceiling: Option<u32>, idle: Option<(f64, f64)>) -> TenantRow {
    t.ceiling = ceiling;
    t.idle = idle;
    t
}

/// The lending rows (issue 23) on `sms` SMs, each followed by its
/// fixed-cap twin.
pub fn lending_rows(sms: u32) -> Vec<Row> {
    use Mode::Async;
    use Who::*;
    let a = |l: &str, g: Option<u32>| t(l, g, Async, SHORT_NS);
    let mut v = Vec::new();
    // 30/30, ceilings 100: both busy, then B idles for 2 s, then resumes.
    v.push(lending(
        &format!("lend-30-30-{sms}"),
        "guarantees 30/30, ceilings 100; b idle from 2 s to 4 s",
        sms,
        6,
        vec![
            with(a("a", Some(30)), Some(100), None),
            with(a("b", Some(30)), Some(100), Some((2.0, 4.0))),
        ],
        vec![
            check("both busy: a ≥ 30", Tenant(0), 1..2, 30.0, 100.0),
            check("both busy: b ≥ 30", Tenant(1), 1..2, 30.0, 100.0),
            check("b idle: a ≥ 90 within 1 s", Tenant(0), 3..4, 90.0, 100.0),
            check("b back: b ≥ 30 within 1 s", Tenant(1), 5..6, 30.0, 100.0),
            check("b back: a ≥ 30", Tenant(0), 5..6, 30.0, 100.0),
            // Busy time is judged in the seconds that follow a settled
            // second (not the first two, nor the second b stops or
            // resumes in); every second's figure is reported.
            check("b idle: busy ≥ 95", Busy, 3..4, 95.0, 101.0),
            check("b back: busy ≥ 95", Busy, 5..6, 95.0, 101.0),
        ],
    ));
    // 20/30/50, ceilings 100: all busy, then a idles.
    v.push(lending(
        &format!("lend-20-30-50-{sms}"),
        "guarantees 20/30/50, ceilings 100; a idle from 3 s",
        sms,
        6,
        vec![
            with(a("a", Some(20)), Some(100), Some((3.0, 6.0))),
            with(a("b", Some(30)), Some(100), None),
            with(a("c", Some(50)), Some(100), None),
        ],
        vec![
            check("all busy: a at 20 ± 5", Tenant(0), 1..3, 15.0, 25.0),
            check("all busy: b at 30 ± 5", Tenant(1), 1..3, 25.0, 35.0),
            check("all busy: c at 50 ± 5", Tenant(2), 1..3, 45.0, 55.0),
            check("a idle: b at 37.5 ± 5", Tenant(1), 4..6, 32.5, 42.5),
            check("a idle: c at 62.5 ± 5", Tenant(2), 4..6, 57.5, 67.5),
            check("all busy: busy ≥ 95", Busy, 2..3, 95.0, 101.0),
            check("a idle: busy ≥ 95", Busy, 4..6, 95.0, 101.0),
        ],
    ));
    // A guarantee of 30 with a ceiling of 60, alone.
    v.push(lending(
        &format!("ceiling-30-60-{sms}"),
        "guarantee 30, ceiling 60, alone",
        sms,
        4,
        vec![with(a("a", Some(30)), Some(60), None)],
        vec![check("alone: 60 ± 5", Tenant(0), 1..4, 55.0, 65.0)],
    ));
    // Best effort beside a guaranteed 70 (its ceiling: the guarantee).
    v.push(lending(
        &format!("besteffort-70-{sms}"),
        "a guaranteed 70 % (no ceiling) beside a best-effort tenant (no cores asked)",
        sms,
        4,
        vec![a("a", Some(70)), a("be", None)],
        vec![
            check("guaranteed: 70 ± 5", Tenant(0), 1..4, 65.0, 75.0),
            check(
                "best effort: the rest (30 ± 5)",
                Tenant(1),
                1..4,
                25.0,
                35.0,
            ),
            check("busy ≥ 95", Busy, 2..4, 95.0, 101.0),
        ],
    ));
    // The borrower dies: b borrows a's time while a idles, is SIGKILLed
    // at 3 s as a comes back.
    let mut b = with(a("b", Some(30)), Some(100), None);
    b.kill_at = Some(3.0);
    v.push(lending(
        &format!("kill-borrower-{sms}"),
        "guarantees 30/30, ceilings 100; a idle 1-3 s while b borrows; b SIGKILLed at 3 s",
        sms,
        5,
        vec![with(a("a", Some(30)), Some(100), Some((1.0, 3.0))), b],
        vec![
            check("b borrows: b ≥ 90", Tenant(1), 2..3, 90.0, 100.0),
            check("b dead: a ≥ 30 within 1 s", Tenant(0), 4..5, 30.0, 100.0),
            check("b dead: a alone ≥ 90", Tenant(0), 4..5, 90.0, 100.0),
        ],
    ));
    v.into_iter().flat_map(|r| [capped(&r), r]).collect()
}

/// Every row, in report order.
pub fn default_rows() -> Vec<Row> {
    use Mode::*;
    let mut v = Vec::new();
    for pct in [10, 30, 50, 70] {
        v.push(row(
            &format!("solo-{pct}"),
            &format!("one tenant at {pct} %, 40 µs kernels, flat out, 132 SMs"),
            132,
            vec![t("a", Some(pct), Async, SHORT_NS)],
        ));
    }
    for sms in [20, 108, 188] {
        v.push(row(
            &format!("sms-{sms}"),
            &format!("one tenant at 50 %, {sms} SMs (a fixed 1024-block grid)"),
            sms,
            vec![t("a", Some(50), Async, SHORT_NS)],
        ));
    }
    v.push(row(
        "long-30",
        "one tenant at 30 %, 12 ms kernels",
        132,
        vec![t("a", Some(30), Async, LONG_NS)],
    ));
    // 1 ms kernels: a synchronizing loop of 40 µs kernels is bound by the
    // round trip (about 30 % on the simulator unpaced), which would pass a
    // 30 % row without any limiter.
    v.push(row(
        "sync-30",
        "one tenant at 30 %, launch then synchronize, 1 ms kernels",
        132,
        vec![t("a", Some(30), Sync, SYNC_NS)],
    ));
    v.push(row(
        "graph-30",
        "one tenant at 30 %, cuGraphLaunch of 8 × 40 µs kernels",
        132,
        vec![t("a", Some(30), Graph, SHORT_NS)],
    ));
    v.push(row(
        "coop-30",
        "one tenant at 30 %, cuLaunchCooperativeKernel, 40 µs",
        132,
        vec![t("a", Some(30), Coop, SHORT_NS)],
    ));
    v.push(row(
        "pair-30-70",
        "two tenants, 30 % and 70 %",
        132,
        vec![
            t("a", Some(30), Async, SHORT_NS),
            t("b", Some(70), Async, SHORT_NS),
        ],
    ));
    v.push(row(
        "pair-10-90",
        "two tenants, 10 % and 90 %",
        132,
        vec![
            t("a", Some(10), Async, SHORT_NS),
            t("b", Some(90), Async, SHORT_NS),
        ],
    ));
    v.push(row(
        "trio-20-30-50",
        "three tenants, 20 %, 30 % and 50 %",
        132,
        vec![
            t("a", Some(20), Async, SHORT_NS),
            t("b", Some(30), Async, SHORT_NS),
            t("c", Some(50), Async, SHORT_NS),
        ],
    ));
    v.push(row(
        "beside-30",
        "30 % beside an unlimited tenant (its throughput)",
        132,
        vec![
            t("a", Some(30), Async, SHORT_NS),
            t("free", None, Async, SHORT_NS),
        ],
    ));
    {
        let sms = 188;
        v.push(row(
            &format!("pair-30-70-{sms}"),
            &format!("two tenants, 30 % and 70 %, {sms} SMs"),
            sms,
            vec![
                t("a", Some(30), Async, SHORT_NS),
                t("b", Some(70), Async, SHORT_NS),
            ],
        ));
        v.push(row(
            &format!("pair-10-90-{sms}"),
            &format!("two tenants, 10 % and 90 %, {sms} SMs"),
            sms,
            vec![
                t("a", Some(10), Async, SHORT_NS),
                t("b", Some(90), Async, SHORT_NS),
            ],
        ));
    }
    let mut live = t("a", Some(30), Async, SHORT_NS);
    live.change = Some((0.5, Some(70)));
    v.push(row(
        "live-30-70",
        "30 % changed to 70 % live at half time (figures after the change)",
        132,
        vec![live],
    ));
    v.push(Row {
        name: "overhead".into(),
        what: "ns per cuLaunchKernel call: bare driver, libvgpu.so unlimited, limited with budget"
            .into(),
        sms: 132,
        tenants: vec![t("launcher", None, Overhead, 0)],
        kind: RowKind::Overhead,
        board: false,
        seconds: None,
        checks: Vec::new(),
        informational: false,
    });
    for sms in [20, 188] {
        v.extend(lending_rows(sms));
    }
    v
}

/// The rows named in `names` (all when empty), or the unknown name.
pub fn select(names: &[String]) -> Result<Vec<Row>, String> {
    let all = default_rows();
    if names.is_empty() {
        return Ok(all);
    }
    names
        .iter()
        .map(|n| {
            all.iter().find(|r| &r.name == n).cloned().ok_or_else(|| {
                format!(
                    "unknown row {n:?} (rows: {})",
                    all.iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
        .collect()
}

/// The whole second at which a live change happens (`frac` of `seconds`).
pub fn change_second(frac: f64, seconds: usize) -> usize {
    ((frac * seconds as f64).floor() as usize).clamp(1, seconds.saturating_sub(1).max(1))
}

/// A tenant's limit in each second of a run.
pub fn targets(t: &TenantRow, seconds: usize) -> Vec<Option<f64>> {
    (0..seconds)
        .map(|i| match t.change {
            Some((frac, to)) if i >= change_second(frac, seconds) => to.map(f64::from),
            _ => t.limit.map(f64::from),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_issue_is_there() {
        let names: Vec<String> = default_rows().into_iter().map(|r| r.name).collect();
        for n in [
            "solo-10",
            "solo-30",
            "solo-50",
            "solo-70",
            "sms-20",
            "sms-108",
            "sms-188",
            "long-30",
            "sync-30",
            "graph-30",
            "coop-30",
            "pair-30-70",
            "pair-10-90",
            "trio-20-30-50",
            "beside-30",
            "live-30-70",
            "overhead",
            "pair-30-70-188",
            "pair-10-90-188",
            "lend-30-30-20",
            "lend-30-30-188",
            "lend-20-30-50-188",
            "ceiling-30-60-20",
            "besteffort-70-188",
            "kill-borrower-20",
            "lend-30-30-188-cap",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} missing");
        }
        // 132 SMs is covered by solo-50.
        assert!(default_rows()
            .iter()
            .any(|r| r.sms == 132 && r.name == "solo-50"));
        assert!(select(&["nope".into()])
            .unwrap_err()
            .contains("unknown row"));
        assert_eq!(select(&["pair-10-90".into()]).unwrap().len(), 1);
    }
}
