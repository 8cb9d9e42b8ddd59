//! What one container gets from Allocate, decided without I/O: HAMi's env
//! and mounts (`pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`)
//! plus vgpu's read-only limits file, `libvgpu_core.so` beside the front
//! `libvgpu.so`, the second mount of the region
//! directory where a process that lost its environment looks, and the
//! broker socket. The plugin turns a [`Plan`] into directories, the limits
//! file and the gRPC response; a plan that cannot be made refuses the whole
//! container (never a half-limited one).

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;
use vgpu_hami::keys;
use vgpu_hami::ContainerDevice;
use vgpu_region::limits::{Device, DeviceLine, Limits, Policy};

use crate::config::DeviceListStrategies;
use crate::layout::{self, Layout};
use crate::proto::v1beta1::{CdiDevice, ContainerAllocateResponse, Mount};

/// The device list the NVIDIA container runtime reads.
pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The settings Allocate uses.
#[derive(Clone, Debug)]
pub struct AllocSettings {
    /// Hook path layout.
    pub layout: Layout,
    /// Host path of libvgpu.so (the front; `libvgpu_core.so` is beside it).
    pub lib_path: PathBuf,
    /// Host directory for `/tmp/vgpulock`.
    pub lock_dir: PathBuf,
    /// Broker socket, when the broker is on.
    pub broker_socket: Option<PathBuf>,
    /// `LIBCUDA_LOG_LEVEL`.
    pub log_level: Option<String>,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub core_policy: Option<Policy>,
    /// `deviceMemoryScaling` (> 1 sets `CUDA_OVERSUBSCRIBE`).
    pub memory_scaling: f64,
    /// How the GPUs reach the container runtime.
    pub device_list: DeviceListStrategies,
}

impl AllocSettings {
    /// From the agent's settings.
    pub fn from_config(c: &crate::config::NodeConfig) -> AllocSettings {
        AllocSettings {
            layout: c.layout.clone(),
            lib_path: c.lib_path.clone(),
            lock_dir: c.lock_dir.clone(),
            broker_socket: c.broker_socket.clone(),
            log_level: c.log_level.clone(),
            core_policy: c.core_policy,
            memory_scaling: c.memory_scaling,
            device_list: c.device_list,
        }
    }
}

/// What one container gets.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// `<podUID>_<container>`.
    pub key: String,
    /// Environment.
    pub envs: BTreeMap<String, String>,
    /// Mounts, in order.
    pub mounts: Vec<Mount>,
    /// The limits file's content.
    pub limits: Limits,
    /// Container annotations for the runtime (`cdi-annotations`).
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`cdi-cri`).
    pub cdi_devices: Vec<String>,
    /// Host paths of its entries on its GPUs' lending boards (made empty
    /// before the container starts: each is a file mount target).
    pub board_entries: Vec<PathBuf>,
}

/// The pod spec's SM ceiling (`CUDA_DEVICE_SM_CEILING` in the container's
/// env, percent 1..=100): what the container may reach while the GPU's
/// other containers leave time unused. Read from the pod spec the operator
/// admitted, never from the process.
pub const ENV_SM_CEILING: &str = "CUDA_DEVICE_SM_CEILING";

/// The mount-point directory of the `volume-mounts` strategy (NVIDIA's
/// container toolkit reads the device list from its entries).
pub const DEVICE_LIST_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// The host side of each `volume-mounts` entry: only the name matters.
pub const DEVICE_LIST_MOUNT_SOURCE: &str = "/dev/null";
/// The CDI kind of a whole NVIDIA GPU, as `nvidia-ctk cdi generate` writes
/// it; devices are named by UUID (`--device-name-strategy=uuid`).
pub const CDI_GPU_KIND: &str = "nvidia.com/gpu";
/// The CDI container-annotation prefix.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// The CDI annotation key for a pod's container: `cdi.k8s.io/vgpu_<uid>`,
/// held to CDI's rule for the name after the prefix (at most 63 of
/// `[A-Za-z0-9_.-]`, alphanumeric at both ends). One key per container
/// response; the runtime sees only its own container's annotations.
pub fn cdi_annotation_key(pod_uid: &str) -> String {
    let mut name: String = format!("vgpu_{pod_uid}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    while name.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        name.pop();
    }
    format!("{CDI_ANNOTATION_PREFIX}{name}")
}

/// Why no plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The assignment lists no device.
    #[error("the assignment of container {0:?} lists no device")]
    NoDevices(String),
    /// A device of another type than NVIDIA.
    #[error("container {container:?}: device {uuid} has type {device_type:?}, not NVIDIA")]
    WrongType {
        /// Container.
        container: String,
        /// UUID.
        uuid: String,
        /// Type.
        device_type: String,
    },
    /// The limits would not be valid.
    #[error("container {container:?}: limits not writable: {why}")]
    Limits {
        /// Container.
        container: String,
        /// Why.
        why: String,
    },
}

fn env_true(c: &Container, name: &str) -> bool {
    c.env
        .iter()
        .flatten()
        .filter(|e| e.name == name)
        .any(|e| e.value.as_deref().and_then(keys::parse_go_bool) == Some(true))
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn mount(container: impl Into<PathBuf>, host: impl Into<PathBuf>, ro: bool) -> Mount {
    Mount {
        container_path: container.into().display().to_string(),
        host_path: host.into().display().to_string(),
        read_only: ro,
    }
}

/// The limits file for `devices`: one `device` line per physical GPU
/// (memory = MiB × 2^20; sm = cores when 1..=99; a GPU listed twice gets
/// the sum of its memory and the larger share), the policy, and the
/// container's `CUDA_TASK_PRIORITY` when it is an integer.
pub fn limits_for(s: &AllocSettings, c: &Container, devices: &[ContainerDevice]) -> Limits {
    let mut lines: Vec<DeviceLine> = Vec::new();
    for d in devices {
        let mem = u64::from(d.mem_mib) << 20;
        let sm = (1..=99).contains(&d.cores).then_some(d.cores);
        match lines
            .iter_mut()
            .find(|l| l.device.as_str().eq_ignore_ascii_case(&d.uuid))
        {
            Some(l) => {
                l.memory = match (l.memory, mem) {
                    (a, 0) => a,
                    (Some(a), b) => Some(a.saturating_add(b)),
                    (None, b) => Some(b),
                };
                l.sm = l.sm.max(sm);
            }
            None => lines.push(DeviceLine {
                device: Device::Uuid(d.uuid.clone()),
                memory: (mem > 0).then_some(mem),
                sm,
            }),
        }
    }
    Limits {
        devices: lines,
        policy: s.core_policy,
        priority: env_value(c, keys::ENV_TASK_PRIORITY).and_then(|v| v.trim().parse().ok()),
        suspended: None,
        hold: None,
        ..Limits::default()
    }
}

/// What gives one container its vgpu devices, whoever hands it over: the
/// device plugin's Allocate response and the DRA driver's CDI spec both
/// come from [`container_edits`] (HAMi's env contract and vgpu's mounts).
#[derive(Clone, Debug, PartialEq)]
pub struct Edits {
    /// Environment.
    pub envs: BTreeMap<String, String>,
    /// Mounts, in order.
    pub mounts: Vec<Mount>,
    /// The GPUs' fully qualified NVIDIA CDI names (`nvidia.com/gpu=<uuid>`),
    /// one per physical GPU; the device-list strategy says whether and how
    /// they are passed on.
    pub cdi_names: Vec<String>,
}

/// The env and mounts for `devices` (non-empty, NVIDIA) of the container
/// whose region and limits directories are named `key`; `preload` mounts
/// the preload list (off for a container that disabled control).
pub fn container_edits(
    s: &AllocSettings,
    key: &str,
    devices: &[ContainerDevice],
    preload: bool,
) -> Edits {
    let l = &s.layout;
    let mut envs = BTreeMap::new();
    let mut uuids: Vec<&str> = Vec::new();
    for d in devices {
        if !uuids.contains(&d.uuid.as_str()) {
            uuids.push(&d.uuid);
        }
    }
    // As NVIDIA's plugin: envvar names the UUIDs, volume-mounts names the
    // mount root instead (it wins when both are on), CDI alone sets none.
    let strategies = s.device_list;
    if strategies.volume_mounts {
        envs.insert(
            ENV_VISIBLE_DEVICES.to_owned(),
            DEVICE_LIST_MOUNT_ROOT.to_owned(),
        );
    } else if strategies.envvar {
        envs.insert(ENV_VISIBLE_DEVICES.to_owned(), uuids.join(","));
    }
    let cdi_names: Vec<String> = uuids
        .iter()
        .map(|u| format!("{CDI_GPU_KIND}={u}"))
        .collect();
    for (i, d) in devices.iter().enumerate() {
        envs.insert(
            format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"),
            format!("{}m", d.mem_mib),
        );
    }
    if let Some(d) = devices.first() {
        envs.insert("CUDA_DEVICE_SM_LIMIT".to_owned(), d.cores.to_string());
    }
    envs.insert(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_owned(),
        l.container_region_file().display().to_string(),
    );
    if s.memory_scaling > 1.0 {
        envs.insert("CUDA_OVERSUBSCRIBE".to_owned(), "true".to_owned());
    }
    if let Some(level) = &s.log_level {
        envs.insert("LIBCUDA_LOG_LEVEL".to_owned(), level.clone());
    }
    if let Some(p) = s.core_policy {
        envs.insert(keys::ENV_CORE_POLICY.to_owned(), p.name().to_owned());
    }
    if let Some(sock) = &s.broker_socket {
        envs.insert(
            vgpu_identity::resolve::ENV_BROKER.to_owned(),
            sock.display().to_string(),
        );
    }
    let region_dir = l.region_dir(key);
    let mut mounts = vec![
        mount(l.container_lib(), &s.lib_path, true),
        // The front loads the core from its own directory.
        mount(
            l.container_core_lib(),
            layout::core_beside(&s.lib_path),
            true,
        ),
        mount(l.vgpu_dir(), &region_dir, false),
        mount(layout::CONTAINER_DEFAULT_REGION_DIR, &region_dir, false),
        mount(layout::CONTAINER_LIMITS_DIR, l.limits_dir(key), true),
        mount(layout::LOCK_DIR, &s.lock_dir, false),
    ];
    if preload {
        mounts.push(mount(
            layout::CONTAINER_LD_SO_PRELOAD,
            l.ld_so_preload(),
            true,
        ));
    }
    if let Some(dir) = s.broker_socket.as_ref().and_then(|p| p.parent()) {
        mounts.push(mount(dir, dir, true));
    }
    if strategies.volume_mounts {
        for u in &uuids {
            mounts.push(mount(
                PathBuf::from(DEVICE_LIST_MOUNT_ROOT).join(u),
                DEVICE_LIST_MOUNT_SOURCE,
                false,
            ));
        }
    }
    Edits {
        envs,
        mounts,
        cdi_names,
    }
}

/// The plan for container `c` of the pod with `pod_uid`.
pub fn plan(
    s: &AllocSettings,
    pod_uid: &str,
    c: &Container,
    devices: &[ContainerDevice],
) -> Result<Plan, PlanError> {
    if devices.is_empty() {
        return Err(PlanError::NoDevices(c.name.clone()));
    }
    if let Some(d) = devices.iter().find(|d| d.device_type != keys::NVIDIA) {
        return Err(PlanError::WrongType {
            container: c.name.clone(),
            uuid: d.uuid.clone(),
            device_type: d.device_type.clone(),
        });
    }
    let key = layout::container_key(pod_uid, &c.name);
    let Edits {
        envs,
        mut mounts,
        cdi_names,
    } = container_edits(s, &key, devices, !env_true(c, keys::ENV_DISABLE_CONTROL));
    let strategies = s.device_list;
    let mut annotations = BTreeMap::new();
    if strategies.cdi_annotations {
        annotations.insert(cdi_annotation_key(pod_uid), cdi_names.join(","));
    }
    let cdi_devices = if strategies.cdi_cri {
        cdi_names
    } else {
        Vec::new()
    };
    // Lending (docs/limiter.md, "Guarantees and ceilings"): the GPUs'
    // boards read-only, the container's own entry on each writable.
    let l = &s.layout;
    mounts.push(mount(layout::CONTAINER_BOARDS_DIR, l.boards_dir(), true));
    let mut uuids: Vec<&str> = Vec::new();
    for d in devices {
        if !uuids.contains(&d.uuid.as_str()) {
            uuids.push(&d.uuid);
        }
    }
    let board_entries: Vec<PathBuf> = uuids.iter().map(|u| l.board_entry(u, &key)).collect();
    for (u, host) in uuids.iter().zip(&board_entries) {
        mounts.push(mount(
            PathBuf::from(layout::CONTAINER_BOARDS_DIR)
                .join(u)
                .join(&key),
            host,
            false,
        ));
    }
    let mut limits = limits_for(s, c, devices);
    limits.board = Some(vgpu_region::limits::BoardRef {
        dir: PathBuf::from(layout::CONTAINER_BOARDS_DIR),
        name: key.clone(),
    });
    if let Some(v) = env_value(c, ENV_SM_CEILING) {
        let pct = v
            .trim()
            .trim_end_matches('%')
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| PlanError::Limits {
                container: c.name.clone(),
                why: format!("{ENV_SM_CEILING}={v:?} is not a percent 1..=100"),
            })?;
        limits.set_ceiling(&Device::Any, Some(pct));
    }
    limits.validate().map_err(|e| PlanError::Limits {
        container: c.name.clone(),
        why: e.to_string(),
    })?;
    Ok(Plan {
        key,
        envs,
        mounts,
        limits,
        annotations,
        cdi_devices,
        board_entries,
    })
}

impl Plan {
    /// The gRPC response for this container.
    pub fn response(&self) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: self.envs.clone().into_iter().collect(),
            mounts: self.mounts.clone(),
            devices: Vec::new(),
            annotations: self.annotations.clone().into_iter().collect(),
            cdi_devices: self
                .cdi_devices
                .iter()
                .map(|name| CdiDevice { name: name.clone() })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AllocSettings {
        AllocSettings {
            layout: Layout::new("/usr/local"),
            lib_path: "/usr/local/vgpu/libvgpu.so".into(),
            lock_dir: "/tmp/vgpulock".into(),
            broker_socket: Some("/run/vgpu/hostpid.sock".into()),
            log_level: Some("2".into()),
            core_policy: None,
            memory_scaling: 1.0,
            device_list: DeviceListStrategies::default(),
        }
    }

    fn ctr(env: &[(&str, &str)]) -> Container {
        serde_json::from_value(serde_json::json!({
            "name": "main",
            "env": env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn env_mounts_and_limits() {
        let d = [
            ContainerDevice::nvidia("GPU-a", 3000, 30),
            ContainerDevice::nvidia("GPU-b", 1024, 30),
        ];
        let p = plan(
            &settings(),
            "uid-1",
            &ctr(&[("CUDA_TASK_PRIORITY", "0")]),
            &d,
        )
        .unwrap();
        let env: Vec<(String, String)> = p.envs.clone().into_iter().collect();
        assert_eq!(
            env,
            [
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
                (
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                    "/usr/local/vgpu/region.cache"
                ),
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("LIBCUDA_LOG_LEVEL", "2"),
                ("LIBVGPU_HOSTPID_BROKER", "/run/vgpu/hostpid.sock"),
                ("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        let m: Vec<(&str, &str, bool)> = p
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            m,
            [
                (
                    "/usr/local/vgpu/libvgpu.so",
                    "/usr/local/vgpu/libvgpu.so",
                    true
                ),
                (
                    "/usr/local/vgpu/libvgpu_core.so",
                    "/usr/local/vgpu/libvgpu_core.so",
                    true
                ),
                (
                    "/usr/local/vgpu",
                    "/usr/local/vgpu/containers/uid-1_main",
                    false
                ),
                ("/tmp/vgpu", "/usr/local/vgpu/containers/uid-1_main", false),
                ("/etc/vgpu", "/usr/local/vgpu/limits/uid-1_main", true),
                ("/tmp/vgpulock", "/tmp/vgpulock", false),
                ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", true),
                ("/run/vgpu", "/run/vgpu", true),
                ("/etc/vgpu-boards", "/usr/local/vgpu/boards", true),
                (
                    "/etc/vgpu-boards/GPU-a/uid-1_main",
                    "/usr/local/vgpu/boards/GPU-a/uid-1_main",
                    false
                ),
                (
                    "/etc/vgpu-boards/GPU-b/uid-1_main",
                    "/usr/local/vgpu/boards/GPU-b/uid-1_main",
                    false
                ),
            ]
        );
        assert_eq!(
            p.limits.render(),
            "vgpu-limits 1\ndevice GPU-a memory=3145728000 sm=30\ndevice GPU-b memory=1073741824 sm=30\npriority 0\nboard /etc/vgpu-boards uid-1_main\n"
        );
        assert_eq!(p.board_entries.len(), 2);
        // A ceiling from the pod spec's env; a bad one refuses the container.
        let p = plan(&settings(), "u", &ctr(&[(ENV_SM_CEILING, "80")]), &d).unwrap();
        assert_eq!(p.limits.ceiling_for("GPU-a"), Some(80));
        let e = plan(&settings(), "u", &ctr(&[(ENV_SM_CEILING, "0")]), &d).unwrap_err();
        assert!(e.to_string().contains(ENV_SM_CEILING), "{e}");
    }

    #[test]
    fn disable_control_oversubscribe_policy_and_duplicates() {
        let mut s = settings();
        s.memory_scaling = 2.0;
        s.broker_socket = None;
        s.core_policy = Some(Policy::Disable);
        s.log_level = None;
        let d = [
            ContainerDevice::nvidia("GPU-a", 1000, 100),
            ContainerDevice::nvidia("GPU-a", 500, 0),
        ];
        let p = plan(&s, "u", &ctr(&[("CUDA_DISABLE_CONTROL", "true")]), &d).unwrap();
        assert_eq!(p.envs["CUDA_OVERSUBSCRIBE"], "true");
        assert_eq!(p.envs["GPU_CORE_UTILIZATION_POLICY"], "disable");
        assert_eq!(p.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
        assert!(!p.envs.contains_key("LIBVGPU_HOSTPID_BROKER"));
        assert!(p
            .mounts
            .iter()
            .all(|m| m.container_path != "/etc/ld.so.preload"));
        assert_eq!(
            p.limits.render(),
            "vgpu-limits 1\ndevice GPU-a memory=1572864000\npolicy disable\nboard /etc/vgpu-boards u_main\n"
        );
        // "false" or junk keeps the preload.
        let p = plan(&s, "u", &ctr(&[("CUDA_DISABLE_CONTROL", "no")]), &d).unwrap();
        assert!(p
            .mounts
            .iter()
            .any(|m| m.container_path == "/etc/ld.so.preload"));
    }

    #[test]
    fn device_list_strategies() {
        let d = [
            ContainerDevice::nvidia("GPU-a", 1000, 0),
            ContainerDevice::nvidia("GPU-b", 1000, 0),
            ContainerDevice::nvidia("GPU-a", 500, 0),
        ];
        let uid = "7d1c2b3a-0000-4000-8000-000000000001";
        let with = |list: &str| {
            let mut s = settings();
            s.device_list = DeviceListStrategies::parse(list).unwrap();
            plan(&s, uid, &ctr(&[]), &d).unwrap()
        };
        let devmounts = |p: &Plan| {
            p.mounts
                .iter()
                .filter(|m| m.container_path.starts_with(DEVICE_LIST_MOUNT_ROOT))
                .map(|m| (m.container_path.clone(), m.host_path.clone()))
                .collect::<Vec<_>>()
        };
        // envvar (default): today's list, nothing else.
        let p = with("envvar");
        assert_eq!(p.envs[ENV_VISIBLE_DEVICES], "GPU-a,GPU-b");
        assert!(devmounts(&p).is_empty() && p.annotations.is_empty() && p.cdi_devices.is_empty());
        let r = p.response();
        assert!(r.annotations.is_empty() && r.cdi_devices.is_empty());

        // volume-mounts: the mount root in the env, one /dev/null per GPU.
        let p = with("volume-mounts");
        assert_eq!(p.envs[ENV_VISIBLE_DEVICES], DEVICE_LIST_MOUNT_ROOT);
        assert_eq!(
            devmounts(&p),
            [
                (
                    "/var/run/nvidia-container-devices/GPU-a".to_string(),
                    "/dev/null".to_string()
                ),
                (
                    "/var/run/nvidia-container-devices/GPU-b".to_string(),
                    "/dev/null".to_string()
                ),
            ]
        );
        // Both: volume-mounts' value wins, as in NVIDIA's plugin.
        assert_eq!(
            with("envvar,volume-mounts").envs[ENV_VISIBLE_DEVICES],
            DEVICE_LIST_MOUNT_ROOT
        );

        // CDI only: no env list at all; annotations and/or CDI devices.
        let p = with("cdi-annotations,cdi-cri");
        assert!(!p.envs.contains_key(ENV_VISIBLE_DEVICES));
        let r = p.response();
        assert_eq!(
            r.annotations.into_iter().collect::<Vec<_>>(),
            [(
                format!("cdi.k8s.io/vgpu_{uid}"),
                "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b".to_string()
            )]
        );
        assert_eq!(
            r.cdi_devices
                .into_iter()
                .map(|c| c.name)
                .collect::<Vec<_>>(),
            ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
        );
        let p = with("cdi-cri");
        assert!(p.annotations.is_empty() && p.cdi_devices.len() == 2);
        // The vgpu env and mounts are there whatever the strategy.
        assert_eq!(p.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
        assert!(p.mounts.iter().any(|m| m.container_path == "/etc/vgpu"));
    }

    #[test]
    fn cdi_annotation_keys_follow_cdi_rules() {
        assert_eq!(cdi_annotation_key("abc-1"), "cdi.k8s.io/vgpu_abc-1");
        assert_eq!(cdi_annotation_key("a/b c"), "cdi.k8s.io/vgpu_a_b_c");
        let long = cdi_annotation_key(&"x".repeat(100));
        assert_eq!(long.len() - CDI_ANNOTATION_PREFIX.len(), 63);
        assert_eq!(cdi_annotation_key("x-"), "cdi.k8s.io/vgpu_x");
    }

    #[test]
    fn refusals() {
        assert_eq!(
            plan(&settings(), "u", &ctr(&[]), &[]),
            Err(PlanError::NoDevices("main".into()))
        );
        let other = ContainerDevice {
            device_type: "MLU".into(),
            ..ContainerDevice::nvidia("x", 1, 1)
        };
        assert!(matches!(
            plan(&settings(), "u", &ctr(&[]), &[other]),
            Err(PlanError::WrongType { .. })
        ));
    }
}
