//! `bind`: put a pod on the node kube-scheduler chose, with the GPUs it
//! gets there, so that no slice is ever promised twice, by two binds in
//! one scheduler or by two scheduler replicas.
//!
//! HAMi's protocol, in order:
//! 1. take the node lock `hami.io/mutex.lock = <RFC3339>,<ns>,<pod>` by a
//!    merge patch guarded by the node's `resourceVersion` (a lock older
//!    than the expiry, or whose pod is gone, is broken first; another
//!    pod's live lock is waited for, up to `node_lock_wait`);
//! 2. under the lock, read the node and every pod assigned to it afresh
//!    (a linearizable LIST), so what other binders did is seen;
//! 3. place the pod on that node (the same rules as `filter`);
//! 4. write the assignment annotations and `bind-phase=allocating`,
//!    `bind-time` by a merge patch guarded by the pod's `resourceVersion`;
//! 5. create the `pods/binding`.
//!
//! Any failure after 1 rolls back what was written (annotations only if
//! still ours) and releases the lock. On success the lock stays: the node
//! agent's `Allocate` finds the pod by it and releases it (HAMi's
//! contract). Unlike HAMi, the assignment is decided here, for the node
//! actually chosen, not at filter time for a node kube-scheduler may not
//! pick.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use thiserror::Error;
use vgpu_hami::{keys, NodeLock};

use crate::assignment;
use crate::decide;
use crate::extender::ExtenderBindingArgs;
use crate::ledger::PodUsage;
use crate::request::{PodRequest, RequestError};
use crate::scheduler::{local_now, Scheduler};

/// How often a contended lock is tried again.
const LOCK_POLL: Duration = Duration::from_millis(100);
/// Conflicts (another writer between our read and patch) retried at once.
const CONFLICT_RETRIES: usize = 20;

#[derive(Debug, Error)]
pub enum BindError {
    #[error("pod {0} not found")]
    PodNotFound(String),
    #[error("pod {pod} has UID {found}, the binding is for {wanted} (the pod was recreated)")]
    UidMismatch {
        pod: String,
        found: String,
        wanted: String,
    },
    #[error("pod {pod} is already bound to node {node}")]
    AlreadyBound { pod: String, node: String },
    #[error("pod {pod}: {source}")]
    Request { pod: String, source: RequestError },
    #[error("pod {pod} does not fit node {node}: {reason}")]
    NoFit {
        pod: String,
        node: String,
        reason: String,
    },
    #[error("node {node} is locked by {holder} (lock {value:?}); waited {waited:?}")]
    Locked {
        node: String,
        holder: String,
        value: String,
        waited: Duration,
    },
    #[error("node {node}: cannot read its lock {value:?}: {reason}")]
    BadLock {
        node: String,
        value: String,
        reason: String,
    },
    #[error("pod {0} changed while it was being bound; kube-scheduler will retry")]
    PodChanged(String),
    #[error("node {0} kept changing under the lock patch")]
    NodeBusy(String),
    #[error("encoding the device list: {0}")]
    Encode(#[from] vgpu_hami::DeviceListError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl BindError {
    /// The `outcome` label of the bind counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            BindError::NoFit { .. } => "no_fit",
            BindError::Locked { .. } => "locked",
            BindError::PodChanged(_) | BindError::NodeBusy(_) => "conflict",
            BindError::Request { .. } => "bad_request",
            _ => "error",
        }
    }
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Binds as HAMi's scheduler does (module docs).
pub async fn bind(s: &Scheduler, args: &ExtenderBindingArgs) -> Result<(), BindError> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &args.pod_namespace);
    let key = format!("{}/{}", args.pod_namespace, args.pod_name);
    let pod = match pods.get(&args.pod_name).await {
        Ok(p) => p,
        Err(e) if api_code(&e) == Some(404) => return Err(BindError::PodNotFound(key)),
        Err(e) => return Err(e.into()),
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if !args.pod_uid.is_empty() && uid != args.pod_uid {
        return Err(BindError::UidMismatch {
            pod: key,
            found: uid,
            wanted: args.pod_uid.clone(),
        });
    }
    if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        if !bound.is_empty() {
            return Err(BindError::AlreadyBound {
                pod: key,
                node: bound,
            });
        }
    }
    let request = PodRequest::from_pod(&pod, &s.cfg).map_err(|source| BindError::Request {
        pod: key.clone(),
        source,
    })?;
    let Some(request) = request else {
        // No GPU: no lock, no annotations (HAMi's LockNode skips such pods).
        return create_binding(&pods, &pod, &args.node).await;
    };
    let node = acquire_lock(s, &args.node, &args.pod_namespace, &args.pod_name).await?;
    let result = bind_locked(s, &pods, &pod, &uid, &request, &node, &key).await;
    if result.is_err() {
        if let Err(e) = release_lock(s, &args.node, &args.pod_namespace, &args.pod_name).await {
            tracing::warn!(node = %args.node, pod = %key, "releasing the node lock after a failed bind: {e}");
        }
    }
    result
}

async fn bind_locked(
    s: &Scheduler,
    pods: &Api<Pod>,
    pod: &Pod,
    uid: &str,
    request: &PodRequest,
    node: &Node,
    key: &str,
) -> Result<(), BindError> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    // What every binder wrote to this node before we got its lock.
    let assigned = Api::<Pod>::all(s.client.clone())
        .list(&ListParams::default().labels(&format!("{}={}", keys::ASSIGNED_NODE, node_name)))
        .await?;
    let placement = {
        let mut st = s.write();
        st.apply_node(node, &s.cfg, local_now());
        st.refresh_node_pods(&node_name, &assigned.items);
        decide::place(&st, request, Some(uid), &node_name)
    }
    .map_err(|reason| BindError::NoFit {
        pod: key.to_owned(),
        node: node_name.clone(),
        reason,
    })?;
    let annotations = assignment::bind_annotations(
        &node_name,
        &placement.containers,
        Timestamp::now().as_second(),
    )?;
    let patch = json!({"metadata": {
        "annotations": annotations,
        "labels": {keys::ASSIGNED_NODE: node_name},
        "resourceVersion": pod.metadata.resource_version,
    }});
    let patched = match pods
        .patch(
            &pod_name(pod),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(p) => p,
        Err(e) if api_code(&e) == Some(409) => return Err(BindError::PodChanged(key.to_owned())),
        Err(e) => return Err(e.into()),
    };
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len);
    s.write().assume(
        uid,
        PodUsage::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod_name(pod),
            node_name.clone(),
            placement.containers.clone(),
            inits,
        ),
        Instant::now(),
    );
    if let Err(e) = create_binding(pods, pod, &node_name).await {
        s.write().remove_pod(uid);
        if let Err(re) = roll_back_annotations(pods, &patched, &annotations).await {
            tracing::warn!(pod = %key, "rolling back the assignment annotations: {re}");
        }
        return Err(e);
    }
    Ok(())
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

async fn create_binding(pods: &Api<Pod>, pod: &Pod, node: &str) -> Result<(), BindError> {
    let binding = Binding {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            ..Default::default()
        },
    };
    pods.create_subresource::<_, Value>(
        "binding",
        &pod_name(pod),
        &PostParams::default(),
        &binding,
    )
    .await?;
    Ok(())
}

/// Removes the annotations a failed bind wrote, only while the pod still
/// carries exactly them (never another binder's).
async fn roll_back_annotations(
    pods: &Api<Pod>,
    patched: &Pod,
    ours: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let mut current = patched.clone();
    for _ in 0..CONFLICT_RETRIES {
        let still_ours = ours
            .iter()
            .filter(|(k, _)| *k != keys::BIND_PHASE)
            .all(|(k, v)| annotation(&current.metadata, k) == Some(v.as_str()));
        if !still_ours {
            return Ok(());
        }
        let nulls: serde_json::Map<String, Value> =
            ours.keys().map(|k| (k.clone(), Value::Null)).collect();
        let patch = json!({"metadata": {
            "annotations": nulls,
            "labels": {keys::ASSIGNED_NODE: null},
            "resourceVersion": current.metadata.resource_version,
        }});
        match pods
            .patch(
                &pod_name(&current),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if api_code(&e) == Some(409) => current = pods.get(&pod_name(&current)).await?,
            Err(e) if api_code(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Takes the node lock for `namespace/pod`; returns the node as locked.
pub async fn acquire_lock(
    s: &Scheduler,
    node: &str,
    namespace: &str,
    pod: &str,
) -> Result<Node, BindError> {
    let nodes: Api<Node> = Api::all(s.client.clone());
    let started = Instant::now();
    let mut conflicts = 0;
    loop {
        let current = nodes.get(node).await?;
        let rv = current.metadata.resource_version.clone();
        let held = annotation(&current.metadata, keys::NODE_LOCK).map(str::to_owned);
        let Some(value) = held else {
            let lock = NodeLock::new(Timestamp::now(), namespace, pod).to_string();
            let patch = json!({"metadata": {"annotations": {keys::NODE_LOCK: lock}, "resourceVersion": rv}});
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(locked) => return Ok(locked),
                Err(e) if api_code(&e) == Some(409) => {
                    conflicts += 1;
                    if conflicts > CONFLICT_RETRIES {
                        return Err(BindError::NodeBusy(node.to_owned()));
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let lock = NodeLock::parse(&value).map_err(|e| BindError::BadLock {
            node: node.to_owned(),
            value: value.clone(),
            reason: e.to_string(),
        })?;
        if lock.is_held_by(namespace, pod) {
            return Ok(current);
        }
        let mut broken = lock.is_expired(Timestamp::now(), s.cfg.node_lock_expiry);
        if !broken {
            if let Some(owner) = &lock.owner {
                let theirs: Api<Pod> = Api::namespaced(s.client.clone(), &owner.namespace);
                match theirs.get(&owner.pod).await {
                    Err(e) if api_code(&e) == Some(404) => broken = true,
                    Err(e) => return Err(e.into()),
                    Ok(_) => {}
                }
            }
        }
        if broken {
            tracing::info!(node, lock = %value, "breaking a node lock (expired or its pod is gone)");
            let patch = json!({"metadata": {"annotations": {keys::NODE_LOCK: null}, "resourceVersion": rv}});
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => continue,
                Err(e) if api_code(&e) == Some(409) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let waited = started.elapsed();
        if waited >= s.cfg.node_lock_wait {
            let holder = lock
                .owner
                .as_ref()
                .map(|o| format!("{}/{}", o.namespace, o.pod))
                .unwrap_or_else(|| "an unnamed holder".into());
            return Err(BindError::Locked {
                node: node.to_owned(),
                holder,
                value,
                waited,
            });
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// Releases the node lock if `namespace/pod` holds it.
pub async fn release_lock(
    s: &Scheduler,
    node: &str,
    namespace: &str,
    pod: &str,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(s.client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let current = nodes.get(node).await?;
        let held = annotation(&current.metadata, keys::NODE_LOCK)
            .and_then(|v| NodeLock::parse(v).ok())
            .is_some_and(|l| l.is_held_by(namespace, pod));
        if !held {
            return Ok(());
        }
        let patch = json!({"metadata": {
            "annotations": {keys::NODE_LOCK: null},
            "resourceVersion": current.metadata.resource_version,
        }});
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if api_code(&e) == Some(409) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
