//! `vgpu node`: the Kubernetes node agent (device plugin, node
//! registration, broker, monitor, watchdog, cache GC; see docs/node.md),
//! and `vgpu node manifests`: the objects the Helm chart renders.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use vgpu_node::config::{DeviceListStrategies, Enforce, Mode, NodeConfig};
use vgpu_node::layout::Layout;
use vgpu_node::manifests::{self, Release, Values};
use vgpu_region::limits::Policy;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<NodeCmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand)]
enum NodeCmd {
    /// Print the Kubernetes objects of a deployment (what deploy/helm/vgpu renders).
    Manifests(ManifestArgs),
}

#[derive(clap::Args)]
struct ManifestArgs {
    /// Helm values file (default: the chart's defaults).
    #[arg(long)]
    values: Option<PathBuf>,
    /// Release name (object name prefix).
    #[arg(long, default_value = "vgpu")]
    release: String,
    /// Namespace (the values' namespaceOverride wins).
    #[arg(long, default_value = "kube-system")]
    namespace: String,
    /// The cluster's Kubernetes version (Helm's `.Capabilities.KubeVersion`):
    /// the kube-scheduler image's tag when the values leave it empty.
    #[arg(long, default_value = manifests::DEFAULT_KUBE_VERSION)]
    kube_version: String,
    /// JSON (one array) instead of YAML documents.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// This node's name (default: $NODE_NAME).
    #[arg(long)]
    node_name: Option<String>,
    /// Extended resource to advertise (HAMi `resourceName`).
    #[arg(long, default_value = "nvidia.com/gpu")]
    resource_name: String,
    /// vGPUs per card (HAMi `devicePlugin.deviceSplitCount`).
    #[arg(long, default_value_t = 10)]
    device_split_count: u32,
    /// Registered memory = MiB x this (HAMi `deviceMemoryScaling`; > 1 over-commits).
    #[arg(long, default_value_t = 1.0)]
    device_memory_scaling: f64,
    /// Registered cores = 100 x this (HAMi `deviceCoreScaling`).
    #[arg(long, default_value_t = 1.0)]
    device_core_scaling: f64,
    /// HAMi `disablecorelimit`: containers get GPU_CORE_UTILIZATION_POLICY=disable.
    #[arg(long, default_value = "false")]
    disable_core_limit: String,
    /// GPU_CORE_UTILIZATION_POLICY for containers: default (not set), force, disable.
    #[arg(long, default_value = "default")]
    core_policy: String,
    /// LIBCUDA_LOG_LEVEL for containers (0 quiet .. 4 debug; unset = not set).
    #[arg(long)]
    lib_cuda_log_level: Option<u32>,
    /// Hook path on the host and in containers (HAMi `global.gpuHookPath`).
    #[arg(long, default_value = "/usr/local")]
    hook_path: PathBuf,
    /// Host path of libvgpu.so, with libvgpu_core.so beside it (default:
    /// <hook>/vgpu/libvgpu.so).
    #[arg(long)]
    lib_path: Option<PathBuf>,
    /// Kubelet device-plugin directory.
    #[arg(long, default_value = vgpu_node::proto::DEVICE_PLUGIN_DIR)]
    device_plugin_dir: PathBuf,
    /// This plugin's socket name in that directory.
    #[arg(long, default_value = "vgpu.sock")]
    socket_name: String,
    /// Host directory mounted at /tmp/vgpulock in containers.
    #[arg(long, default_value = "/tmp/vgpulock")]
    lock_dir: PathBuf,
    /// Host-PID broker socket (its directory is mounted read-only into pods).
    #[arg(long, default_value = vgpu_identity::server::DEFAULT_SOCKET)]
    broker_socket: PathBuf,
    /// Do not run the broker.
    #[arg(long)]
    no_broker: bool,
    /// Monitor address (/metrics, /healthz, /readyz).
    #[arg(long, default_value = "0.0.0.0:9394")]
    metrics_addr: std::net::SocketAddr,
    /// Also export HAMi's pre-v2.9 metric names.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    legacy_metrics: String,
    /// Watchdog action for a container over its limit: report (log, metric,
    /// Event), or also kill the GPU process its ledger accounts least for.
    #[arg(long, default_value = "report")]
    enforce: String,
    /// Driver memory above the limit tolerated (bytes or 128m, 1GiB).
    #[arg(long, default_value = "128m")]
    tolerance: String,
    /// How long a container stays over before --enforce kill acts (30s, 1m).
    #[arg(long, default_value = "30s")]
    grace: String,
    /// Watchdog period (the detection latency: one period).
    #[arg(long, default_value = "1s")]
    watchdog_interval: String,
    /// Cache GC: how long a gone pod's directories are kept.
    #[arg(long, default_value = "5m")]
    gc_grace: String,
    /// Cache GC and slot reclaim period.
    #[arg(long, default_value = "60s")]
    gc_interval: String,
    /// Node registration period.
    #[arg(long, default_value = "30s")]
    register_interval: String,
    /// Advertise each GPU's NUMA node to the kubelet (HAMi
    /// `devicePlugin.enableNumaTopology`; off: no topology, as HAMi). A GPU
    /// whose node sysfs does not tell gets no topology either way.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    enable_numa_topology: String,
    /// How the assigned GPUs reach the container runtime (NVIDIA
    /// k8s-device-plugin names, comma list): envvar, volume-mounts,
    /// cdi-annotations, cdi-cri.
    #[arg(long, default_value = "envvar")]
    device_list_strategy: String,
    /// Device health and kubelet-restart check period.
    #[arg(long, default_value = "1s")]
    health_interval: String,
    /// How often the pods bound to this node are listed.
    #[arg(long, default_value = "5s")]
    pod_refresh: String,
    /// Priority hold, percent ("none" = arbiter off): while a container
    /// with priority 0 is busy on a device, every container on it with a
    /// priority of 1 or more gets `hold N` in its limits file (it paces at
    /// min(its SM limit, N)); removed after --priority-grace without one.
    #[arg(long, default_value = "10")]
    priority_hold: String,
    /// Utilization (percent) at or above which a priority-0 container is busy.
    #[arg(long, default_value_t = 5)]
    priority_busy: u32,
    /// How long a hold outlives the last busy sample of the priority-0 container.
    #[arg(long, default_value = "2s")]
    priority_grace: String,
    /// The priority arbiter's period.
    #[arg(long, default_value = "500ms")]
    priority_interval: String,
    /// NVML library to load (default: libnvidia-ml.so.1 via the loader).
    #[arg(long)]
    nvml_library: Option<PathBuf>,
    /// Kubeconfig (default: in-cluster, then KUBECONFIG).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Log level: error, warn, info, debug.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// How GPUs reach pods: device-plugin (the kubelet device plugin and
    /// HAMi's node registration), dra (the DRA kubelet plugin and its
    /// ResourceSlice; docs/dra.md) or both. The monitor, watchdog, GC and
    /// broker run in every mode.
    #[arg(long, default_value = "device-plugin")]
    mode: String,
    /// DRA: the driver name (ResourceSlice driver, DeviceClass, CDI vendor).
    #[arg(long, default_value = vgpu_dra::DEFAULT_DRIVER)]
    dra_driver_name: String,
    /// DRA: the kubelet's plugin registry (`<dir>/<driver>-reg.sock`).
    #[arg(long, default_value = vgpu_dra::DEFAULT_REGISTRY_DIR)]
    dra_registry_dir: PathBuf,
    /// DRA: the driver's directory (`dra.sock`, the checkpoint; default
    /// /var/lib/kubelet/plugins/<driver>).
    #[arg(long)]
    dra_plugin_dir: Option<PathBuf>,
    /// DRA: where the per-claim transient CDI specs go.
    #[arg(long, default_value = vgpu_dra::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
    /// Check the settings, print them and exit (nothing is started).
    #[arg(long)]
    check: bool,
    /// HAMi's device plugin takes klog's `-v=N` (its chart's default extra
    /// argument): accepted and ignored (--log-level sets vgpu's).
    #[arg(short = 'v', hide = true)]
    klog_verbosity: Option<String>,
}

/// `500ms`, `30s`, `5m`, `1h`, or plain seconds.
fn duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let (num, mult_ms) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1u64)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (t, 1000)
    };
    let v: u64 = num
        .parse()
        .with_context(|| format!("duration {s:?}: expected e.g. 500ms, 30s, 5m"))?;
    Ok(Duration::from_millis(v.saturating_mul(mult_ms)))
}

fn go_bool(s: &str, what: &str) -> anyhow::Result<bool> {
    vgpu_hami::keys::parse_go_bool(s)
        .with_context(|| format!("{what} {s:?}: expected true or false"))
}

fn config(a: RunArgs) -> anyhow::Result<(NodeConfig, vgpu_dra::DraFlags, String, bool)> {
    let node = a
        .node_name
        .or_else(|| std::env::var(vgpu_hami::keys::ENV_NODE_NAME).ok())
        .filter(|n| !n.is_empty())
        .context("--node-name (or NODE_NAME) is required")?;
    let mut c = NodeConfig::new(node);
    c.resource_name = a.resource_name;
    if a.device_split_count == 0 {
        bail!("--device-split-count must be at least 1");
    }
    c.split_count = a.device_split_count;
    if !(a.device_memory_scaling > 0.0 && a.device_core_scaling > 0.0) {
        bail!("--device-memory-scaling and --device-core-scaling must be positive");
    }
    c.memory_scaling = a.device_memory_scaling;
    c.core_scaling = a.device_core_scaling;
    c.core_policy = match (
        go_bool(&a.disable_core_limit, "--disable-core-limit")?,
        a.core_policy.as_str(),
    ) {
        (true, _) | (false, "disable") => Some(Policy::Disable),
        (false, "force") => Some(Policy::Force),
        (false, "default") => None,
        (false, other) => bail!("--core-policy {other:?}: expected default, force or disable"),
    };
    c.log_level = a.lib_cuda_log_level.map(|l| l.to_string());
    c.layout = Layout::new(a.hook_path);
    c.lib_path = a.lib_path.unwrap_or_else(|| c.layout.container_lib());
    c.device_plugin_dir = a.device_plugin_dir;
    c.socket_name = a.socket_name;
    c.lock_dir = a.lock_dir;
    c.broker_socket = (!a.no_broker).then_some(a.broker_socket);
    c.metrics_addr = a.metrics_addr;
    c.legacy_metrics = go_bool(&a.legacy_metrics, "--legacy-metrics")?;
    c.enforce = match a.enforce.as_str() {
        "report" => Enforce::Report,
        "kill" => Enforce::Kill,
        o => bail!("--enforce {o:?}: expected report or kill"),
    };
    c.tolerance_bytes = vgpu_region::units::parse_mem_size(&a.tolerance)
        .with_context(|| format!("--tolerance {:?}", a.tolerance))?;
    c.grace = duration(&a.grace)?;
    c.watchdog_interval = duration(&a.watchdog_interval)?;
    c.gc_grace = duration(&a.gc_grace)?;
    c.gc_interval = duration(&a.gc_interval)?;
    c.register_interval = duration(&a.register_interval)?;
    c.health_interval = duration(&a.health_interval)?;
    c.numa_topology = go_bool(&a.enable_numa_topology, "--enable-numa-topology")?;
    c.device_list = DeviceListStrategies::parse(&a.device_list_strategy)
        .with_context(|| format!("--device-list-strategy {:?}", a.device_list_strategy))?;
    c.pod_refresh = duration(&a.pod_refresh)?;
    c.priority_hold = match a.priority_hold.trim() {
        h if h.eq_ignore_ascii_case("none") => None,
        h => match h.trim_end_matches('%').parse::<u32>() {
            Ok(n) if n <= 100 => Some(n),
            _ => bail!("--priority-hold {h:?}: expected a percent 0..=100 or none"),
        },
    };
    if a.priority_busy == 0 || a.priority_busy > 100 {
        bail!("--priority-busy must be 1..=100");
    }
    c.priority_busy_percent = a.priority_busy;
    c.priority_grace = duration(&a.priority_grace)?;
    c.priority_interval = duration(&a.priority_interval)?;
    if c.priority_interval.is_zero() {
        bail!("--priority-interval must be positive");
    }
    c.nvml_library = a.nvml_library;
    c.kubeconfig = a.kubeconfig;
    c.mode = Mode::parse(&a.mode)?;
    if a.dra_driver_name.is_empty()
        || a.dra_driver_name.len() > 63
        || !a.dra_driver_name.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
        })
    {
        bail!(
            "--dra-driver-name {:?}: expected a DNS subdomain of at most 63 characters (e.g. vgpu.io)",
            a.dra_driver_name
        );
    }
    let dra = vgpu_dra::DraFlags {
        driver: a.dra_driver_name,
        registry_dir: a.dra_registry_dir,
        plugin_dir: a.dra_plugin_dir,
        cdi_dir: a.cdi_dir,
    };
    Ok((c, dra, a.log_level, a.check))
}

fn manifests_cmd(a: ManifestArgs) -> anyhow::Result<ExitCode> {
    let values: Values = match &a.values {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Values::from_yaml(&text)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("values {}", p.display()))?
        }
        None => Values::default(),
    };
    let objects = manifests::render(
        &values,
        &Release {
            name: a.release,
            namespace: a.namespace,
            kube_version: a.kube_version,
        },
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&objects)?);
    } else {
        print!("{}", manifests::to_yaml(&objects));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(NodeCmd::Manifests(m)) = args.cmd {
        return manifests_cmd(m);
    }
    let (cfg, dra, level, check) = config(args.run)?;
    if check {
        println!("{cfg:#?}");
        if cfg.mode.dra() {
            println!(
                "{:#?}",
                dra.config(
                    &cfg.node_name,
                    vgpu_node::allocate::AllocSettings::from_config(&cfg)
                )
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let level: tracing::Level = level.parse().map_err(|_| {
        anyhow::anyhow!("--log-level {level:?}: expected error, warn, info or debug")
    })?;
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let extra: Option<vgpu_node::agent::Extra> = cfg.mode.dra().then(|| {
        Box::new(move |ctx: vgpu_node::agent::AgentContext| {
            let f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> =
                Box::pin(vgpu_dra::run(ctx, dra));
            f
        }) as vgpu_node::agent::Extra
    });
    rt.block_on(vgpu_node::agent::run_with(cfg, extra))
        .context("vgpu node")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(duration("2").unwrap(), Duration::from_secs(2));
        assert!(duration("soon").is_err());
    }
}
