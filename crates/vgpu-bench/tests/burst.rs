//! The burst harness on the simulated driver, with real processes.
//!
//! These tests need the workspace's cdylibs (`cargo build --workspace`):
//! the simulated `libcuda.so.1`, and for the vgpu / legacy tests
//! `libvgpu.so` / `libvgpu_legacy_probe.so`. A missing artifact FAILS the
//! test with the path it looked for; it never skips.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use vgpu_bench::harness::{self, Mode, RunConfig, RunResult};
use vgpu_bench::report::{self, Header, Run, SweepReport};
use vgpu_bench::stats;
use vgpu_bench::worker::{Resolve, Then};
use vgpu_sim::{SimHandle, SimOptions};

fn worker_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vgpu-bench-worker"))
}

fn artifact(name: &str) -> PathBuf {
    match vgpu_sim::locate_artifact(name) {
        Ok(p) => p,
        Err(e) => panic!("{name} is required by this test and was not found: {e}"),
    }
}

fn sim(profile: &str) -> SimHandle {
    let opts = SimOptions::profile(profile).expect("profile");
    SimHandle::start(opts).unwrap_or_else(|e| {
        let msg = vgpu_errors::chain(&e);
        panic!("the simulated driver must start (build the workspace first: cargo build --workspace): {msg}")
    })
}

fn cfg(mode: Mode, workers: usize, sim: &SimHandle) -> RunConfig {
    RunConfig {
        mode,
        workers,
        then: Then::None,
        resolve: Resolve::Default,
        worker_exe: worker_exe(),
        env: sim.env(),
        crash: Vec::new(),
        timeout: Duration::from_secs(120),
    }
}

fn report_of(res: RunResult) -> SweepReport {
    SweepReport::new(
        Header::default(),
        vec![Run {
            repeat: 0,
            result: res,
        }],
    )
}

#[test]
fn every_worker_is_accounted_for_and_a_crash_is_counted_but_not_timed() {
    let sim = sim("zero");
    let mut c = cfg(Mode::Native, 16, &sim);
    c.crash = vec![5];
    c.then = Then::Alloc;
    let res = harness::run(&c).expect("run");
    let s = &res.summary;
    assert_eq!(res.workers.len(), 16, "one record per worker");
    assert_eq!(
        (s.ok, s.failed),
        (15, 1),
        "failures: {:?}; log: {:?}",
        s.failures,
        res.worker_log
    );
    assert_eq!(
        s.failures.get("signal SIGABRT"),
        Some(&1),
        "{:?}",
        s.failures
    );
    let crashed = &res.workers[5];
    assert!(!crashed.ok);
    assert_eq!(crashed.signal, Some(libc::SIGABRT));
    assert_eq!(crashed.latency_ms, None, "a crashed worker has no latency");
    assert_eq!(
        crashed.state, "released",
        "it died after the release, before cuInit"
    );
    // Every worker has its own live pid and a distinct one.
    let pids: BTreeSet<u32> = res.workers.iter().filter_map(|w| w.pid).collect();
    assert_eq!(pids.len(), 16);
    for w in res.workers.iter().filter(|w| w.ok) {
        assert_eq!(w.init_result, Some(0));
        assert_eq!(w.then_result, Some(0));
        assert!(w.t_ready_ns <= w.t_released_ns && w.t_released_ns <= w.t_entry_ns);
        assert!(w.t_entry_ns <= w.t_init_return_ns && w.t_init_return_ns <= w.t_return_ns);
        assert!(w.cpu_ms.is_some());
        let (before, call, after) = (
            w.cpu_before_ms.unwrap(),
            w.call_cpu_ms.unwrap(),
            w.cpu_after_ms.unwrap(),
        );
        assert!(before > 0.0 && call >= 0.0 && after >= 0.0);
        // The three parts never exceed the wait4 total (1 ms rusage rounding).
        assert!(
            before + call <= w.cpu_ms.unwrap() + 1.0,
            "{before} + {call} vs {:?}",
            w.cpu_ms
        );
    }
    // The summary's percentiles are nearest-rank over the 15 ok workers only.
    let mut lat: Vec<f64> = res
        .workers
        .iter()
        .filter(|w| w.ok)
        .map(|w| w.latency_ms.unwrap())
        .collect();
    lat.sort_by(f64::total_cmp);
    assert_eq!(lat.len(), 15);
    // Hand-computed ranks for n = 15: p50 -> ceil(7.5) = 8, p95 -> ceil(14.25) = 15,
    // p99 -> 15, max -> 15.
    assert_eq!(s.p50_ms, Some(lat[7]));
    assert_eq!(s.p95_ms, Some(lat[14]));
    assert_eq!(s.p99_ms, Some(lat[14]));
    assert_eq!(s.max_ms, Some(lat[14]));
    assert_eq!(s.min_ms, Some(lat[0]));
    assert_eq!(stats::nearest_rank(&lat, 50.0), Some(lat[7]));
    // The ranked compositions name real ok workers.
    let ranks: Vec<&str> = res.compositions.iter().map(|c| c.rank).collect();
    assert_eq!(ranks, ["p50", "p95", "p99", "max"]);
    assert!(res.compositions.iter().all(|c| c.index != 5));
    // And the text report says all of it.
    let text = report::text(&report_of(res));
    assert!(text.contains("signal SIGABRT: 1"), "{text}");
    assert!(text.contains("nearest-rank"), "{text}");
}

#[test]
fn json_schema_is_stable() {
    let sim = sim("zero");
    let res = harness::run(&cfg(Mode::Native, 2, &sim)).expect("run");
    let rep = report_of(res);
    let v: serde_json::Value = serde_json::from_str(&report::json(&rep)).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v.as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let set = |s: &[&str]| -> Vec<String> {
        s.iter()
            .map(|x| x.to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    assert_eq!(
        keys(&v),
        set(&[
            "schema",
            "header",
            "percentile_definition",
            "phase_names",
            "runs",
            "fits"
        ])
    );
    assert_eq!(v["schema"], "vgpu-bench-init/1");
    assert_eq!(
        keys(&v["header"]),
        set(&[
            "command",
            "revision",
            "driver",
            "sim_profile",
            "cpus",
            "cpu_model",
            "kernel",
            "started_unix",
            "seed",
            "order"
        ])
    );
    let run = &v["runs"][0];
    assert_eq!(
        keys(run),
        set(&[
            "repeat",
            "summary",
            "compositions",
            "region",
            "worker_log",
            "workers"
        ])
    );
    assert_eq!(
        keys(&run["summary"]),
        set(&[
            "mode",
            "workers",
            "ok",
            "failed",
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "min_ms",
            "mean_ms",
            "wall_ms",
            "release_spread_ms",
            "cpu_ms_total",
            "call_cpu_ms_total",
            "failures",
            "then",
            "resolve",
        ])
    );
    assert_eq!(
        keys(&run["workers"][0]),
        set(&[
            "index",
            "pid",
            "ok",
            "reason",
            "exit_code",
            "signal",
            "init_result",
            "then_result",
            "state",
            "resolve_ms",
            "release_offset_ms",
            "latency_ms",
            "init_ms",
            "return_offset_ms",
            "cpu_ms",
            "cpu_before_ms",
            "call_cpu_ms",
            "cpu_after_ms",
            "t_ready_ns",
            "t_released_ns",
            "t_entry_ns",
            "t_init_return_ns",
            "t_return_ns",
            "phases_ns",
            "phases_monotonic",
            "identity_tier",
            "fallbacks",
            "post_init_waits",
        ])
    );
    assert_eq!(run["summary"]["mode"], "native");
    assert_eq!(run["summary"]["workers"], 2);
    assert_eq!(run["summary"]["ok"], 2, "{run}");
    // The raw CSV has a header plus one line per worker.
    let csv = report::raw_csv(&rep);
    assert_eq!(csv.lines().count(), 3);
    let cols = |l: &str| l.split(',').count();
    let head = csv.lines().next().unwrap();
    assert!(
        csv.lines().all(|l| cols(l) == cols(head)),
        "ragged CSV:\n{csv}"
    );
}

#[test]
fn vgpu_phase_vectors_are_monotonic_and_in_the_report() {
    let lib = artifact("libvgpu.so");
    let sim = sim("zero");
    let res = harness::run(&cfg(Mode::Vgpu { lib }, 16, &sim)).expect("run");
    assert_eq!(
        (res.summary.ok, res.summary.failed),
        (16, 0),
        "{:?} {:?}",
        res.summary.failures,
        res.worker_log
    );
    let region = res.region.clone().expect("vgpu mode reads the region");
    assert_eq!(region.error, None);
    assert_eq!(
        region.workers_matched, 16,
        "every worker's slot found by pid"
    );
    let w0 = &res.workers[0];
    assert_eq!(
        (region.phases_monotonic, region.phases_not_monotonic),
        (16, 0),
        "worker 0: ready {} released {} entry {} init_return {} return {}; phases {:?}",
        w0.t_ready_ns,
        w0.t_released_ns,
        w0.t_entry_ns,
        w0.t_init_return_ns,
        w0.t_return_ns,
        w0.phases_ns
    );
    for w in &res.workers {
        let p = w.phases_ns.expect("phase vector");
        // wrapper enter, region mapped, slot claimed, real init enter/exit,
        // post-init exit, wrapper exit are on every cuInit path.
        for i in [1, 2, 3, 4, 5, 8, 9] {
            assert_ne!(
                p[i],
                0,
                "worker {} phase {} missing: {p:?}",
                w.index,
                vgpu_bench::phases::PHASE_NAMES[i]
            );
        }
        assert_eq!(w.phases_monotonic, Some(true));
    }
    let text = report::text(&report_of(res));
    for seg in ["driver cuInit", "map region", "claim slot", "post-init"] {
        assert!(text.contains(seg), "report lacks {seg:?}:\n{text}");
    }
    assert!(text.contains("phase vectors monotonic 16/16"), "{text}");
    assert!(text.contains("identity state: "), "{text}");
    assert!(
        !text.contains("identity state: -"),
        "identity states counted:\n{text}"
    );
}

#[test]
fn eager_identity_runs_inside_cuinit_and_is_counted_by_tier() {
    // What `vgpu bench init --identity probe|procfs` sets: identity inside
    // cuInit with one forced tier. Lazy runs (the test above) have no
    // post-init waits; these have one per worker, with each slot resolved.
    let lib = artifact("libvgpu.so");
    let sim = sim("zero");
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("hostpid.lock").display().to_string();
    let mut tiers = vec![(
        "probe",
        ("LIBVGPU_HOSTPID_LOCK", lock.as_str()),
        "NvmlProbe",
    )];
    // /proc is the host's procfs only in the initial PID namespace.
    let initial_ns = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).ok() == Some(0xEFFF_FFFC)
    };
    if initial_ns {
        tiers.push(("procfs", ("LIBVGPU_HOST_PROCFS", "/proc"), "HostProcfs"));
    }
    for (tier, extra, want) in tiers {
        let mut c = cfg(Mode::Vgpu { lib: lib.clone() }, 8, &sim);
        c.env.push(("LIBVGPU_IDENTITY".into(), "eager".into()));
        c.env.push(("LIBVGPU_IDENTITY_TIERS".into(), tier.into()));
        c.env.push((extra.0.into(), extra.1.into()));
        let res = harness::run(&c).expect("run");
        assert_eq!((res.summary.ok, res.summary.failed), (8, 0), "{tier}");
        let region = res.region.clone().expect("vgpu mode reads the region");
        assert_eq!(region.post_init_waits, 8, "{tier}: {region:?}");
        assert_eq!(
            region.by_identity_tier.get(want),
            Some(&8),
            "{tier}: {region:?}"
        );
        assert_eq!(
            region.by_identity_state.get("Resolved"),
            Some(&8),
            "{tier}: {region:?}"
        );
        assert_eq!(region.phases_monotonic, 8, "{tier}: {region:?}");
        for w in &res.workers {
            let p = w.phases_ns.expect("phase vector");
            // identity enter/exit between the real cuInit and post-init exit.
            assert!(
                p[5] <= p[6] && p[6] <= p[7] && p[7] <= p[8],
                "{tier}: {p:?}"
            );
        }
    }
}

#[test]
fn legacy_probe_serializes_its_probe_and_finds_each_host_pid() {
    let lib = artifact("libvgpu_legacy_probe.so");
    let sim = sim("zero");
    let trace = tempfile::NamedTempFile::new().unwrap();
    let mut c = cfg(
        Mode::Preload {
            label: "legacy-probe".into(),
            lib,
        },
        8,
        &sim,
    );
    c.env.push((
        "VGPU_LEGACY_PROBE_TRACE".into(),
        trace.path().display().to_string(),
    ));
    let res = harness::run(&c).expect("run");
    assert_eq!(
        (res.summary.ok, res.summary.failed),
        (8, 0),
        "{:?} {:?}",
        res.summary.failures,
        res.worker_log
    );
    let text = std::fs::read_to_string(trace.path()).unwrap();
    let mut spans: Vec<(u32, u64, u64, u32)> = text
        .lines()
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (f[0] as u32, f[1], f[2], f[3] as u32)
        })
        .collect();
    assert_eq!(spans.len(), 8, "one probe per worker:\n{text}");
    spans.sort_by_key(|s| s.1);
    for w in spans.windows(2) {
        assert!(w[0].2 <= w[1].1, "probes overlap (lock not held): {w:?}");
    }
    let worker_pids: BTreeSet<u32> = res.workers.iter().filter_map(|w| w.pid).collect();
    for (pid, _, _, found) in &spans {
        assert!(worker_pids.contains(pid));
        assert_eq!(found, pid, "the NVML diff names the probing process itself");
    }
}

/// Compile a one-function `LD_PRELOAD` library with gcc.
fn c_preload(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let lib = dir.join(format!("lib{name}.so"));
    std::fs::write(&src, body).unwrap();
    let st = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc failed for {name}");
    lib
}

#[test]
fn driver_errors_and_hangs_are_failures_by_reason() {
    let sim = sim("zero");
    let dir = tempfile::tempdir().unwrap();
    // cuInit answering CUDA_ERROR_NO_DEVICE (100) in every worker.
    let lib = c_preload(
        dir.path(),
        "nodev",
        "int cuInit(unsigned f) { (void)f; return 100; }\n",
    );
    let res = harness::run(&cfg(
        Mode::Preload {
            label: "nodev".into(),
            lib,
        },
        4,
        &sim,
    ))
    .expect("run");
    assert_eq!((res.summary.ok, res.summary.failed), (0, 4));
    assert_eq!(
        res.summary.failures.get("cuInit CUDA_ERROR_NO_DEVICE"),
        Some(&4),
        "{:?}",
        res.summary.failures
    );
    assert_eq!(
        res.summary.p99_ms, None,
        "no successful worker, no percentile"
    );
    assert!(res
        .workers
        .iter()
        .all(|w| w.init_result == Some(100) && w.exit_code == Some(3)));
    // One worker (whichever wins the token file) hangs in cuInit: killed at
    // the deadline and reported; the others still count.
    let hang = c_preload(
        dir.path(),
        "hang",
        "#include <fcntl.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         int cuInit(unsigned f) { (void)f; const char *p = getenv(\"HANG_TOKEN\");\n\
         if (p && open(p, O_CREAT | O_EXCL | O_WRONLY, 0600) >= 0) for (;;) pause();\n\
         return 0; }\n",
    );
    let mut c = cfg(
        Mode::Preload {
            label: "hang".into(),
            lib: hang,
        },
        4,
        &sim,
    );
    c.env.push((
        "HANG_TOKEN".into(),
        dir.path().join("token").display().to_string(),
    ));
    c.timeout = Duration::from_secs(3);
    let res = harness::run(&c).expect("run");
    assert_eq!(
        (res.summary.ok, res.summary.failed),
        (3, 1),
        "{:?}",
        res.summary.failures
    );
    assert_eq!(res.summary.failures.get("timeout (killed)"), Some(&1));
    let hung: Vec<_> = res.workers.iter().filter(|w| !w.ok).collect();
    assert_eq!(hung[0].state, "entered");
    assert_eq!(hung[0].signal, Some(libc::SIGKILL));
    assert_eq!(res.summary.p99_ms.map(|_| ()), Some(()));
}
