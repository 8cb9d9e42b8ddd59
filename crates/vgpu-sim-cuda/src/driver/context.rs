//! Contexts: created, primary (retained per device) and destroyed.
use super::*;

impl Driver {
    // ---- contexts ----

    pub fn ctx_create(&self, flags: u32, dev: i32) -> R<u64> {
        let dev = self.device(dev)?;
        self.m
            .context_creation(dev, CtxCost::Create)
            .map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(T_CTX);
        g.ctxs.insert(
            id,
            Ctx {
                dev,
                primary: false,
                flags,
                last_seq: 0,
                default_seq: 0,
            },
        );
        drop(g);
        self.m.count_context(dev, 1);
        if let Err(e) = push_current(id) {
            self.teardown(&mut self.lock(), id);
            return Err(e);
        }
        Ok(id)
    }

    /// Destroy a context's resources (memory, streams, events) and forget it.
    pub(super) fn teardown(&self, g: &mut Inner, ctx: u64) {
        let Some(c) = g.ctxs.remove(&ctx) else { return };
        let dead: Vec<u64> = g
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(k, _)| *k)
            .collect();
        for p in dead {
            if let Some(a) = g.allocs.remove(&p) {
                self.free_alloc(g, p, &a);
            }
        }
        // The context's graph memory goes with it, the device's cached
        // graph memory too.
        self.graph_trim_locked(g, c.dev);
        let dead: Vec<u64> = g
            .arrays
            .iter()
            .filter(|(_, a)| a.2 == ctx)
            .map(|(k, _)| *k)
            .collect();
        for a in dead {
            if let Some((dev, size, _)) = g.arrays.remove(&a) {
                self.m.unreserve(dev, size);
            }
        }
        // Destroying a context synchronizes it.
        self.release_pools_locked(g);
        g.streams.retain(|_, s| s.ctx != ctx);
        self.m.count_context(c.dev, -1);
        g.pt_streams.retain(|(_, c), _| *c != ctx);
        // Other threads may still name it; their calls fail as invalid.
        forget_current(ctx);
    }

    pub fn ctx_destroy(&self, ctx: u64) -> R {
        let g = self.lock();
        let c = g
            .ctxs
            .get(&ctx)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if c.primary {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        let seq = c.last_seq;
        drop(g);
        // Destroy proceeds even if the work can never finish.
        let _ = self.m.wait(seq);
        spend(self.m.header().ctx_destroy_ns);
        let mut g = self.lock();
        self.teardown(&mut g, ctx);
        Ok(())
    }

    pub fn primary_retain(&self, dev: i32) -> R<u64> {
        let dev = self.device(dev)?;
        let _p = lock(&self.primary_lock[dev]);
        let (cold, flags) = {
            let g = self.lock();
            let p = &g.primaries[dev];
            (p.refcount == 0, p.flags)
        };
        if cold {
            self.m
                .context_creation(dev, CtxCost::PrimaryCold)
                .map_err(machine_err)?;
            let mut g = self.lock();
            let id = match g.primaries[dev].ctx {
                0 => g.id(T_CTX),
                id => id,
            };
            g.ctxs.insert(
                id,
                Ctx {
                    dev,
                    primary: true,
                    flags,
                    last_seq: 0,
                    default_seq: 0,
                },
            );
            let p = &mut g.primaries[dev];
            p.ctx = id;
            p.refcount = 1;
            drop(g);
            self.m.count_context(dev, 1);
            Ok(id)
        } else {
            spend(self.m.header().primary_retain_nested_ns);
            let mut g = self.lock();
            let p = &mut g.primaries[dev];
            p.refcount += 1;
            Ok(p.ctx)
        }
    }

    pub fn primary_release(&self, dev: i32) -> R {
        let dev = self.device(dev)?;
        let _p = lock(&self.primary_lock[dev]);
        let mut g = self.lock();
        let p = &mut g.primaries[dev];
        if p.refcount == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        p.refcount -= 1;
        if p.refcount > 0 {
            return Ok(());
        }
        let ctx = p.ctx;
        let seq = g.ctxs.get(&ctx).map(|c| c.last_seq).unwrap_or(0);
        drop(g);
        let _ = self.m.wait(seq);
        spend(self.m.header().primary_release_ns);
        let mut g = self.lock();
        self.teardown(&mut g, ctx);
        Ok(())
    }

    pub fn primary_reset(&self, dev: i32) -> R {
        let d = self.device(dev)?;
        let refs = self.lock().primaries[d].refcount;
        if refs > 0 {
            self.lock().primaries[d].refcount = 1;
            self.primary_release(dev)?;
        }
        Ok(())
    }

    pub fn primary_state(&self, dev: i32) -> R<(u32, bool)> {
        let dev = self.device(dev)?;
        let g = self.lock();
        let p = &g.primaries[dev];
        Ok((p.flags, p.refcount > 0))
    }

    pub fn primary_set_flags(&self, dev: i32, flags: u32) -> R {
        let dev = self.device(dev)?;
        // Scheduling (0x07), map-host (0x08), local-mem-resize (0x10),
        // coredump/cig/sync-memops bits.
        if flags & !0x3ff != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        g.primaries[dev].flags = flags;
        Ok(())
    }

    pub fn ctx_of(&self, ctx: u64) -> R<Ctx> {
        self.lock()
            .ctxs
            .get(&ctx)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }

    pub fn ctx_synchronize(&self) -> R {
        let (c, _) = self.ctx()?;
        let seq = self.lock().ctxs.get(&c).map(|c| c.last_seq).unwrap_or(0);
        self.m.wait(seq).map_err(machine_err)?;
        self.release_pools();
        Ok(())
    }
}
