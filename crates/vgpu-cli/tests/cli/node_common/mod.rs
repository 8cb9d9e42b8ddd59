//! Shared harness of the `vgpu node` tests: a private simulated GPU, the
//! Kubernetes API emulator (vgpu-kube-fixture), a kubelet emulator built
//! from the vendored device-plugin proto (a Registration server on
//! `kubelet.sock` and a client of the plugin), the real `vgpu node` binary
//! as a child process on temp directories and ephemeral ports, workers
//! (`vgpu-sim-probe`) with or without libvgpu.so, and real cgroups.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use tokio::sync::Notify;
use vgpu_kube_fixture::ApiFixture;
use vgpu_node::proto::v1beta1 as api;
use vgpu_sim::{SimHandle, SimOptions};

pub const NODE: &str = "node-1";
pub const MIB: u64 = 1 << 20;

pub fn vgpu_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vgpu"))
}

pub fn libvgpu() -> PathBuf {
    vgpu_sim::locate_artifact("libvgpu.so").expect("libvgpu.so is built (cargo build --workspace)")
}

pub fn probe() -> PathBuf {
    vgpu_sim::locate_artifact("vgpu-sim-probe")
        .expect("vgpu-sim-probe is built (cargo build --workspace)")
}

pub fn uuid(dev: usize) -> String {
    vgpu_sim::Machine::device_uuid_string(dev)
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One test's world.
pub struct Env {
    pub fx: ApiFixture,
    pub sim: SimHandle,
    pub dir: tempfile::TempDir,
    pub hook: PathBuf,
    pub dp_dir: PathBuf,
    pub lock: PathBuf,
    pub broker_sock: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub fn new(devices: u32) -> Env {
        let fx = ApiFixture::start();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE, "labels": {"gpu": "on"}},
            "status": {"allocatable": {"nvidia.com/gpu": "0"}}
        }))
        .unwrap();
        fx.create(&node).unwrap();
        let sim = SimHandle::start(SimOptions::default().devices(devices)).expect("start sim");
        let dir = tempfile::Builder::new()
            .prefix("vgpu-node-test-")
            .tempdir()
            .unwrap();
        let p = |s: &str| {
            let d = dir.path().join(s);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let hook = p("hook");
        let dp_dir = p("device-plugins");
        let lock = dir.path().join("vgpulock");
        // The broker's directory must be root-owned and not group/world
        // writable (the client refuses it otherwise).
        let bdir = p("run-vgpu");
        std::fs::set_permissions(&bdir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        fx.write_kubeconfig(&kubeconfig).unwrap();
        Env {
            fx,
            sim,
            hook,
            dp_dir,
            lock,
            broker_sock: bdir.join("hostpid.sock"),
            kubeconfig,
            dir,
        }
    }

    pub fn nvml_lib(&self) -> PathBuf {
        self.sim.dir().join("lib/libnvidia-ml.so.1")
    }

    /// Starts `vgpu node` with fast test periods; `extra` overrides.
    pub fn agent(&self, extra: &[&str]) -> Agent {
        let mut cmd = Command::new(vgpu_bin());
        cmd.arg("node")
            .args(["--node-name", NODE])
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--device-plugin-dir")
            .arg(&self.dp_dir)
            .arg("--hook-path")
            .arg(&self.hook)
            .arg("--lib-path")
            .arg(libvgpu())
            .arg("--lock-dir")
            .arg(&self.lock)
            .arg("--broker-socket")
            .arg(&self.broker_sock)
            .arg("--nvml-library")
            .arg(self.nvml_lib())
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args([
                "--register-interval",
                "1s",
                "--pod-refresh",
                "300ms",
                "--health-interval",
                "100ms",
            ])
            // A test that measures at the default period passes its own.
            .args(
                ["--watchdog-interval", "300ms"]
                    .iter()
                    .filter(|_| !extra.contains(&"--watchdog-interval")),
            )
            .args(["--lib-cuda-log-level", "2", "--log-level", "debug"])
            .args(extra)
            .envs(self.sim.env())
            .env_remove("LD_PRELOAD")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn vgpu node");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(u) = line.strip_prefix("vgpu node: monitor on ") {
                        let _ = tx.send(u.to_owned());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "vgpu node did not start:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Agent {
            child: Some(child),
            url,
            log,
        }
    }

    /// A pod bound to this node the way HAMi's scheduler leaves it: `spec`
    /// containers (name, is_init), and the device list annotation.
    pub fn gpu_pod(&self, name: &str, containers: &[(&str, bool)], devices: &str) -> Pod {
        let now = jiff::Timestamp::now().as_second().to_string();
        let ctr = |n: &str| json!({"name": n, "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}});
        let init: Vec<_> = containers
            .iter()
            .filter(|c| c.1)
            .map(|c| ctr(c.0))
            .collect();
        let app: Vec<_> = containers
            .iter()
            .filter(|c| !c.1)
            .map(|c| ctr(c.0))
            .collect();
        let mut spec = json!({"nodeName": NODE, "containers": app});
        if !init.is_empty() {
            spec["initContainers"] = json!(init);
        }
        let p: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "default",
                "labels": {"hami.io/vgpu-node": NODE},
                "annotations": {
                    "hami.io/vgpu-node": NODE,
                    "hami.io/vgpu-time": now,
                    "hami.io/bind-time": now,
                    "hami.io/bind-phase": "allocating",
                    "hami.io/vgpu-devices-to-allocate": devices,
                    "hami.io/vgpu-devices-allocated": devices,
                }
            },
            "spec": spec,
        }))
        .unwrap();
        self.fx.create(&p).unwrap()
    }

    pub fn pod(&self, name: &str) -> Pod {
        self.fx.get::<Pod>("default", name).expect("pod exists")
    }

    pub fn annotation(&self, name: &str, key: &str) -> Option<String> {
        self.pod(name)
            .metadata
            .annotations
            .unwrap_or_default()
            .get(key)
            .cloned()
    }

    pub fn node_annotation(&self, key: &str) -> Option<String> {
        self.fx
            .get::<Node>("", NODE)?
            .metadata
            .annotations
            .unwrap_or_default()
            .get(key)
            .cloned()
    }

    /// Marks the pod's containers running with these container IDs.
    pub fn set_running(&self, pod: &str, containers: &[(&str, &str)]) {
        let st: Vec<_> = containers
            .iter()
            .map(|(n, id)| json!({"name": n, "containerID": format!("containerd://{id}"), "image": "cuda", "imageID": "", "ready": true, "restartCount": 0}))
            .collect();
        self.fx
            .set_status::<Pod>(
                "default",
                pod,
                json!({"phase": "Running", "containerStatuses": st}),
            )
            .unwrap();
    }
}

/// The running agent.
pub struct Agent {
    child: Option<Child>,
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
}

pub fn http_get(url: &str, path: &str) -> (u16, String) {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect monitor");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_owned())
}

impl Agent {
    pub fn scrape(&self) -> String {
        let (code, body) = http_get(&self.url, "/metrics");
        assert_eq!(code, 200, "{body}");
        body
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Samples of one metric whose labels include all of `want`.
pub fn values(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
    vgpu_node::monitor::parse_exposition(text)
        .into_iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|s| s.value)
        .collect()
}

pub fn value(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let v = values(text, name, want);
    assert!(v.len() <= 1, "{name} {want:?}: several series {v:?}");
    v.first().copied()
}

// ---------------------------------------------------------------- kubelet

/// The kubelet's side of the device-plugin protocol, from the same proto.
pub struct Kubelet {
    pub dir: PathBuf,
    regs: Arc<Mutex<Vec<api::RegisterRequest>>>,
    notify: Arc<Notify>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

struct Registrar {
    regs: Arc<Mutex<Vec<api::RegisterRequest>>>,
    notify: Arc<Notify>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registrar {
    async fn register(
        &self,
        r: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let r = r.into_inner();
        if r.version != vgpu_node::proto::VERSION {
            return Err(tonic::Status::invalid_argument("unsupported version"));
        }
        self.regs.lock().unwrap().push(r);
        self.notify.notify_waiters();
        Ok(tonic::Response::new(api::Empty {}))
    }
}

impl Kubelet {
    pub async fn start(dir: &Path) -> Kubelet {
        let mut k = Kubelet {
            dir: dir.to_owned(),
            regs: Default::default(),
            notify: Default::default(),
            stop: None,
            task: None,
        };
        k.serve();
        k
    }

    fn serve(&mut self) {
        let sock = self.dir.join(vgpu_node::proto::KUBELET_SOCKET);
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind kubelet.sock");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = api::registration_server::RegistrationServer::new(Registrar {
            regs: self.regs.clone(),
            notify: self.notify.clone(),
        });
        self.task = Some(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = rx.await;
                    },
                )
                .await;
        }));
        self.stop = Some(tx);
    }

    pub fn registrations(&self) -> Vec<api::RegisterRequest> {
        self.regs.lock().unwrap().clone()
    }

    pub async fn wait_registrations(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Vec<api::RegisterRequest> {
        let t0 = Instant::now();
        loop {
            let notified = self.notify.notified();
            let r = self.registrations();
            if r.len() >= n {
                return r;
            }
            let left = timeout
                .checked_sub(t0.elapsed())
                .unwrap_or_else(|| panic!("no registration #{n} within {timeout:?}"));
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), notified).await;
        }
    }

    /// A kubelet restart: its registration server goes away, every socket in
    /// the directory is removed (the kubelet's device manager does this on
    /// start), and `kubelet.sock` comes back.
    pub async fn restart(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.serve();
    }

    pub async fn plugin(
        &self,
        endpoint: &str,
    ) -> api::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
        let path = self.dir.join(endpoint);
        let t0 = Instant::now();
        loop {
            match vgpu_node::plugin::uds_channel(path.clone()).await {
                Ok(ch) => return api::device_plugin_client::DevicePluginClient::new(ch),
                Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("connect to the plugin at {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// One Allocate call for one container asking for `ids`.
pub fn request(ids: &[String]) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    }
}

/// Env of a response as a sorted map.
pub fn envs(r: &api::ContainerAllocateResponse) -> BTreeMap<String, String> {
    r.envs.clone().into_iter().collect()
}

/// Mounts as (container, host, ro).
pub fn mounts(r: &api::ContainerAllocateResponse) -> Vec<(String, String, bool)> {
    r.mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only))
        .collect()
}

/// A container path through the response's mounts to the host.
pub fn to_host(r: &api::ContainerAllocateResponse, container_path: &str) -> PathBuf {
    let m = r
        .mounts
        .iter()
        .filter(|m| {
            container_path == m.container_path
                || container_path.starts_with(&format!("{}/", m.container_path))
        })
        .max_by_key(|m| m.container_path.len())
        .unwrap_or_else(|| panic!("{container_path} is under no mount"));
    PathBuf::from(format!(
        "{}{}",
        m.host_path,
        &container_path[m.container_path.len()..]
    ))
}

// ---------------------------------------------------------------- workers

/// A process on the simulated GPU.
pub struct Worker {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Worker {
    /// `vgpu-sim-probe STEPS...`; with `preload`, under libvgpu.so; `env`
    /// added; in `cgroup` (a cgroup directory) from before it starts.
    pub fn start(
        env: &Env,
        preload: bool,
        extra_env: &[(String, String)],
        cgroup: Option<&Path>,
        steps: &[&str],
    ) -> Worker {
        Self::start_wrapped(env, preload, extra_env, cgroup, &[], steps)
    }

    /// As [`Worker::start`], run under `wrapper` (e.g. `unshare --pid --fork --mount-proc`).
    pub fn start_wrapped(
        env: &Env,
        preload: bool,
        extra_env: &[(String, String)],
        cgroup: Option<&Path>,
        wrapper: &[&str],
        steps: &[&str],
    ) -> Worker {
        let mut cmd = Command::new("sh");
        let script = match cgroup {
            Some(_) => "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"",
            None => "exec \"$@\"",
        };
        cmd.arg("-c").arg(script).arg(
            cgroup
                .map(|p| p.to_owned())
                .unwrap_or_else(|| PathBuf::from("-")),
        );
        cmd.args(wrapper).arg(probe()).args(steps);
        cmd.envs(env.sim.env())
            .env_remove("LD_PRELOAD")
            .env_remove("CUDA_DEVICE_MEMORY_LIMIT")
            .env("LIBCUDA_LOG_LEVEL", "2")
            .envs(extra_env.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if preload {
            cmd.env("LD_PRELOAD", libvgpu());
        }
        let mut child = cmd.spawn().expect("spawn worker");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Worker {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an output line equal to `want`; panics on timeout or exit.
    pub fn expect(&mut self, want: &str) {
        let t0 = Instant::now();
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => {
                    let hit = l == want;
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(60),
                        "worker: no {want:?} (saw {:?})",
                        self.seen
                    );
                }
                Err(_) => panic!(
                    "worker exited before {want:?} (saw {:?}, status {:?})",
                    self.seen,
                    self.child.try_wait()
                ),
            }
        }
    }

    /// Lets a `wait` step return.
    pub fn proceed(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s);
        }
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- cgroups

/// A real cgroup shaped like a kubelet's (systemd driver, containerd):
/// `<root>/vgpu-test-<pid>-<n>/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`.
pub struct Cgroup {
    top: PathBuf,
    pub dir: PathBuf,
    pub container_id: String,
}

fn cgroup_root() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut v1_pids = None;
    for l in mi.lines() {
        let (pre, post) = l.split_once(" - ")?;
        let mnt = pre.split_whitespace().nth(4)?;
        let fstype = post.split_whitespace().next()?;
        if fstype == "cgroup2" {
            return Some(PathBuf::from(mnt));
        }
        if fstype == "cgroup"
            && post
                .split_whitespace()
                .nth(2)
                .is_some_and(|o| o.split(',').any(|x| x == "pids"))
        {
            v1_pids = Some(PathBuf::from(mnt));
        }
    }
    v1_pids
}

impl Cgroup {
    /// `None` when no cgroup hierarchy is writable here.
    pub fn new(pod_uid: &str, tag: u32) -> Option<Cgroup> {
        let root = cgroup_root()?;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let top = root.join(format!("vgpu-test-{}-{n}", std::process::id()));
        let id = format!(
            "{:016x}{:016x}{:016x}{:016x}",
            std::process::id(),
            n,
            tag,
            0x7667_7075u64
        );
        let dir = top
            .join(format!(
                "kubepods-besteffort-pod{}.slice",
                pod_uid.replace('-', "_")
            ))
            .join(format!("cri-containerd-{id}.scope"));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Cgroup {
            top,
            dir,
            container_id: id,
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Leftover processes (killed workers are reaped by then) would keep
        // the directory busy: try a few times, bottom-up.
        for _ in 0..50 {
            let mut dirs = vec![self.dir.clone()];
            if let Some(p) = self.dir.parent() {
                dirs.push(p.to_owned());
            }
            dirs.push(self.top.clone());
            let ok = dirs
                .iter()
                .all(|d| std::fs::remove_dir(d).is_ok() || !d.exists());
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Skips a test that needs a writable cgroup hierarchy, saying why.
#[macro_export]
macro_rules! cgroup_or_skip {
    ($uid:expr, $tag:expr) => {
        match node_common::Cgroup::new($uid, $tag) {
            Some(c) => c,
            None => {
                // Under CI (root) a skip would let the test pass by not running.
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "no writable cgroup hierarchy under CI"
                );
                eprintln!("SKIP: no writable cgroup hierarchy here (needs root and a cgroup2 or v1 pids mount)");
                return;
            }
        }
    };
}
