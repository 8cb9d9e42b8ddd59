//! Shared by the API-level tests: GPU nodes and pods as objects, a running
//! scheduler against the API fixture, kube-scheduler's side of the
//! extender protocol (filter, prioritize, pick, bind) over real HTTP, and
//! a stand-in for the device plugin's half of HAMi's lock protocol.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use vgpu_hami::{keys, register, NodeDevice, NodeLock, PodDevices};
use vgpu_kube_fixture::ApiFixture;
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::extender::{ExtenderBindingResult, ExtenderFilterResult, HostPriority};
use vgpu_scheduler::run::{self, RunOptions, Running};
use vgpu_scheduler::scheduler::Scheduler;

pub const CARD_MIB: u64 = 10000;

/// A GPU node: `cards` cards of 10000 MiB, 100 cores, `slots` vGPUs each.
pub fn gpu_node(name: &str, cards: usize, slots: i32) -> Node {
    let devices: Vec<NodeDevice> = (0..cards)
        .map(|i| NodeDevice {
            id: format!("GPU-{name}-{i}"),
            index: i as u64,
            count: slots,
            devmem: CARD_MIB as i32,
            devcore: 100,
            device_type: "NVIDIA-A100-SXM4-80GB".into(),
            numa: (i / 4) as i64,
            mode: "hami-core".into(),
            health: true,
            ..Default::default()
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": "on"},
            "annotations": {keys::NODE_REGISTER: register::encode(&devices)}},
    }))
    .unwrap()
}

/// Adds the node with `allocatable nvidia.com/gpu` set (its device plugin is up).
pub fn add_node(fx: &ApiFixture, node: &Node) {
    let name = node.metadata.name.clone().unwrap();
    fx.create(node).unwrap();
    fx.set_status::<Node>(
        "",
        &name,
        json!({"allocatable": {"nvidia.com/gpu": "80"}, "capacity": {"nvidia.com/gpu": "80"}}),
    )
    .unwrap();
}

/// A pending pod with one container asking for `limits`.
pub fn gpu_pod(ns: &str, name: &str, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": "hami-scheduler",
                 "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}
    }))
    .unwrap()
}

pub fn config() -> SchedulerConfig {
    SchedulerConfig {
        node_lock_wait: Duration::from_secs(20),
        ..SchedulerConfig::default()
    }
}

/// A scheduler against the fixture, on an ephemeral port, synced.
pub async fn start(fx: &ApiFixture, cfg: SchedulerConfig) -> Running {
    let s = Scheduler::new(fx.client(), cfg, false);
    let running = run::start(
        s,
        RunOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics: Some("127.0.0.1:0".parse().unwrap()),
            tls: None,
            node_label_selector: None,
            handshake_period: None,
        },
    )
    .await
    .unwrap();
    wait_until("the scheduler reads the cluster", || {
        running.scheduler.ready()
    })
    .await;
    running
}

pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One HTTP/1.1 request; returns (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> (u16, Vec<u8>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "scheduler")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body)
}

/// kube-scheduler's side for one pod: filter over `nodes` (NodeNames, as
/// with nodeCacheCapable), prioritize the survivors, take the top score
/// (first on ties), bind. Returns the node, or the filter result when
/// nothing fits, or the bind error.
pub async fn schedule(addr: SocketAddr, pod: &Pod, nodes: &[String]) -> Result<String, String> {
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": nodes});
    let (code, body) = http(
        addr,
        "POST",
        "/filter",
        Some(serde_json::to_vec(&args).unwrap()),
    )
    .await;
    assert_eq!(code, 200);
    let filtered: ExtenderFilterResult = serde_json::from_slice(&body).unwrap();
    if !filtered.error.is_empty() {
        return Err(filtered.error);
    }
    let fits = filtered.node_names.clone().unwrap_or_default();
    if fits.is_empty() {
        return Err(format!(
            "no node fits: {:?} {:?}",
            filtered.failed_nodes, filtered.failed_and_unresolvable_nodes
        ));
    }
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": fits});
    let (code, body) = http(
        addr,
        "POST",
        "/prioritize",
        Some(serde_json::to_vec(&args).unwrap()),
    )
    .await;
    assert_eq!(code, 200);
    let scores: Vec<HostPriority> = serde_json::from_slice(&body).unwrap();
    assert_eq!(scores.len(), fits.len());
    let best = scores
        .iter()
        .max_by_key(|h| {
            (
                h.score,
                std::cmp::Reverse(fits.iter().position(|n| *n == h.host)),
            )
        })
        .unwrap();
    bind(addr, pod, &best.host)
        .await
        .map(|()| best.host.clone())
}

pub async fn bind(addr: SocketAddr, pod: &Pod, node: &str) -> Result<(), String> {
    let args = json!({
        "PodName": pod.metadata.name, "PodNamespace": pod.metadata.namespace,
        "PodUID": pod.metadata.uid, "Node": node,
    });
    let (code, body) = http(
        addr,
        "POST",
        "/bind",
        Some(serde_json::to_vec(&args).unwrap()),
    )
    .await;
    assert_eq!(code, 200);
    let r: ExtenderBindingResult = serde_json::from_slice(&body).unwrap();
    if r.error.is_empty() {
        Ok(())
    } else {
        Err(r.error)
    }
}

/// What the device plugin does with HAMi's lock: finds the pod the lock
/// names, marks it `bind-phase=success` once it is bound, releases the
/// lock. Runs until dropped.
pub struct LockReleaser {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LockReleaser {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn release_locks(client: kube::Client) -> LockReleaser {
    let task = tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client.clone());
        loop {
            if let Ok(list) = nodes.list(&Default::default()).await {
                for n in list.items {
                    let Some(value) = n
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(keys::NODE_LOCK))
                    else {
                        continue;
                    };
                    let Ok(lock) = NodeLock::parse(value) else {
                        continue;
                    };
                    let Some(owner) = lock.owner else { continue };
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
                    let Ok(p) = pods.get(&owner.pod).await else {
                        continue;
                    };
                    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                        continue; // not bound yet: the binder is still working
                    }
                    let phase = json!({"metadata": {"annotations": {keys::BIND_PHASE: "success"}}});
                    let _ = pods
                        .patch(&owner.pod, &PatchParams::default(), &Patch::Merge(&phase))
                        .await;
                    let release = json!({"metadata": {"annotations": {keys::NODE_LOCK: null},
                        "resourceVersion": n.metadata.resource_version}});
                    let _ = nodes
                        .patch(
                            n.metadata.name.as_deref().unwrap(),
                            &PatchParams::default(),
                            &Patch::Merge(&release),
                        )
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    LockReleaser { task }
}

/// (slots, MiB, cores) per GPU UUID, recounted from every pod's
/// `vgpu-devices-allocated` in the API server (independent of the
/// scheduler's ledger).
pub fn recount(fx: &ApiFixture) -> HashMap<String, (u32, u64, u32)> {
    let mut out: HashMap<String, (u32, u64, u32)> = HashMap::new();
    for p in fx.list::<Pod>() {
        let Some(list) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::DEVICES_ALLOCATED))
        else {
            continue;
        };
        for d in PodDevices::parse(list).unwrap().devices() {
            let e = out.entry(d.uuid.clone()).or_default();
            e.0 += 1;
            e.1 += u64::from(d.mem_mib);
            e.2 += d.cores;
        }
    }
    out
}

/// Asserts no GPU holds more than it has.
pub fn assert_no_overbooking(fx: &ApiFixture, slots: u32) {
    for (uuid, (s, mem, cores)) in recount(fx) {
        assert!(s <= slots, "{uuid}: {s} slots of {slots}");
        assert!(mem <= CARD_MIB, "{uuid}: {mem} MiB of {CARD_MIB}");
        assert!(cores <= 100, "{uuid}: {cores} cores of 100");
    }
}

pub fn node_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-{i}")).collect()
}

pub type Shared = Arc<Scheduler>;
