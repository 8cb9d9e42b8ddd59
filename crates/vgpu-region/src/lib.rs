//! vgpu's shared region: the tiny multiprocess database every process of a
//! container maps (docs/design.md section 5, docs/region.md).
//!
//! - One `#[repr(C)]` format ([`layout`]), self-describing and refused
//!   with a specific [`FormatError`] when foreign, truncated, of another
//!   version or layout. Native byte order (little-endian on every supported
//!   target, recorded in the header), 64-byte aligned slots.
//! - Creation exactly once under a `flock` the kernel drops if the creator
//!   dies; readers of a ready file take no lock at all.
//! - Registration by compare-exchange on a free slot; the owner word holds
//!   (pid, start time, PID-namespace index) so PID reuse cannot fool
//!   reclaim and no process judges a namespace it cannot see.
//! - Exact admission: add to your own slot, then sum; over the limit, take
//!   it back (see [`core`]).
//! - The limits file ([`limits`]): the operator's limits, read-only to the
//!   tenant; the region header keeps a display copy.
//! - Readers that must not trust the tenant (the node agent, `vgpu
//!   inspect`) read a private copy (`Region::open_copy`): a tenant that
//!   truncates its file cannot SIGBUS them.
//!
//! The crate is meant to live inside a preloaded cdylib: it never panics on
//! file contents, logs nothing, keeps no global state, starts no threads,
//! and every wait is bounded.

#[cfg(not(loom))]
pub mod board;
#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
mod copy;
pub mod core;
pub mod failpoint;
#[cfg(not(loom))]
pub mod ident;
pub mod layout;
#[cfg(not(loom))]
pub mod limits;
#[cfg(not(loom))]
mod open;
pub mod pacing;
#[cfg(not(loom))]
mod region;
pub mod seqlock;
#[cfg(not(loom))]
mod shm;
#[cfg(not(loom))]
mod snapshot;
mod sync;
pub mod telemetry;
pub mod units;

pub use crate::core::{AdmissionError, MemKind, Release, MAX_RESERVATION};
#[cfg(not(loom))]
pub use clock::{monotonic_ns, realtime_ns, TscClock};
pub use layout::{FormatError, HeaderInfo};
#[cfg(not(loom))]
pub use region::{
    CreateOptions, DeviceConfig, DisplayMismatch, LimitMismatch, Region, RegionError, SlotId,
    SlotOwner, SlotRef, Unusable, DEFAULT_LOCK_WAIT, NO_TMPFILE_ENV, REGION_MODE,
};
#[cfg(not(loom))]
pub use snapshot::{
    DeviceSnapshot, IdentitySnapshot, PacingSnapshot, SlotDeviceSnapshot, SlotLimiterDevice,
    SlotLimiterSnapshot, SlotSnapshot, Snapshot,
};
pub use telemetry::{
    DegradedReason, Fallback, IdentityState, IdentityTier, LimiterState, Limits, Phase, RunStatus,
    Usage, UtilSource,
};
pub use units::SizeError;

/// Loom's view of the algorithms: fresh in-memory regions to run them on.
#[cfg(loom)]
pub mod model {
    pub use crate::core::*;
    pub use crate::layout::{RawHeader, RawPacing, RawSlot, RawSlotPacing};
    pub use crate::pacing::{lease_holder, release_lease, try_lease, Bounds, Bucket};

    /// An in-memory region of `n` slots (all atomics zero).
    pub struct Mem {
        /// Header.
        pub header: Box<RawHeader>,
        /// Owner words.
        pub owners: Vec<crate::sync::AtomicU64>,
        /// Totals (device-major).
        pub totals: Vec<crate::sync::AtomicU64>,
        /// Slots.
        pub slots: Vec<RawSlot>,
        /// Pacing cells (one per device).
        pub pacing: Vec<crate::layout::RawPacing>,
        /// Slot pacing records.
        pub slot_pacing: Vec<crate::layout::RawSlotPacing>,
    }

    fn zeroed_header() -> RawHeader {
        use crate::sync::{AtomicU32, AtomicU64};
        let z64 = || AtomicU64::new(0);
        let z32 = || AtomicU32::new(0);
        RawHeader {
            magic: z64(),
            version: z32(),
            endian: z32(),
            header_size: z32(),
            device_size: z32(),
            slot_size: z32(),
            slot_count: z32(),
            device_count: z32(),
            max_devices: z32(),
            layout_hash: z64(),
            state: z32(),
            creator_pid: z32(),
            created_unix_ns: z64(),
            slot_high_water: z32(),
            limits_generation: z32(),
            pacing_size: z32(),
            slot_pacing_size: z32(),
            _reserved: std::array::from_fn(|_| z64()),
            ns_table: std::array::from_fn(|_| z64()),
            devices: std::array::from_fn(|_| crate::layout::RawDevice {
                uuid: std::array::from_fn(|_| z64()),
                mem_limit: z64(),
                sm_limit: z32(),
                _pad: z32(),
                _reserved: std::array::from_fn(|_| z64()),
            }),
        }
    }

    fn zeroed_slot() -> RawSlot {
        use crate::sync::{AtomicU32, AtomicU64};
        let z64 = || AtomicU64::new(0);
        let z32 = || AtomicU32::new(0);
        RawSlot {
            _reserved0: z64(),
            start_time: z64(),
            host_pid: z32(),
            pid: z32(),
            claimed_ns: z64(),
            identity_tier: z32(),
            identity_state: z32(),
            identity_attempts: z32(),
            identity_failure: z32(),
            identity_ns: z64(),
            run_status: z32(),
            _pad: z32(),
            phases: std::array::from_fn(|_| z64()),
            fallbacks: std::array::from_fn(|_| z64()),
            devices: std::array::from_fn(|_| crate::layout::RawSlotDevice {
                _reserved_total: z64(),
                context: z64(),
                module: z64(),
                data: z64(),
                monitor_mem: z64(),
                monitor_sm_util: z32(),
                _pad: z32(),
                _reserved: std::array::from_fn(|_| z64()),
            }),
        }
    }

    impl Mem {
        /// A zeroed region with `n` slots.
        pub fn new(n: usize) -> Self {
            let header = Box::new(zeroed_header());
            header.device_count.store(
                crate::layout::MAX_DEVICES as u32,
                crate::sync::Ordering::SeqCst,
            );
            Mem {
                header,
                owners: (0..n).map(|_| crate::sync::AtomicU64::new(0)).collect(),
                totals: (0..n * crate::layout::MAX_DEVICES)
                    .map(|_| crate::sync::AtomicU64::new(0))
                    .collect(),
                slots: (0..n).map(|_| zeroed_slot()).collect(),
                pacing: (0..crate::layout::MAX_DEVICES)
                    .map(|_| crate::pacing::zeroed_pacing())
                    .collect(),
                slot_pacing: (0..n)
                    .map(|_| crate::pacing::zeroed_slot_pacing())
                    .collect(),
            }
        }

        /// The algorithms' view.
        pub fn view(&self) -> View<'_> {
            View {
                header: &self.header,
                owners: &self.owners,
                totals: &self.totals,
                slots: &self.slots,
                pacing: &self.pacing,
                slot_pacing: &self.slot_pacing,
            }
        }
    }
}
