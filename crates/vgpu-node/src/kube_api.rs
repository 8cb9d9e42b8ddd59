//! The agent's Kubernetes calls (kube-rs, typed by k8s-openapi): read the
//! node and the pods bound to it, merge-patch annotations (the node lock
//! guarded by resourceVersion, as HAMi does), post Events. Nothing here
//! decides anything; callers own the protocol. [`NodeKube`] is the set of
//! calls the agent's parts make, so they can run against an in-memory
//! cluster in unit tests; [`KubeApi`] is the real one.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use vgpu_hami::{keys, NodeLock};

/// One failed API call, with what was attempted.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct KubeError {
    /// What was attempted.
    pub what: String,
    /// The client's error.
    #[source]
    pub source: kube::Error,
}

impl KubeError {
    /// The HTTP status when the server answered with one.
    pub fn code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }
}

fn err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
    let what = what.into();
    move |source| KubeError { what, source }
}

/// A client bound to this node.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    node: String,
    component: String,
}

impl KubeApi {
    /// For `node`.
    pub fn new(client: Client, node: impl Into<String>) -> KubeApi {
        KubeApi {
            client,
            node: node.into(),
            component: "vgpu-node".into(),
        }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// GET the node.
    pub async fn node(&self) -> Result<Node, KubeError> {
        Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(err(format!("get node {}", self.node)))
    }

    /// Merge-patches node annotations (`None` deletes); `resource_version`
    /// guards the write (409 when stale).
    pub async fn patch_node_annotations(
        &self,
        annotations: &BTreeMap<String, Option<String>>,
        resource_version: Option<&str>,
    ) -> Result<Node, KubeError> {
        let mut meta = json!({ "annotations": annotations });
        if let Some(rv) = resource_version {
            meta["resourceVersion"] = json!(rv);
        }
        Api::<Node>::all(self.client.clone())
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": meta })),
            )
            .await
            .map_err(err(format!("patch annotations of node {}", self.node)))
    }

    /// Pods bound to this node, every namespace (`spec.nodeName=<node>`).
    pub async fn pods_on_node(&self) -> Result<Vec<Pod>, KubeError> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        Ok(Api::<Pod>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(err(format!("list pods on node {}", self.node)))?
            .items)
    }

    /// GET one pod (`None` when it does not exist).
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, KubeError> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(err(format!("get pod {namespace}/{name}")))
    }

    /// Merge-patches pod annotations.
    pub async fn patch_pod_annotations(
        &self,
        namespace: &str,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Pod, KubeError> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
            )
            .await
            .map_err(err(format!("patch annotations of pod {namespace}/{name}")))
    }

    /// Posts a core/v1 Event about `pod`.
    pub async fn pod_event(
        &self,
        pod: &Pod,
        event_type: &str,
        reason: &str,
        message: &str,
    ) -> Result<Event, KubeError> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = Time(jiff::Timestamp::now());
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.vgpu-")),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(event_type.into()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.node.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.node.clone()),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &ev)
            .await
            .map_err(err(format!("post event {reason} for pod {ns}")))
    }
}

/// The Kubernetes calls of the node agent's parts (plugin, registration,
/// watchdog): [`KubeApi`] against the API server, an in-memory fake in unit
/// tests.
pub trait NodeKube: Send + Sync + 'static {
    /// The node's name.
    fn node_name(&self) -> &str;

    /// GET the node.
    fn node(&self) -> impl Future<Output = Result<Node, KubeError>> + Send;

    /// Merge-patches node annotations (`None` deletes); `resource_version`
    /// guards the write (409 when stale).
    fn patch_node_annotations(
        &self,
        annotations: &BTreeMap<String, Option<String>>,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<Node, KubeError>> + Send;

    /// Pods bound to this node, every namespace.
    fn pods_on_node(&self) -> impl Future<Output = Result<Vec<Pod>, KubeError>> + Send;

    /// GET one pod (`None` when it does not exist).
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, KubeError>> + Send;

    /// Merge-patches pod annotations.
    fn patch_pod_annotations(
        &self,
        namespace: &str,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Pod, KubeError>> + Send;

    /// Posts a core/v1 Event about `pod`.
    fn pod_event(
        &self,
        pod: &Pod,
        event_type: &str,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = Result<Event, KubeError>> + Send;

    /// Releases the node lock if it is held by `namespace/pod` or is a
    /// legacy lock naming nobody (HAMi's `ReleaseNodeLock`), guarded by the
    /// node's resourceVersion and retried on conflict. Returns whether a
    /// lock was removed.
    fn release_node_lock(
        &self,
        namespace: &str,
        pod: &str,
    ) -> impl Future<Output = Result<bool, KubeError>> + Send {
        async move {
            for _ in 0..5 {
                let node = self.node().await?;
                let Some(value) = node
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(keys::NODE_LOCK))
                else {
                    return Ok(false);
                };
                let ours = match NodeLock::parse(value) {
                    Ok(l) => l.owner.is_none() || l.is_held_by(namespace, pod),
                    // A value nobody can parse blocks the node forever otherwise.
                    Err(_) => true,
                };
                if !ours {
                    return Ok(false);
                }
                let del = BTreeMap::from([(keys::NODE_LOCK.to_owned(), None)]);
                match self
                    .patch_node_annotations(&del, node.metadata.resource_version.as_deref())
                    .await
                {
                    Ok(_) => return Ok(true),
                    Err(e) if e.code() == Some(409) => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(false)
        }
    }
}

impl NodeKube for KubeApi {
    fn node_name(&self) -> &str {
        KubeApi::node_name(self)
    }

    async fn node(&self) -> Result<Node, KubeError> {
        KubeApi::node(self).await
    }

    async fn patch_node_annotations(
        &self,
        annotations: &BTreeMap<String, Option<String>>,
        resource_version: Option<&str>,
    ) -> Result<Node, KubeError> {
        KubeApi::patch_node_annotations(self, annotations, resource_version).await
    }

    async fn pods_on_node(&self) -> Result<Vec<Pod>, KubeError> {
        KubeApi::pods_on_node(self).await
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, KubeError> {
        KubeApi::pod(self, namespace, name).await
    }

    async fn patch_pod_annotations(
        &self,
        namespace: &str,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Pod, KubeError> {
        KubeApi::patch_pod_annotations(self, namespace, name, annotations).await
    }

    async fn pod_event(
        &self,
        pod: &Pod,
        event_type: &str,
        reason: &str,
        message: &str,
    ) -> Result<Event, KubeError> {
        KubeApi::pod_event(self, pod, event_type, reason, message).await
    }
}

/// A kube client from a kubeconfig path, else in-cluster, else `KUBECONFIG`.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, String> {
    let cfg = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| format!("read kubeconfig {}: {e}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes configuration (in-cluster or KUBECONFIG): {e}"))?,
    };
    Client::try_from(cfg).map_err(|e| format!("kube client: {e}"))
}

/// An in-memory cluster of one node for unit tests: the node's annotations
/// with a resourceVersion that guards patches as the API server's does, and
/// pods; Events are accepted and dropped.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{Event, Node, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::{KubeError, NodeKube};

    #[derive(Default)]
    struct State {
        node: Node,
        version: u64,
        pods: Vec<Pod>,
    }

    /// One node and its pods.
    pub(crate) struct FakeKube {
        name: String,
        state: Mutex<State>,
    }

    fn api_error(what: String, code: u16) -> KubeError {
        KubeError {
            what,
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("fake", "Fake").with_code(code),
            )),
        }
    }

    fn merge(into: &mut Option<BTreeMap<String, String>>, k: &str, v: Option<&String>) {
        let a = into.get_or_insert_with(BTreeMap::new);
        match v {
            Some(v) => a.insert(k.to_owned(), v.clone()),
            None => a.remove(k),
        };
    }

    impl FakeKube {
        /// Node `name`, no annotations, no pods.
        pub(crate) fn new(name: &str) -> FakeKube {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    resource_version: Some("1".into()),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            };
            FakeKube {
                name: name.to_owned(),
                state: Mutex::new(State {
                    node,
                    version: 1,
                    ..State::default()
                }),
            }
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Sets (or with `None` removes) a node annotation.
        pub(crate) fn set_node_annotation(&self, k: &str, v: Option<&str>) {
            let mut st = self.state();
            merge(
                &mut st.node.metadata.annotations,
                k,
                v.map(str::to_owned).as_ref(),
            );
            st.version += 1;
            st.node.metadata.resource_version = Some(st.version.to_string());
        }

        /// A node annotation.
        pub(crate) fn node_annotation(&self, k: &str) -> Option<String> {
            let st = self.state();
            st.node.metadata.annotations.as_ref()?.get(k).cloned()
        }

        /// Adds a pod.
        pub(crate) fn add_pod(&self, p: Pod) {
            self.state().pods.push(p);
        }

        /// An annotation of pod `ns/name`.
        pub(crate) fn pod_annotation(&self, ns: &str, name: &str, k: &str) -> Option<String> {
            let st = self.state();
            let p = st.pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })?;
            p.metadata.annotations.as_ref()?.get(k).cloned()
        }
    }

    impl NodeKube for FakeKube {
        fn node_name(&self) -> &str {
            &self.name
        }

        async fn node(&self) -> Result<Node, KubeError> {
            Ok(self.state().node.clone())
        }

        async fn patch_node_annotations(
            &self,
            annotations: &BTreeMap<String, Option<String>>,
            resource_version: Option<&str>,
        ) -> Result<Node, KubeError> {
            let mut st = self.state();
            let current = st.version.to_string();
            if resource_version.is_some_and(|rv| rv != current) {
                return Err(api_error(format!("patch node {}", self.name), 409));
            }
            for (k, v) in annotations {
                merge(&mut st.node.metadata.annotations, k, v.as_ref());
            }
            st.version += 1;
            st.node.metadata.resource_version = Some(st.version.to_string());
            Ok(st.node.clone())
        }

        async fn pods_on_node(&self) -> Result<Vec<Pod>, KubeError> {
            let st = self.state();
            Ok(st
                .pods
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.name.as_str())
                })
                .cloned()
                .collect())
        }

        async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, KubeError> {
            let st = self.state();
            Ok(st
                .pods
                .iter()
                .find(|p| {
                    p.metadata.namespace.as_deref() == Some(namespace)
                        && p.metadata.name.as_deref() == Some(name)
                })
                .cloned())
        }

        async fn patch_pod_annotations(
            &self,
            namespace: &str,
            name: &str,
            annotations: &BTreeMap<String, String>,
        ) -> Result<Pod, KubeError> {
            let mut st = self.state();
            let Some(p) = st.pods.iter_mut().find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            }) else {
                return Err(api_error(format!("patch pod {namespace}/{name}"), 404));
            };
            for (k, v) in annotations {
                merge(&mut p.metadata.annotations, k, Some(v));
            }
            Ok(p.clone())
        }

        async fn pod_event(
            &self,
            _pod: &Pod,
            _event_type: &str,
            _reason: &str,
            _message: &str,
        ) -> Result<Event, KubeError> {
            Ok(Event::default())
        }
    }
}
