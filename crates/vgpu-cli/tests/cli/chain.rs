//! The whole chain, GPU-free: a pod admitted by `vgpu scheduler`'s webhook
//! (an AdmissionReview over HTTP), filtered, prioritized and bound by its
//! extender against the API emulator; `vgpu node`'s Allocate, called by the
//! kubelet emulator, reads that assignment and answers env and mounts; a
//! process started with exactly that env (container paths mapped to the
//! host through the answered mounts, as a runtime would) under libvgpu.so
//! on a private simulated GPU is held to the assigned memory, and both the
//! node monitor and the scheduler report it under the pod's labels.
//! Everything is a real process on real sockets: the two `vgpu` binaries,
//! the workers, the simulated driver.
use crate::node_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use node_common::*;
use serde_json::{json, Value};
use vgpu_hami::keys;
use vgpu_node::proto::v1beta1 as api;

const SCHEDULER_NAME: &str = "hami-scheduler";

// ------------------------------------------------------------- scheduler

/// `vgpu scheduler` as a child process on ephemeral ports.
struct SchedulerProc {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl SchedulerProc {
    fn start(env: &Env) -> SchedulerProc {
        let mut child = Command::new(vgpu_bin())
            .args([
                "scheduler",
                "--http_bind=127.0.0.1:0",
                "--metrics-bind-address=127.0.0.1:0",
                &format!("--scheduler-name={SCHEDULER_NAME}"),
                // The handshake writer runs: it asks once and must not ask
                // again while its request stands (HAMi's rule).
                "--handshake-period=300ms",
            ])
            .env("KUBECONFIG", &env.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vgpu scheduler");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut addr, mut metrics) = (None, None);
        let mut seen = Vec::new();
        while addr.is_none() || metrics.is_none() {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!(
                    "vgpu scheduler ended before its addresses:\n{}",
                    seen.join("\n")
                );
            };
            if let Some(rest) = line.split("extender and webhook on http://").nth(1) {
                addr = Some(rest.trim().parse::<SocketAddr>().unwrap());
            }
            if let Some(rest) = line.split("metrics on http://").nth(1) {
                metrics = Some(rest.trim().trim_end_matches("/metrics").parse().unwrap());
            }
            seen.push(line);
        }
        // Keep draining stderr so the child never blocks on it.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        let s = SchedulerProc {
            child,
            addr: addr.unwrap(),
            metrics: metrics.unwrap(),
        };
        wait_for(Duration::from_secs(60), "scheduler ready", || {
            (http(s.addr, "GET", "/readyz", "").0 == 200).then_some(())
        });
        s
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let (code, text) = http(self.addr, "POST", path, &body.to_string());
        assert_eq!(code, 200, "POST {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    fn scrape(&self) -> String {
        let (code, text) = http(self.metrics, "GET", "/metrics", "");
        assert_eq!(code, 200, "{text}");
        text
    }
}

impl Drop for SchedulerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: vgpu\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // The servers answer with Content-Length or chunked; undo chunking.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    (code, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

// ------------------------------------------------------------- webhook

fn admission_review(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3b8a0c7e-2f44-4c1e-9d5e-5d0f8f1e0a01",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// What the API server does with the webhook's answer: the JSON patch
/// (Go's `[]byte`: a base64 string, as the API documents it) applied.
fn apply_review(pod: &Value, answer: &Value) -> Value {
    let resp = &answer["response"];
    assert_eq!(resp["uid"], "3b8a0c7e-2f44-4c1e-9d5e-5d0f8f1e0a01");
    assert_eq!(resp["allowed"], true, "refused: {answer}");
    let mut out = pod.clone();
    let Some(p) = resp.get("patch").filter(|p| !p.is_null()) else {
        return out;
    };
    assert_eq!(resp["patchType"], "JSONPatch");
    let bytes: Vec<u8> = match p {
        Value::String(s) => base64_decode(s),
        other => panic!("patch must be a base64 string, is {other}"),
    };
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    assert_eq!(s.len() % 4, 0, "padded standard base64: {s}");
    for c in s.trim_end_matches('=').bytes() {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

// ------------------------------------------------------------- the chain

/// What the chain up to Allocate leaves for the container.
struct Placed {
    resp: api::ContainerAllocateResponse,
    uid: String,
}

fn annotation<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

/// Admits `name` (one container `main` asking `gpumem` MiB and `gpucores`
/// percent, no GPU count: the webhook adds it) through the webhook,
/// creates it, runs filter → prioritize → bind, then Allocate through the
/// kubelet emulator. Asserts every hand-over on the way.
async fn admit_bind_allocate(
    env: &Env,
    sched: &SchedulerProc,
    kubelet: &Kubelet,
    name: &str,
    gpumem: u64,
    gpucores: u32,
) -> Placed {
    let u0 = uuid(0);
    // 1. Admission, as the API server calls it on CREATE.
    let submitted = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{
            "name": "main", "image": "cuda",
            "resources": {"limits": {
                "nvidia.com/gpumem": gpumem.to_string(),
                "nvidia.com/gpucores": gpucores.to_string(),
                "nvidia.com/priority": "1"
            }}
        }]}
    });
    // The API server defaults the pod (schedulerName: default-scheduler)
    // before it calls mutating webhooks; the webhook must take it over.
    let mut submitted = submitted;
    vgpu_kube_fixture::default_pod(&mut submitted);
    assert_eq!(submitted["spec"]["schedulerName"], "default-scheduler");
    let answer = sched.post("/webhook", &admission_review(&submitted));
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    let admitted = apply_review(&submitted, &answer);
    assert_eq!(admitted["spec"]["schedulerName"], SCHEDULER_NAME);
    let ctr = &admitted["spec"]["containers"][0];
    assert_eq!(
        ctr["resources"]["limits"]["nvidia.com/gpu"], "1",
        "memory and cores alone imply one GPU"
    );
    assert!(
        ctr["env"]
            .as_array()
            .is_some_and(|e| e.contains(&json!({"name": "CUDA_TASK_PRIORITY", "value": "1"}))),
        "nvidia.com/priority becomes CUDA_TASK_PRIORITY: {ctr}"
    );
    let pod: Pod = env
        .fx
        .create(&serde_json::from_value::<Pod>(admitted).unwrap())
        .unwrap();
    let uid = pod
        .metadata
        .uid
        .clone()
        .expect("the API server gave it a UID");

    // 2. kube-scheduler's extender calls (nodeCacheCapable: names only).
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": [NODE, "cpu-only"]});
    let filtered = sched.post("/filter", &args);
    assert_eq!(filtered["NodeNames"], json!([NODE]), "{filtered}");
    assert!(
        filtered["FailedNodes"]
            .get(NODE)
            .or_else(|| filtered["FailedAndUnresolvableNodes"].get(NODE))
            .is_none(),
        "{filtered}"
    );
    assert!(
        filtered["FailedAndUnresolvableNodes"]
            .get("cpu-only")
            .or_else(|| filtered["FailedNodes"].get("cpu-only"))
            .and_then(Value::as_str)
            .is_some_and(|r| !r.is_empty()),
        "an unknown node is refused with a reason: {filtered}"
    );
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": [NODE]});
    let scores = sched.post("/prioritize", &args);
    let list = scores.as_array().expect("HostPriorityList");
    assert_eq!(list.len(), 1, "{scores}");
    assert_eq!(list[0]["Host"], NODE);
    assert!(list[0]["Score"]
        .as_i64()
        .is_some_and(|s| (0..=100).contains(&s)));
    let bound = sched.post(
        "/bind",
        &json!({"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": NODE}),
    );
    assert_eq!(bound["Error"].as_str().unwrap_or(""), "", "{bound}");

    // 3. What the scheduler left for the node agent, in HAMi's forms.
    let pod = env.pod(name);
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(NODE)
    );
    let want = format!("{u0},NVIDIA,{gpumem},{gpucores}:;");
    assert_eq!(annotation(&pod, keys::DEVICES_TO_ALLOCATE), Some(&*want));
    assert_eq!(annotation(&pod, keys::DEVICES_ALLOCATED), Some(&*want));
    assert_eq!(annotation(&pod, keys::ASSIGNED_NODE), Some(NODE));
    assert_eq!(annotation(&pod, keys::BIND_PHASE), Some("allocating"));
    assert_eq!(
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::ASSIGNED_NODE))
            .map(String::as_str),
        Some(NODE)
    );
    for k in [keys::ASSIGNED_TIME, keys::BIND_TIME] {
        assert!(
            annotation(&pod, k).is_some_and(|t| t.parse::<i64>().is_ok()),
            "{k}: {:?}",
            annotation(&pod, k)
        );
    }
    let lock = env
        .node_annotation(keys::NODE_LOCK)
        .expect("the bind holds the node lock until Allocate");
    assert!(lock.ends_with(&format!(",default,{name}")), "{lock}");

    // 4. The kubelet allocates one of the advertised `<UUID>-<i>` devices.
    let mut plugin = kubelet.plugin("vgpu.sock").await;
    let r = plugin
        .allocate(request(&[format!("{u0}-0")]))
        .await
        .expect("Allocate")
        .into_inner();
    assert_eq!(r.container_responses.len(), 1);
    let resp = r.container_responses[0].clone();
    let e = envs(&resp);
    assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], u0);
    assert_eq!(e["CUDA_DEVICE_MEMORY_LIMIT_0"], format!("{gpumem}m"));
    assert_eq!(e["CUDA_DEVICE_SM_LIMIT"], gpucores.to_string());
    assert!(!e.contains_key("CUDA_DEVICE_MEMORY_LIMIT_1"), "{e:?}");
    let pod = env.pod(name);
    assert_eq!(annotation(&pod, keys::BIND_PHASE), Some("success"));
    assert_eq!(
        env.node_annotation(keys::NODE_LOCK),
        None,
        "Allocate releases the node lock"
    );
    Placed { resp, uid }
}

/// The container path of the preloaded library: the line the mounted
/// `/etc/ld.so.preload` names.
fn preload_container_path(resp: &api::ContainerAllocateResponse) -> String {
    let file = to_host(resp, "/etc/ld.so.preload");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let lines: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(lines.len(), 1, "ld.so.preload names one library: {text:?}");
    lines[0].to_owned()
}

/// The env a process in the container gets, with container paths mapped to
/// the host through the answered mounts (there is no container runtime):
/// the region file, the limits file (`/etc/vgpu/limits`, named through
/// `LIBVGPU_LIMITS_FILE` because the default path is the container's), and
/// `/etc/ld.so.preload`'s library as `LD_PRELOAD`. NVIDIA_VISIBLE_DEVICES
/// is applied as the NVIDIA runtime would.
fn container_env(resp: &api::ContainerAllocateResponse) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in envs(resp) {
        match k.as_str() {
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => {
                out.push((k, to_host(resp, &v).display().to_string()))
            }
            "NVIDIA_VISIBLE_DEVICES" => out.push(("CUDA_VISIBLE_DEVICES".into(), v)),
            _ => out.push((k, v)),
        }
    }
    let limits = to_host(resp, vgpu_region::limits::DEFAULT_PATH);
    out.push((
        vgpu_region::limits::PATH_ENV.into(),
        limits.display().to_string(),
    ));
    let lib = to_host(resp, &preload_container_path(resp));
    out.push(("LD_PRELOAD".into(), lib.display().to_string()));
    out
}

/// Checks what the container will see on its filesystem: libvgpu.so and,
/// beside it (the front loads it from its own directory), libvgpu_core.so,
/// both the build's files; the region directory writable; the limits file
/// the operator's, read-only, carrying the assignment.
fn check_container_files(
    resp: &api::ContainerAllocateResponse,
    gpumem: u64,
    gpucores: u32,
) -> PathBuf {
    let lib_in_ctr = preload_container_path(resp);
    let lib = to_host(resp, &lib_in_ctr);
    assert_eq!(
        std::fs::canonicalize(&lib).unwrap(),
        std::fs::canonicalize(libvgpu()).unwrap(),
        "the mounted libvgpu.so is the build's"
    );
    let core_in_ctr = Path::new(&lib_in_ctr).with_file_name("libvgpu_core.so");
    let core = to_host(resp, core_in_ctr.to_str().unwrap());
    let built_core = libvgpu().with_file_name("libvgpu_core.so");
    assert!(built_core.is_file(), "{} is built", built_core.display());
    assert!(
        core.is_file(),
        "libvgpu_core.so must be mounted beside libvgpu.so at {} (host {})",
        core_in_ctr.display(),
        core.display()
    );
    assert_eq!(
        std::fs::canonicalize(&core).unwrap(),
        std::fs::canonicalize(&built_core).unwrap()
    );
    let mounts = mounts(resp);
    let ro = |container: &str| {
        mounts
            .iter()
            .filter(|m| container == m.0 || container.starts_with(&format!("{}/", m.0)))
            .max_by_key(|m| m.0.len())
            .map(|m| m.2)
    };
    assert_eq!(ro(&lib_in_ctr), Some(true), "libvgpu.so read-only");
    assert_eq!(
        ro(vgpu_region::limits::DEFAULT_PATH),
        Some(true),
        "limits read-only"
    );
    let e = envs(resp);
    assert_eq!(
        ro(&e["CUDA_DEVICE_MEMORY_SHARED_CACHE"]),
        Some(false),
        "region writable"
    );
    let limits_file = to_host(resp, vgpu_region::limits::DEFAULT_PATH);
    let limits = vgpu_region::limits::read_limits_file(&limits_file)
        .unwrap_or_else(|e| panic!("{}: {e}", limits_file.display()));
    let d = limits.for_device(&uuid(0));
    assert_eq!(d.memory, Some(gpumem * MIB), "{limits:?}");
    assert_eq!(d.sm, Some(gpucores), "{limits:?}");
    assert_eq!(
        limits.priority,
        Some(1),
        "CUDA_TASK_PRIORITY reaches the file"
    );
    to_host(resp, &e["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
}

/// Starts the agent (kubelet registered, node annotated) and the scheduler
/// (handshake requested once, then left standing) against one fixture.
async fn cluster(env: &Env) -> (Kubelet, Agent, SchedulerProc) {
    // The container-side default limits path must not exist on this host:
    // the interposer would read it instead of the mapped one.
    assert!(
        !Path::new(vgpu_region::limits::DEFAULT_PATH).exists(),
        "{} exists on this host; the chain test maps it per container",
        vgpu_region::limits::DEFAULT_PATH
    );
    let kubelet = Kubelet::start(&env.dp_dir).await;
    let agent = env.agent(&[]);
    let reg = kubelet.wait_registrations(1, Duration::from_secs(20)).await;
    assert_eq!(reg[0].resource_name, "nvidia.com/gpu");
    wait_for(Duration::from_secs(20), "node registration", || {
        env.node_annotation(keys::NODE_REGISTER)
    });
    // The kubelet publishes what ListAndWatch advertised.
    env.fx
        .set_status::<Node>("", NODE, json!({"allocatable": {"nvidia.com/gpu": "10"}}))
        .unwrap();
    let sched = SchedulerProc::start(env);
    // The scheduler asks (`Requesting_`) once; neither side writes the
    // handshake again while nothing changes (no `Reported_` answer, so no
    // new request every cycle).
    let req = wait_for(Duration::from_secs(30), "handshake request", || {
        env.node_annotation(keys::NODE_HANDSHAKE)
            .filter(|h| h.starts_with("Requesting_"))
    });
    env.fx.clear_requests();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        env.node_annotation(keys::NODE_HANDSHAKE).as_deref(),
        Some(req.as_str()),
        "the standing request is neither answered nor renewed"
    );
    let writes: Vec<String> = env
        .fx
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET" && r.path.contains("/nodes/"))
        .map(|r| format!("{} {} {}", r.method, r.path, r.body))
        .collect();
    assert!(
        writes.is_empty(),
        "node written with nothing changed: {writes:?}"
    );
    (kubelet, agent, sched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_admitted_bound_and_allocated_is_held_to_its_memory_and_reported() {
    let env = Env::new(1);
    let (kubelet, agent, sched) = cluster(&env).await;
    let u0 = uuid(0);
    let Placed { resp, uid } = admit_bind_allocate(&env, &sched, &kubelet, "train", 1024, 30).await;
    let region = check_container_files(&resp, 1024, 30);
    // Join the process to its container by a real cgroup when we can (the
    // monitor's per-container utilization); memory is read from the region
    // either way.
    let cg = node_common::Cgroup::new(&uid, 7);
    if let Some(cg) = &cg {
        env.set_running("train", &[("main", &cg.container_id)]);
    } else {
        eprintln!("note: no writable cgroup hierarchy; the worker runs outside one");
    }

    // 5. The workload, with exactly the container's env.
    let cenv = container_env(&resp);
    let mut w = Worker::start(
        &env,
        false, // LD_PRELOAD comes from cenv: ld.so.preload's library
        &cenv,
        cg.as_ref().map(|c| c.dir.as_path()),
        &[
            "init", "ctx", "0", "mem-info", "alloc", "1100", "alloc", "600", "alloc", "600",
            "alloc", "100", "mem-info", "ready", "wait",
        ],
    );
    w.expect("ready");
    let mem: Vec<(u64, u64)> = w
        .seen
        .iter()
        .filter_map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            match v[..] {
                ["mem", "free", f, "total", t] => Some((f.parse().unwrap(), t.parse().unwrap())),
                _ => None,
            }
        })
        .collect();
    let allocs: Vec<&str> = w
        .seen
        .iter()
        .filter(|l| l.starts_with("alloc"))
        .map(String::as_str)
        .collect();
    assert_eq!(mem.len(), 2, "{:?}", w.seen);
    assert_eq!(
        mem[0].1,
        1024 * MIB,
        "cuMemGetInfo shows the budget: {:?}",
        w.seen
    );
    // The context is charged to the budget; 600 MiB still fit.
    assert!(
        mem[0].0 < 1024 * MIB && mem[0].0 >= 600 * MIB,
        "{:?}",
        w.seen
    );
    assert_eq!(
        allocs,
        ["alloc err 2", "alloc ok", "alloc err 2", "alloc ok"],
        "beyond the budget: CUDA_ERROR_OUT_OF_MEMORY; within: success"
    );
    assert_eq!(mem[1].1, 1024 * MIB);
    assert_eq!(
        mem[1].0,
        mem[0].0 - 700 * MIB,
        "free shrinks by what was taken: {:?}",
        w.seen
    );

    // 6. The node monitor reports it under the pod's labels.
    let snap = vgpu_region::Region::open_read_only(&region)
        .expect("region")
        .snapshot();
    let d = &snap.devices[0];
    assert_eq!(d.uuid, u0);
    assert_eq!(d.data, 700 * MIB);
    let l = [
        ("namespace", "default"),
        ("pod", "train"),
        ("container", "main"),
        ("vdevice_index", "0"),
        ("device_uuid", u0.as_str()),
    ];
    let text = wait_for(Duration::from_secs(20), "the pod's series", || {
        let t = agent.scrape();
        value(&t, "hami_vgpu_memory_used_bytes", &l).map(|_| t)
    });
    assert_eq!(
        value(&text, "hami_vgpu_memory_used_bytes", &l),
        Some(d.used as f64)
    );
    assert_eq!(
        value(&text, "hami_vgpu_memory_limit_bytes", &l),
        Some((1024 * MIB) as f64)
    );
    assert_eq!(value(&text, "vgpu_container_processes", &l[..3]), Some(1.0));

    // 7. The scheduler's view of the same slice.
    let st = sched.scrape();
    assert_eq!(
        value(
            &st,
            "hami_vgpu_memory_allocated_bytes",
            &[
                ("namespace", "default"),
                ("pod", "train"),
                ("device_uuid", &u0)
            ]
        ),
        Some((1024 * MIB) as f64),
        "{st}"
    );
    assert_eq!(
        value(
            &st,
            "hami_gpu_core_allocated_ratio",
            &[("node", NODE), ("device_uuid", &u0)]
        ),
        Some(30.0)
    );
    w.proceed();
}

/// Kernel throughput (kernels per second of wall time, the final drain of
/// the launch queue included) of a process with `cenv` launching
/// back-to-back 2-wave kernels for `ms`.
fn throughput(env: &Env, cenv: &[(String, String)], cg: Option<&Path>, ms: u64) -> f64 {
    let ms = ms.to_string();
    let mut w = Worker::start(
        env,
        false,
        cenv,
        cg,
        &[
            "init", "ctx", "0", "ready", "launch", "200", "264", &ms, "ready", "wait",
        ],
    );
    w.expect("ready");
    let t0 = Instant::now();
    w.expect("ready");
    let elapsed = t0.elapsed().as_secs_f64();
    let n: u64 = w
        .seen
        .iter()
        .find_map(|l| l.strip_prefix("launched "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no launch count: {:?}", w.seen));
    w.proceed();
    n as f64 / elapsed
}

/// The SM half of the chain: the assigned cores hold the process to that
/// share of the device, measured against a run of the same process with
/// no SM limit in the same test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_admitted_bound_and_allocated_is_held_to_its_sm_share() {
    let env = Env::new(1);
    let (kubelet, _agent, sched) = cluster(&env).await;
    let cores = 30;
    let Placed { resp, uid } = admit_bind_allocate(&env, &sched, &kubelet, "sm", 1024, cores).await;
    check_container_files(&resp, 1024, cores);
    let cg = node_common::Cgroup::new(&uid, 8);
    if let Some(cg) = &cg {
        env.set_running("sm", &[("main", &cg.container_id)]);
    }
    let cenv = container_env(&resp);
    // The baseline: the same workload with nothing limiting it.
    let free: Vec<(String, String)> = cenv
        .iter()
        .filter(|(k, _)| k != "LD_PRELOAD" && k != "CUDA_DEVICE_SM_LIMIT")
        .cloned()
        .collect();
    let window_ms = 6000;
    let base = throughput(&env, &free, None, window_ms);
    let limited = throughput(&env, &cenv, cg.as_ref().map(|c| c.dir.as_path()), window_ms);
    let share = 100.0 * limited / base;
    assert!(
        (share - f64::from(cores)).abs() <= 15.0,
        "achieved {share:.1} % of the device ({limited:.0} kernels/s limited, {base:.0} \
         free, over {window_ms} ms each); assigned {cores} %"
    );
}
