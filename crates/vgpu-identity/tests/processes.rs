//! Real processes: workers in their own PID namespace (`unshare`), a broker
//! whose peer is invisible to it, and 32 concurrent probers sharing the
//! node-wide flock while its holder is SIGKILLed.
//!
//! Children are this test binary re-executed on `child_entry` with
//! `VGPU_ID_CHILD=<role>`; they print `RESULT key=value ...` lines.
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::RunningBroker;
use vgpu_identity::client::BrokerError;
use vgpu_identity::codec::Status;
use vgpu_identity::probe::{self, DriverError, ProbeDriver, ProbeOptions};
use vgpu_identity::procfs::{self, ProcfsError};
use vgpu_identity::query_broker;
use vgpu_identity::server::{Broker, BrokerConfig};

const D: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------- children

fn result(kv: &[(&str, String)]) {
    let line: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", line.join(" "));
    std::io::stdout().flush().unwrap();
}

fn wait_stdin_eof() {
    let mut s = String::new();
    while std::io::stdin()
        .read_line(&mut s)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
}

fn env_path(k: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(k).unwrap_or_else(|| panic!("{k} unset")))
}

/// A fake NVML/CUDA pair over a directory: a retained primary context is a
/// file named by the host PID; the process list is the directory, minus dead
/// processes (as a driver drops them).
struct FileNode {
    dir: PathBuf,
    me: u32,
    hold_forever: bool,
}

impl ProbeDriver for FileNode {
    fn nvml_pids(&mut self, _: u32) -> Result<Vec<u32>, DriverError> {
        let mut out = vec![];
        for e in std::fs::read_dir(&self.dir).unwrap() {
            let name = e.unwrap().file_name();
            if let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) {
                let alive = rustix::process::Pid::from_raw(pid)
                    .map(|p| rustix::process::test_kill_process(p).is_ok())
                    .unwrap_or(false);
                if alive {
                    out.push(pid as u32);
                }
            }
        }
        Ok(out)
    }

    fn retain_primary(&mut self, _: u32) -> Result<(), DriverError> {
        let marks = self.dir.parent().unwrap();
        if self.hold_forever {
            std::fs::write(self.dir.join(self.me.to_string()), b"").unwrap();
            std::fs::write(marks.join("holding"), self.me.to_string()).unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        // Mutual exclusion check: nobody else may be between retain and
        // release right now.
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(marks.join("inside"))
            .is_err()
        {
            std::fs::write(marks.join(format!("violation-{}", self.me)), b"").unwrap();
        }
        std::fs::write(self.dir.join(self.me.to_string()), b"").unwrap();
        // Some driver cost, so overlapping probes would be caught.
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    }

    fn release_primary(&mut self, _: u32) -> Result<(), DriverError> {
        std::fs::remove_file(self.dir.join(self.me.to_string())).unwrap();
        std::fs::remove_file(self.dir.parent().unwrap().join("inside")).unwrap();
        Ok(())
    }
}

/// The probe's driver over the simulated GPU machine: the process list is
/// the sim's (host PIDs, as its daemon learns them by `SO_PEERCRED`), a
/// retain pays the sim's cold-retain cost and counts a context.
struct SimDriver {
    m: vgpu_sim::machine::Machine,
    hold_forever: Option<PathBuf>,
}

impl ProbeDriver for SimDriver {
    fn nvml_pids(&mut self, dev: u32) -> Result<Vec<u32>, DriverError> {
        Ok(self
            .m
            .compute_processes(dev as usize)
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    fn retain_primary(&mut self, dev: u32) -> Result<(), DriverError> {
        self.m
            .context_creation(dev as usize, vgpu_sim::machine::CtxCost::PrimaryCold)
            .map_err(|_| DriverError {
                call: probe::DriverCall::RetainPrimary,
                code: 1,
            })?;
        self.m.count_context(dev as usize, 1);
        if let Some(marker) = &self.hold_forever {
            // Tell the parent whom to kill (our host PID, as the sim knows).
            let tmp = marker.with_extension("tmp");
            std::fs::write(&tmp, self.m.host_pid.to_string()).unwrap();
            std::fs::rename(&tmp, marker).unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        Ok(())
    }

    fn release_primary(&mut self, dev: u32) -> Result<(), DriverError> {
        self.m.count_context(dev as usize, -1);
        Ok(())
    }
}

#[test]
#[ignore = "a subprocess entry point, run only by this file's tests (--ignored)"]
fn child_entry() {
    let Ok(role) = std::env::var("VGPU_ID_CHILD") else {
        return; // Not a child: nothing to do.
    };
    let me = std::process::id();
    // A parent that fails before closing our stdin must not leave us (and
    // itself, reading our stdout) hanging forever.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(3);
    });
    match role.as_str() {
        "broker" => {
            let r = query_broker(&env_path("VGPU_ID_SOCK"), D);
            result(&[("pid", format!("{:?}", r.ok())), ("inner", me.to_string())]);
            wait_stdin_eof();
        }
        "procfs" => {
            let host = procfs::host_pid_from_mount(&env_path("VGPU_ID_HOSTPROC"));
            let own = procfs::host_pid_from_mount(Path::new("/proc"));
            let own_refused = matches!(own, Err(ProcfsError::OwnNamespace { .. }));
            result(&[
                ("pid", format!("{:?}", host.ok())),
                ("inner", me.to_string()),
                ("own_refused", own_refused.to_string()),
                ("own", format!("{own:?}").replace(' ', "_")),
            ]);
            wait_stdin_eof();
        }
        "resolve" => {
            use vgpu_identity::resolve::{resolve, ResolveConfig};
            let sock = env_path("VGPU_ID_SOCK");
            let hostproc = env_path("VGPU_ID_HOSTPROC");
            let show = |name: &str, cfg: ResolveConfig| {
                let r = resolve::<FileNode>(&cfg, None);
                let f: Vec<String> = r
                    .tier_failures
                    .iter()
                    .map(|c| c.name().to_owned())
                    .collect();
                (
                    name.to_owned(),
                    format!(
                        "{}/{:?}/{}/{}/{}",
                        vgpu_identity::tier_name(r.telemetry.tier),
                        r.host_pid(),
                        r.telemetry.attempts,
                        r.telemetry.failure.name(),
                        f.join(",")
                    )
                    .replace(' ', ""),
                )
            };
            let missing = sock.with_file_name("absent.sock");
            let rows = [
                show(
                    "broker",
                    ResolveConfig {
                        broker: Some(sock.clone()),
                        procfs: Some(hostproc.clone()),
                        ..ResolveConfig::default()
                    },
                ),
                show(
                    "procfs",
                    ResolveConfig {
                        broker: Some(missing.clone()),
                        procfs: Some(hostproc.clone()),
                        ..ResolveConfig::default()
                    },
                ),
                show(
                    "none",
                    ResolveConfig {
                        broker: Some(missing.clone()),
                        procfs: Some(PathBuf::from("/proc")),
                        ..ResolveConfig::default()
                    },
                ),
            ];
            let mut kv: Vec<(&str, String)> =
                rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            kv.push(("inner", me.to_string()));
            result(&kv);
            wait_stdin_eof();
        }
        "serve" => {
            let b = Broker::bind(BrokerConfig {
                socket: env_path("VGPU_ID_SOCK"),
                ..BrokerConfig::default()
            })
            .unwrap();
            let m = b.metrics();
            let h = b.shutdown_handle();
            let t = std::thread::spawn(move || b.serve().unwrap());
            wait_stdin_eof();
            h.shutdown();
            t.join().unwrap();
            let s = m.snapshot();
            result(&[
                ("peercred_failures", s.peercred_failures.to_string()),
                ("ok", s.ok.to_string()),
            ]);
        }
        "sim_probe" | "sim_probe_holder" => {
            let m =
                vgpu_sim::machine::Machine::connect_dir(&env_path("VGPU_ID_SIM"), true).unwrap();
            let sim_host = m.host_pid;
            let mut d = SimDriver {
                m,
                hold_forever: (role == "sim_probe_holder").then(|| env_path("VGPU_ID_MARKER")),
            };
            let opts = ProbeOptions {
                lock_path: env_path("VGPU_ID_LOCK"),
                total_budget: Duration::from_secs(60),
                ..ProbeOptions::default()
            };
            if role == "sim_probe" {
                // Start together: report ready, wait for the go.
                let gate = env_path("VGPU_ID_GATE");
                std::fs::write(gate.join(format!("ready-{sim_host}")), b"").unwrap();
                let t0 = Instant::now();
                while !gate.join("go").exists() && t0.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let r = probe::probe_host_pid(&mut d, &opts);
            // Then the application goes on with its own context, which NVML
            // lists from now on: a probe overlapping this one would see it
            // appear.
            d.m.count_context(0, 1);
            result(&[
                ("pid", format!("{:?}", r.result.as_ref().ok())),
                ("sim_host", sim_host.to_string()),
                ("inner", me.to_string()),
                ("attempts", r.attempts.to_string()),
            ]);
            wait_stdin_eof();
        }
        "probe" | "probe_holder" => {
            let mut node = FileNode {
                dir: env_path("VGPU_ID_NODE"),
                me,
                hold_forever: role == "probe_holder",
            };
            let opts = ProbeOptions {
                lock_path: env_path("VGPU_ID_LOCK"),
                total_budget: Duration::from_secs(60),
                ..ProbeOptions::default()
            };
            let r = probe::probe_host_pid(&mut node, &opts);
            result(&[
                ("pid", format!("{:?}", r.result.as_ref().ok())),
                ("self", me.to_string()),
                ("attempts", r.attempts.to_string()),
            ]);
        }
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

// ---------------------------------------------------------------- parent side

fn child_cmd(wrapper: &[&str], role: &str) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    c.args([
        "child_entry",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("VGPU_ID_CHILD", role)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    c
}

/// Reads the child's RESULT line.
fn read_result(out: &mut BufReader<ChildStdout>) -> HashMap<String, String> {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "child exited without a RESULT line");
        // libtest may have printed "test child_entry ... " on the same line.
        if let Some((_, rest)) = line.split_once("RESULT ") {
            return rest
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        }
    }
}

fn finish(mut child: Child) {
    drop(child.stdin.take());
    let st = child.wait().unwrap();
    assert!(st.success(), "child failed: {st}");
}

/// `NStgid` and `PPid` of a live process, as the host sees it.
fn host_view(pid: u32) -> (Vec<u32>, u32) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ns = procfs::parse_nstgid(s.as_bytes())
        .unwrap()
        .as_slice()
        .to_vec();
    let ppid = s
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (ns, ppid)
}

fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn namespaced_worker_gets_its_host_pid_from_the_broker() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    let mut child = child_cmd(&["unshare", "--pid", "--fork", "--mount-proc"], "broker")
        .env("VGPU_ID_SOCK", &b.path)
        .spawn()
        .unwrap();
    let unshare_pid = child.id();
    let r = read_result(&mut BufReader::new(child.stdout.take().unwrap()));
    let inner: u32 = r["inner"].parse().unwrap();
    let pid: u32 = r["pid"]
        .strip_prefix("Some(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("broker gave no pid: {r:?}"))
        .parse()
        .unwrap();
    // The worker is pid 1 in its namespace; the host sees it as the child of
    // the unshare process with NStgid "pid 1".
    assert_eq!(inner, 1);
    assert_ne!(pid, inner);
    let (ns, ppid) = host_view(pid);
    assert_eq!(
        ppid, unshare_pid,
        "the broker's answer is the worker the parent started"
    );
    assert_eq!(ns, vec![pid, inner]);
    finish(child);
    common::eventually("ok == 1", || b.metrics.snapshot().ok == 1);
}

#[test]
fn procfs_tier_host_mount_gives_host_pid_and_private_proc_is_refused() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    let dir = tempfile::tempdir().unwrap();
    let hostproc = dir.path().join("hostproc");
    std::fs::create_dir(&hostproc).unwrap();
    // In a private mount namespace: bind the host's /proc aside, then mount
    // the new namespace's own /proc, then become the worker.
    let script =
        r#"mount --bind /proc "$VGPU_ID_HOSTPROC" && mount -t proc proc /proc && exec "$0" "$@""#;
    let mut child = child_cmd(
        &[
            "unshare", "--pid", "--fork", "--mount", "--", "sh", "-c", script,
        ],
        "procfs",
    )
    .env("VGPU_ID_HOSTPROC", &hostproc)
    .spawn()
    .unwrap();
    let unshare_pid = child.id();
    let r = read_result(&mut BufReader::new(child.stdout.take().unwrap()));
    assert_eq!(
        r["own_refused"], "true",
        "private /proc must be refused: {r:?}"
    );
    let inner: u32 = r["inner"].parse().unwrap();
    let pid: u32 = r["pid"]
        .strip_prefix("Some(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("host procfs gave no pid: {r:?}"))
        .parse()
        .unwrap();
    assert_eq!(inner, 1);
    let (ns, ppid) = host_view(pid);
    assert_eq!(ppid, unshare_pid);
    assert_eq!(ns, vec![pid, inner]);
    finish(child);
    // The bind mount lived in the child's private mount namespace only.
    assert!(std::fs::read_dir(&hostproc).unwrap().next().is_none());
}

#[test]
fn broker_refuses_a_peer_it_cannot_see() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    // The broker runs in a child PID namespace; this (host) process is not
    // visible there, so the kernel reports its pid as 0.
    let dir = common::sock_dir();
    let sock = dir.path().join("inner.sock");
    let mut child = child_cmd(&["unshare", "--pid", "--fork"], "serve")
        .env("VGPU_ID_SOCK", &sock)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "inner broker never bound"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = query_broker(&sock, D).unwrap_err();
    assert!(
        matches!(err, BrokerError::Status(Status::NO_PEER_PID)),
        "{err:?}"
    );
    drop(child.stdin.take());
    let r = read_result(&mut BufReader::new(child.stdout.take().unwrap()));
    assert_eq!(r["peercred_failures"], "1");
    assert_eq!(r["ok"], "0");
    assert!(child.wait().unwrap().success());
}

#[test]
fn thirty_two_probers_with_a_killed_lock_holder() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    std::fs::create_dir(&node).unwrap();
    let lock = dir.path().join("vgpulock/hostpid.lock");
    let with_env = |c: &mut Command| {
        c.env("VGPU_ID_NODE", &node).env("VGPU_ID_LOCK", &lock);
    };

    let mut holder = child_cmd(&[], "probe_holder");
    with_env(&mut holder);
    let mut holder = holder.spawn().unwrap();
    let t0 = Instant::now();
    while !dir.path().join("holding").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "holder never took the lock"
        );
        assert!(holder.try_wait().unwrap().is_none(), "holder died early");
        std::thread::sleep(Duration::from_millis(5));
    }

    let mut probers: Vec<Child> = (0..32)
        .map(|_| {
            let mut c = child_cmd(&[], "probe");
            with_env(&mut c);
            c.spawn().unwrap()
        })
        .collect();
    // Let them start and queue on the lock; while the holder lives, none can
    // get through.
    std::thread::sleep(Duration::from_millis(300));
    for p in probers.iter_mut() {
        assert!(
            p.try_wait().unwrap().is_none(),
            "a prober finished while the lock was held"
        );
    }
    assert!(holder.try_wait().unwrap().is_none());

    holder.kill().unwrap(); // SIGKILL, mid-probe, lock held
    holder.wait().unwrap();

    for mut p in probers.drain(..) {
        let pid = p.id();
        let r = read_result(&mut BufReader::new(p.stdout.take().unwrap()));
        assert_eq!(r["self"], pid.to_string());
        assert_eq!(
            r["pid"],
            format!("Some({pid})"),
            "prober {pid} misidentified: {r:?}"
        );
        finish(p);
    }
    let violations: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("violation"))
        .collect();
    assert!(violations.is_empty(), "probes overlapped: {violations:?}");
}

#[test]
fn tier_chain_inside_a_pid_namespace() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    let hostproc = dir.path().join("hostproc");
    std::fs::create_dir(&hostproc).unwrap();
    let script =
        r#"mount --bind /proc "$VGPU_ID_HOSTPROC" && mount -t proc proc /proc && exec "$0" "$@""#;
    let mut child = child_cmd(
        &[
            "unshare", "--pid", "--fork", "--mount", "--", "sh", "-c", script,
        ],
        "resolve",
    )
    .env("VGPU_ID_HOSTPROC", &hostproc)
    .env("VGPU_ID_SOCK", &b.path)
    .spawn()
    .unwrap();
    let unshare_pid = child.id();
    let r = read_result(&mut BufReader::new(child.stdout.take().unwrap()));
    let broker: Vec<&str> = r["broker"].split('/').collect();
    let procfs_row: Vec<&str> = r["procfs"].split('/').collect();
    let none: Vec<&str> = r["none"].split('/').collect();
    // tier / pid / attempts / failure / per-tier failures
    assert_eq!(broker[0], "broker", "{r:?}");
    let pid: u32 = broker[1]
        .trim_start_matches("Some(")
        .trim_end_matches(')')
        .parse()
        .unwrap();
    let (ns, ppid) = host_view(pid);
    assert_eq!(ppid, unshare_pid);
    assert_eq!(ns, vec![pid, 1]);
    assert_eq!(broker[2], "1");
    assert_eq!(procfs_row[0], "procfs", "{r:?}");
    assert_eq!(procfs_row[1], format!("Some({pid})"));
    assert_eq!(procfs_row[2], "2");
    assert!(procfs_row[4].starts_with("BROKER_MISSING,"), "{r:?}");
    assert_eq!(none[1], "None", "{r:?}");
    // The last tier actually tried says why.
    assert_eq!(none[3], "PROCFS_OWN_NAMESPACE");
    assert_eq!(
        none[4],
        "BROKER_MISSING,PROCFS_OWN_NAMESPACE,PROBE_NOT_AVAILABLE"
    );
    finish(child);
}

#[test]
fn sim_probe_32_namespaced_workers_with_a_killed_lock_holder() {
    assert!(
        unshare_works(),
        "unshare --pid --fork --mount-proc must work here (run as root)"
    );
    // A 5 ms primary retain that the sim does not serialize itself, so
    // probes that overlapped would see each other's PIDs appear.
    let mut config = vgpu_sim::SimConfig::with_profile("zero").unwrap();
    config.cost.primary_retain_cold_ns = 5_000_000;
    config.cost.serialize_context_creation = false;
    let sim = vgpu_sim::SimHandle::start(vgpu_sim::SimOptions {
        config,
        link_libs: false,
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("vgpulock/hostpid.lock");
    let marker = dir.path().join("holding");
    let gate = dir.path().join("gate");
    std::fs::create_dir(&gate).unwrap();
    let with_env = |c: &mut Command| {
        c.env("VGPU_ID_SIM", sim.dir())
            .env("VGPU_ID_LOCK", &lock)
            .env("VGPU_ID_MARKER", &marker)
            .env("VGPU_ID_GATE", &gate);
    };
    let ns = ["unshare", "--pid", "--fork", "--mount-proc"];

    // A worker takes the lock, retains, and hangs there.
    let mut holder = child_cmd(&ns, "sim_probe_holder");
    with_env(&mut holder);
    let mut holder = holder.spawn().unwrap();
    let t0 = Instant::now();
    while !marker.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "holder never took the lock"
        );
        assert!(holder.try_wait().unwrap().is_none(), "holder died early");
        std::thread::sleep(Duration::from_millis(5));
    }

    // 32 workers, each pid 1 in its own namespace, queue on the lock.
    let mut workers: Vec<Child> = (0..32)
        .map(|_| {
            let mut c = child_cmd(&ns, "sim_probe");
            with_env(&mut c);
            c.spawn().unwrap()
        })
        .collect();
    // All 32 registered with the sim; release them at once onto the lock.
    let t0 = Instant::now();
    while std::fs::read_dir(&gate).unwrap().count() < 32 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "workers never got ready"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(gate.join("go"), b"").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    for w in workers.iter_mut() {
        assert!(
            w.try_wait().unwrap().is_none(),
            "a worker exited while the lock was held"
        );
    }
    // SIGKILL the holder itself, mid-probe with the lock held; the kernel
    // drops the lock with its last descriptor. (Its `unshare` parent then
    // exits on its own.)
    let holder_pid: i32 = std::fs::read_to_string(&marker).unwrap().parse().unwrap();
    let (ns_of_holder, _) = host_view(holder_pid as u32);
    assert_eq!(
        ns_of_holder,
        vec![holder_pid as u32, 1],
        "the marker names the namespaced holder"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(holder_pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    holder.wait().unwrap();

    let mut seen = std::collections::HashSet::new();
    for mut w in workers.drain(..) {
        let unshare_pid = w.id();
        let r = read_result(&mut BufReader::new(w.stdout.take().unwrap()));
        assert_eq!(r["inner"], "1");
        let pid: u32 = r["pid"]
            .strip_prefix("Some(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("worker under {unshare_pid} not identified: {r:?}"))
            .parse()
            .unwrap();
        assert_eq!(
            r["sim_host"],
            pid.to_string(),
            "the sim knows the same host PID"
        );
        let (nstgid, ppid) = host_view(pid);
        assert_eq!(
            ppid, unshare_pid,
            "the probe named this worker, not another"
        );
        assert_eq!(nstgid, vec![pid, 1]);
        assert!(seen.insert(pid));
        finish(w);
    }
    assert_eq!(seen.len(), 32);
}
