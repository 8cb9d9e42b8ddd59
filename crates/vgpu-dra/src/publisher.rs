//! Keeps the node's ResourceSlice in the API server: created (owned by the
//! Node), replaced with the next pool generation when the GPUs change,
//! recreated when deleted (the kubelet deletes every slice of its node at
//! start), read back after each write — a server that dropped the
//! consumable-capacity fields gets an error line and a retry, never a slice
//! that pretends to share. A watch on this driver's slices of this node
//! wakes it; a timer catches whatever the watch misses.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Api;
use tokio::sync::watch;

use crate::slice::{self, GpuFacts};

/// What the publisher needs.
pub struct Publisher {
    /// API client.
    pub client: kube::Client,
    /// Driver name.
    pub driver: String,
    /// Node name.
    pub node: String,
    /// The GPUs now.
    pub gpus: Box<dyn Fn() -> Vec<GpuFacts> + Send + Sync>,
    /// Reconcile at least this often.
    pub period: Duration,
}

/// The outcome of one reconcile.
#[derive(Debug, PartialEq, Eq)]
pub enum Reconciled {
    /// The slice was already right.
    Unchanged,
    /// Created or replaced, at this generation.
    Written(i64),
}

impl Publisher {
    fn selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    /// Brings the slice to what the GPUs say; returns an error line to log.
    pub async fn reconcile(&self) -> Result<Reconciled, String> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = slice::slice_name(&self.node, &self.driver);
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(|e| format!("reading node {}: {e}", self.node))?;
        let node_uid = node.metadata.uid.unwrap_or_default();
        let gpus = (self.gpus)();
        // Slices of ours under other names (an older layout) go.
        let list = api
            .list(&ListParams::default().fields(&self.selector()))
            .await
            .map_err(|e| format!("listing ResourceSlices: {e}"))?;
        for s in &list.items {
            let n = s.metadata.name.clone().unwrap_or_default();
            if n != name {
                let _ = api.delete(&n, &DeleteParams::default()).await;
            }
        }
        let current = list
            .items
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
        let stored = match current {
            Some(cur) => {
                let gen = cur.spec.pool.generation;
                let want = slice::build(&self.driver, &self.node, &node_uid, gen, &gpus);
                let owner_ok = cur.metadata.owner_references == want.metadata.owner_references;
                if slice::same_content(&cur, &want) && owner_ok {
                    slice::check_kept(&cur).map_err(|e| e.to_string())?;
                    return Ok(Reconciled::Unchanged);
                }
                let mut next = slice::build(&self.driver, &self.node, &node_uid, gen + 1, &gpus);
                next.metadata.resource_version = cur.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &next)
                    .await
                    .map_err(|e| format!("replacing ResourceSlice {name}: {e}"))?
            }
            None => {
                let want = slice::build(&self.driver, &self.node, &node_uid, 1, &gpus);
                for d in want.spec.devices.iter().flatten() {
                    slice::validate(d).map_err(|e| e.to_string())?;
                }
                api.create(&PostParams::default(), &want)
                    .await
                    .map_err(|e| format!("creating ResourceSlice {name}: {e}"))?
            }
        };
        // What the server kept, not what was sent.
        let back = api
            .get(&name)
            .await
            .map_err(|e| format!("reading back ResourceSlice {name}: {e}"))?;
        if let Err(e) = slice::check_kept(&back).and(slice::check_kept(&stored)) {
            return Err(format!(
                "ResourceSlice {name}: dropped consumable-capacity fields: {e}"
            ));
        }
        Ok(Reconciled::Written(back.spec.pool.generation))
    }

    /// Runs until `shutdown`.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let mut backoff = Duration::from_millis(500);
        loop {
            let wait = match self.reconcile().await {
                Ok(Reconciled::Written(g)) => {
                    tracing::info!(driver = %self.driver, generation = g, "ResourceSlice published");
                    backoff = Duration::from_millis(500);
                    self.period
                }
                Ok(Reconciled::Unchanged) => {
                    backoff = Duration::from_millis(500);
                    self.period
                }
                Err(e) => {
                    if e.contains("dropped consumable-capacity fields") {
                        tracing::error!("{e}");
                    } else {
                        tracing::warn!("ResourceSlice: {e}");
                    }
                    let b = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    b
                }
            };
            // Wake on a change to our slices, the timer, or shutdown.
            let wp = WatchParams::default().fields(&self.selector()).timeout(290);
            let stream = api.watch(&wp, "0").await;
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            match stream {
                Ok(s) => {
                    let mut s = s.boxed();
                    let mut watch_gone = false;
                    // The watch replays the current state as ADDED first:
                    // only a deletion or modification matters.
                    loop {
                        tokio::select! {
                            _ = &mut sleep => break,
                            _ = shutdown.wait_for(|s| *s) => return,
                            ev = s.next() => match ev {
                                Some(Ok(WatchEvent::Deleted(_))) | Some(Ok(WatchEvent::Modified(_))) => break,
                                Some(Ok(_)) => {}
                                // The server ended the watch: start over.
                                None => break,
                                // A broken watch: fall back to the timer.
                                Some(Err(_)) => { watch_gone = true; break }
                            }
                        }
                    }
                    if watch_gone {
                        tokio::select! {
                            _ = &mut sleep => {}
                            _ = shutdown.wait_for(|s| *s) => return,
                        }
                    }
                }
                Err(_) => {
                    tokio::select! {
                        _ = &mut sleep => {}
                        _ = shutdown.wait_for(|s| *s) => return,
                    }
                }
            }
        }
    }
}
