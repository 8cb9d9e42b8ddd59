//! Memory policy: reserve before the real call, release on its failure or
//! when the object goes; linear allocations here, stream-ordered memory
//! and pools in [`pools`], arrays, VMM handles and contexts in [`objects`],
//! graph memory in [`graphs`].
//!
//! Every function is a method of [`Mem`]: a driver (any [`CudaDriver`]),
//! the ledger and this process's charge tables as values, so the logic is
//! unit-tested over the fake driver and a region file in a temp dir. The
//! call being interposed comes in as a closure (`call`), so the same logic
//! serves every ABI variant of an entry point; what the policy asks the
//! driver for itself (the current device, pool attributes, an undo) goes
//! through the trait.
//!
//! Must never hold a charge-table lock across a driver call (except the
//! primary-context count, which must move with the driver's own), and
//! never let a refused request reach the driver.
use std::sync::atomic::{AtomicBool, Ordering};

use vgpu_cuda_abi::CUresult;

use crate::attach::{self, Proc};
use crate::driver::{CudaDriver, REAL_CUDA};
use crate::ledger::{Charge, Charges, Kind, Ledger, Map, Tables, TablesGuard, DATA};

pub mod graphs;
pub mod objects;
pub mod pools;
#[cfg(test)]
mod tests;

pub use objects::{array3d_bytes, array_bytes, mipmapped_bytes};

const OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;

/// The memory policy of one process: what it needs, as values.
pub struct Mem<'a> {
    pub drv: &'a dyn CudaDriver,
    pub ledger: &'a Ledger,
    pub charges: &'a Charges,
    /// CUDA devices the process sees: the current device is asked for
    /// only when more than one is visible.
    pub ndev: u32,
    /// Charged per context (`LIBVGPU_CONTEXT_MEMORY`).
    pub context_memory: u64,
}

impl<'a> Mem<'a> {
    pub fn of(p: &'a Proc, drv: &'a dyn CudaDriver) -> Option<Mem<'a>> {
        Some(Mem {
            drv,
            ledger: p.ledger.as_ref()?,
            charges: &p.charges,
            ndev: p.ndev.load(Ordering::Relaxed),
            context_memory: p.cfg.context_memory,
        })
    }
}

/// The policy when a region applies, attaching first if needed.
#[inline]
pub fn limited() -> Option<Mem<'static>> {
    let p = attach::proc()?;
    // Ordinals bind to the region's devices by UUID once the driver can
    // list them (normally inside cuInit already): before any charge, so a
    // charge and its release always map to the same device.
    if p.ledger.as_ref().is_some_and(|l| !l.is_bound()) {
        p.bind_devices(&REAL_CUDA);
    }
    Mem::of(p, &REAL_CUDA)
}

/// The policy when a region applies and the process already attached
/// (frees and destroys: nothing to release before the first charge).
#[inline]
pub fn limited_attached() -> Option<Mem<'static>> {
    Mem::of(attach::attached()?, &REAL_CUDA)
}

static REFUSED_ONCE: AtomicBool = AtomicBool::new(false);

/// The CUDA ordinal of the current context's device: a query only when
/// more than one device is visible (`ndev`), 0 when it fails.
pub fn current_dev(ndev: u32, drv: &dyn CudaDriver) -> u32 {
    if ndev <= 1 {
        return 0;
    }
    drv.ctx_device()
        .ok()
        .and_then(|d| u32::try_from(d).ok())
        .unwrap_or(0)
}

impl Mem<'_> {
    /// The device of the current context.
    pub fn current_dev(&self) -> u32 {
        current_dev(self.ndev, self.drv)
    }

    fn tables(&self) -> TablesGuard<'_> {
        self.charges.tables()
    }

    /// A charge of `bytes` of `kind` on `dev`, with the context it lives
    /// in (see [`Charge::ctx`]): 0, the primary context, unless this
    /// process created contexts on `dev` (one load), when the driver is
    /// asked.
    #[inline]
    fn charge(&self, dev: u32, kind: Kind, bytes: u64) -> Charge {
        let ctx = if self.charges.created_ctx_on(dev) {
            self.context_key(dev)
        } else {
            0
        };
        Charge {
            dev,
            kind,
            bytes,
            ctx,
        }
    }

    /// The current context as [`Charge::ctx`] keys it (0: `dev`'s
    /// primary), out of line: the common path asks no driver.
    #[cold]
    #[inline(never)]
    fn context_key(&self, dev: u32) -> usize {
        let cur = self.drv.ctx_current().map_or(0, |c| c.0 as usize);
        let primary = self.charges.primary().get(&dev).map_or(0, |p| p.handle);
        if cur == primary {
            0
        } else {
            cur
        }
    }

    /// After the driver tore a context down (destroyed, last primary
    /// release, reset): releases the allocations and arrays it freed with
    /// it (`dev` and context key `ctx` as in [`Charge`]; `dev` `None`: any).
    pub(crate) fn sweep_context(&self, dev: Option<u32>, ctx: &[usize]) {
        let hit =
            |c: &Charge| ctx.contains(&c.ctx) && dev.is_none_or(|d| d == c.dev) && c.kind == DATA;
        let mut gone = self.charges.take_allocs(hit);
        {
            let mut t = self.tables();
            t.arrays.retain(|_, c| {
                let h = hit(c);
                if h {
                    gone.push(*c);
                }
                !h
            });
        }
        for c in gone {
            self.ledger.release(c.dev, c.kind, c.bytes);
        }
    }

    /// Logs a refusal: the first one of the process at warning level (so the
    /// operator sees why the application got CUDA_ERROR_OUT_OF_MEMORY), the
    /// rest at info.
    fn refuse(&self, dev: u32, what: &str, bytes: u64) -> CUresult {
        let level = if REFUSED_ONCE.swap(true, Ordering::Relaxed) {
            crate::log::INFO
        } else {
            crate::log::WARN
        };
        crate::log_at!(
            level,
            "{what} of {bytes} B refused on device {dev} (CUDA_ERROR_OUT_OF_MEMORY): container budget {}, in use {} B",
            self.ledger
                .mem_limit(dev)
                .map_or_else(|| "none".to_string(), |b| format!("{b} B")),
            self.ledger.used(dev)
        );
        OOM
    }

    /// Charges `bytes` of `kind` on `dev`, runs `call`, keeps the charge
    /// only if it succeeded.
    fn charged_call(
        &self,
        dev: u32,
        kind: Kind,
        bytes: u64,
        what: &str,
        call: impl FnOnce() -> CUresult,
    ) -> Result<CUresult, CUresult> {
        let l = self.ledger;
        attach::refresh_limits(l);
        if l.reserve(dev, kind, bytes).is_err() {
            // Pools (and graph memory) give memory back at synchronizations
            // and trims vgpu does not see: bring their charges down to what
            // they hold, then look again.
            let lower = self.settle_pools() | self.settle_graphs();
            if !lower || l.reserve(dev, kind, bytes).is_err() {
                return Err(self.refuse(dev, what, bytes));
            }
        }
        let r = call();
        if !r.is_success() {
            l.release(dev, kind, bytes);
        }
        Ok(r)
    }

    /// [`Mem::charged_call`] for an object the driver hands back: on
    /// success the charge is kept under the object's key (read by `out`)
    /// by `put`, so its destroy can release it; no key, no charge.
    #[allow(clippy::too_many_arguments)]
    fn charge_into<K>(
        &self,
        dev: u32,
        kind: Kind,
        bytes: u64,
        what: &str,
        put: impl FnOnce(K, Charge),
        out: impl Fn() -> Option<K>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match self.charged_call(dev, kind, bytes, what, call) {
            Err(e) => e,
            Ok(r) => {
                if r.is_success() {
                    match out() {
                        Some(k) => put(k, self.charge(dev, kind, bytes)),
                        None => self.ledger.release(dev, kind, bytes),
                    }
                }
                r
            }
        }
    }

    /// [`Mem::charge_into`] the table `table` picks.
    #[allow(clippy::too_many_arguments)]
    fn charge_object<K: std::hash::Hash + Eq>(
        &self,
        dev: u32,
        kind: Kind,
        bytes: u64,
        what: &str,
        table: fn(&mut Tables) -> &mut Map<K, Charge>,
        out: impl Fn() -> Option<K>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let put = |k, c| {
            table(&mut self.tables()).insert(k, c);
        };
        self.charge_into(dev, kind, bytes, what, put, out, call)
    }

    /// The destroy of an object [`Mem::charge_object`] recorded: its charge
    /// goes with a successful destroy and stays when the driver refuses;
    /// objects vgpu never charged pass through.
    fn release_object<K: std::hash::Hash + Eq + Copy>(
        &self,
        key: K,
        table: fn(&mut Tables) -> &mut Map<K, Charge>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let c = table(&mut self.tables()).remove(&key);
        let r = call();
        match c {
            Some(c) if r.is_success() => self.ledger.release(c.dev, c.kind, c.bytes),
            Some(c) => {
                table(&mut self.tables()).insert(key, c);
            }
            None => {}
        }
        r
    }

    /// `cuMemAlloc_v2`, `cuMemAllocManaged`: linear device memory.
    pub fn alloc(
        &self,
        bytes: usize,
        out: impl Fn() -> Option<u64>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let dev = self.current_dev();
        let bytes = bytes as u64;
        let put = |ptr, c| self.charges.put_alloc(ptr, c);
        self.charge_into(dev, DATA, bytes, "allocation", put, out, call)
    }

    /// `cuMemAllocPitch_v2`: charges width × height first, then settles to
    /// pitch × height as the driver returned it.
    pub fn alloc_pitch(
        &self,
        width: usize,
        height: usize,
        out: impl Fn() -> Option<(u64, usize)>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let l = self.ledger;
        let dev = self.current_dev();
        let first = (width as u64).saturating_mul(height as u64);
        match self.charged_call(dev, DATA, first, "pitched allocation", call) {
            Err(e) => e,
            Ok(r) if !r.is_success() => r,
            Ok(r) => {
                let Some((ptr, pitch)) = out() else {
                    l.release(dev, DATA, first);
                    return r;
                };
                let actual = (pitch as u64).saturating_mul(height as u64);
                if actual > first && l.reserve(dev, DATA, actual - first).is_err() {
                    // Undo: free what the driver just made.
                    let _ = self.drv.mem_free(ptr);
                    l.release(dev, DATA, first);
                    return self.refuse(dev, "pitched allocation", actual);
                }
                if actual < first {
                    l.release(dev, DATA, first - actual);
                }
                self.charges.put_alloc(ptr, self.charge(dev, DATA, actual));
                r
            }
        }
    }

    /// `cuMemFree_v2` (also a stream-ordered pointer freed synchronously).
    pub fn free(&self, ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let (c, pool) = match self
            .charges
            .take_alloc_or(ptr, |t| t.async_ptrs.remove(&ptr))
        {
            Ok(c) => (Some(c), None),
            Err(pool) => (None, pool),
        };
        if c.is_none() && pool.is_none() {
            // A graph allocation's memory stays the graph allocator's;
            // anything else vgpu never saw: the driver decides.
            return self.graph_free(ptr, call);
        }
        let r = call();
        if r.is_success() {
            if let Some(c) = c {
                self.ledger.release(c.dev, c.kind, c.bytes);
            }
            if let Some(pool) = pool {
                self.settle_pool(pool);
            }
        } else {
            // The driver kept it: so does the ledger.
            if let Some(c) = c {
                self.charges.put_alloc(ptr, c);
            }
            if let Some(pool) = pool {
                self.tables().async_ptrs.insert(ptr, pool);
            }
        }
        r
    }
}
