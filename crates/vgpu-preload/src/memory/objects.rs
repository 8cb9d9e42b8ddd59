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

    /// `cuMemRelease`.
    pub fn mem_release(&self, h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        self.release_object(h, |t| &mut t.handles, call)
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

    /// `cuCtxDestroy_v2`.
    pub fn ctx_destroy(&self, ctx: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        self.release_object(ctx, |t| &mut t.ctxs, call)
    }

    /// `cuDevicePrimaryCtxRetain`: charged at the first retain of each
    /// device.
    pub fn primary_retain(&self, dev: i32, call: impl FnOnce() -> CUresult) -> CUresult {
        let l = self.ledger;
        let dev = dev.max(0) as u32;
        let mut prim = self.charges.primary();
        let e = prim.entry(dev).or_insert((0, 0));
        if e.0 == 0 {
            let est = self.context_memory;
            if l.reserve(dev, CONTEXT, est).is_err() {
                return self.refuse(dev, "primary context", est);
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

    /// `cuDevicePrimaryCtxRelease(_v2)`: the last release returns the
    /// charge. `reset`: `cuDevicePrimaryCtxReset(_v2)` drops the context
    /// outright.
    pub fn primary_release(
        &self,
        dev: i32,
        reset: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let dev = dev.max(0) as u32;
        let mut prim = self.charges.primary();
        let r = call();
        if r.is_success() {
            if let Some(e) = prim.get_mut(&dev) {
                if reset {
                    e.0 = 0;
                } else {
                    e.0 = e.0.saturating_sub(1);
                }
                if e.0 == 0 && e.1 != 0 {
                    self.ledger.release(dev, CONTEXT, e.1);
                    e.1 = 0;
                }
            }
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
