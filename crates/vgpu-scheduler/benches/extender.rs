//! Benchmark: filter + prioritize for one pod over 1,000 nodes × 8 GPUs
//! with half their capacity in use (target p99 < 20 ms), in process and
//! over HTTP; then binds per second against the API fixture.
//!
//! `cargo bench -p vgpu-scheduler --bench extender` (env
//! `VGPU_BENCH_ITERS`, default 300; `VGPU_BENCH_RAW=<file>` writes every
//! sample as CSV). Prints numbers, asserts nothing about time; every
//! failed call is counted beside the percentiles.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;
use vgpu_hami::{keys, register, NodeDevice, NodeLock};
use vgpu_kube_fixture::ApiFixture;
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::decide;
use vgpu_scheduler::extender::{
    ExtenderArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
};
use vgpu_scheduler::scheduler::{local_now, Scheduler};
use vgpu_scheduler::server;

const NODES: usize = 1000;
const GPUS: usize = 8;
const CARD_MIB: i32 = 81920;

fn node(i: usize) -> Node {
    let devices: Vec<NodeDevice> = (0..GPUS)
        .map(|g| NodeDevice {
            id: format!("GPU-{i:04}-{g}"),
            index: g as u64,
            count: 10,
            devmem: CARD_MIB,
            devcore: 100,
            device_type: "NVIDIA-A100-SXM4-80GB".into(),
            numa: (g / 4) as i64,
            mode: "hami-core".into(),
            health: true,
            ..Default::default()
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": format!("node-{i:04}"),
        "annotations": {keys::NODE_REGISTER: register::encode(&devices)}},
        "status": {"allocatable": {"nvidia.com/gpu": "80"}}}))
    .unwrap()
}

/// A pod already holding `mem` MiB and `cores` on one GPU.
fn holder(uid: usize, node: usize, gpu: usize, mem: u32, cores: u32) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": format!("h{uid}"), "namespace": "ml", "uid": format!("h{uid}"),
        "annotations": {keys::ASSIGNED_NODE: format!("node-{node:04}"),
            keys::DEVICES_ALLOCATED: format!("GPU-{node:04}-{gpu},NVIDIA,{mem},{cores}:;")}},
        "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}}),
    )
    .unwrap()
}

/// 1,000 × 8 GPUs, each between 0 and 100 % used (mean 50 %) in memory,
/// cores and slots, by up to 10 pods; deterministic.
fn cluster(s: &Scheduler) -> usize {
    let mut rng = fastrand::Rng::with_seed(1662);
    let mut st = s.write();
    let mut uid = 0;
    for n in 0..NODES {
        st.apply_node(&node(n), &s.cfg, local_now());
        for g in 0..GPUS {
            let tenants = rng.usize(0..=10);
            for _ in 0..tenants {
                uid += 1;
                st.apply_pod(&holder(uid, n, g, CARD_MIB as u32 / 10, 10), Instant::now());
            }
        }
    }
    uid
}

fn pod() -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "train", "namespace": "ml", "uid": "bench-pod"},
        "spec": {"containers": [{"name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "16000", "nvidia.com/gpucores": "30"}}}]}}))
    .unwrap()
}

struct Stats {
    name: String,
    samples: Vec<f64>,
    failures: usize,
}

impl Stats {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.samples.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i]
    }
    fn row(&self, baseline_p50: f64) {
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1}x |",
            self.name,
            self.samples.len(),
            self.failures,
            self.pct(50.0),
            self.pct(90.0),
            self.pct(99.0),
            self.pct(100.0),
            self.pct(50.0) / baseline_p50
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "s")
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let code = resp.status().as_u16();
    (
        code,
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

fn main() {
    let iters: usize = std::env::var("VGPU_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let fx = ApiFixture::start();
        let s = Scheduler::new(fx.client(), SchedulerConfig::default(), false);
        let t0 = Instant::now();
        let holders = cluster(&s);
        let (mut used, mut total) = (0u64, 0u64);
        {
            let st = s.read();
            for (name, inv) in &st.nodes {
                for d in &inv.devices {
                    used += st.ledger.device(name, &d.uuid).memory_mib;
                    total += d.memory_mib;
                }
            }
        }
        println!("cluster: {NODES} nodes x {GPUS} GPUs, {holders} pods holding GPUs, memory {:.1} % used (built in {:.0} ms)",
            100.0 * used as f64 / total as f64, ms(t0.elapsed()));
        let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:04}")).collect();
        let pod = pod();
        let args_json = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names})).unwrap();
        let cfg = s.cfg.clone();

        // In process: decode the body, answer, encode, as the handler does.
        let mut decode = Stats { name: "decode+encode only (baseline)".into(), samples: vec![], failures: 0 };
        let mut filter = Stats { name: "filter".into(), samples: vec![], failures: 0 };
        let mut prio = Stats { name: "prioritize (feasible nodes)".into(), samples: vec![], failures: 0 };
        let mut both = Stats { name: "filter + prioritize".into(), samples: vec![], failures: 0 };
        let mut feasible = 0;
        for _ in 0..iters {
            let t = Instant::now();
            let args: ExtenderArgs = serde_json::from_slice(&args_json).unwrap();
            let empty = ExtenderFilterResult { node_names: args.node_names.clone(), ..Default::default() };
            std::hint::black_box(serde_json::to_vec(&empty).unwrap());
            decode.samples.push(ms(t.elapsed()));

            let t = Instant::now();
            let args: ExtenderArgs = serde_json::from_slice(&args_json).unwrap();
            let r = decide::filter(&s.read(), &args, &cfg, local_now());
            let out = serde_json::to_vec(&r).unwrap();
            let f = t.elapsed();
            filter.samples.push(ms(f));
            let fits = r.node_names.unwrap_or_default();
            if !r.error.is_empty() || fits.is_empty() {
                filter.failures += 1;
            }
            feasible = fits.len();
            std::hint::black_box(out);
            let body = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": fits})).unwrap();
            let t = Instant::now();
            let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
            let scores = decide::prioritize(&s.read(), &args, &cfg, local_now());
            std::hint::black_box(serde_json::to_vec(&scores).unwrap());
            let p = t.elapsed();
            prio.samples.push(ms(p));
            if scores.len() != feasible {
                prio.failures += 1;
            }
            both.samples.push(ms(f + p));
            both.failures += usize::from(feasible == 0);
        }
        println!("\nfilter + prioritize, one pod (2 GPUs x 16000 MiB, 30 cores) over {NODES} node names, {feasible} feasible; {iters} iterations; ms");
        println!("\n| path | samples | fail | p50 | p90 | p99 | max | p50 / baseline |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        let base = decode.pct(50.0);
        for st in [&decode, &filter, &prio, &both] {
            st.row(base);
        }

        // Over HTTP, the way kube-scheduler calls it (new connection each time).
        s.nodes_synced.store(true, Ordering::Release);
        s.pods_synced.store(true, Ordering::Release);
        let listener = server::serve(s.clone(), "127.0.0.1:0".parse().unwrap(), None).await.unwrap();
        let mut healthz = Stats { name: "GET /healthz (baseline)".into(), samples: vec![], failures: 0 };
        let mut hboth = Stats { name: "POST /filter + /prioritize".into(), samples: vec![], failures: 0 };
        for _ in 0..iters {
            let t = Instant::now();
            let (code, _) = http(listener.addr, "GET", "/healthz", vec![]).await;
            healthz.samples.push(ms(t.elapsed()));
            healthz.failures += usize::from(code != 200);
            let t = Instant::now();
            let (code, body) = http(listener.addr, "POST", "/filter", args_json.clone()).await;
            let ok = code == 200;
            let r: ExtenderFilterResult = serde_json::from_slice(&body).unwrap_or_default();
            let fits = r.node_names.unwrap_or_default();
            let body = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": fits})).unwrap();
            let (code2, body2) = http(listener.addr, "POST", "/prioritize", body).await;
            hboth.samples.push(ms(t.elapsed()));
            let scores: Vec<HostPriority> = serde_json::from_slice(&body2).unwrap_or_default();
            hboth.failures += usize::from(!ok || code2 != 200 || fits.is_empty() || scores.len() != fits.len());
        }
        println!("\nover HTTP/1.1 on loopback (client and server on this machine); ms");
        println!("\n| path | samples | fail | p50 | p90 | p99 | max | p50 / baseline |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        let base = healthz.pct(50.0);
        healthz.row(base);
        hboth.row(base);
        if let Ok(path) = std::env::var("VGPU_BENCH_RAW") {
            let mut csv = String::from("series,iteration,ms\n");
            for st in [&decode, &filter, &prio, &both, &healthz, &hboth] {
                for (i, v) in st.samples.iter().enumerate() {
                    csv.push_str(&format!("{},{i},{v:.4}\n", st.name));
                }
            }
            std::fs::write(&path, csv).unwrap();
        }
        drop(listener);

        binds(&fx).await;
    });
}

/// Binds per second against the API fixture: pods spread over nodes, a
/// stand-in device plugin releasing each node lock once its pod is bound.
async fn binds(fx: &ApiFixture) {
    const BIND_NODES: usize = 50;
    const PODS: usize = 200;
    for n in 0..BIND_NODES {
        let mut nd = node(n);
        nd.status = None;
        fx.create(&nd).unwrap();
        fx.set_status::<Node>(
            "",
            &format!("node-{n:04}"),
            json!({"allocatable": {"nvidia.com/gpu": "80"}}),
        )
        .unwrap();
    }
    let cfg = SchedulerConfig {
        node_lock_wait: Duration::from_secs(30),
        ..SchedulerConfig::default()
    };
    let s = Scheduler::new(fx.client(), cfg, false);
    let running = vgpu_scheduler::run::start(
        s.clone(),
        vgpu_scheduler::run::RunOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics: None,
            tls: None,
            node_label_selector: None,
            handshake_period: None,
        },
    )
    .await
    .unwrap();
    while !s.ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let releaser = tokio::spawn(release_locks(fx.client()));
    // Baseline: plain GETs against the same fixture, one at a time.
    let pods_api: Api<Pod> = Api::namespaced(fx.client(), "ml");
    let probe: Pod = fx
        .create(
            &serde_json::from_value::<Pod>(
                json!({"metadata": {"name": "probe", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            )
            .unwrap(),
        )
        .unwrap();
    let t = Instant::now();
    for _ in 0..200 {
        pods_api
            .get(probe.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
    }
    let gets_per_s = 200.0 / t.elapsed().as_secs_f64();
    println!("\nbinds against the API fixture: {PODS} pods (1 GPU x 8000 MiB each) over {BIND_NODES} nodes; a stand-in device plugin releases each node lock after its pod is bound");
    println!("baseline: {gets_per_s:.0} GET pod/s (sequential, same fixture)");
    println!("\n| concurrency | binds | fail | wall s | binds/s | p50 ms | p99 ms | API requests per bind | binds/s / GET/s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (round, conc) in [1usize, 8, 32].into_iter().enumerate() {
        let pods: Vec<Pod> = (0..PODS).map(|i| fx.create(&serde_json::from_value::<Pod>(json!({
            "metadata": {"name": format!("b{round}-{i:03}"), "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}}]}})).unwrap()).unwrap()).collect();
        fx.clear_requests();
        let started = Instant::now();
        let queue = Arc::new(std::sync::Mutex::new(
            pods.into_iter().enumerate().collect::<Vec<_>>(),
        ));
        let mut workers = Vec::new();
        for _ in 0..conc {
            let queue = queue.clone();
            let addr = running.listen;
            workers.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let Some((i, p)) = queue.lock().unwrap().pop() else { break };
                    let args = json!({"PodName": p.metadata.name, "PodNamespace": "ml", "PodUID": p.metadata.uid,
                        "Node": format!("node-{:04}", i % BIND_NODES)});
                    let t = Instant::now();
                    let (code, body) = http(addr, "POST", "/bind", serde_json::to_vec(&args).unwrap()).await;
                    let r: ExtenderBindingResult = serde_json::from_slice(&body).unwrap_or(ExtenderBindingResult { error: "bad body".into() });
                    out.push((ms(t.elapsed()), code == 200 && r.error.is_empty()));
                }
                out
            }));
        }
        let mut lat = Stats {
            name: String::new(),
            samples: vec![],
            failures: 0,
        };
        for w in workers {
            for (l, ok) in w.await.unwrap() {
                lat.samples.push(l);
                lat.failures += usize::from(!ok);
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let ok = PODS - lat.failures;
        let requests = fx.requests().len();
        println!(
            "| {conc} | {ok} | {} | {wall:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} |",
            lat.failures,
            ok as f64 / wall,
            lat.pct(50.0),
            lat.pct(99.0),
            requests as f64 / PODS as f64,
            (ok as f64 / wall) / gets_per_s
        );
    }
    println!("(API requests per bind include the stand-in device plugin's polling and the scheduler's watches)");
    releaser.abort();
    drop(running);
}

async fn release_locks(client: kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        if let Ok(list) = nodes.list(&Default::default()).await {
            for n in list.items {
                let Some(v) = n
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(keys::NODE_LOCK))
                else {
                    continue;
                };
                let Some(owner) = NodeLock::parse(v).ok().and_then(|l| l.owner) else {
                    continue;
                };
                let pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
                let Ok(p) = pods.get(&owner.pod).await else {
                    continue;
                };
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    continue;
                }
                let release = json!({"metadata": {"annotations": {keys::NODE_LOCK: null}, "resourceVersion": n.metadata.resource_version}});
                let _ = nodes
                    .patch(
                        n.metadata.name.as_deref().unwrap(),
                        &PatchParams::default(),
                        &Patch::Merge(&release),
                    )
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
