//! The SM limiter in libvgpu.so, end to end: real processes (the C
//! launcher, `tests/c/launcher.c`) on one simulated GPU, the truth from the
//! simulator's kernel timeline. Bands (+7 / -12 points over windows of a
//! second or more, measured: see `OVER`/`UNDER`) are what a loaded 2-core
//! machine cannot fail falsely; the tight figures are `vgpu bench sm`'s.
//!
//! One simulated machine for the file, one scenario at a time (they share
//! the device's time, so they must not overlap).
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use vgpu_region::limits::{self, Limits};
use vgpu_region::Region;

fn machine() -> &'static SimHandle {
    static SIM: OnceLock<SimHandle> = OnceLock::new();
    SIM.get_or_init(|| {
        let text = "profile = \"zero\"\ndevices = 1\n[device]\nsms = 132\n";
        let opts = SimOptions::from_toml(text).expect("sim options");
        SimHandle::start(opts).unwrap_or_else(|e| panic!("start sim: {e}"))
    })
}

/// One scenario at a time on the machine.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn launcher() -> PathBuf {
    c_program("launcher")
}

/// A launcher process and what it printed so far.
struct Tenant {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
    pid: u32,
}

impl Tenant {
    fn spawn(cache: &Path, args: &[&str], extra: &[(&str, &str)]) -> Tenant {
        let env = env(machine(), Some(cache), extra);
        let mut c = command(&launcher(), args, &env);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().expect("spawn launcher");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l2.lock().unwrap().push(line);
            }
        });
        let mut t = Tenant {
            child,
            stdin,
            lines,
            pid: 0,
        };
        t.pid = t
            .wait_for("pid=", Duration::from_secs(30))
            .trim_start_matches("pid=")
            .parse()
            .expect("pid");
        t
    }

    /// The first line starting with `prefix`, waiting up to `limit`.
    fn wait_for(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return l.clone();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "launcher exited ({st}) before {prefix:?}: {:?}",
                    self.lines.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {prefix:?} within {limit:?}: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for "done"; the windows it reported: (path, start, end, launches).
    fn windows(&mut self, limit: Duration) -> Vec<(String, u64, u64, u64)> {
        self.wait_for("done", limit);
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 5 && f[0] == "window").then(|| {
                    (
                        f[1].to_string(),
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                        f[4].parse().unwrap(),
                    )
                })
            })
            .collect()
    }

    fn fact(&self, key: &str) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {key}"))
            .parse()
            .unwrap()
    }

    /// The number after `WORD PATH` on a line starting with `word`.
    fn fact_word(&self, word: &str) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[0] == word).then(|| f[2].parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {word} line"))
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().expect("wait");
        assert!(st.success(), "launcher failed: {st}");
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        // A failed assertion must not leave a launcher holding the device.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Percent of `[from, to)` the device spent on `pids`' kernels.
fn share(pids: &[u32], from: u64, to: u64) -> f64 {
    let st = machine().state().expect("sim state");
    let busy: u64 = st
        .kernels(0, from, to)
        .iter()
        .filter(|(p, _, _)| pids.contains(p))
        .map(|&(_, s, e)| e.min(to).saturating_sub(s.max(from)))
        .sum();
    busy as f64 * 100.0 / (to - from) as f64
}

/// The band, from 153 shares measured in 3 runs of this file on a 2-core
/// machine at load average 11 (three other builds beside it): over the
/// target by at most +4.8 points (median |off| 1.1, p95 5.6), under it by
/// up to 11.3 when the loaded CPU starves the tenant itself. Over-granting
/// is the limiter's failure, so that side is tight; under-delivery on a
/// starved CPU is not, so that side has room.
const OVER: f64 = 7.0;
const UNDER: f64 = 12.0;

fn in_band(what: &str, got: f64, target: f64) {
    eprintln!(
        "BAND {what}: {got:.1} % for {target} (off {:+.1})",
        got - target
    );
    assert!(
        got <= target + OVER && got >= target - UNDER,
        "{what}: {got:.1} % is outside {target} +{OVER} / -{UNDER}"
    );
}

/// A container directory: its region path and limits file.
struct Container {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    file: PathBuf,
}

fn container(file: Option<&str>) -> Container {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("region.cache");
    let f = limits::path_for_region(&cache);
    if let Some(text) = file {
        std::fs::write(&f, text).unwrap();
    }
    Container {
        _dir: dir,
        cache,
        file: f,
    }
}

impl Container {
    fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v = vec![("LIBVGPU_LIMITS_FILE", self.file.to_str().unwrap())];
        v.extend_from_slice(extra);
        v
    }

    /// Rewrites the limits file as `vgpu limit`/`vgpu suspend` do: the
    /// file, then the region's display copy and generation bump.
    fn set(&self, f: impl FnOnce(&mut Limits)) {
        let mut l = limits::read_limits_file(&self.file).unwrap_or_default();
        f(&mut l);
        limits::write_limits_file_atomic(&self.file, &l).unwrap();
        let r = Region::open(&self.cache).expect("region");
        r.write_display_copy(&l).unwrap();
    }

    fn snapshot(&self) -> vgpu_region::Snapshot {
        Region::open(&self.cache).expect("region").snapshot()
    }

    fn slot_of(&self, pid: u32) -> vgpu_region::SlotSnapshot {
        self.snapshot()
            .slots
            .into_iter()
            .find(|s| s.pid == pid)
            .unwrap_or_else(|| panic!("no slot of {pid}"))
    }
}

const ALL_PATHS: &str =
    "kernel,ex,coop,graph,kernel_ptsz,ex_ptsz,coop_ptsz,graph_ptsz,multi,capture";

/// Every launch path (`cuLaunchCooperativeKernelMultiDevice` and a
/// stream capture's graph included) through every route, limited to 20 % (four
/// containers at once, 80 % of the device), and an unlimited container
/// beside them that pays no pacing.
#[test]
fn every_path_and_route_is_paced_and_unlimited_pays_nothing() {
    let _x = exclusive();
    let routes = ["direct", "dlsym", "proc11", "proc12"];
    let cs: Vec<Container> = routes
        .iter()
        .map(|_| container(Some("vgpu-limits 1\ndevice * sm=20\n")))
        .collect();
    let free = container(None);
    let mut ts: Vec<Tenant> = routes
        .iter()
        .zip(&cs)
        .map(|(r, c)| {
            Tenant::spawn(
                &c.cache,
                &[r, ALL_PATHS, "1200", "1000", "async"],
                &c.env(&[]),
            )
        })
        .collect();
    let mut unlimited = Tenant::spawn(
        &free.cache,
        &["direct", "kernel,graph,coop_ptsz", "3000", "1000", "async"],
        &free.env(&[]),
    );
    for (t, r) in ts.iter_mut().zip(routes) {
        let w = t.windows(Duration::from_secs(90));
        assert_eq!(w.len(), 10, "{r}: {w:?}");
        for (path, a, b, n) in &w {
            assert!(*n > 0, "{r} {path}: no launch");
            in_band(&format!("{r} {path}"), share(&[t.pid], *a, *b), 20.0);
        }
        // 50 captured launches of 1 ms at 20 % would take about 250 ms if
        // they were paced; they do not run, so they are not.
        let us = t.fact_word("capture");
        assert!(us < 100_000, "{r}: capturing 50 launches took {us} us");
    }
    let w = unlimited.windows(Duration::from_secs(60));
    let s = unlimited_slot(&free, unlimited.pid);
    assert_eq!(s.limiter.state, "Unlimited", "{:?}", s.limiter);
    assert!(
        s.limiter.devices.iter().all(|d| d.waited_ns == 0),
        "an unlimited tenant waited: {:?}",
        s.limiter.devices
    );
    for (path, a, b, _) in &w {
        let got = share(&[unlimited.pid], *a, *b);
        assert!(got > 10.0, "unlimited {path}: only {got:.1} %");
    }
    for c in &cs {
        // Utilization is published for limited and unlimited alike.
        assert!(c.snapshot().devices[0].pacing.util_at_ns > 0);
    }
    assert!(free.snapshot().devices[0].pacing.util_at_ns > 0);
    for t in ts {
        t.finish();
    }
    unlimited.finish();
}

fn unlimited_slot(c: &Container, pid: u32) -> vgpu_region::SlotSnapshot {
    c.slot_of(pid)
}

/// A launch-then-synchronize loop is held too.
#[test]
fn a_synchronizing_loop_is_held() {
    let _x = exclusive();
    let c = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
    let mut t = Tenant::spawn(
        &c.cache,
        &["direct", "kernel,kernel_ptsz", "2500", "1000", "sync"],
        &c.env(&[]),
    );
    for (path, a, b, _) in t.windows(Duration::from_secs(60)) {
        in_band(
            &format!("sync {path}"),
            share(&[t.pid], a + 500_000_000, b),
            30.0,
        );
    }
    t.finish();
}

/// CUDA 12's library management (what current Python JIT stacks call):
/// tenants that load no module, only a library, and launch its kernel
/// either as the `CUkernel` itself where a `CUfunction` goes or through
/// `cuKernelGetFunction`, are held to 30 % and their waits accounted like
/// any other launch's. Nothing of the library family is hooked: the
/// launch entry points are, whatever the handle.
#[test]
fn launches_through_a_library_kernel_are_paced() {
    let _x = exclusive();
    let runs = [
        ("library", "proc12", "kernel,ex,kernel_ptsz"),
        ("library_function", "dlsym", "kernel,coop"),
    ];
    let cs: Vec<Container> = runs
        .iter()
        .map(|_| container(Some("vgpu-limits 1\ndevice * sm=30\n")))
        .collect();
    let mut ts: Vec<Tenant> = runs
        .iter()
        .zip(&cs)
        .map(|((source, route, paths), c)| {
            Tenant::spawn(
                &c.cache,
                &[route, paths, "1500", "1000", "async"],
                &c.env(&[("LAUNCHER_KERNEL", source)]),
            )
        })
        .collect();
    for ((t, c), (source, _, paths)) in ts.iter_mut().zip(&cs).zip(runs) {
        let w = t.windows(Duration::from_secs(90));
        assert_eq!(w.len(), paths.split(',').count(), "{source}: {w:?}");
        for (path, a, b, n) in &w {
            assert!(*n > 0, "{source} {path}: no launch");
            in_band(&format!("{source} {path}"), share(&[t.pid], *a, *b), 30.0);
        }
        let s = c.slot_of(t.pid);
        assert!(
            s.limiter.devices.iter().any(|d| d.waited_ns > 0),
            "{source}: the limiter never held a launch: {:?}",
            s.limiter
        );
        assert!(c.snapshot().devices[0].pacing.util_at_ns > 0);
    }
    for t in ts {
        t.finish();
    }
}

/// Two containers at 30 % and 70 % on one device, each in its band.
#[test]
fn two_tenants_at_30_and_70_each_hold_their_share() {
    let _x = exclusive();
    let a = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
    let b = container(Some("vgpu-limits 1\ndevice * sm=70\n"));
    let mut ta = Tenant::spawn(
        &a.cache,
        &["direct", "kernel", "7000", "200", "async"],
        &a.env(&[]),
    );
    let mut tb = Tenant::spawn(
        &b.cache,
        &["direct", "kernel", "7000", "200", "async"],
        &b.env(&[]),
    );
    let wa = ta.windows(Duration::from_secs(60));
    let wb = tb.windows(Duration::from_secs(60));
    // The common span, after a second of settling.
    let from = wa[0].1.max(wb[0].1) + 1_000_000_000;
    let to = wa[0].2.min(wb[0].2);
    assert!(to > from + 4_000_000_000, "overlap too short");
    in_band("30 % tenant", share(&[ta.pid], from, to), 30.0);
    in_band("70 % tenant", share(&[tb.pid], from, to), 70.0);
    ta.finish();
    tb.finish();
}

/// `disable` turns pacing off; `default` and `force` pace a lone tenant.
#[test]
fn policies_disable_default_and_force() {
    let _x = exclusive();
    for (policy, limited) in [("disable", false), ("default", true), ("force", true)] {
        let c = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
        let env = c.env(&[("GPU_CORE_UTILIZATION_POLICY", policy)]);
        let mut t = Tenant::spawn(
            &c.cache,
            &["direct", "kernel", "2500", "500", "async"],
            &env,
        );
        let w = t.windows(Duration::from_secs(60));
        let got = share(&[t.pid], w[0].1 + 500_000_000, w[0].2);
        let state = c.slot_of(t.pid).limiter.state;
        if limited {
            in_band(&format!("policy {policy}"), got, 30.0);
            assert_ne!(state, "Disabled");
        } else {
            assert!(got > 80.0, "policy disable: {got:.1} %");
            assert_eq!(state, "Disabled");
        }
        t.finish();
    }
}

/// `suspended 1` stops new launches until resumed; queries still answer.
#[test]
fn suspend_stops_launches_until_resume_and_queries_answer() {
    let _x = exclusive();
    let c = container(Some("vgpu-limits 1\ndevice * sm=40\n"));
    let mut t = Tenant::spawn(
        &c.cache,
        &["direct", "kernel", "7000", "500", "async"],
        &c.env(&[("LAUNCHER_QUERY", "1")]),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let t_suspend = vgpu_region::monotonic_ns();
    c.set(|l| l.suspended = Some(true));
    std::thread::sleep(Duration::from_millis(2500));
    let t_resume = vgpu_region::monotonic_ns();
    c.set(|l| l.suspended = None);
    let w = t.windows(Duration::from_secs(60));
    let end = w[0].2;
    // Queued work drains within a bank (tens of ms); then nothing runs.
    let during = share(&[t.pid], t_suspend + 300_000_000, t_resume);
    assert!(during < 2.0, "suspended but running {during:.1} %");
    in_band(
        "after resume",
        share(&[t.pid], t_resume + 500_000_000, end),
        40.0,
    );
    assert!(t.fact("queries") > 100, "queries did not run");
    assert!(
        t.fact("query_max_us") < 200_000,
        "a query waited {} us",
        t.fact("query_max_us")
    );
    t.finish();
}

/// `vgpu limit --sm` through the limits file reaches every process of the
/// container within a control period, and `none` removes the limit.
#[test]
fn a_live_change_reaches_every_process_of_the_container() {
    let _x = exclusive();
    let c = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
    let args = ["direct", "kernel", "9000", "500", "async"];
    // Info level: each process's "limits file changed" line lands in the
    // test's output, so a miss shows which process read what, and when.
    let info = [("LIBCUDA_LOG_LEVEL", "3")];
    let mut a = Tenant::spawn(&c.cache, &args, &c.env(&info));
    let mut b = Tenant::spawn(&c.cache, &args, &c.env(&info));
    let pids = [a.pid, b.pid];
    let t0 = vgpu_region::monotonic_ns();
    std::thread::sleep(Duration::from_millis(3000));
    let t1 = vgpu_region::monotonic_ns();
    c.set(|l| l.line_mut(&limits::Device::Any).sm = Some(60));
    std::thread::sleep(Duration::from_millis(3000));
    let t2 = vgpu_region::monotonic_ns();
    c.set(|l| l.line_mut(&limits::Device::Any).sm = None);
    let wa = a.windows(Duration::from_secs(60));
    let wb = b.windows(Duration::from_secs(60));
    let end = wa[0].2.min(wb[0].2);
    let s = 1_000_000_000;
    in_band("container at 30 %", share(&pids, t0 + s, t1), 30.0);
    in_band("container at 60 %", share(&pids, t1 + s / 2, t2), 60.0);
    let free = share(&pids, t2 + s / 2, end);
    // Each process's own share and the phase's length say which way a
    // miss went: one process still paced, both (the change never read), or
    // a phase cut short.
    assert!(
        free > 80.0,
        "no limit, yet {free:.1} % (per process {:.1} % and {:.1} %, over {} ms after the change)",
        share(&pids[..1], t2 + s / 2, end),
        share(&pids[1..], t2 + s / 2, end),
        end.saturating_sub(t2) / 1_000_000
    );
    for p in pids {
        // Both processes ran in every phase (one bucket, shared).
        for (x, y) in [(t0 + s, t1), (t1 + s / 2, t2), (t2 + s / 2, end)] {
            assert!(share(&[p], x, y) > 3.0, "process {p} starved in a phase");
        }
    }
    a.finish();
    b.finish();
}

/// Identity failing at every tier: the limit still holds, and the slot
/// says the limiter is degraded and why.
#[test]
fn identity_failing_at_every_tier_still_limits_visibly() {
    let _x = exclusive();
    let c = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("no-broker.sock");
    let env = c.env(&[
        ("LIBVGPU_IDENTITY_TIERS", "broker,procfs"),
        ("LIBVGPU_HOSTPID_BROKER", absent.to_str().unwrap()),
    ]);
    let mut t = Tenant::spawn(
        &c.cache,
        &["direct", "kernel", "3000", "500", "async"],
        &env,
    );
    let w = t.windows(Duration::from_secs(60));
    in_band(
        "identity failed",
        share(&[t.pid], w[0].1 + s(1), w[0].2),
        30.0,
    );
    let slot = c.slot_of(t.pid);
    assert_eq!(slot.limiter.state, "DegradedIdentity", "{:?}", slot.limiter);
    assert_eq!(slot.limiter.reason, "IdentityFailed", "{:?}", slot.limiter);
    assert_eq!(slot.identity.state, "Failed");
    t.finish();
}

/// No usable region and a limit configured: the process paces on a
/// private bucket (fail closed), never unlimited.
#[test]
fn an_unusable_region_fails_closed_on_a_private_bucket() {
    let _x = exclusive();
    let c = container(Some("vgpu-limits 1\ndevice * sm=30\n"));
    // A directory where the region file should be: it cannot be mapped.
    std::fs::create_dir(&c.cache).unwrap();
    let mut t = Tenant::spawn(
        &c.cache,
        &["direct", "kernel", "3000", "500", "async"],
        &c.env(&[]),
    );
    let w = t.windows(Duration::from_secs(60));
    in_band(
        "private bucket",
        share(&[t.pid], w[0].1 + s(1), w[0].2),
        30.0,
    );
    t.finish();
}

fn s(n: u64) -> u64 {
    n * 1_000_000_000
}

/// Priority: the node side's hold (`hold N` in a low-priority container's
/// limits file, written while a busy high-priority container shares the
/// device) holds the low-priority container down, and never a
/// high-priority one.
#[test]
fn a_priority_hold_holds_a_low_priority_container_down() {
    let _x = exclusive();
    let high = container(Some("vgpu-limits 1\npriority 0\nhold 10\n"));
    let low = container(Some("vgpu-limits 1\npriority 1\nhold 10\n"));
    let args = ["direct", "kernel", "4000", "500", "async"];
    let mut th = Tenant::spawn(&high.cache, &args, &high.env(&[]));
    let mut tl = Tenant::spawn(&low.cache, &args, &low.env(&[]));
    let wh = th.windows(Duration::from_secs(60));
    let wl = tl.windows(Duration::from_secs(60));
    let from = wh[0].1.max(wl[0].1) + s(1);
    let to = wh[0].2.min(wl[0].2);
    let (h, l) = (share(&[th.pid], from, to), share(&[tl.pid], from, to));
    assert!(l <= 25.0, "low priority at {l:.1} % despite a 10 % hold");
    assert!(h >= 60.0, "high priority only {h:.1} %");
    assert_eq!(low.slot_of(tl.pid).limiter.state, "Held");
    assert_eq!(high.slot_of(th.pid).limiter.state, "Unlimited");
    th.finish();
    tl.finish();
}

/// Lending (docs/limiter.md, "Guarantees and ceilings"): a guarantee of
/// 30 with a ceiling of 60 reaches 60 alone on its board; beside it, a
/// container with no cores on the same board is best effort: the
/// guaranteed one borrows what is unused up to its ceiling of 100, the
/// best-effort one keeps only its floor.
#[test]
fn a_ceiling_lends_idle_time_and_best_effort_gets_what_is_left() {
    let _x = exclusive();
    let boards = tempfile::tempdir().unwrap();
    let b = boards.path().display().to_string();
    let alone = container(Some(&format!(
        "vgpu-limits 1\ndevice * sm=30\nsm-ceiling * 60\nboard {b} alone\n"
    )));
    let mut t = Tenant::spawn(
        &alone.cache,
        &["direct", "kernel", "5000", "200", "async"],
        &alone.env(&[]),
    );
    let w = t.windows(Duration::from_secs(60));
    in_band(
        "30 % with a ceiling of 60, alone",
        share(&[t.pid], w[0].1 + 1_000_000_000, w[0].2),
        60.0,
    );
    t.finish();
    // The entry went stale with its container: a new pair does not see it.
    std::thread::sleep(Duration::from_millis(200));
    let g = container(Some(&format!(
        "vgpu-limits 1\ndevice * sm=30\nsm-ceiling * 100\nboard {b} guaranteed\n"
    )));
    let be = container(Some(&format!("vgpu-limits 1\nboard {b} besteffort\n")));
    let mut tg = Tenant::spawn(
        &g.cache,
        &["direct", "kernel", "5000", "200", "async"],
        &g.env(&[]),
    );
    let mut tb = Tenant::spawn(
        &be.cache,
        &["direct", "kernel", "5000", "200", "async"],
        &be.env(&[]),
    );
    let wg = tg.windows(Duration::from_secs(60));
    let wb = tb.windows(Duration::from_secs(60));
    let from = wg[0].1.max(wb[0].1) + 1_000_000_000;
    let to = wg[0].2.min(wb[0].2);
    assert!(to > from + 2_000_000_000, "overlap too short");
    let (sg, sb) = (share(&[tg.pid], from, to), share(&[tb.pid], from, to));
    eprintln!("BAND lending: guaranteed {sg:.1} %, best effort {sb:.1} %");
    // Without the board they would time-slice 50/50.
    assert!(sg >= 75.0, "the guaranteed one borrowed only to {sg:.1} %");
    assert!(sb <= 12.0, "best effort took {sb:.1} %");
    // The board shows both, as the node side and `vgpu inspect` read it.
    let snap = be.snapshot();
    let uuid = &snap.devices[0].uuid;
    let mut entries = Vec::new();
    vgpu_region::board::read(
        &vgpu_region::board::gpu_dir(boards.path(), uuid),
        vgpu_region::monotonic_ns(),
        &mut entries,
    )
    .unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["besteffort", "guaranteed"], "{entries:?}");
    assert_eq!(entries[1].1.guarantee_ppm, 300_000);
    assert_eq!(entries[1].1.ceiling_ppm, 1_000_000);
    assert_eq!(entries[0].1.guarantee_ppm, 0);
    tg.finish();
    tb.finish();
}
