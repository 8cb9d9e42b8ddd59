//! Wrapper overhead: the same tenant process, once straight on the
//! simulated driver and once under libvgpu.so (a region with a memory limit,
//! no SM limit), alternating runs in one invocation. Reports medians of
//! per-run medians; prints, never asserts time.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use vgpu_sim::{SimHandle, SimOptions};

const RUNS: usize = 5;
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
    let mut d: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut i: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..RUNS {
        let a = run(tenant, &direct, &iters);
        let b = run(tenant, &interposed, &iters);
        for (k, _) in OPS {
            d.entry(k).or_default().push(a[k]);
            i.entry(k).or_default().push(b[k]);
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
    md.push_str("Command: `cargo bench -p vgpu-preload --bench wrapper -- --write`\n");
    md.push_str(&format!("Date: {date}; nproc: {nproc}; CPU: {cpu}\n"));
    md.push_str(&format!(
        "Method: the `vgpu-demo-tenant bench` process (dlopen + dlsym, like an application) runs {RUNS} times directly and {RUNS} times under \
         LD_PRELOAD=libvgpu.so with a 64 GiB limit (every allocation is admitted against the region and released), alternating; each run \
         reports the median of 15 batches of {iters}/15 calls; the table shows the median of the runs. The simulated driver's own cost is in \
         both columns; the difference is the wrapper's. Built with the release profile (`cargo bench`) on both sides; the simulated driver libraries must be built with \
         `cargo build --release -p vgpu-sim-cuda -p vgpu-sim-nvml` first. Launches are timed in batches of 128 with the queue drained \
         between batches (untimed), since the simulated driver blocks a full pushbuffer like a real one. `cargo bench` also enables the test-only \
         `failpoints` feature (dev-dependency unification); with no `LIBVGPU_FAILPOINT_PANIC` set it costs one relaxed load per call.\n\n"
    ));
    md.push_str("| call | direct (ns) | interposed (ns) | added (ns) | ratio |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (k, name) in OPS {
        let a = median(d[k].clone());
        let b = median(i[k].clone());
        md.push_str(&format!(
            "| {name} | {a:.1} | {b:.1} | {:+.1} | {:.2}x |\n",
            b - a,
            b / a
        ));
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
