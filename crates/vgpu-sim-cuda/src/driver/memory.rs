//! Linear, managed and host memory, and arrays.
use super::*;

impl Driver {
    // ---- memory ----

    /// Charge and record a device allocation in the current context.
    pub fn mem_alloc(&self, size: u64, v1: bool) -> R<u64> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, dev) = self.ctx()?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let p = match g.va(size, 512, v1) {
            Ok(p) => p,
            Err(e) => {
                self.m.unreserve(dev, size);
                return Err(e);
            }
        };
        g.allocs.insert(
            p,
            Alloc {
                dev,
                ctx,
                size,
                charged: size,
                kind: AllocKind::Device,
                backing: None,
                ipc: None,
            },
        );
        Ok(p)
    }

    pub fn mem_alloc_managed(&self, size: u64, flags: u32) -> R<u64> {
        if size == 0 || !(flags == 1 || flags == 2) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, dev) = self.ctx()?;
        let map = anon(size)?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let p = map.as_mut_ptr();
        let mut g = self.lock();
        g.allocs.insert(
            p as u64,
            Alloc {
                dev,
                ctx,
                size,
                charged: size,
                kind: AllocKind::Managed(Arc::new(map)),
                backing: None,
                ipc: None,
            },
        );
        Ok(p as u64)
    }

    /// Returns an allocation's memory: to the device, or to its pool (which
    /// keeps it reserved until released).
    pub(super) fn free_alloc(&self, g: &mut Inner, p: u64, a: &Alloc) {
        if let Some((token, nonce)) = a.ipc {
            self.m.ipc_forget(token, nonce);
        }
        crate::data::release_bytes(g, p, a);
        if crate::query::graph_alloc_freed(g, p) {
            // Back to the device's graph memory, reserved until a trim.
            return;
        }
        let AllocKind::Pool(pool, _) = &a.kind else {
            // Managed memory is unmapped as the last `Arc` drops.
            self.m.unreserve(a.dev, a.charged);
            return;
        };
        let Some(p) = g.pools.get_mut(pool) else {
            self.m.unreserve(a.dev, a.charged);
            return;
        };
        p.used = p.used.saturating_sub(a.size);
        p.busy = p.busy.saturating_sub(a.charged);
        if p.destroyed {
            // A destroyed pool keeps only what live allocations occupy.
            self.shrink_pool(p, 0);
            if p.busy == 0 {
                g.pools.remove(pool);
            }
        }
    }

    /// Gives back a pool's unused memory until at most `keep` bytes stay
    /// reserved (or nothing unused is left).
    pub(super) fn shrink_pool(&self, p: &mut Pool, keep: u64) {
        let rel = p.unused().min(p.reserved.saturating_sub(keep));
        if rel > 0 {
            p.reserved -= rel;
            if !p.host {
                self.m.unreserve(p.dev, rel);
            }
        }
    }

    /// What a stream, event or context synchronization does to pools
    /// (cuda.h, `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`): each pool holding more
    /// than its release threshold gives the unused excess back.
    pub fn release_pools(&self) {
        self.release_pools_locked(&mut self.lock());
    }

    pub(super) fn release_pools_locked(&self, g: &mut Inner) {
        for p in g.pools.values_mut() {
            let keep = p.release_threshold;
            self.shrink_pool(p, keep);
        }
    }

    pub fn mem_free(&self, p: u64) -> R {
        if p == 0 {
            return Ok(());
        }
        let mut g = self.lock();
        let a = g
            .allocs
            .remove(&p)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.free_alloc(&mut g, p, &a);
        drop(g);
        if matches!(a.kind, AllocKind::Pool(..)) {
            // cuMemFree of a stream-ordered allocation synchronizes first.
            self.release_pools();
        }
        Ok(())
    }

    /// (free, total) of the current context's device.
    pub fn mem_info(&self) -> R<(u64, u64)> {
        let (_, dev) = self.ctx()?;
        let total = self.m.device(dev).map_err(machine_err)?.memory_bytes;
        Ok((total.saturating_sub(self.m.used(dev)), total))
    }

    pub fn host_alloc(&self, size: u64) -> R<usize> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let map = anon(size)?;
        let p = map.as_mut_ptr();
        self.lock().host.insert(p as usize, map);
        Ok(p as usize)
    }

    pub fn host_free(&self, p: usize) -> R {
        // Unmapped as the mapping drops.
        self.lock()
            .host
            .remove(&p)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(())
    }

    pub fn host_register(&self, p: usize, size: usize, flags: u32) -> R {
        if p == 0 || size == 0 || flags & !0xf != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let mut g = self.lock();
        let end = p
            .checked_add(size)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = g
            .registered
            .range(..end)
            .next_back()
            .is_some_and(|(s, l)| s + l > p);
        if overlaps {
            return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        g.registered.insert(p, size);
        Ok(())
    }

    pub fn host_unregister(&self, p: usize) -> R {
        self.ctx()?;
        self.lock()
            .registered
            .remove(&p)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    }

    // ---- arrays ----

    pub fn array_create(&self, size: Option<u64>, tag: u64) -> R<u64> {
        let size = size
            .filter(|s| *s > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (ctx, dev) = self.ctx()?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(tag);
        g.arrays.insert(id, (dev, size, ctx));
        Ok(id)
    }

    pub fn array_destroy(&self, h: u64, tag: u64) -> R {
        if handle_kind(h) != Some(tag) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let (dev, size, _) = self
            .lock()
            .arrays
            .remove(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        self.m.unreserve(dev, size);
        Ok(())
    }
}
