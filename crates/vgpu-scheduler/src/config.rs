//! What the operator chooses: resource names, HAMi's request defaults, the
//! default policies, the scheduler name, lock timing. Plain data with
//! HAMi v2.10's defaults; the CLI fills it from flags. Owns no behaviour.

use std::time::Duration;

use vgpu_hami::resources;

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
    /// How long a bind waits for another pod's node lock before failing.
    pub node_lock_wait: Duration,
    /// A `Requesting_` handshake older than this, on a node whose
    /// allocatable GPU count is 0, means its device plugin is gone.
    pub handshake_timeout: Duration,
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
            node_lock_wait: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(60),
        }
    }
}
