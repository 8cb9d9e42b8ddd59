//! The lock-free algorithms over a region's structs: claim, reclaim,
//! admission, release. They see the region only as `View` (references to
//! the structs), so the loom model runs them over a small in-memory region
//! and the real code over the mapped file.
//!
//! Why admission is exact (docs/design.md section 5): a racer adds its request to
//! its own slot's total first (a SeqCst read-modify-write), then sums every
//! slot's total (SeqCst loads). SeqCst operations are totally ordered; take
//! the admitted reservation whose add came last: every other admitted
//! racer added before it, hence before this sum, so this sum saw all of
//! them and was within the limit (loom builds add a SeqCst fence after the
//! add: see `sum_after_rmw`). (Slots at or above the high-water mark hold nothing: a claimer
//! raises the mark before its first add.)
//!
//! Why a round of racers cannot all lose: a racer that saw too much takes
//! its request back and sums again; it retries (bounded, with back-off)
//! while the others' total leaves room for it. If every racer gave up, look
//! at the one whose final re-check came last: every other racer had taken
//! its request back before it, so that re-check saw room (unless the room
//! is held by admitted reservations) and it would have retried — so some
//! racer wins unless one exhausts its attempts.

use crate::layout::{
    RawHeader, RawPacing, RawSlot, RawSlotDevice, RawSlotPacing, MAX_DEVICES, NS_TABLE_LEN,
};
use crate::sync::{
    fence, AtomicU32, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Slot states (top two bits of the owner word).
pub const ST_FREE: u64 = 0;
/// Claimed by a process (alive or not yet found dead).
pub const ST_LIVE: u64 = 1;
/// Being cleared by the process named in the word.
pub const ST_RECLAIMING: u64 = 2;

const STATE_SHIFT: u32 = 62;
const NS_SHIFT: u32 = 56;
const NS_MASK: u64 = 0x3f;
const PID_SHIFT: u32 = 34;
const PID_MASK: u64 = (1 << 22) - 1;
/// Mask of the start-time bits kept in the owner word.
pub const START_MASK: u64 = (1 << 34) - 1;

/// A process identity as stored in an owner word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Index into the header's namespace table.
    pub ns_index: u8,
    /// PID in that namespace (< 2^22, the kernel's PID_MAX_LIMIT).
    pub pid: u32,
    /// Process start time, low 34 bits of clock ticks (5 years at 100 Hz).
    pub start34: u64,
}

/// Packs a state and an owner into one word.
pub fn encode(state: u64, o: Owner) -> u64 {
    (state << STATE_SHIFT)
        | ((o.ns_index as u64 & NS_MASK) << NS_SHIFT)
        | ((o.pid as u64 & PID_MASK) << PID_SHIFT)
        | (o.start34 & START_MASK)
}

/// Unpacks an owner word.
pub fn decode(w: u64) -> (u64, Owner) {
    (
        w >> STATE_SHIFT,
        Owner {
            ns_index: ((w >> NS_SHIFT) & NS_MASK) as u8,
            pid: ((w >> PID_SHIFT) & PID_MASK) as u32,
            start34: w & START_MASK,
        },
    )
}

/// What the algorithms need from the outside world.
pub trait Env {
    /// Is this owner (same namespace as the caller) certainly gone?
    fn is_dead(&self, o: Owner) -> bool;
    /// A named step (fail points in test builds; nothing otherwise).
    fn step(&self, _name: &'static str) {}
}

/// The region as the algorithms see it.
pub struct View<'a> {
    /// The header.
    pub header: &'a RawHeader,
    /// Owner word of each slot (same length as `slots`).
    pub owners: &'a [AtomicU64],
    /// Admission totals, device-major: `totals[dev * slots + slot]`
    /// (`MAX_DEVICES * slots` cells), dense so a sum reads few cache lines.
    pub totals: &'a [AtomicU64],
    /// All slots.
    pub slots: &'a [RawSlot],
    /// The container's pacing state, one per device (`MAX_DEVICES`).
    pub pacing: &'a [RawPacing],
    /// Each slot's pacing record (same length as `slots`).
    pub slot_pacing: &'a [RawSlotPacing],
}

impl View<'_> {
    /// Admission total of `slot` on `dev`.
    pub fn total(&self, dev: usize, slot: usize) -> &AtomicU64 {
        &self.totals[dev * self.slots.len() + slot]
    }
}

/// Memory kind of a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum MemKind {
    /// Context memory.
    Context,
    /// Module (code) memory.
    Module,
    /// Data allocations.
    Data,
}

/// The counter of `kind`: none for data, which is what the total holds
/// beyond context and module (see [`data_of`]). Data is nearly every
/// reservation, so an allocate/free pair pays for the total alone (one
/// shared read-modify-write each way, not two).
fn kind_counter(sd: &RawSlotDevice, kind: MemKind) -> Option<&AtomicU64> {
    match kind {
        MemKind::Context => Some(&sd.context),
        MemKind::Module => Some(&sd.module),
        MemKind::Data => None,
    }
}

/// A slot's data bytes on a device: its admission total less its context
/// and module memory (exact at rest; while one of the slot's own
/// reservations is being decided it includes those bytes).
pub fn data_of(total: u64, context: u64, module: u64) -> u64 {
    total.saturating_sub(context.saturating_add(module))
}

/// Finds (or adds) the namespace inode in the header's table.
pub fn ns_index(h: &RawHeader, inode: u64) -> Option<u8> {
    // 0 marks a free table entry; an unknown namespace gets its own marker.
    let inode = if inode == 0 { u64::MAX } else { inode };
    for (i, cell) in h.ns_table.iter().enumerate().take(NS_TABLE_LEN) {
        match cell.load(SeqCst) {
            v if v == inode => return Some(i as u8),
            0 => match cell.compare_exchange(0, inode, SeqCst, SeqCst) {
                Ok(_) => return Some(i as u8),
                Err(v) if v == inode => return Some(i as u8),
                Err(_) => continue,
            },
            _ => continue,
        }
    }
    None
}

fn zero64(c: &AtomicU64) {
    // Most cells are already zero: a load is cheaper than a SeqCst store.
    if c.load(Relaxed) != 0 {
        c.store(0, SeqCst);
    }
}

fn zero32(c: &AtomicU32) {
    if c.load(Relaxed) != 0 {
        c.store(0, SeqCst);
    }
}

/// Zeroes every counter and telemetry cell of slot `idx` (not its owner
/// word).
pub fn clear_slot<E: Env>(v: &View<'_>, idx: usize, env: &E) {
    let s = &v.slots[idx];
    // Only configured devices are ever written; touching the others' totals
    // would fault in a page per device for nothing.
    let ndev = (v.header.device_count.load(Relaxed) as usize).min(MAX_DEVICES);
    for (i, d) in s.devices.iter().enumerate().take(ndev) {
        zero64(&d.context);
        zero64(&d.module);
        zero64(&d.data);
        zero64(v.total(i, idx));
        zero64(&d.monitor_mem);
        zero32(&d.monitor_sm_util);
        if i == 0 {
            env.step("reclaim.mid_clear");
        }
    }
    if ndev == 0 {
        env.step("reclaim.mid_clear");
    }
    for c in [&s.start_time, &s.claimed_ns, &s.identity_ns] {
        zero64(c);
    }
    for c in [
        &s.host_pid,
        &s.pid,
        &s.identity_tier,
        &s.identity_state,
        &s.identity_attempts,
        &s.identity_failure,
        &s.run_status,
    ] {
        zero32(c);
    }
    for p in s.phases.iter().chain(s.fallbacks.iter()) {
        zero64(p);
    }
    if let Some(p) = v.slot_pacing.get(idx) {
        crate::pacing::clear_slot_pacing(p, ndev);
    }
}

/// Claims the lowest free slot for `me` by compare-exchange. The owner word
/// names the owner completely, so a claimer killed right after the
/// exchange leaves a slot any same-namespace process can reclaim.
pub fn claim<E: Env>(v: &View<'_>, me: Owner, env: &E) -> Option<usize> {
    let word = encode(ST_LIVE, me);
    env.step("register.before_claim");
    for (i, o) in v.owners.iter().enumerate() {
        if o.load(SeqCst) != ST_FREE {
            continue;
        }
        if o.compare_exchange(ST_FREE, word, SeqCst, SeqCst).is_ok() {
            env.step("register.after_claim");
            // Raised before any counter of this slot can become non-zero,
            // so every admission sum that could miss this slot's bytes
            // happened before them (see the module comment).
            // Load first: a read-modify-write would dirty the header page
            // (a write fault per process on a file mapping) even when the
            // mark is already past this slot, as it is once slots recycle.
            if v.header.slot_high_water.load(SeqCst) < i as u32 + 1 {
                v.header.slot_high_water.fetch_max(i as u32 + 1, SeqCst);
            }
            fence(SeqCst);
            // Write before reading: on a shared file mapping the first
            // access of a page decides the fault; a load first costs a read
            // fault and then a write-protect fault (page_mkwrite, the
            // filesystem's journal) at the first store. The cell is
            // reserved and always zero.
            v.slots[i]._reserved0.store(0, Relaxed);
            // A free slot is all zero; clear anyway so a slot left dirty by
            // a misbehaving owner cannot hand phantom bytes to its successor.
            clear_slot(v, i, &NoSteps);
            return Some(i);
        }
    }
    None
}

struct NoSteps;
impl Env for NoSteps {
    fn is_dead(&self, _o: Owner) -> bool {
        false
    }
}

/// Frees the slot if `me` owns it (LIVE). Its reservations vanish.
pub fn unregister<E: Env>(v: &View<'_>, idx: usize, me: Owner, env: &E) -> bool {
    let Some(o) = v.owners.get(idx) else {
        return false;
    };
    let live = encode(ST_LIVE, me);
    // Mark it as being cleared by us: if we die half way, any process
    // reclaims it like any dead owner's slot.
    if o.compare_exchange(live, encode(ST_RECLAIMING, me), SeqCst, SeqCst)
        .is_err()
    {
        return false;
    }
    env.step("unregister.after_mark");
    clear_slot(v, idx, env);
    o.store(ST_FREE, SeqCst);
    true
}

/// Reclaims every slot (LIVE or RECLAIMING) of `me`'s namespace whose owner
/// is dead. Returns how many were freed.
pub fn reclaim_dead<E: Env>(v: &View<'_>, me: Owner, env: &E) -> usize {
    // Other namespaces are not ours to judge.
    reclaim_if(v, me, env, |_, _, o| {
        o.ns_index == me.ns_index && env.is_dead(o)
    })
}

/// Reclaims every claimed slot for which `dead(index, state, owner)` says
/// so, except slots named by `me` itself (another thread of ours may be
/// mid-reclaim or mid-unregister). The slot is first marked RECLAIMING by
/// `me`, so if we die half way, a process of our namespace finishes it.
pub fn reclaim_if<E: Env>(
    v: &View<'_>,
    me: Owner,
    env: &E,
    dead: impl Fn(usize, u64, Owner) -> bool,
) -> usize {
    let mine = encode(ST_RECLAIMING, me);
    let mut freed = 0;
    for (idx, cell) in v.owners.iter().enumerate() {
        let w = cell.load(SeqCst);
        if w == ST_FREE {
            continue;
        }
        let (st, o) = decode(w);
        if o.ns_index == me.ns_index && o.pid == me.pid && o.start34 == me.start34 {
            continue;
        }
        if (st != ST_LIVE && st != ST_RECLAIMING) || !dead(idx, st, o) {
            continue;
        }
        if cell.compare_exchange(w, mine, SeqCst, SeqCst).is_err() {
            continue;
        }
        env.step("reclaim.after_mark");
        clear_slot(v, idx, env);
        env.step("reclaim.before_free");
        cell.store(ST_FREE, SeqCst);
        freed += 1;
    }
    freed
}

/// Number of slots an admission sum must cover.
fn sum_range(v: &View<'_>) -> usize {
    (v.header.slot_high_water.load(SeqCst) as usize).min(v.slots.len())
}

/// Sum of every slot's admission total for `dev` (saturating).
pub fn device_total(v: &View<'_>, dev: usize) -> u64 {
    let n = sum_range(v);
    let base = dev * v.slots.len();
    let cells = &v.totals[base..base + n];
    // Four independent u128 lanes: no overflow to check per cell and no
    // single add chain (a saturating add per cell costs ~2 cycles each).
    let mut lanes = [0u128; 4];
    let mut quads = cells.chunks_exact(4);
    for q in &mut quads {
        for (lane, t) in lanes.iter_mut().zip(q) {
            *lane += t.load(SeqCst) as u128;
        }
    }
    for t in quads.remainder() {
        lanes[0] += t.load(SeqCst) as u128;
    }
    let sum: u128 = lanes.iter().sum();
    u64::try_from(sum).unwrap_or(u64::MAX)
}

/// Refusal of `reserve`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// Granting would exceed the device's memory limit.
    #[error("over the memory limit: limit {limit} bytes, in use {in_use}, requested {requested}")]
    OverLimit {
        /// The limit in force.
        limit: u64,
        /// Bytes in use by others when refused.
        in_use: u64,
        /// The request.
        requested: u64,
    },
    /// The device index is not configured in this region.
    #[error("device {dev} is not in this region ({count} devices)")]
    NoSuchDevice {
        /// Index asked for.
        dev: u32,
        /// Devices configured.
        count: u32,
    },
    /// The slot index is out of range.
    #[error("slot {slot} is out of range")]
    NoSuchSlot {
        /// Index asked for.
        slot: u32,
    },
    /// A size no device has (above `MAX_RESERVATION`, e.g. a failed
    /// `cuMemAlloc(SIZE_MAX)`), or one the slot's counter cannot hold:
    /// refused so that no counter ever wraps.
    #[error("unrepresentable request of {requested} bytes (at most {MAX_RESERVATION} at once, and a slot's total stays below 2^64)")]
    Unrepresentable {
        /// The request.
        requested: u64,
    },
}

/// The largest single reservation or release (64 PiB): no device has more
/// memory, and with every request below it no sum of them in flight can
/// come near wrapping a u64 counter unnoticed.
pub const MAX_RESERVATION: u64 = 1 << 56;

/// `c += bytes` unless that would pass u64::MAX (then nothing, false): a
/// SeqCst read-modify-write, as the admission proof needs.
fn checked_add(c: &AtomicU64, bytes: u64) -> bool {
    let mut cur = c.load(SeqCst);
    loop {
        let Some(new) = cur.checked_add(bytes) else {
            return false;
        };
        match c.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
            Ok(_) => return true,
            Err(v) => cur = v,
        }
    }
}

/// `c += bytes`, stopping at u64::MAX (a counter someone corrupted must not
/// wrap to a small value).
fn saturating_add(c: &AtomicU64, bytes: u64) {
    let mut cur = c.load(SeqCst);
    while let Err(v) = c.compare_exchange_weak(cur, cur.saturating_add(bytes), SeqCst, SeqCst) {
        cur = v;
    }
}

/// Orders a SeqCst read-modify-write of a total before the SeqCst loads
/// of the sum that follow. Both are SeqCst, so the one total order over
/// SeqCst operations already forbids the store-buffering outcome (two
/// racers each missing the other's add), and on x86 the locked RMW is a
/// full barrier anyway: no fence in a normal build (it was a locked
/// instruction on every allocation). loom models SeqCst accesses as
/// AcqRel but models fences, so its builds keep one.
#[inline(always)]
fn sum_after_rmw() {
    #[cfg(loom)]
    fence(SeqCst);
}

/// Attempts a racer makes while the others leave room.
#[cfg(not(loom))]
const ADMIT_ATTEMPTS: u32 = 24;
#[cfg(loom)]
const ADMIT_ATTEMPTS: u32 = 2;

#[cfg(loom)]
fn backoff(_attempt: u32, _salt: usize) {
    crate::sync::yield_now();
}

#[cfg(not(loom))]
fn backoff(attempt: u32, salt: usize) {
    let spins = (1u32 << attempt.min(8))
        + (crate::sync::jitter().wrapping_add((salt as u32).wrapping_mul(2_654_435_761)) % 64);
    for _ in 0..spins {
        crate::sync::spin_loop();
    }
    crate::sync::yield_now();
}

/// Admits `bytes` of `kind` on `dev` for slot `idx` against `limit`
/// (0 = none). Never lets the admitted total of the region exceed `limit`.
pub fn reserve<E: Env>(
    v: &View<'_>,
    idx: usize,
    dev: usize,
    kind: MemKind,
    bytes: u64,
    limit: u64,
    env: &E,
) -> Result<(), AdmissionError> {
    let sd = &v.slots[idx].devices[dev];
    let total = v.total(dev, idx);
    if bytes == 0 {
        return Ok(());
    }
    let unrepresentable = Err(AdmissionError::Unrepresentable { requested: bytes });
    if bytes > MAX_RESERVATION {
        return unrepresentable;
    }
    if limit == 0 {
        if !checked_add(total, bytes) {
            return unrepresentable;
        }
        env.step("reserve.before_kind");
        if let Some(c) = kind_counter(sd, kind) {
            saturating_add(c, bytes);
        }
        return Ok(());
    }
    if bytes > limit {
        return Err(AdmissionError::OverLimit {
            limit,
            in_use: device_total(v, dev),
            requested: bytes,
        });
    }
    let mut others = 0;
    for attempt in 0..ADMIT_ATTEMPTS {
        env.step("reserve.before_add");
        if !checked_add(total, bytes) {
            return unrepresentable;
        }
        // The add must come before the loads of the sum against every other
        // racer (the store-buffering case): see `sum_after_rmw`.
        sum_after_rmw();
        env.step("reserve.after_add");
        let used = device_total(v, dev);
        if used <= limit {
            env.step("reserve.before_kind");
            if let Some(c) = kind_counter(sd, kind) {
                saturating_add(c, bytes);
            }
            return Ok(());
        }
        total.fetch_sub(bytes, SeqCst);
        sum_after_rmw();
        // What the others hold now (admitted or mid-attempt). If even that
        // leaves no room, this is a plain refusal; otherwise someone backed
        // off with us and one of us should try again.
        others = device_total(v, dev);
        if others.saturating_add(bytes) > limit {
            break;
        }
        backoff(attempt, idx);
    }
    Err(AdmissionError::OverLimit {
        limit,
        in_use: others,
        requested: bytes,
    })
}

/// Result of `release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Release {
    /// Bytes actually taken off the counters.
    pub released: u64,
    /// The request exceeded what the slot held for that kind (the caller
    /// should log it): the counter went to zero instead of wrapping.
    pub clamped: bool,
    /// The request was above `MAX_RESERVATION` (a size no reservation can
    /// have had): nothing was released.
    pub rejected: bool,
}

/// Gives back up to `bytes` of `kind` on `dev` for slot `idx`.
pub fn release<E: Env>(
    v: &View<'_>,
    idx: usize,
    dev: usize,
    kind: MemKind,
    bytes: u64,
    env: &E,
) -> Release {
    if bytes > MAX_RESERVATION {
        return Release {
            released: 0,
            clamped: false,
            rejected: true,
        };
    }
    let sd = &v.slots[idx].devices[dev];
    let total = v.total(dev, idx);
    let released = match kind_counter(sd, kind) {
        Some(kc) => {
            let mut cur = kc.load(SeqCst);
            let released = loop {
                let r = cur.min(bytes);
                match kc.compare_exchange_weak(cur, cur - r, SeqCst, SeqCst) {
                    Ok(_) => break r,
                    Err(c) => cur = c,
                }
            };
            env.step("release.before_total");
            // total ≥ context + module always holds (reserve adds to total
            // first, release subtracts from it last); saturate anyway.
            let mut t = total.load(SeqCst);
            while let Err(c) =
                total.compare_exchange_weak(t, t.saturating_sub(released), SeqCst, SeqCst)
            {
                t = c;
            }
            released
        }
        None => {
            // Data: at most what the total holds beyond context and module
            // (an over-release is clamped there; only a reservation of this
            // slot still being decided can lose bytes to one).
            let floor = sd
                .context
                .load(SeqCst)
                .saturating_add(sd.module.load(SeqCst));
            env.step("release.before_total");
            let mut t = total.load(SeqCst);
            loop {
                let r = t.saturating_sub(floor).min(bytes);
                match total.compare_exchange_weak(t, t - r, SeqCst, SeqCst) {
                    Ok(_) => break r,
                    Err(c) => t = c,
                }
            }
        }
    };
    Release {
        released,
        clamped: released < bytes,
        rejected: false,
    }
}

/// Checks a device index against the configured count.
pub fn check_dev(dev: u32, count: u32) -> Result<usize, AdmissionError> {
    if dev < count && (dev as usize) < MAX_DEVICES {
        Ok(dev as usize)
    } else {
        Err(AdmissionError::NoSuchDevice { dev, count })
    }
}
