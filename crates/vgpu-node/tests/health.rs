//! Health changes reach the kubelet: ListAndWatch sends the full list again
//! when a GPU turns unhealthy (and when it recovers), with the replicas of
//! that GPU marked `Unhealthy` and the others untouched. Driven through the
//! generated service trait over a fake driver whose queries can be made to
//! fail; the proto file the code was generated from is checked too.
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use vgpu_node::config::NodeConfig;
use vgpu_node::kube_api::KubeApi;
use vgpu_node::nvml::{self, GpuInfo, Gpus, StaticGpus};
use vgpu_node::plugin::{DevicePluginService, DeviceSet, PluginCore, PluginStats};
use vgpu_node::proto::v1beta1::device_plugin_server::DevicePlugin;
use vgpu_node::proto::v1beta1::Empty;

fn gpu(i: u32) -> GpuInfo {
    GpuInfo {
        index: i,
        uuid: format!("GPU-0000000{i}-1111-4222-8333-444444444444"),
        name: "NVIDIA A100-SXM4-80GB".into(),
        memory_total: 80 << 30,
        memory_used: 0,
        bus_id: String::new(),
    }
}

fn set(g: &StaticGpus) -> DeviceSet {
    let gpus = g.devices().unwrap();
    let healthy = gpus.iter().map(|x| nvml::healthy(g, x.index)).collect();
    DeviceSet::from_driver(&gpus, healthy)
}

type Stream = <DevicePluginService as DevicePlugin>::ListAndWatchStream;

async fn next(s: &mut Stream) -> Vec<(String, String)> {
    let r = tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("an update")
        .expect("open");
    let mut v: Vec<(String, String)> = r
        .unwrap()
        .devices
        .into_iter()
        .map(|d| (d.id, d.health))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn health_changes_are_streamed() {
    let fx = vgpu_kube_fixture::ApiFixture::start();
    let g = StaticGpus::default();
    g.devices.lock().unwrap().extend([gpu(0), gpu(1)]);
    let mut cfg = NodeConfig::new("n");
    cfg.split_count = 3;
    let (tx, rx) = watch::channel(set(&g));
    let core = PluginCore::new(
        Arc::new(cfg),
        KubeApi::new(fx.client(), "n"),
        rx,
        Arc::new(PluginStats::default()),
    );
    let svc = DevicePluginService(core);
    let mut s = svc
        .list_and_watch(tonic::Request::new(Empty {}))
        .await
        .unwrap()
        .into_inner();
    let healthy = |u: &str, h: &str| {
        (0..3)
            .map(|i| (format!("{u}-{i}"), h.to_string()))
            .collect::<Vec<_>>()
    };
    let (u0, u1) = (gpu(0).uuid, gpu(1).uuid);
    assert_eq!(
        next(&mut s).await,
        [healthy(&u0, "Healthy"), healthy(&u1, "Healthy")].concat()
    );

    // GPU 1 stops answering: the agent's health check turns it Unhealthy.
    g.failing.lock().unwrap().insert(1);
    tx.send(set(&g)).unwrap();
    assert_eq!(
        next(&mut s).await,
        [healthy(&u0, "Healthy"), healthy(&u1, "Unhealthy")].concat()
    );
    // An unchanged set sends nothing new; a recovery sends the list again.
    tx.send(set(&g)).unwrap();
    g.failing.lock().unwrap().clear();
    tx.send(set(&g)).unwrap();
    assert_eq!(
        next(&mut s).await,
        [healthy(&u0, "Healthy"), healthy(&u1, "Healthy")].concat()
    );
}

#[test]
fn generated_code_matches_the_vendored_proto() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read(dir.join("proto/v1beta1/api.proto")).unwrap();
    let generated = std::fs::read_to_string(dir.join("src/proto/v1beta1.rs")).unwrap();
    let stamp = format!(
        "// proto-fnv1a64: {:016x}",
        vgpu_node::proto::fnv1a64(&proto)
    );
    assert!(
        generated.lines().nth(1) == Some(stamp.as_str()),
        "src/proto/v1beta1.rs was generated from another api.proto: run proto-gen (see proto/README.md)"
    );
    assert!(std::fs::read_to_string(dir.join("proto/LICENSE"))
        .unwrap()
        .contains("Apache License"));
}
