//! The Kubernetes objects of a vgpu deployment, as `deploy/helm/vgpu`
//! renders them (`vgpu node manifests` prints them; a test renders the
//! chart's templates with the same values and requires the same objects,
//! each decoded into its `k8s-openapi` type with unknown fields refused).
//! Helm values keep HAMi's names where they mean the same
//! (`devicePlugin.deviceSplitCount`, `deviceMemoryScaling`,
//! `deviceCoreScaling`, `disablecorelimit`, `libPath`, `hostPID`,
//! `nvidiaNodeSelector`, `resourceName`…, `schedulerName`,
//! `global.gpuHookPath`, `legacyMetrics`, `scheduler.defaultSchedulerPolicy`,
//! `scheduler.nodeLockExpire`). Builds values only; never talks to a cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `values.yaml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Values {
    /// Shared settings.
    pub global: Global,
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
    /// Container-side settings.
    pub devices: Devices,
    /// The scheduler Deployment.
    pub scheduler: Scheduler,
}

/// `global`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Global {
    /// Hook path on the host and in containers.
    pub gpu_hook_path: String,
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

/// `devicePlugin`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DevicePlugin {
    /// vGPUs per card.
    pub device_split_count: u32,
    /// Memory over-commit factor.
    pub device_memory_scaling: f64,
    /// Core scaling.
    pub device_core_scaling: f64,
    /// `"true"`: containers get `GPU_CORE_UTILIZATION_POLICY=disable` (HAMi keeps it a string).
    pub disablecorelimit: String,
    /// Host directory holding libvgpu.so and libvgpu_core.so.
    pub lib_path: String,
    /// The agent runs in the host PID namespace (the broker, the watchdog and
    /// slot reclaim need it).
    #[serde(rename = "hostPID")]
    pub host_pid: bool,
    /// Nodes the agent runs on.
    pub nvidia_node_selector: BTreeMap<String, String>,
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
    /// Kubelet device-plugin directory.
    pub device_plugin_path: String,
    /// Advertise NUMA nodes to the kubelet (HAMi's name; off by default).
    pub enable_numa_topology: bool,
    /// NVIDIA's device-list strategies, comma list (HAMi's name).
    pub device_list_strategy: String,
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
    /// Replicas.
    pub replicas: i32,
    /// `nodeSchedulerPolicy` / `gpuSchedulerPolicy`.
    pub default_scheduler_policy: Policies,
    /// Node lock expiry.
    pub node_lock_expire: String,
    /// The kube-scheduler image (the extender runs beside it).
    pub kube_scheduler_image: String,
    /// Extender and webhook port (HTTPS; kube-scheduler on loopback, the
    /// API server through the webhook Service on 443).
    pub extender_port: u16,
    /// Metrics port.
    pub metrics_port: u16,
    /// The webhook's certificate from cert-manager (else Helm generates it).
    pub cert_manager: CertManager,
    /// The MutatingWebhookConfiguration's policies.
    pub admission_webhook: AdmissionWebhook,
}

/// `scheduler.certManager` (used only by the Helm-only `webhook.yaml`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CertManager {
    /// Issue the webhook's certificate with cert-manager.
    pub enabled: bool,
}

/// `scheduler.admissionWebhook` (used only by the Helm-only `webhook.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdmissionWebhook {
    /// `Ignore` or `Fail`.
    pub failure_policy: String,
    /// `Never` or `IfNeeded`.
    pub reinvocation_policy: String,
}

impl Default for AdmissionWebhook {
    fn default() -> Self {
        AdmissionWebhook {
            failure_policy: "Ignore".into(),
            reinvocation_policy: "Never".into(),
        }
    }
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
            image: Image::default(),
            resource_name: "nvidia.com/gpu".into(),
            resource_mem: "nvidia.com/gpumem".into(),
            resource_mem_percentage: "nvidia.com/gpumem-percentage".into(),
            resource_cores: "nvidia.com/gpucores".into(),
            resource_priority: "nvidia.com/priority".into(),
            scheduler_name: "hami-scheduler".into(),
            legacy_metrics: false,
            device_plugin: DevicePlugin::default(),
            devices: Devices::default(),
            scheduler: Scheduler::default(),
        }
    }
}

impl Default for Global {
    fn default() -> Self {
        Global {
            gpu_hook_path: "/usr/local".into(),
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

impl Default for DevicePlugin {
    fn default() -> Self {
        DevicePlugin {
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            disablecorelimit: "false".into(),
            lib_path: "/usr/local/vgpu".into(),
            host_pid: true,
            nvidia_node_selector: BTreeMap::from([("gpu".into(), "on".into())]),
            monitor_port: 9394,
            enforce: "report".into(),
            tolerance: "128m".into(),
            grace: "30s".into(),
            priority_hold: "10".into(),
            device_plugin_path: "/var/lib/kubelet/device-plugins".into(),
            enable_numa_topology: false,
            device_list_strategy: "envvar".into(),
            broker_dir: "/run/vgpu".into(),
        }
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
            replicas: 1,
            default_scheduler_policy: Policies::default(),
            node_lock_expire: "5m".into(),
            kube_scheduler_image: "registry.k8s.io/kube-scheduler:v1.37.2".into(),
            extender_port: 443,
            metrics_port: 9395,
            cert_manager: CertManager::default(),
            admission_webhook: AdmissionWebhook::default(),
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

/// Where the objects go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// Helm release name (object name prefix).
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

fn num(f: f64) -> String {
    // Go templates print 1 for 1.0 and 1.5 for 1.5; so does this.
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// Where the scheduler container finds `tls.crt`/`tls.key`: the secret
/// `<release>-vgpu-scheduler-tls` (type kubernetes.io/tls), as HAMi's chart.
pub const SCHEDULER_TLS_DIR: &str = "/tls";

fn labels(component: &str) -> Value {
    json!({"app.kubernetes.io/name": "vgpu", "app.kubernetes.io/component": component})
}

/// The agent's command line for these values (the DaemonSet's `args`).
pub fn node_args(v: &Values) -> Vec<String> {
    let d = &v.device_plugin;
    vec![
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
        format!("--device-plugin-dir={}", d.device_plugin_path),
        format!("--broker-socket={}/hostpid.sock", d.broker_dir),
        format!("--metrics-addr=0.0.0.0:{}", d.monitor_port),
        format!("--legacy-metrics={}", v.legacy_metrics),
        format!("--enforce={}", d.enforce),
        format!("--tolerance={}", d.tolerance),
        format!("--grace={}", d.grace),
        format!("--priority-hold={}", d.priority_hold),
        format!("--enable-numa-topology={}", d.enable_numa_topology),
        format!("--device-list-strategy={}", d.device_list_strategy),
    ]
}

fn host_path(name: &str, path: &str, ty: &str) -> Value {
    json!({"name": name, "hostPath": {"path": path, "type": ty}})
}

/// Every object, in apply order.
pub fn render(v: &Values, r: &Release) -> Vec<Value> {
    let ns = &r.namespace;
    let node = format!("{}-vgpu-node", r.name);
    let sched = format!("{}-vgpu-scheduler", r.name);
    let image = format!("{}:{}", v.image.repository, v.image.tag);
    let d = &v.device_plugin;
    let vgpu_dir = format!("{}/vgpu", v.global.gpu_hook_path);
    let node_labels = labels("vgpu-node");
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
        "leaderElection": {"leaderElect": false},
        "profiles": [{"schedulerName": v.scheduler_name}],
        "extenders": [{
            "urlPrefix": format!("https://127.0.0.1:{}", v.scheduler.extender_port),
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
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": node, "namespace": ns, "labels": node_labels}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": node, "labels": node_labels},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": node, "labels": node_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": node},
            "subjects": [{"kind": "ServiceAccount", "name": node, "namespace": ns}],
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": node, "namespace": ns, "labels": node_labels},
            "spec": {
                "selector": {"matchLabels": node_labels},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": node_labels},
                    "spec": {
                        "serviceAccountName": node,
                        "hostPID": d.host_pid,
                        "priorityClassName": "system-node-critical",
                        "nodeSelector": d.nvidia_node_selector,
                        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                        "initContainers": [{
                            "name": "install-libvgpu",
                            "image": image,
                            "imagePullPolicy": v.image.pull_policy,
                            "command": ["/bin/sh", "-c", "install -m 0755 /usr/local/lib/vgpu/libvgpu_core.so /host-lib/libvgpu_core.so.new && mv -f /host-lib/libvgpu_core.so.new /host-lib/libvgpu_core.so && install -m 0755 /usr/local/lib/vgpu/libvgpu.so /host-lib/libvgpu.so.new && mv -f /host-lib/libvgpu.so.new /host-lib/libvgpu.so"],
                            "volumeMounts": [{"name": "lib", "mountPath": "/host-lib"}],
                        }],
                        "containers": [{
                            "name": "vgpu-node",
                            "image": image,
                            "imagePullPolicy": v.image.pull_policy,
                            "command": ["vgpu"],
                            "args": node_args(v),
                            "env": [
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                            ],
                            "securityContext": {"privileged": true},
                            "ports": [{"name": "metrics", "containerPort": d.monitor_port, "protocol": "TCP"}],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": d.monitor_port}, "periodSeconds": 30},
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": d.monitor_port}, "periodSeconds": 10},
                            "volumeMounts": [
                                {"name": "device-plugins", "mountPath": d.device_plugin_path},
                                // Not `lib` too: with the defaults it is this same
                                // directory, and the API server refuses two
                                // mounts at one path.
                                {"name": "hook", "mountPath": vgpu_dir},
                                {"name": "lock", "mountPath": "/tmp/vgpulock"},
                                {"name": "broker", "mountPath": d.broker_dir},
                            ],
                        }],
                        "volumes": [
                            host_path("device-plugins", &d.device_plugin_path, "Directory"),
                            host_path("hook", &vgpu_dir, "DirectoryOrCreate"),
                            host_path("lib", &d.lib_path, "DirectoryOrCreate"),
                            host_path("lock", "/tmp/vgpulock", "DirectoryOrCreate"),
                            host_path("broker", &d.broker_dir, "DirectoryOrCreate"),
                        ],
                    },
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
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": sched, "namespace": ns, "labels": sched_labels},
            "data": {"config.yaml": scheduler_yaml},
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": sched, "namespace": ns, "labels": sched_labels},
            "spec": {
                "replicas": v.scheduler.replicas,
                "selector": {"matchLabels": sched_labels},
                "template": {
                    "metadata": {"labels": {
                        "app.kubernetes.io/name": "vgpu",
                        "app.kubernetes.io/component": "vgpu-scheduler",
                        "hami.io/webhook": "ignore",
                    }},
                    "spec": {
                        "serviceAccountName": sched,
                        "priorityClassName": "system-cluster-critical",
                        "containers": [
                            {
                                "name": "kube-scheduler",
                                "image": v.scheduler.kube_scheduler_image,
                                "command": ["kube-scheduler", "--config=/config/config.yaml", "--leader-elect=false"],
                                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
                            },
                            {
                                "name": "vgpu-scheduler",
                                "image": image,
                                "imagePullPolicy": v.image.pull_policy,
                                "command": ["vgpu"],
                                "args": [
                                    "scheduler",
                                    format!("--http_bind=0.0.0.0:{}", v.scheduler.extender_port),
                                    "--cert_file=/tls/tls.crt".to_owned(),
                                    "--key_file=/tls/tls.key".to_owned(),
                                    format!("--metrics-bind-address=0.0.0.0:{}", v.scheduler.metrics_port),
                                    format!("--scheduler-name={}", v.scheduler_name),
                                    format!("--node-scheduler-policy={}", v.scheduler.default_scheduler_policy.node_scheduler_policy),
                                    format!("--gpu-scheduler-policy={}", v.scheduler.default_scheduler_policy.gpu_scheduler_policy),
                                    format!("--node-lock-expire={}", v.scheduler.node_lock_expire),
                                    format!("--resource-name={}", v.resource_name),
                                    format!("--resource-mem={}", v.resource_mem),
                                    format!("--resource-mem-percentage={}", v.resource_mem_percentage),
                                    format!("--resource-cores={}", v.resource_cores),
                                    format!("--resource-priority={}", v.resource_priority),
                                ],
                                "ports": [
                                    {"name": "https", "containerPort": v.scheduler.extender_port, "protocol": "TCP"},
                                    {"name": "metrics", "containerPort": v.scheduler.metrics_port, "protocol": "TCP"},
                                ],
                                "livenessProbe": {"httpGet": {"path": "/healthz", "port": v.scheduler.extender_port, "scheme": "HTTPS"}, "periodSeconds": 30},
                                "readinessProbe": {"httpGet": {"path": "/readyz", "port": v.scheduler.extender_port, "scheme": "HTTPS"}, "periodSeconds": 10},
                                "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                            },
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": sched}},
                            {"name": "tls", "secret": {"secretName": format!("{sched}-tls")}},
                        ],
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("{sched}-metrics"), "namespace": ns, "labels": sched_labels},
            "spec": {
                "selector": sched_labels,
                "ports": [{"name": "metrics", "port": v.scheduler.metrics_port, "targetPort": v.scheduler.metrics_port, "protocol": "TCP"}],
            },
        }),
    ]
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
