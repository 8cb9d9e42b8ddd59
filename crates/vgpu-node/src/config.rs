//! The agent's settings, one struct for every part (the CLI builds it from
//! flags, the manifests render the same flags). HAMi's Helm value names are
//! noted beside the fields that mean the same.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use vgpu_region::limits::Policy;

use crate::layout::Layout;

/// What the watchdog does with a container over its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforce {
    /// Export metrics and log (default).
    Report,
    /// Also SIGKILL the container's GPU process its ledger accounts least
    /// for after the grace, and record a Kubernetes Event.
    Kill,
}

/// Which kubelet interface hands GPUs to pods (`vgpu node --mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The device plugin and HAMi's node registration (default).
    #[default]
    DevicePlugin,
    /// The DRA kubelet plugin only: no device plugin, no HAMi registration.
    Dra,
    /// Both.
    Both,
}

impl Mode {
    /// `device-plugin`, `dra` or `both`.
    pub fn parse(s: &str) -> Result<Mode, ConfigError> {
        match s {
            "device-plugin" => Ok(Mode::DevicePlugin),
            "dra" => Ok(Mode::Dra),
            "both" => Ok(Mode::Both),
            o => Err(ConfigError::Mode(o.to_owned())),
        }
    }

    /// The device plugin and HAMi's registration run.
    pub fn device_plugin(self) -> bool {
        matches!(self, Mode::DevicePlugin | Mode::Both)
    }

    /// The DRA driver runs.
    pub fn dra(self) -> bool {
        matches!(self, Mode::Dra | Mode::Both)
    }
}

/// A setting that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not one of NVIDIA's device-list strategies.
    #[error("unknown device-list strategy {0:?}: expected envvar, volume-mounts, cdi-annotations or cdi-cri")]
    DeviceListStrategy(String),
    /// Not a mode.
    #[error("--mode {0:?}: expected device-plugin, dra or both")]
    Mode(String),
    /// An empty strategy list.
    #[error("empty device-list strategy: name at least one of envvar, volume-mounts, cdi-annotations, cdi-cri")]
    NoDeviceListStrategy,
}

/// How Allocate hands the assigned GPUs to the container runtime: the
/// strategies of NVIDIA's k8s-device-plugin (`--device-list-strategy`,
/// HAMi's `devicePlugin.deviceListStrategy`), any combination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceListStrategies {
    /// `envvar`: `NVIDIA_VISIBLE_DEVICES=<uuids>` (default).
    pub envvar: bool,
    /// `volume-mounts`: `/dev/null` mounted at
    /// `/var/run/nvidia-container-devices/<uuid>` per GPU and
    /// `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` (the
    /// runtime reads the list from the mount points, which an unprivileged
    /// pod cannot forge through its own env).
    pub volume_mounts: bool,
    /// `cdi-annotations`: the container annotation
    /// `cdi.k8s.io/vgpu_<pod UID>` = `nvidia.com/gpu=<uuid>,…`.
    pub cdi_annotations: bool,
    /// `cdi-cri`: the response's `cdi_devices` (`nvidia.com/gpu=<uuid>`).
    pub cdi_cri: bool,
}

impl Default for DeviceListStrategies {
    fn default() -> Self {
        DeviceListStrategies {
            envvar: true,
            volume_mounts: false,
            cdi_annotations: false,
            cdi_cri: false,
        }
    }
}

impl DeviceListStrategies {
    /// A comma list of NVIDIA's names (`envvar,cdi-cri`).
    pub fn parse(list: &str) -> Result<DeviceListStrategies, ConfigError> {
        let mut s = DeviceListStrategies {
            envvar: false,
            volume_mounts: false,
            cdi_annotations: false,
            cdi_cri: false,
        };
        let mut any = false;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "envvar" => s.envvar = true,
                "volume-mounts" => s.volume_mounts = true,
                "cdi-annotations" => s.cdi_annotations = true,
                "cdi-cri" => s.cdi_cri = true,
                other => return Err(ConfigError::DeviceListStrategy(other.to_owned())),
            }
            any = true;
        }
        if !any {
            return Err(ConfigError::NoDeviceListStrategy);
        }
        Ok(s)
    }

    /// Only CDI strategies: as NVIDIA's plugin, no `NVIDIA_VISIBLE_DEVICES`
    /// at all (the CDI spec injects the devices).
    pub fn cdi_only(&self) -> bool {
        !self.envvar && !self.volume_mounts
    }
}

/// Every setting.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's name (`NODE_NAME`).
    pub node_name: String,
    /// Extended resource (`resourceName`, default `nvidia.com/gpu`).
    pub resource_name: String,
    /// vGPUs per card (`devicePlugin.deviceSplitCount`, default 10).
    pub split_count: u32,
    /// `devicePlugin.deviceMemoryScaling` (default 1).
    pub memory_scaling: f64,
    /// `devicePlugin.deviceCoreScaling` (default 1).
    pub core_scaling: f64,
    /// Host and container hook path (`global.gpuHookPath`, default `/usr/local`).
    pub layout: Layout,
    /// Host path of libvgpu.so (`devicePlugin.libPath`; default `<hook>/vgpu/libvgpu.so`).
    pub lib_path: PathBuf,
    /// Kubelet device-plugin directory.
    pub device_plugin_dir: PathBuf,
    /// This plugin's socket name in that directory.
    pub socket_name: String,
    /// Host directory mounted at `/tmp/vgpulock`.
    pub lock_dir: PathBuf,
    /// Broker socket (`None` = broker off).
    pub broker_socket: Option<PathBuf>,
    /// `LIBCUDA_LOG_LEVEL` for containers (`devices.nvidia.libCudaLogLevel`).
    pub log_level: Option<String>,
    /// `GPU_CORE_UTILIZATION_POLICY` for containers (`devices.nvidia.gpuCorePolicy`;
    /// `devicePlugin.disablecorelimit` = `disable`).
    pub core_policy: Option<Policy>,
    /// Monitor listen address (`:9394`).
    pub metrics_addr: SocketAddr,
    /// Also export HAMi's pre-v2.9 metric names (`--legacy-metrics`).
    pub legacy_metrics: bool,
    /// Watchdog action.
    pub enforce: Enforce,
    /// Driver memory above the limit tolerated before a container counts as over.
    pub tolerance_bytes: u64,
    /// How long a container must stay over before it is enforced.
    pub grace: Duration,
    /// Watchdog period.
    pub watchdog_interval: Duration,
    /// Cache GC: how long a gone pod's directory is kept (HAMi: 5 min).
    pub gc_grace: Duration,
    /// Cache GC period.
    pub gc_interval: Duration,
    /// Node registration period (HAMi: 30 s).
    pub register_interval: Duration,
    /// Advertise each device's NUMA node to the kubelet (HAMi's
    /// `devicePlugin.enableNumaTopology`, default off).
    pub numa_topology: bool,
    /// How the assigned GPUs reach the container runtime.
    pub device_list: DeviceListStrategies,
    /// Device health check and kubelet watch period.
    pub health_interval: Duration,
    /// How often the pods bound to this node are listed for the monitor
    /// and the watchdog.
    pub pod_refresh: Duration,
    /// The priority arbiter's hold, percent (`devicePlugin.priorityHold`;
    /// `None`: the arbiter is off). Default 10.
    pub priority_hold: Option<u32>,
    /// Utilization at or above which a high-priority container counts as
    /// busy, percent. Default 5.
    pub priority_busy_percent: u32,
    /// How long after its high-priority container was last busy a hold is
    /// kept (hysteresis). Default 2 s.
    pub priority_grace: Duration,
    /// The arbiter's period. Default 500 ms.
    pub priority_interval: Duration,
    /// NVML library to load (default: `libnvidia-ml.so.1` through the loader).
    pub nvml_library: Option<PathBuf>,
    /// Kubernetes API: a kubeconfig path (default: in-cluster, then `KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// Device plugin, DRA driver or both.
    pub mode: Mode,
}

impl NodeConfig {
    /// Defaults for `node_name`, as HAMi's chart sets them.
    pub fn new(node_name: impl Into<String>) -> NodeConfig {
        let layout = Layout::new("/usr/local");
        NodeConfig {
            node_name: node_name.into(),
            resource_name: vgpu_hami::resources::GPU.to_owned(),
            split_count: 10,
            memory_scaling: 1.0,
            core_scaling: 1.0,
            lib_path: layout.container_lib(),
            layout,
            device_plugin_dir: PathBuf::from(crate::proto::DEVICE_PLUGIN_DIR),
            socket_name: "vgpu.sock".into(),
            lock_dir: PathBuf::from(crate::layout::LOCK_DIR),
            broker_socket: Some(PathBuf::from(vgpu_identity::server::DEFAULT_SOCKET)),
            log_level: None,
            core_policy: None,
            metrics_addr: SocketAddr::from(([0, 0, 0, 0], 9394)),
            legacy_metrics: false,
            enforce: Enforce::Report,
            tolerance_bytes: 128 << 20,
            grace: Duration::from_secs(30),
            watchdog_interval: Duration::from_secs(1),
            gc_grace: Duration::from_secs(300),
            gc_interval: Duration::from_secs(60),
            register_interval: Duration::from_secs(30),
            numa_topology: false,
            device_list: DeviceListStrategies::default(),
            health_interval: Duration::from_secs(1),
            pod_refresh: Duration::from_secs(5),
            priority_hold: Some(10),
            priority_busy_percent: 5,
            priority_grace: Duration::from_secs(2),
            priority_interval: Duration::from_millis(500),
            nvml_library: None,
            kubeconfig: None,
            mode: Mode::DevicePlugin,
        }
    }

    /// The registration arithmetic settings.
    pub fn scaling(&self) -> vgpu_hami::register::RegisterScaling {
        vgpu_hami::register::RegisterScaling {
            split_count: self.split_count,
            memory_scaling: self.memory_scaling,
            core_scaling: self.core_scaling,
        }
    }

    /// The priority arbiter's rule (`None`: off).
    pub fn priority_rule(&self) -> Option<crate::priority::Rule> {
        self.priority_hold.map(|hold| crate::priority::Rule {
            hold,
            busy_ppm: self.priority_busy_percent.saturating_mul(10_000),
            grace: self.priority_grace,
        })
    }

    /// The plugin socket's path.
    pub fn plugin_socket(&self) -> PathBuf {
        self.device_plugin_dir.join(&self.socket_name)
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.device_plugin_dir.join(crate::proto::KUBELET_SOCKET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_list_strategies_as_nvidia_names_them() {
        assert_eq!(
            DeviceListStrategies::parse("envvar"),
            Ok(DeviceListStrategies::default())
        );
        let s = DeviceListStrategies::parse("volume-mounts, cdi-annotations,cdi-cri").unwrap();
        assert!(!s.envvar && s.volume_mounts && s.cdi_annotations && s.cdi_cri);
        assert!(!s.cdi_only());
        assert!(DeviceListStrategies::parse("cdi-cri").unwrap().cdi_only());
        assert_eq!(
            DeviceListStrategies::parse("envvar,cdi"),
            Err(ConfigError::DeviceListStrategy("cdi".into()))
        );
        assert_eq!(
            DeviceListStrategies::parse(" , "),
            Err(ConfigError::NoDeviceListStrategy)
        );
    }
}
