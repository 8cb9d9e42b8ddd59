//! Host-PID identity inside libvgpu.so, with real processes on the
//! simulated driver: workers in their own PID namespaces (`unshare`), a real
//! `vgpu broker`, a host procfs bind mount, 32 concurrent NVML probes with the
//! probe lock held by a process that is then SIGKILLed, and every tier
//! failing with an SM limit configured. Each test reads what the worker wrote
//! into its region slot while the worker still holds it.
//!
//! Run as root (unshare, mount); needs `vgpu` and libvgpu.so built:
//! `cargo build -p vgpu -p vgpu-sim-cuda -p vgpu-sim-nvml -p vgpu-preload`.
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_void, CStr};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vgpu_cuda_abi::{sig, CUcontext, CUfunction, CUmodule, CUresult, CUstream};
use vgpu_region::{Region, SlotSnapshot, Snapshot};

// ------------------------------------------------------------ worker side

type Ptr = *mut c_void;

fn sym<F: Copy>(h: Ptr, name: &CStr) -> F {
    // SAFETY: valid handle and NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?} not found");
    // SAFETY: `sym!` asks for `sig::<name>`, the list's C type of the
    // symbol (checked against cuda.h).
    unsafe { std::mem::transmute_copy::<Ptr, F>(&p) }
}

/// The driver function `name`, typed as the workspace's one list types it.
macro_rules! sym {
    ($h:expr, $name:ident) => {
        sym::<sig::$name>(
            $h,
            CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
                .expect("a symbol name"),
        )
    };
}

fn check(what: &str, r: CUresult) {
    assert_eq!(r.0, 0, "{what} returned CUresult {}", r.0);
}

fn say(kv: &[(&str, String)]) {
    let line: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut out = std::io::stdout();
    let _ = writeln!(out, "\nRESULT {}", line.join(" "));
    let _ = out.flush();
}

/// A worker: the steps of `VGPU_IDW_STEPS` (comma-separated): `init`
/// (cuInit), `ctx` (retain + set the primary context of device 0, load the
/// busy kernel), `launch`, `sleepMS`, `report` (a RESULT line), `wait` (one
/// line on stdin), `hold` (stdin to EOF).
#[test]
#[ignore = "a subprocess entry point, run only by this file's tests (--ignored)"]
fn worker_entry() {
    let Ok(steps) = std::env::var("VGPU_IDW_STEPS") else {
        return;
    };
    // SAFETY: NUL-terminated name, valid flags; the library stays loaded.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen libcuda.so.1");
    let init = sym!(h, cuInit);
    let retain = sym!(h, cuDevicePrimaryCtxRetain);
    let set_current = sym!(h, cuCtxSetCurrent);
    let load = sym!(h, cuModuleLoadData);
    let get_fn = sym!(h, cuModuleGetFunction);
    let launch = sym!(h, cuLaunchKernel);
    let sync = sym!(h, cuCtxSynchronize);
    let mut func = CUfunction::NULL;
    let mut launches = 0;
    let mut stdin = std::io::stdin().lock();
    for step in steps.split(',') {
        match step {
            // SAFETY: the driver's cuInit with flags 0.
            "init" => check("cuInit", unsafe { init(0) }),
            "ctx" => {
                let mut ctx = CUcontext::NULL;
                // SAFETY: valid out-pointer, device 0 exists on the sim.
                check("cuDevicePrimaryCtxRetain", unsafe { retain(&mut ctx, 0) });
                // SAFETY: the context just retained.
                check("cuCtxSetCurrent", unsafe { set_current(ctx) });
                let image = c"vgpu-sim-kernel name=busy block_us=5";
                let mut m = CUmodule::NULL;
                // SAFETY: valid out-pointer and a NUL-terminated image.
                check("cuModuleLoadData", unsafe {
                    load(&mut m, image.as_ptr().cast())
                });
                // SAFETY: valid out-pointer, the module just loaded, a
                // NUL-terminated name.
                check("cuModuleGetFunction", unsafe {
                    get_fn(&mut func, m, c"busy".as_ptr())
                });
            }
            "launch" => {
                // SAFETY: a 1x1x1 launch of a parameterless kernel of the
                // current context, on the default stream.
                let r = unsafe {
                    launch(
                        func,
                        1,
                        1,
                        1,
                        1,
                        1,
                        1,
                        0,
                        CUstream::NULL,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                check("cuLaunchKernel", r);
                // SAFETY: no arguments; a current context exists.
                check("cuCtxSynchronize", unsafe { sync() });
                launches += 1;
            }
            "report" => say(&[
                ("pid", std::process::id().to_string()),
                ("launches", launches.to_string()),
            ]),
            "wait" => {
                let mut l = String::new();
                let _ = stdin.read_line(&mut l);
            }
            "hold" => {
                let mut l = String::new();
                while stdin.read_line(&mut l).map(|n| n > 0).unwrap_or(false) {}
            }
            s => match s.strip_prefix("sleep").and_then(|ms| ms.parse().ok()) {
                Some(ms) => std::thread::sleep(Duration::from_millis(ms)),
                None => panic!("unknown worker step {s}"),
            },
        }
    }
    std::process::exit(0);
}

// ------------------------------------------------------------ parent side

/// A worker process and the ends of its pipes.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// `wrapper` (e.g. unshare) runs the test binary as a worker.
    fn spawn(wrapper: &[&str], steps: &str, env: &[(String, String)]) -> Worker {
        let exe = std::env::current_exe().unwrap();
        let mut c = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = command(Path::new(w), rest, env);
                c.arg(&exe);
                c
            }
            None => command(&exe, &[], env),
        };
        c.args([
            "worker_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VGPU_IDW_STEPS", steps)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn worker");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker {
            child,
            stdin,
            stdout,
        }
    }

    /// The next RESULT line's `key=value` pairs.
    fn result(&mut self) -> BTreeMap<String, String> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            if n == 0 {
                let st = self.child.wait().unwrap();
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!("worker ended ({st}) without a RESULT line; stderr:\n{err}");
            }
            if let Some((_, rest)) = line.split_once("RESULT ") {
                return rest
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
            }
        }
    }

    fn go(&mut self) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(b"go\n").unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin, waits, returns stderr; the worker must succeed.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "worker failed: {}\n{err}", out.status);
        err
    }
}

/// A `vgpu broker` process, stopped (SIGTERM) on drop.
struct BrokerProc {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl BrokerProc {
    fn start() -> BrokerProc {
        // tempdir: root-owned, 0700, as the client requires of the parent.
        Self::start_in(tempfile::tempdir().unwrap())
    }

    /// Serves `<dir>/hostpid.sock`.
    fn start_in(dir: tempfile::TempDir) -> BrokerProc {
        let vgpu = vgpu_sim::locate_artifact("vgpu").expect("vgpu built (cargo build -p vgpu)");
        let socket = dir.path().join("hostpid.sock");
        let child = Command::new(vgpu)
            .arg("broker")
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let b = BrokerProc {
            child,
            socket,
            _dir: dir,
        };
        wait_for("broker socket", || b.socket.exists());
        b
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// SIGKILLs a process group on drop (also when a test fails midway).
struct KillGroup(i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this test created.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < end, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn snapshot(cache: &Path) -> Snapshot {
    Region::open_read_only(cache).unwrap().snapshot()
}

/// `NStgid` of a live process as this (host) process sees it.
fn nstgid(pid: u32) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    vgpu_identity::parse_nstgid(s.as_bytes())
        .unwrap()
        .as_slice()
        .to_vec()
}

/// The one child of `pid` (the worker `unshare --fork` started).
fn only_child(pid: u32) -> u32 {
    let c = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let kids: Vec<u32> = c.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(kids.len(), 1, "children of {pid}: {kids:?}");
    kids[0]
}

fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn phase(sl: &SlotSnapshot, name: &str) -> u64 {
    sl.phases
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, t)| *t)
}

fn fallback(sl: &SlotSnapshot, name: &str) -> u64 {
    sl.fallbacks
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, c)| *c)
}

/// A container: one sim, one region with an SM limit.
struct Container {
    sim: SimHandle,
    dir: tempfile::TempDir,
}

impl Container {
    fn new() -> Container {
        Container {
            sim: sim(1),
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn cache(&self) -> PathBuf {
        self.dir.path().join("region.cache")
    }
    fn env(&self, sm: bool, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut e: Vec<(&str, &str)> = vec![("LIBCUDA_LOG_LEVEL", "2")];
        if sm {
            e.push(("CUDA_DEVICE_SM_LIMIT", "50"));
        }
        e.extend_from_slice(extra);
        env(&self.sim, Some(&self.cache()), &e)
    }
}

const NS: [&str; 4] = ["unshare", "--pid", "--fork", "--mount-proc"];

#[test]
fn namespaced_worker_gets_its_host_pid_from_the_broker() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    let c = Container::new();
    let b = BrokerProc::start();
    let sock = b.socket.display().to_string();
    let env = c.env(true, &[("LIBVGPU_HOSTPID_BROKER", &sock)]);
    let mut w = Worker::spawn(&NS, "init,ctx,launch,report,hold", &env);
    let unshare_pid = w.child.id();
    let r = w.result();
    assert_eq!(r["pid"], "1", "the worker is pid 1 in its namespace");
    let host = only_child(unshare_pid);
    assert_eq!(nstgid(host), vec![host, 1]);
    let snap = snapshot(&c.cache());
    assert_eq!(snap.slots.len(), 1);
    let sl = &snap.slots[0];
    assert_eq!(sl.pid, 1);
    assert_eq!(sl.host_pid, host, "slot: {sl:?}");
    assert_eq!(sl.identity.tier, "Broker");
    assert_eq!(sl.identity.state, "Resolved");
    assert_eq!(sl.identity.attempts, 1);
    assert_eq!(sl.identity.failure, 0);
    // Lazy: nothing ran inside cuInit.
    assert_eq!(phase(sl, "IdentityEnter"), 0);
    assert_eq!(phase(sl, "IdentityExit"), 0);
    let err = w.finish();
    assert!(!err.contains("host PID unknown"), "{err}");
}

#[test]
fn procfs_tier_gives_the_host_pid_and_refuses_the_private_proc() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    let c = Container::new();
    let hostproc = c.dir.path().join("hostproc");
    std::fs::create_dir(&hostproc).unwrap();
    // In a private mount namespace: the host's /proc bound aside, then the
    // new namespace's own /proc, then the worker.
    let script =
        r#"mount --bind /proc "$VGPU_IDW_HOSTPROC" && mount -t proc proc /proc && exec "$0" "$@""#;
    let wrap = [
        "unshare", "--pid", "--fork", "--mount", "--", "sh", "-c", script,
    ];
    let hp = hostproc.display().to_string();
    let good_env = c.env(
        true,
        &[
            ("LIBVGPU_IDENTITY_TIERS", "procfs"),
            ("LIBVGPU_HOST_PROCFS", &hp),
            ("VGPU_IDW_HOSTPROC", &hp),
        ],
    );
    let mut good = Worker::spawn(&wrap, "init,ctx,launch,report,hold", &good_env);
    let unshare_pid = good.child.id();
    assert_eq!(good.result()["pid"], "1");
    let host = only_child(unshare_pid);
    let bad_env = c.env(
        true,
        &[
            ("LIBVGPU_IDENTITY_TIERS", "procfs"),
            ("LIBVGPU_HOST_PROCFS", "/proc"),
        ],
    );
    let mut bad = Worker::spawn(&NS, "init,ctx,launch,report,hold", &bad_env);
    assert_eq!(bad.result()["pid"], "1");
    let snap = snapshot(&c.cache());
    assert_eq!(snap.slots.len(), 2);
    let resolved: Vec<&SlotSnapshot> = snap
        .slots
        .iter()
        .filter(|s| s.identity.state == "Resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{:?}", snap.slots);
    assert_eq!(resolved[0].host_pid, host);
    assert_eq!(resolved[0].identity.tier, "HostProcfs");
    let failed: Vec<&SlotSnapshot> = snap
        .slots
        .iter()
        .filter(|s| s.identity.state == "Failed")
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", snap.slots);
    assert_eq!(
        failed[0].identity.failure,
        u32::from(vgpu_identity::FailureCode::PROCFS_OWN_NAMESPACE.0),
        "the private /proc must be refused, not read as the host's"
    );
    assert_eq!(failed[0].host_pid, 0, "no guess is recorded");
    good.finish();
    let err = bad.finish();
    assert_eq!(err.matches("host PID unknown").count(), 1, "{err}");
    assert!(err.contains("PROCFS_OWN_NAMESPACE"), "{err}");
}

#[test]
fn probe_tier_32_namespaced_workers_identify_while_a_killed_holder_blocks_nobody() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    const N: usize = 32;
    let c = Container::new();
    let lock = c.dir.path().join("locks/hostpid.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    // The holder: flock(1) takes the lock (-o: the command does not inherit
    // it) and is then stopped: a prober frozen mid-probe.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(&lock)
        .args(["sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = KillGroup(holder.id() as i32);
    let taken = || {
        let f = std::fs::File::open(&lock).unwrap();
        // SAFETY: flock on a descriptor we own.
        let r = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        r != 0
    };
    wait_for("flock holder", || lock.exists() && taken());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(holder.id() as i32, libc::SIGSTOP) };

    let l = lock.display().to_string();
    let env = c.env(
        true,
        &[
            ("LIBVGPU_IDENTITY_TIERS", "probe"),
            ("LIBVGPU_HOSTPID_LOCK", &l),
        ],
    );
    let mut ws: Vec<Worker> = (0..N)
        .map(|_| Worker::spawn(&NS, "init,ctx,launch,report,hold", &env))
        .collect();
    // Every worker is inside its probe, waiting for the lock: slot Pending.
    wait_for("32 pending slots", || {
        let s = snapshot(&c.cache());
        s.slots.len() == N && s.slots.iter().all(|sl| sl.identity.state == "Pending")
    });
    let s = snapshot(&c.cache());
    assert!(
        s.slots.iter().all(|sl| sl.host_pid == 0),
        "nobody may resolve while the lock is held"
    );
    // SIGKILL the stopped holder: the kernel drops its lock. (Its `sleep`
    // never held it, -o; the group guard kills it at the end.)
    holder.kill().unwrap();
    holder.wait().unwrap();

    let mut expected = BTreeSet::new();
    for w in &mut ws {
        assert_eq!(w.result()["pid"], "1");
        let host = only_child(w.child.id());
        assert_eq!(nstgid(host), vec![host, 1]);
        expected.insert(host);
    }
    let snap = snapshot(&c.cache());
    assert_eq!(snap.slots.len(), N);
    let mut found = BTreeSet::new();
    for sl in &snap.slots {
        assert_eq!(sl.identity.state, "Resolved", "{sl:?}");
        assert_eq!(sl.identity.tier, "NvmlProbe", "{sl:?}");
        assert_eq!(sl.pid, 1);
        assert!(sl.identity.attempts >= 1);
        found.insert(sl.host_pid);
    }
    assert_eq!(found, expected, "each slot holds its own worker's host PID");
    for w in ws {
        let err = w.finish();
        assert!(!err.contains("host PID unknown"), "{err}");
    }
}

#[test]
fn all_tiers_failing_is_reported_retried_and_keeps_the_sm_limit() {
    let c = Container::new();
    let bogus = c.dir.path().join("not-proc");
    std::fs::create_dir(&bogus).unwrap();
    let sock = c.dir.path().join("absent.sock").display().to_string();
    let proc_ = bogus.display().to_string();
    let env = c.env(
        true,
        &[
            ("LIBVGPU_IDENTITY_TIERS", "broker,procfs"),
            ("LIBVGPU_HOSTPID_BROKER", &sock),
            ("LIBVGPU_HOST_PROCFS", &proc_),
        ],
    );
    // First need: the first context (and the first launch inside the
    // backoff, which must not retry); then, past the 1 s backoff, a launch
    // retries.
    let mut w = Worker::spawn(
        &[],
        "init,ctx,launch,report,wait,sleep1100,launch,report,hold",
        &env,
    );
    let pid: u32 = w.result()["pid"].parse().unwrap();
    let slot = |c: &Container| {
        snapshot(&c.cache())
            .slots
            .into_iter()
            .find(|s| s.pid == pid)
            .unwrap()
    };
    let first = slot(&c);
    assert_eq!(first.identity.state, "Failed", "{first:?}");
    assert_eq!(first.identity.tier, "HostProcfs", "the last tier tried");
    assert_eq!(
        first.identity.failure,
        u32::from(vgpu_identity::FailureCode::PROCFS_READ.0)
    );
    assert_eq!(first.identity.attempts, 2, "broker + procfs, once");
    assert_eq!(first.host_pid, 0);
    assert_eq!(fallback(&first, "IdentityTierFailed"), 2);
    w.go();
    w.result();
    let second = slot(&c);
    assert_eq!(second.identity.state, "Failed");
    assert_eq!(second.identity.attempts, 4, "one retry on the later launch");
    assert_eq!(fallback(&second, "IdentityTierFailed"), 4);
    // The SM limit is still configured and visible.
    let snap = snapshot(&c.cache());
    assert_eq!(snap.devices[0].limits.sm, 50);
    let err = w.finish();
    assert_eq!(
        err.matches("host PID unknown").count(),
        1,
        "one log line, not one per retry:\n{err}"
    );
    assert!(err.contains("SM limit stays configured"), "{err}");
    assert!(
        err.contains("BROKER_MISSING") && err.contains("PROCFS_READ"),
        "{err}"
    );
}

#[test]
fn eager_runs_inside_cuinit_and_lazy_without_sm_limit_is_not_needed() {
    let c = Container::new();
    let eager_env = c.env(
        false,
        &[
            ("LIBVGPU_IDENTITY", "eager"),
            ("LIBVGPU_IDENTITY_TIERS", "procfs"),
            ("LIBVGPU_HOST_PROCFS", "/proc"),
        ],
    );
    let mut eager = Worker::spawn(&[], "init,report,hold", &eager_env);
    let eager_pid: u32 = eager.result()["pid"].parse().unwrap();
    let mut lazy = Worker::spawn(&[], "init,ctx,launch,report,hold", &c.env(false, &[]));
    let lazy_pid: u32 = lazy.result()["pid"].parse().unwrap();
    let snap = snapshot(&c.cache());
    let e = snap.slots.iter().find(|s| s.pid == eager_pid).unwrap();
    let in_initial_ns =
        vgpu_identity::procfs::in_initial_pid_namespace(Path::new("/proc")).unwrap();
    if in_initial_ns {
        assert_eq!(e.identity.state, "Resolved", "{e:?}");
        assert_eq!(e.host_pid, eager_pid);
    } else {
        assert_eq!(e.identity.state, "Failed", "{e:?}");
    }
    let enter = phase(e, "IdentityEnter");
    let exit = phase(e, "IdentityExit");
    assert!(enter != 0 && exit >= enter, "{e:?}");
    assert!(enter >= phase(e, "RealInitExit") && exit <= phase(e, "WrapperExit"));
    let l = snap.slots.iter().find(|s| s.pid == lazy_pid).unwrap();
    assert_eq!(l.identity.state, "NotNeeded", "{l:?}");
    assert_eq!(l.host_pid, 0);
    assert_eq!(phase(l, "IdentityEnter"), 0);
    eager.finish();
    lazy.finish();
}

#[test]
fn a_failed_identity_recovers_on_a_later_launch_when_the_broker_appears() {
    let c = Container::new();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("hostpid.sock").display().to_string();
    let env = c.env(
        true,
        &[
            ("LIBVGPU_IDENTITY_TIERS", "broker"),
            ("LIBVGPU_HOSTPID_BROKER", &sock),
            ("LIBCUDA_LOG_LEVEL", "3"),
        ],
    );
    let mut w = Worker::spawn(
        &[],
        "init,ctx,launch,report,wait,sleep1100,launch,report,hold",
        &env,
    );
    let pid: u32 = w.result()["pid"].parse().unwrap();
    let slot = |c: &Container| {
        snapshot(&c.cache())
            .slots
            .into_iter()
            .find(|s| s.pid == pid)
            .unwrap()
    };
    let first = slot(&c);
    assert_eq!(first.identity.state, "Failed", "{first:?}");
    assert_eq!(
        first.identity.failure,
        u32::from(vgpu_identity::FailureCode::BROKER_MISSING.0)
    );
    assert_eq!(first.identity.attempts, 1);
    // The node's broker comes up; the next launch past the backoff retries.
    let _b = BrokerProc::start_in(dir);
    w.go();
    w.result();
    let second = slot(&c);
    assert_eq!(second.identity.state, "Resolved", "{second:?}");
    assert_eq!(second.identity.tier, "Broker");
    assert_eq!(second.identity.attempts, 2, "cumulative over the retry");
    assert_eq!(second.identity.failure, 0);
    assert_eq!(second.host_pid, pid, "a host process: its own PID");
    let err = w.finish();
    assert_eq!(err.matches("host PID unknown").count(), 1, "{err}");
    assert!(
        err.contains("found by tier broker after 2 attempt(s)"),
        "{err}"
    );
}
