//! Stream-ordered memory pools.
use super::*;

impl Driver {
    // ---- pools ----

    pub fn default_pool(&self, dev: i32) -> R<u64> {
        self.default_pool_of(self.device(dev)?)
    }

    /// Default pool of the machine's device `dev` (not a CUDA ordinal).
    pub(super) fn default_pool_of(&self, dev: usize) -> R<u64> {
        let mut g = self.lock();
        if let Some(p) = g.default_pools.get(&dev) {
            return Ok(*p);
        }
        let id = g.id(T_POOL);
        g.pools.insert(
            id,
            Pool {
                dev,
                ..Pool::default()
            },
        );
        g.default_pools.insert(dev, id);
        Ok(id)
    }

    /// The device's current pool (`cuDeviceGetMemPool`): the default one
    /// unless `cuDeviceSetMemPool` chose another.
    pub fn current_pool(&self, dev: i32) -> R<u64> {
        self.current_pool_of(self.device(dev)?)
    }

    pub(super) fn current_pool_of(&self, d: usize) -> R<u64> {
        if let Some(p) = self.lock().current_pools.get(&d) {
            return Ok(*p);
        }
        self.default_pool_of(d)
    }

    pub fn set_current_pool(&self, dev: i32, pool: u64) -> R {
        let d = self.device(dev)?;
        let mut g = self.lock();
        match g.pools.get(&pool) {
            Some(p) if p.dev == d && !p.host && !p.destroyed => {
                g.current_pools.insert(d, pool);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemPoolCreate`: pinned memory on a device (`loc_type` DEVICE,
    /// `id` its ordinal) or on a host NUMA node (HOST_NUMA; the sim has
    /// node 0 only); other locations are invalid, as cuda.h says of HOST
    /// and HOST_NUMA_CURRENT.
    pub fn pool_create(&self, alloc_type: u32, loc_type: u32, id: i32, max_size: u64) -> R<u64> {
        const PINNED: u32 = 1;
        const DEVICE: u32 = 1;
        const HOST_NUMA: u32 = 3;
        if alloc_type != PINNED {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (dev, host) = match loc_type {
            DEVICE => (
                self.device(id)
                    .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
                false,
            ),
            HOST_NUMA if id == 0 => (0, true),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let mut g = self.lock();
        let id = g.id(T_POOL);
        g.pools.insert(
            id,
            Pool {
                dev,
                host,
                max_size,
                ..Pool::default()
            },
        );
        Ok(id)
    }

    /// `cuMemPoolDestroy`: not the default pool. Its unused memory goes back
    /// at once; allocations still out keep theirs until freed, and the pool
    /// goes with the last of them (cuda.h).
    pub fn pool_destroy(&self, pool: u64) -> R {
        let mut g = self.lock();
        if g.default_pools.values().any(|p| *p == pool) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = g
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.shrink_pool(p, 0);
        p.destroyed = true;
        if p.busy == 0 {
            g.pools.remove(&pool);
        }
        g.current_pools.retain(|_, p| *p != pool);
        Ok(())
    }

    /// `cuMemPoolTrimTo`: release unused memory until at most `keep` bytes
    /// stay reserved.
    pub fn pool_trim(&self, pool: u64, keep: u64) -> R {
        let mut g = self.lock();
        let p = g
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.shrink_pool(p, keep);
        Ok(())
    }

    /// `cuMemPoolSetAccess`: `(location type, id, flags)` per device. The
    /// owning device always reads and writes its pool.
    pub fn pool_set_access(&self, pool: u64, locs: &[(u32, i32, u32)]) -> R {
        const DEVICE: u32 = 1;
        // CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ, _READWRITE.
        const FLAGS: [u32; 3] = [0, 1, 3];
        let mut want = Vec::with_capacity(locs.len());
        for &(ty, id, flags) in locs {
            if ty != DEVICE || !FLAGS.contains(&flags) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let d = self
                .device(id)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            want.push((d, flags));
        }
        let mut g = self.lock();
        let p = Self::pool_mut(&mut g, pool)?;
        if want.iter().any(|(d, f)| !p.host && *d == p.dev && *f != 3) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // All or nothing: validated above, applied here.
        for (d, f) in want {
            if p.host || d != p.dev {
                p.access.insert(d, f);
            }
        }
        Ok(())
    }

    /// `cuMemPoolGetAccess` from a device, or the CPU for a host pool.
    pub fn pool_get_access(&self, pool: u64, ty: u32, id: i32) -> R<u32> {
        const DEVICE: u32 = 1;
        const HOST_NUMA: u32 = 3;
        const READWRITE: u32 = 3;
        let d = match ty {
            DEVICE => Some(
                self.device(id)
                    .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
            ),
            HOST_NUMA if id == 0 => None,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let mut g = self.lock();
        let p = Self::pool_mut(&mut g, pool)?;
        Ok(match d {
            Some(d) if !p.host && d == p.dev => READWRITE,
            Some(d) => p.access.get(&d).copied().unwrap_or(0),
            // The CPU reaches a host pool by default (cuda.h).
            None if p.host => READWRITE,
            None => 0,
        })
    }

    /// A live pool (not destroyed), for the attribute entry points.
    pub fn pool_mut(g: &mut Inner, pool: u64) -> R<&mut Pool> {
        g.pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// Stream handle -> (ctx, device), resolving the default streams.
    pub fn stream_ctx(&self, stream: u64) -> R<(u64, usize)> {
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            return self.ctx();
        }
        let g = self.lock();
        let s = g
            .streams
            .get(&stream)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let c = g
            .ctxs
            .get(&s.ctx)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        Ok((s.ctx, c.dev))
    }

    /// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync`: reuse the pool's unused
    /// memory first; the pool grows (and the device is charged) only by
    /// what is missing.
    pub fn pool_alloc(&self, size: u64, pool: Option<u64>, stream: u64) -> R<u64> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, sdev) = self.stream_ctx(stream)?;
        let pool = match pool {
            Some(p) => p,
            None => self.current_pool_of(sdev)?,
        };
        let charged = size
            .checked_next_multiple_of(GRANULARITY)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let mut g = self.lock();
        let (dev, host) = {
            let pl = Self::pool_mut(&mut g, pool)?;
            (pl.dev, pl.host)
        };
        if let Some(&graph) = g.captures.get(&stream) {
            // Captured: a graph memory node, made when the graph runs it.
            if host {
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
            let dptr = g.va(size, GRANULARITY, false)?;
            Self::add_node(&mut g, graph, GraphNode::MemAlloc { dptr, size, dev });
            return Ok(dptr);
        }
        let pl = Self::pool_mut(&mut g, pool)?;
        let grow = charged.saturating_sub(pl.unused());
        if pl.max_size != 0 && pl.reserved + grow > pl.max_size {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // Host-located: real host memory the CPU may use, no device memory.
        let (p, backing) = if host {
            let map = anon(size)?;
            (map.as_mut_ptr() as u64, Some(Arc::new(map)))
        } else {
            // Under the lock: two threads must not both count on the same
            // unused memory.
            self.m.reserve(dev, grow).map_err(machine_err)?;
            match g.va(size, 512, false) {
                Ok(p) => (p, None),
                Err(e) => {
                    self.m.unreserve(dev, grow);
                    return Err(e);
                }
            }
        };
        let pl = Self::pool_mut(&mut g, pool)?;
        pl.reserved += grow;
        pl.reserved_high = pl.reserved_high.max(pl.reserved);
        pl.busy += charged;
        pl.used += size;
        pl.used_high = pl.used_high.max(pl.used);
        g.allocs.insert(
            p,
            Alloc {
                dev,
                ctx,
                size,
                charged,
                kind: AllocKind::Pool(pool, backing),
                backing: None,
                ipc: None,
            },
        );
        Ok(p)
    }

    pub fn pool_free(&self, p: u64, stream: u64) -> R {
        self.stream_ctx(stream)?;
        let mut g = self.lock();
        if let Some(&graph) = g.captures.get(&stream) {
            // Captured: a free node of a graph allocation.
            if !crate::query::is_graph_alloc(&g, p) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            Self::add_node(&mut g, graph, GraphNode::MemFree { dptr: p });
            return Ok(());
        }
        match g.allocs.get(&p) {
            // Graph allocations may be freed in stream order too (cuda.h).
            Some(a) if matches!(a.kind, AllocKind::Pool(..)) || g.graph_live.contains_key(&p) => {}
            Some(_) | None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        if let Some(a) = g.allocs.remove(&p) {
            self.free_alloc(&mut g, p, &a);
        }
        Ok(())
    }
}
