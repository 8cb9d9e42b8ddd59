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
}

fn t(label: &str, limit: Option<u32>, mode: Mode, kernel_ns: u64) -> TenantRow {
    TenantRow {
        label: label.into(),
        limit,
        mode,
        kernel_ns,
        change: None,
    }
}

fn row(name: &str, what: &str, sms: u32, tenants: Vec<TenantRow>) -> Row {
    Row {
        name: name.into(),
        what: what.into(),
        sms,
        tenants,
        kind: RowKind::Accuracy,
    }
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
    });
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
