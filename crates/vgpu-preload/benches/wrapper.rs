//! Wrapper overhead: the same tenant process, once straight on the
//! simulated driver and once under libvgpu.so (a region with a memory limit,
//! no SM limit), alternating runs in one invocation. Reports medians of
//! per-run medians; prints, never asserts time. `VGPU_BENCH_RUNS` (default
//! 15) sets the runs per column: on a VM one process's figure can sit 150 ns
//! from the next one's, so the median needs many processes. `VGPU_BENCH_BASELINE_LIB`
//! names another build of the library (e.g. the previous one) to run as a
//! third column in the same rotation, for before/after.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use vgpu_sim::{SimHandle, SimOptions};

/// Runs per column unless `VGPU_BENCH_RUNS` says otherwise.
const RUNS: usize = 15;
const OPS: [(&str, &str); 4] = [
    ("alloc_free_ns", "cuMemAlloc_v2 + cuMemFree_v2 (1 MiB)"),
    (
        "launch_ns",
        "cuLaunchKernel (no SM limit; batches of 128, queue drained between)",
    ),
    (
        "launch_null_ns",
        "cuLaunchKernel (no SM limit; null function, refused by the driver at once)",
    ),
    ("mem_get_info_ns", "cuMemGetInfo_v2"),
];

fn run(tenant: &Path, env: &[(String, String)], iters: &str) -> BTreeMap<String, f64> {
    let out = Command::new(tenant)
        .args(["bench", "--iters", iters])
        .envs(env.iter().cloned())
        .output()
        .expect("run tenant");
    assert!(
        out.status.success(),
        "tenant: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("bench.")?
                .split_once('=')
                .and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let write = std::env::args().any(|a| a == "--write");
    let iters = std::env::var("VGPU_BENCH_ITERS").unwrap_or_else(|_| "60000".into());
    let runs: usize = match std::env::var("VGPU_BENCH_RUNS") {
        Ok(v) => match v.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("VGPU_BENCH_RUNS={v:?}: expected a positive count");
                std::process::exit(2);
            }
        },
        Err(_) => RUNS,
    };
    let tenant = Path::new(env!("CARGO_BIN_EXE_vgpu-demo-tenant"));
    let lib = vgpu_sim::locate_artifact("libvgpu.so").expect("libvgpu.so built");
    let sim = SimHandle::start(SimOptions::default()).expect("start sim");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("region.cache");
    let direct = sim.env();
    let mut interposed = sim.env();
    interposed.extend([
        ("LD_PRELOAD".to_string(), lib.display().to_string()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
            cache.display().to_string(),
        ),
        ("CUDA_DEVICE_MEMORY_LIMIT".to_string(), "64g".to_string()),
    ]);
    let baseline_lib = std::env::var("VGPU_BENCH_BASELINE_LIB")
        .ok()
        .filter(|v| !v.is_empty());
    let baseline_cache = dir.path().join("baseline.cache");
    let baseline: Option<Vec<(String, String)>> = baseline_lib.as_ref().map(|l| {
        interposed
            .iter()
            .map(|(k, v)| match k.as_str() {
                "LD_PRELOAD" => (k.clone(), l.clone()),
                "CUDA_DEVICE_MEMORY_SHARED_CACHE" => {
                    (k.clone(), baseline_cache.display().to_string())
                }
                _ => (k.clone(), v.clone()),
            })
            .collect()
    });
    let mut d: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut i: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut bl: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // Within each interposed run: its median minus its own direct median
    // (the driver's entry points past the interposer, same process).
    let mut ip: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut blp: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let within = |r: &BTreeMap<String, f64>, k: &str| -> f64 {
        let own = r.get(&format!("direct.{k}")).unwrap_or_else(|| {
            panic!("an interposed run reported no direct.{k}: libvgpu.so was not in its path")
        });
        r[k] - own
    };
    for r in 0..runs {
        // Each round runs every column once, in an order that rotates, so
        // no column always runs first (or right after another).
        let arms = if baseline.is_some() { 3 } else { 2 };
        let (mut a, mut b, mut c) = (None, None, None);
        for j in 0..arms {
            match (r + j) % arms {
                0 => a = Some(run(tenant, &direct, &iters)),
                1 => b = Some(run(tenant, &interposed, &iters)),
                _ => c = baseline.as_ref().map(|e| run(tenant, e, &iters)),
            }
        }
        let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
        for (k, _) in OPS {
            d.entry(k).or_default().push(a[k]);
            i.entry(k).or_default().push(b[k]);
            ip.entry(k).or_default().push(within(&b, k));
            if let Some(c) = &c {
                bl.entry(k).or_default().push(c[k]);
                blp.entry(k).or_default().push(within(c, k));
            }
        }
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut md = String::new();
    md.push_str("# Wrapper overhead: libvgpu.so vs direct, on the simulated driver\n\n");
    md.push_str("Command: `cargo bench -p vgpu-preload --bench wrapper -- --write`");
    if let Ok(l) = std::env::var("VGPU_BENCH_BASELINE_LIB") {
        md.push_str(&format!(" with `VGPU_BENCH_BASELINE_LIB={l}`"));
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1: f64 = load
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    md.push_str(&format!(
        "\nLoad average at the end: {}{}\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        if load1 > 1.0 {
            " (a loaded machine: figures provisional)"
        } else {
            ""
        }
    ));
    md.push_str(&format!("Date: {date}; nproc: {nproc}; CPU: {cpu}\n"));
    md.push_str(&format!(
        "Method: the `vgpu-demo-tenant bench` process (dlopen + dlsym, like an application) runs {runs} times directly and {runs} times under \
         LD_PRELOAD=libvgpu.so with a 64 GiB limit (every allocation is admitted against the region and released), alternating; each run \
         reports the median of 15 batches of {iters}/15 calls; the table shows the median of the runs. The simulated driver's own cost is in \
         both columns; the difference is the wrapper's. Each round runs every column once (order rotating); `paired` is the median over \
         rounds of a round's interposed minus its direct run, which cancels what moves this VM's speed between rounds (one process's \
         figure can sit 150 ns from the next one's); `added` is the difference of the columns' medians; `added, in process` is the median over \
         runs of an interposed run's median minus its own median through the driver's own entry points (found in `libcuda.so.1`'s dynamic \
         symbol table, past the interposer), timed in batches alternating with the interposed ones in the same process, which the spread \
         between processes does not reach. Built with the release profile (`cargo bench`) on both sides; the simulated driver libraries must be built with \
         `cargo build --release -p vgpu-sim-cuda -p vgpu-sim-nvml` first. Launches are timed in batches of 128 with the queue drained \
         between batches (untimed), since the simulated driver blocks a full pushbuffer like a real one. `cargo bench` also enables the test-only \
         `failpoints` feature (dev-dependency unification); with no `LIBVGPU_FAILPOINT_PANIC` set it costs one relaxed load per call.\n\n"
    ));
    if let Some(l) = &baseline_lib {
        md.push_str(&format!(
            "Baseline: `VGPU_BENCH_BASELINE_LIB={l}` ran as a third process in the same rotation (same limit, its own region).\n\n"
        ));
        md.push_str("| call | direct (ns) | baseline interposed (ns) | baseline added (ns) | baseline added, paired (ns) | baseline added, in process (ns) | interposed (ns) | added (ns) | added, paired (ns) | added, in process (ns) | ratio | vs baseline |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    } else {
        md.push_str("| call | direct (ns) | interposed (ns) | added (ns) | added, paired (ns) | added, in process (ns) | ratio |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    }
    // Median over rounds of (column − direct) in the same round.
    let paired = |col: &[f64], k: &str| median(col.iter().zip(&d[k]).map(|(x, y)| x - y).collect());
    for (k, name) in OPS {
        let a = median(d[k].clone());
        let b = median(i[k].clone());
        let bp = paired(&i[k], k);
        let bi = median(ip[k].clone());
        match bl.get(k) {
            Some(cv) => {
                let c = median(cv.clone());
                let cp = paired(cv, k);
                let ci = median(blp[k].clone());
                md.push_str(&format!(
                    "| {name} | {a:.1} | {c:.1} | {:+.1} | {cp:+.1} | {ci:+.1} | {b:.1} | {:+.1} | {bp:+.1} | {bi:+.1} | {:.2}x | {:.2}x |\n",
                    c - a,
                    b - a,
                    b / a,
                    b / c
                ));
            }
            None => md.push_str(&format!(
                "| {name} | {a:.1} | {b:.1} | {:+.1} | {bp:+.1} | {bi:+.1} | {:.2}x |\n",
                b - a,
                b / a
            )),
        }
    }
    md.push_str("\nRaw per-run medians (ns), in round order:\n\n");
    for (k, name) in OPS {
        let f = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        md.push_str(&format!(
            "- {name}: direct {}; interposed {} (in process {})",
            f(&d[k]),
            f(&i[k]),
            f(&ip[k])
        ));
        if let Some(c) = bl.get(k) {
            md.push_str(&format!("; baseline {} (in process {})", f(c), f(&blp[k])));
        }
        md.push('\n');
    }
    md.push_str("\nTargets (docs/design.md section 9): alloc+free < 150 ns added; unlimited launch < 20 ns added.\n");
    print!("{md}");
    if write {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/wrapper-overhead.md");
        std::fs::write(&p, &md).expect("write bench/results/wrapper-overhead.md");
        eprintln!("wrote {}", p.display());
    }
}
