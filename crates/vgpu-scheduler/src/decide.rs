//! The extender's `filter` and `prioritize` answers, from the cluster
//! picture. Better than HAMi's: `filter` returns every node that fits
//! (HAMi returns only its own best one, so kube-scheduler's scoring never
//! runs) and says why each other node does not; `prioritize` scores the
//! fitting nodes by the pod's node policy so kube-scheduler can weigh our
//! preference against its own plugins.
//!
//! Pure over a `ClusterState`: no I/O, nothing written. The pod's own
//! earlier assignment (a bind that failed, a retry) is left out of the
//! usage it is fitted against.

use std::borrow::Cow;
use std::collections::HashMap;

use jiff::civil::DateTime;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::List;

use crate::config::SchedulerConfig;
use crate::extender::{ExtenderArgs, ExtenderFilterResult, FailedNodesMap, HostPriority};
use crate::fit::{fit_pod, node_score, Placement};
use crate::inventory::NodeInventory;
use crate::ledger::DeviceUsage;
use crate::request::PodRequest;
use crate::state::ClusterState;

/// The reason given for a node the scheduler has never seen.
pub const UNKNOWN_NODE: &str = "no GPUs: the node is not known to the vgpu scheduler";

/// One candidate's answer.
enum Verdict {
    Fits(Placement),
    Refused { reason: String, resolvable: bool },
}

/// Candidate nodes in the order kube-scheduler sent them, with the
/// inventory to judge them by.
fn candidates<'a>(
    state: &'a ClusterState,
    args: &'a ExtenderArgs,
    cfg: &SchedulerConfig,
    now: DateTime,
) -> Vec<(String, Option<Cow<'a, NodeInventory>>)> {
    if let Some(names) = &args.node_names {
        return names
            .iter()
            .map(|n| (n.clone(), state.nodes.get(n).map(Cow::Borrowed)))
            .collect();
    }
    // Whole Node objects: read what they say now (the usage still comes
    // from the ledger).
    args.nodes
        .iter()
        .flat_map(|l| &l.items)
        .map(|node| {
            let inv =
                NodeInventory::from_node(node, &cfg.resources.count, now, cfg.handshake_timeout);
            (inv.name.clone(), Some(Cow::Owned(inv)))
        })
        .collect()
}

fn judge(
    state: &ClusterState,
    req: &PodRequest,
    pod_uid: Option<&str>,
    name: &str,
    inv: Option<&NodeInventory>,
) -> Verdict {
    let Some(inv) = inv else {
        return Verdict::Refused {
            reason: UNKNOWN_NODE.to_owned(),
            resolvable: false,
        };
    };
    let used = state.ledger.node(name);
    // Leave out this pod's own earlier record on this node.
    let own = pod_uid
        .and_then(|uid| state.ledger.pod(uid))
        .filter(|p| p.node == name);
    let adjusted: Option<HashMap<String, DeviceUsage>> = own.map(|p| {
        let mut u = used.cloned().unwrap_or_default();
        for (uuid, mine) in &p.effective {
            if let Some(total) = u.get_mut(uuid) {
                total.slots = total.slots.saturating_sub(mine.slots);
                total.memory_mib = total.memory_mib.saturating_sub(mine.memory_mib);
                total.cores = total.cores.saturating_sub(mine.cores);
            }
        }
        u
    });
    match fit_pod(req, inv, adjusted.as_ref().or(used)) {
        Ok(p) => Verdict::Fits(p),
        Err(r) => Verdict::Refused {
            reason: r.to_string(),
            resolvable: r.resolvable(),
        },
    }
}

fn pod_uid(args: &ExtenderArgs) -> Option<&str> {
    args.pod.as_ref().and_then(|p| p.metadata.uid.as_deref())
}

/// The `filter` answer.
pub fn filter(
    state: &ClusterState,
    args: &ExtenderArgs,
    cfg: &SchedulerConfig,
    now: DateTime,
) -> ExtenderFilterResult {
    let Some(pod) = args.pod.as_ref() else {
        return ExtenderFilterResult::error("extender args carry no Pod");
    };
    let mut failed = FailedNodesMap::new();
    let mut unresolvable = FailedNodesMap::new();
    let mut fits: Vec<String> = Vec::new();
    match PodRequest::from_pod(pod, cfg) {
        // Not ours: every node stays a candidate.
        Ok(None) => {
            return ExtenderFilterResult {
                nodes: args.nodes.clone(),
                node_names: args.node_names.clone(),
                ..Default::default()
            }
        }
        // A malformed request fits nowhere; kube-scheduler shows the reason
        // once per node ("0/3 nodes are available: 3 <reason>").
        Err(e) => {
            for (name, _) in candidates(state, args, cfg, now) {
                unresolvable.insert(name, e.to_string());
            }
        }
        Ok(Some(req)) => {
            for (name, inv) in candidates(state, args, cfg, now) {
                match judge(state, &req, pod_uid(args), &name, inv.as_deref()) {
                    Verdict::Fits(_) => fits.push(name),
                    Verdict::Refused { reason, resolvable } => {
                        if resolvable {
                            failed.insert(name, reason);
                        } else {
                            unresolvable.insert(name, reason);
                        }
                    }
                }
            }
        }
    }
    let (nodes, node_names) = if args.node_names.is_some() {
        (None, Some(fits))
    } else {
        let items: Vec<Node> = args
            .nodes
            .iter()
            .flat_map(|l| &l.items)
            .filter(|n| {
                n.metadata
                    .name
                    .as_ref()
                    .is_some_and(|name| fits.contains(name))
            })
            .cloned()
            .collect();
        (
            Some(List {
                items,
                metadata: Default::default(),
            }),
            None,
        )
    };
    ExtenderFilterResult {
        nodes,
        node_names,
        failed_nodes: Some(failed),
        failed_and_unresolvable_nodes: Some(unresolvable),
        error: String::new(),
    }
}

/// The `prioritize` answer: every candidate with a score 0..=10; nodes
/// that do not fit (or a pod that asks for no GPU) score 0.
pub fn prioritize(
    state: &ClusterState,
    args: &ExtenderArgs,
    cfg: &SchedulerConfig,
    now: DateTime,
) -> Vec<HostPriority> {
    let req = args
        .pod
        .as_ref()
        .and_then(|p| PodRequest::from_pod(p, cfg).ok().flatten());
    candidates(state, args, cfg, now)
        .into_iter()
        .map(|(name, inv)| {
            let score = match &req {
                Some(req) => match judge(state, req, pod_uid(args), &name, inv.as_deref()) {
                    Verdict::Fits(p) => node_score(req.node_policy, p.utilization),
                    Verdict::Refused { .. } => 0,
                },
                None => 0,
            };
            HostPriority { host: name, score }
        })
        .collect()
}

/// Where the pod goes on `node`, for the binder (same rules as `filter`).
pub fn place(
    state: &ClusterState,
    req: &PodRequest,
    pod_uid: Option<&str>,
    node: &str,
) -> Result<Placement, String> {
    match judge(state, req, pod_uid, node, state.nodes.get(node)) {
        Verdict::Fits(p) => Ok(p),
        Verdict::Refused { reason, .. } => Err(reason),
    }
}
