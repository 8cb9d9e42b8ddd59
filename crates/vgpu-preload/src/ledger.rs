//! The process's view of its container's shared region: the one place this
//! library calls `vgpu-region` (open/create, register, reserve/release,
//! limits, phases).
use std::path::Path;

use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Phase, Region, SlotId};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot open the region at {path}")]
    Open {
        path: String,
        #[source]
        source: vgpu_region::RegionError,
    },
    #[error("cannot claim a slot in the region at {path}")]
    Register {
        path: String,
        #[source]
        source: vgpu_region::RegionError,
    },
}

/// Refusal: the request would cross the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: u64,
    pub in_use: u64,
    pub requested: u64,
}

pub use vgpu_region::MemKind as Kind;

/// Bound on waiting for another process that is creating the region right
/// now (microseconds normally; a creator that is stopped, not dead, would
/// otherwise hold us). Past it this process runs without limits and says so.
const OPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Bound on how often a view reclaims dead slots: a process that died
/// after the last pass may show in views for at most this long (admission
/// reclaims on its own when a reservation is refused).
pub const VIEW_RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

pub struct Ledger {
    region: Region,
    slot: SlotId,
    pub path: String,
    /// CLOCK_MONOTONIC ns when the region was mapped / the slot claimed.
    pub mapped_ns: u64,
    pub claimed_ns: u64,
}

/// One device's limits for region creation.
pub struct NewDevice {
    pub uuid: String,
    pub mem_limit: u64,
    pub sm_limit: u32,
}

impl Ledger {
    /// Maps an existing region (no CUDA needed) and claims a slot.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let p = path.display().to_string();
        let region = Region::open_with(path, OPEN_WAIT).map_err(|source| LedgerError::Open {
            path: p.clone(),
            source,
        })?;
        Self::register(region, p, vgpu_region::monotonic_ns())
    }

    /// `open`, or `None` when no file is at `path` (one `open(2)` instead
    /// of a `stat` first: this runs inside `cuInit`).
    pub fn open_existing(path: &Path) -> Result<Option<Ledger>, LedgerError> {
        match Self::open(path) {
            Err(LedgerError::Open {
                source: vgpu_region::RegionError::Io { source, .. },
                ..
            }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            r => r.map(Some),
        }
    }

    /// Creates the region (or maps one another process created meanwhile)
    /// and claims a slot; returns the limit mismatches as readable lines.
    pub fn create(
        path: &Path,
        slots: u32,
        devs: Vec<NewDevice>,
    ) -> Result<(Ledger, Vec<String>), LedgerError> {
        let p = path.display().to_string();
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let opts = CreateOptions {
            slots,
            devices: devs
                .into_iter()
                .map(|d| DeviceConfig {
                    uuid: d.uuid,
                    mem_limit: d.mem_limit,
                    sm_limit: d.sm_limit,
                })
                .collect(),
        };
        let (region, mism) =
            Region::open_or_create_with(path, &opts, OPEN_WAIT).map_err(|source| {
                LedgerError::Open {
                    path: p.clone(),
                    source,
                }
            })?;
        let mapped = vgpu_region::monotonic_ns();
        let lines = mism.iter().map(|m| m.to_string()).collect();
        Ok((Self::register(region, p, mapped)?, lines))
    }

    fn register(region: Region, path: String, mapped_ns: u64) -> Result<Ledger, LedgerError> {
        let slot = region.register().map_err(|source| LedgerError::Register {
            path: path.clone(),
            source,
        })?;
        Ok(Ledger {
            region,
            slot,
            path,
            mapped_ns,
            claimed_ns: vgpu_region::monotonic_ns(),
        })
    }

    pub fn device_count(&self) -> u32 {
        self.region.device_count()
    }

    /// Memory limit of device `dev` (0: none, or no such device).
    pub fn mem_limit(&self, dev: u32) -> u64 {
        if dev >= self.device_count() {
            return 0;
        }
        self.region.limits(dev).mem
    }

    pub fn sm_limit(&self, dev: u32) -> u32 {
        if dev >= self.device_count() {
            return 0;
        }
        self.region.limits(dev).sm
    }

    /// The container's live usage of `dev` (all processes, all kinds), for
    /// the memory views. A SIGKILLed process's bytes stay in the admission
    /// total until its slot is reclaimed; a view must not show them, so dead
    /// slots are reclaimed first (at most every `VIEW_RECLAIM_EVERY`, the
    /// pass costs a liveness check per claimed slot).
    pub fn used(&self, dev: u32) -> u64 {
        if dev >= self.device_count() {
            return 0;
        }
        self.region.reclaim_dead_at_most_every(VIEW_RECLAIM_EVERY);
        self.region.device_used(dev)
    }

    /// Charges `bytes` to this process on `dev`; a device the region does
    /// not know is unlimited (nothing to charge).
    pub fn reserve(&self, dev: u32, kind: Kind, bytes: u64) -> Result<(), OverLimit> {
        if bytes == 0 || dev >= self.device_count() {
            return Ok(());
        }
        match self.region.reserve(self.slot, dev, kind, bytes) {
            Ok(()) => Ok(()),
            Err(vgpu_region::AdmissionError::OverLimit {
                limit,
                in_use,
                requested,
            }) => Err(OverLimit {
                limit,
                in_use,
                requested,
            }),
            Err(e) => {
                crate::warn!("region refused a reservation on device {dev}: {e}; allowing it");
                Ok(())
            }
        }
    }

    pub fn release(&self, dev: u32, kind: Kind, bytes: u64) {
        if bytes == 0 || dev >= self.device_count() {
            return;
        }
        let r = self.region.release(self.slot, dev, kind, bytes);
        if r.clamped {
            crate::debug!(
                "release of {bytes} B on device {dev} clamped to {}",
                r.released
            );
        }
    }

    pub fn set_phase(&self, phase: Phase, ns: u64) {
        if ns != 0 {
            self.region.slot(self.slot).set_phase(phase, ns);
        }
    }

    pub fn unregister(&self) {
        self.region.unregister(self.slot);
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn slot(&self) -> SlotId {
        self.slot
    }
}

pub use vgpu_region::Phase as RegionPhase;
pub const DATA: MemKind = MemKind::Data;
pub const CONTEXT: MemKind = MemKind::Context;
pub const MODULE: MemKind = MemKind::Module;

/// A read-only look at a region, for processes that only ask NVML
/// (nvidia-smi, monitors): limits and usage without claiming a slot.
pub struct View {
    region: Region,
}

impl View {
    pub fn open(path: &Path) -> Result<View, LedgerError> {
        let region = Region::open_read_only(path).map_err(|source| LedgerError::Open {
            path: path.display().to_string(),
            source,
        })?;
        Ok(View { region })
    }

    pub fn mem_limit(&self, dev: u32) -> u64 {
        if dev >= self.region.device_count() {
            return 0;
        }
        self.region.limits(dev).mem
    }

    /// Usage without the bytes of dead processes (a read-only mapping cannot
    /// reclaim their slots, so it skips them).
    pub fn used(&self, dev: u32) -> u64 {
        if dev >= self.region.device_count() {
            return 0;
        }
        self.region.device_used_live(dev)
    }
}
