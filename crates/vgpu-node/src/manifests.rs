//! The Kubernetes objects of a vgpu deployment, as `deploy/helm/vgpu`
//! renders them (`vgpu node manifests` prints them; a test renders the
//! chart's templates with the same values and requires the same objects,
//! each decoded into its `k8s-openapi` type with unknown fields refused).
//! The values are HAMi v2.10's chart values wherever vgpu has the same
//! setting, under HAMi's key and with HAMi's meaning; HAMi keys that have
//! no meaning here are accepted and ignored ([`HAMI_IGNORED`]); the table
//! of every HAMi key is docs/helm-values.md. A values file is merged over
//! the defaults as Helm merges it ([`Values::from_yaml`]). Builds values
//! only; never talks to a cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// HAMi v2.10 value keys (dotted paths; a path covers everything under it)
/// that vgpu accepts and ignores: other vendors' devices, HAMi's own images
/// and certificate Job, device-plugin features vgpu does not have, and the
/// per-image pull policies whose vgpu setting is `image.pullPolicy`
/// (docs/helm-values.md says why for each).
pub const HAMI_IGNORED: &[&str] = &[
    "global.imageTag",
    "global.managedNodeSelectorEnable",
    "global.managedNodeSelector",
    "mluResourceName",
    "mluResourceMem",
    "mluResourceCores",
    "dcuResourceName",
    "dcuResourceMem",
    "dcuResourceCores",
    "metaxResourceName",
    "metaxResourceCore",
    "metaxResourceMem",
    "metaxsGPUTopologyAware",
    "enflameResourceNameDRSGCU",
    "enflameResourceNameGCUMemory",
    "enflameResourceNameGCUCore",
    "kunlunResourceName",
    "kunlunResourceVCountName",
    "kunlunResourceVMemoryName",
    "vastaiResourceName",
    "birenResourceName",
    "podSecurityPolicy",
    "scheduler.kubeScheduler.extraArgs",
    "scheduler.extender.image.registry",
    "scheduler.extender.image.repository",
    "scheduler.extender.image.tag",
    "scheduler.extender.image.pullPolicy",
    "scheduler.patch",
    "devicePlugin.image.registry",
    "devicePlugin.image.repository",
    "devicePlugin.image.tag",
    "devicePlugin.image.pullPolicy",
    "devicePlugin.monitor",
    "devicePlugin.preConfiguredDeviceMemory",
    "devicePlugin.nodeConfiguration",
    "devicePlugin.migStrategy",
    "devicePlugin.passDeviceSpecsEnabled",
    "devicePlugin.nvidiaHookPath",
    "devicePlugin.nvidiaDriverRoot",
    "devicePlugin.gdrcopyEnabled",
    "devicePlugin.gdsEnabled",
    "devicePlugin.mofedEnabled",
    "mockDevicePlugin",
    "devices.amd",
    "devices.awsneuron",
    "devices.kunlun",
    "devices.enflame",
    "devices.mthreads",
    "devices.vastai",
    "devices.biren",
    "devices.ascend",
    "devices.iluvatar",
];

/// The Kubernetes version the kube-scheduler image defaults to when
/// `scheduler.kubeScheduler.image.tag` is empty and no cluster is asked
/// (Helm uses the cluster's; `vgpu node manifests --kube-version`).
pub const DEFAULT_KUBE_VERSION: &str = "v1.37.2";

/// `values.yaml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Values {
    /// Shared settings.
    pub global: Global,
    /// Base of the HAMi-compatible Services' names and their
    /// `app.kubernetes.io/name` label (HAMi's chart name, `hami`, when empty).
    pub name_override: String,
    /// The HAMi-compatible Services' name prefix, whole.
    pub fullname_override: String,
    /// Namespace of every namespaced object (the release's when empty).
    pub namespace_override: String,
    /// The image with `vgpu`, `libvgpu.so` and `libvgpu_core.so`.
    pub image: Image,
    /// Count resource.
    pub resource_name: String,
    /// Memory resource (MiB).
    pub resource_mem: String,
    /// Memory percentage resource.
    pub resource_mem_percentage: String,
    /// Cores resource.
    pub resource_cores: String,
    /// Priority resource.
    pub resource_priority: String,
    /// The scheduler profile pods name.
    pub scheduler_name: String,
    /// Export HAMi's pre-v2.9 metric names too.
    pub legacy_metrics: bool,
    /// The node agent.
    pub device_plugin: DevicePlugin,
    /// The DRA driver in the node agent (docs/dra.md).
    pub dra: Dra,
    /// Container-side settings.
    pub devices: Devices,
    /// The scheduler Deployment.
    pub scheduler: Scheduler,
    /// ServiceMonitors for the two HAMi-compatible Services.
    pub prometheus: Enabled,
    /// The scheduler's device config file, whole (`content`; empty: made
    /// from the values).
    #[serde(rename = "device-config")]
    pub device_config: DeviceConfig,
}

/// `global`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Global {
    /// Hook path on the host and in containers.
    pub gpu_hook_path: String,
    /// Registry in front of every image the chart runs (empty: none).
    pub image_registry: String,
    /// Pull secrets of both pods.
    pub image_pull_secrets: Vec<String>,
    /// Extra labels on the DaemonSet and the Deployment.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on the DaemonSet and the Deployment.
    pub annotations: BTreeMap<String, String>,
}

/// `image`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Image {
    /// Repository.
    pub repository: String,
    /// Tag.
    pub tag: String,
    /// Pull policy.
    pub pull_policy: String,
}

/// An image of HAMi's whose pull secrets vgpu's pod takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PullSecrets {
    /// Secret names.
    pub pull_secrets: Vec<String>,
}

/// `dra`: the node agent's DRA driver and its DeviceClass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dra {
    /// Run the DRA driver (`--mode dra`, or `both` with
    /// `devicePlugin.enabled`), create the DeviceClass.
    pub enabled: bool,
    /// The driver name: ResourceSlices, the DeviceClass's name, the CDI vendor.
    pub driver_name: String,
    /// When set, the DeviceClass's `extendedResourceName` (pods asking for
    /// it get a whole-default share through DRA; Kubernetes 1.36+).
    pub extended_resource_name: String,
}

impl Default for Dra {
    fn default() -> Self {
        Dra {
            enabled: false,
            driver_name: "vgpu.io".into(),
            extended_resource_name: String::new(),
        }
    }
}

/// The plugin directory of a DRA driver on the host.
pub fn dra_plugin_dir(driver: &str) -> String {
    format!("/var/lib/kubelet/plugins/{driver}")
}

/// `{enabled: bool}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Enabled {
    /// On.
    pub enabled: bool,
}

/// `device-config`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceConfig {
    /// HAMi's `device-config.yaml`, whole.
    pub content: String,
}

/// `devicePlugin.gpuOperatorToolkitReady`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ToolkitReady {
    /// Wait for the GPU operator's toolkit before starting.
    pub enabled: bool,
    /// Host directory of its `toolkit-ready` file.
    pub host_path: String,
    /// The waiting init container's securityContext.
    pub security_context: Value,
}

/// A HAMi-compatible Service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeService {
    /// `NodePort` or `ClusterIP`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Port (and node port with `NodePort`).
    pub http_port: u16,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// `devicePlugin`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DevicePlugin {
    /// Deploy the node agent (DaemonSet, its RBAC and Services).
    pub enabled: bool,
    /// Pull secrets of the agent's pod (HAMi's device-plugin image's).
    pub image: PullSecrets,
    /// Wait for the NVIDIA GPU operator's toolkit.
    pub gpu_operator_toolkit_ready: ToolkitReady,
    /// vGPUs per card.
    pub device_split_count: u32,
    /// Memory over-commit factor.
    pub device_memory_scaling: f64,
    /// Core scaling.
    pub device_core_scaling: f64,
    /// Advertise NUMA nodes to the kubelet (HAMi's name; off by default).
    pub enable_numa_topology: bool,
    /// RuntimeClass of the agent's pod and of GPU pods (webhook); empty: none.
    pub runtime_class_name: String,
    /// Create that RuntimeClass (handler `nvidia`).
    pub create_runtime_class: bool,
    /// `"true"`: containers get `GPU_CORE_UTILIZATION_POLICY=disable` (HAMi keeps it a string).
    pub disablecorelimit: String,
    /// NVIDIA's device-list strategies, comma list (HAMi's name).
    pub device_list_strategy: String,
    /// More arguments for `vgpu node`.
    pub extra_args: Vec<String>,
    /// More env entries for the agent's container (a list; null, and HAMi's
    /// default `{}`, mean none).
    pub extra_envs: Value,
    /// HAMi's device-plugin monitor Service.
    pub service: NodeService,
    /// Kubelet device-plugin directory on the host.
    pub plugin_path: String,
    /// Host directory holding libvgpu.so and libvgpu_core.so.
    pub lib_path: String,
    /// Annotations of the agent's pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// The agent runs in the host PID namespace (the broker, the watchdog and
    /// slot reclaim need it).
    #[serde(rename = "hostPID")]
    pub host_pid: bool,
    /// The agent runs in the host network namespace.
    pub host_network: bool,
    /// The agent container's securityContext.
    pub security_context: Value,
    /// Nodes the agent runs on.
    pub nvidia_node_selector: BTreeMap<String, String>,
    /// The agent pod's tolerations.
    pub tolerations: Vec<Value>,
    /// The DaemonSet's updateStrategy.
    pub update_strategy: Value,
    /// The agent container's resources.
    pub resources: Value,
    /// Monitor port.
    pub monitor_port: u16,
    /// Watchdog: `report` or `kill`.
    pub enforce: String,
    /// Watchdog tolerance above the limit.
    pub tolerance: String,
    /// Watchdog grace.
    pub grace: String,
    /// The priority arbiter's hold in percent, or `none` (arbiter off).
    pub priority_hold: String,
    /// Host directory of the broker socket (mounted read-only into pods).
    pub broker_dir: String,
}

/// `devices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Devices {
    /// `devices.nvidia`.
    pub nvidia: Nvidia,
}

/// `devices.nvidia`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Nvidia {
    /// `default`, `force` or `disable`.
    pub gpu_core_policy: String,
    /// `LIBCUDA_LOG_LEVEL` in containers (vgpu's scale: 0 quiet … 4 debug, 2 warnings).
    pub lib_cuda_log_level: u32,
}

/// `scheduler`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Scheduler {
    /// Pin the scheduler pod to this node (empty: scheduled as usual).
    pub node_name: String,
    /// Only nodes with these labels are considered (`--node-label-selector`).
    pub node_label_selector: BTreeMap<String, String>,
    /// The scheduler pod's nodeSelector.
    pub node_selector: BTreeMap<String, String>,
    /// Containers without a GPU get `NVIDIA_VISIBLE_DEVICES=none` (HAMi keeps it a string).
    pub overwrite_env: Value,
    /// `nodeSchedulerPolicy` / `gpuSchedulerPolicy`.
    pub default_scheduler_policy: Policies,
    /// The scheduler's metrics address (`:9395`).
    pub metrics_bind_address: String,
    /// The webhook also takes pods whose scheduler is `default-scheduler`.
    pub force_overwrite_default_scheduler: bool,
    /// Liveness probes on both containers.
    pub liveness_probe: bool,
    /// kube-scheduler elects a leader; `replicas` applies only then.
    pub leader_elect: bool,
    /// Replicas (with `leaderElect`; else 1).
    pub replicas: i32,
    /// The kube-scheduler beside the extender.
    pub kube_scheduler: KubeScheduler,
    /// The extender container (`vgpu scheduler`).
    pub extender: ExtenderContainer,
    /// Node lock expiry.
    pub node_lock_expire: String,
    /// Annotations of the scheduler's pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// The scheduler pod's tolerations.
    pub tolerations: Vec<Value>,
    /// The MutatingWebhookConfiguration.
    pub admission_webhook: AdmissionWebhook,
    /// The webhook's certificate from cert-manager (else Helm generates it).
    pub cert_manager: Enabled,
    /// HAMi's scheduler Service (its `httpTargetPort` is also the port the
    /// extender and webhook listen on in the pod).
    pub service: SchedulerService,
}

/// `scheduler.kubeScheduler`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeScheduler {
    /// Run kube-scheduler in the scheduler pod.
    pub enabled: bool,
    /// Its image.
    pub image: KubeSchedulerImage,
    /// Its resources.
    pub resources: Value,
    /// Its arguments after `--config`.
    pub extra_new_args: Vec<String>,
}

/// `scheduler.kubeScheduler.image`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeSchedulerImage {
    /// Registry (`global.imageRegistry` wins).
    pub registry: String,
    /// Repository.
    pub repository: String,
    /// Tag; empty: the cluster's Kubernetes version.
    pub tag: String,
    /// Pull policy.
    pub pull_policy: String,
    /// Pull secrets.
    pub pull_secrets: Vec<String>,
}

/// `scheduler.extender`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExtenderContainer {
    /// Pull secrets of the scheduler pod (HAMi's extender image's).
    pub image: PullSecrets,
    /// Its resources.
    pub resources: Value,
    /// More arguments for `vgpu scheduler`.
    pub extra_args: Vec<String>,
}

/// `scheduler.admissionWebhook` (used only by the Helm-only `webhook.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdmissionWebhook {
    /// Install the MutatingWebhookConfiguration.
    pub enabled: bool,
    /// Call the webhook at this URL instead of through the Service.
    #[serde(rename = "customURL")]
    pub custom_url: CustomUrl,
    /// Namespaces the webhook leaves alone.
    pub whitelist_namespaces: Vec<String>,
    /// Render the webhook's namespaceSelector.
    pub manage_namespace_selector: bool,
    /// More namespaceSelector terms.
    pub namespace_selector: Selector,
    /// More objectSelector terms.
    pub object_selector: Selector,
    /// `Never` or `IfNeeded`.
    pub reinvocation_policy: String,
    /// `Ignore` or `Fail`.
    pub failure_policy: String,
}

/// `scheduler.admissionWebhook.customURL`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustomUrl {
    /// Use `https://host:port/path`.
    pub enabled: bool,
    /// Host name or IP (also in the certificate).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Path.
    pub path: String,
}

/// A label selector's extra terms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Selector {
    /// matchLabels.
    pub match_labels: BTreeMap<String, String>,
    /// matchExpressions after the chart's own.
    pub match_expressions: Vec<Value>,
}

/// `scheduler.service`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SchedulerService {
    /// `NodePort` or `ClusterIP`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Port of `http` (extender and webhook).
    pub http_port: u16,
    /// Node port of `http`.
    pub scheduler_port: u16,
    /// Port (and node port) of `monitor`.
    pub monitor_port: u16,
    /// Target of `monitor`: the scheduler's metrics port.
    pub monitor_target_port: u16,
    /// Target of `http`: the extender's and webhook's HTTPS port in the
    /// pod (kube-scheduler dials it on loopback).
    pub http_target_port: u16,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Default policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policies {
    /// `binpack` or `spread`.
    pub node_scheduler_policy: String,
    /// `binpack`, `spread`, `topology-aware`, `numa`.
    pub gpu_scheduler_policy: String,
}

impl Default for Values {
    fn default() -> Self {
        Values {
            global: Global::default(),
            name_override: String::new(),
            fullname_override: String::new(),
            namespace_override: String::new(),
            image: Image::default(),
            resource_name: "nvidia.com/gpu".into(),
            resource_mem: "nvidia.com/gpumem".into(),
            resource_mem_percentage: "nvidia.com/gpumem-percentage".into(),
            resource_cores: "nvidia.com/gpucores".into(),
            resource_priority: "nvidia.com/priority".into(),
            scheduler_name: "hami-scheduler".into(),
            legacy_metrics: false,
            device_plugin: DevicePlugin::default(),
            dra: Dra::default(),
            devices: Devices::default(),
            scheduler: Scheduler::default(),
            prometheus: Enabled::default(),
            device_config: DeviceConfig::default(),
        }
    }
}

impl Default for Global {
    fn default() -> Self {
        Global {
            gpu_hook_path: "/usr/local".into(),
            image_registry: String::new(),
            image_pull_secrets: Vec::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }
}

impl Default for Image {
    fn default() -> Self {
        Image {
            repository: "vgpu".into(),
            tag: env!("CARGO_PKG_VERSION").into(),
            pull_policy: "IfNotPresent".into(),
        }
    }
}

impl Default for ToolkitReady {
    fn default() -> Self {
        ToolkitReady {
            enabled: false,
            host_path: "/run/nvidia/validations".into(),
            security_context: json!({"privileged": true, "runAsUser": 0}),
        }
    }
}

impl Default for DevicePlugin {
    fn default() -> Self {
        DevicePlugin {
            enabled: true,
            image: PullSecrets::default(),
            gpu_operator_toolkit_ready: ToolkitReady::default(),
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            enable_numa_topology: false,
            runtime_class_name: String::new(),
            create_runtime_class: false,
            disablecorelimit: "false".into(),
            device_list_strategy: "envvar".into(),
            extra_args: Vec::new(),
            extra_envs: Value::Null,
            service: NodeService {
                type_: "NodePort".into(),
                http_port: 31992,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
            plugin_path: "/var/lib/kubelet/device-plugins".into(),
            lib_path: "/usr/local/vgpu".into(),
            pod_annotations: BTreeMap::new(),
            host_pid: true,
            host_network: false,
            security_context: json!({"privileged": true}),
            nvidia_node_selector: BTreeMap::from([("gpu".into(), "on".into())]),
            tolerations: vec![json!({"key": "CriticalAddonsOnly", "operator": "Exists"})],
            update_strategy: json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}),
            resources: json!({}),
            monitor_port: 9394,
            enforce: "report".into(),
            tolerance: "128m".into(),
            grace: "30s".into(),
            priority_hold: "10".into(),
            broker_dir: "/run/vgpu".into(),
        }
    }
}

impl Default for NodeService {
    fn default() -> Self {
        DevicePlugin::default().service
    }
}

impl Default for Nvidia {
    fn default() -> Self {
        Nvidia {
            gpu_core_policy: "default".into(),
            lib_cuda_log_level: 2,
        }
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler {
            node_name: String::new(),
            node_label_selector: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            overwrite_env: json!("false"),
            default_scheduler_policy: Policies::default(),
            metrics_bind_address: ":9395".into(),
            force_overwrite_default_scheduler: true,
            liveness_probe: true,
            leader_elect: true,
            replicas: 1,
            kube_scheduler: KubeScheduler::default(),
            extender: ExtenderContainer::default(),
            node_lock_expire: "5m".into(),
            pod_annotations: BTreeMap::new(),
            tolerations: Vec::new(),
            admission_webhook: AdmissionWebhook::default(),
            cert_manager: Enabled::default(),
            service: SchedulerService::default(),
        }
    }
}

impl Default for KubeScheduler {
    fn default() -> Self {
        KubeScheduler {
            enabled: true,
            image: KubeSchedulerImage::default(),
            resources: json!({}),
            extra_new_args: Vec::new(),
        }
    }
}

impl Default for KubeSchedulerImage {
    fn default() -> Self {
        KubeSchedulerImage {
            registry: "registry.k8s.io".into(),
            repository: "kube-scheduler".into(),
            tag: String::new(),
            pull_policy: "IfNotPresent".into(),
            pull_secrets: Vec::new(),
        }
    }
}

impl Default for ExtenderContainer {
    fn default() -> Self {
        ExtenderContainer {
            image: PullSecrets::default(),
            resources: json!({}),
            extra_args: Vec::new(),
        }
    }
}

impl Default for AdmissionWebhook {
    fn default() -> Self {
        AdmissionWebhook {
            enabled: true,
            custom_url: CustomUrl::default(),
            whitelist_namespaces: Vec::new(),
            manage_namespace_selector: true,
            namespace_selector: Selector::default(),
            object_selector: Selector::default(),
            reinvocation_policy: "Never".into(),
            failure_policy: "Ignore".into(),
        }
    }
}

impl Default for CustomUrl {
    fn default() -> Self {
        CustomUrl {
            enabled: false,
            host: "127.0.0.1".into(),
            port: 31998,
            path: "/webhook".into(),
        }
    }
}

impl Default for SchedulerService {
    fn default() -> Self {
        SchedulerService {
            type_: "NodePort".into(),
            http_port: 443,
            scheduler_port: 31998,
            monitor_port: 31993,
            monitor_target_port: 9395,
            http_target_port: 443,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }
}

impl Default for Policies {
    fn default() -> Self {
        Policies {
            node_scheduler_policy: "binpack".into(),
            gpu_scheduler_policy: "spread".into(),
        }
    }
}

/// Helm's merge of a values file over the chart's: maps merge key by key,
/// a null removes the key (its default comes back), anything else replaces.
pub fn merge_values(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(&k);
                } else if let Some(slot) = b.get_mut(&k) {
                    merge_values(slot, v);
                } else {
                    b.insert(k, v);
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn remove_path(v: &mut Value, path: &str) {
    let mut cur = v;
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        let Some(obj) = cur.as_object_mut() else {
            return;
        };
        if parts.peek().is_none() {
            obj.remove(p);
            return;
        }
        match obj.get_mut(p) {
            Some(next) => cur = next,
            None => return,
        }
    }
}

impl Values {
    /// A values file as Helm reads it: merged over the defaults, HAMi's
    /// ignored keys ([`HAMI_IGNORED`]) dropped, anything else unknown refused.
    pub fn from_yaml(text: &str) -> Result<Values, String> {
        let user: Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut user = match user {
            Value::Null => Value::Object(Map::new()),
            u @ Value::Object(_) => u,
            other => return Err(format!("values: expected a mapping, got {other}")),
        };
        for p in HAMI_IGNORED {
            remove_path(&mut user, p);
        }
        let mut merged = serde_json::to_value(Values::default()).map_err(|e| e.to_string())?;
        merge_values(&mut merged, user);
        serde_json::from_value(merged).map_err(|e| e.to_string())
    }
}

/// Where the objects go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// Helm release name (object name prefix).
    pub name: String,
    /// Namespace (`namespaceOverride` wins).
    pub namespace: String,
    /// The cluster's Kubernetes version (`.Capabilities.KubeVersion.Version`).
    pub kube_version: String,
}

fn num(f: f64) -> String {
    // Go templates print 1 for 1.0 and 1.5 for 1.5; so does this.
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// A scalar as a Go template prints it.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.as_i64().is_none() && !n.is_u64() => num(f),
            _ => n.to_string(),
        },
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// HAMi's chart strips what follows `vMAJOR.MINOR.PATCH` in the cluster's
/// version (`v1.31.1+k3s1`) to tag the kube-scheduler image.
pub fn stripped_kube_version(v: &str) -> String {
    let bytes = v.as_bytes();
    if bytes.first() != Some(&b'v') {
        return v.to_owned();
    }
    let mut i = 1;
    for part in 0..3 {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return v.to_owned();
        }
        if part < 2 {
            if bytes.get(i) != Some(&b'.') {
                return v.to_owned();
            }
            i += 1;
        }
    }
    v[..i].to_owned()
}

/// Where the scheduler container finds `tls.crt`/`tls.key`: the secret
/// `<release>-vgpu-scheduler-tls` (type kubernetes.io/tls), as HAMi's chart.
pub const SCHEDULER_TLS_DIR: &str = "/tls";

fn labels(component: &str) -> Value {
    json!({"app.kubernetes.io/name": "vgpu", "app.kubernetes.io/component": component})
}

/// Object labels: the selector labels and `global.labels`.
fn object_labels(component: &str, v: &Values) -> Value {
    let mut l = labels(component);
    for (k, x) in &v.global.labels {
        l[k] = json!(x);
    }
    l
}

fn workload_meta(name: &str, ns: &str, component: &str, v: &Values) -> Value {
    let mut m = json!({"name": name, "namespace": ns, "labels": object_labels(component, v)});
    if !v.global.annotations.is_empty() {
        m["annotations"] = json!(v.global.annotations);
    }
    m
}

fn pull_secrets<'a>(lists: impl IntoIterator<Item = &'a Vec<String>>) -> Option<Value> {
    let names: Vec<Value> = lists
        .into_iter()
        .flatten()
        .map(|n| json!({"name": n}))
        .collect();
    (!names.is_empty()).then_some(Value::Array(names))
}

fn with_registry(v: &Values, own: &str) -> String {
    match (v.global.image_registry.as_str(), own) {
        ("", "") => String::new(),
        ("", r) | (r, _) => format!("{r}/"),
    }
}

/// The agent's command line for these values (the DaemonSet's `args`).
pub fn node_args(v: &Values) -> Vec<String> {
    let d = &v.device_plugin;
    let mut a = vec![
        "node".to_owned(),
        format!("--resource-name={}", v.resource_name),
        format!("--device-split-count={}", d.device_split_count),
        format!("--device-memory-scaling={}", num(d.device_memory_scaling)),
        format!("--device-core-scaling={}", num(d.device_core_scaling)),
        format!("--disable-core-limit={}", d.disablecorelimit),
        format!("--core-policy={}", v.devices.nvidia.gpu_core_policy),
        format!(
            "--lib-cuda-log-level={}",
            v.devices.nvidia.lib_cuda_log_level
        ),
        format!("--hook-path={}", v.global.gpu_hook_path),
        format!("--lib-path={}/libvgpu.so", d.lib_path),
        format!("--device-plugin-dir={}", d.plugin_path),
        format!("--broker-socket={}/hostpid.sock", d.broker_dir),
        format!("--metrics-addr=0.0.0.0:{}", d.monitor_port),
        format!("--legacy-metrics={}", v.legacy_metrics),
        format!("--enforce={}", d.enforce),
        format!("--tolerance={}", d.tolerance),
        format!("--grace={}", d.grace),
        format!("--priority-hold={}", d.priority_hold),
        format!("--enable-numa-topology={}", d.enable_numa_topology),
        format!("--device-list-strategy={}", d.device_list_strategy),
        format!(
            "--mode={}",
            match (d.enabled, v.dra.enabled) {
                (true, true) => "both",
                (false, true) => "dra",
                _ => "device-plugin",
            }
        ),
    ];
    if v.dra.enabled {
        a.push(format!("--dra-driver-name={}", v.dra.driver_name));
    }
    a.extend(d.extra_args.iter().cloned());
    a
}

/// The scheduler's command line for these values (its container's `args`).
pub fn scheduler_args(v: &Values) -> Vec<String> {
    let s = &v.scheduler;
    let mut a = vec![
        "scheduler".to_owned(),
        format!("--http_bind=0.0.0.0:{}", s.service.http_target_port),
        format!("--cert_file={SCHEDULER_TLS_DIR}/tls.crt"),
        format!("--key_file={SCHEDULER_TLS_DIR}/tls.key"),
        format!("--metrics-bind-address={}", s.metrics_bind_address),
        format!("--scheduler-name={}", v.scheduler_name),
        format!(
            "--node-scheduler-policy={}",
            s.default_scheduler_policy.node_scheduler_policy
        ),
        format!(
            "--gpu-scheduler-policy={}",
            s.default_scheduler_policy.gpu_scheduler_policy
        ),
        format!(
            "--force-overwrite-default-scheduler={}",
            s.force_overwrite_default_scheduler
        ),
        "--device-config-file=/device-config.yaml".to_owned(),
        format!("--node-lock-expire={}", s.node_lock_expire),
        format!("--legacy-metrics={}", v.legacy_metrics),
        format!("--resource-name={}", v.resource_name),
        format!("--resource-mem={}", v.resource_mem),
        format!("--resource-mem-percentage={}", v.resource_mem_percentage),
        format!("--resource-cores={}", v.resource_cores),
        format!("--resource-priority={}", v.resource_priority),
    ];
    for (k, x) in &s.node_label_selector {
        a.push(format!("--node-label-selector={k}={x}"));
    }
    a.extend(s.extender.extra_args.iter().cloned());
    a
}

/// The scheduler's device config (`device-config.yaml`, HAMi's format):
/// `device-config.content` whole, else the `nvidia:` keys the values set.
pub fn device_config(v: &Values) -> String {
    if !v.device_config.content.is_empty() {
        return v.device_config.content.clone();
    }
    format!(
        "nvidia:\n  resourceCountName: {}\n  resourceMemoryName: {}\n  resourceMemoryPercentageName: {}\n  resourceCoreName: {}\n  resourcePriorityName: {}\n  overwriteEnv: {}\n  gpuCorePolicy: {}\n  runtimeClassName: {}\n",
        v.resource_name,
        v.resource_mem,
        v.resource_mem_percentage,
        v.resource_cores,
        v.resource_priority,
        scalar(&v.scheduler.overwrite_env),
        v.devices.nvidia.gpu_core_policy,
        serde_json::to_string(&v.device_plugin.runtime_class_name).unwrap_or_default(),
    )
}

fn host_path(name: &str, path: &str, ty: &str) -> Value {
    json!({"name": name, "hostPath": {"path": path, "type": ty}})
}

/// Every object, in apply order.
pub fn render(v: &Values, r: &Release) -> Vec<Value> {
    let ns = if v.namespace_override.is_empty() {
        r.namespace.as_str()
    } else {
        v.namespace_override.as_str()
    };
    let mut out = Vec::new();
    if v.device_plugin.enabled || v.dra.enabled {
        out.extend(node_objects(v, r, ns));
    }
    out.extend(scheduler_objects(v, r, ns));
    out
}

/// vgpu's image (both the node agent and the scheduler run it).
fn vgpu_image(v: &Values) -> String {
    format!(
        "{}{}:{}",
        with_registry(v, ""),
        v.image.repository,
        v.image.tag
    )
}

fn node_objects(v: &Values, r: &Release, ns: &str) -> Vec<Value> {
    let node = format!("{}-vgpu-node", r.name);
    let image = vgpu_image(v);
    let d = &v.device_plugin;
    let vgpu_dir = format!("{}/vgpu", v.global.gpu_hook_path);
    let node_labels = labels("vgpu-node");
    let toolkit = &d.gpu_operator_toolkit_ready;
    let mut init = Vec::new();
    if toolkit.enabled {
        init.push(json!({
            "name": "toolkit-validation",
            "image": image,
            "imagePullPolicy": v.image.pull_policy,
            "securityContext": toolkit.security_context,
            "command": ["/bin/sh", "-c", format!("until [ -f {0}/toolkit-ready ]; do echo waiting for {0}/toolkit-ready; sleep 5; done", toolkit.host_path)],
            "volumeMounts": [{"name": "nvidia-validations", "mountPath": toolkit.host_path, "mountPropagation": "HostToContainer", "readOnly": true}],
        }));
    }
    init.push(json!({
        "name": "install-libvgpu",
        "image": image,
        "imagePullPolicy": v.image.pull_policy,
        "command": ["/bin/sh", "-c", "install -m 0755 /usr/local/lib/vgpu/libvgpu_core.so /host-lib/libvgpu_core.so.new && mv -f /host-lib/libvgpu_core.so.new /host-lib/libvgpu_core.so && install -m 0755 /usr/local/lib/vgpu/libvgpu.so /host-lib/libvgpu.so.new && mv -f /host-lib/libvgpu.so.new /host-lib/libvgpu.so"],
        "volumeMounts": [{"name": "lib", "mountPath": "/host-lib"}],
    }));
    let mut env = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}),
    ];
    if let Value::Array(extra) = &d.extra_envs {
        env.extend(extra.iter().cloned());
    }
    let mut volumes = vec![
        host_path("device-plugins", &d.plugin_path, "Directory"),
        host_path("hook", &vgpu_dir, "DirectoryOrCreate"),
        host_path("lib", &d.lib_path, "DirectoryOrCreate"),
        host_path("lock", "/tmp/vgpulock", "DirectoryOrCreate"),
        host_path("broker", &d.broker_dir, "DirectoryOrCreate"),
    ];
    if toolkit.enabled {
        volumes.push(host_path(
            "nvidia-validations",
            &toolkit.host_path,
            "DirectoryOrCreate",
        ));
    }
    let mut mounts = vec![
        json!({"name": "device-plugins", "mountPath": d.plugin_path}),
        // Not `lib` too: with the defaults it is this same
        // directory, and the API server refuses two
        // mounts at one path.
        json!({"name": "hook", "mountPath": vgpu_dir}),
        json!({"name": "lock", "mountPath": "/tmp/vgpulock"}),
        json!({"name": "broker", "mountPath": d.broker_dir}),
    ];
    if v.dra.enabled {
        let plugin = dra_plugin_dir(&v.dra.driver_name);
        for (name, path) in [
            ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
            ("dra-plugin", plugin.as_str()),
            ("cdi", "/var/run/cdi"),
        ] {
            volumes.push(host_path(name, path, "DirectoryOrCreate"));
            mounts.push(json!({"name": name, "mountPath": path}));
        }
    }
    let mut pod_spec = json!({
        "serviceAccountName": node,
        "hostPID": d.host_pid,
        "hostNetwork": d.host_network,
        "priorityClassName": "system-node-critical",
        "nodeSelector": d.nvidia_node_selector,
        "tolerations": d.tolerations,
        "initContainers": init,
        "containers": [{
            "name": "vgpu-node",
            "image": image,
            "imagePullPolicy": v.image.pull_policy,
            "command": ["vgpu"],
            "args": node_args(v),
            "env": env,
            "securityContext": d.security_context,
            "resources": d.resources,
            "ports": [{"name": "metrics", "containerPort": d.monitor_port, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": d.monitor_port}, "periodSeconds": 30},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": d.monitor_port}, "periodSeconds": 10},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    });
    if !d.runtime_class_name.is_empty() {
        pod_spec["runtimeClassName"] = json!(d.runtime_class_name);
    }
    if let Some(s) = pull_secrets([&v.global.image_pull_secrets, &d.image.pull_secrets]) {
        pod_spec["imagePullSecrets"] = s;
    }
    let mut objs = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": node, "namespace": ns, "labels": node_labels}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": node, "labels": node_labels},
            "rules": node_rules(v),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": node, "labels": node_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": node},
            "subjects": [{"kind": "ServiceAccount", "name": node, "namespace": ns}],
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": workload_meta(&node, ns, "vgpu-node", v),
            "spec": {
                "selector": {"matchLabels": node_labels},
                "updateStrategy": d.update_strategy,
                "template": {
                    "metadata": {"labels": node_labels, "annotations": d.pod_annotations},
                    "spec": pod_spec,
                },
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("{node}-monitor"), "namespace": ns, "labels": node_labels},
            "spec": {
                "selector": node_labels,
                "ports": [{"name": "metrics", "port": d.monitor_port, "targetPort": d.monitor_port, "protocol": "TCP"}],
            },
        }),
    ];
    if v.dra.enabled {
        let mut spec = json!({"selectors": [{"cel": {"expression": format!(
            "device.driver == '{}' && device.allowMultipleAllocations",
            v.dra.driver_name
        )}}]});
        if !v.dra.extended_resource_name.is_empty() {
            spec["extendedResourceName"] = json!(v.dra.extended_resource_name);
        }
        objs.push(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": v.dra.driver_name, "labels": node_labels},
            "spec": spec,
        }));
    }
    if d.create_runtime_class && !d.runtime_class_name.is_empty() {
        objs.push(json!({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": d.runtime_class_name, "annotations": {"helm.sh/hook": "pre-install,pre-upgrade"}},
            "handler": "nvidia",
        }));
    }
    objs
}

/// The node agent's ClusterRole rules; the DRA driver's when it runs.
fn node_rules(v: &Values) -> Vec<Value> {
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]}),
        json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}),
        json!({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}),
    ];
    if v.dra.enabled {
        rules.push(json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}));
        rules.push(json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]}));
    }
    rules
}

fn scheduler_objects(v: &Values, r: &Release, ns: &str) -> Vec<Value> {
    let sched = format!("{}-vgpu-scheduler", r.name);
    let image = vgpu_image(v);
    let s = &v.scheduler;
    let ks = &s.kube_scheduler;
    let sched_labels = labels("vgpu-scheduler");
    let resources = [
        &v.resource_name,
        &v.resource_mem,
        &v.resource_mem_percentage,
        &v.resource_cores,
        &v.resource_priority,
    ];
    let scheduler_config = json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": s.leader_elect,
            "resourceName": v.scheduler_name,
            "resourceNamespace": ns,
        },
        "profiles": [{"schedulerName": v.scheduler_name}],
        "extenders": [{
            "urlPrefix": format!("https://127.0.0.1:{}", s.service.http_target_port),
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "bindVerb": "bind",
            "weight": 10,
            "nodeCacheCapable": true,
            "httpTimeout": "30s",
            "enableHTTPS": true,
            "tlsConfig": {"insecure": true},
            "managedResources": resources.iter().map(|n| json!({"name": n, "ignoredByScheduler": true})).collect::<Vec<_>>(),
        }],
    });
    let scheduler_yaml = serde_saphyr::to_string(&scheduler_config).unwrap_or_default();
    let tag = if ks.image.tag.is_empty() {
        stripped_kube_version(&r.kube_version)
    } else {
        ks.image.tag.clone()
    };
    let ks_image = format!(
        "{}{}:{}",
        with_registry(v, &ks.image.registry),
        ks.image.repository,
        tag
    );
    let mut containers = Vec::new();
    if ks.enabled {
        let mut command = vec![
            "kube-scheduler".to_owned(),
            "--config=/config/config.yaml".to_owned(),
        ];
        command.extend(ks.extra_new_args.iter().cloned());
        let mut c = json!({
            "name": "kube-scheduler",
            "image": ks_image,
            "imagePullPolicy": ks.image.pull_policy,
            "command": command,
            "resources": ks.resources,
            "volumeMounts": [{"name": "config", "mountPath": "/config"}],
        });
        if s.liveness_probe {
            c["livenessProbe"] = json!({"httpGet": {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}, "periodSeconds": 10, "failureThreshold": 8, "timeoutSeconds": 15});
        }
        containers.push(c);
    }
    let mut ext = json!({
        "name": "vgpu-scheduler",
        "image": image,
        "imagePullPolicy": v.image.pull_policy,
        "command": ["vgpu"],
        "args": scheduler_args(v),
        "ports": [
            {"name": "https", "containerPort": s.service.http_target_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": s.service.monitor_target_port, "protocol": "TCP"},
        ],
        "resources": s.extender.resources,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": s.service.http_target_port, "scheme": "HTTPS"}, "periodSeconds": 10},
        "volumeMounts": [
            {"name": "tls", "mountPath": SCHEDULER_TLS_DIR, "readOnly": true},
            {"name": "device-config", "mountPath": "/device-config.yaml", "subPath": "device-config.yaml", "readOnly": true},
        ],
    });
    if s.liveness_probe {
        ext["livenessProbe"] = json!({"httpGet": {"path": "/healthz", "port": s.service.http_target_port, "scheme": "HTTPS"}, "periodSeconds": 30});
    }
    containers.push(ext);
    let mut volumes = Vec::new();
    if ks.enabled {
        volumes.push(json!({"name": "config", "configMap": {"name": sched}}));
    }
    volumes.push(json!({"name": "tls", "secret": {"secretName": format!("{sched}-tls")}}));
    volumes
        .push(json!({"name": "device-config", "configMap": {"name": format!("{sched}-device")}}));
    let mut pod_spec = json!({
        "serviceAccountName": sched,
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": s.node_selector,
        "tolerations": s.tolerations,
        "containers": containers,
        "volumes": volumes,
    });
    if let Some(p) = pull_secrets([
        &v.global.image_pull_secrets,
        &s.extender.image.pull_secrets,
        &ks.image.pull_secrets,
    ]) {
        pod_spec["imagePullSecrets"] = p;
    }
    if !s.node_name.is_empty() {
        pod_spec["nodeName"] = json!(s.node_name);
    }
    if s.leader_elect {
        pod_spec["affinity"] = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"labelSelector": {"matchLabels": sched_labels}, "topologyKey": "kubernetes.io/hostname"},
        }]}});
    }
    let replicas = if s.leader_elect { s.replicas } else { 1 };
    let mut objs = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sched, "namespace": ns, "labels": sched_labels}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": sched, "labels": sched_labels},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update"]},
                {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": sched, "labels": sched_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sched},
            "subjects": [{"kind": "ServiceAccount", "name": sched, "namespace": ns}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{sched}-kube-scheduler"), "labels": sched_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-scheduler"},
            "subjects": [{"kind": "ServiceAccount", "name": sched, "namespace": ns}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{sched}-volume-scheduler"), "labels": sched_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:volume-scheduler"},
            "subjects": [{"kind": "ServiceAccount", "name": sched, "namespace": ns}],
        }),
        // kube-scheduler's leader election takes a Lease named after the
        // profile (system:kube-scheduler only covers the name kube-scheduler).
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": sched, "namespace": ns, "labels": sched_labels},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "list", "watch", "update", "patch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": sched, "namespace": ns, "labels": sched_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sched},
            "subjects": [{"kind": "ServiceAccount", "name": sched, "namespace": ns}],
        }),
    ];
    if ks.enabled {
        objs.push(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": sched, "namespace": ns, "labels": sched_labels},
            "data": {"config.yaml": scheduler_yaml},
        }));
    }
    objs.push(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{sched}-device"), "namespace": ns, "labels": sched_labels},
        "data": {"device-config.yaml": device_config(v)},
    }));
    objs.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": workload_meta(&sched, ns, "vgpu-scheduler", v),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": sched_labels},
            "template": {
                "metadata": {
                    "labels": {
                        "app.kubernetes.io/name": "vgpu",
                        "app.kubernetes.io/component": "vgpu-scheduler",
                        "hami.io/webhook": "ignore",
                    },
                    "annotations": s.pod_annotations,
                },
                "spec": pod_spec,
            },
        },
    }));
    objs.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("{sched}-metrics"), "namespace": ns, "labels": sched_labels},
        "spec": {
            "selector": sched_labels,
            "ports": [{"name": "metrics", "port": s.service.monitor_target_port, "targetPort": s.service.monitor_target_port, "protocol": "TCP"}],
        },
    }));
    objs
}

/// The component-config subset the scheduler ConfigMap carries (not in
/// k8s-openapi): decoded with unknown fields refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeSchedulerConfiguration {
    /// `kubescheduler.config.k8s.io/v1`.
    pub api_version: String,
    /// `KubeSchedulerConfiguration`.
    pub kind: String,
    /// Leader election.
    pub leader_election: LeaderElection,
    /// Profiles.
    pub profiles: Vec<Profile>,
    /// Extenders.
    pub extenders: Vec<Extender>,
}

/// `leaderElection`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderElection {
    /// Elect a leader.
    pub leader_elect: bool,
    /// The Lease's name.
    pub resource_name: String,
    /// The Lease's namespace.
    pub resource_namespace: String,
}

/// One profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Its name.
    pub scheduler_name: String,
}

/// One extender.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Extender {
    /// Base URL.
    pub url_prefix: String,
    /// Filter path.
    pub filter_verb: String,
    /// Prioritize path.
    pub prioritize_verb: String,
    /// Bind path.
    pub bind_verb: String,
    /// Weight.
    pub weight: i64,
    /// Node names only in filter requests.
    pub node_cache_capable: bool,
    /// Timeout.
    pub http_timeout: String,
    /// HTTPS.
    #[serde(rename = "enableHTTPS")]
    pub enable_https: bool,
    /// TLS client settings.
    pub tls_config: ExtenderTls,
    /// Resources the extender manages.
    pub managed_resources: Vec<ManagedResource>,
}

/// `tlsConfig` of an extender.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtenderTls {
    /// Do not verify the extender's certificate (it is on loopback in the
    /// same pod; its CA is generated at install).
    pub insecure: bool,
}

/// One managed resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedResource {
    /// Resource name.
    pub name: String,
    /// kube-scheduler ignores it.
    pub ignored_by_scheduler: bool,
}

/// The objects as one multi-document YAML text.
pub fn to_yaml(objects: &[Value]) -> String {
    serde_saphyr::to_string_multiple(objects).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_scheduler_tag_is_the_clusters_semver() {
        for (cluster, tag) in [
            ("v1.31.1+k3s1", "v1.31.1"),
            ("v1.30.8-eks-2d5f260", "v1.30.8"),
            ("v1.37.2", "v1.37.2"),
            ("1.37.2", "1.37.2"),
            ("v1.37", "v1.37"),
        ] {
            assert_eq!(stripped_kube_version(cluster), tag, "{cluster}");
        }
    }

    #[test]
    fn values_merge_as_helm_merges() {
        let v = Values::from_yaml(
            "scheduler:\n  nodeLabelSelector: {pool: a}\n  service: {type: ClusterIP}\ndevicePlugin:\n  tolerations: null\n",
        )
        .unwrap();
        assert_eq!(v.scheduler.service.type_, "ClusterIP");
        assert_eq!(v.scheduler.service.http_port, 443);
        assert_eq!(v.scheduler.node_label_selector.len(), 1);
        assert_eq!(
            v.device_plugin.tolerations,
            Values::default().device_plugin.tolerations
        );
        assert_eq!(Values::from_yaml("").unwrap(), Values::default());
        assert!(Values::from_yaml("- a").is_err());
    }

    #[test]
    fn hamis_ignored_keys_are_accepted_and_nothing_else_unknown() {
        let mut yaml = String::new();
        for k in HAMI_IGNORED {
            let parts: Vec<&str> = k.split('.').collect();
            for (i, p) in parts.iter().enumerate() {
                let last = i + 1 == parts.len();
                yaml.push_str(&format!(
                    "{}{p}:{}\n",
                    "  ".repeat(i),
                    if last { " x" } else { "" }
                ));
            }
            let v = Values::from_yaml(&yaml).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert_eq!(v, Values::default(), "{k}");
            yaml.clear();
        }
        assert!(Values::from_yaml("scheduler:\n  patch2: {}\n").is_err());
    }

    #[test]
    fn the_scheduler_gets_hamis_arguments() {
        let mut v = Values::default();
        v.scheduler.node_label_selector =
            BTreeMap::from([("gpu".into(), "on".into()), ("a".into(), "b".into())]);
        v.scheduler.extender.extra_args = vec!["--debug".into()];
        let a = scheduler_args(&v);
        let tail: Vec<&str> = a[a.len() - 3..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "--node-label-selector=a=b",
                "--node-label-selector=gpu=on",
                "--debug"
            ]
        );
        assert!(a.contains(&"--metrics-bind-address=:9395".to_string()));
        assert!(device_config(&v).contains("overwriteEnv: false\n"));
        v.device_config.content = "nvidia: {}\n".into();
        assert_eq!(device_config(&v), "nvidia: {}\n");
    }
}
