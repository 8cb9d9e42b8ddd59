//! The memory policy over the fake driver and a real region file: no
//! driver, no extra process. Each test drives the policy the way the hooks
//! do (the interposed call as a closure over the fake) and checks the
//! ledger against what the fake driver holds.
use std::cell::Cell;

use vgpu_cuda_abi::*;

use super::pools::HOST_POOL;
use super::Mem;
use crate::driver::fake::FakeCuda;
use crate::driver::CudaDriver;
use crate::ledger::{Charges, Ledger, NewDevice};

const MIB: u64 = 1 << 20;
const SUCCESS: CUresult = CUresult::CUDA_SUCCESS;

struct Fixture {
    _dir: tempfile::TempDir,
    ledger: Ledger,
    charges: Charges,
    drv: FakeCuda,
    ndev: u32,
}

fn fixture(limits: &[u64]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let devs = limits
        .iter()
        .enumerate()
        .map(|(i, &l)| NewDevice {
            uuid: format!("GPU-unit-{i}"),
            mem_limit: l,
            sm_limit: 0,
        })
        .collect();
    let (ledger, _) = Ledger::create(&dir.path().join("r.cache"), 16, devs).unwrap();
    Fixture {
        _dir: dir,
        ledger,
        charges: Charges::default(),
        drv: FakeCuda::new(limits.len(), 80 << 30),
        ndev: limits.len() as u32,
    }
}

impl Fixture {
    fn mem(&self) -> Mem<'_> {
        Mem {
            drv: &self.drv,
            ledger: &self.ledger,
            charges: &self.charges,
            ndev: self.ndev,
            context_memory: 8 * MIB,
        }
    }

    fn used(&self, dev: u32) -> u64 {
        self.ledger.used(dev)
    }

    /// `cuMemAlloc_v2` through the policy; the pointer on success.
    fn alloc(&self, bytes: u64) -> Result<u64, CUresult> {
        let p = Cell::new(None);
        let r = self.mem().alloc(
            bytes as usize,
            || p.get(),
            || match self.drv.mem_alloc(bytes as usize) {
                Ok(x) => {
                    p.set(Some(x));
                    SUCCESS
                }
                Err(e) => e,
            },
        );
        if r.is_success() {
            Ok(p.get().unwrap())
        } else {
            Err(r)
        }
    }

    fn free(&self, ptr: u64) -> CUresult {
        self.mem().free(ptr, || self.drv.mem_free(ptr))
    }

    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` through the policy.
    fn alloc_async(&self, bytes: u64, pool: Option<CUmemoryPool>) -> Result<u64, CUresult> {
        let p = Cell::new(None);
        let r = self.mem().alloc_async(
            bytes as usize,
            pool,
            CUstream::NULL,
            || p.get(),
            || {
                let got = match pool {
                    Some(pl) => {
                        self.drv
                            .mem_alloc_from_pool_async(bytes as usize, pl, CUstream::NULL)
                    }
                    None => self.drv.mem_alloc_async(bytes as usize, CUstream::NULL),
                };
                match got {
                    Ok(x) => {
                        p.set(Some(x));
                        SUCCESS
                    }
                    Err(e) => e,
                }
            },
        );
        if r.is_success() {
            Ok(p.get().unwrap())
        } else {
            Err(r)
        }
    }

    fn free_async(&self, ptr: u64) -> CUresult {
        self.mem()
            .free_async(ptr, || self.drv.mem_free_async(ptr, CUstream::NULL))
    }

    fn create_pool(&self, dev: i32, host: bool) -> CUmemoryPool {
        let props = CUmemPoolProps {
            allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: 0,
            location: CUmemLocation {
                type_: if host {
                    CU_MEM_LOCATION_TYPE_HOST_NUMA
                } else {
                    CU_MEM_LOCATION_TYPE_DEVICE
                },
                id: dev,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let pool = self.drv.pool_create(&props).unwrap();
        self.mem().pool_created(pool, (!host).then_some(dev as u32));
        pool
    }

    fn trim(&self, pool: CUmemoryPool, keep: usize) {
        assert!(self.drv.pool_trim_to(pool, keep).is_success());
        self.mem().pool_trimmed(pool);
    }
}

#[test]
fn linear_allocations_charge_refuse_and_release() {
    let f = fixture(&[64 * MIB]);
    let a = f.alloc(40 * MIB).unwrap();
    assert_eq!(f.used(0), 40 * MIB);
    // Over the budget: refused before the driver is asked.
    let calls = f.drv.count("cuMemAlloc_v2");
    assert_eq!(f.alloc(25 * MIB), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(f.drv.count("cuMemAlloc_v2"), calls);
    assert_eq!(f.used(0), 40 * MIB);
    // The driver refusing releases the charge.
    f.drv
        .fail_next("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(f.alloc(MIB), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(f.used(0), 40 * MIB);
    // A failed free keeps the charge; a successful one returns it.
    f.drv
        .fail_next("cuMemFree_v2", CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(!f.free(a).is_success());
    assert_eq!(f.used(0), 40 * MIB);
    assert!(f.free(a).is_success());
    assert_eq!(f.used(0), 0);
    // A pointer vgpu never charged goes to the driver, which decides.
    assert_eq!(f.free(0xdead), CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(f.used(0), 0);
    assert_eq!(f.drv.in_use(0), 0);
}

#[test]
fn allocations_charge_the_current_device_when_several_are_visible() {
    let f = fixture(&[64 * MIB, 64 * MIB]);
    f.drv.set_current(1);
    let a = f.alloc(8 * MIB).unwrap();
    assert_eq!((f.used(0), f.used(1)), (0, 8 * MIB));
    assert!(f.free(a).is_success());
    assert_eq!(f.used(1), 0);
    // One visible device: no current-device query at all.
    let g = fixture(&[64 * MIB]);
    g.alloc(MIB).unwrap();
    assert_eq!(g.drv.count("cuCtxGetDevice"), 0);
}

#[test]
fn pitched_allocation_settles_to_the_pitch_the_driver_chose() {
    let f = fixture(&[64 * MIB]);
    let out = Cell::new(None);
    let r = f.mem().alloc_pitch(
        1000,
        1024,
        || out.get(),
        || match f.drv.mem_alloc_pitch(1000, 1024, 4) {
            Ok(x) => {
                out.set(Some(x));
                SUCCESS
            }
            Err(e) => e,
        },
    );
    assert!(r.is_success());
    let (ptr, pitch) = out.get().unwrap();
    assert_eq!(pitch, 1024);
    assert_eq!(f.used(0), 1024 * 1024);
    assert!(f.free(ptr).is_success());
    assert_eq!(f.used(0), 0);
    // Room for width x height but not for the pitch: undone and refused.
    let g = fixture(&[1000 * 1024 + 1]);
    let out = Cell::new(None);
    let r = g.mem().alloc_pitch(
        1000,
        1024,
        || out.get(),
        || match g.drv.mem_alloc_pitch(1000, 1024, 4) {
            Ok(x) => {
                out.set(Some(x));
                SUCCESS
            }
            Err(e) => e,
        },
    );
    assert_eq!(r, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(g.used(0), 0);
    assert_eq!(g.drv.in_use(0), 0, "the driver's allocation was freed");
}

#[test]
fn pool_growth_follows_reserved_memory_and_trim_returns_it() {
    let f = fixture(&[16 * MIB]);
    let pool = f.drv.current_pool(0).unwrap();
    // 3 MiB from an empty pool: it reserves 4 MiB (2 MiB steps), all charged.
    let a = f.alloc_async(3 * MIB, None).unwrap();
    assert_eq!(f.drv.pool(pool), (4 * MIB, 3 * MIB));
    assert_eq!(f.used(0), 4 * MIB);
    // 1 MiB more fits in what the pool holds: no growth, no new charge.
    let b = f.alloc_async(MIB, None).unwrap();
    assert_eq!(f.used(0), 4 * MIB);
    // Freed back to the pool: the pool keeps its memory, so does the charge.
    assert!(f.free_async(a).is_success());
    assert!(f.free_async(b).is_success());
    assert_eq!(f.drv.pool(pool), (4 * MIB, 0));
    assert_eq!(f.used(0), 4 * MIB);
    // A trim gives it back to the device, and the charge follows.
    f.trim(pool, 0);
    assert_eq!(f.drv.pool(pool), (0, 0));
    assert_eq!(f.used(0), 0);
    // Growth past the budget is refused before the driver is asked.
    let calls = f.drv.count("cuMemAllocAsync");
    assert_eq!(
        f.alloc_async(17 * MIB, None),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(f.drv.count("cuMemAllocAsync"), calls);
}

#[test]
fn a_pool_that_shrank_unseen_is_settled_before_a_refusal_is_final() {
    let f = fixture(&[8 * MIB]);
    let pool = f.drv.current_pool(0).unwrap();
    let a = f.alloc_async(6 * MIB, None).unwrap();
    assert!(f.free_async(a).is_success());
    assert_eq!(f.used(0), 6 * MIB);
    // The pool gives its memory back at a point vgpu does not see.
    f.drv.pool_release_unused(pool);
    // A linear allocation that only fits once the pool's charge follows.
    let b = f.alloc(7 * MIB).unwrap();
    assert_eq!(f.used(0), 7 * MIB);
    assert!(f.free(b).is_success());
}

#[test]
fn pool_growth_beyond_the_admission_is_undone_and_trimmed() {
    // 4 MiB steps: a 3 MiB request is admitted (3 MiB), the pool takes 4.
    let f = fixture(&[3 * MIB + MIB / 2]);
    f.drv.state().pool_step = 4 * MIB;
    let pool = f.drv.current_pool(0).unwrap();
    assert_eq!(
        f.alloc_async(3 * MIB, None),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(f.used(0), 0, "nothing stays charged");
    assert_eq!(f.drv.pool(pool), (0, 0), "freed and trimmed in the driver");
    assert_eq!(f.drv.in_use(0), 0);
}

#[test]
fn own_pools_host_pools_and_destroy_with_allocations_out() {
    let f = fixture(&[32 * MIB]);
    let own = f.create_pool(0, false);
    let a = f.alloc_async(MIB, Some(own)).unwrap();
    let b = f.alloc_async(MIB, Some(own)).unwrap();
    assert_eq!(f.used(0), 2 * MIB);
    // Host pools take no device memory: not charged at all.
    let host = f.create_pool(0, true);
    assert_eq!(f.charges.tables().pools[&(host.0 as usize)].dev, HOST_POOL);
    let h = f.alloc_async(4 * MIB, Some(host)).unwrap();
    assert_eq!(f.used(0), 2 * MIB);
    assert!(f.free_async(h).is_success());
    // Destroyed with two allocations out: their part stays charged, on the
    // pointers, until each is freed.
    assert!(f
        .mem()
        .pool_destroy(own, || f.drv.pool_destroy(own))
        .is_success());
    assert_eq!(f.used(0), 2 * MIB);
    assert!(f.free(a).is_success());
    assert_eq!(f.used(0), MIB);
    assert!(f.free(b).is_success());
    assert_eq!(f.used(0), 0);
}

#[test]
fn primary_contexts_are_charged_once_and_refcounted() {
    let f = fixture(&[64 * MIB]);
    let m = f.mem();
    let retain = || m.primary_retain(0, || f.drv.primary_retain(0).err().unwrap_or(SUCCESS));
    let release = || m.primary_release(0, false, || f.drv.primary_release(0));
    assert!(retain().is_success());
    assert!(retain().is_success());
    assert_eq!(f.used(0), 8 * MIB, "one estimate per device");
    assert!(release().is_success());
    assert_eq!(f.used(0), 8 * MIB, "still retained once");
    assert!(release().is_success());
    assert_eq!(f.used(0), 0);
    // A retain the driver refuses leaves nothing charged.
    f.drv.fail_next(
        "cuDevicePrimaryCtxRetain",
        CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    );
    assert!(!retain().is_success());
    assert_eq!(f.used(0), 0);
    // A reset drops the context (and its charge) whatever the count.
    assert!(retain().is_success());
    assert!(retain().is_success());
    assert!(m.primary_release(0, true, || SUCCESS).is_success());
    assert_eq!(f.used(0), 0);
    // No room for the estimate: refused without asking the driver.
    let g = fixture(&[4 * MIB]);
    let calls = g.drv.count("cuDevicePrimaryCtxRetain");
    let r = g
        .mem()
        .primary_retain(0, || g.drv.primary_retain(0).err().unwrap_or(SUCCESS));
    assert_eq!(r, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(g.drv.count("cuDevicePrimaryCtxRetain"), calls);
}

#[test]
fn contexts_are_charged_per_context_until_destroyed() {
    let f = fixture(&[64 * MIB]);
    let create = || {
        let c = Cell::new(None);
        let r = f.mem().ctx_create(
            0,
            || c.get(),
            || match f.drv.ctx_create(0, 0) {
                Ok(x) => {
                    c.set(Some(x.0 as usize));
                    SUCCESS
                }
                Err(e) => e,
            },
        );
        assert!(r.is_success());
        c.get().unwrap()
    };
    let (a, b) = (create(), create());
    assert_eq!(f.used(0), 16 * MIB);
    let destroy = |c: usize| {
        f.mem()
            .ctx_destroy(c, || f.drv.ctx_destroy(CUcontext(c as *mut _)))
    };
    assert!(destroy(a).is_success());
    assert_eq!(f.used(0), 8 * MIB);
    // Destroying it twice: the driver refuses, nothing more is released.
    assert!(!destroy(a).is_success());
    assert_eq!(f.used(0), 8 * MIB);
    assert!(destroy(b).is_success());
    assert_eq!(f.used(0), 0);
}

#[test]
fn vmm_handles_hold_their_charge_until_released() {
    let f = fixture(&[64 * MIB]);
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: 0,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: CUmemAllocFlags::default(),
    };
    let h = Cell::new(None);
    let r = f.mem().mem_create(
        (32 * MIB) as usize,
        0,
        || h.get(),
        || match f.drv.mem_create((32 * MIB) as usize, &prop) {
            Ok(x) => {
                h.set(Some(x));
                SUCCESS
            }
            Err(e) => e,
        },
    );
    assert!(r.is_success());
    let h = h.get().unwrap();
    assert_eq!(f.used(0), 32 * MIB);
    // A second handle that would cross the budget is refused up front.
    let calls = f.drv.count("cuMemCreate");
    let r = f.mem().mem_create(
        (40 * MIB) as usize,
        0,
        || None,
        || {
            f.drv
                .mem_create((40 * MIB) as usize, &prop)
                .err()
                .unwrap_or(SUCCESS)
        },
    );
    assert_eq!(r, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(f.drv.count("cuMemCreate"), calls);
    // A release the driver refuses keeps the charge.
    f.drv
        .fail_next("cuMemRelease", CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(!f.mem().mem_release(h, || f.drv.mem_release(h)).is_success());
    assert_eq!(f.used(0), 32 * MIB);
    assert!(f.mem().mem_release(h, || f.drv.mem_release(h)).is_success());
    assert_eq!(f.used(0), 0);
    assert_eq!(f.drv.in_use(0), 0);
    // A handle vgpu never charged passes through.
    assert_eq!(
        f.mem().mem_release(77, || f.drv.mem_release(77)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
}

#[test]
fn arrays_are_charged_by_size_and_released_by_destroy() {
    let f = fixture(&[64 * MIB]);
    let d = CUDA_ARRAY_DESCRIPTOR {
        Width: 1024,
        Height: 1024,
        Format: CU_AD_FORMAT_FLOAT,
        NumChannels: 4,
    };
    let bytes = super::array_bytes(&d).unwrap();
    let h = Cell::new(None);
    let r = f.mem().array_create(
        bytes,
        || h.get(),
        || match f.drv.array_create(&d) {
            Ok(a) => {
                h.set(Some(a.0 as usize));
                SUCCESS
            }
            Err(e) => e,
        },
    );
    assert!(r.is_success());
    assert_eq!(f.used(0), 16 * MIB);
    let h = h.get().unwrap();
    assert!(f
        .mem()
        .array_destroy(h, || f.drv.array_destroy(CUarray(h as *mut _)))
        .is_success());
    assert_eq!(f.used(0), 0);
}
