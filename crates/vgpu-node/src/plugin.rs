//! The kubelet device plugin (API v1beta1) on a Unix socket in the
//! kubelet's device-plugin directory: registration with the kubelet (and
//! again whenever the kubelet restarts: its socket is recreated and ours is
//! removed), ListAndWatch (each GPU as `deviceSplitCount` devices with
//! HAMi's IDs `<UUID>-<i>`, health changes streamed), GetPreferredAllocation
//! and Allocate as HAMi's plugin does them: the pod is the node lock's
//! holder, else the pending pod on this node with bind-phase
//! allocating/success and `hami.io/vgpu-node` = this node; its next
//! container entry of `hami.io/vgpu-devices-to-allocate` must match the
//! request; the container gets HAMi's env and mounts plus its read-only
//! limits file; the entry is consumed and, once the pod is fully served,
//! `bind-phase=success` and the lock released. Anything wrong — no pod, no
//! or a malformed or mismatched assignment, a GPU not on this node, a limits
//! file that cannot be written — is a clear gRPC error and `bind-phase=failed`
//! (lock released): never a half-limited container.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use vgpu_hami::{devices, keys, BindPhase, ContainerSlot, NodeLock, PodDevices};

use crate::allocate::{self, AllocSettings, Plan};
use crate::config::NodeConfig;
use crate::kube_api::{KubeApi, NodeKube};
use crate::layout;
use crate::nvml::GpuInfo;
use crate::proto::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::proto::v1beta1::registration_client::RegistrationClient;
use crate::proto::v1beta1::*;
use crate::proto::{HEALTHY, UNHEALTHY, VERSION};

/// One GPU as the kubelet and the scheduler see it: what ListAndWatch and
/// the node registration carry, and nothing that moves while the GPU is
/// busy (memory in use is the monitor's, read at scrape time). Equality of
/// these facts is what "the devices changed" means: a change re-sends
/// ListAndWatch and re-checks the registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Device name.
    pub name: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// NUMA node, when sysfs tells it.
    pub numa: Option<i64>,
}

impl DeviceFacts {
    /// The facts of `g` (reads its NUMA node from sysfs).
    pub fn of(g: &GpuInfo) -> DeviceFacts {
        DeviceFacts {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_total: g.memory_total,
            numa: crate::nvml::numa_node(&g.bus_id),
        }
    }
}

/// The GPUs and their health, as ListAndWatch advertises them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSet {
    /// GPUs in NVML order.
    pub gpus: Vec<DeviceFacts>,
    /// Health per GPU (same order).
    pub healthy: Vec<bool>,
}

impl DeviceSet {
    /// The set for what the driver listed, `healthy` per GPU.
    pub fn from_driver(gpus: &[GpuInfo], healthy: Vec<bool>) -> DeviceSet {
        DeviceSet {
            gpus: gpus.iter().map(DeviceFacts::of).collect(),
            healthy,
        }
    }

    /// The advertised devices. With `numa_topology` (HAMi's
    /// `enableNumaTopology`, off by default) each carries its GPU's NUMA node
    /// when it is known; otherwise, or when unknown, no topology at all: the
    /// kubelet's topology manager then treats it as fitting any node, where
    /// a made-up node would make it refuse or misplace pods.
    pub fn api_devices(&self, split: u32, numa_topology: bool) -> Vec<Device> {
        let mut out = Vec::new();
        for (g, ok) in self.gpus.iter().zip(&self.healthy) {
            let topology = g.numa.filter(|_| numa_topology).map(|id| TopologyInfo {
                nodes: vec![NumaNode { id }],
            });
            for i in 0..split {
                out.push(Device {
                    id: devices::replica_id(&g.uuid, i),
                    health: if *ok { HEALTHY } else { UNHEALTHY }.to_owned(),
                    topology: topology.clone(),
                });
            }
        }
        out
    }

    fn has_gpu(&self, uuid: &str) -> bool {
        self.gpus.iter().any(|g| g.uuid.eq_ignore_ascii_case(uuid))
    }
}

/// Counters for `/healthz` and tests.
#[derive(Default)]
pub struct PluginStats {
    /// Registered with the current kubelet.
    pub registered: AtomicBool,
    /// Successful registrations so far.
    pub registrations: AtomicU64,
    /// Allocate calls answered with devices.
    pub allocations: AtomicU64,
    /// Allocate calls refused.
    pub refusals: AtomicU64,
}

/// State shared by the gRPC service and the serving loop.
pub struct PluginCore<K = KubeApi> {
    cfg: Arc<NodeConfig>,
    alloc: AllocSettings,
    kube: K,
    devices: watch::Receiver<DeviceSet>,
    lock: tokio::sync::Mutex<()>,
    /// Bumped when a server stops: its ListAndWatch streams end.
    epoch: watch::Sender<u64>,
    /// Counters.
    pub stats: Arc<PluginStats>,
}

/// The tonic service.
#[derive(Clone)]
pub struct DevicePluginService<K = KubeApi>(pub Arc<PluginCore<K>>);

fn fmt_pod(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

fn anno<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

/// Why Allocate refused a pod (the message is the gRPC status message).
#[derive(Debug)]
struct Refusal {
    code: tonic::Code,
    message: String,
}

fn refuse(code: tonic::Code, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

impl<K: NodeKube> PluginCore<K> {
    /// A core over these sources.
    pub fn new(
        cfg: Arc<NodeConfig>,
        kube: K,
        devices: watch::Receiver<DeviceSet>,
        stats: Arc<PluginStats>,
    ) -> Arc<PluginCore<K>> {
        Arc::new(PluginCore {
            alloc: AllocSettings::from_config(&cfg),
            cfg,
            kube,
            devices,
            lock: tokio::sync::Mutex::new(()),
            epoch: watch::channel(0).0,
            stats,
        })
    }

    /// The pod whose devices are being handed out now (HAMi's
    /// `GetPendingPod`, chosen by [`choose_pending_pod`]): reads the node's
    /// lock, its holder, and the pods on the node unless the holder wins.
    pub async fn pending_pod(&self) -> Result<Pod, String> {
        let node = self.kube.node().await.map_err(|e| e.to_string())?;
        let lock = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::NODE_LOCK));
        let holder = match lock_holder(lock.map(String::as_str)) {
            // A holder that cannot be read is passed over, as HAMi does.
            Some((ns, name)) => self.kube.pod(&ns, &name).await.ok().flatten(),
            None => None,
        };
        let pods = if holder.as_ref().is_some_and(holder_wins) {
            Vec::new()
        } else {
            self.kube.pods_on_node().await.map_err(|e| e.to_string())?
        };
        choose_pending_pod(self.kube.node_name(), holder, pods)
    }

    async fn set_phase_and_release(&self, pod: &Pod, phase: BindPhase) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let a = BTreeMap::from([(keys::BIND_PHASE.to_owned(), phase.as_str().to_owned())]);
        if let Err(e) = self.kube.patch_pod_annotations(&ns, &name, &a).await {
            tracing::warn!("setting {}={phase} on {ns}/{name}: {e}", keys::BIND_PHASE);
        }
        match self.kube.release_node_lock(&ns, &name).await {
            Ok(released) => tracing::debug!(released, "node lock after {ns}/{name}"),
            Err(e) => tracing::warn!("releasing the node lock for {ns}/{name}: {e}"),
        }
    }

    fn container_of(pod: &Pod, index: usize) -> Option<&Container> {
        let spec = pod.spec.as_ref()?;
        let init = spec.init_containers.as_deref().unwrap_or(&[]);
        match PodDevices::slot_of(index, init.len(), spec.containers.len())? {
            ContainerSlot::Init(i) => init.get(i),
            ContainerSlot::App(i) => spec.containers.get(i),
        }
    }

    fn prepare_host(&self, plan: &Plan) -> Result<(), String> {
        let l = &self.cfg.layout;
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("preparing {what} for {}: {e}", plan.key)
        };
        layout::ensure_dir_all(&l.containers_dir(), 0o755)
            .map_err(|e| fail("the containers directory", &e))?;
        layout::ensure_dir_all(&l.limits_root(), 0o755)
            .map_err(|e| fail("the limits directory", &e))?;
        // Tenant processes of any uid create the region here.
        let region_dir = l.region_dir(&plan.key);
        layout::ensure_dir(&region_dir, 0o1777).map_err(|e| fail("the region directory", &e))?;
        // The region keeps its fixed name (a process that lost its env finds
        // it); a second Allocate for the container decides what it inherits.
        let live = crate::gc::LiveProcesses::scan(Path::new("/proc"));
        match crate::gc::prepare_region_dir(&region_dir, &live)
            .map_err(|e| fail("the region directory", &e))?
        {
            crate::gc::RegionReuse::Fresh => {}
            crate::gc::RegionReuse::Cleared(files) => {
                tracing::info!(key = %plan.key, ?files, "Allocate again for a container whose processes are gone: its old region is removed")
            }
            crate::gc::RegionReuse::KeptInUse => {
                tracing::warn!(key = %plan.key, "Allocate again for a container with live processes: their region is kept and keeps counting")
            }
        }
        layout::ensure_dir(&l.limits_dir(&plan.key), 0o755)
            .map_err(|e| fail("the limits directory", &e))?;
        vgpu_region::limits::write_limits_file_atomic(&l.limits_file(&plan.key), &plan.limits)
            .map_err(|e| fail("the limits file", &e))?;
        layout::ensure_dir_all(&self.alloc.lock_dir, 0o1777)
            .map_err(|e| fail("the lock directory", &e))?;
        // Each entry is a file mount target: it must exist (empty: a board
        // reader skips it until the container writes it).
        for entry in &plan.board_entries {
            if let Some(gpu) = entry.parent() {
                layout::ensure_dir_all(gpu, 0o755).map_err(|e| fail("a lending board", &e))?;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(entry)
                .map_err(|e| fail("a lending board entry", &e))?;
            // Its container's processes, whatever their uid, write it; no
            // other container has it mounted writable.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(entry, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| fail("a lending board entry", &e))?;
        }
        Ok(())
    }

    async fn serve_pod(
        &self,
        pod: &Pod,
        req: &AllocateRequest,
    ) -> Result<AllocateResponse, Refusal> {
        let who = fmt_pod(pod);
        let uid = pod
            .metadata
            .uid
            .clone()
            .ok_or_else(|| refuse(tonic::Code::Internal, format!("pod {who} has no UID")))?;
        let raw = anno(pod, keys::DEVICES_TO_ALLOCATE).ok_or_else(|| {
            refuse(
                tonic::Code::FailedPrecondition,
                format!("pod {who} has no {} annotation: it was not scheduled by a HAMi-compatible scheduler", keys::DEVICES_TO_ALLOCATE),
            )
        })?;
        let mut assigned = PodDevices::parse(raw).map_err(|e| {
            refuse(
                tonic::Code::InvalidArgument,
                format!(
                    "pod {who}: malformed {} {raw:?}: {e}",
                    keys::DEVICES_TO_ALLOCATE
                ),
            )
        })?;
        let set = self.devices.borrow().clone();
        let advertised: HashSet<String> = set
            .api_devices(self.cfg.split_count, self.cfg.numa_topology)
            .into_iter()
            .map(|d| d.id)
            .collect();
        let mut plans = Vec::new();
        for creq in &req.container_requests {
            let (index, devs) = assigned.pop_next().ok_or_else(|| {
                refuse(
                    tonic::Code::FailedPrecondition,
                    format!("pod {who}: no container has devices left in {} (kubelet asks for {} device(s))", keys::DEVICES_TO_ALLOCATE, creq.devices_ids.len()),
                )
            })?;
            let ctr = Self::container_of(pod, index).ok_or_else(|| {
                refuse(
                    tonic::Code::InvalidArgument,
                    format!(
                        "pod {who}: {} entry {index} names no container of the pod",
                        keys::DEVICES_TO_ALLOCATE
                    ),
                )
            })?;
            if devs.len() != creq.devices_ids.len() {
                return Err(refuse(
                    tonic::Code::InvalidArgument,
                    format!(
                        "pod {who}, container {}: device number not matched: the assignment has {} device(s), kubelet asks for {}",
                        ctr.name,
                        devs.len(),
                        creq.devices_ids.len()
                    ),
                ));
            }
            if let Some(d) = devs.iter().find(|d| !set.has_gpu(&d.uuid)) {
                return Err(refuse(
                    tonic::Code::InvalidArgument,
                    format!(
                        "pod {who}, container {}: assigned GPU {} is not on node {}",
                        ctr.name, d.uuid, self.cfg.node_name
                    ),
                ));
            }
            if let Some(id) = creq.devices_ids.iter().find(|id| !advertised.contains(*id)) {
                return Err(refuse(
                    tonic::Code::InvalidArgument,
                    format!(
                        "pod {who}, container {}: kubelet asks for unknown device {id}",
                        ctr.name
                    ),
                ));
            }
            let plan = allocate::plan(&self.alloc, &uid, ctr, &devs)
                .map_err(|e| refuse(tonic::Code::InvalidArgument, format!("pod {who}: {e}")))?;
            plans.push(plan);
        }
        for p in &plans {
            self.prepare_host(p)
                .map_err(|e| refuse(tonic::Code::Internal, format!("pod {who}: {e}")))?;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let remaining = assigned.encode().map_err(|e| {
            refuse(
                tonic::Code::Internal,
                format!("pod {who}: re-encoding the assignment: {e}"),
            )
        })?;
        let a = BTreeMap::from([(keys::DEVICES_TO_ALLOCATE.to_owned(), remaining)]);
        self.kube
            .patch_pod_annotations(&ns, &name, &a)
            .await
            .map_err(|e| {
                refuse(
                    tonic::Code::Unavailable,
                    format!("pod {who}: consuming the assignment: {e}"),
                )
            })?;
        if assigned.all_served() {
            self.set_phase_and_release(pod, BindPhase::Success).await;
        }
        Ok(AllocateResponse {
            container_responses: plans.iter().map(Plan::response).collect(),
        })
    }

    /// Allocate: see the module comment.
    pub async fn allocate(&self, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        let _one_at_a_time = self.lock.lock().await;
        let pod = match self.pending_pod().await {
            Ok(p) => p,
            Err(e) => {
                self.stats.refusals.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("Allocate refused: {e}");
                return Err(Status::failed_precondition(e));
            }
        };
        match self.serve_pod(&pod, &req).await {
            Ok(r) => {
                self.stats.allocations.fetch_add(1, Ordering::Relaxed);
                tracing::info!(pod = %fmt_pod(&pod), containers = r.container_responses.len(), "Allocate");
                Ok(r)
            }
            Err(Refusal { code, message }) => {
                self.stats.refusals.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("Allocate refused: {message}");
                self.set_phase_and_release(&pod, BindPhase::Failed).await;
                Err(Status::new(code, message))
            }
        }
    }

    /// GetPreferredAllocation as HAMi does it: for each request in order,
    /// the next container entry with devices; for each assigned GPU, an
    /// available replica of it (must-include first). Best effort: a request
    /// it cannot answer gets no preference.
    pub async fn preferred(&self, req: PreferredAllocationRequest) -> PreferredAllocationResponse {
        let assigned = match self.pending_pod().await {
            Ok(p) => anno(&p, keys::DEVICES_TO_ALLOCATE).and_then(|v| PodDevices::parse(v).ok()),
            Err(_) => None,
        };
        let entries: Vec<Vec<vgpu_hami::ContainerDevice>> = assigned
            .map(|a| a.containers.into_iter().filter(|c| !c.is_empty()).collect())
            .unwrap_or_default();
        let mut out = PreferredAllocationResponse::default();
        for (i, c) in req.container_requests.iter().enumerate() {
            let Some(want) = entries.get(i) else { continue };
            if let Some(ids) = pick(want, c) {
                out.container_responses
                    .push(ContainerPreferredAllocationResponse { device_i_ds: ids });
            }
        }
        out
    }
}

/// The (namespace, pod) a node lock value names, when it parses and names
/// one.
pub fn lock_holder(lock: Option<&str>) -> Option<(String, String)> {
    match NodeLock::parse(lock?) {
        Ok(NodeLock { owner: Some(o), .. }) => Some((o.namespace, o.pod)),
        _ => None,
    }
}

/// The lock holder is the pod being served while it has container entries
/// left, or an assignment nobody can parse (so Allocate refuses it with the
/// reason rather than serving another pod).
pub fn holder_wins(p: &Pod) -> bool {
    match anno(p, keys::DEVICES_TO_ALLOCATE).map(PodDevices::parse) {
        Some(Ok(d)) => !d.all_served(),
        Some(Err(_)) => true,
        None => false,
    }
}

/// HAMi's `GetPendingPod` as a decision: the lock `holder` when it wins
/// ([`holder_wins`]); else, of `pods`, those Pending with a `bind-time`,
/// bind-phase allocating or success, `vgpu-node` = `node_name` and entries
/// left (or an assignment that is missing or unparsable, for Allocate to
/// refuse), the oldest bind-time first, ties by namespace/name; none: why.
pub fn choose_pending_pod(
    node_name: &str,
    holder: Option<Pod>,
    pods: Vec<Pod>,
) -> Result<Pod, String> {
    if let Some(p) = holder.filter(holder_wins) {
        return Ok(p);
    }
    let mut cands: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .filter(|p| anno(p, keys::BIND_TIME).is_some())
        .filter(|p| {
            matches!(
                anno(p, keys::BIND_PHASE).and_then(|v| v.parse().ok()),
                Some(BindPhase::Allocating | BindPhase::Success)
            )
        })
        .filter(|p| anno(p, keys::ASSIGNED_NODE) == Some(node_name))
        .filter(|p| holder_wins(p) || anno(p, keys::DEVICES_TO_ALLOCATE).is_none())
        .collect();
    cands.sort_by_key(|p| {
        (
            anno(p, keys::BIND_TIME)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(i64::MAX),
            fmt_pod(p),
        )
    });
    cands
        .into_iter()
        .next()
        .ok_or_else(|| format!("no pod on node {node_name} is waiting for devices (no node lock holder, no pending pod with {} allocating and {} = {node_name})", keys::BIND_PHASE, keys::ASSIGNED_NODE))
}

fn pick(
    want: &[vgpu_hami::ContainerDevice],
    c: &ContainerPreferredAllocationRequest,
) -> Option<Vec<String>> {
    let size = usize::try_from(c.allocation_size).ok()?;
    if want.len() < size {
        return None;
    }
    let mut chosen: Vec<String> = c.must_include_device_i_ds.clone();
    let mut covered: Vec<String> = chosen
        .iter()
        .map(|id| devices::physical_id(id).to_owned())
        .collect();
    for d in &want[..size] {
        if let Some(pos) = covered.iter().position(|p| p.eq_ignore_ascii_case(&d.uuid)) {
            covered.remove(pos);
            continue;
        }
        let id = c.available_device_i_ds.iter().find(|id| {
            devices::physical_id(id).eq_ignore_ascii_case(&d.uuid) && !chosen.contains(id)
        })?;
        chosen.push(id.clone());
    }
    (chosen.len() == size).then_some(chosen)
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<K: NodeKube> DevicePlugin for DevicePluginService<K> {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        let mut rx = self.0.devices.clone();
        let split = self.0.cfg.split_count;
        let numa = self.0.cfg.numa_topology;
        let s = async_stream(move |tx| async move {
            let mut last: Option<Vec<Device>> = None;
            loop {
                let now = rx.borrow_and_update().api_devices(split, numa);
                if last.as_ref() != Some(&now) {
                    if tx
                        .send(Ok(ListAndWatchResponse {
                            devices: now.clone(),
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last = Some(now);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(s))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Ok(Response::new(self.0.preferred(r.into_inner()).await))
    }

    async fn allocate(
        &self,
        r: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        self.0.allocate(r.into_inner()).await.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A stream fed by a task through a channel.
fn async_stream<F, Fut>(f: F) -> DeviceStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<ListAndWatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|x| (x, rx))
    }))
}

/// Why the plugin could not serve.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Socket handling.
    #[error("{op} {path}: {source}")]
    Io {
        /// Step.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Something other than a socket is at the plugin socket path.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
}

fn inode(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| (m.dev(), m.ino()))
}

fn remove_stale_socket(p: &Path) -> Result<(), PluginError> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(p).map_err(|source| PluginError::Io {
                op: "remove stale socket",
                path: p.to_owned(),
                source,
            })
        }
        Ok(_) => Err(PluginError::NotASocket(p.to_owned())),
        Err(_) => Ok(()),
    }
}

/// A gRPC channel to a Unix socket.
pub async fn uds_channel(
    path: PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
}

async fn register(cfg: &NodeConfig) -> Result<(), String> {
    let ch = uds_channel(cfg.kubelet_socket())
        .await
        .map_err(|e| format!("connect {}: {e}", cfg.kubelet_socket().display()))?;
    let mut c = RegistrationClient::new(ch);
    c.register(RegisterRequest {
        version: VERSION.to_owned(),
        endpoint: cfg.socket_name.clone(),
        resource_name: cfg.resource_name.clone(),
        options: Some(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    })
    .await
    .map_err(|s| format!("kubelet refused the registration: {}", s.message()))?;
    Ok(())
}

/// Serves the plugin until `shutdown` turns true: (re)binds the socket,
/// registers, and starts over when the kubelet restarts.
pub async fn serve<K: NodeKube>(
    core: Arc<PluginCore<K>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    let cfg = core.cfg.clone();
    let sock = cfg.plugin_socket();
    let period = cfg.health_interval.max(Duration::from_millis(50));
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        remove_stale_socket(&sock)?;
        let listener = tokio::net::UnixListener::bind(&sock).map_err(|source| PluginError::Io {
            op: "bind",
            path: sock.clone(),
            source,
        })?;
        let ours = inode(&sock);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = DevicePluginServer::new(DevicePluginService(core.clone()));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        core.stats.registered.store(false, Ordering::SeqCst);
        let mut kubelet = None;
        let mut backoff = period;
        // Serve until our socket goes away (kubelet restart) or shutdown.
        let restart = loop {
            if inode(&sock) != ours || ours.is_none() {
                break true;
            }
            let k = inode(&cfg.kubelet_socket());
            if k.is_some() && k != kubelet {
                match register(&cfg).await {
                    Ok(()) => {
                        kubelet = k;
                        backoff = period;
                        core.stats.registered.store(true, Ordering::SeqCst);
                        core.stats.registrations.fetch_add(1, Ordering::SeqCst);
                        tracing::info!(resource = %cfg.resource_name, socket = %sock.display(), "registered with the kubelet");
                    }
                    Err(e) => {
                        core.stats.registered.store(false, Ordering::SeqCst);
                        tracing::warn!("{e}; retrying in {backoff:?}");
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            } else if k.is_none() {
                core.stats.registered.store(false, Ordering::SeqCst);
                kubelet = None;
            }
            tokio::select! {
                _ = tokio::time::sleep(if kubelet.is_some() { period } else { backoff }) => {}
                _ = shutdown.changed() => break false,
            }
            if *shutdown.borrow() {
                break false;
            }
        };
        let _ = stop_tx.send(());
        core.epoch.send_modify(|e| *e += 1);
        // Connections the kubelet keeps open must not hold the restart.
        let mut server = server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
        core.stats.registered.store(false, Ordering::SeqCst);
        if !restart {
            if inode(&sock) == ours {
                let _ = std::fs::remove_file(&sock);
            }
            return Ok(());
        }
        tracing::info!(
            "plugin socket {} went away (kubelet restart?): serving it again and re-registering",
            sock.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::fake::FakeKube;
    use serde_json::json;
    use vgpu_hami::ContainerDevice;

    const GPU: &str = "GPU-4617e643-f070-4b90-b715-30c57f977a9a";
    const NODE: &str = "node-a";

    fn assignment(entries: Vec<Vec<ContainerDevice>>) -> String {
        PodDevices {
            containers: entries,
        }
        .encode()
        .unwrap()
    }

    fn one_gpu() -> String {
        assignment(vec![vec![ContainerDevice::nvidia(GPU, 1000, 30)]])
    }

    /// Pod `ns/name` on `NODE`, phase `phase`, these annotations.
    fn pod(ns: &str, name: &str, phase: &str, annos: &[(&str, &str)]) -> Pod {
        let a: BTreeMap<&str, &str> = annos.iter().copied().collect();
        serde_json::from_value(json!({
            "metadata": {
                "namespace": ns,
                "name": name,
                "uid": format!("00000000-0000-4000-8000-{:012x}", name.len() * 7919 + ns.len()),
                "annotations": a,
            },
            "spec": { "nodeName": NODE, "containers": [{ "name": "main" }] },
            "status": { "phase": phase },
        }))
        .unwrap()
    }

    /// A pod the scheduler assigned to `NODE` at `bind_time`.
    fn assigned(ns: &str, name: &str, bind_time: &str, devices: Option<&str>) -> Pod {
        let mut a = vec![
            (keys::BIND_TIME, bind_time),
            (keys::BIND_PHASE, "allocating"),
            (keys::ASSIGNED_NODE, NODE),
        ];
        if let Some(d) = devices {
            a.push((keys::DEVICES_TO_ALLOCATE, d));
        }
        pod(ns, name, "Pending", &a)
    }

    fn name_of(r: Result<Pod, String>) -> Result<String, String> {
        r.map(|p| fmt_pod(&p))
    }

    #[test]
    fn the_lock_holder_wins_while_it_has_entries_or_an_unreadable_assignment() {
        let d = one_gpu();
        let older = assigned("a", "older", "100", Some(&d));
        let holder = pod("b", "holder", "Pending", &[(keys::DEVICES_TO_ALLOCATE, &d)]);
        assert_eq!(
            name_of(choose_pending_pod(NODE, Some(holder), vec![older.clone()])),
            Ok("b/holder".into())
        );
        assert!(PodDevices::parse("GPU-x,NVIDIA").is_err());
        let garbled = pod(
            "b",
            "holder",
            "Pending",
            &[(keys::DEVICES_TO_ALLOCATE, "GPU-x,NVIDIA")],
        );
        assert_eq!(
            name_of(choose_pending_pod(NODE, Some(garbled), vec![older.clone()])),
            Ok("b/holder".into())
        );
        // Fully served or never assigned: the holder is done, the rest choose.
        let served = assignment(vec![vec![]]);
        for a in [vec![(keys::DEVICES_TO_ALLOCATE, served.as_str())], vec![]] {
            let done = pod("b", "holder", "Pending", &a);
            assert_eq!(
                name_of(choose_pending_pod(NODE, Some(done), vec![older.clone()])),
                Ok("a/older".into())
            );
        }
    }

    #[test]
    fn candidates_are_pending_bound_allocating_here_and_not_served() {
        let d = one_gpu();
        let served = assignment(vec![vec![]]);
        let good = assigned("z", "good", "500", Some(&d));
        let mut running = assigned("a", "running", "1", Some(&d));
        running.status.as_mut().unwrap().phase = Some("Running".into());
        let no_bind_time = pod(
            "a",
            "no-bind-time",
            "Pending",
            &[
                (keys::BIND_PHASE, "allocating"),
                (keys::ASSIGNED_NODE, NODE),
                (keys::DEVICES_TO_ALLOCATE, &d),
            ],
        );
        let failed = pod(
            "a",
            "failed",
            "Pending",
            &[
                (keys::BIND_TIME, "1"),
                (keys::BIND_PHASE, "failed"),
                (keys::ASSIGNED_NODE, NODE),
                (keys::DEVICES_TO_ALLOCATE, &d),
            ],
        );
        let elsewhere = pod(
            "a",
            "elsewhere",
            "Pending",
            &[
                (keys::BIND_TIME, "1"),
                (keys::BIND_PHASE, "allocating"),
                (keys::ASSIGNED_NODE, "node-b"),
                (keys::DEVICES_TO_ALLOCATE, &d),
            ],
        );
        let done = assigned("a", "done", "1", Some(&served));
        let others = vec![running, no_bind_time, failed, elsewhere, done];
        let mut all = others.clone();
        all.push(good);
        assert_eq!(
            name_of(choose_pending_pod(NODE, None, all)),
            Ok("z/good".into())
        );
        // bind-phase success counts as allocating; a missing assignment is
        // chosen too (Allocate refuses it with the reason).
        let mut success = assigned("z", "success", "600", Some(&d));
        success
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::BIND_PHASE.into(), "success".into());
        assert_eq!(
            name_of(choose_pending_pod(NODE, None, vec![success])),
            Ok("z/success".into())
        );
        assert_eq!(
            name_of(choose_pending_pod(
                NODE,
                None,
                vec![assigned("z", "bare", "7", None)]
            )),
            Ok("z/bare".into())
        );
        let none = choose_pending_pod(NODE, None, others).unwrap_err();
        assert!(
            none.starts_with("no pod on node node-a is waiting for devices"),
            "{none}"
        );
    }

    #[test]
    fn the_oldest_bind_time_first_then_namespace_and_name() {
        let d = one_gpu();
        let pods = vec![
            assigned("b", "x", "200", Some(&d)),
            assigned("b", "a", "100", Some(&d)),
            assigned("a", "z", "100", Some(&d)),
            // An unreadable bind-time sorts last.
            assigned("0", "0", "soon", Some(&d)),
        ];
        assert_eq!(
            name_of(choose_pending_pod(NODE, None, pods.clone())),
            Ok("a/z".into())
        );
        assert_eq!(
            name_of(choose_pending_pod(NODE, None, pods[..2].to_vec())),
            Ok("b/a".into())
        );
        assert_eq!(
            name_of(choose_pending_pod(
                NODE,
                None,
                vec![pods[3].clone(), pods[0].clone()]
            )),
            Ok("b/x".into())
        );
    }

    #[test]
    fn the_lock_names_its_holder() {
        let v = NodeLock::new(jiff::Timestamp::now(), "ns", "p").to_string();
        assert_eq!(lock_holder(Some(&v)), Some(("ns".into(), "p".into())));
        assert_eq!(lock_holder(Some("not a lock")), None);
        assert_eq!(lock_holder(None), None);
    }

    struct Rig {
        _dir: tempfile::TempDir,
        cfg: Arc<NodeConfig>,
        core: Arc<PluginCore<FakeKube>>,
        _devices: watch::Sender<DeviceSet>,
    }

    /// A plugin over a fake cluster where `ns/p` holds the node lock with
    /// one container entry for `GPU`, and a scratch host directory.
    fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = NodeConfig::new(NODE);
        cfg.layout = crate::layout::Layout::new(dir.path());
        cfg.lock_dir = dir.path().join("lock");
        let cfg = Arc::new(cfg);
        let kube = FakeKube::new(NODE);
        let d = one_gpu();
        kube.add_pod(assigned("ns", "p", "100", Some(&d)));
        let lock = NodeLock::new(jiff::Timestamp::now(), "ns", "p").to_string();
        kube.set_node_annotation(keys::NODE_LOCK, Some(&lock));
        let set = DeviceSet {
            gpus: vec![DeviceFacts {
                index: 0,
                uuid: GPU.into(),
                name: "NVIDIA A100".into(),
                memory_total: 40 << 30,
                numa: None,
            }],
            healthy: vec![true],
        };
        let (tx, rx) = watch::channel(set);
        let core = PluginCore::new(cfg.clone(), kube, rx, Arc::new(PluginStats::default()));
        Rig {
            _dir: dir,
            cfg,
            core,
            _devices: tx,
        }
    }

    fn request(ids: &[String]) -> AllocateRequest {
        AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        }
    }

    #[tokio::test]
    async fn allocate_serves_the_holder_marks_success_and_releases_the_lock() {
        let r = rig();
        let core = &r.core;
        let resp = core.allocate(request(&[format!("{GPU}-0")])).await.unwrap();
        assert_eq!(resp.container_responses.len(), 1);
        let k = &core.kube;
        assert_eq!(
            k.pod_annotation("ns", "p", keys::BIND_PHASE).as_deref(),
            Some("success")
        );
        let left = k
            .pod_annotation("ns", "p", keys::DEVICES_TO_ALLOCATE)
            .unwrap();
        assert!(PodDevices::parse(&left).unwrap().all_served(), "{left}");
        assert_eq!(k.node_annotation(keys::NODE_LOCK), None);
        let uid = k
            .pod("ns", "p")
            .await
            .unwrap()
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let limits = r
            .cfg
            .layout
            .limits_file(&crate::layout::container_key(&uid, "main"));
        let text = std::fs::read_to_string(&limits).unwrap();
        assert!(text.contains(GPU), "{text}");
        assert_eq!(core.stats.allocations.load(Ordering::Relaxed), 1);
        // Served: the next Allocate finds nobody, and says so.
        let e = core
            .allocate(request(&[format!("{GPU}-1")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.message().contains("no pod on node node-a"),
            "{}",
            e.message()
        );
    }

    #[tokio::test]
    async fn a_refused_allocate_marks_failed_releases_the_lock_and_writes_nothing() {
        let r = rig();
        let core = &r.core;
        // Two devices asked for, one assigned.
        let e = core
            .allocate(request(&[format!("{GPU}-0"), format!("{GPU}-1")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("device number not matched"),
            "{}",
            e.message()
        );
        let k = &core.kube;
        assert_eq!(
            k.pod_annotation("ns", "p", keys::BIND_PHASE).as_deref(),
            Some("failed")
        );
        // The assignment is left as it was: nothing was consumed.
        assert_eq!(
            k.pod_annotation("ns", "p", keys::DEVICES_TO_ALLOCATE),
            Some(one_gpu())
        );
        assert_eq!(k.node_annotation(keys::NODE_LOCK), None);
        assert!(!r.cfg.layout.limits_root().exists());
        assert_eq!(core.stats.refusals.load(Ordering::Relaxed), 1);
        assert_eq!(core.stats.allocations.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn the_lock_is_released_only_for_its_holder_or_when_unreadable() {
        let k = FakeKube::new(NODE);
        let lock = NodeLock::new(jiff::Timestamp::now(), "ns", "other").to_string();
        k.set_node_annotation(keys::NODE_LOCK, Some(&lock));
        assert!(!k.release_node_lock("ns", "p").await.unwrap());
        assert_eq!(k.node_annotation(keys::NODE_LOCK), Some(lock));
        assert!(k.release_node_lock("ns", "other").await.unwrap());
        assert_eq!(k.node_annotation(keys::NODE_LOCK), None);
        k.set_node_annotation(keys::NODE_LOCK, Some("garbage"));
        assert!(k.release_node_lock("ns", "p").await.unwrap());
        assert_eq!(k.node_annotation(keys::NODE_LOCK), None);
        assert!(!k.release_node_lock("ns", "p").await.unwrap());
    }

    fn facts(numa: Option<i64>) -> DeviceFacts {
        DeviceFacts {
            index: 0,
            uuid: "GPU-a".into(),
            name: "NVIDIA T4".into(),
            memory_total: 16 << 30,
            numa,
        }
    }

    #[test]
    fn numa_topology_is_opt_in_and_never_made_up() {
        let set = |numa| DeviceSet {
            gpus: vec![facts(numa)],
            healthy: vec![true],
        };
        let topo = |s: &DeviceSet, on| {
            s.api_devices(2, on)
                .into_iter()
                .map(|d| {
                    d.topology
                        .map(|t| t.nodes.iter().map(|n| n.id).collect::<Vec<_>>())
                })
                .collect::<Vec<_>>()
        };
        // Off (HAMi's default): no topology, known node or not.
        assert_eq!(topo(&set(Some(1)), false), [None, None]);
        // On: the known node on every replica.
        assert_eq!(topo(&set(Some(1)), true), [Some(vec![1]), Some(vec![1])]);
        // On, unknown: no topology rather than a made-up node 0.
        assert_eq!(topo(&set(None), true), [None, None]);
    }

    #[test]
    fn preferred_picks_replicas_of_the_assigned_gpus() {
        let u = "GPU-4617e643-f070-4b90-b715-30c57f977a9a";
        let v = "GPU-9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
        let want = [
            vgpu_hami::ContainerDevice::nvidia(v, 1, 0),
            vgpu_hami::ContainerDevice::nvidia(u, 1, 0),
        ];
        let req = ContainerPreferredAllocationRequest {
            available_device_i_ds: vec![format!("{u}-0"), format!("{u}-1"), format!("{v}-3")],
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        };
        assert_eq!(
            pick(&want, &req),
            Some(vec![format!("{v}-3"), format!("{u}-0")])
        );
        let must = ContainerPreferredAllocationRequest {
            must_include_device_i_ds: vec![format!("{u}-1")],
            ..req.clone()
        };
        assert_eq!(
            pick(&want, &must),
            Some(vec![format!("{u}-1"), format!("{v}-3")])
        );
        let none = ContainerPreferredAllocationRequest {
            available_device_i_ds: vec![format!("{u}-0")],
            ..req
        };
        assert_eq!(pick(&want, &none), None);
    }
}
