//! The SM bench's instrument on the simulated driver, without any
//! interposer (so nothing here depends on the limiter): a flat-out tenant
//! shows the whole device, two show half each, and a tenant that fails is
//! counted and fails its row. And the overhead row, which needs the built
//! `libvgpu.so` (a missing one FAILS the test): its interposed tenants time
//! the driver's own entry point too, past the interposer.
use std::time::Duration;

use vgpu_bench::sm::harness::{run_row, scratch_dir, Setup};
use vgpu_bench::sm::rows::select;
use vgpu_bench::sm::Engine;

fn setup(dir: &std::path::Path, exe: std::path::PathBuf) -> Setup {
    Setup {
        engine: Engine::Sim,
        tenant_exe: exe,
        preload: None,
        vgpu_lib: None,
        seconds: 2,
        dir: dir.to_path_buf(),
        start_delay: Duration::from_millis(700),
        overhead_runs: 3,
    }
}

#[test]
fn the_truth_is_the_devices_and_failures_are_counted() {
    let dir = scratch_dir().unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_vgpu-bench-sm-tenant"));
    let s = setup(dir.path(), exe);

    let solo = &select(&["solo-30".into()]).unwrap()[0];
    let r = run_row(&s, solo);
    assert_eq!(r.failures, 0, "{:?}", r.notes);
    let t = &r.tenants[0];
    // Unpaced (no interposer): the whole device in every second.
    assert!(t.per_second.iter().all(|x| *x > 90.0), "{:?}", t.per_second);
    assert!(t.launches > 1000, "{} launches", t.launches);
    assert!(
        !r.target_met,
        "an unpaced 30 % tenant cannot meet its target"
    );
    assert!(t.figures.mae_points.unwrap() > 60.0);

    let pair = &select(&["pair-30-70".into()]).unwrap()[0];
    let r = run_row(&s, pair);
    assert_eq!(r.failures, 0, "{:?}", r.notes);
    for t in &r.tenants {
        // The device's time-slicing splits two flat-out tenants evenly.
        assert!(
            (t.figures.achieved - 50.0).abs() < 10.0,
            "{} at {}",
            t.label,
            t.figures.achieved
        );
    }
    assert!(r.ratio.is_some());

    // A tenant that cannot run: counted, reported, row not met.
    let bad = setup(dir.path(), "/bin/false".into());
    let r = run_row(&bad, solo);
    assert_eq!(r.failures, 1);
    assert!(r.tenants[0].failed);
    assert!(
        r.tenants[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("exited"),
        "{:?}",
        r.tenants[0].error
    );
    assert!(!r.target_met);
}

#[test]
fn the_model_rows_meet_their_targets() {
    let rows = select(&[]).unwrap();
    let mut ran = 0;
    for row in &rows {
        let Some(r) = vgpu_bench::sm::model::run_row(row, 4) else {
            // Only the overhead row and the lending rows (a board shared
            // by processes) have nothing to run on the model.
            assert!(
                row.kind == vgpu_bench::sm::rows::RowKind::Overhead
                    || row.board
                    || row.informational,
                "{}",
                row.name
            );
            continue;
        };
        ran += 1;
        assert!(
            r.target_met,
            "{}: {:?}",
            r.name,
            r.tenants
                .iter()
                .map(|t| (&t.label, &t.per_second))
                .collect::<Vec<_>>()
        );
    }
    // Every row but those ran: the test cannot pass on none.
    let skipped = rows.iter().filter(|r| r.board || r.informational).count() + 1;
    assert!(
        ran >= 2 && ran + skipped >= rows.len(),
        "{ran} of {} rows ran",
        rows.len()
    );
}

#[test]
fn the_overhead_row_times_the_drivers_own_launch_beside_the_interposers() {
    let dir = scratch_dir().unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_vgpu-bench-sm-tenant"));
    let lib = vgpu_sim::locate_artifact("libvgpu.so")
        .unwrap_or_else(|e| panic!("libvgpu.so is required by this test and was not found: {e}"));
    let mut s = setup(dir.path(), exe);
    s.vgpu_lib = Some(lib);
    s.overhead_runs = 1;
    let row = &select(&["overhead".into()]).unwrap()[0];
    let r = run_row(&s, row);
    // A tenant whose launches did not go through libvgpu.so (its own and
    // the default `cuLaunchKernel` the same) fails the row.
    assert_eq!(r.failures, 0, "{:?}", r.notes);
    let o = r.overhead.expect("the overhead figures");
    let names: Vec<&str> = o.runs.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(names, ["bare", "unlimited", "limited"]);
    // Only the interposed runs are paired, each with both medians timed.
    let paired: Vec<&str> = o.paired.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(paired, ["unlimited", "limited"]);
    for (name, via, direct) in &o.paired {
        assert!(
            *via > 0.0 && *direct > 0.0 && *via < 1e6 && *direct < 1e6,
            "{name}: {via} / {direct} ns"
        );
    }
    assert!(o.paired_unlimited_ns.is_some() && o.paired_limited_ns.is_some());
}
