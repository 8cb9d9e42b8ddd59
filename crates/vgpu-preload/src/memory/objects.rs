//! Objects the driver hands back that hold device memory: VMM handles
//! (`cuMemCreate`), arrays and mipmapped arrays, contexts and primary
//! contexts. Each is charged at creation under its handle and released by
//! its destroy.
use vgpu_cuda_abi::{array_format_bytes, CUresult, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR};

use super::Mem;
use crate::ledger::{CONTEXT, DATA};

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

impl Mem<'_> {
    /// `cuMemCreate` of a device-located handle on `dev`.
    pub fn mem_create(
        &self,
        bytes: usize,
        dev: u32,
        out: impl Fn() -> Option<u64>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let bytes = bytes as u64;
        self.charge_object(
            dev,
            DATA,
            bytes,
            "cuMemCreate",
            |t| &mut t.handles,
            out,
            call,
        )
    }

    /// `cuMemRelease`: the handle goes, but its memory stays on the device
    /// while a mapping of it lives (a common pattern: release right after
    /// `cuMemMap`), and so does its charge, until the last `cuMemUnmap`.
    pub fn mem_release(&self, h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let mapped = {
            let t = self.tables();
            t.handle_refs.get(&h).is_some_and(|r| r.0 > 0 && !r.1)
        };
        if !mapped {
            let r = self.release_object(h, |t| &mut t.handles, call);
            if r.is_success() {
                self.tables().handle_refs.remove(&h);
            }
            return r;
        }
        let r = call();
        if r.is_success() {
            if let Some(rf) = self.tables().handle_refs.get_mut(&h) {
                rf.1 = true;
            }
        }
        r
    }

    /// `cuMemMap` of a handle vgpu charged: one more reference to its
    /// memory.
    pub fn mem_map(
        &self,
        va: u64,
        size: usize,
        h: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r.is_success() {
            let mut t = self.tables();
            if t.handles.contains_key(&h) {
                t.handle_refs.entry(h).or_insert((0, false)).0 += 1;
                t.mappings.insert(va, (size as u64, h));
            }
        }
        r
    }

    /// `cuMemUnmap` of `[va, va + size)`: every mapping starting in it goes;
    /// a released handle whose last mapping that was gives its charge back.
    pub fn mem_unmap(&self, va: u64, size: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if !r.is_success() {
            return r;
        }
        let mut freed = Vec::new();
        {
            let mut t = self.tables();
            let hit: Vec<u64> = t
                .mappings
                .range(va..va.saturating_add(size as u64))
                .map(|(k, _)| *k)
                .collect();
            for k in hit {
                let Some((_, h)) = t.mappings.remove(&k) else {
                    continue;
                };
                let last = match t.handle_refs.get_mut(&h) {
                    Some(rf) => {
                        rf.0 = rf.0.saturating_sub(1);
                        rf.0 == 0 && rf.1
                    }
                    None => false,
                };
                if last {
                    t.handle_refs.remove(&h);
                    if let Some(c) = t.handles.remove(&h) {
                        freed.push(c);
                    }
                }
            }
        }
        for c in freed {
            self.ledger.release(c.dev, c.kind, c.bytes);
        }
        r
    }

    /// `cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuMipmappedArrayCreate`
    /// (`bytes` from the sizes above).
    pub fn array_create(
        &self,
        bytes: u64,
        out: impl Fn() -> Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let dev = self.current_dev();
        self.charge_object(dev, DATA, bytes, "array", |t| &mut t.arrays, out, call)
    }

    /// `cuArrayDestroy`, `cuMipmappedArrayDestroy`.
    pub fn array_destroy(&self, h: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        self.release_object(h, |t| &mut t.arrays, call)
    }

    /// `cuCtxCreate_v2/_v3/_v4`: the configured context estimate on `dev`.
    pub fn ctx_create(
        &self,
        dev: i32,
        out: impl Fn() -> Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let dev = dev.max(0) as u32;
        let est = self.context_memory;
        self.charge_object(
            dev,
            CONTEXT,
            est,
            "context creation",
            |t| &mut t.ctxs,
            out,
            call,
        )
    }

    /// `cuCtxDestroy_v2`: the context's estimate, and what the driver freed
    /// with it.
    pub fn ctx_destroy(&self, ctx: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let dev = self.tables().ctxs.get(&ctx).map(|c| c.dev);
        let r = self.release_object(ctx, |t| &mut t.ctxs, call);
        if r.is_success() && ctx != 0 {
            self.sweep_context(None, &[ctx]);
            // Its graph memory went with it; the device's primary context
            // (or another) may still hold some: the driver says how much.
            self.graph_context_gone(dev, false);
        }
        r
    }

    /// `cuDevicePrimaryCtxRetain`: charged at the first retain of each
    /// device; `out` reads the context handle the driver returned.
    pub fn primary_retain(
        &self,
        dev: i32,
        out: impl Fn() -> Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let l = self.ledger;
        let dev = dev.max(0) as u32;
        let mut prim = self.charges.primary();
        let e = prim.entry(dev).or_default();
        let r = if e.refs == 0 {
            let est = self.context_memory;
            if l.reserve(dev, CONTEXT, est).is_err() {
                return self.refuse(dev, "primary context", est);
            }
            let r = call();
            if r.is_success() {
                e.refs = 1;
                e.charge = est;
            } else {
                l.release(dev, CONTEXT, est);
            }
            r
        } else {
            let r = call();
            if r.is_success() {
                e.refs += 1;
            }
            r
        };
        if r.is_success() {
            if let Some(h) = out() {
                e.handle = h;
            }
        }
        r
    }

    /// `cuDevicePrimaryCtxRelease(_v2)`: the last release returns the
    /// charge. `reset`: `cuDevicePrimaryCtxReset(_v2)` drops the context
    /// outright. Either way, once the primary context is gone, so are the
    /// allocations and arrays in it: their charges go too.
    pub fn primary_release(
        &self,
        dev: i32,
        reset: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let dev = dev.max(0) as u32;
        let mut prim = self.charges.primary();
        let r = call();
        if !r.is_success() {
            return r;
        }
        let mut gone = reset;
        let mut handle = 0;
        if let Some(e) = prim.get_mut(&dev) {
            handle = e.handle;
            e.refs = if reset { 0 } else { e.refs.saturating_sub(1) };
            if e.refs == 0 {
                gone = true;
                if e.charge != 0 {
                    self.ledger.release(dev, CONTEXT, e.charge);
                    e.charge = 0;
                }
            }
        }
        drop(prim);
        if gone {
            // Charged as "the primary" (0), or under its handle when it
            // was asked for before we knew the handle was the primary's.
            self.sweep_context(Some(dev), &[0, handle]);
            let others = self.tables().ctxs.values().any(|c| c.dev == dev);
            self.graph_context_gone(Some(dev), !others);
        }
        r
    }
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
}
