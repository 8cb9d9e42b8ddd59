//! Test doubles of [`CudaDriver`] and [`NvmlDriver`] (youki's
//! `TestHelperSyscall` model): every call is recorded by name, answers come
//! from a small device model, and any call can be scripted to fail next.
//!
//! The model is what the policy tests need and no more: devices with a
//! total and a current one, linear allocations, pools whose reserved
//! memory grows in `pool_step` increments and shrinks only at a trim or a
//! synchronize, VMM handles, primary-context reference counts, contexts,
//! graphs with memory nodes (a per-device graph allocator that reuses what
//! it reserved and keeps freed memory until a trim, as the simulator and
//! cuda.h describe), and an NVML side with handles, UUIDs and memory info.
//!
//! For the limiter (given a [`FakeClock`] by [`FakeCuda::with_clock`]):
//! streams that run queued GPU time in order ([`FakeCuda::kernel`], graph
//! executables' own costs), events that complete when their stream's work
//! before them has run on that clock (`cuEventQuery` / `ElapsedTime` follow
//! it), streams under capture, entries the driver lacks ([`CudaDriver::has`]),
//! and NVML per-process utilization samples.
#![allow(clippy::unwrap_used)]
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CStr};
use std::sync::Mutex;

use vgpu_cuda_abi::*;

use super::{api, cu_ok, CuResult, CudaDriver, NvmlDriver, NvmlResult, ProcessInfo};
use crate::clock::{Clock, FakeClock};

#[derive(Clone, Debug, Default)]
pub struct FakePool {
    pub dev: CUdevice,
    pub reserved: u64,
    pub used: u64,
    /// In host memory (not charged).
    pub host: bool,
    pub live: bool,
}

/// A node of a fake graph.
#[derive(Clone, Copy, Debug)]
pub enum FakeNode {
    Kernel,
    Alloc {
        dptr: CUdeviceptr,
        dev: CUdevice,
        bytes: u64,
    },
    Free {
        dptr: CUdeviceptr,
    },
    /// A child graph node (its graph by handle).
    Child(usize),
}

/// One device's graph allocator: (used by live allocations, reserved).
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeGraphMem {
    pub used: u64,
    pub reserved: u64,
}

#[derive(Default)]
pub struct CudaState {
    /// Per device: total bytes.
    pub totals: Vec<u64>,
    pub uuids: Vec<String>,
    pub current: CUdevice,
    /// Bytes the device has handed out (allocations + pools' reserved).
    pub in_use: Vec<u64>,
    pub allocs: HashMap<CUdeviceptr, (CUdevice, u64)>,
    pub pools: HashMap<usize, FakePool>,
    /// Stream-ordered pointer -> (pool, bytes).
    pub async_ptrs: HashMap<CUdeviceptr, (usize, u64)>,
    pub handles: HashMap<u64, (CUdevice, u64)>,
    /// VMM handle -> (live mappings, released): the memory goes when the
    /// handle is released and its last mapping is gone (as the driver does).
    pub vmm: HashMap<u64, (u32, bool)>,
    /// Mapped address -> (size, handle).
    pub mappings: std::collections::BTreeMap<CUdeviceptr, (u64, u64)>,
    pub primary: HashMap<CUdevice, u32>,
    pub ctxs: HashMap<usize, CUdevice>,
    /// Pools grow their reserved memory in steps of this many bytes.
    pub pool_step: u64,
    /// Pitch alignment of `mem_alloc_pitch`.
    pub pitch_align: usize,
    /// Graphs: handle -> node handles; nodes by handle.
    pub graphs: HashMap<usize, Vec<usize>>,
    pub nodes: HashMap<usize, FakeNode>,
    /// Executables: handle -> (nodes, child graphs flattened;
    /// AUTO_FREE_ON_LAUNCH; bytes its instantiation mapped on device 0).
    pub execs: HashMap<usize, (Vec<FakeNode>, bool, u64)>,
    /// Per device: the graph allocator.
    pub graph_mem: Vec<FakeGraphMem>,
    /// Live graph allocations: address -> (device, bytes).
    pub graph_live: HashMap<CUdeviceptr, (CUdevice, u64)>,
    /// Bytes each graph allocation takes beyond its size (a driver that
    /// rounds up more than vgpu can know).
    pub graph_extra: u64,
    /// Bytes an instantiation maps at once for the executable (a driver
    /// that maps there), in use until the executable is destroyed.
    pub instantiate_backs: u64,
    /// The clock GPU time follows (`None`: events are ready at once and
    /// 1 ms apart, as before the limiter's tests needed more).
    pub clock: Option<&'static FakeClock>,
    /// Per stream key (`CU_STREAM_PER_THREAD` for the per-thread default
    /// stream): when the work queued on it so far has run.
    pub stream_busy: HashMap<u64, u64>,
    /// Recorded events: handle -> when they complete.
    pub events: HashMap<usize, u64>,
    /// Streams (by key) whose work is being captured, not run.
    pub capturing: std::collections::HashSet<u64>,
    /// GPU time of one launch of an executable (by handle; 0 when unset).
    pub exec_cost: HashMap<usize, u64>,
    /// Entries this driver lacks (for [`CudaDriver::has`]).
    pub missing: Vec<api::Fn>,
    next: u64,
    /// Scripted answers: the next call of that name fails with the code.
    fail: HashMap<&'static str, VecDeque<CUresult>>,
    pub calls: Vec<&'static str>,
}

/// A scripted CUDA driver.
pub struct FakeCuda(pub Mutex<CudaState>);

impl FakeCuda {
    /// `devices` devices of `total` bytes each; pools step by 2 MiB.
    pub fn new(devices: usize, total: u64) -> FakeCuda {
        FakeCuda(Mutex::new(CudaState {
            totals: vec![total; devices],
            uuids: (0..devices)
                .map(|i| format!("GPU-fake{i:04}-0000-0000-0000-000000000000"))
                .collect(),
            in_use: vec![0; devices],
            graph_mem: vec![FakeGraphMem::default(); devices],
            pool_step: 2 << 20,
            pitch_align: 512,
            next: 0x7f00_0000_0000,
            ..CudaState::default()
        }))
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, CudaState> {
        self.0.lock().unwrap()
    }

    /// GPU time follows `clock` (events complete when their stream's work
    /// has run on it).
    pub fn with_clock(self, clock: &'static FakeClock) -> FakeCuda {
        self.state().clock = Some(clock);
        self
    }

    /// A kernel launch that runs `ns` of GPU time on `stream` (after what
    /// is queued there): what a hook's real call does, for the limiter's
    /// tests. Scriptable as `cuLaunchKernel`.
    pub fn kernel(&self, stream: CUstream, ns: u64) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuLaunchKernel") {
            return e;
        }
        s.queue(stream.0 as u64, ns);
        CUresult::CUDA_SUCCESS
    }

    /// The next call named `call` answers `code`.
    pub fn fail_next(&self, call: &'static str, code: CUresult) {
        self.state().fail.entry(call).or_default().push_back(code);
    }

    /// How many times `call` was made.
    pub fn count(&self, call: &str) -> usize {
        self.state().calls.iter().filter(|c| **c == call).count()
    }

    pub fn set_current(&self, dev: CUdevice) {
        self.state().current = dev;
    }

    /// A pool's (reserved, used).
    pub fn pool(&self, pool: CUmemoryPool) -> (u64, u64) {
        let s = self.state();
        let p = &s.pools[&(pool.0 as usize)];
        (p.reserved, p.used)
    }

    /// Bytes the device has handed out.
    pub fn in_use(&self, dev: CUdevice) -> u64 {
        self.state().in_use[dev as usize]
    }

    /// Gives back what a pool holds above its use (as a synchronize does
    /// for a pool above its release threshold, here 0).
    pub fn pool_release_unused(&self, pool: CUmemoryPool) {
        let mut s = self.state();
        let step = s.pool_step;
        let p = s.pools.get_mut(&(pool.0 as usize)).unwrap();
        let keep = p.used.div_ceil(step) * step;
        let freed = p.reserved.saturating_sub(keep);
        p.reserved -= freed;
        let (dev, host) = (p.dev, p.host);
        if !host {
            s.in_use[dev as usize] -= freed;
        }
    }
}

impl FakeCuda {
    /// A graph of `allocs` (device, bytes) alloc nodes, then a free node
    /// for each address in `frees`, then one kernel; (graph, the allocs'
    /// addresses).
    pub fn graph(&self, allocs: &[(CUdevice, u64)], frees: &[CUdeviceptr]) -> (CUgraph, Vec<u64>) {
        let mut s = self.state();
        let g = s.handle() as usize;
        let mut ids = Vec::new();
        let mut ptrs = Vec::new();
        for &(dev, bytes) in allocs {
            let dptr = s.handle();
            ptrs.push(dptr);
            let n = s.handle() as usize;
            s.nodes.insert(n, FakeNode::Alloc { dptr, dev, bytes });
            ids.push(n);
        }
        for &dptr in frees {
            let n = s.handle() as usize;
            s.nodes.insert(n, FakeNode::Free { dptr });
            ids.push(n);
        }
        let k = s.handle() as usize;
        s.nodes.insert(k, FakeNode::Kernel);
        ids.push(k);
        s.graphs.insert(g, ids);
        (CUgraph(g as *mut c_void), ptrs)
    }

    /// Adds a child graph node of `child` to `graph`.
    pub fn add_child(&self, graph: CUgraph, child: CUgraph) {
        let mut s = self.state();
        let n = s.handle() as usize;
        s.nodes.insert(n, FakeNode::Child(child.0 as usize));
        s.graphs.get_mut(&(graph.0 as usize)).unwrap().push(n);
    }

    /// `cuGraphInstantiateWithFlags`: the executable.
    pub fn instantiate(&self, graph: CUgraph, flags: u64) -> CuResult<CUgraphExec> {
        let mut s = self.state();
        s.enter("cuGraphInstantiateWithFlags")?;
        let mut flat = Vec::new();
        s.flatten(graph.0 as usize, &mut flat, 0)?;
        let has_alloc = flat.iter().any(|n| matches!(n, FakeNode::Alloc { .. }));
        let backs = if has_alloc { s.instantiate_backs } else { 0 };
        if backs > 0 {
            s.take(0, backs)?;
            let m = &mut s.graph_mem[0];
            m.reserved += backs;
            m.used += backs;
        }
        let e = s.handle() as usize;
        let auto = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0;
        s.execs.insert(e, (flat, auto, backs));
        Ok(CUgraphExec(e as *mut c_void))
    }

    /// A device's graph allocator.
    pub fn graph_mem(&self, dev: CUdevice) -> FakeGraphMem {
        self.state().graph_mem[dev as usize]
    }
}

impl CudaState {
    fn flatten(&self, g: usize, out: &mut Vec<FakeNode>, depth: u32) -> CuResult<()> {
        let ids = self
            .graphs
            .get(&g)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        for id in ids {
            match self.nodes[id] {
                FakeNode::Child(c) if depth < 64 => self.flatten(c, out, depth + 1)?,
                n => out.push(n),
            }
        }
        Ok(())
    }

    /// A launch reaching an alloc node: reuse what the graph allocator
    /// reserved and nothing uses, reserve the rest (plus `graph_extra`).
    fn graph_alloc(&mut self, dptr: CUdeviceptr, dev: CUdevice, bytes: u64) -> CuResult<()> {
        let bytes = bytes + self.graph_extra;
        let m = self.graph_mem[dev as usize];
        let grow = bytes.saturating_sub(m.reserved - m.used);
        self.take(dev, grow)?;
        let m = &mut self.graph_mem[dev as usize];
        m.reserved += grow;
        m.used += bytes;
        self.graph_live.insert(dptr, (dev, bytes));
        Ok(())
    }

    /// A graph allocation freed (any way): its memory stays reserved.
    fn graph_free(&mut self, dptr: CUdeviceptr) -> bool {
        match self.graph_live.remove(&dptr) {
            Some((dev, bytes)) => {
                self.graph_mem[dev as usize].used -= bytes;
                true
            }
            None => false,
        }
    }
}

fn pool_key(p: CUmemoryPool) -> usize {
    p.0 as usize
}

impl CudaState {
    fn now(&self) -> u64 {
        self.clock.map_or(0, |c| c.now_ns())
    }

    /// `ns` of GPU time queued on stream `key` now.
    fn queue(&mut self, key: u64, ns: u64) {
        let now = self.now();
        let b = self.stream_busy.entry(key).or_insert(0);
        *b = (*b).max(now) + ns;
    }

    fn record(&mut self, ev: CUevent, key: u64) {
        let at = self
            .stream_busy
            .get(&key)
            .copied()
            .unwrap_or(0)
            .max(self.now());
        self.events.insert(ev.0 as usize, at);
    }

    /// Whether a recorded event has completed (`None`: never recorded).
    fn done(&self, ev: CUevent) -> Option<bool> {
        let at = *self.events.get(&(ev.0 as usize))?;
        Some(self.clock.is_none() || at <= self.now())
    }

    fn enter(&mut self, call: &'static str) -> CuResult<()> {
        self.calls.push(call);
        match self.fail.get_mut(call).and_then(VecDeque::pop_front) {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    fn handle(&mut self) -> u64 {
        self.next += 0x20_0000;
        self.next
    }

    fn take(&mut self, dev: CUdevice, bytes: u64) -> CuResult<()> {
        let d = dev as usize;
        if d >= self.totals.len() {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        if self.in_use[d] + bytes > self.totals[d] {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.in_use[d] += bytes;
        Ok(())
    }

    fn pool_alloc(&mut self, key: usize, bytes: u64) -> CuResult<CUdeviceptr> {
        let step = self.pool_step;
        let Some(p) = self.pools.get(&key).filter(|p| p.live).cloned() else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let need = (p.used + bytes).saturating_sub(p.reserved);
        let grow = need.div_ceil(step) * step;
        if grow > 0 && !p.host {
            self.take(p.dev, grow)?;
        }
        let pl = self.pools.get_mut(&key).unwrap();
        pl.reserved += grow;
        pl.used += bytes;
        let ptr = self.handle();
        self.async_ptrs.insert(ptr, (key, bytes));
        Ok(ptr)
    }

    fn default_pool(&mut self, dev: CUdevice) -> usize {
        // Default pools: one per device, keyed 0x1000 + dev.
        let key = 0x1000 + dev as usize;
        self.pools.entry(key).or_insert(FakePool {
            dev,
            live: true,
            ..FakePool::default()
        });
        key
    }
}

impl CudaDriver for FakeCuda {
    fn init(&self, _flags: u32) -> CUresult {
        let mut s = self.state();
        s.enter("cuInit").err().unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn device_count(&self) -> CuResult<u32> {
        let mut s = self.state();
        s.enter("cuDeviceGetCount")?;
        Ok(s.totals.len() as u32)
    }
    fn device_get(&self, ordinal: u32) -> CuResult<CUdevice> {
        let mut s = self.state();
        s.enter("cuDeviceGet")?;
        if (ordinal as usize) < s.totals.len() {
            Ok(ordinal as CUdevice)
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_DEVICE)
        }
    }
    fn device_uuid(&self, dev: CUdevice) -> CuResult<CUuuid> {
        let mut s = self.state();
        s.enter("cuDeviceGetUuid_v2")?;
        let mut u = CUuuid::default();
        u.bytes[0] = 0x10;
        u.bytes[15] = dev as std::ffi::c_char;
        Ok(u)
    }
    fn device_attribute(&self, attr: CUdevice_attribute, _dev: CUdevice) -> CuResult<i32> {
        let mut s = self.state();
        s.enter("cuDeviceGetAttribute")?;
        match attr {
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => Ok(108),
            _ => Ok(0),
        }
    }
    fn device_total_mem(&self, dev: CUdevice) -> CuResult<usize> {
        let mut s = self.state();
        s.enter("cuDeviceTotalMem_v2")?;
        s.totals
            .get(dev as usize)
            .map(|&t| t as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }
    fn ctx_device(&self) -> CuResult<CUdevice> {
        let mut s = self.state();
        s.enter("cuCtxGetDevice")?;
        Ok(s.current)
    }
    fn ctx_current(&self) -> CuResult<CUcontext> {
        let mut s = self.state();
        s.enter("cuCtxGetCurrent")?;
        Ok(CUcontext((0x100 + s.current as usize) as *mut c_void))
    }
    fn ctx_set_current(&self, _ctx: CUcontext) -> CUresult {
        let mut s = self.state();
        s.enter("cuCtxSetCurrent")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn ctx_synchronize(&self) -> CUresult {
        let mut s = self.state();
        s.enter("cuCtxSynchronize")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn ctx_create(&self, _flags: u32, dev: CUdevice) -> CuResult<CUcontext> {
        let mut s = self.state();
        s.enter("cuCtxCreate_v2")?;
        let h = s.handle() as usize;
        s.ctxs.insert(h, dev);
        Ok(CUcontext(h as *mut c_void))
    }
    fn ctx_destroy(&self, ctx: CUcontext) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuCtxDestroy_v2") {
            return e;
        }
        match s.ctxs.remove(&(ctx.0 as usize)) {
            Some(_) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_CONTEXT,
        }
    }
    fn primary_retain(&self, dev: CUdevice) -> CuResult<CUcontext> {
        let mut s = self.state();
        s.enter("cuDevicePrimaryCtxRetain")?;
        *s.primary.entry(dev).or_insert(0) += 1;
        Ok(CUcontext((0x100 + dev as usize) as *mut c_void))
    }
    fn primary_release(&self, dev: CUdevice) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuDevicePrimaryCtxRelease_v2") {
            return e;
        }
        match s.primary.get_mut(&dev) {
            Some(n) if *n > 0 => {
                *n -= 1;
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_CONTEXT,
        }
    }
    fn mem_get_info(&self) -> CuResult<(usize, usize)> {
        let mut s = self.state();
        s.enter("cuMemGetInfo_v2")?;
        let d = s.current as usize;
        Ok(((s.totals[d] - s.in_use[d]) as usize, s.totals[d] as usize))
    }
    fn mem_alloc(&self, bytes: usize) -> CuResult<CUdeviceptr> {
        let mut s = self.state();
        s.enter("cuMemAlloc_v2")?;
        let dev = s.current;
        s.take(dev, bytes as u64)?;
        let p = s.handle();
        s.allocs.insert(p, (dev, bytes as u64));
        Ok(p)
    }
    fn mem_alloc_pitch(
        &self,
        width: usize,
        height: usize,
        _elem: u32,
    ) -> CuResult<(CUdeviceptr, usize)> {
        let mut s = self.state();
        s.enter("cuMemAllocPitch_v2")?;
        let pitch = width.div_ceil(s.pitch_align) * s.pitch_align;
        let bytes = (pitch * height) as u64;
        let dev = s.current;
        s.take(dev, bytes)?;
        let p = s.handle();
        s.allocs.insert(p, (dev, bytes));
        Ok((p, pitch))
    }
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemFree_v2") {
            return e;
        }
        if let Some((dev, b)) = s.allocs.remove(&ptr) {
            s.in_use[dev as usize] -= b;
            return CUresult::CUDA_SUCCESS;
        }
        if let Some((pool, b)) = s.async_ptrs.remove(&ptr) {
            if let Some(p) = s.pools.get_mut(&pool) {
                p.used -= b;
            }
            return CUresult::CUDA_SUCCESS;
        }
        if s.graph_free(ptr) {
            return CUresult::CUDA_SUCCESS;
        }
        CUresult::CUDA_ERROR_INVALID_VALUE
    }
    fn mem_create(
        &self,
        size: usize,
        prop: &CUmemAllocationProp,
    ) -> CuResult<CUmemGenericAllocationHandle> {
        let mut s = self.state();
        s.enter("cuMemCreate")?;
        let dev = prop.location.id;
        if prop.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            s.take(dev, size as u64)?;
        }
        let h = s.handle();
        let bytes = if prop.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            size as u64
        } else {
            0
        };
        s.handles.insert(h, (dev, bytes));
        Ok(h)
    }
    fn mem_release(&self, handle: CUmemGenericAllocationHandle) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemRelease") {
            return e;
        }
        match s.vmm.get(&handle).copied() {
            None if s.handles.contains_key(&handle) => {}
            Some((_, true)) | None => return CUresult::CUDA_ERROR_INVALID_VALUE,
            Some((0, false)) => {}
            Some((maps, false)) => {
                // Mapped: the memory stays until the last unmap.
                s.vmm.insert(handle, (maps, true));
                return CUresult::CUDA_SUCCESS;
            }
        }
        s.vmm.remove(&handle);
        match s.handles.remove(&handle) {
            Some((dev, b)) => {
                if b > 0 {
                    s.in_use[dev as usize] -= b;
                }
                CUresult::CUDA_SUCCESS
            }
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemMap") {
            return e;
        }
        if !s.handles.contains_key(&handle)
            || s.vmm.get(&handle).is_some_and(|v| v.1)
            || s.mappings.contains_key(&ptr)
        {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        s.mappings.insert(ptr, (size as u64, handle));
        s.vmm.entry(handle).or_insert((0, false)).0 += 1;
        CUresult::CUDA_SUCCESS
    }
    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemUnmap") {
            return e;
        }
        let hit: Vec<u64> = s
            .mappings
            .range(ptr..ptr.saturating_add(size as u64))
            .map(|(k, _)| *k)
            .collect();
        if hit.is_empty() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        for k in hit {
            let Some((_, h)) = s.mappings.remove(&k) else {
                continue;
            };
            let Some(v) = s.vmm.get_mut(&h) else { continue };
            v.0 -= 1;
            if *v == (0, true) {
                s.vmm.remove(&h);
                if let Some((dev, b)) = s.handles.remove(&h) {
                    s.in_use[dev as usize] -= b;
                }
            }
        }
        CUresult::CUDA_SUCCESS
    }
    fn array_create(&self, desc: &CUDA_ARRAY_DESCRIPTOR) -> CuResult<CUarray> {
        let mut s = self.state();
        s.enter("cuArrayCreate_v2")?;
        let bytes = (desc.Width.max(1) * desc.Height.max(1) * desc.NumChannels as usize * 4) as u64;
        let dev = s.current;
        s.take(dev, bytes)?;
        let h = s.handle();
        s.allocs.insert(h, (dev, bytes));
        Ok(CUarray(h as *mut c_void))
    }
    fn array_destroy(&self, array: CUarray) -> CUresult {
        self.mem_free(array.0 as u64)
    }
    fn mem_alloc_async(&self, bytes: usize, _stream: CUstream) -> CuResult<CUdeviceptr> {
        let mut s = self.state();
        s.enter("cuMemAllocAsync")?;
        let dev = s.current;
        let key = s.default_pool(dev);
        s.pool_alloc(key, bytes as u64)
    }
    fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: CUmemoryPool,
        _stream: CUstream,
    ) -> CuResult<CUdeviceptr> {
        let mut s = self.state();
        s.enter("cuMemAllocFromPoolAsync")?;
        s.pool_alloc(pool_key(pool), bytes as u64)
    }
    fn mem_free_async(&self, ptr: CUdeviceptr, _stream: CUstream) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemFreeAsync") {
            return e;
        }
        match s.async_ptrs.remove(&ptr) {
            Some((pool, b)) => {
                if let Some(p) = s.pools.get_mut(&pool) {
                    p.used -= b;
                }
                CUresult::CUDA_SUCCESS
            }
            None if s.graph_free(ptr) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn pool_create(&self, props: &CUmemPoolProps) -> CuResult<CUmemoryPool> {
        let mut s = self.state();
        s.enter("cuMemPoolCreate")?;
        let h = s.handle() as usize;
        s.pools.insert(
            h,
            FakePool {
                dev: props.location.id,
                host: props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE,
                live: true,
                ..FakePool::default()
            },
        );
        Ok(CUmemoryPool(h as *mut c_void))
    }
    fn pool_destroy(&self, pool: CUmemoryPool) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemPoolDestroy") {
            return e;
        }
        let step = s.pool_step;
        let Some(p) = s.pools.get_mut(&pool_key(pool)) else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        // Unused memory goes back now; what allocations still use stays
        // until they are freed (modelled as staying reserved).
        p.live = false;
        let keep = p.used.div_ceil(step) * step;
        let freed = p.reserved.saturating_sub(keep);
        p.reserved -= freed;
        let (dev, host) = (p.dev, p.host);
        if !host {
            s.in_use[dev as usize] -= freed;
        }
        CUresult::CUDA_SUCCESS
    }
    fn pool_trim_to(&self, pool: CUmemoryPool, keep: usize) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuMemPoolTrimTo") {
            return e;
        }
        let step = s.pool_step;
        let Some(p) = s.pools.get_mut(&pool_key(pool)) else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        // cuda.h: releases memory "until the pool contains fewer than
        // minBytesToKeep reserved bytes, or there is no more memory that
        // the allocator can safely release" (here: whole unused steps).
        let floor = p.used.div_ceil(step) * step;
        let before = p.reserved;
        while p.reserved > floor && (keep == 0 || p.reserved >= keep as u64) {
            p.reserved -= step;
        }
        let freed = before - p.reserved;
        let (dev, host) = (p.dev, p.host);
        if !host {
            s.in_use[dev as usize] -= freed;
        }
        CUresult::CUDA_SUCCESS
    }
    fn pool_attribute(&self, pool: CUmemoryPool, attr: CUmemPool_attribute) -> CuResult<u64> {
        let mut s = self.state();
        s.enter("cuMemPoolGetAttribute")?;
        let p = s
            .pools
            .get(&pool_key(pool))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match attr {
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => Ok(p.reserved),
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => Ok(p.used),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn current_pool(&self, dev: CUdevice) -> CuResult<CUmemoryPool> {
        let mut s = self.state();
        s.enter("cuDeviceGetMemPool")?;
        let key = s.default_pool(dev);
        Ok(CUmemoryPool(key as *mut c_void))
    }
    fn stream_create(&self, _flags: u32) -> CuResult<CUstream> {
        let mut s = self.state();
        s.enter("cuStreamCreate")?;
        Ok(CUstream(s.handle() as *mut c_void))
    }
    fn stream_destroy(&self, _stream: CUstream) -> CUresult {
        let mut s = self.state();
        s.enter("cuStreamDestroy_v2")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn stream_query(&self, _stream: CUstream) -> CUresult {
        let mut s = self.state();
        s.enter("cuStreamQuery")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn stream_synchronize(&self, _stream: CUstream) -> CUresult {
        let mut s = self.state();
        s.enter("cuStreamSynchronize")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn event_create(&self, _flags: u32) -> CuResult<CUevent> {
        let mut s = self.state();
        s.enter("cuEventCreate")?;
        Ok(CUevent(s.handle() as *mut c_void))
    }
    fn event_record(&self, event: CUevent, stream: CUstream) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuEventRecord") {
            return e;
        }
        s.record(event, stream.0 as u64);
        CUresult::CUDA_SUCCESS
    }
    fn event_record_ptsz(&self, event: CUevent, stream: CUstream) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuEventRecord_ptsz") {
            return e;
        }
        let key = if stream.is_null() {
            CU_STREAM_PER_THREAD as u64
        } else {
            stream.0 as u64
        };
        s.record(event, key);
        CUresult::CUDA_SUCCESS
    }
    fn event_query(&self, event: CUevent) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuEventQuery") {
            return e;
        }
        match s.done(event) {
            Some(false) => CUresult::CUDA_ERROR_NOT_READY,
            _ => CUresult::CUDA_SUCCESS,
        }
    }
    fn event_synchronize(&self, _event: CUevent) -> CUresult {
        let mut s = self.state();
        s.enter("cuEventSynchronize")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn event_elapsed_ms(&self, start: CUevent, end: CUevent) -> CuResult<f32> {
        let mut s = self.state();
        s.enter("cuEventElapsedTime")?;
        if s.clock.is_none() {
            return Ok(1.0);
        }
        match (s.done(start), s.done(end)) {
            (Some(true), Some(true)) => {
                let (a, b) = (s.events[&(start.0 as usize)], s.events[&(end.0 as usize)]);
                Ok((b.saturating_sub(a) as f64 / 1e6) as f32)
            }
            (Some(_), Some(_)) => Err(CUresult::CUDA_ERROR_NOT_READY),
            _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
        }
    }
    fn event_destroy(&self, event: CUevent) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuEventDestroy_v2") {
            return e;
        }
        s.events.remove(&(event.0 as usize));
        CUresult::CUDA_SUCCESS
    }
    unsafe fn launch_kernel(
        &self,
        _f: CUfunction,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared_mem: u32,
        _stream: CUstream,
        _params: *mut *mut c_void,
        _extra: *mut *mut c_void,
    ) -> CUresult {
        let mut s = self.state();
        s.enter("cuLaunchKernel")
            .err()
            .unwrap_or(CUresult::CUDA_SUCCESS)
    }
    fn graph_launch(&self, exec: CUgraphExec, stream: CUstream) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuGraphLaunch") {
            return e;
        }
        let cost = s.exec_cost.get(&(exec.0 as usize)).copied().unwrap_or(0);
        s.queue(stream.0 as u64, cost);
        // Executables the fake did not instantiate launch as no-ops.
        let Some((nodes, auto, _)) = s.execs.get(&(exec.0 as usize)).cloned() else {
            return CUresult::CUDA_SUCCESS;
        };
        for n in &nodes {
            if let FakeNode::Alloc { dptr, .. } = *n {
                if s.graph_live.contains_key(&dptr) {
                    if !auto {
                        return CUresult::CUDA_ERROR_INVALID_VALUE;
                    }
                    s.graph_free(dptr);
                }
            }
        }
        for n in nodes {
            let r = match n {
                FakeNode::Alloc { dptr, dev, bytes } => s.graph_alloc(dptr, dev, bytes),
                FakeNode::Free { dptr } => {
                    if s.graph_free(dptr) {
                        Ok(())
                    } else {
                        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
                    }
                }
                FakeNode::Kernel | FakeNode::Child(_) => Ok(()),
            };
            if let Err(e) = r {
                return e;
            }
        }
        CUresult::CUDA_SUCCESS
    }
    fn graph_mem_attribute(&self, dev: CUdevice, attr: CUgraphMem_attribute) -> CuResult<u64> {
        let mut s = self.state();
        s.enter("cuDeviceGetGraphMemAttribute")?;
        let m = *s
            .graph_mem
            .get(dev as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => Ok(m.used),
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => Ok(m.reserved),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn graph_mem_trim(&self, dev: CUdevice) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuDeviceGraphMemTrim") {
            return e;
        }
        let m = &mut s.graph_mem[dev as usize];
        let unused = m.reserved - m.used;
        m.reserved -= unused;
        s.in_use[dev as usize] -= unused;
        CUresult::CUDA_SUCCESS
    }
    fn graph_nodes(&self, graph: CUgraph) -> CuResult<Vec<CUgraphNode>> {
        let mut s = self.state();
        s.enter("cuGraphGetNodes")?;
        let ids = s
            .graphs
            .get(&(graph.0 as usize))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(ids.iter().map(|&n| CUgraphNode(n as *mut c_void)).collect())
    }
    fn graph_node_type(&self, node: CUgraphNode) -> CuResult<CUgraphNodeType> {
        let mut s = self.state();
        s.enter("cuGraphNodeGetType")?;
        match s.nodes.get(&(node.0 as usize)) {
            Some(FakeNode::Kernel) => Ok(CU_GRAPH_NODE_TYPE_KERNEL),
            Some(FakeNode::Alloc { .. }) => Ok(CU_GRAPH_NODE_TYPE_MEM_ALLOC),
            Some(FakeNode::Free { .. }) => Ok(CU_GRAPH_NODE_TYPE_MEM_FREE),
            Some(FakeNode::Child(_)) => Ok(CU_GRAPH_NODE_TYPE_GRAPH),
            None => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn graph_mem_alloc_node(
        &self,
        node: CUgraphNode,
    ) -> CuResult<(CUdeviceptr, CUmemLocation, usize)> {
        let mut s = self.state();
        s.enter("cuGraphMemAllocNodeGetParams")?;
        match s.nodes.get(&(node.0 as usize)) {
            Some(FakeNode::Alloc { dptr, dev, bytes }) => Ok((
                *dptr,
                CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: *dev,
                },
                *bytes as usize,
            )),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn graph_mem_free_node(&self, node: CUgraphNode) -> CuResult<CUdeviceptr> {
        let mut s = self.state();
        s.enter("cuGraphMemFreeNodeGetParams")?;
        match s.nodes.get(&(node.0 as usize)) {
            Some(FakeNode::Free { dptr }) => Ok(*dptr),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn graph_child(&self, node: CUgraphNode) -> CuResult<CUgraph> {
        let mut s = self.state();
        s.enter("cuGraphChildGraphNodeGetGraph")?;
        match s.nodes.get(&(node.0 as usize)) {
            Some(FakeNode::Child(g)) => Ok(CUgraph(*g as *mut c_void)),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn graph_exec_destroy(&self, exec: CUgraphExec) -> CUresult {
        let mut s = self.state();
        if let Err(e) = s.enter("cuGraphExecDestroy") {
            return e;
        }
        match s.execs.remove(&(exec.0 as usize)) {
            Some((_, _, backs)) => {
                s.graph_mem[0].used -= backs;
                CUresult::CUDA_SUCCESS
            }
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn stream_is_capturing(&self, stream: CUstream, per_thread: bool) -> CuResult<bool> {
        let mut s = self.state();
        s.enter("cuStreamIsCapturing")?;
        let key = if stream.is_null() && per_thread {
            CU_STREAM_PER_THREAD as u64
        } else {
            stream.0 as u64
        };
        Ok(s.capturing.contains(&key))
    }
    fn has(&self, f: api::Fn) -> bool {
        !self.state().missing.contains(&f)
    }
}

/// A scripted NVML: `devices` physical devices, handle i = 0x5000 + i.
pub struct FakeNvml {
    pub uuids: Vec<String>,
    pub memory: Vec<nvmlMemory_t>,
    pub processes: Mutex<Vec<Vec<ProcessInfo>>>,
    pub calls: Mutex<Vec<&'static str>>,
    /// Answers of `device_count` while NVML is "not initialized".
    pub uninitialized: std::sync::atomic::AtomicBool,
    /// Per device: the per-process utilization samples NVML answers
    /// (all of them, whatever the `since`), and the device's GPU busy %.
    pub samples: Mutex<Vec<Vec<nvmlProcessUtilizationSample_t>>>,
    pub gpu_util: Mutex<Vec<u32>>,
    /// Entries this NVML lacks (for [`NvmlDriver::has`]).
    pub missing: Mutex<Vec<api::Fn>>,
}

impl FakeNvml {
    pub fn new(uuids: &[&str], total: u64) -> FakeNvml {
        FakeNvml {
            uuids: uuids.iter().map(|s| s.to_string()).collect(),
            memory: vec![
                nvmlMemory_t {
                    total,
                    free: total,
                    used: 0
                };
                uuids.len()
            ],
            processes: Mutex::new(vec![Vec::new(); uuids.len()]),
            calls: Mutex::new(Vec::new()),
            uninitialized: std::sync::atomic::AtomicBool::new(false),
            samples: Mutex::new(vec![Vec::new(); uuids.len()]),
            gpu_util: Mutex::new(vec![0; uuids.len()]),
            missing: Mutex::new(Vec::new()),
        }
    }

    pub fn handle(i: usize) -> nvmlDevice_t {
        nvmlDevice_t((0x5000 + i) as *mut c_void)
    }

    fn index(&self, dev: nvmlDevice_t) -> NvmlResult<usize> {
        let i = (dev.0 as usize).wrapping_sub(0x5000);
        if i < self.uuids.len() {
            Ok(i)
        } else {
            Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)
        }
    }

    fn note(&self, c: &'static str) {
        self.calls.lock().unwrap().push(c);
    }

    pub fn count(&self, call: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| **c == call)
            .count()
    }
}

impl NvmlDriver for FakeNvml {
    fn init(&self) -> nvmlReturn_t {
        self.note("nvmlInit_v2");
        nvmlReturn_t::NVML_SUCCESS
    }
    fn shutdown(&self) -> nvmlReturn_t {
        self.note("nvmlShutdown");
        nvmlReturn_t::NVML_SUCCESS
    }
    fn device_count(&self) -> NvmlResult<u32> {
        self.note("nvmlDeviceGetCount_v2");
        if self
            .uninitialized
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
        }
        Ok(self.uuids.len() as u32)
    }
    fn device_by_index(&self, index: u32) -> NvmlResult<nvmlDevice_t> {
        self.note("nvmlDeviceGetHandleByIndex_v2");
        if (index as usize) < self.uuids.len() {
            Ok(Self::handle(index as usize))
        } else {
            Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)
        }
    }
    fn device_by_uuid(&self, uuid: &CStr) -> NvmlResult<nvmlDevice_t> {
        self.note("nvmlDeviceGetHandleByUUID");
        let u = uuid.to_string_lossy();
        self.uuids
            .iter()
            .position(|x| *x == u)
            .map(Self::handle)
            .ok_or(nvmlReturn_t::NVML_ERROR_NOT_FOUND)
    }
    fn device_uuid(&self, dev: nvmlDevice_t) -> NvmlResult<String> {
        self.note("nvmlDeviceGetUUID");
        Ok(self.uuids[self.index(dev)?].clone())
    }
    fn device_index(&self, dev: nvmlDevice_t) -> NvmlResult<u32> {
        self.note("nvmlDeviceGetIndex");
        self.index(dev).map(|i| i as u32)
    }
    fn memory_info(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlMemory_t> {
        self.note("nvmlDeviceGetMemoryInfo");
        Ok(self.memory[self.index(dev)?])
    }
    fn running_processes(&self, dev: nvmlDevice_t) -> NvmlResult<Vec<ProcessInfo>> {
        self.note("nvmlDeviceGetComputeRunningProcesses_v3");
        let i = self.index(dev)?;
        Ok(self.processes.lock().unwrap()[i].clone())
    }
    fn utilization(&self, dev: nvmlDevice_t) -> NvmlResult<nvmlUtilization_t> {
        self.note("nvmlDeviceGetUtilizationRates");
        let i = self.index(dev)?;
        Ok(nvmlUtilization_t {
            gpu: self.gpu_util.lock().unwrap()[i],
            ..nvmlUtilization_t::default()
        })
    }
    fn process_utilization(
        &self,
        dev: nvmlDevice_t,
        _since_us: u64,
    ) -> NvmlResult<Vec<nvmlProcessUtilizationSample_t>> {
        self.note("nvmlDeviceGetProcessUtilization");
        let i = self.index(dev)?;
        Ok(self.samples.lock().unwrap()[i].clone())
    }
    fn has(&self, f: api::Fn) -> bool {
        !self.missing.lock().unwrap().contains(&f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_records_calls_and_follows_its_script() {
        let d = FakeCuda::new(1, 1 << 30);
        let p = d.mem_alloc(4096).unwrap();
        assert_eq!(d.in_use(0), 4096);
        d.fail_next("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(d.mem_alloc(1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(cu_ok(d.mem_free(p)).is_ok());
        assert_eq!(d.count("cuMemAlloc_v2"), 2);
        assert_eq!(d.in_use(0), 0);
        // Pools reserve in steps and keep them until trimmed.
        let pool = d.current_pool(0).unwrap();
        let a = d.mem_alloc_async(3 << 20, CUstream::NULL).unwrap();
        assert_eq!(d.pool(pool), (4 << 20, 3 << 20));
        assert!(cu_ok(d.mem_free_async(a, CUstream::NULL)).is_ok());
        assert_eq!(d.pool(pool), (4 << 20, 0));
        assert!(cu_ok(d.pool_trim_to(pool, 0)).is_ok());
        assert_eq!(d.pool(pool), (0, 0));
        assert_eq!(d.in_use(0), 0);
    }
}
