//! The resources the emulator serves, each typed by its `k8s-openapi`
//! struct: every object that enters the store is decoded into that type
//! (wrong types fail), re-encoded, and compared with what was sent, so a
//! field the type does not know is refused the way `fieldValidation=Strict`
//! refuses it. The table also says which field selectors each resource has
//! and what the API server's strategy does on create and update (pod status
//! reset, status kept by main-resource writes, pod spec immutability).

use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::Value;

/// Typed round trip of one object: what its type keeps, and the unknown paths.
pub type Normalizer = fn(&Value) -> Result<(Value, Vec<String>), String>;

/// One served resource.
pub struct ResourceDef {
    /// API group (`""` for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// URL plural.
    pub plural: &'static str,
    /// `kind` of one object.
    pub kind: &'static str,
    /// `kind` of the list.
    pub list_kind: &'static str,
    /// Namespaced?
    pub namespaced: bool,
    /// Has a `/status` subresource (status kept by main-resource writes).
    pub has_status: bool,
    /// Field selector paths beyond `metadata.name`/`metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Typed round trip: the object as its type keeps it, and the paths
    /// the type does not know.
    pub normalize: Normalizer,
}

impl ResourceDef {
    /// `apiVersion` of its objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Store key prefix.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }
}

/// Decodes `v` as `K` (a wrong type is an error) and re-encodes it; returns
/// the re-encoded value and the paths the type dropped (unknown fields).
pub(crate) fn strict<K>(v: &Value) -> Result<(Value, Vec<String>), String>
where
    K: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: K = serde_json::from_value(v.clone()).map_err(|e| format!("{e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("{e}"))?;
    let mut unknown = Vec::new();
    unknown_fields(v, &back, String::new(), &mut unknown);
    Ok((back, unknown))
}

/// The API server's message for unknown fields under `fieldValidation=Strict`.
pub fn strict_error(unknown: &[String]) -> String {
    let list: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    format!("strict decoding error: {}", list.join(", "))
}

/// Paths present (and non-empty) in `sent` but missing from `kept`.
fn unknown_fields(sent: &Value, kept: &Value, path: String, out: &mut Vec<String>) {
    match (sent, kept) {
        (Value::Object(s), Value::Object(k)) => {
            for (key, sv) in s {
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(kv) => unknown_fields(sv, kv, p, out),
                    // A null, an empty list or an empty map decodes to an
                    // absent optional field: nothing was lost.
                    None if is_empty(sv) => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(s), Value::Array(k)) => {
            for (i, (sv, kv)) in s.iter().zip(k).enumerate() {
                unknown_fields(sv, kv, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Reads a dotted field path (`spec.nodeName`) as the API server's field
/// sets render it: strings as-is, booleans and numbers as text, missing as "".
pub fn field(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// Every resource served.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        list_kind: "PodList",
        namespaced: true,
        has_status: true,
        fields: &[
            "spec.nodeName",
            "spec.schedulerName",
            "spec.restartPolicy",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        normalize: strict::<Pod>,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        list_kind: "NodeList",
        namespaced: false,
        has_status: true,
        fields: &["spec.unschedulable"],
        normalize: strict::<Node>,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        list_kind: "EventList",
        namespaced: true,
        has_status: false,
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        normalize: strict::<Event>,
    },
    ResourceDef {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        list_kind: "EventList",
        namespaced: true,
        has_status: false,
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        normalize: strict::<k8s_openapi::api::events::v1::Event>,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        list_kind: "ConfigMapList",
        namespaced: true,
        has_status: false,
        fields: &[],
        normalize: strict::<ConfigMap>,
    },
    ResourceDef {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        kind: "ResourceSlice",
        list_kind: "ResourceSliceList",
        namespaced: false,
        has_status: false,
        fields: &["spec.nodeName", "spec.driver"],
        normalize: strict::<ResourceSlice>,
    },
    ResourceDef {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        kind: "ResourceClaim",
        list_kind: "ResourceClaimList",
        namespaced: true,
        has_status: true,
        fields: &[],
        normalize: strict::<ResourceClaim>,
    },
    ResourceDef {
        group: "resource.k8s.io",
        version: "v1",
        plural: "deviceclasses",
        kind: "DeviceClass",
        list_kind: "DeviceClassList",
        namespaced: false,
        has_status: false,
        fields: &[],
        normalize: strict::<DeviceClass>,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        list_kind: "NamespaceList",
        namespaced: false,
        has_status: true,
        fields: &["status.phase"],
        normalize: strict::<Namespace>,
    },
];

/// The resource at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// What the pod update validation allows to change in `spec`
/// (`k8s.io/kubernetes/pkg/apis/core/validation` ValidatePodUpdate): the
/// images, activeDeadlineSeconds, terminationGracePeriodSeconds and
/// tolerations. Returns the spec with those fields cleared.
fn mutable_pod_spec_cleared(spec: &Value) -> Value {
    let mut s = spec.clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("activeDeadlineSeconds");
        o.remove("terminationGracePeriodSeconds");
        o.remove("tolerations");
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            if let Some(Value::Array(cs)) = o.get_mut(list) {
                for c in cs {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("image");
                    }
                }
            }
        }
    }
    s
}

/// Refuses a pod update that changes an immutable part of the spec.
pub fn check_pod_update(old: &Value, new: &Value) -> Result<(), String> {
    let (o, n) = (
        old.get("spec").cloned().unwrap_or(Value::Null),
        new.get("spec").cloned().unwrap_or(Value::Null),
    );
    if mutable_pod_spec_cleared(&o) != mutable_pod_spec_cleared(&n) {
        return Err(
            "Pod \"spec\": Forbidden: pod updates may not change fields other than \
                    `spec.containers[*].image`, `spec.initContainers[*].image`, \
                    `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing \
                    tolerations) or `spec.terminationGracePeriodSeconds`; bind with the \
                    pods/binding subresource"
                .to_owned(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_refuses_unknown_and_wrong_types() {
        let ok = json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","env":[]}]}});
        assert!(strict::<Pod>(&ok).unwrap().1.is_empty());
        let unknown = json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","gpu":1}],"nodename":"x"}});
        let (_, u) = strict::<Pod>(&unknown).unwrap();
        assert_eq!(
            u,
            vec![
                "spec.containers[0].gpu".to_string(),
                "spec.nodename".to_string()
            ]
        );
        assert!(strict_error(&u).starts_with("strict decoding error: unknown field"));
        let wrong = json!({"metadata":{"name":"a"},"spec":{"containers":"c"}});
        assert!(strict::<Pod>(&wrong).is_err());
    }

    #[test]
    fn field_paths() {
        let v = json!({"spec":{"nodeName":"n","unschedulable":true}});
        assert_eq!(field(&v, "spec.nodeName"), "n");
        assert_eq!(field(&v, "spec.unschedulable"), "true");
        assert_eq!(field(&v, "status.phase"), "");
    }
}
