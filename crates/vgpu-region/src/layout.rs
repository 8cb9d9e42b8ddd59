//! The file format: one `#[repr(C)]` definition every reader and writer
//! uses, and the pure header parser that decides whether a file is ours.
//!
//! File = header (`HEADER_SIZE`) | owner table (one u64 owner word per
//! slot, padded to a page) | totals table (one u64 admission total per
//! device and slot, device-major, padded to a page) | slots | pacing
//! section (the SM limiter's state: one container bucket per device, then
//! one pacing record per slot; see the end of this file). Owner words
//! sit together so a claimer scans a few cache lines of one page, and the
//! totals of one device sit together so an admission sum over 256 slots
//! reads 32 cache lines, not 256.
//!
//! Byte order is the machine's native order; every supported target is
//! little-endian and the header records a marker (`ENDIAN_MARK`) so a file
//! written by a big-endian machine is refused, never reinterpreted. Every
//! field is an atomic of its natural size at its natural alignment; the
//! header occupies the first `HEADER_SIZE` bytes (a page), slots follow,
//! each `SLOT_SIZE` bytes and 64-byte (cache-line) aligned. Offsets and
//! sizes are pinned by the const assertions at the bottom of this file.

use crate::sync::{AtomicI64, AtomicU32, AtomicU64};

/// First 8 bytes of every region file (stored as a native u64).
pub const MAGIC: [u8; 8] = *b"VGPUREG\0";
/// Layout version; bumped on any change of the structs below.
pub const VERSION: u32 = 3;
/// `0x0102_0304` written in native order; reads back swapped on a machine
/// of the other byte order.
pub const ENDIAN_MARK: u32 = 0x0102_0304;
/// `state` value once the creator finished initializing.
pub const STATE_READY: u32 = 0x5245_4459; // "READ(Y)"
/// `state` value while the creator (holding the file lock) initializes.
pub const STATE_INITIALIZING: u32 = 0x494e_4954; // "INIT"

/// Devices per region (per-slot counters are sized for this many).
#[cfg(not(loom))]
pub const MAX_DEVICES: usize = 16;
#[cfg(loom)]
pub const MAX_DEVICES: usize = 1;
/// Distinct PID namespaces whose processes may own slots of one region.
#[cfg(not(loom))]
pub const NS_TABLE_LEN: usize = 64;
#[cfg(loom)]
pub const NS_TABLE_LEN: usize = 2;
/// Phase timestamp cells per slot (10 used, see `Phase`).
#[cfg(not(loom))]
pub const PHASE_CELLS: usize = 16;
#[cfg(loom)]
pub const PHASE_CELLS: usize = 1;
/// Fallback counters per slot (see `Fallback`).
#[cfg(not(loom))]
pub const FALLBACK_CELLS: usize = 8;
#[cfg(loom)]
pub const FALLBACK_CELLS: usize = 1;

/// Header bytes before the first slot (one page).
pub const HEADER_SIZE: usize = 4096;
/// Default slot count when `CreateOptions::slots` is 0.
pub const DEFAULT_SLOTS: u32 = 1024;
/// Largest slot count accepted (a 80 MiB file); more is surely corruption.
pub const MAX_SLOTS: u32 = 65536;
/// Bytes of a device UUID field (NUL-terminated, so 63 usable).
pub const UUID_LEN: usize = 64;

/// The region header (offset 0).
#[repr(C)]
pub struct RawHeader {
    /// `MAGIC` as a native u64.
    pub magic: AtomicU64,
    /// `VERSION`.
    pub version: AtomicU32,
    /// `ENDIAN_MARK`.
    pub endian: AtomicU32,
    /// `HEADER_SIZE`.
    pub header_size: AtomicU32,
    /// `size_of::<RawDevice>()`.
    pub device_size: AtomicU32,
    /// `size_of::<RawSlot>()`.
    pub slot_size: AtomicU32,
    /// Number of slots (chosen at creation).
    pub slot_count: AtomicU32,
    /// Number of devices configured (≤ `MAX_DEVICES`).
    pub device_count: AtomicU32,
    /// `MAX_DEVICES` of the writer.
    pub max_devices: AtomicU32,
    /// `layout_hash()` of the writer.
    pub layout_hash: AtomicU64,
    /// `STATE_INITIALIZING` → `STATE_READY` (Release) once.
    pub state: AtomicU32,
    /// PID (in its own namespace) of the creator, for humans.
    pub creator_pid: AtomicU32,
    /// CLOCK_REALTIME ns at creation, for humans.
    pub created_unix_ns: AtomicU64,
    /// One past the highest slot index ever claimed: admission sums only
    /// slots below it, so a region with few processes sums few slots.
    pub slot_high_water: AtomicU32,
    /// Bumped on every live limit change (readers may cache limits).
    pub limits_generation: AtomicU32,
    /// `size_of::<RawPacing>()` (layout version 3).
    pub pacing_size: AtomicU32,
    /// `size_of::<RawSlotPacing>()` (layout version 3).
    pub slot_pacing_size: AtomicU32,
    /// Reserved, zero.
    pub _reserved: [AtomicU64; 7],
    /// PID-namespace inodes of slot owners; a slot's owner word stores the
    /// index into this table (claimed by compare-exchange, never freed).
    pub ns_table: [AtomicU64; NS_TABLE_LEN],
    /// Per-device configuration.
    pub devices: [RawDevice; MAX_DEVICES],
}

/// Per-device configuration in the header.
#[repr(C, align(64))]
pub struct RawDevice {
    /// UUID bytes, NUL-padded (written once at creation).
    pub uuid: [AtomicU64; UUID_LEN / 8],
    /// Memory limit in bytes; 0 = none. Changed live by `set_limits`.
    pub mem_limit: AtomicU64,
    /// SM limit in percent; 0 = none.
    pub sm_limit: AtomicU32,
    /// Reserved, zero.
    pub _pad: AtomicU32,
    /// Reserved, zero.
    pub _reserved: [AtomicU64; 6],
}

/// One process's slot. Its owner word lives in the owner table: state
/// (2 bits) | pid-namespace index (6) | pid (22) | start time (low 34 bits
/// of clock ticks); 0 = free. The whole owner identity is published by the
/// single compare-exchange that claims the slot, so no window exists where
/// a slot is taken but anonymous.
#[repr(C, align(64))]
pub struct RawSlot {
    /// Reserved, zero (room for a generation counter).
    pub _reserved0: AtomicU64,
    /// Full process start time (clock ticks since boot, /proc stat field 22).
    pub start_time: AtomicU64,
    /// PID in the host namespace, when identity found it (0 = unknown).
    pub host_pid: AtomicU32,
    /// PID in the owner's namespace (also in `owner`; here for readers).
    pub pid: AtomicU32,
    /// CLOCK_MONOTONIC ns when the slot was claimed.
    pub claimed_ns: AtomicU64,
    /// `IdentityTier` as u32.
    pub identity_tier: AtomicU32,
    /// `IdentityState` as u32.
    pub identity_state: AtomicU32,
    /// Identity attempts so far.
    pub identity_attempts: AtomicU32,
    /// Last identity failure code (interposer-defined; 0 = none).
    pub identity_failure: AtomicU32,
    /// Time identity took, ns.
    pub identity_ns: AtomicU64,
    /// `RunStatus` as u32.
    pub run_status: AtomicU32,
    /// Reserved, zero.
    pub _pad: AtomicU32,
    /// CLOCK_MONOTONIC ns per `Phase` (0 = not reached).
    pub phases: [AtomicU64; PHASE_CELLS],
    /// Counts per `Fallback`.
    pub fallbacks: [AtomicU64; FALLBACK_CELLS],
    /// Per-device usage and monitor samples.
    pub devices: [RawSlotDevice; MAX_DEVICES],
}

/// One slot's usage of one device (one cache line). Its admission total
/// (every reservation and transient attempt of the slot; ≥ context +
/// module at all times, the rest being data) lives in the dense totals
/// table.
#[repr(C, align(64))]
pub struct RawSlotDevice {
    /// Reserved, zero.
    pub _reserved_total: AtomicU64,
    /// Context memory.
    pub context: AtomicU64,
    /// Module memory.
    pub module: AtomicU64,
    /// Not written: data allocations have no counter of their own (they
    /// are the total less context and module). Earlier layout-3 builds
    /// kept one here; nothing reads it now.
    pub data: AtomicU64,
    /// Monitor sample: memory the driver reports for this process.
    pub monitor_mem: AtomicU64,
    /// Monitor sample: SM utilization percent.
    pub monitor_sm_util: AtomicU32,
    /// Reserved, zero.
    pub _pad: AtomicU32,
    /// Reserved, zero.
    pub _reserved: [AtomicU64; 2],
}

/// Size of one device record.
pub const DEVICE_SIZE: usize = std::mem::size_of::<RawDevice>();
/// Size of one slot.
pub const SLOT_SIZE: usize = std::mem::size_of::<RawSlot>();

/// Bytes of the owner table for `slots` slots (whole pages).
pub const fn owners_len(slots: u32) -> u64 {
    (slots as u64 * 8).div_ceil(4096) * 4096
}

/// Offset of the totals table (`MAX_DEVICES` × `slots` u64, device-major).
pub const fn totals_offset(slots: u32) -> u64 {
    HEADER_SIZE as u64 + owners_len(slots)
}

/// Bytes of the totals table (whole pages).
pub const fn totals_len(slots: u32) -> u64 {
    (MAX_DEVICES as u64 * slots as u64 * 8).div_ceil(4096) * 4096
}

/// Offset of slot 0.
pub const fn slots_offset(slots: u32) -> u64 {
    totals_offset(slots) + totals_len(slots)
}

/// Offset of the pacing section: the container buckets
/// (`MAX_DEVICES` × `RawPacing`), after the slots, page-aligned.
pub const fn pacing_offset(slots: u32) -> u64 {
    (slots_offset(slots) + slots as u64 * SLOT_SIZE as u64).div_ceil(4096) * 4096
}

/// Offset of the per-slot pacing records (`slots` × `RawSlotPacing`), after
/// the container buckets, page-aligned.
pub const fn slot_pacing_offset(slots: u32) -> u64 {
    pacing_offset(slots) + (MAX_DEVICES as u64 * PACING_SIZE as u64).div_ceil(4096) * 4096
}

/// Total file length for `slots` slots.
pub const fn file_len(slots: u32) -> u64 {
    slot_pacing_offset(slots) + slots as u64 * SLOT_PACING_SIZE as u64
}

const fn fnv1a(mut h: u64, v: u64) -> u64 {
    let mut i = 0;
    while i < 8 {
        h ^= (v >> (i * 8)) & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// A hash of every size and offset a reader relies on; two builds that
/// disagree on the layout disagree on this.
pub const fn layout_hash() -> u64 {
    use std::mem::{offset_of, size_of};
    let parts: [usize; 33] = [
        VERSION as usize,
        // Pacing section after the slots (version 3): buckets, then one
        // record per slot, each page-aligned.
        0x0003_9ace_0001,
        size_of::<RawPacing>(),
        offset_of!(RawPacing, refill_at_ns),
        offset_of!(RawPacing, util_ppm),
        offset_of!(RawPacing, sampler_lease),
        size_of::<RawSlotPacing>(),
        offset_of!(RawSlotPacing, devices),
        size_of::<RawSlotPacingDevice>(),
        // Owner table, then device-major totals table, between header and
        // slots (8-byte words, each page-padded).
        0x0417_0008_0002,
        HEADER_SIZE,
        size_of::<RawHeader>(),
        offset_of!(RawHeader, state),
        offset_of!(RawHeader, slot_high_water),
        offset_of!(RawHeader, ns_table),
        offset_of!(RawHeader, devices),
        NS_TABLE_LEN,
        MAX_DEVICES,
        size_of::<RawDevice>(),
        offset_of!(RawDevice, mem_limit),
        offset_of!(RawDevice, sm_limit),
        size_of::<RawSlot>(),
        offset_of!(RawSlot, start_time),
        offset_of!(RawSlot, host_pid),
        offset_of!(RawSlot, identity_tier),
        offset_of!(RawSlot, run_status),
        offset_of!(RawSlot, phases),
        offset_of!(RawSlot, fallbacks),
        offset_of!(RawSlot, devices),
        size_of::<RawSlotDevice>(),
        offset_of!(RawSlotDevice, data),
        offset_of!(RawSlotDevice, monitor_mem),
        offset_of!(RawSlotDevice, monitor_sm_util),
    ];
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < parts.len() {
        h = fnv1a(h, parts[i] as u64);
        i += 1;
    }
    h
}

// Pinned layout (the real file, not the loom model's shrunken one).
#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(cfg!(target_endian = "little"));
    assert!(offset_of!(RawHeader, magic) == 0);
    assert!(offset_of!(RawHeader, version) == 8);
    assert!(offset_of!(RawHeader, endian) == 12);
    assert!(offset_of!(RawHeader, header_size) == 16);
    assert!(offset_of!(RawHeader, device_size) == 20);
    assert!(offset_of!(RawHeader, slot_size) == 24);
    assert!(offset_of!(RawHeader, slot_count) == 28);
    assert!(offset_of!(RawHeader, device_count) == 32);
    assert!(offset_of!(RawHeader, max_devices) == 36);
    assert!(offset_of!(RawHeader, layout_hash) == 40);
    assert!(offset_of!(RawHeader, state) == 48);
    assert!(offset_of!(RawHeader, creator_pid) == 52);
    assert!(offset_of!(RawHeader, created_unix_ns) == 56);
    assert!(offset_of!(RawHeader, slot_high_water) == 64);
    assert!(offset_of!(RawHeader, limits_generation) == 68);
    assert!(offset_of!(RawHeader, pacing_size) == 72);
    assert!(offset_of!(RawHeader, slot_pacing_size) == 76);
    assert!(offset_of!(RawHeader, ns_table) == 136);
    assert!(offset_of!(RawHeader, devices) == 704);
    assert!(size_of::<RawHeader>() == 2752);
    assert!(size_of::<RawHeader>() <= HEADER_SIZE);
    assert!(size_of::<RawDevice>() == 128);
    assert!(offset_of!(RawDevice, mem_limit) == 64);
    assert!(offset_of!(RawDevice, sm_limit) == 72);
    assert!(size_of::<RawSlotDevice>() == 64);
    assert!(align_of::<RawSlotDevice>() == 64);
    assert!(offset_of!(RawSlotDevice, _reserved_total) == 0);
    assert!(offset_of!(RawSlotDevice, monitor_sm_util) == 40);
    assert!(offset_of!(RawSlot, _reserved0) == 0);
    assert!(offset_of!(RawSlot, start_time) == 8);
    assert!(offset_of!(RawSlot, host_pid) == 16);
    assert!(offset_of!(RawSlot, pid) == 20);
    assert!(offset_of!(RawSlot, claimed_ns) == 24);
    assert!(offset_of!(RawSlot, identity_tier) == 32);
    assert!(offset_of!(RawSlot, identity_ns) == 48);
    assert!(offset_of!(RawSlot, run_status) == 56);
    assert!(offset_of!(RawSlot, phases) == 64);
    assert!(offset_of!(RawSlot, fallbacks) == 192);
    assert!(offset_of!(RawSlot, devices) == 256);
    assert!(size_of::<RawSlot>() == 1280);
    assert!(align_of::<RawSlot>() == 64);
    assert!(HEADER_SIZE.is_multiple_of(align_of::<RawSlot>()));
};

// ---- Pacing section (layout version 3): the SM limiter's shared state ----
//
// Own structs in their own part of the file, so the limiter's cells never
// share a cache line with admission counters. Written by the interposer's
// launch gate and its background sampler (`crate::pacing` holds every
// algorithm over these cells); read by `vgpu inspect` and the monitor.
// Limits are never taken from here: `share_ppm` and `mode` are copies for
// display, written by whichever process refilled or sampled last.

/// One container's pacing state for one device: the token bucket every
/// process of the container draws from (GPU-time nanoseconds), and the
/// container's measured utilization (always filled, limited or not).
#[repr(C, align(64))]
pub struct RawPacing {
    /// Tokens (GPU-ns the container may still start), an i64: charged
    /// below zero by launches whose cost exceeds what is left (debt).
    pub credit_ns: AtomicI64,
    /// CLOCK_MONOTONIC ns up to which time has been credited: a refiller
    /// claims the interval since then by compare-exchange, so every
    /// instant is credited once, whichever process refills.
    pub refill_at_ns: AtomicU64,
    /// GPU-ns charged so far (estimates plus corrections), cumulative.
    pub charged_ns: AtomicU64,
    /// GPU-ns measured so far by the container's markers, cumulative.
    pub measured_ns: AtomicU64,
    /// Launches that had to wait at the gate, cumulative.
    pub waits: AtomicU64,
    /// Share the last refiller used, ppm of the device's time (display).
    pub share_ppm: AtomicU32,
    /// `LimiterMode` code of the last refiller (display).
    pub mode: AtomicU32,
    /// Measurement correction (truth / markers), ppm; 0 = none yet (1.0).
    pub correction_ppm: AtomicU32,
    /// Most refill rate the sampler allows now, ppm of wall time (0: the
    /// whole device). Above the whole device only while NVML says the
    /// container gets less than its share (docs/limiter.md).
    pub rate_cap_ppm: AtomicU32,
    /// Reserved, zero.
    pub _reserved0: AtomicU64,
    /// The container's utilization of the device over the last window, ppm.
    pub util_ppm: AtomicU32,
    /// `UtilSource` code: what `util_ppm` was measured with.
    pub util_source: AtomicU32,
    /// CLOCK_MONOTONIC ns of that sample (0 = never).
    pub util_at_ns: AtomicU64,
    /// Length of the window it covers, ns.
    pub util_window_ns: AtomicU64,
    /// The sampler lease: (slot index + 1) << 44 | expiry in CLOCK_MONOTONIC
    /// ms; one process per container samples NVML for every device.
    pub sampler_lease: AtomicU64,
    /// Reserved, zero.
    pub _reserved1: [AtomicU64; 4],
}

/// One process's pacing record (one per slot, same index).
#[repr(C, align(64))]
pub struct RawSlotPacing {
    /// `LimiterState` code (active, degraded-identity, disabled, ...).
    pub state: AtomicU32,
    /// `DegradedReason` code while degraded (0 = none).
    pub reason: AtomicU32,
    /// CLOCK_MONOTONIC ns of the last state change.
    pub state_since_ns: AtomicU64,
    /// Reserved, zero.
    pub _reserved: [AtomicU64; 6],
    /// Per-device counters.
    pub devices: [RawSlotPacingDevice; MAX_DEVICES],
}

/// One process's pacing counters for one device.
#[repr(C)]
pub struct RawSlotPacingDevice {
    /// GPU-ns measured by this process's markers, cumulative (the sampler
    /// joins it with NVML's per-process time to correct the markers).
    pub measured_ns: AtomicU64,
    /// Launches that went through the gate, cumulative.
    pub launches: AtomicU64,
    /// Time spent waiting at the gate, ns, cumulative.
    pub waited_ns: AtomicU64,
    /// The current per-launch estimate, GPU-ns.
    pub estimate_ns: AtomicU64,
}

/// Size of one container bucket.
pub const PACING_SIZE: usize = std::mem::size_of::<RawPacing>();
/// Size of one slot's pacing record.
pub const SLOT_PACING_SIZE: usize = std::mem::size_of::<RawSlotPacing>();

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<RawPacing>() == 128);
    assert!(align_of::<RawPacing>() == 64);
    assert!(offset_of!(RawPacing, credit_ns) == 0);
    assert!(offset_of!(RawPacing, refill_at_ns) == 8);
    assert!(offset_of!(RawPacing, charged_ns) == 16);
    assert!(offset_of!(RawPacing, measured_ns) == 24);
    assert!(offset_of!(RawPacing, waits) == 32);
    assert!(offset_of!(RawPacing, share_ppm) == 40);
    assert!(offset_of!(RawPacing, mode) == 44);
    assert!(offset_of!(RawPacing, correction_ppm) == 48);
    // The sampler's cells start the second cache line: launches hammer the
    // first, the sampler writes the second a few times a second.
    assert!(offset_of!(RawPacing, util_ppm) == 64);
    assert!(offset_of!(RawPacing, util_source) == 68);
    assert!(offset_of!(RawPacing, util_at_ns) == 72);
    assert!(offset_of!(RawPacing, util_window_ns) == 80);
    assert!(offset_of!(RawPacing, sampler_lease) == 88);
    assert!(size_of::<RawSlotPacingDevice>() == 32);
    assert!(size_of::<RawSlotPacing>() == 576);
    assert!(align_of::<RawSlotPacing>() == 64);
    assert!(offset_of!(RawSlotPacing, state) == 0);
    assert!(offset_of!(RawSlotPacing, reason) == 4);
    assert!(offset_of!(RawSlotPacing, state_since_ns) == 8);
    assert!(offset_of!(RawSlotPacing, devices) == 64);
    assert!(pacing_offset(1024).is_multiple_of(4096));
    assert!(slot_pacing_offset(1024).is_multiple_of(4096));
    assert!(slot_pacing_offset(1024) == pacing_offset(1024) + 4096);
};

/// What a header says, once it has been checked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeaderInfo {
    /// Layout version.
    pub version: u32,
    /// Always "little" on supported targets.
    pub endianness: &'static str,
    /// Header bytes.
    pub header_size: u32,
    /// Device record bytes.
    pub device_size: u32,
    /// Slot bytes.
    pub slot_size: u32,
    /// Slots in the file.
    pub slot_count: u32,
    /// Devices configured.
    pub device_count: u32,
    /// Layout hash.
    pub layout_hash: u64,
    /// Creator PID (its namespace).
    pub creator_pid: u32,
    /// Creation time, Unix ns.
    pub created_unix_ns: u64,
    /// Expected (and checked) file length.
    pub file_len: u64,
}

/// Why a file is not a usable region. Each kind of refusal has its own
/// variant so tools and tests can tell them apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Shorter than a header, or shorter than its header says.
    #[error("truncated region file: {len} bytes, need {need}")]
    Truncated {
        /// Actual length.
        len: u64,
        /// Length needed.
        need: u64,
    },
    /// Not a vgpu region (first bytes shown).
    #[error(
        "not a vgpu region file (starts with \"{}\", expected \"{}\")",
        found.escape_ascii(),
        MAGIC.escape_ascii()
    )]
    ForeignMagic {
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// A vgpu region of another layout version.
    #[error("region layout version {found}, this build reads version {VERSION}")]
    OtherVersion {
        /// Version in the file.
        found: u32,
    },
    /// Written by a machine of the other byte order.
    #[error("region written with the other byte order (marker {found:#010x})")]
    OtherEndianness {
        /// Marker as read.
        found: u32,
    },
    /// Same version but a different struct layout (another build).
    #[error("region layout differs from this build: {what} is {found}, expected {expected}")]
    OtherLayout {
        /// Which field disagrees.
        what: &'static str,
        /// Value in the file.
        found: u64,
        /// Value this build uses.
        expected: u64,
    },
    /// Header values that cannot be right.
    #[error("corrupt region header: {what} = {found}")]
    Corrupt {
        /// Which field.
        what: &'static str,
        /// Its value.
        found: u64,
    },
    /// Header not (yet) marked initialized.
    #[error("region not initialized (state {state:#010x}): its creator is still at work or died")]
    NotInitialized {
        /// The state word.
        state: u32,
    },
}

fn rd_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_ne_bytes(a)
}

fn rd_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

/// Minimum bytes `parse_header` needs to decide.
pub const PARSE_MIN: usize = 80;

/// Checks a header given its first bytes and the file's length. Pure: used
/// by `open`, the fuzz target and the tests. Never panics.
pub fn parse_header(bytes: &[u8], file_len_actual: u64) -> Result<HeaderInfo, FormatError> {
    if bytes.len() < 8 {
        return Err(FormatError::Truncated {
            len: bytes.len() as u64,
            need: HEADER_SIZE as u64,
        });
    }
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&bytes[..8]);
    if magic != MAGIC {
        return Err(FormatError::ForeignMagic { found: magic });
    }
    if bytes.len() < PARSE_MIN || file_len_actual < HEADER_SIZE as u64 {
        return Err(FormatError::Truncated {
            len: file_len_actual.min(bytes.len() as u64),
            need: HEADER_SIZE as u64,
        });
    }
    let endian = rd_u32(bytes, 12);
    if endian != ENDIAN_MARK {
        return Err(FormatError::OtherEndianness { found: endian });
    }
    let version = rd_u32(bytes, 8);
    if version != VERSION {
        return Err(FormatError::OtherVersion { found: version });
    }
    let state = rd_u32(bytes, 48);
    if state != STATE_READY {
        return Err(FormatError::NotInitialized { state });
    }
    let checks: [(&'static str, u64, u64); 7] = [
        ("header_size", rd_u32(bytes, 16) as u64, HEADER_SIZE as u64),
        ("device_size", rd_u32(bytes, 20) as u64, DEVICE_SIZE as u64),
        ("slot_size", rd_u32(bytes, 24) as u64, SLOT_SIZE as u64),
        ("max_devices", rd_u32(bytes, 36) as u64, MAX_DEVICES as u64),
        ("pacing_size", rd_u32(bytes, 72) as u64, PACING_SIZE as u64),
        (
            "slot_pacing_size",
            rd_u32(bytes, 76) as u64,
            SLOT_PACING_SIZE as u64,
        ),
        ("layout_hash", rd_u64(bytes, 40), layout_hash()),
    ];
    for (what, found, expected) in checks {
        if found != expected {
            return Err(FormatError::OtherLayout {
                what,
                found,
                expected,
            });
        }
    }
    let slot_count = rd_u32(bytes, 28);
    if slot_count == 0 || slot_count > MAX_SLOTS {
        return Err(FormatError::Corrupt {
            what: "slot_count",
            found: slot_count as u64,
        });
    }
    let device_count = rd_u32(bytes, 32);
    if device_count as usize > MAX_DEVICES {
        return Err(FormatError::Corrupt {
            what: "device_count",
            found: device_count as u64,
        });
    }
    let need = file_len(slot_count);
    if file_len_actual < need {
        return Err(FormatError::Truncated {
            len: file_len_actual,
            need,
        });
    }
    Ok(HeaderInfo {
        version,
        endianness: "little",
        header_size: HEADER_SIZE as u32,
        device_size: DEVICE_SIZE as u32,
        slot_size: SLOT_SIZE as u32,
        slot_count,
        device_count,
        layout_hash: layout_hash(),
        creator_pid: rd_u32(bytes, 52),
        created_unix_ns: rd_u64(bytes, 56),
        file_len: need,
    })
}

/// The fuzz target's body (shared with the test that replays its seeds):
/// the first 8 bytes are the claimed file length, the rest the header
/// bytes. Checks that an accepted header is self-consistent.
pub fn fuzz_header(data: &[u8]) {
    let (len, bytes) = match data.split_first_chunk::<8>() {
        Some((l, rest)) => (u64::from_le_bytes(*l), rest),
        None => (data.len() as u64, data),
    };
    if let Ok(info) = parse_header(bytes, len) {
        assert!(info.slot_count >= 1 && info.slot_count <= MAX_SLOTS);
        assert!(info.device_count as usize <= MAX_DEVICES);
        assert!(len >= info.file_len);
        assert_eq!(info.file_len, file_len(info.slot_count));
    }
}
