//! The running scheduler's shared parts: the API client, the
//! configuration, the cluster picture, the metrics, and whether the first
//! full read of nodes and pods is done. Every handler holds an
//! `Arc<Scheduler>`; the picture sits behind one `RwLock` that is never
//! held across an await.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use jiff::civil::DateTime;

use crate::config::SchedulerConfig;
use crate::metrics::Metrics;
use crate::state::ClusterState;

pub struct Scheduler {
    pub client: kube::Client,
    pub cfg: SchedulerConfig,
    pub state: Arc<RwLock<ClusterState>>,
    pub metrics: Metrics,
    pub nodes_synced: AtomicBool,
    pub pods_synced: AtomicBool,
}

impl Scheduler {
    pub fn new(client: kube::Client, cfg: SchedulerConfig, legacy_metrics: bool) -> Arc<Self> {
        let state = Arc::new(RwLock::new(ClusterState::default()));
        Arc::new(Self {
            client,
            cfg,
            metrics: Metrics::new(state.clone(), legacy_metrics),
            state,
            nodes_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
        })
    }

    /// Both the node and the pod lists have been read once.
    pub fn ready(&self) -> bool {
        self.nodes_synced.load(Ordering::Acquire) && self.pods_synced.load(Ordering::Acquire)
    }

    pub fn read(&self) -> RwLockReadGuard<'_, ClusterState> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, ClusterState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The scheduler's local civil time: the clock HAMi's handshake stamps use.
pub fn local_now() -> DateTime {
    jiff::Zoned::now().datetime()
}
