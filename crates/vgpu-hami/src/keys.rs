//! Annotation and label keys, env names and fixed words of HAMi's contract
//! (`pkg/util/types.go`, `pkg/device/nvidia/device.go`,
//! `pkg/util/nodelock/nodelock.go`). Constants only.

/// Pod annotation and label: the node the scheduler chose.
pub const ASSIGNED_NODE: &str = "hami.io/vgpu-node";
/// Pod annotation: unix seconds of the scheduling decision.
pub const ASSIGNED_TIME: &str = "hami.io/vgpu-time";
/// Pod annotation: the device list the device plugin consumes, container by
/// container ([`crate::devices`]).
pub const DEVICES_TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";
/// Pod annotation: the same device list, kept (the scheduler rebuilds node
/// usage from it).
pub const DEVICES_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
/// Pod annotation: [`crate::BindPhase`].
pub const BIND_PHASE: &str = "hami.io/bind-phase";
/// Pod annotation: unix seconds, written at bind.
pub const BIND_TIME: &str = "hami.io/bind-time";

/// Node annotation: registered devices ([`crate::register`]).
pub const NODE_REGISTER: &str = "hami.io/node-nvidia-register";
/// Node annotation: [`crate::Handshake`].
pub const NODE_HANDSHAKE: &str = "hami.io/node-handshake";
/// Node annotation: [`crate::NodeLock`].
pub const NODE_LOCK: &str = "hami.io/mutex.lock";
/// Node annotation: GPU pair topology scores (JSON; not decoded here).
pub const NODE_PAIR_SCORE: &str = "hami.io/node-nvidia-score";
/// Node annotation, set by an admin: comma list of UUIDs to exclude.
pub const DEVICE_CORDON: &str = "hami.io/device-cordon";

/// Pod annotation (user): comma list, case-insensitive substrings of the type.
pub const USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
/// Pod annotation (user): types to avoid.
pub const NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
/// Pod annotation (user): comma list of exact UUIDs to use.
pub const USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
/// Pod annotation (user): UUIDs to avoid.
pub const NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
/// Pod annotation (user): `"true"` binds all GPUs of the pod to one NUMA node.
pub const NUMA_BIND: &str = "nvidia.com/numa-bind";
/// Pod annotation (user): allocation mode (`hami-core`, `mig`, `mps`).
pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";
/// Pod annotation (user): GPU policy (`binpack`, `spread`, `topology-aware`, `numa`).
pub const GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";
/// Pod annotation (user): node policy (`binpack`, `spread`).
pub const NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";
/// Pod label (user): `ignore` skips the mutating webhook.
pub const WEBHOOK_LABEL: &str = "hami.io/webhook";

/// The device type word in device lists and the device-type key of HAMi's
/// per-vendor maps.
pub const NVIDIA: &str = "NVIDIA";
/// Registration `mode` of a shared (HAMi-core style) GPU.
pub const MODE_HAMI_CORE: &str = "hami-core";
/// Registration `mode` of a MIG GPU.
pub const MODE_MIG: &str = "mig";
/// Registration `mode` of an MPS GPU.
pub const MODE_MPS: &str = "mps";

/// Env of the device plugin and monitor: this node's name.
pub const ENV_NODE_NAME: &str = "NODE_NAME";
/// Container env: `true` (Go `strconv.ParseBool`) skips the `ld.so.preload` mount.
pub const ENV_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// Container env set by the webhook from `nvidia.com/priority`.
pub const ENV_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// Container env: core limiter policy (`default`, `force`, `disable`).
pub const ENV_CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";

/// Go `strconv.ParseBool`: the only spellings Go accepts; `None` for others.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
