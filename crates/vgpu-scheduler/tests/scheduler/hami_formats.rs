//! HAMi v2.10's annotation strings and register JSON read by the
//! scheduler, and the scheduler's written forms read back in HAMi's
//! formats. The values are vgpu-hami's golden files
//! (`crates/vgpu-hami/testdata/golden/manifest.txt` names the HAMi source
//! of each: `pkg/device/devices.go` MarshalNodeDevices/DecodeNodeDevices/
//! EncodePodSingleDevice, `pkg/util/nodelock/nodelock.go`,
//! `pkg/device/devices.go` CheckHealth) and the device-list example of
//! `docs/develop/protocol.md` ("Schedule Decision").

use std::time::{Duration, Instant};

use jiff::civil::DateTime;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use vgpu_hami::{keys, PodDevices};
use vgpu_scheduler::assignment;
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::fit::fit_pod;
use vgpu_scheduler::inventory::{handshake_needs_request, node_health, NodeHealth, NodeInventory};
use vgpu_scheduler::ledger::{AssignedDevice, DeviceUsage};
use vgpu_scheduler::request::PodRequest;
use vgpu_scheduler::state::ClusterState;

fn golden(name: &str) -> String {
    let p = format!(
        "{}/../vgpu-hami/testdata/golden/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn node(annotations: serde_json::Value, allocatable_gpus: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "gpu-1", "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": allocatable_gpus}}
    }))
    .unwrap()
}

fn now() -> DateTime {
    "2025-06-01T08:31:30".parse().unwrap()
}

fn inventory(n: &Node) -> NodeInventory {
    NodeInventory::from_node(n, "nvidia.com/gpu", now(), Duration::from_secs(60))
}

#[test]
fn reads_hamis_register_json() {
    let inv = inventory(&node(
        json!({keys::NODE_REGISTER: golden("node-register-two-gpus.json")}),
        "20",
    ));
    assert_eq!(inv.register_error, None);
    assert_eq!(inv.health, NodeHealth::Healthy);
    let got: Vec<_> = inv
        .devices
        .iter()
        .map(|d| {
            (
                d.uuid.as_str(),
                d.index,
                d.slots,
                d.memory_mib,
                d.cores,
                d.model.as_str(),
                d.numa,
                d.healthy,
                d.mode.as_str(),
            )
        })
        .collect();
    // Go's omitempty dropped index 0 and numa 0 of the first card.
    assert_eq!(
        got,
        [
            (
                "GPU-4617e643-f070-4b90-b715-30c57f977a9a",
                0,
                10,
                81920,
                100,
                "NVIDIA A100-SXM4-80GB",
                0,
                true,
                "hami-core"
            ),
            (
                "GPU-9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f",
                1,
                10,
                81920,
                100,
                "NVIDIA A100-SXM4-80GB",
                1,
                true,
                "hami-core"
            ),
        ]
    );
}

#[test]
fn scaled_unhealthy_and_mig_cards_are_refused_with_their_reason() {
    let req = |limits| {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}))
        .unwrap();
        PodRequest::from_pod(&p, &SchedulerConfig::default())
            .unwrap()
            .unwrap()
    };
    // health omitted = false (Go omitempty): the T4 is unhealthy.
    let t4 = inventory(&node(
        json!({keys::NODE_REGISTER: golden("node-register-scaled-unhealthy.json")}),
        "4",
    ));
    assert_eq!(
        (
            t4.devices[0].memory_mib,
            t4.devices[0].cores,
            t4.devices[0].healthy
        ),
        (24576, 200, false)
    );
    let err = fit_pod(
        &req(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})),
        &t4,
        None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "container \"c\" needs 1 GPUs, 0 of 1 fit (1 unhealthy)"
    );
    let mig = inventory(&node(
        json!({keys::NODE_REGISTER: golden("node-register-mig.json")}),
        "7",
    ));
    let err = fit_pod(
        &req(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})),
        &mig,
        None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "container \"c\" needs 1 GPUs, 0 of 1 fit (1 not in hami-core mode)"
    );
}

#[test]
fn reads_the_pre_2_8_colon_register_and_refuses_junk() {
    let inv = inventory(&node(
        json!({keys::NODE_REGISTER: golden("node-register-legacy-9.txt")}),
        "10",
    ));
    assert_eq!(inv.devices.len(), 1);
    let d = &inv.devices[0];
    assert_eq!(
        (
            d.uuid.as_str(),
            d.index,
            d.slots,
            d.memory_mib,
            d.model.as_str()
        ),
        (
            "GPU-00aa11bb-22cc-33dd-44ee-55ff66778899",
            2,
            10,
            32768,
            "NVIDIA-Tesla V100-PCIE-32GB"
        )
    );
    let junk = inventory(&node(json!({keys::NODE_REGISTER: "[{\"id\": 5}]"}), "10"));
    assert!(junk.devices.is_empty());
    let why = junk.register_error.unwrap();
    assert!(
        why.starts_with(
            "hami.io/node-nvidia-register: node registration is not HAMi's JSON device array"
        ),
        "{why}"
    );
    let none = inventory(&node(json!({}), "0"));
    assert_eq!(
        none.register_error.as_deref(),
        Some("hami.io/node-nvidia-register is missing")
    );
}

#[test]
fn cordon_and_handshake_as_hami_writes_them() {
    let n = node(
        json!({
            keys::NODE_REGISTER: golden("node-register-two-gpus.json"),
            keys::DEVICE_CORDON: " GPU-4617e643-f070-4b90-b715-30c57f977a9a, ,",
            keys::NODE_HANDSHAKE: golden("handshake-requesting.txt"),
        }),
        "0",
    );
    let inv = inventory(&n);
    assert_eq!(inv.cordoned.len(), 1);
    assert!(inv
        .cordoned
        .contains("GPU-4617e643-f070-4b90-b715-30c57f977a9a"));
    // Requesting_2025-06-01 08:30:00, 90 s ago, and nothing allocatable.
    assert_eq!(
        inv.health,
        NodeHealth::StaleHandshake {
            stamp: "Requesting_2025-06-01 08:30:00".into()
        }
    );
    let stamp = golden("handshake-requesting.txt");
    let t = Duration::from_secs(60);
    // Allocatable GPUs keep a node alive; so does a fresh stamp.
    assert_eq!(node_health(Some(&stamp), 20, now(), t), NodeHealth::Healthy);
    assert_eq!(
        node_health(Some(&stamp), 0, "2025-06-01T08:30:59".parse().unwrap(), t),
        NodeHealth::Healthy
    );
    // The node side's answer is not a request: the scheduler asks again.
    let reported = golden("handshake-reported.txt");
    assert_eq!(
        node_health(Some(&reported), 0, now(), t),
        NodeHealth::Healthy
    );
    assert!(handshake_needs_request(Some(&reported)));
    assert!(handshake_needs_request(None));
    assert!(handshake_needs_request(Some("junk")));
    assert!(!handshake_needs_request(Some(&stamp)));
}

fn assigned_pod(uid: &str, list: &str, inits: usize, phase: &str) -> Pod {
    let init: Vec<_> = (0..inits)
        .map(|i| json!({"name": format!("init{i}")}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
            keys::ASSIGNED_NODE: "gpu-1", keys::DEVICES_ALLOCATED: list}},
        "spec": {"initContainers": init, "containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

#[test]
fn usage_is_rebuilt_from_hamis_device_lists() {
    let mut s = ClusterState::default();
    let t = Instant::now();
    // protocol.md's example: two containers on one card, 3000 + 5000 MiB.
    s.apply_pod(
        &assigned_pod(
            "p1",
            &golden("device-list-two-containers.txt"),
            0,
            "Running",
        ),
        t,
    );
    let gpu = "GPU-5d1e3a9c-8f21-4c6b-9e02-7b4a1f6c3d88";
    assert_eq!(
        s.ledger.device("gpu-1", gpu),
        DeviceUsage {
            slots: 2,
            memory_mib: 8000,
            cores: 0
        }
    );
    // An init container without GPUs, an app container with two, a third empty.
    s.apply_pod(
        &assigned_pod(
            "p2",
            &golden("device-list-init-multi-empty.txt"),
            1,
            "Pending",
        ),
        t,
    );
    assert_eq!(
        s.ledger
            .device("gpu-1", "GPU-0b2f6c1e-33aa-4d5e-8a90-1c2d3e4f5a6b"),
        DeviceUsage {
            slots: 1,
            memory_mib: 10240,
            cores: 30
        }
    );
    // Finished pods hold nothing; an unreadable list is reported, not guessed.
    s.apply_pod(
        &assigned_pod(
            "p1",
            &golden("device-list-two-containers.txt"),
            0,
            "Succeeded",
        ),
        t,
    );
    assert!(s.ledger.pod("p1").is_none());
    assert_eq!(s.ledger.device("gpu-1", gpu), DeviceUsage::default());
    s.apply_pod(
        &assigned_pod("p3", "GPU-x,NVIDIA,lots,0:;", 0, "Running"),
        t,
    );
    assert!(s.ledger.pod("p3").is_none());
    assert!(
        s.unreadable["p3"].contains("hami.io/vgpu-devices-allocated"),
        "{:?}",
        s.unreadable
    );
}

#[test]
fn written_assignment_reads_back_in_hamis_format() {
    let gpu = "GPU-5d1e3a9c-8f21-4c6b-9e02-7b4a1f6c3d88";
    let d = |m| AssignedDevice {
        uuid: gpu.into(),
        memory_mib: m,
        cores: 0,
    };
    let a = vec![vec![d(3000)], vec![d(5000)]];
    let annotations = assignment::bind_annotations("gpu-1", &a, 1_748_766_600).unwrap();
    // Byte for byte the list HAMi's EncodePodSingleDevice writes.
    assert_eq!(
        annotations[keys::DEVICES_TO_ALLOCATE],
        golden("device-list-two-containers.txt")
    );
    assert_eq!(
        annotations[keys::DEVICES_ALLOCATED],
        golden("device-list-two-containers.txt")
    );
    assert_eq!(annotations[keys::ASSIGNED_NODE], "gpu-1");
    assert_eq!(annotations[keys::ASSIGNED_TIME], "1748766600");
    assert_eq!(annotations[keys::BIND_TIME], "1748766600");
    assert_eq!(annotations[keys::BIND_PHASE], "allocating");
    // And the device plugin's decoder gives back the same containers.
    let back = PodDevices::parse(&annotations[keys::DEVICES_TO_ALLOCATE]).unwrap();
    assert_eq!(back.containers.len(), 2);
    assert_eq!(
        (
            back.containers[1][0].uuid.as_str(),
            back.containers[1][0].device_type.as_str(),
            back.containers[1][0].mem_mib
        ),
        (gpu, "NVIDIA", 5000)
    );
    // An init container without GPUs stays an empty entry, first.
    let with_empty = assignment::encode(&vec![vec![], a[0].clone()]).unwrap();
    assert_eq!(with_empty, format!(";{gpu},NVIDIA,3000,0:;"));
}
