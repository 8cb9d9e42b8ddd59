//! The simulated machine with real processes: the simulated libcuda /
//! libnvidia-ml loaded by `vgpu-sim-probe` processes against a private
//! `SimHandle`. Waits poll with generous deadlines; nothing asserts a
//! duration.
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_sim::{SimHandle, SimOptions};

const PROBE: &str = env!("CARGO_BIN_EXE_vgpu-sim-probe");
const MIB: u64 = 1 << 20;

struct Probe {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Probe {
    fn spawn(sim: &SimHandle, prefix: &[&str], steps: &[&str]) -> Probe {
        let mut cmd = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(PROBE);
                c
            }
            None => Command::new(PROBE),
        };
        cmd.args(steps)
            .envs(sim.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn probe");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Probe { child, out }
    }

    /// Read lines until one starts with `want`; panics on `error` or EOF.
    fn expect(&mut self, want: &str) -> String {
        loop {
            let mut l = String::new();
            let n = self.out.read_line(&mut l).expect("read probe");
            assert!(n > 0, "probe exited before `{want}`");
            let l = l.trim().to_string();
            assert!(!l.starts_with("error"), "probe failed: {l}");
            if l.starts_with(want) {
                return l;
            }
        }
    }

    /// End one `wait` step.
    fn next(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"\n")
            .and_then(|()| stdin.flush())
            .expect("write probe");
    }

    /// Close stdin (ends every `wait` step) and reap.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        self.child.wait().expect("wait probe")
    }
}

/// Run a probe to completion and return its stdout lines.
fn run(sim: &SimHandle, steps: &[&str]) -> Vec<String> {
    let out = Command::new(PROBE)
        .args(steps)
        .envs(sim.env())
        .output()
        .expect("run probe");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "probe {steps:?} failed: {text}");
    text.lines().map(str::to_string).collect()
}

fn nvml_procs(sim: &SimHandle) -> HashMap<u32, u64> {
    run(sim, &["nvml-procs", "0"])
        .iter()
        .filter_map(|l| {
            let mut w = l.strip_prefix("proc ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of the only child of `pid` (unshare's forked worker).
fn only_child(pid: u32) -> u32 {
    let mut found = None;
    wait_until("unshare's child", || {
        let p = format!("/proc/{pid}/task/{pid}/children");
        found = std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|c| c.parse().ok()));
        found.is_some()
    });
    found.expect("child")
}

fn have_unshare() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn nvml_lists_host_pids_and_a_killed_process_is_released() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let mut a = Probe::spawn(
        &sim,
        &[],
        &["init", "retain", "0", "alloc", "512", "ready", "wait"],
    );
    a.expect("alloc ok");
    a.expect("ready");
    let ns = have_unshare();
    let prefix: &[&str] = if ns {
        &["unshare", "--pid", "--fork", "--mount-proc"]
    } else {
        &[]
    };
    if !ns {
        eprintln!("unshare --pid unavailable: worker B runs in this namespace");
    }
    let mut b = Probe::spawn(
        &sim,
        prefix,
        &[
            "init", "retain", "0", "alloc", "1024", "pid", "ready", "wait",
        ],
    );
    b.expect("alloc ok");
    let inner: u32 = b.expect("pid").trim_start_matches("pid ").parse().unwrap();
    b.expect("ready");
    let b_host = if ns {
        only_child(b.child.id())
    } else {
        b.child.id()
    };
    if ns {
        assert_eq!(inner, 1, "worker B sees itself as pid 1 in its namespace");
    }
    let procs = nvml_procs(&sim);
    assert_eq!(
        procs.len(),
        2,
        "NVML lists exactly the two workers: {procs:?}"
    );
    assert_eq!(
        procs.get(&a.child.id()),
        Some(&(512 * MIB)),
        "A under its host pid: {procs:?}"
    );
    assert_eq!(
        procs.get(&b_host),
        Some(&(1024 * MIB)),
        "B under its host pid {b_host}: {procs:?}"
    );
    let state = sim.state().unwrap();
    assert_eq!(state.used_bytes(0), 1536 * MIB);

    // SIGKILL B: the daemon sees it die and releases its memory and context.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(b_host as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let _ = b.finish();
    wait_until("B's record to be released", || {
        state.used_bytes(0) == 512 * MIB
    });
    let procs = nvml_procs(&sim);
    assert_eq!(procs.len(), 1, "only A is left: {procs:?}");
    assert_eq!(procs.get(&a.child.id()), Some(&(512 * MIB)));

    // A exits without freeing: released as a driver releases at teardown.
    assert!(a.finish().success());
    wait_until("A's record to be released", || state.used_bytes(0) == 0);
    assert!(nvml_procs(&sim).is_empty());
}

#[test]
fn a_process_is_listed_only_while_it_holds_a_context() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let mut p = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "ready", "wait", "retain", "0", "alloc", "64", "ready", "wait", "release", "0",
            "ready", "wait",
        ],
    );
    let pid = p.child.id();
    p.expect("ready");
    assert!(!nvml_procs(&sim).contains_key(&pid), "no context yet");
    p.next();
    p.expect("ready");
    assert_eq!(nvml_procs(&sim).get(&pid), Some(&(64 * MIB)));
    p.next();
    p.expect("ready");
    // Releasing the primary context destroys it and frees its memory.
    assert!(
        !nvml_procs(&sim).contains_key(&pid),
        "listed after its last release"
    );
    assert_eq!(sim.state().unwrap().used_bytes(0), 0);
    assert!(p.finish().success());
}

#[test]
fn memory_is_accounted_across_processes() {
    let sim = SimHandle::start(SimOptions::from_toml("[device]\nmemory = \"1GiB\"\n").unwrap())
        .expect("sim");
    let mut a = Probe::spawn(
        &sim,
        &[],
        &["init", "retain", "0", "alloc", "700", "ready", "wait"],
    );
    a.expect("alloc ok");
    a.expect("ready");
    // 700 + 400 MiB > 1 GiB: the second process is refused, 300 fits.
    let lines = run(
        &sim,
        &["init", "retain", "0", "alloc", "400", "alloc", "300"],
    );
    assert_eq!(
        lines,
        vec!["alloc err 2".to_string(), "alloc ok".to_string()]
    );
    assert!(a.finish().success());
}

#[test]
fn an_unrepresentable_allocation_is_refused_without_wrapping_the_counters() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let mut p = Probe::spawn(
        &sim,
        &[],
        &[
            "init",
            "retain",
            "0",
            "alloc",
            "512",
            "alloc-bytes",
            "max",
            "alloc-bytes",
            "18446744073709551104",
            "ready",
            "wait",
        ],
    );
    p.expect("alloc ok");
    // SIZE_MAX and SIZE_MAX - 511: CUDA_ERROR_OUT_OF_MEMORY, nothing charged.
    assert_eq!(p.expect("alloc"), "alloc err 2");
    assert_eq!(p.expect("alloc"), "alloc err 2");
    p.expect("ready");
    let state = sim.state().unwrap();
    assert_eq!(state.used_bytes(0), 512 * MIB, "the 512 MiB still held");
    assert_eq!(
        nvml_procs(&sim).values().copied().collect::<Vec<_>>(),
        vec![512 * MIB]
    );
    assert!(p.finish().success());
}

#[test]
fn cold_retains_never_overlap_when_the_driver_serializes() {
    let sim = SimHandle::start(SimOptions::profile("a100-burst").unwrap()).expect("sim");
    let probes: Vec<Probe> = (0..8)
        .map(|_| Probe::spawn(&sim, &[], &["init", "retain", "0", "release", "0"]))
        .collect();
    let pids: Vec<u32> = probes.iter().map(|p| p.child.id()).collect();
    for p in probes {
        assert!(p.finish().success());
    }
    let mut r = sim.state().unwrap().retains();
    assert_eq!(r.len(), 8, "one cold retain per process: {r:?}");
    let mut seen: Vec<u32> = r.iter().map(|x| x.0).collect();
    seen.sort_unstable();
    let mut want = pids.clone();
    want.sort_unstable();
    assert_eq!(seen, want, "recorded under each process's host pid");
    r.sort_by_key(|x| x.2);
    for w in r.windows(2) {
        assert!(
            w[0].3 <= w[1].2,
            "cold retains overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
        assert!(w[0].3 > w[0].2, "a cold retain takes time under a100-burst");
    }
}

#[test]
fn cold_retains_without_serialization_are_still_recorded() {
    let toml = "profile = \"a100-burst\"\n[cost]\nserialize_context_creation = false\n";
    let sim = SimHandle::start(SimOptions::from_toml(toml).unwrap()).expect("sim");
    let probes: Vec<Probe> = (0..8)
        .map(|_| Probe::spawn(&sim, &[], &["init", "retain", "0", "release", "0"]))
        .collect();
    for p in probes {
        assert!(p.finish().success());
    }
    let mut r = sim.state().unwrap().retains();
    assert_eq!(r.len(), 8);
    r.sort_by_key(|x| x.2);
    // They may overlap now (not asserted: it depends on scheduling).
    let overlaps = r.windows(2).filter(|w| w[0].3 > w[1].2).count();
    eprintln!("unserialized: {overlaps} of 7 neighbouring cold retains overlapped");
}

/// Busy fraction per host pid over `[from, to)` from the sim's timeline.
fn shares(sim: &SimHandle, from: u64, to: u64) -> (f64, HashMap<u32, f64>) {
    let st = sim.state().unwrap();
    let span = (to - from) as f64;
    let mut per = HashMap::new();
    let mut total = 0.0;
    for (pid, s, e) in st.kernels(0, from, to) {
        let b = (e.min(to) - s.max(from)) as f64 / span;
        total += b;
        *per.entry(pid).or_insert(0.0) += b;
    }
    (total, per)
}

fn util_sim() -> SimHandle {
    util_sim_depth(64)
}

fn util_sim_depth(depth: u32) -> SimHandle {
    // A short NVML window. The queue holds some work ahead, so a briefly
    // descheduled launcher leaves no gap; fairness comes from the
    // scheduler's time slices, not from launch timing.
    let toml = format!("[kernel]\nnvml_window_ms = 400\nqueue_depth = {depth}\n");
    SimHandle::start(SimOptions::from_toml(&toml).unwrap()).expect("sim")
}

fn nvml_util(sim: &SimHandle) -> (u32, HashMap<u32, u32>) {
    let lines = run(sim, &["nvml-util", "0"]);
    let gpu = lines
        .iter()
        .find_map(|l| l.strip_prefix("util ")?.parse().ok())
        .expect("util line");
    let per = lines
        .iter()
        .filter_map(|l| {
            let mut w = l.strip_prefix("putil ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    (gpu, per)
}

#[test]
fn one_busy_process_saturates_the_device() {
    let sim = util_sim();
    // 132 blocks of 1 ms on 132 SMs: one wave, 1 ms per launch.
    let mut p = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "retain", "0", "ready", "launch", "1000", "132", "2500",
        ],
    );
    p.expect("ready");
    std::thread::sleep(Duration::from_millis(1200));
    let (gpu, per) = nvml_util(&sim);
    let pid = p.child.id();
    p.expect("launched");
    assert!(p.finish().success());
    eprintln!("one busy process: NVML device {gpu} %, per process {per:?}");
    assert!((85..=100).contains(&gpu), "device utilization {gpu} %");
    assert!(
        per.get(&pid).is_some_and(|u| (85..=100).contains(u)),
        "process utilization {per:?}"
    );
    // The recorded timeline agrees over the middle of the run.
    let st = sim.state().unwrap();
    let k = st.kernels(0, 0, u64::MAX);
    let (first, last) = (
        k.iter().map(|x| x.1).min().unwrap(),
        k.iter().map(|x| x.2).max().unwrap(),
    );
    let (total, _) = shares(&sim, first + (last - first) / 4, last - (last - first) / 4);
    assert!(total > 0.85, "timeline busy fraction {total}");
}

#[test]
fn two_busy_processes_share_the_device_evenly() {
    let sim = util_sim();
    let steps = [
        "init", "retain", "0", "ready", "launch", "1000", "132", "3000",
    ];
    let mut a = Probe::spawn(&sim, &[], &steps);
    let mut b = Probe::spawn(&sim, &[], &steps);
    a.expect("ready");
    b.expect("ready");
    std::thread::sleep(Duration::from_millis(1500));
    let (gpu, per) = nvml_util(&sim);
    let (pa, pb) = (a.child.id(), b.child.id());
    a.expect("launched");
    b.expect("launched");
    assert!(a.finish().success() && b.finish().success());
    eprintln!("two busy processes: NVML device {gpu} %, per process {per:?}");
    assert!((85..=100).contains(&gpu), "device utilization {gpu} %");
    for pid in [pa, pb] {
        let u = per.get(&pid).copied().unwrap_or(0);
        assert!(
            (35..=65).contains(&u),
            "pid {pid} at {u} % (want ~50): {per:?}"
        );
    }
    // From the timeline: over the span both were launching, each ~half.
    let st = sim.state().unwrap();
    let k = st.kernels(0, 0, u64::MAX);
    let span = |pid: u32| {
        let mine: Vec<_> = k.iter().filter(|x| x.0 == pid).collect();
        (
            mine.iter().map(|x| x.1).min().unwrap(),
            mine.iter().map(|x| x.2).max().unwrap(),
        )
    };
    let ((a0, a1), (b0, b1)) = (span(pa), span(pb));
    let (from, to) = (a0.max(b0), a1.min(b1));
    assert!(to > from, "both ran at once");
    let (total, per) = shares(&sim, from, to);
    assert!(total > 0.85, "timeline busy {total}");
    for pid in [pa, pb] {
        let s = per.get(&pid).copied().unwrap_or(0.0);
        assert!((0.35..=0.65).contains(&s), "pid {pid} timeline share {s}");
    }
}

#[test]
fn malformed_config_is_one_clear_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        "profile = \"a100-burst\"\n[cost]\nprimary_retain_cold_us = \"fast\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-simd"))
        .arg("--dir")
        .arg(dir.path().join("m"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("`cost.primary_retain_cold_us`"), "{err}");
    assert!(err.contains("config.toml"), "names the file: {err}");
    assert!(!dir.path().join("m").exists(), "nothing started");

    std::fs::write(&cfg, "[device]\nsms = 0\n").unwrap();
    let e = SimOptions::from_toml("[device]\nsms = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`device.sms`"), "{e}");
}

#[test]
fn daemon_binary_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    let mut d = Command::new(env!("CARGO_BIN_EXE_vgpu-simd"))
        .arg("--dir")
        .arg(&m)
        .args(["--devices", "3"])
        .spawn()
        .unwrap();
    wait_until("the daemon socket", || vgpu_sim::client::ping(&m).is_ok());
    let machine = vgpu_sim::Machine::connect_dir(&m, false).unwrap();
    assert_eq!(machine.device_count(), 3);
    assert!(machine.device_name(0).unwrap().contains("(simulated)"));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(d.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
    assert!(!m.join("sock").exists(), "socket removed on SIGTERM");
}

#[test]
fn bogus_handles_are_errors_not_crashes() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let lines = run(&sim, &["init", "retain", "0", "bogus"]);
    let got: HashMap<String, u32> = lines
        .iter()
        .filter_map(|l| {
            let mut w = l.strip_prefix("bogus ")?.split(' ');
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect();
    let want = [
        ("cuCtxSetCurrent", 201),
        ("cuCtxDestroy_v2", 201),
        ("cuMemFree_v2", 1),
        ("cuMemRelease", 1),
        ("cuStreamSynchronize", 400),
        ("cuStreamDestroy_v2", 400),
        ("cuEventRecord", 400),
        ("cuEventDestroy_v2", 400),
        ("cuModuleUnload", 400),
        ("cuArrayDestroy", 400),
        ("cuMipmappedArrayDestroy", 400),
        ("cuGraphLaunch", 1),
        ("cuGraphExecDestroy", 1),
        ("cuGraphDestroy", 1),
        ("nvmlDeviceGetName", 2),
    ];
    for (name, code) in want {
        assert_eq!(got.get(name), Some(&code), "{name}: {lines:?}");
    }
}

#[test]
fn without_a_daemon_init_fails_cleanly() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let empty = tempfile::tempdir().unwrap();
    let mut env = sim.env();
    env.retain(|(k, _)| k != "VGPU_SIM_DIR");
    let out = Command::new(PROBE)
        .arg("init")
        .envs(env)
        .env("VGPU_SIM_DIR", empty.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stdout.contains("CUDA_ERROR_NO_DEVICE"), "{stdout}");
    assert!(
        stderr.contains(
            "[vgpu-sim] cuInit: cannot reach the simulated machine: no vgpu-sim daemon at"
        ),
        "{stderr}"
    );
}

#[test]
fn the_daemon_survives_garbage_and_hangups() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let sock = sim.dir().join("sock");
    // A client that connects and hangs up at once.
    drop(UnixStream::connect(&sock).unwrap());
    // One that sends junk gets a "bad request" reply.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(b"GARBAGE!").unwrap();
    let mut rep = [0u8; 16];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(&rep[..4], b"VSIM");
    assert_eq!(u32::from_le_bytes(rep[4..8].try_into().unwrap()), 3);
    // One that connects and says nothing holds no one up; one whose
    // request arrives in pieces is served.
    let _stalled = UnixStream::connect(&sock).unwrap();
    let mut slow = UnixStream::connect(&sock).unwrap();
    slow.write_all(b"VSIM").unwrap();
    assert_eq!(
        run(&sim, &["init", "retain", "0", "alloc", "1"]),
        vec!["alloc ok".to_string()]
    );
    slow.write_all(b"A\0\0\0").unwrap();
    slow.read_exact(&mut rep).unwrap();
    assert_eq!(
        u32::from_le_bytes(rep[4..8].try_into().unwrap()),
        0,
        "attach served"
    );
    assert_eq!(
        u32::from_le_bytes(rep[8..12].try_into().unwrap()),
        std::process::id()
    );
}

#[test]
fn many_killed_processes_are_all_released() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let mut probes: Vec<Probe> = (0..24)
        .map(|_| {
            Probe::spawn(
                &sim,
                &[],
                &["init", "retain", "0", "alloc", "100", "ready", "wait"],
            )
        })
        .collect();
    for p in &mut probes {
        p.expect("ready");
    }
    let state = sim.state().unwrap();
    assert_eq!(state.used_bytes(0), 24 * 100 * MIB);
    assert_eq!(nvml_procs(&sim).len(), 24);
    for p in &mut probes {
        p.child.kill().unwrap();
    }
    for p in probes {
        let _ = p.finish();
    }
    wait_until("every record to be released", || state.used_bytes(0) == 0);
    assert!(nvml_procs(&sim).is_empty());
    assert!(
        state.live_procs().is_empty(),
        "records left: {:?}",
        state.live_procs()
    );
}

#[test]
fn devices_are_accounted_separately() {
    let sim = SimHandle::start(SimOptions::default().devices(2)).expect("sim");
    let mut p = Probe::spawn(
        &sim,
        &[],
        &["init", "retain", "1", "alloc", "256", "ready", "wait"],
    );
    p.expect("ready");
    let on = |d: &str| -> HashMap<u32, u64> {
        run(&sim, &["nvml-procs", d])
            .iter()
            .filter_map(|l| {
                let mut w = l.strip_prefix("proc ")?.split(' ');
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
            })
            .collect()
    };
    assert!(on("0").is_empty(), "nothing on device 0");
    assert_eq!(on("1").get(&p.child.id()), Some(&(256 * MIB)));
    let st = sim.state().unwrap();
    assert_eq!((st.used_bytes(0), st.used_bytes(1)), (0, 256 * MIB));
    assert!(p.finish().success());
}

#[test]
fn long_kernels_are_time_sliced_against_short_ones() {
    // Few launches ahead: 50 ms kernels would otherwise queue seconds.
    let sim = util_sim_depth(8);
    // 50 ms single-wave kernels against 0.2 ms ones: each process still
    // gets about half of the device, slice by slice.
    let mut a = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "retain", "0", "ready", "launch", "50000", "132", "2500",
        ],
    );
    let mut b = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "retain", "0", "ready", "launch", "200", "132", "2500",
        ],
    );
    a.expect("ready");
    b.expect("ready");
    std::thread::sleep(Duration::from_millis(1500));
    let (gpu, per) = nvml_util(&sim);
    let (pa, pb) = (a.child.id(), b.child.id());
    a.expect("launched");
    b.expect("launched");
    assert!(a.finish().success() && b.finish().success());
    eprintln!("long vs short kernels: NVML device {gpu} %, per process {per:?}");
    assert!((85..=100).contains(&gpu), "device utilization {gpu} %");
    for pid in [pa, pb] {
        let u = per.get(&pid).copied().unwrap_or(0);
        assert!(
            (35..=65).contains(&u),
            "pid {pid} at {u} % (want ~50): {per:?}"
        );
    }
}

#[test]
fn a_killed_launcher_frees_the_device_for_others() {
    let sim = util_sim();
    let mut a = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "retain", "0", "ready", "launch", "1000", "132", "5000",
        ],
    );
    a.expect("ready");
    std::thread::sleep(Duration::from_millis(300));
    a.child.kill().unwrap();
    let pa = a.child.id();
    let _ = a.finish();
    // B's work runs and completes although A died with work queued.
    let lines = run(
        &sim,
        &["init", "retain", "0", "launch", "1000", "132", "300"],
    );
    assert!(lines.iter().any(|l| l.starts_with("launched")), "{lines:?}");
    let st = sim.state().unwrap();
    wait_until("A's record to be released", || {
        st.live_procs().iter().all(|(_, p)| *p != pa)
    });
    // Nothing of A's runs after B started.
    let k = st.kernels(0, 0, u64::MAX);
    let b_first = k.iter().filter(|x| x.0 != pa).map(|x| x.1).min().unwrap();
    assert!(
        k.iter()
            .filter(|x| x.0 == pa)
            .all(|x| x.2 <= b_first + 2_000_000),
        "A's kernels ran after it died: {k:?}"
    );
}

#[test]
fn synchronize_fails_instead_of_hanging_when_the_daemon_is_gone() {
    let sim = util_sim();
    // 10 s of queued work; the machine goes away under it.
    let mut p = Probe::spawn(
        &sim,
        &[],
        &[
            "init", "retain", "0", "ready", "launch", "1000000", "132", "1",
        ],
    );
    p.expect("ready");
    std::thread::sleep(Duration::from_millis(100));
    drop(sim);
    let mut l = String::new();
    p.out.read_line(&mut l).unwrap();
    assert!(
        l.contains("error") && l.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{l}"
    );
    assert!(!p.finish().success());
}

#[test]
fn cuda_visible_devices_maps_ordinals_to_physical_devices() {
    let sim = SimHandle::start(SimOptions::default().devices(2)).expect("sim");
    let out = Command::new(PROBE)
        .args([
            "init",
            "retain",
            "0",
            "alloc",
            "64",
            "alloc-async",
            "64",
            "nvml-procs",
            "0",
            "nvml-procs",
            "1",
        ])
        .envs(sim.env())
        .env("CUDA_VISIBLE_DEVICES", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // CUDA's device 0 is the machine's device 1; NVML ignores the variable.
    let lines: Vec<&str> = text.lines().collect();
    let snap0 = lines
        .iter()
        .position(|l| l.starts_with("snapshot_us"))
        .unwrap();
    assert!(
        !lines[..snap0].iter().any(|l| l.starts_with("proc ")),
        "nothing on NVML device 0: {text}"
    );
    assert!(
        lines[snap0..]
            .iter()
            .any(|l| l.starts_with("proc ") && l.ends_with(&(128 * MIB).to_string())),
        "128 MiB on NVML device 1: {text}"
    );
    // Hiding every device: cuInit reports no device.
    let out = Command::new(PROBE)
        .arg("init")
        .envs(sim.env())
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("CUDA_ERROR_NO_DEVICE"));
}

/// `key value` lines of a probe's output.
fn facts(lines: &[String]) -> HashMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// CUDA's and NVML's device lists of a probe run with `CUDA_VISIBLE_DEVICES`
/// (unset when `None`).
fn device_lists(sim: &SimHandle, visible: Option<&str>) -> (Vec<String>, Vec<String>) {
    let mut cmd = Command::new(PROBE);
    cmd.args(["init", "devices", "nvml-devices"])
        .envs(sim.env());
    match visible {
        Some(v) => cmd.env("CUDA_VISIBLE_DEVICES", v),
        None => cmd.env_remove("CUDA_VISIBLE_DEVICES"),
    };
    let out = cmd.output().expect("run probe");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "probe ({visible:?}) failed: {text}");
    let f = facts(&text.lines().map(str::to_string).collect::<Vec<_>>());
    let list = |side: &str| -> Vec<String> {
        let n: usize = f[&format!("{side}.count")].parse().unwrap();
        (0..n)
            .map(|i| f[&format!("{side}.{i}.uuid")].clone())
            .collect()
    };
    (list("cuda"), list("nvml"))
}

#[test]
fn cuda_visible_devices_selects_and_orders_by_index_and_uuid_nvml_ignores_it() {
    let sim = SimHandle::start(SimOptions::default().devices(2)).expect("sim");
    let (cuda, nvml) = device_lists(&sim, None);
    assert_eq!(cuda.len(), 2);
    assert_eq!(cuda, nvml, "without the variable CUDA and NVML agree");
    assert_ne!(cuda[0], cuda[1]);
    let (u0, u1) = (cuda[0].clone(), cuda[1].clone());
    // The shortest prefix of device 1's UUID that device 0's lacks.
    let n = (5..=u1.len())
        .find(|n| !u0.starts_with(&u1[..*n]))
        .expect("UUIDs differ");
    let prefix = &u1[..n];
    for (visible, want) in [
        ("1", vec![&u1]),
        ("1,0", vec![&u1, &u0]),
        ("0,1", vec![&u0, &u1]),
        (u1.as_str(), vec![&u1]),
        (&format!("{u1},0"), vec![&u1, &u0]),
        (prefix, vec![&u1]),
        // Enumeration stops at the first invalid entry.
        ("0,7,1", vec![&u0]),
        ("1,GPU-nonesuch,0", vec![&u1]),
    ] {
        let (c, nv) = device_lists(&sim, Some(visible));
        assert_eq!(
            c,
            want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "CUDA_VISIBLE_DEVICES={visible}"
        );
        assert_eq!(nv, nvml, "NVML ignores CUDA_VISIBLE_DEVICES={visible}");
    }
    // A leading invalid entry (or an empty value) hides every device.
    for visible in ["", "7", "GPU-nonesuch"] {
        let out = Command::new(PROBE)
            .arg("init")
            .envs(sim.env())
            .env("CUDA_VISIBLE_DEVICES", visible)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("CUDA_ERROR_NO_DEVICE"),
            "CUDA_VISIBLE_DEVICES={visible:?}"
        );
    }
}

/// `pool reserved R used U reserved_high RH used_high UH` lines, in MiB.
fn pool_lines(lines: &[String]) -> Vec<[u64; 4]> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("pool reserved "))
        .map(|l| {
            let w: Vec<u64> = l.split(' ').filter_map(|x| x.parse::<u64>().ok()).collect();
            assert_eq!(w.len(), 4, "{l}");
            [w[0] / MIB, w[1] / MIB, w[2] / MIB, w[3] / MIB]
        })
        .collect()
}

fn pool_line(p: &mut Probe) -> [u64; 4] {
    pool_lines(&[p.expect("pool reserved")])[0]
}

#[test]
fn own_pool_memory_is_device_memory_until_trimmed_and_a_killed_owner_frees_it() {
    let sim = SimHandle::start(SimOptions::from_toml("[device]\nmemory = \"1GiB\"\n").unwrap())
        .expect("sim");
    let mut a = Probe::spawn(
        &sim,
        &[],
        &[
            "init",
            "retain",
            "0",
            "pool-create",
            "0",
            "pool-threshold",
            "max",
            "pool-alloc",
            "512",
            "pool-alloc",
            "256",
            "free-async",
            "free-async",
            "sync",
            "pool-attr",
            "ready",
            "wait",
            "pool-trim",
            "256",
            "pool-attr",
            "ready",
            "wait",
            "pool-trim",
            "0",
            "pool-attr",
            "pool-alloc",
            "100",
            "pool-attr",
            "ready",
            "wait",
        ],
    );
    // Everything freed, but the threshold keeps it: the device is charged.
    assert_eq!(pool_line(&mut a), [768, 0, 768, 768]);
    a.expect("ready");
    let a_pid = a.child.id();
    assert_eq!(nvml_procs(&sim).get(&a_pid), Some(&(768 * MIB)));
    let b = |mib: &str| run(&sim, &["init", "retain", "0", "alloc", mib]);
    assert_eq!(b("400"), ["alloc err 2"], "256 MiB left beside the pool");
    assert_eq!(b("200"), ["alloc ok"]);

    // Trim to 256 MiB: the rest goes back.
    a.next();
    assert_eq!(pool_line(&mut a), [256, 0, 768, 768]);
    a.expect("ready");
    assert_eq!(nvml_procs(&sim).get(&a_pid), Some(&(256 * MIB)));
    assert_eq!(b("700"), ["alloc ok"]);
    assert_eq!(b("800"), ["alloc err 2"]);

    // Trim to nothing, then grow again by what is asked (rounded to 2 MiB).
    a.next();
    assert_eq!(pool_line(&mut a), [0, 0, 768, 768]);
    assert_eq!(pool_line(&mut a), [100, 100, 768, 768]);
    a.expect("ready");
    assert_eq!(nvml_procs(&sim).get(&a_pid), Some(&(100 * MIB)));

    // SIGKILL the owner: its pool memory is released with it.
    a.child.kill().unwrap();
    let _ = a.finish();
    let state = sim.state().unwrap();
    wait_until("the killed pool owner to be released", || {
        state.used_bytes(0) == 0
    });
    assert_eq!(b("1000"), ["alloc ok"]);
}

#[test]
fn pools_reuse_freed_memory_and_release_above_the_threshold_at_synchronize() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let lines = run(
        &sim,
        &[
            "init",
            "retain",
            "0",
            // The device's default pool: release threshold 0.
            "pool-current",
            "0",
            "pool-alloc",
            "64",
            "free-async",
            "pool-attr", // freed, not yet synchronized: still reserved
            "sync",
            "pool-attr", // synchronized: released
            // An own pool keeping up to 32 MiB.
            "pool-create",
            "0",
            "pool-threshold",
            "32",
            "pool-alloc",
            "64",
            "free-async",
            "sync",
            "pool-attr",
            // Reuse: 30 MiB fit in the 32 kept, no growth; 40 more grow it
            // by the 38 MiB missing.
            "pool-alloc",
            "30",
            "pool-attr",
            "pool-alloc",
            "40",
            "pool-attr",
            "mem-info",
        ],
    );
    assert_eq!(
        pool_lines(&lines),
        vec![
            [64, 0, 64, 64],
            [0, 0, 64, 64],
            [32, 0, 64, 64],
            [32, 30, 64, 64],
            [70, 70, 70, 70],
        ],
        "{lines:?}"
    );
    let f = facts(&lines);
    let (free, total): (u64, u64) = f["mem"]
        .strip_prefix("free ")
        .and_then(|s| s.split_once(" total "))
        .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
        .unwrap();
    assert_eq!(total - free, 70 * MIB, "cuMemGetInfo counts pool memory");
}

#[test]
fn a_destroyed_pool_keeps_live_allocations_until_they_are_freed() {
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let mut a = Probe::spawn(
        &sim,
        &[],
        &[
            "init",
            "retain",
            "0",
            "pool-create",
            "0",
            "pool-threshold",
            "max",
            "pool-alloc",
            "32",
            "pool-alloc",
            "64",
            "free-async",
            "sync",
            "pool-destroy",
            "ready",
            "wait",
            "free-async",
            "sync",
            "ready",
            "wait",
        ],
    );
    assert_eq!(a.expect("pool-destroy"), "pool-destroy 0");
    a.expect("ready");
    let pid = a.child.id();
    // The freed 64 MiB went back at destroy; the live 32 MiB stays.
    assert_eq!(nvml_procs(&sim).get(&pid), Some(&(32 * MIB)));
    a.next();
    a.expect("ready");
    assert_eq!(nvml_procs(&sim).get(&pid), Some(&0));
    assert!(a.finish().success());
}

#[test]
fn host_pools_take_no_device_memory_and_max_size_caps_a_pool() {
    let sim = SimHandle::start(SimOptions::from_toml("[device]\nmemory = \"1GiB\"\n").unwrap())
        .expect("sim");
    let lines = run(
        &sim,
        &[
            "init",
            "retain",
            "0",
            "pool-create-host",
            // More than the device has: host memory.
            "pool-alloc",
            "1100",
            "pool-attr",
            "mem-info",
            "free-async",
            "sync",
            "pool-attr",
            "pool-create-max",
            "0",
            "8",
            "pool-alloc",
            "6",
            "pool-alloc",
            "4",
            "pool-alloc",
            "2",
            "pool-attr",
        ],
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("alloc"))
            .collect::<Vec<_>>(),
        ["alloc ok", "alloc ok", "alloc err 2", "alloc ok"],
        "{lines:?}"
    );
    assert_eq!(
        pool_lines(&lines),
        vec![[1100, 1100, 1100, 1100], [0, 0, 1100, 1100], [8, 8, 8, 8]],
        "{lines:?}"
    );
    let f = facts(&lines);
    assert_eq!(
        f["mem"],
        format!("free {} total {}", 1024 * MIB, 1024 * MIB),
        "a host pool is not device memory"
    );
}

#[test]
fn ipc_requests_are_checked_and_exports_go_with_their_owner() {
    use vgpu_sim::client::{ipc_request, ClientError};
    use vgpu_sim::daemon::{
        CMD_IPC_EVENT_MARK, CMD_IPC_EVENT_WAIT, CMD_IPC_EXPORT, CMD_IPC_FORGET, CMD_IPC_OPEN,
        STATUS_BAD_REQUEST, STATUS_DENIED, STATUS_GONE,
    };
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    let dir = sim.dir().to_path_buf();
    let refused = |r: Result<_, ClientError>| match r {
        Err(ClientError::Refused { status, .. }) => status,
        Ok(_) => 0,
        Err(e) => panic!("{e}"),
    };
    // This test process never registered: it may not export.
    let b = vgpu_sim::backing::Backing::new(4096).unwrap();
    assert_eq!(
        refused(ipc_request(&dir, CMD_IPC_EXPORT, 4096, 0, Some(b.fd()))),
        STATUS_BAD_REQUEST
    );
    // Unknown tokens, wrong nonces: nothing to open, wait on or forget.
    assert_eq!(
        refused(ipc_request(&dir, CMD_IPC_OPEN, 7, 7, None)),
        STATUS_GONE
    );
    assert_eq!(
        refused(ipc_request(&dir, CMD_IPC_EVENT_WAIT, 7 << 32 | 7, 0, None)),
        STATUS_GONE
    );
    assert_eq!(
        refused(ipc_request(&dir, CMD_IPC_FORGET, 7, 7, None)),
        STATUS_DENIED
    );
    assert_eq!(
        refused(ipc_request(&dir, CMD_IPC_EVENT_MARK, 7 << 32 | 7, 1, None)),
        STATUS_DENIED
    );
    // A registered exporter's memory opens (with its size) while it lives
    // and is gone once it is killed.
    let mut p = Probe::spawn(
        &sim,
        &[],
        &["init", "retain", "0", "ipc-export", "3", "ready", "wait"],
    );
    let line = p.expect("ipc ");
    let hex = line.trim_start_matches("ipc ");
    let bytes: Vec<u8> = (0..24)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let (token, nonce) = (word(0) as u32, (word(0) >> 32) as u32);
    let (size, offset) = (word(8), word(16));
    assert_eq!(size, 3 * MIB, "the handle names the allocation's size");
    p.expect("ready");
    let (_, span, fd) = ipc_request(&dir, CMD_IPC_OPEN, token.into(), nonce.into(), None)
        .expect("open while the owner lives");
    assert!(
        span >= offset + size,
        "the shared memory holds the allocation"
    );
    assert!(fd.is_some());
    assert_eq!(
        refused(ipc_request(
            &dir,
            CMD_IPC_OPEN,
            token.into(),
            u64::from(nonce) ^ 1,
            None
        )),
        STATUS_GONE,
        "a wrong nonce opens nothing"
    );
    p.child.kill().unwrap();
    let _ = p.child.wait();
    wait_until("the exporter's record released", || {
        sim.state().unwrap().used_bytes(0) == 0
    });
    wait_until("its export forgotten", || {
        refused(ipc_request(
            &dir,
            CMD_IPC_OPEN,
            token.into(),
            nonce.into(),
            None,
        )) == STATUS_GONE
    });
    // The daemon still serves.
    assert_eq!(
        run(&sim, &["init", "retain", "0", "alloc", "1"]),
        vec!["alloc ok".to_string()]
    );
}
