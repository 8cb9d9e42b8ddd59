//! What a node offers: its GPUs (from the device plugin's
//! `hami.io/node-nvidia-register`), the UUIDs an admin cordoned
//! (`hami.io/device-cordon`), and whether its device plugin is alive (the
//! `hami.io/node-handshake` stamp and the allocatable GPU count).
//!
//! Owns the reading of a Node into this shape and the health rule; the
//! annotation formats themselves belong to `vgpu-hami`. Never talks to the
//! API server.

use std::collections::HashSet;

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

/// Mode of a card vgpu's interposer shares.
pub const MODE_SHARED: &str = "hami-core";

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
}

impl NodeInventory {
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
