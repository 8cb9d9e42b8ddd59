//! The process's view of its container's shared region: the one place this
//! library calls `vgpu-region` (open/create, register, reserve/release,
//! limits, phases), and the process-local record of what it charged
//! ([`Tables`], [`Charges`]).
//!
//! Must never decide policy (what to charge is `memory`'s) or call a driver.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

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

/// What one charge was: device (CUDA ordinal), kind, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub dev: u32,
    pub kind: Kind,
    pub bytes: u64,
}

/// A stream-ordered pool this process has charged for.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolCharge {
    pub dev: u32,
    /// Bytes currently charged for this pool (its reserved memory as last seen).
    pub charged: u64,
}

/// A cheap hasher for pointer and handle keys (the allocation hot path):
/// one folded 64x64->128 multiply, which mixes the low bits that aligned
/// device pointers leave zero. Keys come from the driver, not an attacker.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

pub type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// What this process has charged, by object (the process-local half of
/// the ledger: the region holds the totals).
#[derive(Default)]
pub struct Tables {
    /// Linear/managed/pitched allocations by device pointer.
    pub allocs: Map<u64, Charge>,
    /// Stream-ordered allocations: pointer -> pool.
    pub async_ptrs: Map<u64, usize>,
    pub pools: Map<usize, PoolCharge>,
    /// `cuMemCreate` handles.
    pub handles: Map<u64, Charge>,
    /// Arrays and mipmapped arrays by handle.
    pub arrays: Map<usize, Charge>,
    /// Contexts created with `cuCtxCreate*`.
    pub ctxs: Map<usize, Charge>,
}

/// The charge tables of one process, each behind its own short lock (never
/// held across a driver call, except `primary`: a retain count must move
/// with the driver's own).
#[derive(Default)]
pub struct Charges {
    pub tables: Mutex<Tables>,
    /// Primary-context retain count and charge per device.
    pub primary: Mutex<Map<u32, (u32, u64)>>,
}

impl Charges {
    pub fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A poisoned lock only means a panic elsewhere mid-update; the maps
        // are still usable and the library must keep serving.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn primary(&self) -> std::sync::MutexGuard<'_, Map<u32, (u32, u64)>> {
        self.primary.lock().unwrap_or_else(|e| e.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn key_hasher_spreads_aligned_pointers() {
        // Device pointers are 2 MiB aligned here: the low bits (which pick
        // the bucket) must still differ.
        let b = BuildHasherDefault::<KeyHasher>::default();
        let low: std::collections::HashSet<u64> = (0..256u64)
            .map(|i| b.hash_one(0x7f00_0000_0000 + (i << 21)) & 0xff)
            .collect();
        assert!(low.len() > 128, "only {} distinct low bytes", low.len());
    }
}
