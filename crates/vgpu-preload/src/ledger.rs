//! The process's view of its container's shared region: the one place this
//! library calls `vgpu-region` (open/create, register, reserve/release,
//! limits, phases), and the process-local record of what it charged
//! ([`Tables`], [`Charges`]).
//!
//! Must never decide policy (what to charge is `memory`'s) or call a driver.
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_alloc_table::AllocTable;

use vgpu_region::limits::DeviceLimit;
use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Phase, Region, SlotId, Unusable};

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

impl LedgerError {
    /// Why the region cannot be used (the fail-closed decision's input).
    pub fn unusable(&self) -> Unusable {
        match self {
            LedgerError::Open { source, .. } | LedgerError::Register { source, .. } => {
                source.unusable()
            }
        }
    }
}

/// Refusal: the request would cross the budget, or it is a size no
/// counter may hold (`requested` ≥ 2^56: refused, so nothing ever wraps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: u64,
    pub in_use: u64,
    pub requested: u64,
}

/// A budget as one atomic word: 0 = no limit, else limit + 1 (so a zero
/// budget, "admit nothing", is 1), saturating at u64::MAX.
fn encode_budget(b: Option<u64>) -> u64 {
    b.map_or(0, |n| n.saturating_add(1))
}

fn decode_budget(w: u64) -> Option<u64> {
    w.checked_sub(1)
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
    /// The memory limit this process enforces per region device (see
    /// `encode_budget`), set from the limits source, never read from the
    /// region's header at admission: a tenant writing the mapped header
    /// changes nothing that is enforced.
    budgets: Box<[AtomicU64]>,
    /// What this process holds per region device, in its own memory: a
    /// tenant zeroing this slot's counters in the shared file gets them
    /// back at this process's next reservation, never a wider budget.
    own: Box<[Own]>,
    /// CUDA ordinal -> where it is charged, by UUID (set once the driver
    /// can say; until then ordinal i is region device i).
    ords: OnceLock<Box<[Option<Loc>]>>,
    /// The driver's UUID of each CUDA ordinal (set with `ords`): budgets
    /// are looked up by what the driver says, not by the region's record.
    uuids: OnceLock<Box<[String]>>,
    /// Devices this process sees that the region does not describe (a
    /// first process with a narrower `CUDA_VISIBLE_DEVICES`, a header a
    /// tenant rewrote): charged on a process-private ledger against the
    /// configured limit, never unlimited.
    side: OnceLock<Side>,
    /// The region limits generation the budgets were last computed at.
    pub applied_generation: AtomicU64,
    /// Set for a process-private ledger: why the shared region could not
    /// be used.
    pub private_cause: Option<Unusable>,
}

/// Where one CUDA ordinal is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Region device `n` of the shared region.
    Shared(u32),
    /// Device `n` of the side ledger.
    Side(u32),
    /// Not described and no side ledger could be made: nothing is admitted.
    Closed,
}

/// The side ledger (see `Ledger::side`).
struct Side {
    region: Region,
    slot: SlotId,
    budgets: Box<[AtomicU64]>,
    own: Box<[Own]>,
    /// CUDA ordinal of each side device.
    ords: Box<[u32]>,
}

/// One device whose budget the limits source sets (`Ledger::targets`).
pub struct Target {
    pub loc: Loc,
    /// Its CUDA ordinal in this process (`None`: not visible here).
    pub ord: Option<u32>,
    /// The driver's UUID (the region's record before binding).
    pub uuid: String,
    /// The shared region's display copy (`None` for a side device).
    pub shown: Option<DeviceLimit>,
}

/// One device of one region, resolved for a charge.
struct At<'a> {
    region: &'a Region,
    slot: SlotId,
    dev: u32,
    budget: Option<&'a AtomicU64>,
    own: Option<&'a Own>,
}

/// One device's limits for region creation.
pub struct NewDevice {
    pub uuid: String,
    pub mem_limit: u64,
    pub sm_limit: u32,
}

fn zeros(n: u32) -> Box<[Own]> {
    (0..n).map(|_| Own::default()).collect()
}

/// What this process holds on one device, and a count of its changes, in
/// one word: the bytes held in the low [`OWN_BYTES`] bits and a change
/// count above them (wrapping), so every reserve and every release moves
/// the word with one read-modify-write, and a snapshot that reads the same
/// word before and after the slot's total knows that no change of this
/// process's record landed in between.
///
/// That makes the pair (ours, the slot's) safe to compare for a
/// write-down by someone else. A release takes its bytes off ours first
/// and off the slot's after: one whose first step landed before the
/// snapshot and whose second did not only makes the slot's read higher
/// (no restore); one whose first step landed inside the snapshot moved the
/// word (no pair). A reserve adds to the slot's total first and to ours
/// after: the same two cases the other way round. So a free racing the
/// check is never taken for a tenant's write, with no mark of "release
/// under way" (which cost a second read-modify-write per free).
///
/// A change below [`OWN_FAST`] is one locked add, not a compare-exchange
/// loop (which costs a load and a retry check more on every allocation and
/// free). Held bytes are exact below [`OWN_SANE`]; the snapshot takes no
/// pair above it, which covers the moment an over-release (a racing double
/// free) borrows from the count before its repair, and sizes no device
/// holds.
#[derive(Default)]
struct Own(AtomicU64);

/// One change in the count field.
const OWN_CHANGE: u64 = 1 << 48;
/// The bytes field.
const OWN_BYTES: u64 = OWN_CHANGE - 1;
/// Changes below this size (1 TiB) are one `fetch_add`; larger ones (a
/// request no device can back, with no limit to refuse it) saturate in a
/// compare-exchange loop.
const OWN_FAST: u64 = 1 << 40;
/// Above this (128 TiB) the bytes field is not a figure to restore from.
const OWN_SANE: u64 = 1 << 47;

impl Own {
    /// `(mine, slot total)` read with no change of this process's record
    /// landing in between; `None` when one did (the next call looks again)
    /// or the record holds no usable figure.
    fn quiet_snapshot(&self, slot_total: impl Fn() -> u64) -> Option<(u64, u64)> {
        let w = self.0.load(Ordering::SeqCst);
        let total = slot_total();
        let mine = w & OWN_BYTES;
        (self.0.load(Ordering::SeqCst) == w && mine < OWN_SANE).then_some((mine, total))
    }

    /// `bytes` ± `delta` and one more change, one compare-exchange loop.
    fn change(&self, f: impl Fn(u64) -> u64) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                let b = f(w & OWN_BYTES).min(OWN_BYTES);
                Some(((w & !OWN_BYTES).wrapping_add(OWN_CHANGE)) | b)
            });
    }

    /// A reserve of `bytes` succeeded (the slot's total already holds it).
    fn reserved(&self, bytes: u64) {
        if bytes < OWN_FAST {
            // No carry into the count while the field is below `OWN_SANE`.
            self.0.fetch_add(OWN_CHANGE + bytes, Ordering::SeqCst);
        } else {
            self.change(|b| b.saturating_add(bytes));
        }
    }

    /// A release starts: `bytes` fewer held (ours first, then the slot's:
    /// the slot's total never reads below what we record).
    fn released(&self, bytes: u64) {
        if bytes >= OWN_FAST {
            self.change(|b| b.saturating_sub(bytes));
            return;
        }
        let was = self
            .0
            .fetch_add(OWN_CHANGE.wrapping_sub(bytes), Ordering::SeqCst)
            & OWN_BYTES;
        if was < bytes {
            // An over-release borrowed from the count (which did not move)
            // and left the field near 2^48: adding the shortfall back carries
            // into the count, so the whole change reads as "one change, down
            // to 0", whatever landed in between (adds commute).
            self.0.fetch_add(bytes - was, Ordering::SeqCst);
        }
    }
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
        let opts = create_options(slots, devs);
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
        // Until the limits source sets them: the display copy, at most
        // (apply_budgets runs before the ledger is published).
        let budgets = (0..region.device_count())
            .map(|d| {
                AtomicU64::new(encode_budget(
                    DeviceLimit::from_region(region.limits(d)).memory,
                ))
            })
            .collect();
        let own = zeros(region.device_count());
        Ok(Ledger {
            region,
            slot,
            path,
            mapped_ns,
            claimed_ns: vgpu_region::monotonic_ns(),
            budgets,
            own,
            ords: OnceLock::new(),
            uuids: OnceLock::new(),
            side: OnceLock::new(),
            applied_generation: AtomicU64::new(u64::MAX),
            private_cause: None,
        })
    }

    /// A ledger only this process sees (`Region::private`): for a process
    /// with a limit to keep whose shared region cannot be used (fail
    /// closed). Same admission, same views.
    pub fn private(devs: Vec<NewDevice>, cause: Unusable) -> Result<Ledger, LedgerError> {
        let opts = create_options(16, devs);
        let region = Region::private(&opts).map_err(|source| LedgerError::Open {
            path: "(process-private ledger)".into(),
            source,
        })?;
        let p = region.path().display().to_string();
        let mut l = Self::register(region, p, vgpu_region::monotonic_ns())?;
        l.private_cause = Some(cause);
        Ok(l)
    }

    pub fn device_count(&self) -> u32 {
        self.region.device_count()
    }

    /// Where CUDA ordinal `ord` is charged (`None`: nowhere, before the
    /// ordinals are bound and past the region's devices).
    pub fn loc(&self, ord: u32) -> Option<Loc> {
        match self.ords.get() {
            Some(m) => m.get(ord as usize).copied().flatten(),
            None => (ord < self.device_count()).then_some(Loc::Shared(ord)),
        }
    }

    /// The shared region's device CUDA ordinal `ord` is (by UUID once
    /// bound), or `None` when the region does not describe it.
    pub fn index(&self, ord: u32) -> Option<u32> {
        match self.loc(ord)? {
            Loc::Shared(d) => Some(d),
            _ => None,
        }
    }

    /// The CUDA ordinal of region device `idx` (`None`: not visible here).
    pub fn ordinal_of(&self, idx: u32) -> Option<u32> {
        match self.ords.get() {
            Some(m) => m
                .iter()
                .position(|&d| d == Some(Loc::Shared(idx)))
                .map(|o| o as u32),
            None => Some(idx),
        }
    }

    /// Binds CUDA ordinals to region devices by the UUIDs the driver
    /// reports (`uuids[ordinal]`); once per ledger. Returns the ordinals
    /// the region does not describe: those are charged on a side ledger
    /// of this process (against the configured limit, see `targets`).
    pub fn bind_ordinals(&self, uuids: &[String]) -> Vec<u32> {
        let n = self.device_count();
        let mut map: Vec<Option<Loc>> = uuids
            .iter()
            .enumerate()
            .map(|(o, u)| {
                let by_uuid = (!u.is_empty())
                    .then(|| self.region.device_index(u))
                    .flatten();
                // A region device recorded without a UUID (its creator could
                // not read one) is the ordinal of the same index.
                by_uuid
                    .or_else(|| {
                        let o = o as u32;
                        (o < n && self.region.device_uuid(o).is_empty()).then_some(o)
                    })
                    .map(Loc::Shared)
            })
            .collect();
        let missing: Vec<u32> = map
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_none())
            .map(|(o, _)| o as u32)
            .collect();
        if !missing.is_empty() {
            let devs = missing
                .iter()
                .map(|&o| NewDevice {
                    uuid: uuids[o as usize].clone(),
                    mem_limit: 0,
                    sm_limit: 0,
                })
                .collect();
            let side = Region::private(&create_options(16, devs)).and_then(|r| {
                let slot = r.register()?;
                Ok((r, slot))
            });
            match side {
                Ok((region, slot)) => {
                    let k = missing.len() as u32;
                    // Nothing is admitted until the limits source sets the
                    // side budgets (apply_budgets runs right after binding).
                    let budgets = (0..k)
                        .map(|_| AtomicU64::new(encode_budget(Some(0))))
                        .collect();
                    let _ = self.side.set(Side {
                        region,
                        slot,
                        budgets,
                        own: zeros(k),
                        ords: missing.clone().into_boxed_slice(),
                    });
                    for (i, &o) in missing.iter().enumerate() {
                        map[o as usize] = Some(Loc::Side(i as u32));
                    }
                }
                Err(e) => {
                    crate::error!(
                        "no private ledger for CUDA device(s) {missing:?}: {}; nothing is admitted on them",
                        crate::log::chain(&e)
                    );
                    for &o in &missing {
                        map[o as usize] = Some(Loc::Closed);
                    }
                }
            }
        }
        let _ = self.uuids.set(uuids.to_vec().into_boxed_slice());
        let _ = self.ords.set(map.into_boxed_slice());
        missing
    }

    pub fn is_bound(&self) -> bool {
        self.ords.get().is_some()
    }

    /// The UUID the region records for region device `idx`.
    pub fn device_uuid(&self, idx: u32) -> String {
        self.region.device_uuid(idx)
    }

    /// The region header's display copy of device `idx`'s limits.
    pub fn display_limit(&self, idx: u32) -> DeviceLimit {
        DeviceLimit::from_region(self.region.limits(idx))
    }

    /// Every device whose budget this process sets: the shared region's
    /// (by the driver's UUID of the ordinal bound to it, once bound) and
    /// the side ledger's.
    pub fn targets(&self) -> Vec<Target> {
        let driver_uuid = |o: Option<u32>| {
            o.and_then(|o| self.uuids.get()?.get(o as usize).cloned())
                .filter(|u| !u.is_empty())
        };
        let mut out: Vec<Target> = (0..self.device_count())
            .map(|d| {
                let ord = self.ordinal_of(d);
                Target {
                    loc: Loc::Shared(d),
                    ord,
                    uuid: driver_uuid(ord).unwrap_or_else(|| self.device_uuid(d)),
                    shown: Some(self.display_limit(d)),
                }
            })
            .collect();
        if let Some(s) = self.side.get() {
            out.extend(s.ords.iter().enumerate().map(|(i, &o)| Target {
                loc: Loc::Side(i as u32),
                ord: Some(o),
                uuid: driver_uuid(Some(o)).unwrap_or_default(),
                shown: None,
            }));
        }
        out
    }

    /// Sets the memory budget enforced at `loc`.
    pub fn set_budget(&self, loc: Loc, b: Option<u64>) {
        let w = match loc {
            Loc::Shared(d) => self.budgets.get(d as usize),
            Loc::Side(d) => self.side.get().and_then(|s| s.budgets.get(d as usize)),
            Loc::Closed => None,
        };
        if let Some(w) = w {
            w.store(encode_budget(b), Ordering::Release);
        }
    }

    fn at(&self, loc: Loc) -> Option<At<'_>> {
        match loc {
            Loc::Shared(d) => Some(At {
                region: &self.region,
                slot: self.slot,
                dev: d,
                budget: self.budgets.get(d as usize),
                own: self.own.get(d as usize),
            }),
            Loc::Side(d) => self.side.get().map(|s| At {
                region: &s.region,
                slot: s.slot,
                dev: d,
                budget: s.budgets.get(d as usize),
                own: s.own.get(d as usize),
            }),
            Loc::Closed => None,
        }
    }

    /// The memory budget enforced on CUDA ordinal `ord` (`None`: none;
    /// `Some(0)`: nothing is admitted).
    pub fn mem_limit(&self, ord: u32) -> Option<u64> {
        match self.loc(ord)? {
            Loc::Closed => Some(0),
            loc => self
                .at(loc)?
                .budget
                .and_then(|w| decode_budget(w.load(Ordering::Acquire))),
        }
    }

    /// The region's limits generation (moves at every `vgpu limit`).
    pub fn limits_generation(&self) -> u64 {
        u64::from(self.region.limits_generation())
    }

    /// The container's live usage of `dev` (all processes, all kinds), for
    /// the memory views. A SIGKILLed process's bytes stay in the admission
    /// total until its slot is reclaimed; a view must not show them, so dead
    /// slots are reclaimed first (at most every `VIEW_RECLAIM_EVERY`, the
    /// pass costs a liveness check per claimed slot).
    pub fn used(&self, ord: u32) -> u64 {
        let Some(at) = self.loc(ord).and_then(|l| self.at(l)) else {
            return 0;
        };
        at.region.reclaim_dead_at_most_every(VIEW_RECLAIM_EVERY);
        at.region.device_used(at.dev)
    }

    /// Charges `bytes` to this process on CUDA ordinal `ord` against its
    /// budget. A device the region does not describe is charged on the
    /// side ledger against its configured limit; before the ordinals are
    /// bound, an ordinal past the region's devices has nothing to charge.
    /// A size no counter can hold is refused, never wrapped.
    pub fn reserve(&self, ord: u32, kind: Kind, bytes: u64) -> Result<(), OverLimit> {
        self.admit(ord, kind, bytes, true)
    }

    /// Records `bytes` the driver already holds for this process whatever
    /// the budget says (memory it backed beyond what was admitted): the
    /// ledger must show what the device holds, so that nothing more is
    /// admitted until it comes back under the budget. Only a size no counter
    /// can hold is refused.
    pub fn record_over_budget(&self, ord: u32, kind: Kind, bytes: u64) -> Result<(), OverLimit> {
        self.admit(ord, kind, bytes, false)
    }

    fn admit(&self, ord: u32, kind: Kind, bytes: u64, enforce: bool) -> Result<(), OverLimit> {
        if bytes > vgpu_region::MAX_RESERVATION {
            return Err(OverLimit {
                limit: self.mem_limit(ord).unwrap_or(0),
                in_use: self.used(ord),
                requested: bytes,
            });
        }
        let Some(loc) = self.loc(ord) else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        let Some(at) = self.at(loc) else {
            return Err(OverLimit {
                limit: 0,
                in_use: 0,
                requested: bytes,
            });
        };
        let limit = match at
            .budget
            .and_then(|w| decode_budget(w.load(Ordering::Acquire)))
            .filter(|_| enforce)
        {
            Some(0) => {
                return Err(OverLimit {
                    limit: 0,
                    in_use: at.region.device_used(at.dev),
                    requested: bytes,
                })
            }
            Some(n) => n,
            None => 0,
        };
        // What this process holds is in its own memory: a slot total below
        // it was written down by someone else (a tenant zeroing the file's
        // counters), and admitting against it would widen the budget.
        // The pair is read with no change of this process's record landing
        // in between (see `Own`), and the total is put back only if it has
        // not moved since: a concurrent free is never undone.
        if let Some((mine, was)) = at
            .own
            .and_then(|o| o.quiet_snapshot(|| at.region.slot_total(at.slot, at.dev)))
            .filter(|&(mine, was)| was < mine)
        {
            if at.region.restore_total(at.slot, at.dev, was, mine) {
                crate::error!(
                    "region {}: this process's usage of device {} was written down from {mine} B to {was} B by someone else; restored (admission counts what this process holds)",
                    self.path,
                    at.dev
                );
            }
        }
        let r = at
            .region
            .reserve_within(at.slot, at.dev, kind, bytes, limit);
        if let (Some(o), true) = (at.own, r.is_ok()) {
            o.reserved(bytes);
        }
        match r {
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
            Err(vgpu_region::AdmissionError::Unrepresentable { requested }) => Err(OverLimit {
                limit,
                in_use: at.region.device_used(at.dev),
                requested,
            }),
            Err(e) if limit == 0 => {
                crate::warn!(
                    "region refused a reservation on device {}: {e}; no limit applies, allowing it",
                    at.dev
                );
                Ok(())
            }
            Err(e) => {
                crate::error!(
                    "region refused a reservation on device {}: {e}; refusing it (a limit applies)",
                    at.dev
                );
                Err(OverLimit {
                    limit,
                    in_use: 0,
                    requested: bytes,
                })
            }
        }
    }

    pub fn release(&self, ord: u32, kind: Kind, bytes: u64) {
        let Some(at) = self.loc(ord).and_then(|l| self.at(l)) else {
            return;
        };
        if bytes == 0 {
            return;
        }
        // Our own record first, then the shared one: the slot's total never
        // reads below what we record (the restore in `reserve` relies on it).
        if let Some(o) = at.own {
            o.released(bytes);
        }
        let r = at.region.release(at.slot, at.dev, kind, bytes);
        if r.clamped {
            crate::debug!(
                "release of {bytes} B on device {} clamped to {}",
                at.dev,
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

fn create_options(slots: u32, devs: Vec<NewDevice>) -> CreateOptions {
    CreateOptions {
        slots,
        devices: devs
            .into_iter()
            .map(|d| DeviceConfig {
                uuid: d.uuid,
                mem_limit: d.mem_limit,
                sm_limit: d.sm_limit,
            })
            .collect(),
    }
}

/// What one charge was: device (CUDA ordinal), kind, bytes, and the
/// context it lives in (0: the device's primary context), so that a
/// context's teardown (destroy, last primary release, reset) releases what
/// the driver freed with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub dev: u32,
    pub kind: Kind,
    pub bytes: u64,
    pub ctx: usize,
}

/// A [`Charge`] packed into one nonzero word for the lock-free table:
/// bytes in the low [`PACK_BYTES`] bits, then the ordinal (4 bits), the
/// kind (2 bits) and a present bit (so no packed charge is 0, the table's
/// "absent").
const PACK_BYTES: u32 = 57;
const PACK_DEV: u32 = PACK_BYTES;
const PACK_KIND: u32 = PACK_DEV + 4;
const PACK_PRESENT: u64 = 1 << 63;
// Every size the ledger admits fits the bytes field.
const _: () = assert!(vgpu_region::MAX_RESERVATION < 1 << PACK_BYTES);
const _: () = assert!(PACK_KIND + 2 == 63);

impl Charge {
    /// The word for the lock-free table, when the charge fits one: in the
    /// primary context (a charge in a created context carries its handle),
    /// ordinal < 16, bytes ≤ `MAX_RESERVATION` (all a reservation admits).
    fn pack(&self) -> Option<u64> {
        if self.ctx != 0 || self.dev >= 16 || self.bytes > vgpu_region::MAX_RESERVATION {
            return None;
        }
        let kind: u64 = match self.kind {
            Kind::Context => 0,
            Kind::Module => 1,
            Kind::Data => 2,
        };
        Some(PACK_PRESENT | kind << PACK_KIND | u64::from(self.dev) << PACK_DEV | self.bytes)
    }

    fn unpack(w: u64) -> Charge {
        // A lookup, not a match: 3 never occurs (it reads as data).
        const KINDS: [Kind; 4] = [Kind::Context, Kind::Module, Kind::Data, Kind::Data];
        Charge {
            dev: ((w >> PACK_DEV) & 0xf) as u32,
            kind: KINDS[((w >> PACK_KIND) & 3) as usize],
            bytes: w & ((1 << PACK_BYTES) - 1),
            ctx: 0,
        }
    }
}

/// A device's primary context as this process retained it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Primary {
    /// Our retains not yet released.
    pub refs: u32,
    /// Its charge (the context estimate), 0 when none.
    pub charge: u64,
    /// Its handle, once a retain returned it.
    pub handle: usize,
}

/// A stream-ordered pool this process has charged for.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolCharge {
    pub dev: u32,
    /// Bytes currently charged for this pool (its reserved memory as last seen).
    pub charged: u64,
}

/// A graph allocation an executable makes when it runs: its address
/// (fixed when the node was made), CUDA ordinal and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphAlloc {
    pub dptr: u64,
    pub dev: u32,
    pub bytes: u64,
}

/// An executable graph with memory nodes, as instantiated: what its
/// launches allocate and free, and whether each launch first frees what the
/// previous one left (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphExec {
    pub allocs: Vec<GraphAlloc>,
    pub frees: Vec<u64>,
    pub auto_free: bool,
    /// The driver could not list the graph's nodes: its launches are not
    /// admitted, only settled (every visible device) after the driver ran
    /// them.
    pub unlisted: bool,
}

/// This process's graph memory.
#[derive(Default)]
pub struct Graphs {
    /// Per CUDA ordinal: bytes charged for the driver's graph allocator
    /// (its `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` as last settled).
    pub charged: Map<u32, u64>,
    /// Executables with memory nodes, by handle.
    pub execs: Map<usize, GraphExec>,
    /// Graph allocations a launch made and nothing freed yet:
    /// address -> (ordinal, bytes).
    pub live: Map<u64, (u32, u64)>,
    /// Per ordinal: the executable whose launch or upload last backed graph
    /// memory there (the memory it freed is still its own to reuse).
    pub last: Map<u32, usize>,
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
    /// Linear/managed/pitched allocations by device pointer that the
    /// lock-free table ([`Charges::put_alloc`]) could not take: private,
    /// so every access goes through the `Charges`/[`TablesGuard`] methods
    /// that look in both places.
    allocs: Map<u64, Charge>,
    /// Stream-ordered allocations: pointer -> pool.
    pub async_ptrs: Map<u64, usize>,
    pub pools: Map<usize, PoolCharge>,
    /// `cuMemCreate` handles (their charge stays while mapped, even after
    /// `cuMemRelease`: the charge follows the physical memory).
    pub handles: Map<u64, Charge>,
    /// Per handle: live mappings, and whether `cuMemRelease` already ran.
    pub handle_refs: Map<u64, (u32, bool)>,
    /// Mapped address -> (size, handle), for `cuMemUnmap` of a range.
    pub mappings: std::collections::BTreeMap<u64, (u64, u64)>,
    /// Arrays and mipmapped arrays by handle.
    pub arrays: Map<usize, Charge>,
    /// Contexts created with `cuCtxCreate*` (their devices mirrored in
    /// `Charges::ctx_devs` by [`TablesGuard`]'s drop).
    pub ctxs: Map<usize, Charge>,
}

/// Slots of the lock-free allocation table (64 KiB): a process with more
/// live allocations than its windows hold keeps the rest in the map.
const ALLOC_TABLE_SLOTS: usize = 4096;

/// The charge tables of one process, each behind its own short lock (never
/// held across a driver call, except `primary`: a retain count must move
/// with the driver's own, and `graphs`: a graph launch is admitted, made
/// and settled as one step, so two launches never count on the same
/// memory).
///
/// Linear allocations (the `cuMemAlloc`/`cuMemFree` hot path) live in a
/// lock-free table when their charge packs into a word (see
/// [`Charge::pack`]: the common case, an allocation in the primary
/// context), else in `Tables::allocs`; [`Charges::put_alloc`],
/// [`Charges::take_alloc_or`] and [`Charges::take_allocs`] (and their
/// [`TablesGuard`] forms for a caller holding the lock) are the only way
/// in or out, so nothing misses an entry in one place or the other.
pub struct Charges {
    tables: Mutex<Tables>,
    /// Primary-context retain count, charge and handle per device.
    pub primary: Mutex<Map<u32, Primary>>,
    pub graphs: Mutex<Graphs>,
    /// Executables with memory nodes (`graphs.execs.len()`): a launch of
    /// any other graph costs this one load.
    pub graph_execs: std::sync::atomic::AtomicUsize,
    /// Linear allocations whose charge packs into a word.
    fast: AllocTable,
    /// CUDA ordinals (< 32) on which this process has created contexts
    /// (`Tables::ctxs`), one bit each, so an allocation asks "in a created
    /// context?" with one load. Written only under the tables lock, by
    /// [`TablesGuard`]'s drop, after any change to `ctxs`.
    ctx_devs: AtomicU32,
}

impl Default for Charges {
    fn default() -> Charges {
        Charges {
            tables: Mutex::default(),
            primary: Mutex::default(),
            graphs: Mutex::default(),
            graph_execs: std::sync::atomic::AtomicUsize::new(0),
            fast: AllocTable::new(ALLOC_TABLE_SLOTS),
            ctx_devs: AtomicU32::new(0),
        }
    }
}

/// The tables, locked. Dropping it republishes [`Charges::ctx_devs`] from
/// `ctxs` (still under the lock), whatever the holder changed.
pub struct TablesGuard<'a> {
    t: MutexGuard<'a, Tables>,
    charges: &'a Charges,
}

impl std::ops::Deref for TablesGuard<'_> {
    type Target = Tables;
    fn deref(&self) -> &Tables {
        &self.t
    }
}

impl std::ops::DerefMut for TablesGuard<'_> {
    fn deref_mut(&mut self) -> &mut Tables {
        &mut self.t
    }
}

impl Drop for TablesGuard<'_> {
    fn drop(&mut self) {
        let mask = self
            .t
            .ctxs
            .values()
            .filter(|c| c.dev < 32)
            .fold(0u32, |m, c| m | 1 << c.dev);
        // Release: a thread that later sees the bit (Acquire) sees the
        // context's entry; only lock holders store, so a plain store is
        // enough.
        if self.charges.ctx_devs.load(Ordering::Relaxed) != mask {
            self.charges.ctx_devs.store(mask, Ordering::Release);
        }
    }
}

impl TablesGuard<'_> {
    /// [`Charges::put_alloc`] for a caller holding the lock.
    pub fn put_alloc(&mut self, ptr: u64, c: Charge) {
        if !self.charges.put_fast(ptr, c) {
            self.t.allocs.insert(ptr, c);
        }
    }

    /// Takes `ptr`'s charge from the table or the map. Under the lock,
    /// the table too is looked at again: an entry may have moved there
    /// under the lock since a lock-free look missed it (`pool_destroy`
    /// moves a pool's live pointers into the allocations).
    pub fn take_alloc(&mut self, ptr: u64) -> Option<Charge> {
        match self.charges.fast.remove(ptr) {
            Some(w) => Some(Charge::unpack(w)),
            None => self.t.allocs.remove(&ptr),
        }
    }
}

impl Charges {
    pub fn tables(&self) -> TablesGuard<'_> {
        TablesGuard {
            // A poisoned lock only means a panic elsewhere mid-update; the
            // maps are still usable and the library must keep serving.
            t: self.tables.lock().unwrap_or_else(|e| e.into_inner()),
            charges: self,
        }
    }

    /// Records a linear allocation's charge: the lock-free table when it
    /// packs and its window has room, else the map.
    #[inline]
    pub fn put_alloc(&self, ptr: u64, c: Charge) {
        if !self.put_fast(ptr, c) {
            self.put_alloc_locked(ptr, c);
        }
    }

    /// `ptr`'s charge into the lock-free table; false when it does not
    /// pack or its window is full (the caller keeps it in the map).
    #[inline]
    fn put_fast(&self, ptr: u64, c: Charge) -> bool {
        c.pack().is_some_and(|w| self.fast.insert(ptr, w))
    }

    /// The map's side of `put_alloc`, out of line: the common path stays
    /// free of the lock's and the map's code.
    #[cold]
    #[inline(never)]
    fn put_alloc_locked(&self, ptr: u64, c: Charge) {
        self.tables().allocs.insert(ptr, c);
    }

    /// Takes `ptr`'s allocation charge (`Ok`), lock-free when it is in the
    /// table; else, under the tables lock, from the map, or `other` runs
    /// there (in the same lock hold, so an entry moving between the two
    /// under the lock is seen in one or the other) and its answer is the
    /// `Err`.
    #[inline]
    pub fn take_alloc_or<R>(
        &self,
        ptr: u64,
        other: impl FnOnce(&mut Tables) -> R,
    ) -> Result<Charge, R> {
        match self.fast.remove(ptr) {
            Some(w) => Ok(Charge::unpack(w)),
            None => self.take_alloc_locked(ptr, other),
        }
    }

    /// The locked side of `take_alloc_or`, out of line (see `put_alloc_locked`).
    #[cold]
    #[inline(never)]
    fn take_alloc_locked<R>(
        &self,
        ptr: u64,
        other: impl FnOnce(&mut Tables) -> R,
    ) -> Result<Charge, R> {
        let mut t = self.tables();
        match t.take_alloc(ptr) {
            Some(c) => Ok(c),
            None => Err(other(&mut t)),
        }
    }

    /// Takes every allocation charge `hit` picks (a context's teardown).
    pub fn take_allocs(&self, hit: impl Fn(&Charge) -> bool) -> Vec<Charge> {
        let mut t = self.tables();
        let mut gone = Vec::new();
        t.allocs.retain(|_, c| {
            let h = hit(c);
            if h {
                gone.push(*c);
            }
            !h
        });
        gone.extend(
            self.fast
                .take_matching(|_, w| hit(&Charge::unpack(w)))
                .into_iter()
                .map(|(_, w)| Charge::unpack(w)),
        );
        gone
    }

    /// Whether this process has created a context on CUDA ordinal `dev`
    /// (one load for ordinals < 32, the table lock past them).
    #[inline]
    pub fn created_ctx_on(&self, dev: u32) -> bool {
        match 1u32.checked_shl(dev) {
            Some(bit) => self.ctx_devs.load(Ordering::Acquire) & bit != 0,
            None => self.created_ctx_on_locked(dev),
        }
    }

    #[cold]
    #[inline(never)]
    fn created_ctx_on_locked(&self, dev: u32) -> bool {
        self.tables().ctxs.values().any(|c| c.dev == dev)
    }

    pub fn primary(&self) -> std::sync::MutexGuard<'_, Map<u32, Primary>> {
        self.primary.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn graphs(&self) -> std::sync::MutexGuard<'_, Graphs> {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner())
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

    pub fn device_count(&self) -> u32 {
        self.region.device_count()
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn device_index(&self, uuid: &str) -> Option<u32> {
        if uuid.is_empty() {
            return None;
        }
        self.region.device_index(uuid)
    }

    pub fn device_uuid(&self, dev: u32) -> String {
        self.region.device_uuid(dev)
    }

    /// The header's display copy (an input of the limits, never the only one).
    pub fn display_limit(&self, dev: u32) -> DeviceLimit {
        DeviceLimit::from_region(self.region.limits(dev))
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

    /// Threads of one process reserving and releasing at once never look
    /// like a write-down of the slot's total to each other: a restore
    /// would leave bytes charged that nobody holds. With the snapshot's
    /// second read of `Own` removed, this failed in 2 of 3 runs here.
    #[test]
    fn racing_reserves_and_releases_never_restore_a_total() {
        let dir = tempfile::tempdir().unwrap();
        let (l, _) = Ledger::create(
            &dir.path().join("r.cache"),
            8,
            vec![NewDevice {
                uuid: "GPU-own".into(),
                mem_limit: 1 << 40,
                sm_limit: 0,
            }],
        )
        .unwrap();
        let go = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (l, go) = (&l, &go);
                s.spawn(move || {
                    go.wait();
                    for i in 0..200_000u64 {
                        // Sizes that repeat across threads (the ABA case of
                        // the bytes field) and differ.
                        let b = 4096 * (1 + (i + t) % 3);
                        l.reserve(0, DATA, b).unwrap();
                        l.release(0, DATA, b);
                    }
                });
            }
        });
        assert_eq!(l.region.slot_total(l.slot, 0), 0, "nothing leaked");
        assert_eq!(l.own[0].0.load(Ordering::SeqCst) & OWN_BYTES, 0);
        assert_eq!(l.used(0), 0);
    }

    /// The one-add changes keep the saturating meaning: an over-release (a
    /// racing double free) ends at 0 with one change counted, and a size
    /// past `OWN_FAST` saturates; the snapshot takes no pair from a field
    /// past `OWN_SANE`.
    #[test]
    fn own_record_changes_by_one_add_and_saturates() {
        let o = Own::default();
        let read = |o: &Own| {
            let w = o.0.load(Ordering::SeqCst);
            (w >> 48, w & OWN_BYTES)
        };
        o.reserved(4096);
        assert_eq!(read(&o), (1, 4096));
        o.released(8192);
        assert_eq!(read(&o), (2, 0), "an over-release stops at 0");
        o.released(1);
        assert_eq!(read(&o), (3, 0));
        o.reserved(3 << 20);
        o.released(1 << 20);
        assert_eq!(read(&o), (5, 2 << 20));
        assert_eq!(o.quiet_snapshot(|| 7), Some((2 << 20, 7)));
        o.reserved(OWN_FAST);
        o.reserved(OWN_BYTES);
        assert_eq!(read(&o), (7, OWN_BYTES), "large sizes saturate");
        assert_eq!(o.quiet_snapshot(|| 0), None, "no figure to restore from");
        o.released(OWN_BYTES);
        assert_eq!(read(&o), (8, 0));
        // The count wraps without touching the bytes.
        let o = Own(AtomicU64::new(!OWN_BYTES | 5));
        o.reserved(1);
        assert_eq!(read(&o), (0, 6));
    }

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

    fn data(dev: u32, bytes: u64, ctx: usize) -> Charge {
        Charge {
            dev,
            kind: DATA,
            bytes,
            ctx,
        }
    }

    #[test]
    fn charges_pack_into_a_word_only_when_they_fit() {
        let max = vgpu_region::MAX_RESERVATION;
        for c in [
            data(0, 1, 0),
            data(15, max, 0),
            Charge {
                kind: CONTEXT,
                ..data(3, 8 << 20, 0)
            },
            Charge {
                kind: MODULE,
                ..data(7, 0, 0)
            },
        ] {
            let w = c.pack().expect("fits");
            assert_ne!(w, 0, "0 is the table's absent");
            assert_eq!(Charge::unpack(w), c);
        }
        // A created context's handle, an ordinal past 15, a size past any
        // reservation: kept in the map.
        for c in [data(0, 1, 0x5000), data(16, 1, 0), data(0, max + 1, 0)] {
            assert_eq!(c.pack(), None, "{c:?}");
        }
    }

    #[test]
    fn allocations_are_found_wherever_they_were_put() {
        let ch = Charges::default();
        // More than the table holds, and some that never pack: both the
        // table and the map must be in use.
        let put: Vec<(u64, Charge)> = (1..=5000u64)
            .map(|i| {
                let c = match i % 10 {
                    0 => data(20, i, 0),
                    1 => data(0, i, 0x7000),
                    _ => data((i % 4) as u32, i, 0),
                };
                ((0x7f00 << 32) + (i << 21), c)
            })
            .collect();
        for &(p, c) in &put {
            ch.put_alloc(p, c);
        }
        assert!(ch.fast.len() > 3000, "table holds {}", ch.fast.len());
        assert!(ch.tables().allocs.len() > 1000);
        assert_eq!(ch.fast.len() + ch.tables().allocs.len(), put.len());
        for &(p, c) in &put {
            assert_eq!(ch.take_alloc_or(p, |_| "miss"), Ok(c));
            assert_eq!(ch.take_alloc_or(p, |_| "miss"), Err("miss"), "taken twice");
        }
        assert!(ch.fast.is_empty());
        assert!(ch.tables().allocs.is_empty());
    }

    #[test]
    fn a_lock_holder_puts_and_takes_in_both_places() {
        let ch = Charges::default();
        {
            let mut t = ch.tables();
            t.put_alloc(1 << 21, data(0, 5, 0));
            t.put_alloc(2 << 21, data(0, 6, 9));
        }
        assert_eq!((ch.fast.len(), ch.tables().allocs.len()), (1, 1));
        // The lock-free look finds the first, the guard's the second.
        assert_eq!(ch.take_alloc_or(1 << 21, |_| ()), Ok(data(0, 5, 0)));
        assert_eq!(ch.tables().take_alloc(2 << 21), Some(data(0, 6, 9)));
        assert_eq!(ch.tables().take_alloc(1 << 21), None);
    }

    #[test]
    fn a_sweep_takes_matches_from_the_table_and_the_map() {
        let ch = Charges::default();
        ch.put_alloc(1 << 21, data(0, 1, 0)); // table
        ch.put_alloc(2 << 21, data(20, 2, 0)); // map: ordinal
        ch.put_alloc(3 << 21, data(0, 4, 0x9000)); // map: created context
        ch.put_alloc(4 << 21, data(1, 8, 0)); // table, other device
        let mut gone: Vec<u64> = ch
            .take_allocs(|c| c.ctx == 0 && c.dev != 1)
            .iter()
            .map(|c| c.bytes)
            .collect();
        gone.sort_unstable();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!(ch.take_alloc_or(1 << 21, |_| ()), Err(()));
        assert_eq!(ch.take_alloc_or(2 << 21, |_| ()), Err(()));
        assert_eq!(ch.take_alloc_or(3 << 21, |_| ()), Ok(data(0, 4, 0x9000)));
        assert_eq!(ch.take_alloc_or(4 << 21, |_| ()), Ok(data(1, 8, 0)));
    }

    #[test]
    fn created_context_devices_follow_the_contexts_table() {
        let ch = Charges::default();
        assert!(!ch.created_ctx_on(3));
        ch.tables().ctxs.insert(0xa, data(3, 8, 0));
        ch.tables().ctxs.insert(0xb, data(3, 8, 0));
        ch.tables().ctxs.insert(0xc, data(40, 8, 0));
        assert!(ch.created_ctx_on(3));
        assert!(!ch.created_ctx_on(2));
        // Past the bitmask's 32 ordinals: the table is asked.
        assert!(ch.created_ctx_on(40));
        assert!(!ch.created_ctx_on(41));
        ch.tables().ctxs.remove(&0xa);
        assert!(ch.created_ctx_on(3), "one context left there");
        ch.tables().ctxs.remove(&0xb);
        ch.tables().ctxs.remove(&0xc);
        assert!(!ch.created_ctx_on(3));
        assert!(!ch.created_ctx_on(40));
    }
}
