//! The rows on the law's deterministic model (`vgpu_limiter::model`): the
//! control law alone, under simulated time, with no processes and no
//! interposer. Labelled `model` in every report, so it is never mistaken
//! for the interposer's figures.

use vgpu_limiter::model::{self, ContainerSpec, KernelSpec, Scenario, TenantSpec, Workload};
use vgpu_limiter::Settings;

use super::metrics::figures;
use super::report::{RowResult, TenantResult};
use super::rows::{Row, RowKind};
use super::tenant::Mode;

/// Runs one row on the model (`None` for the overhead row: the model has
/// no launch calls to time).
pub fn run_row(row: &Row, seconds: usize) -> Option<RowResult> {
    // Lending rows need a board shared by processes: the model has none
    // (the law's lending is tested in `vgpu_limiter::lend`); their
    // fixed-cap twins are comparisons, not targets.
    if row.kind == RowKind::Overhead || row.board || row.informational {
        return None;
    }
    let dur = seconds as u64 * 1_000_000_000;
    let mut containers = Vec::new();
    let mut tenants = Vec::new();
    let mut change_s = None;
    for (c, t) in row.tenants.iter().enumerate() {
        let settings = Settings {
            sm_limit: t.limit,
            ..Settings::default()
        };
        let mut spec = ContainerSpec {
            settings: vec![(0, settings)],
            identity: true,
        };
        if let Some((frac, to)) = t.change {
            let sec = super::rows::change_second(frac, seconds);
            spec.settings.push((
                sec as u64 * 1_000_000_000,
                Settings {
                    sm_limit: to,
                    ..settings
                },
            ));
            change_s = Some(sec);
        }
        containers.push(spec);
        let kernel = if t.mode == Mode::Coop {
            // One block per SM, one wave (as the tenant launches it).
            KernelSpec {
                blocks: row.sms as u64,
                block_ns: t.kernel_ns,
            }
        } else {
            KernelSpec::lasting(t.kernel_ns, row.sms)
        };
        let mut ts = TenantSpec::flat_out(c, kernel);
        ts.workload = match t.mode {
            Mode::Sync => Workload::Sync { host_ns: 5_000 },
            Mode::Graph => Workload::Graph { nodes: 8 },
            _ => Workload::Async,
        };
        tenants.push(ts);
    }
    let mut sc = Scenario::new(row.sms, containers, tenants);
    sc.duration_ns = dur;
    let o = model::run(&sc);
    let mut res = RowResult {
        name: row.name.clone(),
        what: row.what.clone(),
        engine: "model".into(),
        sms: row.sms,
        seconds,
        ..RowResult::default()
    };
    for (c, t) in row.tenants.iter().enumerate() {
        let share: Vec<f64> = o
            .windows(c, 0, dur, 1_000_000_000)
            .into_iter()
            .map(|x| x * 100.0)
            .collect();
        let targets = super::rows::targets(t, seconds);
        let f = figures(&share, &targets, change_s);
        let after = change_s.map(|c| super::metrics::after_change(&share, &targets, c));
        res.tenants.push(TenantResult {
            label: t.label.clone(),
            target: t.limit.map(f64::from),
            targets,
            mode: t.mode.as_str().into(),
            kernel_ns: t.kernel_ns,
            pid: 0,
            per_second: share,
            figures: f,
            after_change: after,
            target_met: None,
            launches: o.launches[c],
            launches_per_s: o.launches[c] as f64 / seconds.max(1) as f64,
            failed: false,
            error: None,
        });
    }
    if change_s.is_some() {
        res.notes.push(
            "limit changed at the row's change second (applied half a control period late)".into(),
        );
    }
    res.summarize(change_s);
    Some(res)
}
