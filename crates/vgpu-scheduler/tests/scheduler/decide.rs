//! The filter and prioritize answers over a cluster picture: every node
//! that fits comes back (not only the best, as HAMi does), each other node
//! with its reason, split into what preemption could fix and what it
//! could not; the scores follow the node policy.

use std::time::{Duration, Instant};

use jiff::civil::DateTime;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};
use vgpu_hami::{keys, register, NodeDevice};
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::decide::{filter, prioritize, UNKNOWN_NODE};
use vgpu_scheduler::extender::ExtenderArgs;
use vgpu_scheduler::state::ClusterState;

fn now() -> DateTime {
    "2025-06-01T08:30:00".parse().unwrap()
}

/// A node with `cards` 10000-MiB cards named `<node>-gpu<i>`.
fn gpu_node(name: &str, cards: usize, model: &str) -> Node {
    let devices: Vec<NodeDevice> = (0..cards)
        .map(|i| NodeDevice {
            id: format!("GPU-{name}-{i}"),
            index: i as u64,
            count: 10,
            devmem: 10000,
            devcore: 100,
            device_type: model.into(),
            mode: "hami-core".into(),
            health: true,
            ..Default::default()
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {keys::NODE_REGISTER: register::encode(&devices)}},
        "status": {"allocatable": {"nvidia.com/gpu": (cards * 10).to_string()}}
    }))
    .unwrap()
}

fn holder(uid: &str, node: &str, list: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
            keys::ASSIGNED_NODE: node, keys::DEVICES_ALLOCATED: list}},
        "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}
    }))
    .unwrap()
}

fn cluster() -> ClusterState {
    let cfg = SchedulerConfig::default();
    let mut s = ClusterState::default();
    s.apply_node(&gpu_node("a", 2, "NVIDIA-A100"), &cfg, now());
    s.apply_node(&gpu_node("b", 2, "NVIDIA-A100"), &cfg, now());
    s.apply_node(&gpu_node("t", 1, "NVIDIA-Tesla T4"), &cfg, now());
    s.apply_node(&gpu_node("big", 8, "NVIDIA-A100"), &cfg, now());
    // a is nearly full, b half full.
    let t = Instant::now();
    s.apply_pod(&holder("h1", "a", "GPU-a-0,NVIDIA,9000,0:;"), t);
    s.apply_pod(&holder("h2", "a", "GPU-a-1,NVIDIA,9000,0:;"), t);
    s.apply_pod(&holder("h3", "b", "GPU-b-0,NVIDIA,5000,0:;"), t);
    s
}

fn pod(uid: &str, limits: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    }))
    .unwrap()
}

fn names_args(pod: Pod, names: &[&str]) -> ExtenderArgs {
    ExtenderArgs {
        pod: Some(pod),
        nodes: None,
        node_names: Some(names.iter().map(|s| s.to_string()).collect()),
    }
}

const ALL: &[&str] = &["a", "b", "t", "big", "cpu-only"];

#[test]
fn filter_returns_every_fitting_node_with_reasons_for_the_rest() {
    let s = cluster();
    let cfg = SchedulerConfig::default();
    let p = pod(
        "x",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}),
        json!({"nvidia.com/use-gputype": "a100"}),
    );
    let r = filter(&s, &names_args(p, ALL), &cfg, now());
    assert_eq!(r.error, "");
    assert_eq!(r.node_names.unwrap(), ["b", "big"]);
    assert!(r.nodes.is_none());
    let failed = r.failed_nodes.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed["a"],
        "container \"main\" needs 1 GPUs, 0 of 2 fit (2 insufficient free memory)"
    );
    let unresolvable = r.failed_and_unresolvable_nodes.unwrap();
    assert_eq!(
        unresolvable["t"],
        "container \"main\" needs 1 GPUs, 0 of 1 fit (1 type excluded)"
    );
    assert_eq!(unresolvable["cpu-only"], UNKNOWN_NODE);
    assert_eq!(unresolvable.len(), 2);
}

#[test]
fn more_gpus_than_any_node_has_and_malformed_requests() {
    let s = cluster();
    let cfg = SchedulerConfig::default();
    let r = filter(
        &s,
        &names_args(pod("x", json!({"nvidia.com/gpu": "9"}), json!({})), ALL),
        &cfg,
        now(),
    );
    assert_eq!(r.node_names.unwrap(), Vec::<String>::new());
    let u = r.failed_and_unresolvable_nodes.unwrap();
    assert_eq!(u["big"], "container \"main\" needs 9 GPUs, the node has 8");
    assert_eq!(u["a"], "container \"main\" needs 9 GPUs, the node has 2");
    // A malformed request fits nowhere, with its reason on every node.
    let bad = pod(
        "x",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
        json!({}),
    );
    let r = filter(&s, &names_args(bad, &["a", "b"]), &cfg, now());
    assert_eq!(r.node_names.unwrap(), Vec::<String>::new());
    let u = r.failed_and_unresolvable_nodes.unwrap();
    assert_eq!(u.len(), 2);
    assert_eq!(
        u["b"],
        "container \"main\": nvidia.com/gpucores is 150, must be at most 100"
    );
    let neg = pod(
        "x",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-1"}),
        json!({}),
    );
    let r = filter(&s, &names_args(neg, &["a"]), &cfg, now());
    assert_eq!(
        r.failed_and_unresolvable_nodes.unwrap()["a"],
        "container \"main\": nvidia.com/gpumem is -1, must not be negative"
    );
    // A GPU type no node has: every GPU node refused, saying so.
    let unknown = pod(
        "x",
        json!({"nvidia.com/gpu": "1"}),
        json!({"nvidia.com/use-gputype": "B200"}),
    );
    let r = filter(&s, &names_args(unknown, ALL), &cfg, now());
    assert_eq!(r.node_names.unwrap(), Vec::<String>::new());
    let u = r.failed_and_unresolvable_nodes.unwrap();
    assert_eq!(u.len(), ALL.len(), "{u:?}");
    assert_eq!(
        u["big"],
        "container \"main\" needs 1 GPUs, 0 of 8 fit (8 type excluded)"
    );
    assert_eq!(
        u["t"],
        "container \"main\" needs 1 GPUs, 0 of 1 fit (1 type excluded)"
    );
    // More malformed values, each refused on every node with its reason.
    for (limits, want) in [
        (
            json!({"nvidia.com/gpu": "-1"}),
            "container \"main\": nvidia.com/gpu is -1, must not be negative",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-5"}),
            "container \"main\": nvidia.com/gpucores is -5, must not be negative",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"}),
            "container \"main\": nvidia.com/gpumem-percentage is 101, must be at most 100",
        ),
    ] {
        let r = filter(
            &s,
            &names_args(pod("x", limits.clone(), json!({})), &["a", "big"]),
            &cfg,
            now(),
        );
        assert_eq!(r.node_names.unwrap(), Vec::<String>::new(), "{limits}");
        let u = r.failed_and_unresolvable_nodes.unwrap();
        assert_eq!(u["a"], want, "{limits}");
        assert_eq!(u["big"], want, "{limits}");
    }
    // No Pod at all is a request error.
    let r = filter(&s, &ExtenderArgs::default(), &cfg, now());
    assert_eq!(r.error, "extender args carry no Pod");
}

#[test]
fn pods_without_gpus_pass_through() {
    let s = cluster();
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    let r = filter(
        &s,
        &names_args(p.clone(), ALL),
        &SchedulerConfig::default(),
        now(),
    );
    assert_eq!(r.node_names.unwrap().len(), ALL.len());
    assert!(r.failed_nodes.is_none());
    let scores = prioritize(&s, &names_args(p, ALL), &SchedulerConfig::default(), now());
    assert!(scores.iter().all(|h| h.score == 0));
}

#[test]
fn whole_node_objects_are_read_as_sent() {
    let s = ClusterState::default(); // nothing cached: the objects carry it all
    let mut cordoned = gpu_node("c", 1, "NVIDIA-A100");
    cordoned
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(keys::DEVICE_CORDON.into(), "GPU-c-0".into());
    let args = ExtenderArgs {
        pod: Some(pod(
            "x",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}),
            json!({}),
        )),
        nodes: Some(k8s_openapi::List {
            items: vec![gpu_node("a", 1, "NVIDIA-A100"), cordoned],
            metadata: Default::default(),
        }),
        node_names: None,
    };
    let r = filter(&s, &args, &SchedulerConfig::default(), now());
    assert!(r.node_names.is_none());
    let names: Vec<_> = r
        .nodes
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["a"]);
    assert_eq!(
        r.failed_and_unresolvable_nodes.unwrap()["c"],
        "container \"main\" needs 1 GPUs, 0 of 1 fit (1 cordoned)"
    );
}

#[test]
fn a_pods_own_earlier_assignment_does_not_block_it() {
    let mut s = cluster();
    // The pod itself already holds 9000 MiB on b-1 from a bind that failed.
    s.apply_pod(
        &holder("me", "b", "GPU-b-1,NVIDIA,9000,0:;"),
        Instant::now(),
    );
    let me = pod(
        "me",
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}),
        json!({}),
    );
    let r = filter(
        &s,
        &names_args(me, &["b"]),
        &SchedulerConfig::default(),
        now(),
    );
    assert_eq!(r.node_names.unwrap(), ["b"]);
    let other = pod(
        "other",
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}),
        json!({}),
    );
    let r = filter(
        &s,
        &names_args(other, &["b"]),
        &SchedulerConfig::default(),
        now(),
    );
    assert_eq!(r.node_names.unwrap(), Vec::<String>::new());
}

#[test]
fn prioritize_follows_the_node_policy() {
    let s = cluster();
    let cfg = SchedulerConfig::default();
    let ask =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500", "nvidia.com/gpucores": "10"});
    let score = |policy: &str| {
        let p = pod(
            "x",
            ask.clone(),
            json!({"hami.io/node-scheduler-policy": policy}),
        );
        let list = prioritize(&s, &names_args(p, &["a", "b", "big", "t"]), &cfg, now());
        list.into_iter()
            .map(|h| (h.host, h.score))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let binpack = score("binpack");
    let spread = score("spread");
    // a (nearly full) > b (half) > big (empty) under binpack; reversed under spread.
    assert!(
        binpack["a"] > binpack["b"] && binpack["b"] > binpack["big"],
        "{binpack:?}"
    );
    assert!(
        spread["a"] < spread["b"] && spread["b"] < spread["big"],
        "{spread:?}"
    );
    assert!(binpack
        .values()
        .chain(spread.values())
        .all(|&v| (0..=10).contains(&v)));
    // The default is binpack (HAMi's).
    let p = pod("x", ask, json!({}));
    let default: std::collections::HashMap<_, _> =
        prioritize(&s, &names_args(p, &["a", "b", "big"]), &cfg, now())
            .into_iter()
            .map(|h| (h.host, h.score))
            .collect();
    assert_eq!(
        default,
        binpack.into_iter().filter(|(k, _)| k != "t").collect()
    );
}

#[test]
fn assumed_binds_survive_an_older_event_until_they_expire() {
    let mut s = cluster();
    let t = Instant::now();
    let usage = vgpu_scheduler::ledger::PodUsage::new(
        "ns".into(),
        "new".into(),
        "big".into(),
        vec![vec![vgpu_scheduler::ledger::AssignedDevice {
            uuid: "GPU-big-0".into(),
            memory_mib: 7000,
            cores: 0,
        }]],
        0,
    );
    s.assume("new", usage, t);
    // The watch delivers the pod as it was before the bind's patch.
    let before: Pod = serde_json::from_value(
        json!({"metadata": {"name": "new", "namespace": "ns", "uid": "new"},
        "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}),
    )
    .unwrap();
    s.apply_pod(&before, t + Duration::from_secs(1));
    assert_eq!(s.ledger.device("big", "GPU-big-0").memory_mib, 7000);
    s.apply_pod(&before, t + Duration::from_secs(120));
    assert_eq!(s.ledger.device("big", "GPU-big-0").memory_mib, 0);
}
