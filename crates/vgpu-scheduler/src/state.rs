//! The scheduler's picture of the cluster: each GPU node's inventory and
//! the ledger of pods holding GPUs, kept current from Node and Pod events
//! (and from the binder, which records a pod before its own patch comes
//! back as an event).
//!
//! Owns the rules for folding events in; never talks to the API server.
//! A pod recorded by a bind is "assumed" (as kube-scheduler assumes): an
//! older event for it that still lacks the annotations must not erase it,
//! until the annotated version arrives, the pod goes away, or the
//! assumption expires.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jiff::civil::DateTime;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::assignment;
use crate::config::SchedulerConfig;
use crate::inventory::NodeInventory;
use crate::ledger::{Ledger, PodUsage};

/// How long a bind's own record outlives the lack of a matching event.
pub const ASSUME_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct ClusterState {
    pub nodes: HashMap<String, NodeInventory>,
    pub ledger: Ledger,
    /// Pods whose device list does not decode: UID to why (they hold an
    /// unknown amount; reported, never guessed).
    pub unreadable: HashMap<String, String>,
    assumed: HashMap<String, Instant>,
}

impl ClusterState {
    pub fn apply_node(&mut self, node: &Node, cfg: &SchedulerConfig, now: DateTime) {
        let inv = NodeInventory::from_node(node, &cfg.resources.count, now, cfg.handshake_timeout);
        self.nodes.insert(inv.name.clone(), inv);
    }

    /// A full relist of nodes: the picture becomes exactly these.
    pub fn replace_nodes(&mut self, nodes: &[Node], cfg: &SchedulerConfig, now: DateTime) {
        self.nodes.clear();
        for n in nodes {
            self.apply_node(n, cfg, now);
        }
    }

    /// A full relist of assigned pods: the ledger becomes exactly these,
    /// plus binds still assumed (their patch may postdate the list).
    pub fn replace_pods(&mut self, pods: &[Pod], now: Instant) {
        self.assumed
            .retain(|_, t| now.duration_since(*t) < ASSUME_TTL);
        let keep: Vec<(String, PodUsage)> = self
            .assumed
            .keys()
            .filter_map(|uid| self.ledger.pod(uid).map(|p| (uid.clone(), p.clone())))
            .collect();
        self.ledger = Ledger::default();
        self.unreadable.clear();
        for (uid, usage) in keep {
            self.ledger.upsert(&uid, usage);
        }
        for pod in pods {
            self.apply_pod(pod, now);
        }
    }

    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Folds in the current version of a pod.
    pub fn apply_pod(&mut self, pod: &Pod, now: Instant) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        // A terminating pod still holds its GPUs until it is gone.
        match assignment::pod_usage(pod) {
            Some(Ok((uid, usage))) => {
                self.unreadable.remove(&uid);
                self.assumed.remove(&uid);
                self.ledger.upsert(&uid, usage);
            }
            Some(Err(why)) => {
                self.ledger.remove(&uid);
                self.assumed.remove(&uid);
                self.unreadable.insert(uid, why);
            }
            None => {
                let fresh = self
                    .assumed
                    .get(&uid)
                    .is_some_and(|t| now.duration_since(*t) < ASSUME_TTL);
                if fresh && !assignment::is_finished(pod) {
                    return;
                }
                self.remove_pod(&uid);
            }
        }
    }

    pub fn remove_pod(&mut self, uid: &str) {
        self.ledger.remove(uid);
        self.assumed.remove(uid);
        self.unreadable.remove(uid);
    }

    /// Records a pod a bind just assigned.
    pub fn assume(&mut self, uid: &str, usage: PodUsage, now: Instant) {
        self.ledger.upsert(uid, usage);
        self.assumed.insert(uid.to_owned(), now);
    }

    /// Replaces everything known about `node`'s pods with a fresh list
    /// (read under the node lock), keeping assumptions for other nodes.
    pub fn refresh_node_pods(&mut self, node: &str, pods: &[Pod]) {
        let mut fresh = Vec::new();
        for pod in pods {
            match assignment::pod_usage(pod) {
                Some(Ok((uid, usage))) if usage.node == node => fresh.push((uid, usage)),
                Some(Err(why)) => {
                    if let Some(uid) = &pod.metadata.uid {
                        self.unreadable.insert(uid.clone(), why);
                    }
                }
                _ => {}
            }
        }
        for (uid, _) in &fresh {
            self.assumed.remove(uid);
        }
        self.ledger.replace_node(node, fresh);
    }
}
