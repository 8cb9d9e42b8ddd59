//! What the bench reads from a vgpu shared region after a burst: per-slot
//! phase vectors and identity telemetry, keyed by pid. A thin adapter over
//! `vgpu_region::Region::snapshot`, so the report does not depend on the
//! region's layout.
use std::path::Path;

use vgpu_region::{Phase, Region};

use crate::phases::PhaseVector;

/// One live slot's telemetry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SlotTelemetry {
    /// PID in the owner's namespace (the workers share the harness's).
    pub pid: u32,
    pub phases: PhaseVector,
    /// Identity tier as the region names it.
    pub identity_tier: String,
    /// Identity state as the region names it.
    pub identity_state: String,
    /// Sum of every fallback counter of the slot.
    pub fallbacks: u64,
    /// Non-zero fallback counters by name.
    pub fallback_kinds: Vec<(String, u64)>,
    /// 1 when identity ran inside `cuInit` (the post-init step waited for
    /// it: `identity_enter` set), else 0.
    pub post_init_waits: u64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RegionSnapshot {
    pub slots: Vec<SlotTelemetry>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegionViewError {
    #[error("cannot open the shared region {0}")]
    Open(String, #[source] vgpu_region::RegionError),
}

/// Index of a phase name in [`crate::phases::PHASE_NAMES`] order (the
/// region's phase codes).
fn phase_index(name: &str) -> Option<usize> {
    Phase::ALL
        .iter()
        .find(|p| p.name() == name)
        .map(|p| p.code() as usize)
}

/// Snapshot the region file at `path`.
pub fn snapshot(path: &Path) -> Result<RegionSnapshot, RegionViewError> {
    let r = Region::open(path).map_err(|e| RegionViewError::Open(path.display().to_string(), e))?;
    let snap = r.snapshot();
    let slots = snap
        .slots
        .iter()
        .map(|s| {
            let mut phases: PhaseVector = [0; 10];
            for (name, ns) in &s.phases {
                if let Some(i) = phase_index(name).filter(|&i| i < phases.len()) {
                    phases[i] = *ns;
                }
            }
            SlotTelemetry {
                pid: s.pid,
                phases,
                identity_tier: s.identity.tier.clone(),
                identity_state: s.identity.state.clone(),
                fallbacks: s.fallbacks.iter().map(|(_, n)| n).sum(),
                fallback_kinds: s
                    .fallbacks
                    .iter()
                    .map(|(k, n)| (k.to_string(), *n))
                    .collect(),
                post_init_waits: u64::from(phases[Phase::IdentityEnter.code() as usize] != 0),
            }
        })
        .collect();
    Ok(RegionSnapshot { slots })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_codes_follow_the_documented_order() {
        for (i, name) in crate::phases::PHASE_NAMES.iter().enumerate() {
            let p = Phase::from_code(i as u32).expect("phase code");
            // Names differ in case style only: LoaderReady vs loader_ready.
            let snake: String = p
                .name()
                .chars()
                .enumerate()
                .flat_map(|(k, c)| {
                    let lower = c.to_ascii_lowercase();
                    if c.is_ascii_uppercase() && k > 0 {
                        vec!['_', lower]
                    } else {
                        vec![lower]
                    }
                })
                .collect();
            assert_eq!(&snake, name);
            assert_eq!(phase_index(p.name()), Some(i));
        }
    }
}
