//! The emulator's state: objects by resource/namespace/name as the typed
//! JSON their `k8s-openapi` type keeps, one global resourceVersion counter
//! (etcd's revision), a bounded history of changes for watches, a request
//! log and injected faults. Every write goes through the same rules as the
//! API server's generic registry: optimistic concurrency on
//! `metadata.resourceVersion` (409 on a stale one), immutable identity
//! fields, status kept by main-resource writes and written only through
//! `/status`, strict field validation. Never touches the network.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};

/// An error the API server would answer, as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub code: u16,
    /// `Status.reason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
}

impl ApiError {
    /// A new error.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(m: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", m)
    }

    pub(crate) fn invalid(m: impl Into<String>) -> ApiError {
        ApiError::new(422, "Invalid", m)
    }

    fn not_found(def: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.plural),
        )
    }

    fn conflict(def: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                def.plural
            ),
        )
    }

    /// The `metav1.Status` body.
    pub fn status_json(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// Watch event types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl ChangeKind {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Clone, Debug)]
pub struct Change {
    /// Its resourceVersion.
    pub rv: u64,
    /// [`ResourceDef::key`].
    pub resource: String,
    /// Namespace (`""` for cluster-scoped).
    pub namespace: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after (for a delete: as deleted).
    pub object: Value,
    /// The object before (modifications).
    pub old: Option<Value>,
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Request `Content-Type`.
    pub content_type: String,
    /// Response status.
    pub status: u16,
    /// Request body (text).
    pub body: String,
}

/// A fault to inject: the next `times` requests matching `method` (any
/// when `None`) and containing `path_contains` get `code` instead.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Method to match.
    pub method: Option<String>,
    /// Substring of the path.
    pub path_contains: String,
    /// Status to answer.
    pub code: u16,
    /// How many more times.
    pub remaining: usize,
}

/// How a write validates fields the type does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// Refuse (the emulator's default, stricter than the real server's `Warn`
    /// so a test object with a misspelt field fails loudly).
    Strict,
    /// Drop them with a warning.
    Warn,
    /// Drop them.
    Ignore,
}

/// Patch flavours by `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
}

/// How a replace or patch writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOpts {
    /// A `/status` write (only status changes) rather than the main resource.
    pub status_only: bool,
    /// Unknown-field handling.
    pub validation: FieldValidation,
}

impl WriteOpts {
    /// Main-resource write.
    pub fn main(validation: FieldValidation) -> WriteOpts {
        WriteOpts {
            status_only: false,
            validation,
        }
    }

    /// `/status` write.
    pub fn status(validation: FieldValidation) -> WriteOpts {
        WriteOpts {
            status_only: true,
            validation,
        }
    }
}

const HISTORY: usize = 100_000;

/// The whole state.
pub struct Store {
    rv: u64,
    uids: u64,
    objects: BTreeMap<String, Value>,
    history: VecDeque<Arc<Change>>,
    /// Changes with `rv > compacted` are all in `history`.
    compacted: u64,
    tx: broadcast::Sender<Arc<Change>>,
    pub(crate) requests: Vec<RequestRecord>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) warnings: Vec<String>,
    /// The `DRAConsumableCapacity` feature gate is off: ResourceSlice writes
    /// lose `allowMultipleAllocations` and every capacity's
    /// `requestPolicy`, silently, as the API server's field dropping does.
    pub(crate) consumable_capacity_off: bool,
}

/// What the API server drops from a ResourceSlice with the
/// `DRAConsumableCapacity` gate off.
fn drop_consumable_capacity(slice: &mut Value) {
    let Some(devices) = slice
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for d in devices.iter_mut().filter_map(Value::as_object_mut) {
        d.remove("allowMultipleAllocations");
        if let Some(caps) = d.get_mut("capacity").and_then(Value::as_object_mut) {
            for c in caps.values_mut().filter_map(Value::as_object_mut) {
                c.remove("requestPolicy");
            }
        }
    }
}

fn object_key(def: &ResourceDef, ns: &str, name: &str) -> String {
    format!("{}/{}/{}", def.key(), ns, name)
}

fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    meta(v).and_then(|m| m.get(k)).and_then(Value::as_str)
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

/// The labels of an object.
pub fn labels_of(v: &Value) -> BTreeMap<String, String> {
    meta(v)
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Does an object pass both selectors?
pub fn selected(v: &Value, labels: &LabelSelector, fields: &FieldSelector) -> bool {
    labels.matches(&labels_of(v)) && fields.matches(|path| resources::field(v, path))
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

impl Store {
    /// An empty store at resourceVersion 1.
    pub fn new() -> Store {
        let (tx, _) = broadcast::channel(4096);
        Store {
            rv: 1,
            uids: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 1,
            tx,
            requests: Vec::new(),
            faults: Vec::new(),
            warnings: Vec::new(),
            consumable_capacity_off: false,
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Forgets the history (watches from an older version get 410 Gone).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// A receiver of future changes, and the changes after `rv` already
    /// committed (`None` = compacted away: 410).
    pub fn subscribe_after(
        &self,
        rv: u64,
    ) -> (broadcast::Receiver<Arc<Change>>, Option<Vec<Arc<Change>>>) {
        let rx = self.tx.subscribe();
        if rv < self.compacted {
            return (rx, None);
        }
        let past = self.history.iter().filter(|c| c.rv > rv).cloned().collect();
        (rx, Some(past))
    }

    fn commit(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        kind: ChangeKind,
        object: Value,
        old: Option<Value>,
    ) {
        let c = Arc::new(Change {
            rv: self.rv,
            resource: def.key(),
            namespace: ns.to_owned(),
            kind,
            object,
            old,
        });
        if self.history.len() == HISTORY {
            if let Some(first) = self.history.pop_front() {
                self.compacted = first.rv;
            }
        }
        self.history.push_back(c.clone());
        // Nobody listening is fine.
        let _ = self.tx.send(c);
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    /// Typed validation: refuses wrong types; unknown fields per `fv`.
    fn normalize(
        &mut self,
        def: &ResourceDef,
        v: &Value,
        fv: FieldValidation,
    ) -> Result<Value, ApiError> {
        let (kept, unknown) = (def.normalize)(v).map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                def.kind, def.version, def.kind
            ))
        })?;
        let mut kept = kept;
        if self.consumable_capacity_off && def.plural == "resourceslices" {
            drop_consumable_capacity(&mut kept);
        }
        if !unknown.is_empty() {
            match fv {
                FieldValidation::Strict => {
                    return Err(ApiError::bad_request(resources::strict_error(&unknown)))
                }
                FieldValidation::Warn => self
                    .warnings
                    .extend(unknown.iter().map(|f| format!("unknown field \"{f}\""))),
                FieldValidation::Ignore => {}
            }
        }
        Ok(kept)
    }

    fn check_type_meta(def: &ResourceDef, v: &mut Value) -> Result<(), ApiError> {
        if !v.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        let api_version = def.api_version();
        match v.get("apiVersion").and_then(Value::as_str) {
            None => v["apiVersion"] = json!(api_version),
            Some(a) if a == api_version => {}
            Some(a) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({a}) does not match the expected API version ({api_version})"
                )))
            }
        }
        match v.get("kind").and_then(Value::as_str) {
            None => v["kind"] = json!(def.kind),
            Some(k) if k == def.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    def.kind
                )))
            }
        }
        Ok(())
    }

    fn check_namespace(def: &ResourceDef, ns: &str, v: &mut Value) -> Result<(), ApiError> {
        if def.namespaced {
            match meta_str(v, "namespace") {
                None | Some("") => {
                    meta_mut(v).insert("namespace".into(), json!(ns));
                }
                Some(n) if n == ns => {}
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
            }
        } else if meta_str(v, "namespace").is_some_and(|n| !n.is_empty()) {
            meta_mut(v).remove("namespace");
        }
        Ok(())
    }

    /// POST: creates an object.
    pub fn create(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        mut v: Value,
        fv: FieldValidation,
    ) -> Result<Value, ApiError> {
        Self::check_type_meta(def, &mut v)?;
        Self::check_namespace(def, ns, &mut v)?;
        if meta_str(&v, "resourceVersion").is_some_and(|r| !r.is_empty()) {
            return Err(ApiError::new(
                500,
                "InternalError",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = match meta_str(&v, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_owned(),
            None => match meta_str(&v, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => format!("{prefix}{:05x}", (self.rv * 2654435761) & 0xfffff),
                None => {
                    return Err(ApiError::invalid(format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        def.kind
                    )))
                }
            },
        };
        let key = object_key(def, ns, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", def.plural),
            ));
        }
        if def.kind == "Pod" && def.group.is_empty() {
            crate::default_pod(&mut v);
        }
        let mut v = self.normalize(def, &v, fv)?;
        match def.kind {
            // The pod strategy resets status on create (PrepareForCreate).
            "Pod" if def.group.is_empty() => v["status"] = json!({"phase": "Pending"}),
            "Namespace" => v["status"] = json!({"phase": "Active"}),
            _ => {}
        }
        self.rv += 1;
        let uid = self.next_uid();
        let m = meta_mut(&mut v);
        m.insert("name".into(), json!(name));
        m.insert("uid".into(), json!(uid));
        m.insert("resourceVersion".into(), json!(self.rv.to_string()));
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        self.objects.insert(key, v.clone());
        self.commit(def, ns, ChangeKind::Added, v.clone(), None);
        Ok(v)
    }

    /// GET one.
    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&object_key(def, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    /// GET a collection (`ns = None`: every namespace).
    pub fn list(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        let prefix = match ns {
            Some(ns) => format!("{}/{}/", def.key(), ns),
            None => format!("{}/", def.key()),
        };
        self.objects
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
            .filter(|v| selected(v, labels, fields))
            .cloned()
            .collect()
    }

    /// Puts `new` in place of `old` at `key` after the shared update rules;
    /// `status_only` = a `/status` write.
    fn write_update(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        old: Value,
        mut new: Value,
        opts: WriteOpts,
    ) -> Result<Value, ApiError> {
        let WriteOpts {
            status_only,
            validation: fv,
        } = opts;
        Self::check_type_meta(def, &mut new)?;
        Self::check_namespace(def, ns, &mut new)?;
        if meta_str(&new, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&new, "name").unwrap_or_default()
            )));
        }
        match meta_str(&new, "resourceVersion") {
            None | Some("") => {
                return Err(ApiError::invalid(format!(
                    "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    def.kind
                )))
            }
            Some(rv) if rv != self.rv_of(&old) => return Err(ApiError::conflict(def, name)),
            Some(_) => {}
        }
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty()) {
            if Some(uid) != meta_str(&old, "uid") {
                return Err(ApiError::conflict(def, name));
            }
        }
        let mut new = self.normalize(def, &new, fv)?;
        if status_only {
            let status = new.get("status").cloned().unwrap_or(Value::Null);
            new = old.clone();
            match status {
                Value::Null => {
                    new.as_object_mut().map(|o| o.remove("status"));
                }
                s => new["status"] = s,
            }
        } else {
            if def.has_status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().map(|o| o.remove("status"));
                    }
                }
            }
            if def.kind == "Pod" && def.group.is_empty() {
                resources::check_pod_update(&old, &new).map_err(ApiError::invalid)?;
            }
        }
        // Identity fields stay the server's.
        for k in ["uid", "creationTimestamp", "name"] {
            if let Some(v) = meta(&old).and_then(|m| m.get(k)).cloned() {
                meta_mut(&mut new).insert(k.into(), v);
            }
        }
        if new == old {
            // A no-op write keeps the resourceVersion (as the API server does).
            return Ok(old);
        }
        self.rv += 1;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.objects.insert(object_key(def, ns, name), new.clone());
        self.commit(def, ns, ChangeKind::Modified, new.clone(), Some(old));
        Ok(new)
    }

    fn rv_of<'a>(&self, v: &'a Value) -> &'a str {
        meta_str(v, "resourceVersion").unwrap_or("")
    }

    /// PUT (main resource or `/status`).
    pub fn replace(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        new: Value,
        opts: WriteOpts,
    ) -> Result<Value, ApiError> {
        let old = self.get(def, ns, name)?;
        self.write_update(def, ns, name, old, new, opts)
    }

    /// PATCH (main resource or `/status`). A patch that sets
    /// `metadata.resourceVersion` is a precondition: stale = 409.
    pub fn patch(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        kind: PatchType,
        patch: &[u8],
        opts: WriteOpts,
    ) -> Result<Value, ApiError> {
        let old = self.get(def, ns, name)?;
        let mut doc = old.clone();
        match kind {
            PatchType::Merge => {
                let p: Value = serde_json::from_slice(patch)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                json_patch::merge(&mut doc, &p);
            }
            PatchType::Json => {
                let p: json_patch::Patch = serde_json::from_slice(patch)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                json_patch::patch(&mut doc, &p).map_err(|e| {
                    ApiError::invalid(format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ))
                })?;
            }
        }
        if meta_str(&doc, "resourceVersion").is_none_or(str::is_empty) {
            // A patch that removed the version is unconditional.
            let rv = self.rv_of(&old).to_owned();
            meta_mut(&mut doc).insert("resourceVersion".into(), json!(rv));
        }
        self.write_update(def, ns, name, old, doc, opts)
    }

    /// DELETE, with optional `preconditions` (uid, resourceVersion).
    pub fn delete(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let key = object_key(def, ns, name);
        let old = self.get(def, ns, name)?;
        if let Some(pre) = opts.and_then(|o| o.get("preconditions")) {
            let want_uid = pre.get("uid").and_then(Value::as_str);
            let want_rv = pre.get("resourceVersion").and_then(Value::as_str);
            if want_uid.is_some_and(|u| Some(u) != meta_str(&old, "uid"))
                || want_rv.is_some_and(|r| r != self.rv_of(&old))
            {
                return Err(ApiError::conflict(def, name));
            }
        }
        self.objects.remove(&key);
        self.rv += 1;
        let mut gone = old.clone();
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.commit(def, ns, ChangeKind::Deleted, gone.clone(), Some(old));
        Ok(gone)
    }

    /// POST `pods/<name>/binding`: sets `spec.nodeName` once, copies the
    /// binding's annotations onto the pod, adds the `PodScheduled` condition.
    pub fn bind(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let binding: k8s_openapi::api::core::v1::Binding = serde_json::from_value(body.clone())
            .map_err(|e| ApiError::bad_request(format!("Binding cannot be handled: {e}")))?;
        if binding.target.name.as_deref().unwrap_or("").is_empty() {
            return Err(ApiError::invalid(
                "Binding is invalid: target.name: Required value",
            ));
        }
        if binding
            .target
            .kind
            .as_deref()
            .is_some_and(|k| !k.is_empty() && k != "Node")
        {
            return Err(ApiError::invalid(
                "Binding is invalid: target.kind: must be empty or Node",
            ));
        }
        if binding.metadata.name.as_deref().is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the binding's name does not match the pod",
            ));
        }
        let node = binding.target.name.unwrap_or_default();
        let old = self.get(def, ns, name)?;
        if let Some(uid) = binding.metadata.uid.as_deref() {
            if Some(uid) != meta_str(&old, "uid") {
                return Err(ApiError::conflict(def, name));
            }
        }
        let current = resources::field(&old, "spec.nodeName");
        if !current.is_empty() {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{current}\""),
            ));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(node);
        if let Some(a) = binding.metadata.annotations {
            let m = meta_mut(&mut new);
            if !m.get("annotations").is_some_and(Value::is_object) {
                m.insert("annotations".into(), json!({}));
            }
            let annos = m["annotations"]
                .as_object_mut()
                .expect("just made an object");
            for (k, v) in a {
                annos.insert(k, json!(v));
            }
        }
        if !new["status"].is_object() {
            new["status"] = json!({});
        }
        let conds = new["status"]
            .as_object_mut()
            .expect("just made an object")
            .entry("conditions")
            .or_insert_with(|| json!([]));
        if let Some(list) = conds.as_array_mut() {
            list.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            list.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}));
        }
        self.rv += 1;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.objects.insert(object_key(def, ns, name), new.clone());
        self.commit(def, ns, ChangeKind::Modified, new, Some(old));
        Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )
    }

    /// Takes a matching injected fault, if any.
    pub(crate) fn take_fault(&mut self, method: &str, path: &str) -> Option<u16> {
        let f = self.faults.iter_mut().find(|f| {
            f.remaining > 0
                && f.method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(method))
                && path.contains(&f.path_contains)
        })?;
        f.remaining -= 1;
        Some(f.code)
    }
}
