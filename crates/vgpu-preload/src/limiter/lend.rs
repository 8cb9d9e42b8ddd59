//! Lending on the GPU's board (docs/limiter.md, "Guarantees and
//! ceilings"), every control period on the owned thread, never on a
//! launch: the holder of the container's sampler lease publishes the
//! container's entry (guarantee, ceiling, what it wants: its ceiling when
//! it waited at the gate in the last period, else what it used plus a
//! little), then every process reads the GPU's board and computes the
//! share it paces at (`vgpu_limiter::lend`).
//!
//! A board that cannot be used never raises a share: the container paces
//! as it would without a board (its limit a fixed cap, no limit none),
//! and it says so once.
use std::path::{Path, PathBuf};

use vgpu_limiter::lend::{self, Member};
use vgpu_limiter::{Settings, PPM};
use vgpu_region::board::{self, BoardError, Entry, Writer};
use vgpu_region::limits::BoardRef;
use vgpu_region::pacing::{try_lease, Bucket};

/// The sampler lease's length (the same lease as the sampler's).
const LEASE_MS: u64 = 500;
/// A published utilization older than this is not used.
const UTIL_FRESH_NS: u64 = 300_000_000;

/// What the board says to pace at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// This share, ppm.
    At(u32),
    /// Not paced: no member of the GPU holds a guarantee.
    Unlimited,
}

/// One device's lending state (one per device, in the job's state).
#[derive(Default)]
pub struct DevLend {
    dir: Option<PathBuf>,
    writer: Option<Writer>,
    prev_ns: u64,
    prev_waits: u64,
    prev_measured: u64,
    entries: Vec<(String, Entry)>,
    members: Vec<Member>,
    alloc: Vec<u32>,
    /// The board failed and it was said (cleared when it works again).
    pub logged: bool,
}

impl DevLend {
    /// One period on device `uuid`'s board: publish (when this process
    /// holds the lease of `bucket`, or the bucket is its own), read,
    /// allocate. `slot`: this process's region slot (`None`: a private
    /// bucket, always the writer); `pace_ppm`: what it paces at now.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        b: &BoardRef,
        uuid: &str,
        s: &Settings,
        bucket: &Bucket<'_>,
        slot: Option<u32>,
        pace_ppm: u32,
        now: u64,
    ) -> Result<Pace, BoardError> {
        let dir = board::gpu_dir(&b.dir, uuid);
        if self.dir.as_deref() != Some(dir.as_path()) {
            self.writer = None;
            self.prev_ns = 0;
            self.dir = Some(dir.clone());
        }
        let (g, c) = s.guarantee_and_ceiling();
        let writes = slot.is_none_or(|me| try_lease(bucket.raw(), me, now / 1_000_000, LEASE_MS));
        let mut mine = Member {
            guarantee_ppm: g,
            ceiling_ppm: c,
            want_ppm: c,
        };
        if writes {
            let e = self.entry(bucket, g, c, pace_ppm, now);
            mine.want_ppm = e.want_ppm;
            self.publish(&dir, &b.name, &e)?;
        } else {
            self.prev_ns = 0;
        }
        board::read(&dir, now, &mut self.entries)?;
        self.members.clear();
        self.members
            .extend(self.entries.iter().map(|(_, e)| Member {
                guarantee_ppm: e.guarantee_ppm,
                ceiling_ppm: e.ceiling_ppm,
                want_ppm: e.want_ppm,
            }));
        let me = match self.entries.iter().position(|(n, _)| *n == b.name) {
            Some(i) => {
                // Our own floor and ceiling are the operator's, whatever
                // the entry says.
                if let Some(m) = self.members.get_mut(i) {
                    m.guarantee_ppm = g;
                    m.ceiling_ppm = c;
                }
                i
            }
            None => {
                self.members.push(mine);
                self.members.len() - 1
            }
        };
        if g == 0 && self.members.iter().all(|m| m.guarantee_ppm == 0) {
            return Ok(Pace::Unlimited);
        }
        self.alloc.clear();
        self.alloc.resize(self.members.len(), 0);
        lend::allocate(&self.members, &mut self.alloc);
        Ok(match (self.members.get(me), self.alloc.get(me)) {
            (Some(m), Some(&a)) => Pace::At(lend::pace_at(m, a)),
            _ => Pace::At(lend::pace_at(&mine, 0)),
        })
    }

    /// This container's entry now: hungry when it waited at the gate since
    /// the last period; what it used from its measured time (corrected),
    /// or the sampler's published utilization when that is higher (an
    /// unpaced container has no markers).
    fn entry(&mut self, bucket: &Bucket<'_>, g: u32, c: u32, pace_ppm: u32, now: u64) -> Entry {
        use std::sync::atomic::Ordering::Relaxed;
        let raw = bucket.raw();
        let waits = raw.waits.load(Relaxed);
        let measured = raw.measured_ns.load(Relaxed);
        let first = self.prev_ns == 0 || now <= self.prev_ns;
        let dt = now.saturating_sub(self.prev_ns).max(1);
        let mut used = if first {
            0
        } else {
            let m = measured.saturating_sub(self.prev_measured) as u128;
            (m * bucket.correction_ppm() as u128 / dt as u128).min(PPM as u128) as u32
        };
        let util_at = raw.util_at_ns.load(Relaxed);
        if util_at != 0 && now.saturating_sub(util_at) <= UTIL_FRESH_NS {
            used = used.max(raw.util_ppm.load(Relaxed).min(PPM));
        }
        // A container that just started asks for all it may have; its want
        // settles to its use at the next period.
        let hungry = first || waits != self.prev_waits;
        self.prev_ns = now;
        self.prev_waits = waits;
        self.prev_measured = measured;
        Entry {
            guarantee_ppm: g,
            ceiling_ppm: c,
            want_ppm: lend::want(hungry, used, c),
            used_ppm: used,
            pace_ppm,
            pid: std::process::id(),
            heartbeat_ns: now,
            seq: 0,
        }
    }

    fn publish(&mut self, dir: &Path, name: &str, e: &Entry) -> Result<(), BoardError> {
        if self.writer.is_none() {
            self.writer = Some(Writer::open(dir, name)?);
        }
        match self.writer.as_mut() {
            Some(w) => w.publish(e),
            None => Ok(()),
        }
    }
}
