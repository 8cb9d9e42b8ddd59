//! Memory policy: reserve before the real call, release on its failure or
//! on free; the virtual memory view. Each function takes the real call as a
//! closure so the same logic serves every ABI variant of an entry point.
use std::sync::atomic::Ordering;

use vgpu_cuda_abi::{
    array_format_bytes, CUmemoryPool, CUresult, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
};

use crate::aux;
use crate::ledger::{Kind, Ledger, CONTEXT, DATA};
use crate::state::{self, Charge, Map, PoolCharge, Proc, Tables};

const OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;

/// The process state and its ledger when a region applies.
#[inline]
fn limited() -> Option<(&'static Proc, &'static Ledger)> {
    let p = state::proc()?;
    Some((p, p.ledger.as_ref()?))
}

#[inline]
fn limited_attached() -> Option<(&'static Proc, &'static Ledger)> {
    let p = state::attached()?;
    Some((p, p.ledger.as_ref()?))
}

/// The device of the current context (a query only when more than one
/// device is visible).
pub fn current_dev(p: &Proc) -> u32 {
    if p.ndev.load(Ordering::Relaxed) <= 1 {
        return 0;
    }
    aux::cuda().and_then(|a| a.current_device()).unwrap_or(0)
}

static REFUSED_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Logs a refusal: the first one of the process at warning level (so the
/// operator sees why the application got CUDA_ERROR_OUT_OF_MEMORY), the
/// rest at info.
fn refuse(l: &Ledger, dev: u32, what: &str, bytes: u64) -> CUresult {
    let level = if REFUSED_ONCE.swap(true, Ordering::Relaxed) {
        crate::log::INFO
    } else {
        crate::log::WARN
    };
    crate::log_at!(
        level,
        "{what} of {bytes} B refused on device {dev} (CUDA_ERROR_OUT_OF_MEMORY): container budget {} B, in use {} B",
        l.mem_limit(dev),
        l.used(dev)
    );
    OOM
}

/// Charges `bytes` of `kind` on `dev`, runs `call`, keeps the charge only if
/// it succeeded; `key` reads the new object's key after success.
fn charged_call(
    l: &Ledger,
    dev: u32,
    kind: Kind,
    bytes: u64,
    what: &str,
    call: impl FnOnce() -> CUresult,
) -> Result<CUresult, CUresult> {
    if l.reserve(dev, kind, bytes).is_err() {
        // Pools give memory back at synchronizations vgpu does not see:
        // bring their charges down to what they hold, then look again.
        let settled = state::proc().is_some_and(|p| settle_pools(p, l));
        if !settled || l.reserve(dev, kind, bytes).is_err() {
            return Err(refuse(l, dev, what, bytes));
        }
    }
    let r = call();
    if !r.is_success() {
        l.release(dev, kind, bytes);
    }
    Ok(r)
}

/// [`charged_call`] for an object the driver hands back: on success the
/// charge is recorded under the object's key (read by `out`) in the table
/// `table` picks, so its destroy can release it; no key, no charge.
#[allow(clippy::too_many_arguments)]
fn charge_object<K: std::hash::Hash + Eq>(
    p: &Proc,
    l: &Ledger,
    dev: u32,
    kind: Kind,
    bytes: u64,
    what: &str,
    table: fn(&mut Tables) -> &mut Map<K, Charge>,
    out: impl Fn() -> Option<K>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match charged_call(l, dev, kind, bytes, what, call) {
        Err(e) => e,
        Ok(r) => {
            if r.is_success() {
                match out() {
                    Some(k) => {
                        table(&mut p.tables()).insert(k, Charge { dev, kind, bytes });
                    }
                    None => l.release(dev, kind, bytes),
                }
            }
            r
        }
    }
}

/// The destroy of an object [`charge_object`] recorded: its charge goes
/// with a successful destroy and stays when the driver refuses; objects
/// vgpu never charged pass through.
fn release_object<K: std::hash::Hash + Eq + Copy>(
    key: K,
    table: fn(&mut Tables) -> &mut Map<K, Charge>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((p, l)) = limited_attached() else {
        return call();
    };
    let c = table(&mut p.tables()).remove(&key);
    let r = call();
    match c {
        Some(c) if r.is_success() => l.release(c.dev, c.kind, c.bytes),
        Some(c) => {
            table(&mut p.tables()).insert(key, c);
        }
        None => {}
    }
    r
}

/// `cuMemAlloc_v2`, `cuMemAllocManaged`: linear device memory.
pub fn alloc(
    bytes: usize,
    out: impl Fn() -> Option<u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((p, l)) = limited() else {
        return call();
    };
    let dev = current_dev(p);
    let bytes = bytes as u64;
    charge_object(
        p,
        l,
        dev,
        DATA,
        bytes,
        "allocation",
        |t| &mut t.allocs,
        out,
        call,
    )
}

/// `cuMemAllocPitch_v2`: charges width × height first, then settles to
/// pitch × height as the driver returned it.
pub fn alloc_pitch(
    width: usize,
    height: usize,
    out: impl Fn() -> Option<(u64, usize)>,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce(u64),
) -> CUresult {
    let Some((p, l)) = limited() else {
        return call();
    };
    let dev = current_dev(p);
    let first = (width as u64).saturating_mul(height as u64);
    match charged_call(l, dev, DATA, first, "pitched allocation", call) {
        Err(e) => e,
        Ok(r) if !r.is_success() => r,
        Ok(r) => {
            let Some((ptr, pitch)) = out() else {
                l.release(dev, DATA, first);
                return r;
            };
            let actual = (pitch as u64).saturating_mul(height as u64);
            if actual > first && l.reserve(dev, DATA, actual - first).is_err() {
                undo(ptr);
                l.release(dev, DATA, first);
                return refuse(l, dev, "pitched allocation", actual);
            }
            if actual < first {
                l.release(dev, DATA, first - actual);
            }
            p.tables().allocs.insert(
                ptr,
                Charge {
                    dev,
                    kind: DATA,
                    bytes: actual,
                },
            );
            r
        }
    }
}

/// `cuMemFree_v2` (also a stream-ordered pointer freed synchronously).
pub fn free(ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((p, l)) = limited_attached() else {
        return call();
    };
    let (c, pool) = {
        let mut t = p.tables();
        match t.allocs.remove(&ptr) {
            Some(c) => (Some(c), None),
            None => (None, t.async_ptrs.remove(&ptr)),
        }
    };
    if c.is_none() && pool.is_none() {
        return call(); // vgpu never saw it: the driver decides
    }
    let r = call();
    if r.is_success() {
        if let Some(c) = c {
            l.release(c.dev, c.kind, c.bytes);
        }
        if let Some(pool) = pool {
            settle_pool(p, l, pool);
        }
    } else {
        let mut t = p.tables();
        if let Some(c) = c {
            t.allocs.insert(ptr, c);
        }
        if let Some(pool) = pool {
            t.async_ptrs.insert(ptr, pool);
        }
    }
    r
}

fn pool_reserved(pool: CUmemoryPool) -> Option<u64> {
    aux::cuda()?.pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
}

/// Brings a pool's charge down to its reserved memory when it shrank.
fn settle_pool(p: &Proc, l: &Ledger, pool: usize) {
    let Some(now) = pool_reserved(CUmemoryPool(pool as *mut _)) else {
        return;
    };
    let mut t = p.tables();
    if let Some(pc) = t.pools.get_mut(&pool) {
        if now < pc.charged {
            l.release(pc.dev, DATA, pc.charged - now);
            pc.charged = now;
        }
    }
}

/// Settles every pool this process holds a charge for; whether any charge
/// went down.
fn settle_pools(p: &Proc, l: &Ledger) -> bool {
    let pools: Vec<(usize, u64)> = p
        .tables()
        .pools
        .iter()
        .filter(|(_, pc)| pc.charged > 0)
        .map(|(k, pc)| (*k, pc.charged))
        .collect();
    let mut lower = false;
    for (pool, before) in pools {
        settle_pool(p, l, pool);
        lower |= p
            .tables()
            .pools
            .get(&pool)
            .is_some_and(|pc| pc.charged < before);
    }
    lower
}

/// After a stream, event or context synchronize: pools above their release
/// threshold gave memory back there (cuda.h), so their charges follow now,
/// for every process sharing the budget. Free when no pool holds a charge.
pub fn synchronized(r: CUresult) {
    if !r.is_success() {
        return;
    }
    if let Some((p, l)) = limited_attached() {
        settle_pools(p, l);
    }
}

/// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync` (and `_ptsz`): admission on
/// what the pool must grow by, then the charge follows the pool's reserved
/// memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`) after the call.
pub fn alloc_async(
    bytes: usize,
    pool: Option<CUmemoryPool>,
    out: impl Fn() -> Option<u64>,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce(u64),
) -> CUresult {
    let Some((p, l)) = limited() else {
        return call();
    };
    let a = aux::cuda();
    let known_dev = pool.and_then(|pl| p.tables().pools.get(&(pl.0 as usize)).map(|pc| pc.dev));
    if known_dev == Some(HOST_POOL) {
        return call();
    }
    let dev = known_dev.unwrap_or_else(|| current_dev(p));
    let pool = pool.or_else(|| a.and_then(|a| a.current_pool(dev)));
    let Some((a, pool)) = a.zip(pool) else {
        // No pool to observe: charge it like a plain allocation.
        return alloc(bytes, out, call);
    };
    let reserved = a
        .pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        .unwrap_or(0);
    let used = a
        .pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        .unwrap_or(reserved);
    let need = (bytes as u64).saturating_sub(reserved.saturating_sub(used));
    let r = match charged_call(l, dev, DATA, need, "stream-ordered allocation", call) {
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
    let after = a
        .pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        .unwrap_or(reserved + need);
    let key = pool.0 as usize;
    let mut t = p.tables();
    let pc = t.pools.entry(key).or_insert(PoolCharge { dev, charged: 0 });
    // What the ledger holds for this pool right now: its settled charge plus
    // our admission; settle it to the pool's reserved memory.
    let have = pc.charged + need;
    if after > have {
        if l.reserve(dev, DATA, after - have).is_err() {
            // The pool grew past what was admitted (its unused memory was
            // less than reserved − used, e.g. rounding) and the budget has
            // no room for the rest: undo, and trim what the pool took
            // beyond its charge so the driver holds no more than the ledger.
            pc.charged = have;
            drop(t);
            undo(ptr);
            crate::hooks::cuda::pool_trim_raw(pool, have);
            settle_pool(p, l, key);
            return refuse(l, dev, "stream-ordered allocation", bytes as u64);
        }
    } else if after < have {
        l.release(dev, DATA, have - after);
    }
    pc.charged = after;
    t.async_ptrs.insert(ptr, key);
    r
}

/// `cuMemFreeAsync` (and `_ptsz`).
pub fn free_async(ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((p, l)) = limited_attached() else {
        return call();
    };
    let pool = p.tables().async_ptrs.remove(&ptr);
    let Some(pool) = pool else {
        // Maybe charged as a plain allocation (no pool to observe).
        return free(ptr, call);
    };
    let r = call();
    if r.is_success() {
        settle_pool(p, l, pool);
    } else {
        p.tables().async_ptrs.insert(ptr, pool);
    }
    r
}

/// The device recorded for a pool in host memory (a host NUMA node): its
/// allocations take no device memory and pass through uncharged.
const HOST_POOL: u32 = u32::MAX;

/// `cuMemPoolCreate`: remember the pool's device (`None`: host-located).
pub fn pool_created(pool: CUmemoryPool, dev: Option<u32>) {
    let Some((p, l)) = limited() else { return };
    let old = p.tables().pools.insert(
        pool.0 as usize,
        PoolCharge {
            dev: dev.unwrap_or(HOST_POOL),
            charged: 0,
        },
    );
    // A reused handle: the pool it named is gone (destroyed through a path
    // vgpu did not see), and its memory with it.
    if let Some(old) = old.filter(|o| o.dev != HOST_POOL && o.charged > 0) {
        l.release(old.dev, DATA, old.charged);
    }
}

/// `cuMemPoolTrimTo`: the pool may have shrunk.
pub fn pool_trimmed(pool: CUmemoryPool) {
    if let Some((p, l)) = limited_attached() {
        settle_pool(p, l, pool.0 as usize);
    }
}

/// `cuMemPoolDestroy`: the pool's unused memory goes back at once; its
/// allocations still out keep theirs until freed (cuda.h). Their part of
/// the charge (the pool's used memory, capped by its charge) moves to the
/// pointers themselves, split evenly: the pool handle is dead (and may be
/// reused), and freeing the last of them releases the rest.
pub fn pool_destroy(pool: CUmemoryPool, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((p, l)) = limited_attached() else {
        return call();
    };
    let used = aux::cuda()
        .and_then(|a| a.pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT))
        .unwrap_or(0);
    let r = call();
    if !r.is_success() {
        return r;
    }
    let key = pool.0 as usize;
    let mut t = p.tables();
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
    l.release(pc.dev, DATA, pc.charged - held);
    let n = live.len() as u64;
    for (i, ptr) in live.into_iter().enumerate() {
        t.async_ptrs.remove(&ptr);
        let share = held / n + if i == 0 { held % n } else { 0 };
        t.allocs.insert(
            ptr,
            Charge {
                dev: pc.dev,
                kind: DATA,
                bytes: share,
            },
        );
    }
    r
}

/// `cuMemCreate`: device-located physical allocations.
pub fn mem_create(
    bytes: usize,
    dev: Option<u32>,
    out: impl Fn() -> Option<u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(dev) = dev else { return call() }; // host-located: pass through
    let Some((p, l)) = limited() else {
        return call();
    };
    let bytes = bytes as u64;
    charge_object(
        p,
        l,
        dev,
        DATA,
        bytes,
        "cuMemCreate",
        |t| &mut t.handles,
        out,
        call,
    )
}

/// `cuMemRelease`.
pub fn mem_release(h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    release_object(h, |t| &mut t.handles, call)
}

/// Bytes of a 2D array; `None` for formats vgpu does not size.
pub fn array_bytes(d: &CUDA_ARRAY_DESCRIPTOR) -> Option<u64> {
    let fb = array_format_bytes(d.Format)?;
    Some(
        (d.Width as u64)
            .max(1)
            .saturating_mul((d.Height as u64).max(1))
            .saturating_mul(d.NumChannels as u64)
            .saturating_mul(fb),
    )
}

/// Bytes of a 3D (or layered/1D/2D) array.
pub fn array3d_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> Option<u64> {
    let fb = array_format_bytes(d.Format)?;
    Some(
        (d.Width as u64)
            .max(1)
            .saturating_mul((d.Height as u64).max(1))
            .saturating_mul((d.Depth as u64).max(1))
            .saturating_mul(d.NumChannels as u64)
            .saturating_mul(fb),
    )
}

/// Bytes of a mipmapped array: the sum of its levels, each dimension
/// halving (never below 1) per level.
pub fn mipmapped_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> Option<u64> {
    let fb = array_format_bytes(d.Format)?;
    let mut total: u64 = 0;
    for lv in 0..levels.clamp(1, 64) {
        let dim = |x: usize| ((x as u64) >> lv).max(1);
        let lvl = dim(d.Width)
            .saturating_mul(dim(d.Height))
            .saturating_mul(dim(d.Depth))
            .saturating_mul(d.NumChannels as u64)
            .saturating_mul(fb);
        total = total.saturating_add(lvl);
    }
    Some(total)
}

/// `cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuMipmappedArrayCreate`.
pub fn array_create(
    bytes: Option<u64>,
    out: impl Fn() -> Option<usize>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(bytes) = bytes else {
        crate::debug!("array of a format vgpu does not size: not charged");
        return call();
    };
    let Some((p, l)) = limited() else {
        return call();
    };
    let dev = current_dev(p);
    charge_object(
        p,
        l,
        dev,
        DATA,
        bytes,
        "array",
        |t| &mut t.arrays,
        out,
        call,
    )
}

/// `cuArrayDestroy`, `cuMipmappedArrayDestroy`.
pub fn array_destroy(h: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    release_object(h, |t| &mut t.arrays, call)
}

/// `cuCtxCreate_v2/_v3/_v4`: the configured context estimate on `dev`.
pub fn ctx_create(
    dev: i32,
    out: impl Fn() -> Option<usize>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((p, l)) = limited() else {
        return call();
    };
    let dev = dev.max(0) as u32;
    let est = p.cfg.context_memory;
    charge_object(
        p,
        l,
        dev,
        CONTEXT,
        est,
        "context creation",
        |t| &mut t.ctxs,
        out,
        call,
    )
}

/// `cuCtxDestroy_v2`.
pub fn ctx_destroy(ctx: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    release_object(ctx, |t| &mut t.ctxs, call)
}

/// `cuDevicePrimaryCtxRetain`: charged at the first retain of each device.
pub fn primary_retain(dev: i32, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((p, l)) = limited() else {
        return call();
    };
    let dev = dev.max(0) as u32;
    let mut prim = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    let e = prim.entry(dev).or_insert((0, 0));
    if e.0 == 0 {
        let est = p.cfg.context_memory;
        if l.reserve(dev, CONTEXT, est).is_err() {
            return refuse(l, dev, "primary context", est);
        }
        let r = call();
        if r.is_success() {
            *e = (1, est);
        } else {
            l.release(dev, CONTEXT, est);
        }
        r
    } else {
        let r = call();
        if r.is_success() {
            e.0 += 1;
        }
        r
    }
}

/// `cuDevicePrimaryCtxRelease(_v2)`: the last release returns the charge.
/// `reset`: `cuDevicePrimaryCtxReset(_v2)` drops the context outright.
pub fn primary_release(dev: i32, reset: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((p, l)) = limited_attached() else {
        return call();
    };
    let dev = dev.max(0) as u32;
    let mut prim = p.primary.lock().unwrap_or_else(|e| e.into_inner());
    let r = call();
    if r.is_success() {
        if let Some(e) = prim.get_mut(&dev) {
            if reset {
                e.0 = 0;
            } else {
                e.0 = e.0.saturating_sub(1);
            }
            if e.0 == 0 && e.1 != 0 {
                l.release(dev, CONTEXT, e.1);
                e.1 = 0;
            }
        }
    }
    r
}

/// The virtual total and free for a device: total = min(limit, physical),
/// free = total − the container's usage (never below zero, never above
/// the physical free).
pub fn view(limit: u64, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64) {
    if limit == 0 {
        return (phys_free, phys_total);
    }
    let total = limit.min(phys_total);
    (total.saturating_sub(used).min(phys_free), total)
}

/// `cuMemGetInfo_v2`.
///
/// # Safety
/// `free`/`total` are the caller's out-pointers (valid when `call` succeeds).
pub unsafe fn mem_get_info(
    free: *mut usize,
    total: *mut usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = call();
    if !r.is_success() {
        return r;
    }
    let Some(p) = state::proc() else { return r };
    let dev = current_dev(p);
    let limit = p.mem_limit(dev);
    if limit == 0 {
        return r;
    }
    if let Some(l) = &p.ledger {
        let pools: Vec<usize> = p.tables().pools.keys().copied().collect();
        for pool in pools {
            settle_pool(p, l, pool);
        }
    }
    // SAFETY: the driver just succeeded writing both, so both are valid.
    let (pf, pt) = unsafe {
        (
            crate::sys::get(free).unwrap_or(0),
            crate::sys::get(total).unwrap_or(0),
        )
    };
    let (f, t) = view(limit, p.used(dev), pf as u64, pt as u64);
    // SAFETY: as above.
    unsafe {
        crate::sys::put(free, f as usize);
        crate::sys::put(total, t as usize);
    }
    r
}

/// `cuDeviceTotalMem_v2`: the limit (capped by the physical total).
///
/// # Safety
/// `bytes` is the caller's out-pointer (valid when `call` succeeds).
pub unsafe fn device_total_mem(
    bytes: *mut usize,
    dev: i32,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = call();
    if !r.is_success() {
        return r;
    }
    let Some(p) = state::proc() else { return r };
    let limit = p.mem_limit(dev.max(0) as u32);
    if limit != 0 {
        // SAFETY: the driver just wrote it successfully.
        unsafe {
            let phys = crate::sys::get(bytes).unwrap_or(0) as u64;
            crate::sys::put(bytes, limit.min(phys) as usize);
        }
    }
    r
}

/// The launch path's gate: one atomic load when nothing is SM-limited.
/// With an SM limit, identity resolves here at first need (or retries when
/// its backoff is due), then the pacing seam (`state::launch_gate`) runs.
#[inline]
pub fn launch_gate() {
    if let Some(p) = state::attached() {
        if p.sm_limited {
            limited_launch(p);
        }
    }
}

fn limited_launch(p: &Proc) {
    crate::identity::on_limited_launch(p);
    state::launch_gate();
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_cuda_abi::{CU_AD_FORMAT_FLOAT, CU_AD_FORMAT_UNSIGNED_INT8};

    #[test]
    fn array_sizes() {
        let d = CUDA_ARRAY_DESCRIPTOR {
            Width: 100,
            Height: 0,
            Format: CU_AD_FORMAT_FLOAT,
            NumChannels: 4,
        };
        assert_eq!(array_bytes(&d), Some(1600));
        let d3 = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 64,
            Height: 32,
            Depth: 2,
            Format: CU_AD_FORMAT_UNSIGNED_INT8,
            NumChannels: 2,
            Flags: 0,
        };
        assert_eq!(array3d_bytes(&d3), Some(64 * 32 * 2 * 2));
        let bad = CUDA_ARRAY_DESCRIPTOR {
            Width: 1,
            Height: 1,
            Format: 0xb0,
            NumChannels: 1,
        };
        assert_eq!(array_bytes(&bad), None);
    }

    #[test]
    fn mipmap_levels_sum() {
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 4,
            Depth: 0,
            Format: CU_AD_FORMAT_FLOAT,
            NumChannels: 1,
            Flags: 0,
        };
        // 8x4 + 4x2 + 2x1 + 1x1 texels of 4 bytes.
        assert_eq!(mipmapped_bytes(&d, 4), Some((32 + 8 + 2 + 1) * 4));
        assert_eq!(mipmapped_bytes(&d, 0), Some(32 * 4));
    }

    #[test]
    fn view_never_underflows() {
        let g = 1u64 << 30;
        assert_eq!(view(0, 5, 7, 9), (7, 9));
        assert_eq!(view(2 * g, g / 2, 70 * g, 80 * g), (2 * g - g / 2, 2 * g));
        assert_eq!(view(2 * g, 3 * g, 70 * g, 80 * g), (0, 2 * g));
        assert_eq!(view(100 * g, 0, 70 * g, 80 * g), (70 * g, 80 * g));
        assert_eq!(view(2 * g, 0, g, 80 * g), (g, 2 * g));
    }
}
