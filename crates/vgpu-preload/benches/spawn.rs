//! Spawn cost: what libvgpu.so costs a process that never uses CUDA. With
//! `/etc/ld.so.preload` every process of a container loads it (shells,
//! `ls`, data-loader workers); this runs `sh` starting N `/bin/true` one
//! after another, bare and with each library preloaded (into `sh` and every
//! `/bin/true`), interleaved, and reports per library the median wall time
//! and CPU time of the whole loop, the ratio to bare and the cost per
//! process. Prints, never asserts time.
//!
//! `cargo bench -p vgpu-preload --bench spawn [-- --write]` (release
//! build); `VGPU_SPAWN_LIBS=label=path,...` adds libraries to compare in
//! the same run (e.g. a previous build), `VGPU_SPAWN_RUNS` (default 11) and
//! `VGPU_SPAWN_N` (default 200) change the sizes. `--write` also writes
//! bench/results/spawn-footprint.md.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Lib {
    label: String,
    path: Option<PathBuf>,
    wall_us: Vec<f64>,
    cpu_us: Vec<f64>,
    /// CPU of each round's loop (`None`: it failed), for the paired ratio.
    round_cpu_us: Vec<Option<f64>>,
    failures: usize,
}

/// One loop: wall and CPU (user + sys of `sh` and its children) in µs.
fn run_loop(n: usize, lib: Option<&Path>) -> Option<(f64, f64)> {
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done");
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", &script]).env_remove("LD_PRELOAD");
    if let Some(l) = lib {
        cmd.env("LD_PRELOAD", l);
    }
    let t0 = Instant::now();
    let child = cmd.spawn().ok()?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `pid` is our child, not yet waited for; `status` and `ru` are
    // valid out-parameters. wait4 reports the child's usage including the
    // children it waited for (every /bin/true).
    let r = unsafe { libc::wait4(pid, &mut status, 0, ru.as_mut_ptr()) };
    let wall = t0.elapsed().as_secs_f64() * 1e6;
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return None;
    }
    // SAFETY: wait4 succeeded and filled `ru`.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Some((wall, tv(ru.ru_utime) + tv(ru.ru_stime)))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Instructions of one `/bin/true` under callgrind (repeatable where wall
/// time is not); `None` without valgrind.
fn instructions(lib: Option<&Path>) -> Option<u64> {
    let dir = tempfile::tempdir().ok()?;
    let out_file = dir.path().join("cg.out");
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("/bin/true")
        .env_remove("LD_PRELOAD");
    if let Some(l) = lib {
        cmd.env("LD_PRELOAD", l);
    }
    let out = cmd.output().ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// (symbol relocations, relative relocations) the loader did for one
/// `/bin/true` (`LD_DEBUG=statistics`).
fn relocations(lib: Option<&Path>) -> Option<(u64, u64)> {
    let mut cmd = Command::new("/bin/true");
    cmd.env("LD_DEBUG", "statistics").env_remove("LD_PRELOAD");
    if let Some(l) = lib {
        cmd.env("LD_PRELOAD", l);
    }
    let out = cmd.output().ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let field = |key: &str| {
        err.lines()
            .find(|l| l.contains(key) && !l.contains("final"))
            .and_then(|l| l.rsplit(':').next())
            .and_then(|v| v.trim().parse().ok())
    };
    Some((
        field("number of relocations:")?,
        field("number of relative relocations:")?,
    ))
}

/// An empty shared object, compiled with the C compiler (`None` without one).
fn empty_object(dir: &Path) -> Option<PathBuf> {
    let c = dir.join("empty.c");
    let so = dir.join("libempty.so");
    std::fs::write(&c, "int vgpu_spawn_floor(void) { return 0; }\n").ok()?;
    let ok = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .ok()?
        .success();
    ok.then_some(so)
}

fn main() {
    let write = std::env::args().any(|a| a == "--write");
    let runs: usize = std::env::var("VGPU_SPAWN_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(11)
        .max(7);
    let n: usize = std::env::var("VGPU_SPAWN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut libs = vec![Lib {
        label: "bare".into(),
        path: None,
        wall_us: Vec::new(),
        cpu_us: Vec::new(),
        round_cpu_us: Vec::new(),
        failures: 0,
    }];
    for spec in std::env::var("VGPU_SPAWN_LIBS")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
    {
        let (label, path) = spec.split_once('=').unwrap_or((spec, spec));
        libs.push(Lib {
            label: label.into(),
            path: Some(PathBuf::from(path)),
            wall_us: Vec::new(),
            cpu_us: Vec::new(),
            round_cpu_us: Vec::new(),
            failures: 0,
        });
    }
    // The floor: an empty shared object preloaded (what any preload costs).
    let floor_dir = tempfile::tempdir().expect("tempdir");
    if let Some(floor) = empty_object(floor_dir.path()) {
        libs.push(Lib {
            label: "empty .so (floor)".into(),
            path: Some(floor),
            wall_us: Vec::new(),
            cpu_us: Vec::new(),
            round_cpu_us: Vec::new(),
            failures: 0,
        });
    }
    let front = vgpu_sim::locate_artifact("libvgpu.so").expect("libvgpu.so built");
    libs.push(Lib {
        label: "libvgpu.so (this build)".into(),
        path: Some(front),
        wall_us: Vec::new(),
        cpu_us: Vec::new(),
        round_cpu_us: Vec::new(),
        failures: 0,
    });
    // Warm the page cache and the loader's caches once per library.
    for l in &libs {
        let _ = run_loop(10, l.path.as_deref());
    }
    // Interleaved: one loop per library per round, the order rotating.
    for round in 0..runs {
        for k in 0..libs.len() {
            let i = (round + k) % libs.len();
            match run_loop(n, libs[i].path.as_deref()) {
                Some((w, c)) => {
                    libs[i].wall_us.push(w);
                    libs[i].cpu_us.push(c);
                    libs[i].round_cpu_us.push(Some(c));
                }
                None => {
                    libs[i].failures += 1;
                    libs[i].round_cpu_us.push(None);
                }
            }
        }
    }
    let base_wall = median(&libs[0].wall_us);
    let base_cpu = median(&libs[0].cpu_us);
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut md = String::new();
    md.push_str("# Spawn cost: libvgpu.so in processes that never use CUDA\n\n");
    md.push_str("Command: `cargo bench -p vgpu-preload --bench spawn -- --write`");
    if let Ok(v) = std::env::var("VGPU_SPAWN_LIBS") {
        md.push_str(&format!(" with `VGPU_SPAWN_LIBS={v}`"));
    }
    md.push_str(&format!(
        "\nDate: {date}; nproc: {nproc}; CPU: {cpu}; load average at the end: {}\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    md.push_str(&format!(
        "Method: `sh -c` running {n} × `/bin/true` one after another, bare and with each library in `LD_PRELOAD` (so `sh` and every \
         `/bin/true` load it), {runs} rounds interleaved (one loop per library per round, order rotating), after one warm-up loop each. \
         Wall: the loop's elapsed time; CPU: user + sys of `sh` and its children (`wait4`). Ratios and µs/process are against `bare` \
         in the same run (median of the rounds). Instructions: callgrind's count for one `/bin/true` (repeatable where time is not); \
         relocations: the loader's `LD_DEBUG=statistics` for one `/bin/true` (symbol / relative). `empty .so` is an empty shared \
         object built by the benchmark: the floor any preload costs. `CPU ratio, paired`: the median over rounds of a round's loop \
         CPU over bare's in the same round, which cancels what moves this VM's speed between rounds. Failed loops are counted, not dropped.\n\n"
    ));
    md.push_str("| library | wall median (ms) | wall ratio | wall µs/process | CPU median (ms) | CPU ratio | CPU ratio, paired | CPU µs/process | instructions (/bin/true) | relocations (symbol / relative) | failed loops |\n");
    md.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for l in &libs {
        let w = median(&l.wall_us);
        let c = median(&l.cpu_us);
        let ratios: Vec<f64> = l
            .round_cpu_us
            .iter()
            .zip(&libs[0].round_cpu_us)
            .filter_map(|(x, b)| Some(x.as_ref()? / b.as_ref()?))
            .collect();
        let paired = median(&ratios);
        let ins = instructions(l.path.as_deref()).map_or("-".to_string(), |v| v.to_string());
        let rel =
            relocations(l.path.as_deref()).map_or("-".to_string(), |(s, r)| format!("{s} / {r}"));
        md.push_str(&format!(
            "| {} | {:.1} | {:.3}x | {:+.1} | {:.1} | {:.3}x | {:.3}x | {:+.1} | {ins} | {rel} | {} |\n",
            l.label,
            w / 1e3,
            w / base_wall,
            (w - base_wall) / n as f64,
            c / 1e3,
            c / base_cpu,
            paired,
            (c - base_cpu) / n as f64,
            l.failures
        ));
    }
    md.push_str("\nRaw loops (ms, in round order):\n\n");
    for l in &libs {
        let f = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{:.1}", x / 1e3))
                .collect::<Vec<_>>()
                .join(" ")
        };
        md.push_str(&format!(
            "- {}: wall {}; CPU {}\n",
            l.label,
            f(&l.wall_us),
            f(&l.cpu_us)
        ));
    }
    md.push_str(
        "\nTarget (docs/design.md section 9): ≤ 1.03× on this loop, ≤ 15 µs per process.\n",
    );
    print!("{md}");
    if write {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/spawn-footprint.md");
        std::fs::write(&p, &md).expect("write bench/results/spawn-footprint.md");
        eprintln!("wrote {}", p.display());
    }
}
