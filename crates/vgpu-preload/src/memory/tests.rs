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

    /// `cuGraphInstantiateWithFlags` through the policy.
    fn instantiate(&self, graph: CUgraph, flags: u64) -> Result<CUgraphExec, CUresult> {
        let e = Cell::new(None);
        let r = self.mem().graph_instantiate(
            graph,
            flags,
            || e.get(),
            || match self.drv.instantiate(graph, flags) {
                Ok(x) => {
                    e.set(Some(x));
                    SUCCESS
                }
                Err(err) => err,
            },
        );
        if r.is_success() {
            Ok(e.get().unwrap())
        } else {
            Err(r)
        }
    }

    /// A graph of `allocs` alloc nodes on device 0 (then a free node for
    /// each with `free`), instantiated; (executable, addresses).
    fn graph_exec(&self, allocs: &[u64], free: bool, flags: u64) -> (CUgraphExec, Vec<u64>) {
        let nodes: Vec<(i32, u64)> = allocs.iter().map(|&b| (0, b)).collect();
        let (g, ptrs) = self.drv.graph(&nodes, &[]);
        if free {
            let mut s = self.drv.state();
            let ids = s.graphs[&(g.0 as usize)].clone();
            let kernel = *ids.last().unwrap();
            let mut fresh = ids[..ids.len() - 1].to_vec();
            for &p in &ptrs {
                let n = 0x10_0000_0000 + p as usize;
                s.nodes
                    .insert(n, crate::driver::fake::FakeNode::Free { dptr: p });
                fresh.push(n);
            }
            fresh.push(kernel);
            s.graphs.insert(g.0 as usize, fresh);
        }
        (self.instantiate(g, flags).unwrap(), ptrs)
    }

    /// `cuGraphLaunch` through the policy.
    fn launch(&self, exec: CUgraphExec) -> CUresult {
        self.mem()
            .graph_run(exec, true, || self.drv.graph_launch(exec, CUstream::NULL))
    }

    /// `cuDeviceGraphMemTrim` of device 0 through the policy.
    fn graph_trim(&self) {
        let r = self.drv.graph_mem_trim(0);
        assert!(r.is_success());
        self.mem().graph_trimmed(0, r);
    }

    /// The ledger equals what the fake device holds (no contexts charged).
    #[track_caller]
    fn assert_truth(&self) {
        assert_eq!(self.used(0), self.drv.in_use(0), "ledger vs driver");
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
fn graph_alloc_nodes_past_the_budget_are_refused_before_the_driver_runs_them() {
    let f = fixture(&[1024 * MIB]);
    let (exec, _) = f.graph_exec(&[512 * MIB; 6], false, 0);
    assert_eq!(f.used(0), 0, "instantiation backs nothing here");
    assert_eq!(f.launch(exec), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(f.drv.count("cuGraphLaunch"), 0, "the driver never saw it");
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0));
    // An upload backs the same memory: refused the same way.
    let r = f
        .mem()
        .graph_run(exec, false, || f.drv.graph_launch(exec, CUstream::NULL));
    assert_eq!(r, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    // Two of them fit exactly.
    let (two, _) = f.graph_exec(&[512 * MIB; 2], false, 0);
    assert_eq!(f.launch(two), SUCCESS);
    assert_eq!(f.used(0), 1024 * MIB);
    f.assert_truth();
    assert_eq!(f.alloc(1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
}

#[test]
fn graph_charge_follows_the_allocators_reserved_memory_until_a_trim() {
    let f = fixture(&[1024 * MIB]);
    let (exec, ptrs) = f.graph_exec(&[384 * MIB], false, 0);
    assert_eq!(f.launch(exec), SUCCESS);
    assert_eq!(f.used(0), 384 * MIB);
    f.assert_truth();
    // A relaunch before the allocation is freed: no admission (the driver
    // refuses it), nothing moves.
    assert_eq!(f.launch(exec), CUresult::CUDA_ERROR_INVALID_VALUE);
    f.assert_truth();
    // Freed outside the graph: the allocator keeps the memory, so does the
    // charge; the relaunch reuses it (no new admission: fits at the edge).
    assert!(f.free(ptrs[0]).is_success());
    assert_eq!(f.drv.graph_mem(0).reserved, 384 * MIB);
    assert_eq!(f.used(0), 384 * MIB);
    let edge = f.alloc(640 * MIB).unwrap();
    assert_eq!(
        f.launch(exec),
        SUCCESS,
        "its own memory, reused at the budget"
    );
    f.assert_truth();
    assert!(f.free(edge).is_success());
    assert!(f.free_async(ptrs[0]).is_success());
    // Destroyed: still reserved; trimmed: gone.
    let r = f
        .mem()
        .graph_exec_destroy(exec, || f.drv.graph_exec_destroy(exec));
    assert!(r.is_success());
    assert_eq!(f.used(0), 384 * MIB);
    f.graph_trim();
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0));
}

#[test]
fn a_first_launch_counts_on_no_other_graphs_memory_and_trims_to_make_room() {
    let f = fixture(&[1024 * MIB]);
    let (a, _) = f.graph_exec(&[640 * MIB], true, 0);
    let (b, _) = f.graph_exec(&[640 * MIB], true, 0);
    assert_eq!(f.launch(a), SUCCESS);
    assert_eq!(f.used(0), 640 * MIB, "freed in the graph, kept reserved");
    // b's first launch: a's memory may still be in use on a real GPU, so
    // 640 MiB more are needed; the allocator's unused memory is trimmed to
    // make room, then b is admitted.
    assert_eq!(f.launch(b), SUCCESS);
    assert_eq!(f.drv.count("cuDeviceGraphMemTrim"), 1);
    f.assert_truth();
    // b again: its own memory, no trim.
    assert_eq!(f.launch(b), SUCCESS);
    assert_eq!(f.drv.count("cuDeviceGraphMemTrim"), 1);
    f.assert_truth();
    // Not enough even after a trim: refused, and nothing is left charged
    // that the driver does not hold.
    let (big, _) = f.graph_exec(&[1025 * MIB], true, 0);
    assert_eq!(f.launch(big), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    f.assert_truth();
    assert!(f.used(0) <= 1024 * MIB);
}

#[test]
fn auto_free_relaunches_reuse_what_the_previous_launch_left() {
    let f = fixture(&[1024 * MIB]);
    let (e, _) = f.graph_exec(
        &[768 * MIB],
        false,
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    for i in 0..4 {
        assert_eq!(f.launch(e), SUCCESS, "launch {i}");
        assert_eq!(f.used(0), 768 * MIB);
        f.assert_truth();
    }
}

#[test]
fn memory_backed_beyond_the_admission_is_still_charged() {
    // A driver that rounds a graph allocation up by 64 MiB: at the edge of
    // the budget the ledger records what the device holds, over the budget,
    // and admits nothing more until it comes back.
    let f = fixture(&[1024 * MIB]);
    f.drv.state().graph_extra = 64 * MIB;
    let (e, ptrs) = f.graph_exec(&[1000 * MIB], false, 0);
    assert_eq!(f.launch(e), SUCCESS);
    f.assert_truth();
    assert_eq!(f.used(0), 1064 * MIB);
    assert_eq!(f.alloc(1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert!(f.free(ptrs[0]).is_success());
    f.graph_trim();
    assert_eq!(f.used(0), 0);
    f.assert_truth();
}

#[test]
fn memory_an_instantiation_backs_past_the_budget_is_undone() {
    let f = fixture(&[1024 * MIB]);
    f.drv.state().instantiate_backs = 1536 * MIB;
    let nodes = [(0, 1536 * MIB)];
    let (g, _) = f.drv.graph(&nodes, &[]);
    assert_eq!(f.instantiate(g, 0), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(f.drv.count("cuGraphExecDestroy"), 1, "undone");
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0), "and trimmed");
    // Within the budget it stays, charged.
    f.drv.state().instantiate_backs = 512 * MIB;
    let (g, _) = f.drv.graph(&[(0, 512 * MIB)], &[]);
    assert!(f.instantiate(g, 0).is_ok());
    assert_eq!(f.used(0), 512 * MIB);
    f.assert_truth();
}

#[test]
fn memory_nodes_of_child_graphs_are_found() {
    let f = fixture(&[1024 * MIB]);
    let (parent, _) = f.drv.graph(&[], &[]);
    let (child, _) = f.drv.graph(&[(0, 700 * MIB)], &[]);
    let (grandchild, _) = f.drv.graph(&[(0, 400 * MIB)], &[]);
    f.drv.add_child(child, grandchild);
    f.drv.add_child(parent, child);
    let nodes = f.mem().graph_memory_nodes(parent).unwrap();
    assert_eq!(
        nodes.allocs.iter().map(|a| a.bytes).sum::<u64>(),
        1100 * MIB
    );
    let e = f.instantiate(parent, 0).unwrap();
    assert_eq!(f.launch(e), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(f.drv.in_use(0), 0);
    // Nested past what vgpu looks into: charged after each launch.
    let (deep, _) = f.drv.graph(&[(0, 100 * MIB)], &[]);
    let mut top = deep;
    for _ in 0..9 {
        let (g, _) = f.drv.graph(&[], &[]);
        f.drv.add_child(g, top);
        top = g;
    }
    assert!(f.mem().graph_memory_nodes(top).unwrap().unlisted);
    let e = f.instantiate(top, 0).unwrap();
    assert_eq!(f.launch(e), SUCCESS);
    assert_eq!(f.used(0), 100 * MIB);
    f.assert_truth();
}

#[test]
fn a_graph_whose_nodes_cannot_be_listed_is_charged_after_its_launch() {
    let f = fixture(&[1024 * MIB]);
    let (g, _) = f.drv.graph(&[(0, 300 * MIB)], &[]);
    f.drv
        .fail_next("cuGraphGetNodes", CUresult::CUDA_ERROR_NOT_SUPPORTED);
    let e = f.instantiate(g, 0).unwrap();
    assert_eq!(f.launch(e), SUCCESS);
    assert_eq!(f.used(0), 300 * MIB);
    f.assert_truth();
}

#[test]
fn a_context_teardown_takes_the_graph_memory_with_it() {
    let f = fixture(&[1024 * MIB]);
    let m = f.mem();
    assert!(m.primary_retain(0, || Some(0x100), || SUCCESS).is_success());
    let (e, _) = f.graph_exec(&[256 * MIB], false, 0);
    assert_eq!(f.launch(e), SUCCESS);
    assert_eq!(f.used(0), 8 * MIB + 256 * MIB);
    // The reset frees the context's graph memory (and the driver cannot be
    // asked about a context that is gone): the charge goes with it.
    f.drv.fail_next(
        "cuDeviceGetGraphMemAttribute",
        CUresult::CUDA_ERROR_INVALID_CONTEXT,
    );
    assert!(m.primary_release(0, true, || SUCCESS).is_success());
    assert_eq!(f.used(0), 0);
}

#[test]
fn primary_contexts_are_charged_once_and_refcounted() {
    let f = fixture(&[64 * MIB]);
    let m = f.mem();
    let retain = || {
        m.primary_retain(
            0,
            || None,
            || f.drv.primary_retain(0).err().unwrap_or(SUCCESS),
        )
    };
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
    let r = g.mem().primary_retain(
        0,
        || None,
        || g.drv.primary_retain(0).err().unwrap_or(SUCCESS),
    );
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

#[test]
fn unrepresentable_sizes_never_reach_the_driver_and_counters_hold() {
    // Unlimited and limited devices alike.
    let f = fixture(&[0, 256 * MIB]);
    let p = f.alloc(64 * MIB).unwrap();
    for huge in [u64::MAX, (1 << 56) + 1] {
        assert_eq!(f.alloc(huge), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(f.used(0), 64 * MIB, "{huge}: no wrap");
    }
    assert_eq!(f.drv.count("cuMemAlloc_v2"), 1, "refused before the driver");
    f.drv.set_current(1);
    assert_eq!(f.alloc(u64::MAX), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(f.used(1), 0);
    f.drv.set_current(0);
    assert_eq!(f.free(p), SUCCESS);
    assert_eq!(f.used(0), 0);
}

impl Fixture {
    /// `cuMemCreate` of a device handle through the policy.
    fn vmm_create(&self, bytes: u64) -> u64 {
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
        let r = self.mem().mem_create(
            bytes as usize,
            0,
            || h.get(),
            || match self.drv.mem_create(bytes as usize, &prop) {
                Ok(x) => {
                    h.set(Some(x));
                    SUCCESS
                }
                Err(e) => e,
            },
        );
        assert!(r.is_success());
        h.get().unwrap()
    }

    fn vmm_map(&self, va: u64, size: u64, h: u64) -> CUresult {
        self.mem().mem_map(va, size as usize, h, || {
            self.drv.mem_map(va, size as usize, h)
        })
    }

    fn vmm_unmap(&self, va: u64, size: u64) -> CUresult {
        self.mem()
            .mem_unmap(va, size as usize, || self.drv.mem_unmap(va, size as usize))
    }

    fn vmm_release(&self, h: u64) -> CUresult {
        self.mem().mem_release(h, || self.drv.mem_release(h))
    }
}

#[test]
fn vmm_charge_follows_the_physical_memory_through_release_while_mapped() {
    let f = fixture(&[256 * MIB]);
    let va = 0x10_0000_0000u64;
    // create -> map -> release: the memory is still on the device, and so
    // is the charge.
    let h = f.vmm_create(64 * MIB);
    assert_eq!(f.vmm_map(va, 64 * MIB, h), SUCCESS);
    assert_eq!(f.vmm_release(h), SUCCESS);
    assert_eq!(f.drv.in_use(0), 64 * MIB);
    assert_eq!(f.used(0), 64 * MIB, "charged while mapped");
    // Mapped twice: the first unmap keeps it, the last returns it.
    let h2 = f.vmm_create(32 * MIB);
    assert_eq!(f.vmm_map(va + (1 << 30), 32 * MIB, h2), SUCCESS);
    assert_eq!(f.vmm_map(va + (2 << 30), 32 * MIB, h2), SUCCESS);
    assert_eq!(f.vmm_release(h2), SUCCESS);
    assert_eq!(f.vmm_unmap(va + (1 << 30), 32 * MIB), SUCCESS);
    assert_eq!(f.used(0), 96 * MIB);
    assert_eq!(f.drv.in_use(0), 96 * MIB);
    assert_eq!(f.vmm_unmap(va + (2 << 30), 32 * MIB), SUCCESS);
    assert_eq!(f.used(0), 64 * MIB);
    // One unmap over a range covering the first mapping.
    assert_eq!(f.vmm_unmap(va, 1 << 30), SUCCESS);
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0));
    // unmap first, release after: returned at the release.
    let h3 = f.vmm_create(16 * MIB);
    assert_eq!(f.vmm_map(va, 16 * MIB, h3), SUCCESS);
    assert_eq!(f.vmm_unmap(va, 16 * MIB), SUCCESS);
    assert_eq!(f.used(0), 16 * MIB, "the handle still holds it");
    assert_eq!(f.vmm_release(h3), SUCCESS);
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0));
    // A second release of a released, mapped handle is the driver's error
    // and changes nothing.
    let h4 = f.vmm_create(8 * MIB);
    assert_eq!(f.vmm_map(va, 8 * MIB, h4), SUCCESS);
    assert_eq!(f.vmm_release(h4), SUCCESS);
    assert_ne!(f.vmm_release(h4), SUCCESS);
    assert_eq!(f.used(0), 8 * MIB);
    assert_eq!(f.vmm_unmap(va, 8 * MIB), SUCCESS);
    assert_eq!((f.used(0), f.drv.in_use(0)), (0, 0));
}

/// One call of a random sequence: every allocating family, both ABIs
/// where they differ in what reaches the policy (the v1 calls' 32-bit
/// sizes), and the calls that free.
#[derive(Clone, Debug)]
enum Op {
    Alloc {
        bytes: u64,
        v1: bool,
    },
    Managed(u64),
    Pitch {
        width: u32,
        height: u32,
        v1: bool,
    },
    Free(usize),
    Array {
        w: u32,
        h: u32,
    },
    Array3d {
        w: u32,
        h: u32,
        d: u32,
    },
    ArrayDestroy(usize),
    VmmCreate(u64),
    VmmMap(usize),
    VmmUnmap(usize),
    VmmRelease(usize),
    CtxCreate,
    CtxDestroy(usize),
    AllocAsync(u64),
    FreeAsync(usize),
    Huge,
    PrimaryRetain,
    PrimaryRelease,
    PrimaryReset,
    /// A graph of one alloc node (freed in the graph with `free`),
    /// instantiated (with AUTO_FREE_ON_LAUNCH with `auto`).
    Graph {
        bytes: u64,
        free: bool,
        auto: bool,
    },
    GraphLaunch(usize),
    GraphUpload(usize),
    /// A live graph allocation freed outside its graph (`cuMemFree_v2`, or
    /// `cuMemFreeAsync` with the flag).
    GraphFree(usize, bool),
    GraphExecDestroy(usize),
    GraphTrim,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let mib = 1..=48u64;
    prop_oneof![
        (mib.clone(), any::<bool>()).prop_map(|(m, v1)| Op::Alloc {
            bytes: m * MIB - 4096,
            v1
        }),
        mib.clone().prop_map(|m| Op::Managed(m * MIB)),
        (1000..5000u32, 100..4000u32, any::<bool>()).prop_map(|(width, height, v1)| Op::Pitch {
            width,
            height,
            v1
        }),
        any::<usize>().prop_map(Op::Free),
        (1..2048u32, 1..2048u32).prop_map(|(w, h)| Op::Array { w, h }),
        (1..512u32, 1..512u32, 1..32u32).prop_map(|(w, h, d)| Op::Array3d { w, h, d }),
        any::<usize>().prop_map(Op::ArrayDestroy),
        mib.clone().prop_map(|m| Op::VmmCreate(m * 2 * MIB)),
        any::<usize>().prop_map(Op::VmmMap),
        any::<usize>().prop_map(Op::VmmUnmap),
        any::<usize>().prop_map(Op::VmmRelease),
        Just(Op::CtxCreate),
        any::<usize>().prop_map(Op::CtxDestroy),
        mib.prop_map(|m| Op::AllocAsync(m * MIB)),
        any::<usize>().prop_map(Op::FreeAsync),
        Just(Op::Huge),
        Just(Op::PrimaryRetain),
        Just(Op::PrimaryRelease),
        Just(Op::PrimaryReset),
        (1..=96u64, any::<bool>(), any::<bool>()).prop_map(|(m, free, auto)| Op::Graph {
            bytes: m * 4 * MIB,
            free,
            auto
        }),
        any::<usize>().prop_map(Op::GraphLaunch),
        any::<usize>().prop_map(Op::GraphLaunch),
        any::<usize>().prop_map(Op::GraphUpload),
        (any::<usize>(), any::<bool>()).prop_map(|(i, a)| Op::GraphFree(i, a)),
        any::<usize>().prop_map(Op::GraphExecDestroy),
        Just(Op::GraphTrim),
    ]
}

/// What the test knows is live (to pick objects for frees).
#[derive(Default)]
struct Live {
    ptrs: Vec<u64>,
    arrays: Vec<usize>,
    /// (handle, mapped addresses, released)
    vmm: Vec<(u64, Vec<u64>, bool)>,
    ctxs: Vec<usize>,
    async_ptrs: Vec<u64>,
    primary: u32,
    next_va: u64,
    /// Executables with their allocation's address.
    execs: Vec<(CUgraphExec, u64)>,
}

fn pick<T>(v: &[T], i: usize) -> Option<usize> {
    (!v.is_empty()).then(|| i % v.len())
}

impl Fixture {
    /// Runs one op through the policy against the fake driver.
    fn apply(&self, live: &mut Live, op: &Op) {
        let out = Cell::new(None);
        let ok = |r: CUresult, v: &Cell<Option<u64>>| r.is_success().then(|| v.get()).flatten();
        match *op {
            Op::Alloc { bytes, v1 } => {
                // The v1 ABI's size is 32 bits wide.
                let bytes = if v1 {
                    bytes.min(u64::from(u32::MAX))
                } else {
                    bytes
                };
                if let Ok(p) = self.alloc(bytes) {
                    live.ptrs.push(p);
                }
            }
            Op::Managed(bytes) => {
                if let Ok(p) = self.alloc(bytes) {
                    live.ptrs.push(p);
                }
            }
            Op::Pitch { width, height, v1 } => {
                let (w, h) = if v1 {
                    (width as usize, height as usize)
                } else {
                    (width as usize * 3, height as usize)
                };
                let got = Cell::new(None);
                let r = self.mem().alloc_pitch(
                    w,
                    h,
                    || got.get(),
                    || match self.drv.mem_alloc_pitch(w, h, 4) {
                        Ok(x) => {
                            got.set(Some(x));
                            SUCCESS
                        }
                        Err(e) => e,
                    },
                );
                if r.is_success() {
                    live.ptrs.push(got.get().unwrap().0);
                }
            }
            Op::Free(i) => {
                if let Some(k) = pick(&live.ptrs, i) {
                    let p = live.ptrs.swap_remove(k);
                    assert_eq!(self.free(p), SUCCESS);
                }
            }
            Op::Array { w, h } | Op::Array3d { w, h, d: 1 } => {
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: w as usize,
                    Height: h as usize,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 1,
                };
                let bytes = super::array_bytes(&desc).unwrap();
                let r = self.mem().array_create(
                    bytes,
                    || out.get().map(|x| x as usize),
                    || match self.drv.array_create(&desc) {
                        Ok(a) => {
                            out.set(Some(a.0 as u64));
                            SUCCESS
                        }
                        Err(e) => e,
                    },
                );
                if let Some(a) = ok(r, &out) {
                    live.arrays.push(a as usize);
                }
            }
            Op::Array3d { w, h, d } => {
                // The fake sizes arrays in 2D: fold the depth into the height.
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: w as usize,
                    Height: (h * d) as usize,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 1,
                };
                let d3 = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: w as usize,
                    Height: h as usize,
                    Depth: d as usize,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 1,
                    Flags: 0,
                };
                let bytes = super::array3d_bytes(&d3).unwrap();
                let r = self.mem().array_create(
                    bytes,
                    || out.get().map(|x| x as usize),
                    || match self.drv.array_create(&desc) {
                        Ok(a) => {
                            out.set(Some(a.0 as u64));
                            SUCCESS
                        }
                        Err(e) => e,
                    },
                );
                if let Some(a) = ok(r, &out) {
                    live.arrays.push(a as usize);
                }
            }
            Op::ArrayDestroy(i) => {
                if let Some(k) = pick(&live.arrays, i) {
                    let a = live.arrays.swap_remove(k);
                    let r = self.mem().array_destroy(a, || {
                        self.drv.array_destroy(CUarray(a as *mut std::ffi::c_void))
                    });
                    assert_eq!(r, SUCCESS);
                }
            }
            Op::VmmCreate(bytes) => {
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
                let r = self.mem().mem_create(
                    bytes as usize,
                    0,
                    || out.get(),
                    || match self.drv.mem_create(bytes as usize, &prop) {
                        Ok(h) => {
                            out.set(Some(h));
                            SUCCESS
                        }
                        Err(e) => e,
                    },
                );
                if let Some(h) = ok(r, &out) {
                    live.vmm.push((h, Vec::new(), false));
                }
            }
            Op::VmmMap(i) => {
                if let Some(k) = pick(&live.vmm, i) {
                    if !live.vmm[k].2 {
                        live.next_va += 1 << 32;
                        let va = 0x1000_0000_0000 + live.next_va;
                        assert_eq!(self.vmm_map(va, MIB, live.vmm[k].0), SUCCESS);
                        live.vmm[k].1.push(va);
                    }
                }
            }
            Op::VmmUnmap(i) => {
                if let Some(k) = pick(&live.vmm, i) {
                    if let Some(va) = live.vmm[k].1.pop() {
                        assert_eq!(self.vmm_unmap(va, MIB), SUCCESS);
                    }
                    if live.vmm[k].2 && live.vmm[k].1.is_empty() {
                        live.vmm.swap_remove(k);
                    }
                }
            }
            Op::VmmRelease(i) => {
                if let Some(k) = pick(&live.vmm, i) {
                    if !live.vmm[k].2 {
                        assert_eq!(self.vmm_release(live.vmm[k].0), SUCCESS);
                        live.vmm[k].2 = true;
                        if live.vmm[k].1.is_empty() {
                            live.vmm.swap_remove(k);
                        }
                    }
                }
            }
            Op::CtxCreate => {
                let r = self.mem().ctx_create(
                    0,
                    || out.get().map(|c| c as usize),
                    || match self.drv.ctx_create(0, 0) {
                        Ok(c) => {
                            out.set(Some(c.0 as u64));
                            SUCCESS
                        }
                        Err(e) => e,
                    },
                );
                if let Some(c) = ok(r, &out) {
                    live.ctxs.push(c as usize);
                }
            }
            Op::CtxDestroy(i) => {
                if let Some(k) = pick(&live.ctxs, i) {
                    let c = live.ctxs.swap_remove(k);
                    let r = self.mem().ctx_destroy(c, || {
                        self.drv.ctx_destroy(CUcontext(c as *mut std::ffi::c_void))
                    });
                    assert_eq!(r, SUCCESS);
                }
            }
            Op::AllocAsync(bytes) => {
                if let Ok(p) = self.alloc_async(bytes, None) {
                    live.async_ptrs.push(p);
                }
            }
            Op::FreeAsync(i) => {
                if let Some(k) = pick(&live.async_ptrs, i) {
                    let p = live.async_ptrs.swap_remove(k);
                    assert_eq!(self.free_async(p), SUCCESS);
                }
            }
            Op::Huge => {
                let calls = self.drv.count("cuMemAlloc_v2");
                assert_eq!(
                    self.alloc(u64::MAX),
                    Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
                );
                assert_eq!(self.drv.count("cuMemAlloc_v2"), calls);
            }
            Op::PrimaryRetain => {
                let r = self.mem().primary_retain(
                    0,
                    || Some(0x100),
                    || self.drv.primary_retain(0).err().unwrap_or(SUCCESS),
                );
                if r.is_success() {
                    live.primary += 1;
                }
            }
            Op::PrimaryRelease | Op::PrimaryReset if live.primary == 0 => {}
            Op::PrimaryRelease => {
                let last = live.primary == 1;
                let r = self.mem().primary_release(0, false, || {
                    let r = self.drv.primary_release(0);
                    if last {
                        self.teardown_primary(live);
                    }
                    r
                });
                assert_eq!(r, SUCCESS);
                live.primary -= 1;
            }
            Op::PrimaryReset => {
                let r = self.mem().primary_release(0, true, || {
                    self.drv.state().primary.insert(0, 0);
                    self.teardown_primary(live);
                    SUCCESS
                });
                assert_eq!(r, SUCCESS);
                live.primary = 0;
            }
            Op::Graph { bytes, free, auto } => {
                let flags = if auto {
                    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
                } else {
                    0
                };
                let (e, ptrs) = self.graph_exec(&[bytes], free, flags);
                live.execs.push((e, ptrs[0]));
            }
            Op::GraphLaunch(i) => {
                if let Some(k) = pick(&live.execs, i) {
                    let r = self.launch(live.execs[k].0);
                    assert!(
                        r.is_success()
                            || r == CUresult::CUDA_ERROR_OUT_OF_MEMORY
                            || r == CUresult::CUDA_ERROR_INVALID_VALUE,
                        "{r:?}"
                    );
                }
            }
            Op::GraphUpload(i) => {
                if let Some(k) = pick(&live.execs, i) {
                    let e = live.execs[k].0;
                    // The fake backs nothing at an upload.
                    let r = self.mem().graph_run(e, false, || SUCCESS);
                    assert!(r.is_success() || r == CUresult::CUDA_ERROR_OUT_OF_MEMORY);
                }
            }
            Op::GraphFree(i, stream_ordered) => {
                if let Some(k) = pick(&live.execs, i) {
                    let p = live.execs[k].1;
                    if self.drv.state().graph_live.contains_key(&p) {
                        let r = if stream_ordered {
                            self.free_async(p)
                        } else {
                            self.free(p)
                        };
                        assert_eq!(r, SUCCESS);
                    }
                }
            }
            Op::GraphExecDestroy(i) => {
                if let Some(k) = pick(&live.execs, i) {
                    let (e, _) = live.execs.swap_remove(k);
                    let r = self
                        .mem()
                        .graph_exec_destroy(e, || self.drv.graph_exec_destroy(e));
                    assert_eq!(r, SUCCESS);
                }
            }
            Op::GraphTrim => self.graph_trim(),
        }
    }

    /// What the driver does when the primary context goes: its linear
    /// allocations, arrays, executables and graph memory go with it (every
    /// one here lives in it).
    fn teardown_primary(&self, live: &mut Live) {
        let mut s = self.drv.state();
        let g = std::mem::take(&mut s.graph_mem[0]);
        s.in_use[0] -= g.reserved;
        s.graph_live.clear();
        for (e, _) in live.execs.drain(..) {
            s.execs.remove(&(e.0 as usize));
        }
        for p in live
            .ptrs
            .drain(..)
            .chain(live.arrays.drain(..).map(|a| a as u64))
        {
            if let Some((dev, b)) = s.allocs.remove(&p) {
                s.in_use[dev as usize] -= b;
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// For random sequences of allocation calls across every family, the
    /// ledger equals what the driver holds for the container (plus the
    /// context estimates it charges), and never passes the budget.
    #[test]
    fn the_ledger_equals_what_the_driver_holds(ops in proptest::collection::vec(op(), 1..80)) {
        let limit = 512 * MIB;
        let f = fixture(&[limit]);
        let mut live = Live::default();
        for (i, op) in ops.iter().enumerate() {
            f.apply(&mut live, op);
            let contexts = (live.ctxs.len() as u64 + u64::from(live.primary > 0)) * 8 * MIB;
            proptest::prop_assert_eq!(
                f.used(0),
                f.drv.in_use(0) + contexts,
                "after op {} {:?}", i, op
            );
            proptest::prop_assert!(f.used(0) <= limit, "over the budget after {:?}", op);
        }
    }
}
