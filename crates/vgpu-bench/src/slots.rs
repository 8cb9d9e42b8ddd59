//! The result table shared between the harness and its workers: one
//! 64-byte slot per worker in a `memfd`, mapped `MAP_SHARED` by both sides.
//!
//! Every slot starts as [`STATE_EMPTY`] ("no result"), so a worker that dies
//! before writing can never count as a fast success. Workers are separate
//! processes writing concurrently, so the mapping is a [`MmapRaw`] and every
//! field is an atomic (never `&mut [u8]`).
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

/// Nothing written: counts as failed ("missing result").
pub const STATE_EMPTY: u32 = 0;
/// Worker reached main and is about to signal ready.
pub const STATE_READY: u32 = 1;
/// Worker saw the release broadcast.
pub const STATE_RELEASED: u32 = 2;
/// Worker is inside the measured call sequence.
pub const STATE_ENTERED: u32 = 3;
/// Worker wrote its results (they may still be driver errors).
pub const STATE_DONE: u32 = 4;

/// One worker's results. Timestamps are CLOCK_MONOTONIC ns (0 = not reached);
/// `cpu_*` are the worker process's CPU time (all threads,
/// CLOCK_PROCESS_CPUTIME_ID) at that point.
#[repr(C, align(64))]
#[derive(Default)]
pub struct ResultSlot {
    pub state: AtomicU32,
    pub pid: AtomicU32,
    /// `CUresult` of `cuInit(0)`.
    pub init_result: AtomicU32,
    /// `CUresult` of the `--then` call (0 when none).
    pub then_result: AtomicU32,
    /// Duration of `dlopen("libcuda.so.1")` + `dlsym("cuInit")` (before ready).
    pub resolve_ns: AtomicU64,
    pub t_ready: AtomicU64,
    pub t_released: AtomicU64,
    pub t_entry: AtomicU64,
    pub t_init_return: AtomicU64,
    pub t_return: AtomicU64,
    pub cpu_ready_ns: AtomicU64,
    pub cpu_entry_ns: AtomicU64,
    pub cpu_return_ns: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<ResultSlot>() == 128);

/// A plain copy of one slot, read after the worker finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCopy {
    pub state: u32,
    pub pid: u32,
    pub init_result: u32,
    pub then_result: u32,
    pub resolve_ns: u64,
    pub t_ready: u64,
    pub t_released: u64,
    pub t_entry: u64,
    pub t_init_return: u64,
    pub t_return: u64,
    pub cpu_ready_ns: u64,
    pub cpu_entry_ns: u64,
    pub cpu_return_ns: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SlotsError {
    #[error("cannot create the result memfd")]
    Create(#[source] std::io::Error),
    #[error("cannot size the result memfd to {0} bytes")]
    Size(u64, #[source] std::io::Error),
    #[error("cannot map the result table")]
    Map(#[source] std::io::Error),
    #[error("result table has {len} bytes, too small for worker index {index}")]
    OutOfRange { len: usize, index: usize },
    #[error("result table mapping is not 64-byte aligned")]
    Misaligned,
}

/// The table: a memfd and its mapping.
pub struct ResultTable {
    fd: OwnedFd,
    map: MmapRaw,
    count: usize,
}

impl ResultTable {
    /// A fresh zeroed (all [`STATE_EMPTY`]) table for `count` workers. The
    /// memfd is close-on-exec; the spawner passes it to each worker explicitly.
    pub fn create(count: usize) -> Result<Self, SlotsError> {
        let fd = rustix::fs::memfd_create("vgpu-bench-results", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| SlotsError::Create(e.into()))?;
        let len = (count.max(1) * std::mem::size_of::<ResultSlot>()) as u64;
        let file = File::from(fd);
        // A new memfd is zero-filled: every slot reads STATE_EMPTY.
        file.set_len(len).map_err(|e| SlotsError::Size(len, e))?;
        let map = MmapRaw::map_raw(&file).map_err(SlotsError::Map)?;
        Self::check_align(&map)?;
        Ok(ResultTable {
            fd: file.into(),
            map,
            count,
        })
    }

    /// Map an inherited table (in the worker).
    pub fn open(fd: OwnedFd) -> Result<Self, SlotsError> {
        let file = File::from(fd);
        let map = MmapRaw::map_raw(&file).map_err(SlotsError::Map)?;
        Self::check_align(&map)?;
        let count = map.len() / std::mem::size_of::<ResultSlot>();
        Ok(ResultTable {
            fd: file.into(),
            map,
            count,
        })
    }

    fn check_align(map: &MmapRaw) -> Result<(), SlotsError> {
        // Page-aligned in practice; checked because `slot` relies on it.
        if !(map.as_ptr() as usize).is_multiple_of(std::mem::align_of::<ResultSlot>()) {
            return Err(SlotsError::Misaligned);
        }
        Ok(())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Shared access to slot `index`.
    pub fn slot(&self, index: usize) -> Result<&ResultSlot, SlotsError> {
        let size = std::mem::size_of::<ResultSlot>();
        if index >= self.count || (index + 1) * size > self.map.len() {
            return Err(SlotsError::OutOfRange {
                len: self.map.len(),
                index,
            });
        }
        // SAFETY: the range [index*64, index*64+64) lies inside the mapping
        // (checked above), which lives as long as `self`; the base is 64-byte
        // aligned (checked at map time); `ResultSlot` is all atomics, valid for
        // any bit pattern (a zeroed memfd included) and safe to share with
        // other processes that write the same fields atomically.
        Ok(unsafe { &*(self.map.as_ptr().add(index * size) as *const ResultSlot) })
    }

    /// Copy slot `index` (Acquire on `state`, so the fields written before a
    /// worker's Release store of [`STATE_DONE`] are seen).
    pub fn read(&self, index: usize) -> Result<SlotCopy, SlotsError> {
        let s = self.slot(index)?;
        let state = s.state.load(Ordering::Acquire);
        Ok(SlotCopy {
            state,
            pid: s.pid.load(Ordering::Relaxed),
            init_result: s.init_result.load(Ordering::Relaxed),
            then_result: s.then_result.load(Ordering::Relaxed),
            resolve_ns: s.resolve_ns.load(Ordering::Relaxed),
            t_ready: s.t_ready.load(Ordering::Relaxed),
            t_released: s.t_released.load(Ordering::Relaxed),
            t_entry: s.t_entry.load(Ordering::Relaxed),
            t_init_return: s.t_init_return.load(Ordering::Relaxed),
            t_return: s.t_return.load(Ordering::Relaxed),
            cpu_ready_ns: s.cpu_ready_ns.load(Ordering::Relaxed),
            cpu_entry_ns: s.cpu_entry_ns.load(Ordering::Relaxed),
            cpu_return_ns: s.cpu_return_ns.load(Ordering::Relaxed),
        })
    }
}

/// CPU time of this process (all threads) in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds (the clock the interposer's phase
/// timestamps use, so they compare across processes).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_table_reads_empty_and_shares_writes_across_mappings() {
        let t = ResultTable::create(5).unwrap();
        assert_eq!(t.len(), 5);
        for i in 0..5 {
            assert_eq!(t.read(i).unwrap().state, STATE_EMPTY);
        }
        // A second mapping of the same memfd (what a worker gets) sees writes.
        let dup = t.fd().try_clone_to_owned().unwrap();
        let w = ResultTable::open(dup).unwrap();
        assert_eq!(w.len(), 5);
        w.slot(3).unwrap().t_entry.store(42, Ordering::Relaxed);
        w.slot(3)
            .unwrap()
            .state
            .store(STATE_DONE, Ordering::Release);
        let c = t.read(3).unwrap();
        assert_eq!((c.state, c.t_entry), (STATE_DONE, 42));
        assert!(matches!(
            t.slot(5),
            Err(SlotsError::OutOfRange { index: 5, .. })
        ));
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
