//! The scheduler's metrics carry HAMi's names, labels and values (and the
//! legacy names only when asked), plus our latency histograms.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use vgpu_hami::{keys, register, NodeDevice};
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::metrics::Metrics;
use vgpu_scheduler::state::ClusterState;

fn state() -> Arc<RwLock<ClusterState>> {
    let mut s = ClusterState::default();
    let dev = NodeDevice {
        id: "GPU-aaaa".into(),
        index: 0,
        count: 10,
        devmem: 16384,
        devcore: 100,
        device_type: "NVIDIA-Tesla T4".into(),
        mode: "hami-core".into(),
        health: true,
        ..Default::default()
    };
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "gpu-1",
        "annotations": {keys::NODE_REGISTER: register::encode(&[dev])}}}))
    .unwrap();
    s.apply_node(
        &node,
        &SchedulerConfig::default(),
        "2025-06-01T00:00:00".parse().unwrap(),
    );
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "train", "namespace": "ml", "uid": "u1",
        "annotations": {keys::ASSIGNED_NODE: "gpu-1", keys::DEVICES_ALLOCATED: "GPU-aaaa,NVIDIA,4096,30:;"}},
        "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}})).unwrap();
    s.apply_pod(&pod, Instant::now());
    Arc::new(RwLock::new(s))
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix}\n{text}"))
}

#[test]
fn hami_names_labels_and_values() {
    let m = Metrics::new(state(), false);
    m.timings.filter.observe(0.003);
    let text = m.render();
    let gpu = r#"{zone="vGPU",node="gpu-1",device_uuid="GPU-aaaa",device_index="0",device_type="NVIDIA-Tesla T4"}"#;
    assert_eq!(
        line(&text, "hami_gpu_memory_limit_bytes{"),
        format!("hami_gpu_memory_limit_bytes{gpu} 17179869184.0")
    );
    assert_eq!(
        line(&text, "hami_gpu_core_limit_ratio{"),
        format!("hami_gpu_core_limit_ratio{gpu} 100.0")
    );
    assert_eq!(
        line(&text, "hami_gpu_shared_count{"),
        format!("hami_gpu_shared_count{gpu} 1.0")
    );
    assert_eq!(
        line(&text, "hami_gpu_core_allocated_ratio{"),
        format!("hami_gpu_core_allocated_ratio{gpu} 30.0")
    );
    assert_eq!(
        line(&text, "hami_gpu_memory_allocated_bytes{"),
        format!(
            r#"hami_gpu_memory_allocated_bytes{{zone="vGPU",node="gpu-1",device_uuid="GPU-aaaa",device_index="0",device_cores="100",device_type="NVIDIA-Tesla T4"}} 4294967296.0"#
        )
    );
    assert_eq!(
        line(&text, "hami_node_gpu_memory_allocated_ratio{"),
        format!("hami_node_gpu_memory_allocated_ratio{gpu} 0.25")
    );
    assert!(line(&text, "hami_node_gpu_overview{").contains(r#"device_memory_limit="16384""#));
    assert_eq!(
        line(&text, "hami_vgpu_memory_allocated_bytes{"),
        format!(
            r#"hami_vgpu_memory_allocated_bytes{{zone="vGPU",namespace="ml",node="gpu-1",pod="train",container_index="0",device_uuid="GPU-aaaa"}} 4294967296.0"#
        )
    );
    assert!(line(&text, "hami_vgpu_core_allocated_ratio{").ends_with(" 30.0"));
    assert!(line(&text, "vgpu_scheduler_filter_duration_seconds_count").ends_with(" 1"));
    assert!(
        !text.contains("GPUDeviceMemoryLimit"),
        "legacy names only behind the flag"
    );
}

#[test]
fn legacy_names_behind_the_flag() {
    let text = Metrics::new(state(), true).render();
    assert!(line(&text, "GPUDeviceMemoryLimit{").contains(
        r#"nodeid="gpu-1",deviceuuid="GPU-aaaa",deviceidx="0",devicetype="NVIDIA-Tesla T4""#
    ));
    assert!(line(&text, "vGPUMemoryAllocated{").contains(r#"podnamespace="ml",nodename="gpu-1",podname="train",containeridx="0",deviceuuid="GPU-aaaa""#));
    assert!(!line(&text, "nodeGPUMemoryPercentage{").contains("devicetype"));
    // The new names stay.
    assert!(text.contains("hami_gpu_memory_limit_bytes{"));
}
