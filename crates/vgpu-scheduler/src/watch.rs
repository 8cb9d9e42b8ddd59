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

/// Which due nodes to ask again. The node cache can lag our own patch by
/// more than a period; asking again while it still shows the value we
/// answered would write the Node for nothing (HAMi's plugin never answers,
/// so the request is meant to stand). A node is asked again only once the
/// cache shows something other than what it showed when we wrote.
#[derive(Debug, Default)]
pub struct HandshakeRequests {
    /// Node → the handshake value the cache showed when we wrote ours.
    written: std::collections::HashMap<String, Option<String>>,
}

impl HandshakeRequests {
    /// The nodes to write now, given (name, due, handshake seen) for every node.
    pub fn due<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a str, bool, Option<&'a str>)>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (name, due, handshake) in nodes {
            seen.insert(name.to_owned());
            if !due {
                // Our request (or anything standing) reached the cache.
                self.written.remove(name);
                continue;
            }
            match self.written.get(name) {
                Some(before) if before.as_deref() == handshake => {} // cache lags our write
                _ => out.push(name.to_owned()),
            }
        }
        self.written.retain(|n, _| seen.contains(n));
        out
    }

    /// Records a successful write on `node` while the cache showed `before`.
    pub fn wrote(&mut self, node: &str, before: Option<String>) {
        self.written.insert(node.to_owned(), before);
    }
}

/// Every `period`, writes `Requesting_<now>` on GPU nodes whose handshake
/// is not a standing request: after `handshake_timeout` such a node is
/// judged by its allocatable GPU count (HAMi v2.10's health rule).
pub async fn write_handshakes(s: Arc<Scheduler>, period: Duration) {
    let nodes: Api<Node> = Api::all(s.client.clone());
    let mut requests = HandshakeRequests::default();
    loop {
        let (due, before): (
            Vec<String>,
            std::collections::HashMap<String, Option<String>>,
        ) = {
            let st = s.read();
            let due = requests.due(
                st.nodes
                    .values()
                    .map(|n| (n.name.as_str(), n.handshake_due, n.handshake.as_deref())),
            );
            let before = due
                .iter()
                .filter_map(|d| st.nodes.get(d).map(|n| (d.clone(), n.handshake.clone())))
                .collect();
            (due, before)
        };
        for name in due {
            let value = Handshake::requesting(local_now()).to_string();
            let patch = json!({"metadata": {"annotations": {keys::NODE_HANDSHAKE: value}}});
            match nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => requests.wrote(&name, before.get(&name).cloned().flatten()),
                Err(e) => tracing::warn!(node = %name, "writing the handshake: {e}"),
            }
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::HandshakeRequests;

    #[test]
    fn a_lagging_cache_does_not_renew_the_request() {
        let mut r = HandshakeRequests::default();
        assert_eq!(r.due([("a", true, None)]), vec!["a".to_owned()]);
        r.wrote("a", None);
        // The cache still shows no handshake: our write is in flight.
        assert!(r.due([("a", true, None)]).is_empty());
        // Our request arrived: not due.
        assert!(r.due([("a", false, Some("Requesting_x"))]).is_empty());
        // Something else answered later (e.g. `Deleted_`): ask again.
        assert_eq!(
            r.due([("a", true, Some("Deleted_y"))]),
            vec!["a".to_owned()]
        );
    }

    #[test]
    fn a_new_value_while_we_wait_is_asked_again_and_gone_nodes_are_forgotten() {
        let mut r = HandshakeRequests::default();
        r.wrote("a", None);
        assert_eq!(
            r.due([("a", true, Some("Deleted_y"))]),
            vec!["a".to_owned()]
        );
        r.wrote("b", None);
        assert!(r.due([("a", false, None)]).is_empty());
        assert!(r.written.is_empty(), "{:?}", r.written);
    }
}
