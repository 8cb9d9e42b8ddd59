//! What the operator chooses: resource names, HAMi's request defaults, the
//! default policies, the scheduler name, lock timing. Plain data with
//! HAMi v2.10's defaults; the CLI fills it from flags. Owns no behaviour.

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;
use vgpu_hami::resources;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("device config: {0}")]
    Yaml(String),
    #[error("device config: nvidia.{field} is {value}: {expected}")]
    Value {
        field: &'static str,
        value: i64,
        expected: &'static str,
    },
}

/// The `nvidia:` section of HAMi's `device-config.yaml` (the scheduler's
/// `--device-config-file`): the keys the scheduler and webhook use; the
/// device plugin's keys and other vendors' sections are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaDeviceConfig {
    resource_count_name: Option<String>,
    resource_memory_name: Option<String>,
    resource_memory_percentage_name: Option<String>,
    resource_core_name: Option<String>,
    resource_priority_name: Option<String>,
    overwrite_env: Option<bool>,
    default_memory: Option<i64>,
    default_cores: Option<i64>,
    #[serde(rename = "defaultGPUNum")]
    default_gpu_num: Option<i64>,
    memory_factor: Option<i64>,
    gpu_core_policy: Option<String>,
    runtime_class_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct DeviceConfigFile {
    nvidia: Option<NvidiaDeviceConfig>,
}

/// How a node is chosen among those that fit (`hami.io/node-scheduler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePolicy {
    /// Fill the busiest node first (HAMi's default).
    Binpack,
    /// Prefer the idlest node.
    Spread,
}

/// How GPUs are chosen on a node (`hami.io/gpu-scheduler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuPolicy {
    /// Fill the busiest GPU first.
    Binpack,
    /// Prefer the idlest GPU (HAMi's default).
    Spread,
}

impl NodePolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "binpack" => Some(Self::Binpack),
            "spread" => Some(Self::Spread),
            _ => None,
        }
    }
}

impl GpuPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "binpack" => Some(Self::Binpack),
            "spread" => Some(Self::Spread),
            _ => None,
        }
    }
}

/// The extended-resource names a container's limits are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    pub count: String,
    pub memory: String,
    pub memory_percentage: String,
    pub cores: String,
    pub priority: String,
}

impl Default for ResourceNames {
    fn default() -> Self {
        Self {
            count: resources::GPU.into(),
            memory: resources::GPU_MEMORY.into(),
            memory_percentage: resources::GPU_MEMORY_PERCENTAGE.into(),
            cores: resources::GPU_CORES.into(),
            priority: resources::PRIORITY.into(),
        }
    }
}

impl ResourceNames {
    /// Every name the extender manages (the `managedResources` list).
    pub fn all(&self) -> [&str; 5] {
        [
            &self.count,
            &self.memory,
            &self.memory_percentage,
            &self.cores,
            &self.priority,
        ]
    }
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub resources: ResourceNames,
    /// MiB per vGPU when a container asks for none (0: the whole card).
    pub default_memory_mib: u64,
    /// Core percent when a container asks for none.
    pub default_cores: u32,
    /// GPUs implied by a memory or core request without a count (webhook).
    pub default_gpu_num: u32,
    /// `nvidia.com/gpumem` is multiplied by this (HAMi's `memoryFactor`).
    pub memory_factor: u64,
    pub node_policy: NodePolicy,
    pub gpu_policy: GpuPolicy,
    /// Written into `spec.schedulerName` by the webhook (empty: leave it).
    pub scheduler_name: String,
    /// The webhook also takes pods whose scheduler is `default-scheduler`.
    pub force_overwrite_default_scheduler: bool,
    /// `GPU_CORE_UTILIZATION_POLICY` the webhook injects (`default`: none).
    pub gpu_core_policy: String,
    /// `spec.runtimeClassName` set on GPU pods that have none (empty: leave it).
    pub runtime_class_name: String,
    /// Containers without a GPU get `NVIDIA_VISIBLE_DEVICES=none`.
    pub overwrite_env: bool,
    /// A node lock older than this is broken (`HAMI_NODELOCK_EXPIRE`).
    pub node_lock_expiry: Duration,
    /// How long a bind waits for another pod's node lock before failing
    /// (HAMi's `--node-lock-retry-timeout`, 28 s: inside the extender's
    /// 30 s `httpTimeout`).
    pub node_lock_wait: Duration,
    /// A `Requesting_` handshake older than this, on a node whose
    /// allocatable GPU count is 0, means its device plugin is gone.
    pub handshake_timeout: Duration,
}

impl SchedulerConfig {
    /// Takes the keys of HAMi's `device-config.yaml` `nvidia:` section.
    pub fn apply_device_config(&mut self, yaml: &str) -> Result<(), ConfigError> {
        let file: DeviceConfigFile =
            serde_saphyr::from_str(yaml).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        let Some(n) = file.nvidia else {
            return Ok(());
        };
        let r = &mut self.resources;
        for (slot, value) in [
            (&mut r.count, n.resource_count_name),
            (&mut r.memory, n.resource_memory_name),
            (&mut r.memory_percentage, n.resource_memory_percentage_name),
            (&mut r.cores, n.resource_core_name),
            (&mut r.priority, n.resource_priority_name),
        ] {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                *slot = v;
            }
        }
        let bounded = |field, v: i64, max: i64, expected| {
            if (0..=max).contains(&v) {
                Ok(v)
            } else {
                Err(ConfigError::Value {
                    field,
                    value: v,
                    expected,
                })
            }
        };
        if let Some(v) = n.default_memory {
            self.default_memory_mib =
                bounded("defaultMemory", v, i32::MAX.into(), "MiB in 0..=2147483647")? as u64;
        }
        if let Some(v) = n.default_cores {
            self.default_cores = bounded("defaultCores", v, 100, "percent in 0..=100")? as u32;
        }
        if let Some(v) = n.default_gpu_num {
            self.default_gpu_num = bounded("defaultGPUNum", v, 1024, "0..=1024")? as u32;
        }
        if let Some(v) = n.memory_factor {
            self.memory_factor = bounded("memoryFactor", v, 1 << 20, "1..")?.max(1) as u64;
        }
        if let Some(v) = n.overwrite_env {
            self.overwrite_env = v;
        }
        if let Some(v) = n.gpu_core_policy.filter(|v| !v.is_empty()) {
            self.gpu_core_policy = v;
        }
        if let Some(v) = n.runtime_class_name {
            self.runtime_class_name = v;
        }
        Ok(())
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            resources: ResourceNames::default(),
            default_memory_mib: 0,
            default_cores: 0,
            default_gpu_num: 1,
            memory_factor: 1,
            node_policy: NodePolicy::Binpack,
            gpu_policy: GpuPolicy::Spread,
            scheduler_name: "hami-scheduler".into(),
            force_overwrite_default_scheduler: true,
            gpu_core_policy: "default".into(),
            runtime_class_name: String::new(),
            overwrite_env: false,
            node_lock_expiry: Duration::from_secs(300),
            node_lock_wait: Duration::from_secs(28),
            handshake_timeout: Duration::from_secs(60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lock_wait_defaults_to_hamis_retry_timeout() {
        // HAMi v2.10 cmd/scheduler: --node-lock-retry-timeout 28s, kept
        // under kube-scheduler's 30 s extender httpTimeout.
        assert_eq!(
            SchedulerConfig::default().node_lock_wait,
            Duration::from_secs(28)
        );
    }

    #[test]
    fn reads_hamis_device_config() {
        // The shape of HAMi's chart (templates/scheduler/device-configmap.yaml).
        let yaml = r#"
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: true
  defaultMemory: 2048
  defaultCores: 10
  defaultGPUNum: 1
  preConfiguredDeviceMemory: 0
  memoryFactor: 2
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  gpuCorePolicy: force
  libCudaLogLevel: 1
  runtimeClassName: ""
  migProfileAllowlist:
  - models: [ "A30" ]
    profiles: [ "1g.6gb", "2g.12gb" ]
cambricon:
  resourceCountName: cambricon.com/vmlu
"#;
        let mut cfg = SchedulerConfig::default();
        cfg.apply_device_config(yaml).unwrap();
        assert!(cfg.overwrite_env);
        assert_eq!(
            (cfg.default_memory_mib, cfg.default_cores, cfg.memory_factor),
            (2048, 10, 2)
        );
        assert_eq!(cfg.gpu_core_policy, "force");
        assert_eq!(cfg.resources, ResourceNames::default());
        let err = cfg
            .apply_device_config("nvidia:\n  defaultCores: 150\n")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "device config: nvidia.defaultCores is 150: percent in 0..=100"
        );
        assert!(cfg.apply_device_config("nvidia: [").is_err());
        let mut renamed = SchedulerConfig::default();
        renamed
            .apply_device_config("nvidia:\n  resourceCountName: example.com/vgpu\n")
            .unwrap();
        assert_eq!(renamed.resources.count, "example.com/vgpu");
    }
}
