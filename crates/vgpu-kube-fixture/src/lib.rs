//! A Kubernetes API-server emulator for tests (never shipped): HTTP/1.1 on
//! an ephemeral `127.0.0.1` port, good enough for a `kube::Client` pointed
//! at it. Objects are typed by `k8s-openapi` (Kubernetes 1.34): whatever
//! enters the store is decoded into its type and unknown fields are refused
//! (`fieldValidation=Strict` by default), so hand-waved JSON fails here the
//! way it would be silently dropped by a real server.
//!
//! Served: pods (with `status` and `binding` subresources), nodes (with
//! `status`), core and `events.k8s.io/v1` events, configmaps, namespaces,
//! `resource.k8s.io/v1` resourceslices, resourceclaims (+status), deviceclasses;
//! get, list, watch (from a resourceVersion, or the current objects first;
//! 410 once compacted; no bookmarks), create, replace, delete (immediate,
//! with preconditions), merge patch and JSON patch (strategic merge and
//! server-side apply are refused with 415), 409 on a stale
//! `metadata.resourceVersion` in a replace or patch, label selectors
//! (equality and set-based) and the field selectors the API server has for
//! each resource (`spec.nodeName`, `status.phase`, `involvedObject.name`,
//! ...). Pod writes follow the pod strategy: status reset on create, kept by
//! main-resource writes, spec immutable except images (bind through
//! `pods/<name>/binding`). Pods are defaulted on create as the API server
//! defaults them before admission ([`default_pod`]: `spec.schedulerName`
//! becomes `default-scheduler`); there is no admission chain, so a test
//! that plays the API server calls [`default_pod`] before the webhook.
//! Namespaces need not exist.
//!
//! ```no_run
//! # async fn t() {
//! let fx = vgpu_kube_fixture::ApiFixture::start();
//! let client = fx.client(); // inside a tokio runtime
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, "default");
//! # }
//! ```
//!
//! Tests can also reach the store directly ([`ApiFixture::create`],
//! [`ApiFixture::get`], [`ApiFixture::requests`], [`ApiFixture::fail_next`]).

mod resources;
pub mod selectors;
mod server;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use store::{ApiError, Fault, FieldValidation, RequestRecord};

/// The API server's defaulting of a Pod that matters to vgpu, applied at
/// decode time, before any mutating webhook sees the pod: an empty or
/// missing `spec.schedulerName` becomes `default-scheduler`
/// (`SetDefaults_PodSpec`). A webhook therefore never sees it empty.
pub fn default_pod(pod: &mut serde_json::Value) {
    let Some(spec) = pod.get_mut("spec").and_then(|s| s.as_object_mut()) else {
        return;
    };
    let empty = spec
        .get("schedulerName")
        .is_none_or(|n| n.is_null() || n.as_str() == Some(""));
    if empty {
        spec.insert(
            "schedulerName".into(),
            serde_json::Value::String("default-scheduler".into()),
        );
    }
}

use store::Store;

/// A running emulator; stops on drop.
pub struct ApiFixture {
    addr: SocketAddr,
    state: Arc<Mutex<Store>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn def_of<K: k8s_openapi::Resource>() -> &'static resources::ResourceDef {
    resources::find(K::GROUP, K::VERSION, K::URL_PATH_SEGMENT)
        .unwrap_or_else(|| panic!("vgpu-kube-fixture does not serve {}", K::URL_PATH_SEGMENT))
}

impl ApiFixture {
    /// Starts on `127.0.0.1:0`, on its own thread and tokio runtime (so it
    /// serves sync and async tests alike). Panics if it cannot bind.
    pub fn start() -> ApiFixture {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        std_listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = std_listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(Store::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("kube-fixture".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fixture runtime");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
                    loop {
                        let conn = tokio::select! {
                            c = listener.accept() => c,
                            _ = &mut stopped => break,
                        };
                        let Ok((sock, _)) = conn else { continue };
                        let st = st.clone();
                        tokio::spawn(async move {
                            let svc = hyper::service::service_fn(move |req| {
                                server::serve(st.clone(), req)
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(sock), svc)
                                .await;
                        });
                    }
                });
            })
            .expect("spawn fixture thread");
        ApiFixture {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `kube::Client` for this server. Must be called inside a tokio
    /// runtime (kube's client spawns its buffer worker there).
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().expect("fixture URL");
        let mut cfg = kube::Config::new(url);
        cfg.default_namespace = "default".into();
        kube::Client::try_from(cfg).expect("kube client for the fixture")
    }

    /// A kubeconfig naming this server (for programs under test that read
    /// `KUBECONFIG`).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fixture\n  cluster:\n    server: {}\ncontexts:\n- name: fixture\n  context:\n    cluster: fixture\n    user: fixture\n    namespace: default\ncurrent-context: fixture\nusers:\n- name: fixture\n  user: {{}}\n",
            self.url()
        )
    }

    /// Writes [`ApiFixture::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates `obj` as a POST would (same validation); returns it as stored.
    pub fn create<K>(&self, obj: &K) -> Result<K, ApiError>
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + Serialize
            + DeserializeOwned,
    {
        let def = def_of::<K>();
        let ns = obj.metadata().namespace.clone().unwrap_or_else(|| {
            if def.namespaced {
                "default".into()
            } else {
                String::new()
            }
        });
        let v = serde_json::to_value(obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let out = self.store().create(def, &ns, v, FieldValidation::Strict)?;
        serde_json::from_value(out).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Writes the status of an existing object, as `PUT .../status` would
    /// (the object's resourceVersion is taken as current).
    pub fn set_status<K>(
        &self,
        namespace: &str,
        name: &str,
        status: serde_json::Value,
    ) -> Result<K, ApiError>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let def = def_of::<K>();
        let mut st = self.store();
        let patch = serde_json::json!({ "status": status }).to_string();
        let out = st.patch(
            def,
            namespace,
            name,
            store::PatchType::Merge,
            patch.as_bytes(),
            store::WriteOpts::status(FieldValidation::Strict),
        )?;
        serde_json::from_value(out).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Applies a merge patch to an object's main resource (as `PATCH` with
    /// `application/merge-patch+json`).
    pub fn merge_patch<K>(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K, ApiError>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let def = def_of::<K>();
        let out = self.store().patch(
            def,
            namespace,
            name,
            store::PatchType::Merge,
            patch.to_string().as_bytes(),
            store::WriteOpts::main(FieldValidation::Strict),
        )?;
        serde_json::from_value(out).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// One object (`namespace` ignored for cluster-scoped kinds).
    pub fn get<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let def = def_of::<K>();
        let ns = if def.namespaced { namespace } else { "" };
        let v = self.store().get(def, ns, name).ok()?;
        serde_json::from_value(v).ok()
    }

    /// Every object of a kind, all namespaces.
    pub fn list<K>(&self) -> Vec<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let def = def_of::<K>();
        self.store()
            .list(def, None, &Default::default(), &Default::default())
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Deletes an object; false when it did not exist.
    pub fn delete<K>(&self, namespace: &str, name: &str) -> bool
    where
        K: k8s_openapi::Resource,
    {
        let def = def_of::<K>();
        let ns = if def.namespaced { namespace } else { "" };
        self.store().delete(def, ns, name, None).is_ok()
    }

    /// Every request served so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.store().requests.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.store().requests.clear();
    }

    /// The next `times` requests with `method` (any if `None`) whose path
    /// contains `path_contains` are answered `code` (a `metav1.Status`).
    pub fn fail_next(&self, method: Option<&str>, path_contains: &str, code: u16, times: usize) {
        self.store().faults.push(Fault {
            method: method.map(str::to_owned),
            path_contains: path_contains.to_owned(),
            code,
            remaining: times,
        });
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    /// Plays an API server with the `DRAConsumableCapacity` feature gate off
    /// (`false`) or on (the default): while off, ResourceSlice writes lose
    /// `allowMultipleAllocations` and every capacity's `requestPolicy`
    /// without an error.
    pub fn set_consumable_capacity(&self, on: bool) {
        self.store().consumable_capacity_off = !on;
    }

    /// Drops the change history: a watch from an older resourceVersion gets
    /// 410 Gone.
    pub fn compact(&self) {
        self.store().compact();
    }
}

impl Drop for ApiFixture {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decodes `v` as `K` the way the emulator admits objects: a wrong type or
/// a field `K` does not know is an error (`strict decoding error: unknown
/// field "spec.x"`); returns the object as `K` re-encodes it (for tests
/// that validate manifests against the real API types).
pub fn normalize_strict<K>(v: &serde_json::Value) -> Result<serde_json::Value, String>
where
    K: DeserializeOwned + Serialize,
{
    let (kept, unknown) = resources::strict::<K>(v)?;
    if unknown.is_empty() {
        Ok(kept)
    } else {
        Err(resources::strict_error(&unknown))
    }
}
