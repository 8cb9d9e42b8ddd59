//! Registration burst benchmark: N fork+exec workers (N = 1, 8, 64, 128,
//! 256) map a region, wait at one gate, and register at once — lock-free
//! (CAS claim) side by side with the same claim serialized on one flock (the
//! shape of HAMi-core's semaphore) — then reserve/release cost per call.
//! Prints numbers; asserts nothing about time.
//!
//! `cargo bench -p vgpu-region --bench registration` (VGPU_BENCH_REPS sets
//! the repetitions per configuration, default 5).
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use hdrhistogram::Histogram;
use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region};

const WORKER: &str = env!("CARGO_BIN_EXE_vgpu-region-worker");

struct Burst {
    lat_ns: Vec<u64>,
    from_gate_ns: Vec<u64>,
    wall_ns: u64,
    failures: usize,
}

fn lock_ex(path: &Path) -> std::fs::File {
    let f = std::fs::File::create(path).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    f
}

fn burst(dir: &Path, n: usize, mode: &str) -> Burst {
    let region = dir.join(format!("region-{mode}-{n}"));
    let _ = std::fs::remove_file(&region);
    let (r, _) = Region::open_or_create(
        &region,
        &CreateOptions {
            slots: 1024,
            devices: vec![DeviceConfig {
                uuid: "GPU-bench".into(),
                mem_limit: 0,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    let gate_p = dir.join("gate");
    let hold_p = dir.join("hold");
    let gate = lock_ex(&gate_p);
    let hold = lock_ex(&hold_p);
    let mut kids = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = Command::new(WORKER);
        c.arg("burst")
            .arg(&region)
            .arg(&gate_p)
            .arg(&hold_p)
            .arg(mode)
            .env_remove(vgpu_region::failpoint::ENV)
            .stdout(Stdio::piped());
        let mut k = c.spawn().unwrap();
        let out = BufReader::new(k.stdout.take().unwrap());
        kids.push((k, out));
    }
    let mut failures = 0;
    for (_, out) in kids.iter_mut() {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        if l.trim() != "ready" {
            failures += 1;
        }
    }
    let t_gate = vgpu_region::monotonic_ns();
    drop(gate);
    let mut lat_ns = Vec::new();
    let mut from_gate_ns = Vec::new();
    let mut last = t_gate;
    for (_, out) in kids.iter_mut() {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        let get = |k: &str| -> Option<u64> {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse().ok())
        };
        match (get("start_ns="), get("end_ns=")) {
            (Some(s), Some(e)) => {
                lat_ns.push(e.saturating_sub(s));
                from_gate_ns.push(e.saturating_sub(t_gate));
                last = last.max(e);
            }
            _ => failures += 1,
        }
    }
    drop(hold);
    for (mut k, _) in kids {
        if !k.wait().unwrap().success() {
            failures += 1;
        }
    }
    if r.reclaim_dead() != n - failures {
        failures += 1;
    }
    let _ = std::fs::remove_file(&region);
    Burst {
        lat_ns,
        from_gate_ns,
        wall_ns: last - t_gate,
        failures,
    }
}

fn pct(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn hist(v: &[u64]) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).unwrap();
    for &x in v {
        h.record(x.max(1)).unwrap();
    }
    h
}

/// Median over 5 runs of (reserve ns, release ns) per call: `iters`
/// reservations of 4 KiB, then `iters` releases.
fn per_call(r: &Region, iters: u32, limit: u64) -> (f64, f64) {
    r.set_limits(0, vgpu_region::Limits { mem: limit, sm: 0 });
    let s = r.register().unwrap();
    let mut res = Vec::new();
    let mut rel = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            r.reserve(s, 0, MemKind::Data, 4096).unwrap();
        }
        res.push(t.elapsed().as_nanos() as f64 / iters as f64);
        let t = Instant::now();
        for _ in 0..iters {
            r.release(s, 0, MemKind::Data, 4096);
        }
        rel.push(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    r.unregister(s);
    res.sort_by(f64::total_cmp);
    rel.sort_by(f64::total_cmp);
    (res[2], rel[2])
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let reps: usize = std::env::var("VGPU_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    println!(
        "registration burst: N fork+exec workers released together from one gate; {reps} runs each"
    );
    println!("latency = the worker's own register call (queueing on the lock included for flock); from-gate = gate release -> registered; wall = gate -> last registered (median of runs)");
    println!();
    println!("| N | registration | samples | fail | p50 µs | p99 µs | max µs | from-gate p50 µs | from-gate p99 µs | wall ms |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [1usize, 8, 64, 128, 256] {
        for mode in ["cas", "flock"] {
            let mut lat = Vec::new();
            let mut fg = Vec::new();
            let mut walls = Vec::new();
            let mut fails = 0;
            for _ in 0..reps {
                let b = burst(dir.path(), n, mode);
                lat.extend(b.lat_ns);
                fg.extend(b.from_gate_ns);
                walls.push(b.wall_ns);
                fails += b.failures;
            }
            walls.sort_unstable();
            let (h, g) = (hist(&lat), hist(&fg));
            println!(
                "| {n} | {} | {} | {fails} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
                if mode == "cas" {
                    "lock-free CAS"
                } else {
                    "flock-serialized"
                },
                lat.len(),
                pct(&h, 0.5),
                pct(&h, 0.99),
                h.max() as f64 / 1000.0,
                pct(&g, 0.5),
                pct(&g, 0.99),
                walls[walls.len() / 2] as f64 / 1e6
            );
        }
    }
    let p = dir.path().join("percall");
    let (r, _) = Region::open_or_create(
        &p,
        &CreateOptions {
            slots: 1024,
            devices: vec![DeviceConfig {
                uuid: "GPU-bench".into(),
                mem_limit: 0,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    // Threads of one process, each with its own slot, all under the limit
    // (their sums read each other's cache lines).
    println!();
    println!("reserve+release of 4 KiB, threads of one process each with its own slot (8 slots summed), 1 TiB limit:");
    println!();
    println!("| threads (own slots, 8 summed) | limit | reserve+release ns per pair per thread |");
    println!("|---:|---|---:|");
    r.set_limits(
        0,
        vgpu_region::Limits {
            mem: 1 << 40,
            sm: 0,
        },
    );
    let extra: Vec<_> = (0..7).map(|_| r.register().unwrap()).collect();
    for threads in [1usize, 2, 4] {
        let iters = 100_000u32;
        let t = Instant::now();
        std::thread::scope(|sc| {
            for &s in &extra[..threads] {
                let r = &r;
                sc.spawn(move || {
                    for _ in 0..iters {
                        r.reserve(s, 0, MemKind::Data, 4096).unwrap();
                        r.release(s, 0, MemKind::Data, 4096);
                    }
                });
            }
        });
        let ns = t.elapsed().as_nanos() as f64 / iters as f64;
        println!("| {threads} | 1 TiB | {ns:.0} |");
    }
    for s in extra {
        r.unregister(s);
    }
    println!();
    println!(
        "reserve and release cost per call (one thread, 4 KiB each, median of 5 runs of 100k), by slots summed:"
    );
    println!();
    println!("| slots summed (high water) | limit | reserve ns | release ns |");
    println!("|---:|---|---:|---:|");
    let mut held = Vec::new();
    for hw in [1usize, 8, 64, 256] {
        // Occupy slots so admission sums `hw` slots (as after a burst).
        while held.len() + 1 < hw {
            held.push(r.register().unwrap());
        }
        for (limit, name) in [(0u64, "none"), (1u64 << 40, "1 TiB")] {
            let (res, rel) = per_call(&r, 100_000, limit);
            println!("| {hw} | {name} | {res:.0} | {rel:.0} |");
        }
    }
}
