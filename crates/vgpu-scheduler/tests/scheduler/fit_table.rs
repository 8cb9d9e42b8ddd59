//! Table-driven placement: every policy and annotation HAMi's users
//! write, each case stating which GPUs a pod gets on a node, or the exact
//! reason the node refuses it (the text kube-scheduler shows the user).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};
use vgpu_scheduler::config::{NodePolicy, SchedulerConfig};
use vgpu_scheduler::fit::{fit_pod, node_score, Refusal};
use vgpu_scheduler::inventory::{GpuDevice, NodeHealth, NodeInventory};
use vgpu_scheduler::ledger::DeviceUsage;
use vgpu_scheduler::request::PodRequest;

fn gpu(uuid: &str, model: &str, memory_mib: u64, numa: i32) -> GpuDevice {
    GpuDevice {
        uuid: uuid.into(),
        index: uuid.trim_start_matches("GPU-").parse().unwrap_or(0),
        slots: 10,
        memory_mib,
        cores: 100,
        model: model.into(),
        numa,
        healthy: true,
        mode: "hami-core".into(),
    }
}

const A100: &str = "NVIDIA-A100-SXM4-80GB";
const T4: &str = "NVIDIA-Tesla T4";

fn node(devices: Vec<GpuDevice>) -> NodeInventory {
    NodeInventory {
        name: "n".into(),
        devices,
        cordoned: HashSet::new(),
        health: NodeHealth::Healthy,
        register_error: None,
        handshake_due: false,
        handshake: None,
    }
}

/// Four 10000-MiB A100s, NUMA 0: GPU-0, GPU-1; NUMA 1: GPU-2, GPU-3.
fn four() -> NodeInventory {
    node(
        (0..4)
            .map(|i| gpu(&format!("GPU-{i}"), A100, 10000, i / 2))
            .collect(),
    )
}

fn used(entries: &[(&str, u32, u64, u32)]) -> HashMap<String, DeviceUsage> {
    entries
        .iter()
        .map(|&(uuid, slots, memory_mib, cores)| {
            (
                uuid.to_owned(),
                DeviceUsage {
                    slots,
                    memory_mib,
                    cores,
                },
            )
        })
        .collect()
}

/// A pod with one container `main` holding `limits`, and `annotations`.
fn pod(limits: Value, annotations: Value) -> PodRequest {
    pod_spec(
        json!({"containers": [{"name": "main", "resources": {"limits": limits}}]}),
        annotations,
    )
}

fn pod_spec(spec: Value, annotations: Value) -> PodRequest {
    let p = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": spec
    }))
    .unwrap();
    PodRequest::from_pod(&p, &SchedulerConfig::default())
        .unwrap()
        .unwrap()
}

/// UUIDs per container, or the refusal text.
fn outcome(
    req: &PodRequest,
    n: &NodeInventory,
    u: &HashMap<String, DeviceUsage>,
) -> Result<Vec<Vec<String>>, String> {
    fit_pod(req, n, Some(u))
        .map(|p| {
            p.containers
                .iter()
                .map(|c| c.iter().map(|d| d.uuid.clone()).collect())
                .collect()
        })
        .map_err(|r| r.to_string())
}

fn ok(per_container: &[&[&str]]) -> Result<Vec<Vec<String>>, String> {
    Ok(per_container
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect())
}

struct Case {
    name: &'static str,
    node: NodeInventory,
    used: HashMap<String, DeviceUsage>,
    pod: PodRequest,
    want: Result<Vec<Vec<String>>, String>,
}

#[test]
fn placement_table() {
    let mem = |m: u32| json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": m.to_string()});
    let none = json!({});
    let mut cordoned = four();
    cordoned.cordoned = ["GPU-0".to_string(), "GPU-2".to_string()].into();
    let mut sick = four();
    sick.devices[0].healthy = false;
    sick.devices[1].healthy = false;
    sick.devices[2].healthy = false;
    let mut stale = four();
    stale.health = NodeHealth::StaleHandshake {
        stamp: "Requesting_2024-01-02 03:04:05".into(),
    };
    let mut mig = four();
    for d in &mut mig.devices[..3] {
        d.mode = "mig".into();
    }
    let mixed = node(vec![
        gpu("GPU-0", T4, 15000, 0),
        gpu("GPU-1", A100, 80000, 0),
    ]);
    let mut unregistered = node(vec![]);
    unregistered.register_error = Some("hami.io/node-nvidia-register is missing".into());
    let busy = used(&[
        ("GPU-0", 3, 6000, 30),
        ("GPU-1", 1, 1000, 10),
        ("GPU-2", 2, 9000, 20),
    ]);

    let cases = vec![
        Case {
            name: "spread (default) takes the emptiest card",
            node: four(),
            used: busy.clone(),
            pod: pod(mem(1000), none.clone()),
            want: ok(&[&["GPU-3"]]),
        },
        Case {
            // GPU-2 has exactly 1000 MiB left: after this pod it is full.
            name: "binpack takes the fullest card that still fits",
            node: four(),
            used: busy.clone(),
            pod: pod(mem(1000), json!({"hami.io/gpu-scheduler-policy": "binpack"})),
            want: ok(&[&["GPU-2"]]),
        },
        Case {
            name: "binpack skips a card without room for the request",
            node: four(),
            used: busy.clone(),
            pod: pod(mem(4500), json!({"hami.io/gpu-scheduler-policy": "binpack"})),
            want: ok(&[&["GPU-1"]]),
        },
        Case {
            name: "several GPUs are distinct cards, emptiest first",
            node: four(),
            used: busy.clone(),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "500"}), none.clone()),
            want: ok(&[&["GPU-3", "GPU-1"]]),
        },
        Case {
            name: "use-gputype: case-insensitive substring",
            node: mixed.clone(),
            used: used(&[]),
            pod: pod(mem(1000), json!({"nvidia.com/use-gputype": "a100"})),
            want: ok(&[&["GPU-1"]]),
        },
        Case {
            name: "use-gputype matching no card refuses the node",
            node: mixed.clone(),
            used: used(&[]),
            pod: pod(mem(1000), json!({"nvidia.com/use-gputype": "H100,V100"})),
            want: Err("container \"main\" needs 1 GPUs, 0 of 2 fit (2 type excluded)".into()),
        },
        Case {
            name: "nouse-gputype excludes a type",
            node: mixed.clone(),
            used: used(&[]),
            pod: pod(mem(1000), json!({"nvidia.com/nouse-gputype": "tesla"})),
            want: ok(&[&["GPU-1"]]),
        },
        Case {
            name: "use-gpuuuid pins a card even against the policy",
            node: four(),
            used: busy.clone(),
            pod: pod(mem(1000), json!({"nvidia.com/use-gpuuuid": "GPU-0"})),
            want: ok(&[&["GPU-0"]]),
        },
        Case {
            name: "nouse-gpuuuid excludes cards",
            node: four(),
            used: busy.clone(),
            pod: pod(mem(1000), json!({"nvidia.com/nouse-gpuuuid": "GPU-3,GPU-1"})),
            want: ok(&[&["GPU-0"]]),
        },
        Case {
            name: "use-gpuuuid naming an absent card refuses the node",
            node: four(),
            used: used(&[]),
            pod: pod(mem(1000), json!({"nvidia.com/use-gpuuuid": "GPU-9"})),
            want: Err("container \"main\" needs 1 GPUs, 0 of 4 fit (4 UUID excluded)".into()),
        },
        Case {
            name: "numa-bind keeps a container's cards on one NUMA node",
            node: four(),
            // GPU-3 is the emptiest, its NUMA peer GPU-2 is full: NUMA 0 wins.
            used: used(&[("GPU-2", 10, 0, 0)]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), json!({"nvidia.com/numa-bind": "true"})),
            want: ok(&[&["GPU-0", "GPU-1"]]),
        },
        Case {
            name: "without numa-bind the same pod crosses NUMA nodes",
            node: four(),
            used: used(&[("GPU-2", 10, 0, 0), ("GPU-0", 1, 100, 0)]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), none.clone()),
            want: ok(&[&["GPU-1", "GPU-3"]]),
        },
        Case {
            name: "numa-bind with enough cards only across NUMA nodes",
            node: four(),
            used: used(&[("GPU-1", 10, 0, 0), ("GPU-3", 10, 0, 0)]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), json!({"nvidia.com/numa-bind": "true"})),
            want: Err("container \"main\" needs 2 GPUs on one NUMA node, 2 of 4 fit but on different NUMA nodes (2 all vGPU slots taken)".into()),
        },
        Case {
            name: "device-cordon removes cards",
            node: cordoned.clone(),
            used: used(&[]),
            pod: pod(json!({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "100"}), none.clone()),
            want: Err("container \"main\" needs 3 GPUs, 2 of 4 fit (2 cordoned)".into()),
        },
        Case {
            name: "cordoned cards are never chosen",
            node: cordoned,
            used: used(&[]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), none.clone()),
            want: ok(&[&["GPU-1", "GPU-3"]]),
        },
        Case {
            name: "unhealthy GPUs are skipped",
            node: sick,
            used: used(&[]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), none.clone()),
            want: Err("container \"main\" needs 2 GPUs, 1 of 4 fit (3 unhealthy)".into()),
        },
        Case {
            name: "a stale handshake refuses the whole node",
            node: stale,
            used: used(&[]),
            pod: pod(mem(100), none.clone()),
            want: Err("GPU device plugin gone: handshake \"Requesting_2024-01-02 03:04:05\" is stale and the node advertises no allocatable GPU".into()),
        },
        Case {
            name: "MIG and MPS cards are not shared by vgpu",
            node: mig,
            used: used(&[]),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"}), none.clone()),
            want: Err("container \"main\" needs 2 GPUs, 1 of 4 fit (3 not in hami-core mode)".into()),
        },
        Case {
            name: "exclusive (cores=100) wants a card nobody uses",
            node: four(),
            used: busy.clone(),
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "100"}), json!({"hami.io/gpu-scheduler-policy": "binpack"})),
            want: ok(&[&["GPU-3"]]),
        },
        Case {
            name: "exclusive refused on a shared card",
            node: node(vec![gpu("GPU-0", A100, 10000, 0)]),
            used: used(&[("GPU-0", 1, 1000, 0)]),
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "100"}), none.clone()),
            want: Err("container \"main\" needs 1 GPUs, 0 of 1 fit (1 in use (100 cores asks for an unused card))".into()),
        },
        Case {
            name: "count alone is a whole exclusive card",
            node: four(),
            used: used(&[("GPU-0", 1, 1, 1), ("GPU-1", 1, 1, 1), ("GPU-2", 1, 1, 1)]),
            pod: pod(json!({"nvidia.com/gpu": "1"}), none.clone()),
            want: ok(&[&["GPU-3"]]),
        },
        Case {
            name: "no core-less tenant on a card whose cores are all promised",
            node: node(vec![gpu("GPU-0", A100, 10000, 0)]),
            used: used(&[("GPU-0", 2, 2000, 100)]),
            pod: pod(mem(1000), none.clone()),
            want: Err("container \"main\" needs 1 GPUs, 0 of 1 fit (1 all cores allocated)".into()),
        },
        Case {
            name: "no over-guarantee on a card that scales its cores",
            node: node(vec![GpuDevice {
                cores: 200,
                ..gpu("GPU-0", A100, 10000, 0)
            }]),
            used: used(&[("GPU-0", 2, 2000, 80)]),
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/gpucores": "30"}), none.clone()),
            want: Err("container \"main\" needs 1 GPUs, 0 of 1 fit (1 cores are guarantees: they would sum over 100 % of the card)".into()),
        },
        Case {
            name: "guarantees up to 100 on a card that scales its cores",
            node: node(vec![GpuDevice {
                cores: 200,
                ..gpu("GPU-0", A100, 10000, 0)
            }]),
            used: used(&[("GPU-0", 2, 2000, 70)]),
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/gpucores": "30"}), none.clone()),
            want: ok(&[&["GPU-0"]]),
        },
        Case {
            name: "insufficient cores",
            node: node(vec![gpu("GPU-0", A100, 10000, 0)]),
            used: used(&[("GPU-0", 2, 2000, 80)]),
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/gpucores": "30"}), none.clone()),
            want: Err("container \"main\" needs 1 GPUs, 0 of 1 fit (1 insufficient free cores)".into()),
        },
        Case {
            name: "slots exhausted, memory short, card too small",
            node: node(vec![gpu("GPU-0", A100, 10000, 0), gpu("GPU-1", A100, 10000, 0), gpu("GPU-2", T4, 4000, 0)]),
            used: used(&[("GPU-0", 10, 100, 0), ("GPU-1", 1, 6000, 0)]),
            pod: pod(mem(5000), none.clone()),
            want: Err("container \"main\" needs 1 GPUs, 0 of 3 fit (1 all vGPU slots taken, 1 too little memory on the card, 1 insufficient free memory)".into()),
        },
        Case {
            name: "more GPUs than the node has",
            node: four(),
            used: used(&[]),
            pod: pod(json!({"nvidia.com/gpu": "9"}), none.clone()),
            want: Err("container \"main\" needs 9 GPUs, the node has 4".into()),
        },
        Case {
            name: "a node without a register annotation",
            node: unregistered,
            used: used(&[]),
            pod: pod(mem(1), none.clone()),
            want: Err("no GPUs: hami.io/node-nvidia-register is missing".into()),
        },
        Case {
            name: "mutex policy takes only idle cards",
            node: four(),
            used: busy.clone(),
            pod: pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1"}), json!({"hami.io/gpu-scheduler-policy": "mutex"})),
            want: Err("container \"main\" needs 2 GPUs, 1 of 4 fit (3 in use (mutex policy))".into()),
        },
        Case {
            name: "memory percentage is per card",
            node: mixed.clone(),
            used: used(&[("GPU-1", 1, 50000, 0)]),
            // 50 % of the T4 is 7500 MiB (free); of the A100 40000 (30000 free).
            pod: pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}), json!({"hami.io/gpu-scheduler-policy": "binpack"})),
            want: ok(&[&["GPU-0"]]),
        },
        Case {
            name: "init containers run alone: they do not add to the app containers",
            node: node(vec![gpu("GPU-0", A100, 10000, 0)]),
            used: used(&[]),
            pod: pod_spec(json!({
                "initContainers": [{"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}}],
                "containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}},
                    {"name": "sidecar"}]}), none.clone()),
            want: ok(&[&["GPU-0"], &["GPU-0"], &[]]),
        },
        Case {
            name: "app containers add up on a shared card",
            node: node(vec![gpu("GPU-0", A100, 10000, 0)]),
            used: used(&[]),
            pod: pod_spec(json!({"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}}}]}), none.clone()),
            want: Err("container \"b\" needs 1 GPUs, 0 of 1 fit (1 insufficient free memory)".into()),
        },
        Case {
            name: "app containers spread over cards",
            node: four(),
            used: used(&[]),
            pod: pod_spec(json!({"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}}}]}), none.clone()),
            want: ok(&[&["GPU-0"], &["GPU-1"]]),
        },
        Case {
            name: "vgpu-mode selects by card mode",
            node: four(),
            used: used(&[]),
            pod: pod(mem(1), json!({"nvidia.com/vgpu-mode": "mig"})),
            want: Err("container \"main\" needs 1 GPUs, 0 of 4 fit (4 mode excluded by nvidia.com/vgpu-mode)".into()),
        },
    ];
    let mut failures = Vec::new();
    for c in &cases {
        let got = outcome(&c.pod, &c.node, &c.used);
        if got != c.want {
            failures.push(format!(
                "{}:\n   got {:?}\n  want {:?}",
                c.name, got, c.want
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn assigned_memory_and_cores_are_what_was_asked() {
    let n = node(vec![
        gpu("GPU-0", T4, 15000, 0),
        gpu("GPU-1", A100, 80000, 0),
    ]);
    let req = pod(
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "10", "nvidia.com/gpucores": "25"}),
        json!({}),
    );
    let p = fit_pod(&req, &n, None).unwrap();
    let got: Vec<(String, u64, u32)> = p.containers[0]
        .iter()
        .map(|d| (d.uuid.clone(), d.memory_mib, d.cores))
        .collect();
    assert_eq!(
        got,
        [("GPU-0".into(), 1500, 25), ("GPU-1".into(), 8000, 25)]
    );
}

#[test]
fn node_scores_follow_the_node_policy() {
    // An empty node and a busy one, the same pod.
    let req = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}),
        json!({}),
    );
    let empty = fit_pod(&req, &four(), None).unwrap().utilization;
    let busy_usage = used(&[
        ("GPU-0", 5, 8000, 80),
        ("GPU-1", 5, 8000, 80),
        ("GPU-2", 5, 8000, 80),
    ]);
    let busy = fit_pod(&req, &four(), Some(&busy_usage))
        .unwrap()
        .utilization;
    assert!(busy > empty, "{busy} > {empty}");
    assert!(node_score(NodePolicy::Binpack, busy) > node_score(NodePolicy::Binpack, empty));
    assert!(node_score(NodePolicy::Spread, busy) < node_score(NodePolicy::Spread, empty));
    assert_eq!(node_score(NodePolicy::Binpack, 0.0), 0);
    assert_eq!(node_score(NodePolicy::Binpack, 1.0), 10);
    assert_eq!(node_score(NodePolicy::Spread, 0.0), 10);
    // The node policy annotation reaches the request.
    let spread = pod(
        json!({"nvidia.com/gpu": "1"}),
        json!({"hami.io/node-scheduler-policy": "spread"}),
    );
    assert_eq!(spread.node_policy, NodePolicy::Spread);
    assert_eq!(
        pod(json!({"nvidia.com/gpu": "1"}), json!({})).node_policy,
        NodePolicy::Binpack
    );
}

#[test]
fn refusals_say_whether_preemption_could_help() {
    let req = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}),
        json!({}),
    );
    let full = used(&[
        ("GPU-0", 1, 9000, 0),
        ("GPU-1", 1, 9000, 0),
        ("GPU-2", 1, 9000, 0),
        ("GPU-3", 1, 9000, 0),
    ]);
    let r = fit_pod(&req, &four(), Some(&full)).unwrap_err();
    assert!(r.resolvable(), "{r}");
    let typed = pod(
        json!({"nvidia.com/gpu": "1"}),
        json!({"nvidia.com/use-gputype": "T4"}),
    );
    let r = fit_pod(&typed, &four(), None).unwrap_err();
    assert!(!r.resolvable(), "{r}");
    assert!(!Refusal::TooFewCards {
        container: "c".into(),
        wanted: 9,
        cards: 8
    }
    .resolvable());
}
