//! Stream-ordered allocations and memory pools: admission on what a pool
//! must grow by, then each pool's charge follows its reserved memory
//! (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), settled down wherever a pool
//! may have given memory back (frees, trims, synchronizes, views, a
//! refusal before it is final).
use vgpu_cuda_abi::{
    CUmemoryPool, CUresult, CUstream, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
};

use super::Mem;
use crate::ledger::{Charge, PoolCharge, DATA};

/// The device recorded for a pool in host memory (a host NUMA node): its
/// allocations take no device memory and pass through uncharged.
pub const HOST_POOL: u32 = u32::MAX;

impl Mem<'_> {
    fn pool_reserved(&self, pool: CUmemoryPool) -> Option<u64> {
        self.drv
            .pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            .ok()
    }

    /// Brings a pool's charge down to its reserved memory when it shrank.
    pub fn settle_pool(&self, pool: usize) {
        let Some(now) = self.pool_reserved(CUmemoryPool(pool as *mut _)) else {
            return;
        };
        let mut t = self.tables();
        if let Some(pc) = t.pools.get_mut(&pool) {
            if now < pc.charged {
                self.ledger.release(pc.dev, DATA, pc.charged - now);
                pc.charged = now;
            }
        }
    }

    /// Settles every pool this process holds a charge for; whether any
    /// charge went down.
    pub fn settle_pools(&self) -> bool {
        let pools: Vec<(usize, u64)> = self
            .tables()
            .pools
            .iter()
            .filter(|(_, pc)| pc.charged > 0)
            .map(|(k, pc)| (*k, pc.charged))
            .collect();
        let mut lower = false;
        for (pool, before) in pools {
            self.settle_pool(pool);
            lower |= self
                .tables()
                .pools
                .get(&pool)
                .is_some_and(|pc| pc.charged < before);
        }
        lower
    }

    /// Settles every known pool (before a view is computed).
    pub fn settle_all_pools(&self) {
        let pools: Vec<usize> = self.tables().pools.keys().copied().collect();
        for pool in pools {
            self.settle_pool(pool);
        }
    }

    /// After a stream, event or context synchronize: pools above their
    /// release threshold gave memory back there (cuda.h), so their charges
    /// follow now, for every process sharing the budget. Free when no pool
    /// holds a charge.
    pub fn synchronized(&self, r: CUresult) {
        if r.is_success() {
            self.settle_pools();
            self.settle_graphs();
        }
    }

    /// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync` (and `_ptsz`): admission
    /// on what the pool must grow by, then the charge follows the pool's
    /// reserved memory after the call. `stream` is the call's (a refused
    /// growth frees on it).
    pub fn alloc_async(
        &self,
        bytes: usize,
        pool: Option<CUmemoryPool>,
        stream: CUstream,
        out: impl Fn() -> Option<u64>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let l = self.ledger;
        let known_dev =
            pool.and_then(|pl| self.tables().pools.get(&(pl.0 as usize)).map(|pc| pc.dev));
        if known_dev == Some(HOST_POOL) {
            return call();
        }
        let dev = known_dev.unwrap_or_else(|| self.current_dev());
        let pool = pool.or_else(|| self.drv.current_pool(dev as i32).ok());
        let Some(pool) = pool else {
            // No pool to observe: charge it like a plain allocation.
            return self.alloc(bytes, out, call);
        };
        let attr = |a| self.drv.pool_attribute(pool, a).ok();
        let reserved = attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
        let used = attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(reserved);
        let need = (bytes as u64).saturating_sub(reserved.saturating_sub(used));
        let r = match self.charged_call(dev, DATA, need, "stream-ordered allocation", call) {
            Err(e) => return e,
            Ok(r) => r,
        };
        if !r.is_success() {
            return r;
        }
        let Some(ptr) = out() else {
            l.release(dev, DATA, need);
            return r;
        };
        let after = attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(reserved + need);
        let key = pool.0 as usize;
        let mut t = self.tables();
        let pc = t.pools.entry(key).or_insert(PoolCharge { dev, charged: 0 });
        // What the ledger holds for this pool right now: its settled charge
        // plus our admission; settle it to the pool's reserved memory.
        let have = pc.charged + need;
        if after > have {
            if l.reserve(dev, DATA, after - have).is_err() {
                // The pool grew past what was admitted (its unused memory
                // was less than reserved − used, e.g. rounding) and the
                // budget has no room for the rest: undo, and trim what the
                // pool took beyond its charge so the driver holds no more
                // than the ledger.
                pc.charged = have;
                drop(t);
                let _ = self.drv.mem_free_async(ptr, stream);
                let keep = usize::try_from(have).unwrap_or(usize::MAX);
                let _ = self.drv.pool_trim_to(pool, keep);
                self.settle_pool(key);
                return self.refuse(dev, "stream-ordered allocation", bytes as u64);
            }
        } else if after < have {
            l.release(dev, DATA, have - after);
        }
        pc.charged = after;
        t.async_ptrs.insert(ptr, key);
        r
    }

    /// `cuMemFreeAsync` (and `_ptsz`).
    pub fn free_async(&self, ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let pool = self.tables().async_ptrs.remove(&ptr);
        let Some(pool) = pool else {
            // Maybe charged as a plain allocation (no pool to observe).
            return self.free(ptr, call);
        };
        let r = call();
        if r.is_success() {
            self.settle_pool(pool);
        } else {
            self.tables().async_ptrs.insert(ptr, pool);
        }
        r
    }

    /// `cuMemPoolCreate`: remember the pool's device (`None`: host-located).
    pub fn pool_created(&self, pool: CUmemoryPool, dev: Option<u32>) {
        let old = self.tables().pools.insert(
            pool.0 as usize,
            PoolCharge {
                dev: dev.unwrap_or(HOST_POOL),
                charged: 0,
            },
        );
        // A reused handle: the pool it named is gone (destroyed through a
        // path vgpu did not see), and its memory with it.
        if let Some(old) = old.filter(|o| o.dev != HOST_POOL && o.charged > 0) {
            self.ledger.release(old.dev, DATA, old.charged);
        }
    }

    /// `cuMemPoolTrimTo`: the pool may have shrunk.
    pub fn pool_trimmed(&self, pool: CUmemoryPool) {
        self.settle_pool(pool.0 as usize);
    }

    /// `cuMemPoolDestroy`: the pool's unused memory goes back at once; its
    /// allocations still out keep theirs until freed (cuda.h). Their part
    /// of the charge (the pool's used memory, capped by its charge) moves to
    /// the pointers themselves, split evenly: the pool handle is dead (and
    /// may be reused), and freeing the last of them releases the rest.
    pub fn pool_destroy(&self, pool: CUmemoryPool, call: impl FnOnce() -> CUresult) -> CUresult {
        let used = self
            .drv
            .pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            .unwrap_or(0);
        let r = call();
        if !r.is_success() {
            return r;
        }
        let key = pool.0 as usize;
        let mut t = self.tables();
        let Some(pc) = t.pools.remove(&key) else {
            return r;
        };
        let mut live: Vec<u64> = t
            .async_ptrs
            .iter()
            .filter(|(_, v)| **v == key)
            .map(|(k, _)| *k)
            .collect();
        live.sort_unstable();
        let held = if live.is_empty() {
            0
        } else {
            used.min(pc.charged)
        };
        self.ledger.release(pc.dev, DATA, pc.charged - held);
        let n = live.len() as u64;
        for (i, ptr) in live.into_iter().enumerate() {
            t.async_ptrs.remove(&ptr);
            let share = held / n + if i == 0 { held % n } else { 0 };
            t.put_alloc(
                ptr,
                Charge {
                    dev: pc.dev,
                    kind: DATA,
                    bytes: share,
                    ctx: 0,
                },
            );
        }
        r
    }
}
