//! What a node offers: its GPUs (from the device plugin's
//! `hami.io/node-nvidia-register`), the UUIDs an admin cordoned
//! (`hami.io/device-cordon`), and whether its device plugin is alive (the
//! `hami.io/node-handshake` stamp and the allocatable GPU count).
//!
//! Owns the reading of a Node into this shape and the health rule; the
//! annotation formats themselves belong to `vgpu-hami`. Never talks to the
//! API server.

use std::collections::HashSet;
use std::time::Duration;

use jiff::civil::DateTime;
use k8s_openapi::api::core::v1::Node;
use vgpu_hami::{keys, register, Handshake};

use crate::quantity;

/// One physical GPU as the node's device plugin registered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    pub uuid: String,
    pub index: u32,
    /// vGPU slots (`deviceSplitCount`): how many containers may share it.
    pub slots: u32,
    /// Schedulable memory in MiB (already × `deviceMemoryScaling`).
    pub memory_mib: u64,
    /// Schedulable cores in percent (100 × `deviceCoreScaling`).
    pub cores: u32,
    /// `NVIDIA-<model>`, e.g. `NVIDIA-A100-SXM4-80GB`.
    pub model: String,
    pub numa: i32,
    pub healthy: bool,
    /// `hami-core` (shared by libvgpu), `mig`, `mps`.
    pub mode: String,
}

/// Why a node offers nothing right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeHealth {
    Healthy,
    /// The handshake is stale and the node advertises no GPU: its device
    /// plugin is gone.
    StaleHandshake {
        stamp: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInventory {
    pub name: String,
    pub devices: Vec<GpuDevice>,
    pub cordoned: HashSet<String>,
    pub health: NodeHealth,
    /// Why the register annotation could not be used, when it could not.
    pub register_error: Option<String>,
    /// A GPU node whose handshake is not a standing request: the
    /// scheduler should write `Requesting_<now>` (HAMi's health timer).
    pub handshake_due: bool,
    /// The handshake annotation as last seen, raw.
    pub handshake: Option<String>,
}

impl GpuDevice {
    fn from_register(d: &register::NodeDevice) -> Self {
        let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
        GpuDevice {
            uuid: d.id.clone(),
            index: u32::try_from(d.index).unwrap_or(u32::MAX),
            slots: nonneg(d.count),
            memory_mib: u64::from(nonneg(d.devmem)),
            cores: nonneg(d.devcore),
            model: d.device_type.clone(),
            numa: i32::try_from(d.numa).unwrap_or(i32::MAX),
            healthy: d.health,
            // HAMi reads an absent mode as hami-core.
            mode: if d.mode.is_empty() {
                keys::MODE_HAMI_CORE.to_owned()
            } else {
                d.mode.clone()
            },
        }
    }
}

/// The node's register annotation decoded: the JSON HAMi v2.8+ and vgpu's
/// node agent write, or the older colon form.
pub fn parse_register(value: &str) -> Result<Vec<GpuDevice>, String> {
    let devices = match register::decode(value) {
        Ok(d) => d,
        Err(json) => register::decode_legacy(value).map_err(|_| json.to_string())?,
    };
    Ok(devices.iter().map(GpuDevice::from_register).collect())
}

/// The health rule of HAMi v2.10 (`CheckHealth`): a node's device plugin
/// is gone when the handshake asks (`Requesting_<stamp>`) for longer than
/// `timeout` and the node advertises no allocatable GPU. `now` is the
/// scheduler's local civil time, the clock the stamp was written in.
pub fn node_health(
    handshake: Option<&str>,
    allocatable_gpus: i64,
    now: DateTime,
    timeout: Duration,
) -> NodeHealth {
    match handshake.map(|h| (h, Handshake::parse(h))) {
        Some((raw, Ok(h))) if allocatable_gpus <= 0 && h.request_expired(now, timeout) => {
            NodeHealth::StaleHandshake {
                stamp: raw.to_owned(),
            }
        }
        _ => NodeHealth::Healthy,
    }
}

/// Whether the scheduler should (re)write `Requesting_<now>`: HAMi asks
/// again whenever the value is not a request of its own.
pub fn handshake_needs_request(handshake: Option<&str>) -> bool {
    !matches!(
        handshake.map(Handshake::parse),
        Some(Ok(Handshake {
            state: vgpu_hami::HandshakeState::Requesting,
            ..
        }))
    )
}

impl NodeInventory {
    /// What `node` offers, read from its annotations and status.
    pub fn from_node(node: &Node, count_resource: &str, now: DateTime, timeout: Duration) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.as_ref();
        let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
        let (devices, register_error) = match get(keys::NODE_REGISTER) {
            None => (
                Vec::new(),
                Some(format!("{} is missing", keys::NODE_REGISTER)),
            ),
            Some(v) => match parse_register(v) {
                Ok(d) if d.is_empty() => (d, Some(format!("{} lists no GPU", keys::NODE_REGISTER))),
                Ok(d) => (d, None),
                Err(e) => (Vec::new(), Some(format!("{}: {e}", keys::NODE_REGISTER))),
            },
        };
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(count_resource))
            .and_then(|q| quantity::parse_int(&q.0).ok())
            .unwrap_or(0);
        let handshake = get(keys::NODE_HANDSHAKE);
        NodeInventory {
            name,
            handshake_due: get(keys::NODE_REGISTER).is_some() && handshake_needs_request(handshake),
            devices,
            cordoned: parse_cordon(get(keys::DEVICE_CORDON)),
            health: node_health(handshake, allocatable, now, timeout),
            register_error,
            handshake: handshake.map(str::to_owned),
        }
    }

    /// The largest number of distinct cards a container could get here.
    pub fn card_count(&self) -> usize {
        self.devices.len()
    }
}

/// The device-cordon list: comma-separated UUIDs, blanks ignored.
pub fn parse_cordon(value: Option<&str>) -> HashSet<String> {
    value
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
