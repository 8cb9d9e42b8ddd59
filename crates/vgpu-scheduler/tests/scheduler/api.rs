//! The scheduler against the Kubernetes API fixture, driven over HTTP the
//! way kube-scheduler drives an extender: batches across nodes, two
//! replicas binding at once, a restart, HAMi's node lock in every state,
//! rollback when the binding fails.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use vgpu_hami::{keys, NodeLock, PodDevices};
use vgpu_kube_fixture::ApiFixture;
use vgpu_scheduler::config::SchedulerConfig;

fn create_pods(fx: &ApiFixture, n: usize, limits: serde_json::Value) -> Vec<Pod> {
    (0..n)
        .map(|i| {
            fx.create(&gpu_pod("ml", &format!("job-{i:02}"), limits.clone()))
                .unwrap()
        })
        .collect()
}

fn fresh(fx: &ApiFixture, p: &Pod) -> Pod {
    fx.get::<Pod>("ml", p.metadata.name.as_deref().unwrap())
        .unwrap()
}

fn ann<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_across_nodes_then_a_restart_rebuilds_usage_exactly() {
    let fx = ApiFixture::start();
    for n in node_names(3) {
        add_node(&fx, &gpu_node(&n, 2, 4));
    }
    let _releaser = release_locks(fx.client());
    let sched = start(&fx, config()).await;
    // 3000 MiB, 20 cores: three per card by memory, 6 cards: 18 fit.
    let pods = create_pods(
        &fx,
        19,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"}),
    );
    let nodes = node_names(3);
    let mut placed = Vec::new();
    for p in &pods[..18] {
        let node = schedule(sched.listen, p, &nodes)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", p.metadata.name.as_deref().unwrap()));
        placed.push(node);
    }
    // Node binpack (the default): a node is filled before the next is used.
    assert_eq!(placed[..6], ["gpu-0"; 6]);
    assert_eq!(placed[6..12], ["gpu-1"; 6]);
    assert_eq!(placed[12..], ["gpu-2"; 6]);
    let last = schedule(sched.listen, &pods[18], &nodes).await.unwrap_err();
    assert!(last.contains("insufficient free memory"), "{last}");
    wait_until("every lock is released", || {
        fx.list::<Node>()
            .iter()
            .all(|n| ann_node(n, keys::NODE_LOCK).is_none())
    })
    .await;
    for (p, node) in pods.iter().zip(&placed) {
        let p = fresh(&fx, p);
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some(node.as_str())
        );
        assert_eq!(ann(&p, keys::ASSIGNED_NODE), Some(node.as_str()));
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()[keys::ASSIGNED_NODE],
            *node
        );
        assert_eq!(
            ann(&p, keys::DEVICES_TO_ALLOCATE),
            ann(&p, keys::DEVICES_ALLOCATED)
        );
        assert_eq!(ann(&p, keys::BIND_PHASE), Some("success"));
        assert!(ann(&p, keys::BIND_TIME).unwrap().parse::<i64>().unwrap() > 1_700_000_000);
        assert!(ann(&p, keys::ASSIGNED_TIME).is_some());
        let list = PodDevices::parse(ann(&p, keys::DEVICES_ALLOCATED).unwrap()).unwrap();
        assert_eq!(list.containers.len(), 1);
        let d = &list.containers[0][0];
        assert!(
            d.uuid.starts_with(&format!("GPU-{node}-")),
            "{} on {node}",
            d.uuid
        );
        assert_eq!(
            (d.device_type.as_str(), d.mem_mib, d.cores),
            ("NVIDIA", 3000, 20)
        );
    }
    assert_no_overbooking(&fx, 4);
    let counted = recount(&fx);
    assert_eq!(counted.len(), 6);
    assert!(
        counted
            .values()
            .all(|&(s, m, c)| (s, m, c) == (3, 9000, 60)),
        "{counted:?}"
    );

    // A new scheduler (a restart) reads the same usage from the pods alone.
    let before = ledger_of(&sched);
    drop(sched);
    let again = start(&fx, config()).await;
    let after = ledger_of(&again);
    assert_eq!(after, before);
    assert_eq!(after, counted);
    // And it refuses what the first one refused.
    let err = schedule(again.listen, &pods[18], &nodes).await.unwrap_err();
    assert!(err.contains("insufficient free memory"), "{err}");
}

fn ann_node<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

fn ledger_of(r: &vgpu_scheduler::run::Running) -> HashMap<String, (u32, u64, u32)> {
    let st = r.scheduler.read();
    let mut out = HashMap::new();
    for (name, inv) in &st.nodes {
        for d in &inv.devices {
            let u = st.ledger.device(name, &d.uuid);
            if !u.is_zero() {
                out.insert(d.uuid.clone(), (u.slots, u.memory_mib, u.cores));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_binding_at_once_never_double_book() {
    let fx = ApiFixture::start();
    for n in node_names(2) {
        add_node(&fx, &gpu_node(&n, 2, 10));
    }
    let _releaser = release_locks(fx.client());
    // Two independent schedulers: own client, own picture, same API server.
    let a = start(&fx, config()).await;
    let b = start(&fx, config()).await;
    // 4000 MiB each: two per card, 4 cards: 8 fit, 6 must not.
    let pods = create_pods(
        &fx,
        14,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}),
    );
    let nodes = node_names(2);
    let mut pending: Vec<Pod> = pods.clone();
    let mut bound = 0;
    let mut reasons = Vec::new();
    for _round in 0..30 {
        // Every pending pod at once, alternating replicas.
        let attempts = pending.iter().enumerate().map(|(i, p)| {
            let addr = if i % 2 == 0 { a.listen } else { b.listen };
            let nodes = nodes.clone();
            let p = p.clone();
            async move { (p.clone(), schedule(addr, &p, &nodes).await) }
        });
        let results = join_all(attempts).await;
        let mut next = Vec::new();
        let mut progress = false;
        for (p, r) in results {
            match r {
                Ok(_) => {
                    bound += 1;
                    progress = true;
                }
                Err(e) => {
                    reasons.push(e.clone());
                    if !e.starts_with("no node fits") {
                        progress = true; // a lost race: kube-scheduler retries
                    }
                    next.push(p);
                }
            }
        }
        assert_no_overbooking(&fx, 10);
        pending = next;
        if !progress {
            break;
        }
    }
    eprintln!("lost races and refusals: {reasons:#?}");
    assert_eq!(bound, 8, "reasons: {reasons:#?}");
    assert_eq!(pending.len(), 6);
    let counted = recount(&fx);
    assert_eq!(counted.len(), 4);
    assert!(
        counted.values().all(|&(s, m, _)| (s, m) == (2, 8000)),
        "{counted:?}"
    );
    // Each refusal said why.
    assert!(reasons.iter().all(|r| !r.trim().is_empty()));
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("insufficient free memory")),
        "{reasons:#?}"
    );
}

async fn locked_by(fx: &ApiFixture, node: &str, value: &str) {
    fx.merge_patch::<Node>(
        "",
        node,
        &json!({"metadata": {"annotations": {keys::NODE_LOCK: value}}}),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hamis_node_lock_in_every_state() {
    let fx = ApiFixture::start();
    add_node(&fx, &gpu_node("gpu-0", 1, 10));
    let cfg = SchedulerConfig {
        node_lock_wait: Duration::from_millis(300),
        ..config()
    };
    let sched = start(&fx, cfg).await;
    let ask = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"});
    let holder = fx.create(&gpu_pod("ml", "holder", ask.clone())).unwrap();
    let pods = create_pods(&fx, 4, ask);

    // A live lock of an existing pod: waited for, then refused with who holds it.
    let now = jiff::Timestamp::now();
    locked_by(
        &fx,
        "gpu-0",
        &NodeLock::new(now, "ml", "holder").to_string(),
    )
    .await;
    let err = bind(sched.listen, &pods[0], "gpu-0").await.unwrap_err();
    assert!(
        err.starts_with("node gpu-0 is locked by ml/holder"),
        "{err}"
    );
    assert_eq!(
        ann(&fresh(&fx, &pods[0]), keys::ASSIGNED_NODE),
        None,
        "nothing written"
    );

    // Its pod is gone: the lock is broken and taken.
    assert!(fx.delete::<Pod>("ml", "holder"));
    drop(holder);
    bind(sched.listen, &pods[0], "gpu-0").await.unwrap();
    let node = fx.get::<Node>("", "gpu-0").unwrap();
    let lock = NodeLock::parse(ann_node(&node, keys::NODE_LOCK).unwrap()).unwrap();
    assert!(lock.is_held_by("ml", "job-00"), "{lock}");
    // The value is HAMi's: <RFC3339>,<namespace>,<pod>.
    let value = ann_node(&node, keys::NODE_LOCK).unwrap();
    assert!(
        value.ends_with(",ml,job-00") && value.len() == "2025-06-01T08:30:00Z,ml,job-00".len(),
        "{value}"
    );

    // Held by a bound pod whose Allocate has not come: the next bind waits, then fails.
    let err = bind(sched.listen, &pods[1], "gpu-0").await.unwrap_err();
    assert!(err.contains("is locked by ml/job-00"), "{err}");

    // Expired (older than 5 min): broken even though its pod exists.
    let old = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    locked_by(
        &fx,
        "gpu-0",
        &NodeLock::new(old, "ml", "job-00").to_string(),
    )
    .await;
    bind(sched.listen, &pods[1], "gpu-0").await.unwrap();

    // A legacy bare-timestamp lock, expired, is broken too.
    locked_by(&fx, "gpu-0", "2020-01-01T00:00:00Z").await;
    bind(sched.listen, &pods[2], "gpu-0").await.unwrap();

    // An unreadable lock is never guessed at.
    locked_by(&fx, "gpu-0", "tomorrow").await;
    let err = bind(sched.listen, &pods[3], "gpu-0").await.unwrap_err();
    assert!(
        err.starts_with("node gpu-0: cannot read its lock \"tomorrow\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_binding_is_rolled_back() {
    let fx = ApiFixture::start();
    add_node(&fx, &gpu_node("gpu-0", 1, 10));
    let cfg = SchedulerConfig {
        node_lock_wait: Duration::from_millis(300),
        ..config()
    };
    let sched = start(&fx, cfg).await;
    let pods = create_pods(
        &fx,
        2,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}),
    );
    let uid = pods[0].metadata.uid.clone().unwrap();

    fx.fail_next(Some("POST"), "/binding", 500, 1);
    let err = bind(sched.listen, &pods[0], "gpu-0").await.unwrap_err();
    assert!(err.starts_with("kubernetes API"), "{err}");
    let p = fresh(&fx, &pods[0]);
    for k in [
        keys::ASSIGNED_NODE,
        keys::DEVICES_ALLOCATED,
        keys::DEVICES_TO_ALLOCATE,
        keys::BIND_PHASE,
        keys::BIND_TIME,
        keys::ASSIGNED_TIME,
    ] {
        assert_eq!(ann(&p, k), None, "{k} rolled back");
    }
    assert!(p
        .metadata
        .labels
        .as_ref()
        .is_none_or(|l| !l.contains_key(keys::ASSIGNED_NODE)));
    assert!(p.spec.unwrap().node_name.is_none());
    assert_eq!(
        ann_node(&fx.get::<Node>("", "gpu-0").unwrap(), keys::NODE_LOCK),
        None,
        "lock released"
    );
    assert!(sched.scheduler.read().ledger.pod(&uid).is_none());

    // A pod changed under the binder (409 on the guarded patch): refused, lock released.
    fx.fail_next(Some("PATCH"), "/pods/job-01", 409, 1);
    let err = bind(sched.listen, &pods[1], "gpu-0").await.unwrap_err();
    assert!(err.contains("changed while it was being bound"), "{err}");
    assert_eq!(
        ann_node(&fx.get::<Node>("", "gpu-0").unwrap(), keys::NODE_LOCK),
        None
    );

    // Both can still be placed: nothing leaked.
    bind(sched.listen, &pods[0], "gpu-0").await.unwrap();
    let err = bind(sched.listen, &pods[1], "gpu-0").await.unwrap_err();
    assert!(
        err.contains("locked by ml/job-00"),
        "the lock waits for Allocate: {err}"
    );
    assert_eq!(
        sched
            .scheduler
            .read()
            .ledger
            .device("gpu-0", "GPU-gpu-0-0")
            .memory_mib,
        6000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_handshakes_and_pods_without_gpus() {
    let fx = ApiFixture::start();
    add_node(&fx, &gpu_node("alive", 1, 10));
    // A device plugin gone: its handshake request went unanswered and it
    // advertises no GPU.
    let mut dead = gpu_node("dead", 1, 10);
    dead.metadata.annotations.as_mut().unwrap().insert(
        keys::NODE_HANDSHAKE.into(),
        "Requesting_2020-01-01 00:00:00".into(),
    );
    fx.create(&dead).unwrap();
    add_node(&fx, &gpu_node("fresh", 1, 10));
    let s = vgpu_scheduler::scheduler::Scheduler::new(fx.client(), config(), false);
    let sched = vgpu_scheduler::run::start(
        s,
        vgpu_scheduler::run::RunOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics: None,
            tls: None,
            node_label_selector: None,
            handshake_period: Some(Duration::from_millis(50)),
        },
    )
    .await
    .unwrap();
    wait_until("synced", || sched.scheduler.ready()).await;
    // The handshake writer starts HAMi's timer on GPU nodes without one.
    wait_until("a handshake request on alive", || {
        fx.get::<Node>("", "alive")
            .and_then(|n| ann_node(&n, keys::NODE_HANDSHAKE).map(|v| v.starts_with("Requesting_")))
            .unwrap_or(false)
    })
    .await;
    let p = fx
        .create(&gpu_pod("ml", "p", json!({"nvidia.com/gpu": "1"})))
        .unwrap();
    let args = json!({"Pod": p, "Nodes": null, "NodeNames": ["alive", "dead", "fresh"]});
    let (_, body) = http(
        sched.listen,
        "POST",
        "/filter",
        Some(serde_json::to_vec(&args).unwrap()),
    )
    .await;
    let r: vgpu_scheduler::extender::ExtenderFilterResult = serde_json::from_slice(&body).unwrap();
    assert_eq!(r.node_names.unwrap(), ["alive", "fresh"]);
    let u = r.failed_and_unresolvable_nodes.unwrap();
    assert!(
        u["dead"]
            .starts_with("GPU device plugin gone: handshake \"Requesting_2020-01-01 00:00:00\""),
        "{u:?}"
    );
    // A pod that asks for no GPU is bound without a lock or annotations.
    let web: Pod = fx.create(&serde_json::from_value::<Pod>(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ml"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}})).unwrap()).unwrap();
    bind(sched.listen, &web, "alive").await.unwrap();
    let web = fx.get::<Pod>("ml", "web").unwrap();
    assert_eq!(
        web.spec.as_ref().unwrap().node_name.as_deref(),
        Some("alive")
    );
    assert_eq!(ann(&web, keys::ASSIGNED_NODE), None);
    assert_eq!(
        ann_node(&fx.get::<Node>("", "alive").unwrap(), keys::NODE_LOCK),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints() {
    let fx = ApiFixture::start();
    add_node(&fx, &gpu_node("gpu-0", 1, 10));
    let sched = start(&fx, config()).await;
    assert_eq!(
        http(sched.listen, "GET", "/healthz", None).await,
        (200, b"ok".to_vec())
    );
    assert_eq!(
        http(sched.listen, "GET", "/readyz", None).await,
        (200, b"ok".to_vec())
    );
    assert_eq!(http(sched.listen, "GET", "/nope", None).await.0, 404);
    // A urlPrefix with a path works: the verb is the last segment.
    let p = fx
        .create(&gpu_pod("ml", "p", json!({"nvidia.com/gpu": "1"})))
        .unwrap();
    let args = serde_json::to_vec(&json!({"Pod": p, "NodeNames": ["gpu-0"]})).unwrap();
    let (code, body) = http(sched.listen, "POST", "/scheduler/filter", Some(args)).await;
    assert_eq!(code, 200);
    let r: vgpu_scheduler::extender::ExtenderFilterResult = serde_json::from_slice(&body).unwrap();
    assert_eq!(r.node_names.unwrap(), ["gpu-0"]);
    // Junk gets an answer in the verb's shape.
    let (code, body) = http(sched.listen, "POST", "/filter", Some(b"{not json".to_vec())).await;
    assert_eq!(code, 200);
    let r: vgpu_scheduler::extender::ExtenderFilterResult = serde_json::from_slice(&body).unwrap();
    assert!(r.error.starts_with("decoding ExtenderArgs"), "{}", r.error);
    let (code, body) = http(sched.listen, "POST", "/bind", Some(b"[]".to_vec())).await;
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("decoding ExtenderBindingArgs"));
    // The webhook over HTTP.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "userInfo": {}, "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
            "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true},
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}});
    let (code, body) = http(
        sched.listen,
        "POST",
        "/webhook",
        Some(serde_json::to_vec(&review).unwrap()),
    )
    .await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u-1");
    assert_eq!(v["response"]["allowed"], false);
    // Metrics on their own port, after a filter and a bind.
    bind(sched.listen, &p, "gpu-0").await.unwrap();
    let (code, body) = http(sched.metrics.unwrap(), "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains(r#"hami_gpu_shared_count{zone="vGPU",node="gpu-0",device_uuid="GPU-gpu-0-0",device_index="0",device_type="NVIDIA-A100-SXM4-80GB"} 1"#), "{text}");
    assert!(
        text.contains(r#"vgpu_scheduler_binds_total{zone="vGPU",outcome="bound"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("vgpu_scheduler_filter_duration_seconds_count{zone=\"vGPU\"} 2"),
        "{text}"
    );
}
