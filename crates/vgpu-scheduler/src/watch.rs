//! Keeping the cluster picture current: a watch on Nodes and one on pods
//! labelled `hami.io/vgpu-node` (every pod a HAMi-compatible scheduler has
//! assigned), each relisting on its own after errors (kube's watcher),
//! and the handshake writer that starts HAMi's health timer on GPU nodes.
//!
//! A full list replaces what it covers, so a restarted scheduler's usage
//! is exactly what the bound pods' `vgpu-devices-allocated` say. Only
//! these tasks and the binder write the picture.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use serde_json::json;
use vgpu_hami::{keys, Handshake};

use crate::scheduler::{local_now, Scheduler};

/// Runs the node watch until the stream ends (it does not, in practice).
pub async fn watch_nodes(s: Arc<Scheduler>, label_selector: Option<String>) {
    let api: Api<Node> = Api::all(s.client.clone());
    let mut config = watcher::Config::default();
    if let Some(sel) = &label_selector {
        config = config.labels(sel);
    }
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut relist: Vec<Node> = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(n)) => s.write().apply_node(&n, &s.cfg, local_now()),
            Ok(Event::Delete(n)) => s
                .write()
                .remove_node(n.metadata.name.as_deref().unwrap_or("")),
            Ok(Event::Init) => relist.clear(),
            Ok(Event::InitApply(n)) => relist.push(n),
            Ok(Event::InitDone) => {
                s.write()
                    .replace_nodes(&std::mem::take(&mut relist), &s.cfg, local_now());
                s.nodes_synced.store(true, Ordering::Release);
            }
            Err(e) => tracing::warn!("node watch: {e}"),
        }
    }
}

/// Runs the watch on assigned pods.
pub async fn watch_pods(s: Arc<Scheduler>) {
    let api: Api<Pod> = Api::all(s.client.clone());
    let config = watcher::Config::default().labels(keys::ASSIGNED_NODE);
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut relist: Vec<Pod> = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(p)) => s.write().apply_pod(&p, Instant::now()),
            Ok(Event::Delete(p)) => {
                if let Some(uid) = &p.metadata.uid {
                    s.write().remove_pod(uid);
                }
            }
            Ok(Event::Init) => relist.clear(),
            Ok(Event::InitApply(p)) => relist.push(p),
            Ok(Event::InitDone) => {
                s.write()
                    .replace_pods(&std::mem::take(&mut relist), Instant::now());
                s.pods_synced.store(true, Ordering::Release);
            }
            Err(e) => tracing::warn!("pod watch: {e}"),
        }
    }
}

/// Every `period`, writes `Requesting_<now>` on GPU nodes whose handshake
/// is not a standing request: after `handshake_timeout` such a node is
/// judged by its allocatable GPU count (HAMi v2.10's health rule).
pub async fn write_handshakes(s: Arc<Scheduler>, period: Duration) {
    let nodes: Api<Node> = Api::all(s.client.clone());
    loop {
        let due: Vec<String> = s
            .read()
            .nodes
            .values()
            .filter(|n| n.handshake_due)
            .map(|n| n.name.clone())
            .collect();
        for name in due {
            let value = Handshake::requesting(local_now()).to_string();
            let patch = json!({"metadata": {"annotations": {keys::NODE_HANDSHAKE: value}}});
            if let Err(e) = nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(node = %name, "writing the handshake: {e}");
            }
        }
        tokio::time::sleep(period).await;
    }
}
