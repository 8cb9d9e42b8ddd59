//! What a pod asks for, read the way HAMi's users write it: per container
//! `nvidia.com/gpu` (count), `nvidia.com/gpumem` (MiB),
//! `nvidia.com/gpumem-percentage`, `nvidia.com/gpucores` (percent, 100 =
//! the whole card), and per pod the `nvidia.com/use-gputype`,
//! `nouse-gputype`, `use-gpuuuid`, `nouse-gpuuuid`, `numa-bind`,
//! `vgpu-mode` and `hami.io/{gpu,node}-scheduler-policy` annotations.
//!
//! One reading serves the webhook (which writes the defaults it implies
//! into the pod) and the extender (which must reach the same numbers
//! whether or not the webhook ran). Malformed input is an error with the
//! container and resource named, never a silent clamp.

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;

use crate::config::{GpuPolicy, NodePolicy, SchedulerConfig};
use crate::quantity::{self, QuantityError};
use vgpu_hami::keys;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("container {container:?}: {resource}: {source}")]
    Quantity {
        container: String,
        resource: String,
        source: QuantityError,
    },
    #[error("container {container:?}: {resource} is {value}, must not be negative")]
    Negative {
        container: String,
        resource: String,
        value: i64,
    },
    #[error("container {container:?}: {resource} is {value}, must be at most {max}")]
    TooLarge {
        container: String,
        resource: String,
        value: i64,
        max: i64,
    },
    #[error(
        "container {container:?} asks for {resource} but not {count}: add {count} \
         (the vgpu webhook adds it when the pod is admitted through it)"
    )]
    MissingCount {
        container: String,
        resource: String,
        count: String,
    },
    #[error("annotation {key}={value:?}: {expected}")]
    Annotation {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Device memory for one vGPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    MiB(u64),
    /// Percent of each chosen card's memory (100: all of it).
    Percent(u32),
}

impl Memory {
    /// MiB this request takes on a card with `total_mib`.
    pub fn on_card(self, total_mib: u64) -> u64 {
        match self {
            Memory::MiB(m) => m,
            Memory::Percent(p) => total_mib * u64::from(p) / 100,
        }
    }
}

/// One container's GPU request: `count` distinct GPUs, each with `memory`
/// and `cores` percent of its SMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRequest {
    pub count: u32,
    pub memory: Memory,
    pub cores: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    pub name: String,
    /// Init containers run one after another, before the app containers.
    pub init: bool,
    pub gpu: Option<GpuRequest>,
}

/// Which cards a pod accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSelector {
    /// Case-insensitive substrings of the card type (any must match).
    pub use_types: Vec<String>,
    pub nouse_types: Vec<String>,
    /// Exact UUIDs.
    pub use_uuids: Vec<String>,
    pub nouse_uuids: Vec<String>,
    /// `nvidia.com/vgpu-mode`: the card's mode must be a substring of it.
    pub mode: Option<String>,
}

impl DeviceSelector {
    pub fn type_allowed(&self, card_type: &str) -> bool {
        let card = card_type.to_uppercase();
        let hit = |list: &[String]| list.iter().any(|t| card.contains(&t.to_uppercase()));
        (self.use_types.is_empty() || hit(&self.use_types)) && !hit(&self.nouse_types)
    }

    pub fn uuid_allowed(&self, uuid: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.iter().any(|u| u == uuid))
            && !self.nouse_uuids.iter().any(|u| u == uuid)
    }

    pub fn mode_allowed(&self, mode: &str) -> bool {
        self.mode.as_deref().is_none_or(|m| m.contains(mode))
    }
}

/// Everything the placement needs to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Init containers first, then app containers: the order of the
    /// device-list annotation.
    pub containers: Vec<ContainerRequest>,
    pub selector: DeviceSelector,
    pub gpu_policy: GpuPolicy,
    pub node_policy: NodePolicy,
    /// All GPUs of one container on one NUMA node.
    pub numa_bind: bool,
    /// `mutex` GPU policy: only GPUs nobody uses.
    pub idle_gpus_only: bool,
}

impl PodRequest {
    /// The pod's request, `None` when it asks for no GPU at all.
    pub fn from_pod(pod: &Pod, cfg: &SchedulerConfig) -> Result<Option<Self>, RequestError> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(None);
        };
        let mut containers = Vec::new();
        let inits = spec.init_containers.iter().flatten().map(|c| (c, true));
        for (ctr, init) in inits.chain(spec.containers.iter().map(|c| (c, false))) {
            containers.push(ContainerRequest {
                name: ctr.name.clone(),
                init,
                gpu: container_request(ctr, cfg)?,
            });
        }
        if containers.iter().all(|c| c.gpu.is_none()) {
            return Ok(None);
        }
        let annotations = pod.metadata.annotations.as_ref();
        let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
        let list = |key: &str| -> Vec<String> {
            get(key)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let selector = DeviceSelector {
            use_types: list(keys::USE_GPU_TYPE),
            nouse_types: list(keys::NOUSE_GPU_TYPE),
            use_uuids: list(keys::USE_GPU_UUID),
            nouse_uuids: list(keys::NOUSE_GPU_UUID),
            mode: get(keys::VGPU_MODE).map(str::to_owned),
        };
        let numa_bind = match get(keys::NUMA_BIND) {
            None => false,
            Some(v) => keys::parse_go_bool(v).ok_or_else(|| RequestError::Annotation {
                key: keys::NUMA_BIND,
                value: v.to_owned(),
                expected: "expected true or false",
            })?,
        };
        let node_policy = match get(keys::NODE_SCHEDULER_POLICY) {
            None => cfg.node_policy,
            Some(v) => NodePolicy::parse(v).ok_or_else(|| RequestError::Annotation {
                key: keys::NODE_SCHEDULER_POLICY,
                value: v.to_owned(),
                expected: "expected binpack or spread",
            })?,
        };
        let (gpu_policy, idle_gpus_only) = match get(keys::GPU_SCHEDULER_POLICY) {
            None => (cfg.gpu_policy, false),
            Some(v) => {
                parse_gpu_policy(v, cfg.gpu_policy).ok_or_else(|| RequestError::Annotation {
                    key: keys::GPU_SCHEDULER_POLICY,
                    value: v.to_owned(),
                    expected: "expected binpack, spread, numa or mutex (comma-separated); \
                               topology-aware is not supported",
                })?
            }
        };
        Ok(Some(Self {
            containers,
            selector,
            gpu_policy,
            node_policy,
            numa_bind,
            idle_gpus_only,
        }))
    }

    /// The most GPUs one container asks for (a node with fewer cards can
    /// never fit the pod).
    pub fn max_count(&self) -> u32 {
        self.containers
            .iter()
            .filter_map(|c| c.gpu.map(|g| g.count))
            .max()
            .unwrap_or(0)
    }
}

/// HAMi's chain syntax (`binpack,numa`): the first of binpack/spread is the
/// order; `numa` only breaks ties (we always do); `mutex` is a filter.
fn parse_gpu_policy(v: &str, default: GpuPolicy) -> Option<(GpuPolicy, bool)> {
    let mut order = None;
    let mut mutex = false;
    for token in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match token {
            "numa" => {}
            "mutex" => mutex = true,
            other => {
                let p = GpuPolicy::parse(other)?;
                order.get_or_insert(p);
            }
        }
    }
    Some((order.unwrap_or(default), mutex))
}

/// A resource's integer value, limits first, then requests (as HAMi reads it).
pub fn resource_value(ctr: &Container, name: &str) -> Option<Result<i64, QuantityError>> {
    let res = ctr.resources.as_ref()?;
    let q = res
        .limits
        .as_ref()
        .and_then(|l| l.get(name))
        .or_else(|| res.requests.as_ref().and_then(|r| r.get(name)))?;
    Some(quantity::parse_int(&q.0))
}

/// One container's GPU request with HAMi's defaults applied.
pub fn container_request(
    ctr: &Container,
    cfg: &SchedulerConfig,
) -> Result<Option<GpuRequest>, RequestError> {
    let names = &cfg.resources;
    let read = |resource: &str| -> Result<Option<i64>, RequestError> {
        match resource_value(ctr, resource) {
            None => Ok(None),
            Some(Ok(v)) if v < 0 => Err(RequestError::Negative {
                container: ctr.name.clone(),
                resource: resource.to_owned(),
                value: v,
            }),
            Some(Ok(v)) => Ok(Some(v)),
            Some(Err(source)) => Err(RequestError::Quantity {
                container: ctr.name.clone(),
                resource: resource.to_owned(),
                source,
            }),
        }
    };
    let too_large = |resource: &str, value: i64, max: i64| RequestError::TooLarge {
        container: ctr.name.clone(),
        resource: resource.to_owned(),
        value,
        max,
    };
    let count = read(&names.count)?;
    let memory = read(&names.memory)?;
    let percentage = read(&names.memory_percentage)?;
    let cores = read(&names.cores)?;
    let count = match count {
        Some(n) => n,
        None => {
            // HAMi's webhook adds the count for a memory or core request;
            // without it kubelet never calls the device plugin, so the
            // container would run with no limit: refuse instead.
            let asked = [
                (&names.memory, memory),
                (&names.memory_percentage, percentage),
                (&names.cores, cores),
            ];
            if let Some((resource, _)) = asked.iter().find(|(_, v)| v.is_some()) {
                return Err(RequestError::MissingCount {
                    container: ctr.name.clone(),
                    resource: (*resource).clone(),
                    count: names.count.clone(),
                });
            }
            return Ok(None);
        }
    };
    if count == 0 {
        return Ok(None);
    }
    let count = u32::try_from(count).map_err(|_| too_large(&names.count, count, 1024))?;
    if count > 1024 {
        return Err(too_large(&names.count, count.into(), 1024));
    }
    if let Some(c) = cores.filter(|&c| c > 100) {
        return Err(too_large(&names.cores, c, 100));
    }
    if let Some(p) = percentage.filter(|&p| p > 100) {
        return Err(too_large(&names.memory_percentage, p, 100));
    }
    let factor = cfg.memory_factor.max(1);
    let mem_mib = match memory {
        // HAMi keeps MiB in an int32; more is refused, never wrapped.
        Some(m) if m as u64 > i32::MAX as u64 / factor => {
            return Err(too_large(
                &names.memory,
                m,
                (i32::MAX as u64 / factor) as i64,
            ));
        }
        Some(m) => m as u64 * factor,
        None => 0,
    };
    // 0 means unset for both, as in HAMi (a 0 limit would mean "none").
    let percent = percentage.filter(|&p| p > 0).map(|p| p as u32);
    let memory = match (mem_mib, percent) {
        (m, _) if m > 0 => Memory::MiB(m),
        (_, Some(p)) => Memory::Percent(p),
        _ if cfg.default_memory_mib > 0 => Memory::MiB(cfg.default_memory_mib),
        _ => Memory::Percent(100),
    };
    let cores = match cores {
        Some(c) => c as u32,
        // A whole card with no core request is an exclusive card.
        None if memory == Memory::Percent(100) => 100,
        None => cfg.default_cores,
    };
    Ok(Some(GpuRequest {
        count,
        memory,
        cores,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn one(limits: serde_json::Value) -> Result<Option<GpuRequest>, RequestError> {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "main", "resources": {"limits": limits}}]}}));
        PodRequest::from_pod(&p, &SchedulerConfig::default())
            .map(|r| r.and_then(|r| r.containers[0].gpu))
    }

    #[test]
    fn hami_defaults() {
        let req = |count, memory, cores| {
            Ok(Some(GpuRequest {
                count,
                memory,
                cores,
            }))
        };
        // Count alone: the whole card, exclusively (HAMi's webhook sets 100 cores).
        assert_eq!(
            one(json!({"nvidia.com/gpu": "1"})),
            req(1, Memory::Percent(100), 100)
        );
        // Memory: MiB; canonical "3k" = 3000; cores default 0.
        assert_eq!(
            one(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3k"})),
            req(2, Memory::MiB(3000), 0)
        );
        assert_eq!(
            one(
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25",
                       "nvidia.com/gpucores": "30"})
            ),
            req(1, Memory::Percent(25), 30)
        );
        // Memory wins over a percentage; 100 % without cores is exclusive.
        assert_eq!(
            one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000",
                       "nvidia.com/gpumem-percentage": "50"})),
            req(1, Memory::MiB(1000), 0)
        );
        assert_eq!(
            one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"})),
            req(1, Memory::Percent(100), 100)
        );
        // 0 memory is "unset" (whole card), 0 percentage too.
        assert_eq!(
            one(
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0", "nvidia.com/gpucores": "20"})
            ),
            req(1, Memory::Percent(100), 20)
        );
        // No GPU at all; count 0 is no GPU.
        assert_eq!(one(json!({"cpu": "1"})), Ok(None));
        assert_eq!(one(json!({"nvidia.com/gpu": "0"})), Ok(None));
    }

    #[test]
    fn configured_defaults_and_memory_factor() {
        let cfg = SchedulerConfig {
            default_memory_mib: 2048,
            default_cores: 10,
            memory_factor: 4,
            ..SchedulerConfig::default()
        };
        let ctr = |limits: serde_json::Value| -> Container {
            serde_json::from_value(json!({"name": "c", "resources": {"limits": limits}})).unwrap()
        };
        assert_eq!(
            container_request(&ctr(json!({"nvidia.com/gpu": "1"})), &cfg),
            Ok(Some(GpuRequest {
                count: 1,
                memory: Memory::MiB(2048),
                cores: 10
            }))
        );
        assert_eq!(
            container_request(
                &ctr(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})),
                &cfg
            ),
            Ok(Some(GpuRequest {
                count: 1,
                memory: Memory::MiB(400),
                cores: 10
            }))
        );
    }

    #[test]
    fn requests_read_when_limits_are_absent() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "main", "resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "512"}}}]}}));
        let r = PodRequest::from_pod(&p, &SchedulerConfig::default())
            .unwrap()
            .unwrap();
        assert_eq!(r.containers[0].gpu.unwrap().memory, Memory::MiB(512));
    }

    #[test]
    fn malformed_requests_are_refused_with_reasons() {
        let cases = [
            (json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-5"}),
             "container \"main\": nvidia.com/gpumem is -5, must not be negative"),
            (json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
             "container \"main\": nvidia.com/gpucores is 150, must be at most 100"),
            (json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"}),
             "container \"main\": nvidia.com/gpumem-percentage is 101, must be at most 100"),
            (json!({"nvidia.com/gpu": "-1"}),
             "container \"main\": nvidia.com/gpu is -1, must not be negative"),
            (json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4294967296"}),
             "container \"main\": nvidia.com/gpumem is 4294967296, must be at most 2147483647"),
            (json!({"nvidia.com/gpu": "1.5"}),
             "container \"main\": nvidia.com/gpu: quantity \"1.5\" is not a whole number"),
            (json!({"nvidia.com/gpumem": "1000"}),
             "container \"main\" asks for nvidia.com/gpumem but not nvidia.com/gpu: add nvidia.com/gpu (the vgpu webhook adds it when the pod is admitted through it)"),
        ];
        for (limits, want) in cases {
            let err = one(limits.clone()).unwrap_err();
            assert_eq!(err.to_string(), want, "{limits}");
        }
    }

    #[test]
    fn annotations_select_cards_and_policies() {
        let p = pod(json!({"metadata": {"name": "p", "annotations": {
            "nvidia.com/use-gputype": "a100, H100",
            "nvidia.com/nouse-gputype": "pcie",
            "nvidia.com/use-gpuuuid": "GPU-1,GPU-2",
            "nvidia.com/nouse-gpuuuid": "GPU-2",
            "nvidia.com/numa-bind": "true",
            "hami.io/gpu-scheduler-policy": "binpack,numa",
            "hami.io/node-scheduler-policy": "spread"}},
            "spec": {"initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "containers": [{"name": "main"}, {"name": "side", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10"}}}]}}));
        let r = PodRequest::from_pod(&p, &SchedulerConfig::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            r.containers
                .iter()
                .map(|c| (c.name.as_str(), c.init, c.gpu.is_some()))
                .collect::<Vec<_>>(),
            [
                ("init", true, true),
                ("main", false, false),
                ("side", false, true)
            ]
        );
        assert_eq!(r.max_count(), 2);
        assert!(r.numa_bind);
        assert_eq!(r.gpu_policy, GpuPolicy::Binpack);
        assert_eq!(r.node_policy, NodePolicy::Spread);
        let s = &r.selector;
        assert!(s.type_allowed("NVIDIA-A100-SXM4-80GB"));
        assert!(s.type_allowed("NVIDIA-H100 80GB HBM3"));
        assert!(!s.type_allowed("NVIDIA-A100-PCIE-40GB"), "nouse wins");
        assert!(!s.type_allowed("NVIDIA-Tesla T4"));
        assert!(s.uuid_allowed("GPU-1"));
        assert!(!s.uuid_allowed("GPU-2"));
        assert!(!s.uuid_allowed("GPU-3"));
    }

    #[test]
    fn bad_annotations_are_refused() {
        let with = |key: &str, value: &str| {
            let p = pod(
                json!({"metadata": {"name": "p", "annotations": {key: value}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
            );
            PodRequest::from_pod(&p, &SchedulerConfig::default())
        };
        assert!(with("nvidia.com/numa-bind", "yes").is_err());
        assert!(with("hami.io/node-scheduler-policy", "fastest").is_err());
        let err = with("hami.io/gpu-scheduler-policy", "topology-aware").unwrap_err();
        assert!(
            err.to_string().contains("topology-aware is not supported"),
            "{err}"
        );
        let mutex = with("hami.io/gpu-scheduler-policy", "mutex")
            .unwrap()
            .unwrap();
        assert!(mutex.idle_gpus_only);
        assert_eq!(mutex.gpu_policy, GpuPolicy::Spread);
        // Annotations on a pod without GPUs are not our business.
        let p = pod(
            json!({"metadata": {"name": "p", "annotations": {"nvidia.com/numa-bind": "yes"}},
            "spec": {"containers": [{"name": "c"}]}}),
        );
        assert_eq!(
            PodRequest::from_pod(&p, &SchedulerConfig::default()),
            Ok(None)
        );
    }
}
