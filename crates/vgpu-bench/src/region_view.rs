//! What the bench reads from a vgpu shared region after a burst: per-slot
//! phase vectors and identity telemetry, keyed by pid. Adapter over
//! `vgpu_region`'s snapshot so the rest of the bench does not depend on the
//! region's layout.
use std::path::Path;

use crate::phases::PhaseVector;

/// One live slot's telemetry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SlotTelemetry {
    pub pid: u32,
    pub phases: PhaseVector,
    /// Identity tier as the region names it ("none" when not resolved).
    pub identity_tier: String,
    pub fallbacks: u64,
    pub post_init_waits: u64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RegionSnapshot {
    pub slots: Vec<SlotTelemetry>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegionViewError {
    #[error("cannot read the shared region {path}: {reason}")]
    Open { path: String, reason: String },
}

/// Snapshot the region file at `path`.
pub fn snapshot(path: &Path) -> Result<RegionSnapshot, RegionViewError> {
    Err(RegionViewError::Open {
        path: path.display().to_string(),
        reason: "vgpu-region snapshot API not available in this build".into(),
    })
}
