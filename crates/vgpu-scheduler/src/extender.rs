//! The scheduler-extender wire types, exactly as kube-scheduler's
//! `k8s.io/kube-scheduler/extender/v1` structs travel as JSON.
//!
//! Those Go structs carry no `json` tags, so Go's encoder writes the field
//! names as declared (`Pod`, `NodeNames`, `FailedNodes`, ...) and a nil
//! pointer or map as `null`; Go's decoder matches names case-insensitively.
//! We write the exact Go spelling and accept it plus the lower-case and
//! camel-case spellings other clients use. Owns no behaviour: only shapes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::List;
use serde::{Deserialize, Serialize};

/// Highest score an extender may give a node (`MaxExtenderPriority`);
/// kube-scheduler multiplies it by the extender's `weight` and by
/// `MaxNodeScore / MaxExtenderPriority` (100 / 10).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the body of `filter` and `prioritize` calls. With
/// `nodeCacheCapable: true` kube-scheduler sends `NodeNames` only; without
/// it, whole `Nodes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<List<Node>>,
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// `FailedNodesMap`: node name to the reason it was refused. Ordered, so
/// responses (and the tests reading them) are deterministic.
pub type FailedNodesMap = BTreeMap<String, String>;

/// `ExtenderFilterResult`: the nodes that fit, and why the others do not.
/// Nodes in `failed_and_unresolvable_nodes` are ones preemption cannot
/// help (no GPU of that kind at all); kube-scheduler skips them when it
/// looks for victims.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<List<Node>>,
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
    #[serde(
        rename = "FailedNodes",
        alias = "failedNodes",
        alias = "failednodes",
        default
    )]
    pub failed_nodes: Option<FailedNodesMap>,
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        alias = "failedandunresolvablenodes",
        default
    )]
    pub failed_and_unresolvable_nodes: Option<FailedNodesMap>,
    #[serde(rename = "Error", alias = "error", default)]
    pub error: String,
}

impl ExtenderFilterResult {
    /// A whole-request failure: kube-scheduler reports `error` and retries.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            error: message.into(),
            ..Self::default()
        }
    }
}

/// `HostPriority`: one node's score, 0..=[`MAX_EXTENDER_PRIORITY`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostPriority {
    #[serde(rename = "Host", alias = "host")]
    pub host: String,
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// `HostPriorityList`: the body of a `prioritize` answer (a bare array).
pub type HostPriorityList = Vec<HostPriority>;

/// `ExtenderBindingArgs`: the body of a `bind` call.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName", alias = "podName", alias = "podname")]
    pub pod_name: String,
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        alias = "podnamespace"
    )]
    pub pod_namespace: String,
    #[serde(
        rename = "PodUID",
        alias = "podUID",
        alias = "podUid",
        alias = "poduid"
    )]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// `ExtenderBindingResult`: empty `error` means bound.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExtenderBindingResult {
    #[serde(rename = "Error", alias = "error", default)]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A filter call as kube-scheduler's `HTTPExtender.send` writes it
    /// with `nodeCacheCapable: true`: `json.Marshal(&ExtenderArgs{Pod:
    /// pod, NodeNames: &names})`, the pod as the informer holds it (empty
    /// TypeMeta omitted, zero timestamps as `null`, quantities canonical).
    const FILTER_NODE_NAMES: &str = r#"{"Pod":{"metadata":{"name":"train-0","namespace":"ml","uid":"7d1c0c7e-3b1f-4a59-9a55-0c6f1c1f2b10","resourceVersion":"4711","creationTimestamp":null,"labels":{"app":"train"},"annotations":{"nvidia.com/use-gputype":"A100"}},"spec":{"containers":[{"name":"main","image":"pytorch:2","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3k","nvidia.com/gpucores":"30"}}}],"schedulerName":"hami-scheduler"},"status":{"phase":"Pending","qosClass":"BestEffort"}},"Nodes":null,"NodeNames":["gpu-a","gpu-b"]}"#;

    #[test]
    fn reads_node_cache_capable_filter_args() {
        let args: ExtenderArgs = serde_json::from_str(FILTER_NODE_NAMES).unwrap();
        let pod = args.pod.unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("train-0"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("4711"));
        let limits = pod.spec.unwrap().containers[0]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap();
        assert_eq!(limits["nvidia.com/gpumem"].0, "3k");
        assert!(args.nodes.is_none());
        assert_eq!(args.node_names.unwrap(), ["gpu-a", "gpu-b"]);
    }

    #[test]
    fn reads_full_node_list_filter_args() {
        // nodeCacheCapable: false: `Nodes` is a v1.NodeList whose empty
        // TypeMeta Go omits; `NodeNames` is a nil pointer.
        let body = json!({
            "Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}},
            "Nodes": {"metadata": {}, "items": [
                {"metadata": {"name": "gpu-a", "annotations": {"hami.io/node-nvidia-register": "[]"}},
                 "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "10"}}}
            ]},
            "NodeNames": null
        });
        let args: ExtenderArgs = serde_json::from_value(body).unwrap();
        let nodes = args.nodes.unwrap();
        assert_eq!(nodes.items.len(), 1);
        assert_eq!(nodes.items[0].metadata.name.as_deref(), Some("gpu-a"));
        assert!(args.node_names.is_none());
    }

    #[test]
    fn accepts_lower_case_names_like_gos_decoder() {
        let args: ExtenderArgs =
            serde_json::from_value(json!({"pod": null, "nodenames": ["x"]})).unwrap();
        assert!(args.pod.is_none());
        assert_eq!(args.node_names.unwrap(), ["x"]);
        let bind: ExtenderBindingArgs = serde_json::from_value(
            json!({"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"}),
        )
        .unwrap();
        assert_eq!(bind.pod_uid, "u");
    }

    #[test]
    fn writes_filter_result_with_gos_field_names() {
        let mut failed = FailedNodesMap::new();
        failed.insert("gpu-b".into(), "insufficient memory".into());
        let result = ExtenderFilterResult {
            node_names: Some(vec!["gpu-a".into()]),
            failed_nodes: Some(failed),
            ..Default::default()
        };
        // What Go's json.Marshal writes for the same struct value.
        let want: Value = serde_json::from_str(
            r#"{"Nodes":null,"NodeNames":["gpu-a"],"FailedNodes":{"gpu-b":"insufficient memory"},"FailedAndUnresolvableNodes":null,"Error":""}"#,
        )
        .unwrap();
        assert_eq!(serde_json::to_value(&result).unwrap(), want);
        let back: ExtenderFilterResult = serde_json::from_value(want).unwrap();
        assert_eq!(back, result);
    }

    #[test]
    fn writes_priorities_and_binding_as_go_does() {
        let list: HostPriorityList = vec![HostPriority {
            host: "gpu-a".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"[{"Host":"gpu-a","Score":7}]"#
        );
        // kube-scheduler's Bind: json.Marshal(&ExtenderBindingArgs{...}).
        let args: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"train-0","PodNamespace":"ml","PodUID":"7d1c0c7e-3b1f-4a59-9a55-0c6f1c1f2b10","Node":"gpu-a"}"#,
        )
        .unwrap();
        assert_eq!(args.node, "gpu-a");
        assert_eq!(args.pod_namespace, "ml");
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult::default()).unwrap(),
            r#"{"Error":""}"#
        );
        // Go's decoder reads `{"Error":""}` and `{}` alike.
        let empty: ExtenderBindingResult = serde_json::from_str("{}").unwrap();
        assert!(empty.error.is_empty());
    }
}
