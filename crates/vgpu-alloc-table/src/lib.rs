//! A fixed-capacity, lock-free map of `u64` keys (device pointers) to
//! nonzero `u64` values (encoded charges): the interposer's fast path for
//! `cuMemAlloc` / `cuMemFree`, one locked read-modify-write on each side,
//! with the caller's mutex-protected map as the fallback for whatever does
//! not fit (a full probe window, a value it cannot encode).
//!
//! Layout: two arrays of atomics, `keys` and `vals`, a power-of-two
//! capacity, and a bounded linear probe: a key lives in one of the
//! [`WINDOW`] slots from its hash. Key [`EMPTY`] (0) marks a slot never
//! used, [`TOMBSTONE`] (`u64::MAX`) one whose entry was removed; value 0
//! means "no value" (callers encode a present bit).
//!
//! # Protocol
//!
//! * **insert** claims the first empty or tombstoned slot of the window
//!   with `compare_exchange` on its key (Acquire: the claim reads the
//!   tombstone a remover stored with Release after zeroing the value, so
//!   that zeroing is ordered before the new value), then stores the value
//!   (Release). Slots never go back to empty, so a lookup stops at the
//!   first empty slot: every slot before the one an insert claimed was
//!   non-empty when it looked, and stays so.
//! * **remove** finds the key (stopping at an empty slot) and takes the
//!   value with one `compare_exchange(val, 0)`: success with a nonzero
//!   value makes this caller the owner of the removal, who then stores the
//!   tombstone (Release) into the key; a zero or a failed exchange means
//!   another thread got there first (a racing double free), so it looks
//!   on. A value is nonzero only between its insert's
//!   store and its removal's exchange, and the key is written only by the
//!   claim (before the value) and by the removal's owner (after the
//!   exchange): while a value is nonzero, the slot's key is its owner's.
//! * **take_matching** (a sweep) takes each matching entry with
//!   `compare_exchange(val, 0)`, so a sweep and a racing remove never both
//!   get one.
//!
//! # Why the orderings hold
//!
//! A free of a pointer happens after its allocation returned in any
//! correct program (the pointer reached the freeing thread through some
//! synchronization), so the remover sees the insert's key and value, and,
//! by coherence, every slot the insert saw non-empty as non-empty. A
//! racing double free gets the value in exactly one thread (one exchange takes
//! it, the others fail or read 0). The driver reuses an address only after its
//! free, and the interposer removes the entry before calling the driver's
//! free: the tombstone is stored before the address can come back, so a
//! re-insert of the same pointer never meets its own live entry.
//!
//! One case is not exact: a thread that read a slot's key, then lost the
//! race to a double free of that key, can take the value of a new entry
//! that reused the slot meanwhile. It notices (the slot's key is no longer
//! its key), puts the value back and looks on; a removal of that new entry
//! in those few instructions reads 0 and misses it. That needs a double
//! free racing, which CUDA leaves undefined.
#![forbid(unsafe_code)]

mod sync;

use sync::{AtomicU64, Ordering};

/// The key of a slot never used (refused by [`AllocTable::insert`]).
pub const EMPTY: u64 = 0;
/// The key of a slot whose entry was removed (refused by `insert`).
pub const TOMBSTONE: u64 = u64::MAX;
/// How many slots from a key's hash it may live in.
pub const WINDOW: usize = 16;

/// See the crate documentation.
pub struct AllocTable {
    keys: Box<[AtomicU64]>,
    vals: Box<[AtomicU64]>,
    mask: usize,
    window: usize,
}

impl std::fmt::Debug for AllocTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocTable")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

/// The slot a key's window starts at: the folded 64×64→128 multiply of
/// the interposer's `KeyHasher` (device pointers are aligned: their low
/// bits, which pick the slot, are zero until mixed).
#[inline]
fn hash(key: u64) -> u64 {
    let m = u128::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    (m as u64) ^ ((m >> 64) as u64)
}

impl AllocTable {
    /// A table of `capacity` slots (rounded up to a power of two, at
    /// least 1), allocated now and never grown.
    pub fn new(capacity: usize) -> AllocTable {
        let n = capacity.max(1).next_power_of_two();
        let zeros = || (0..n).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        AllocTable {
            keys: zeros(),
            vals: zeros(),
            mask: n - 1,
            window: WINDOW.min(n),
        }
    }

    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    /// The slots `key` may live in, in probe order.
    #[inline]
    fn window(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = hash(key) as usize;
        (0..self.window).map(move |i| start.wrapping_add(i) & self.mask)
    }

    /// Adds `key` -> `val`. `false`: nothing was added, because the
    /// window has no free slot, or `key` is [`EMPTY`]/[`TOMBSTONE`], or
    /// `val` is 0 (the caller keeps the entry elsewhere). The caller must
    /// not insert a key that is present.
    #[inline]
    pub fn insert(&self, key: u64, val: u64) -> bool {
        if key == EMPTY || key == TOMBSTONE || val == 0 {
            return false;
        }
        for i in self.window(key) {
            let k = self.keys[i].load(Ordering::Relaxed);
            if k != EMPTY && k != TOMBSTONE {
                continue;
            }
            // Acquire: a tombstone read here was stored (Release) after its
            // remover zeroed the value, so our value is ordered after that
            // zero. A lost race means another insert took the slot.
            if self.keys[i]
                .compare_exchange(k, key, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // Release: whoever takes this value sees the key claim.
                self.vals[i].store(val, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Removes `key` and returns its value; `None` when it is not in the
    /// table (or another thread removed it at the same time).
    #[inline]
    pub fn remove(&self, key: u64) -> Option<u64> {
        if key == EMPTY || key == TOMBSTONE {
            return None;
        }
        for i in self.window(key) {
            // Relaxed: the insert of `key` happened before this remove
            // (see the crate documentation), so its claim, and every
            // non-empty slot it probed past, is visible by coherence.
            let k = self.keys[i].load(Ordering::Relaxed);
            if k == EMPTY {
                return None;
            }
            if k != key {
                continue;
            }
            // The one read-modify-write: taking a nonzero value makes us
            // the owner of this removal. Acquire pairs with the insert's
            // Release of the value, so the key read next is the value's
            // owner's. A compare-exchange rather than a swap: the loser of
            // a double free writes nothing (a losing swap's 0 lands right
            // after the winner's in C++'s model, but loom orders it against
            // a later insert's store only partially and reports a lost
            // value).
            let v = self.vals[i].load(Ordering::Relaxed);
            if v == 0
                || self.vals[i]
                    .compare_exchange(v, 0, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            if self.keys[i].load(Ordering::Relaxed) != key {
                // Lost a double-free race and the slot was reused since we
                // read its key: this value is another entry's. Back it goes.
                self.vals[i].store(v, Ordering::Release);
                continue;
            }
            // Release: an insert that claims the tombstone orders its value
            // after our zero.
            self.keys[i].store(TOMBSTONE, Ordering::Release);
            return Some(v);
        }
        None
    }

    /// Removes every entry for which `f(key, val)` holds and returns them
    /// (the sweep of a torn-down context). Each is taken with a
    /// compare-exchange of its value, so a racing [`AllocTable::remove`]
    /// and the sweep never both get it; entries inserted meanwhile may or
    /// may not be seen.
    pub fn take_matching(&self, mut f: impl FnMut(u64, u64) -> bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for i in 0..self.capacity() {
            // The value first (Acquire, pairing with its insert's Release):
            // the key read after it is the value's owner's, unless the entry
            // was removed meanwhile (then the exchange below fails, or finds
            // the very same value under the same key again).
            let v = self.vals[i].load(Ordering::Acquire);
            if v == 0 {
                continue;
            }
            let k = self.keys[i].load(Ordering::Relaxed);
            if k == EMPTY || k == TOMBSTONE || !f(k, v) {
                continue;
            }
            if self.vals[i]
                .compare_exchange(v, 0, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // We own this removal; the key is the owner's of what we took.
            let owner = self.keys[i].load(Ordering::Relaxed);
            if owner != k && !f(owner, v) {
                // The slot was reused (twice) between our reads with an
                // equal value under another key that does not match.
                self.vals[i].store(v, Ordering::Release);
                continue;
            }
            self.keys[i].store(TOMBSTONE, Ordering::Release);
            out.push((owner, v));
        }
        out
    }

    /// How many entries the table holds (a snapshot; exact when no thread
    /// is changing it).
    pub fn len(&self) -> usize {
        (0..self.capacity())
            .filter(|&i| {
                let k = self.keys[i].load(Ordering::Acquire);
                k != EMPTY && k != TOMBSTONE && self.vals[i].load(Ordering::Acquire) != 0
            })
            .count()
    }

    pub fn dump(&self) -> Vec<(u64, u64)> {
        (0..self.capacity())
            .map(|i| {
                (
                    self.keys[i].load(Ordering::SeqCst),
                    self.vals[i].load(Ordering::SeqCst),
                )
            })
            .collect()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_round_trip() {
        let t = AllocTable::new(64);
        assert!(t.insert(0x7f00_0020_0000, 5));
        assert!(t.insert(0x7f00_0040_0000, 6));
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(0x7f00_0020_0000), Some(5));
        // Gone: a second remove (a double free) finds nothing.
        assert_eq!(t.remove(0x7f00_0020_0000), None);
        assert_eq!(t.remove(0x7f00_0040_0000), Some(6));
        assert!(t.is_empty());
    }

    #[test]
    fn refuses_reserved_keys_and_zero_values() {
        let t = AllocTable::new(8);
        assert!(!t.insert(EMPTY, 1));
        assert!(!t.insert(TOMBSTONE, 1));
        assert!(!t.insert(1, 0));
        assert!(t.is_empty());
        assert_eq!(t.remove(EMPTY), None);
        assert_eq!(t.remove(TOMBSTONE), None);
    }

    #[test]
    fn capacity_rounds_up_to_a_power_of_two() {
        assert_eq!(AllocTable::new(0).capacity(), 1);
        assert_eq!(AllocTable::new(4096).capacity(), 4096);
        assert_eq!(AllocTable::new(4097).capacity(), 8192);
    }

    #[test]
    fn a_full_window_refuses_and_tombstones_are_reused() {
        // Capacity 4: the window is the whole table.
        let t = AllocTable::new(4);
        for k in 1..=4 {
            assert!(t.insert(k, k * 10), "key {k}");
        }
        assert!(!t.insert(5, 50), "no free slot left");
        assert_eq!(t.remove(3), Some(30));
        // The tombstone is claimed again; every other entry is intact.
        assert!(t.insert(5, 50));
        assert!(!t.insert(6, 60));
        for (k, v) in [(1, 10), (2, 20), (4, 40), (5, 50)] {
            assert_eq!(t.remove(k), Some(v), "key {k}");
        }
        assert!(t.is_empty());
    }

    #[test]
    fn lookup_probes_past_tombstones() {
        let t = AllocTable::new(4);
        for k in 1..=4 {
            assert!(t.insert(k, k));
        }
        // Whichever slots 1..3 took, 4 lies behind tombstones for some key
        // order; every remaining key must still be found.
        for k in 1..=3 {
            assert_eq!(t.remove(k), Some(k));
        }
        assert_eq!(t.remove(4), Some(4));
    }

    #[test]
    fn take_matching_takes_only_matches() {
        let t = AllocTable::new(64);
        for k in 1..=10u64 {
            assert!(t.insert(k << 21, k));
        }
        let mut got = t.take_matching(|_, v| v % 2 == 0);
        got.sort_unstable();
        let want: Vec<(u64, u64)> = (1..=5).map(|i| ((2 * i) << 21, 2 * i)).collect();
        assert_eq!(got, want);
        assert_eq!(t.len(), 5);
        assert_eq!(t.remove(2 << 21), None, "taken by the sweep");
        assert_eq!(t.remove(3 << 21), Some(3));
    }

    #[test]
    fn aligned_pointers_spread_over_the_table() {
        // 2 MiB-aligned pointers: their windows must start all over a
        // 4096-slot table, or the window fills at a few dozen allocations.
        let t = AllocTable::new(4096);
        let n = (0..3000u64)
            .filter(|i| t.insert(0x7f00_0000_0000 + (i << 21), 1))
            .count();
        assert_eq!(n, 3000, "a window filled at {} of 3000 entries", n);
    }
}
