//! Graph memory: what the driver's graph allocator backs for the alloc
//! nodes of executable graphs (`cuGraphAddMemAllocNode`, `cuGraphAddNode`
//! of a memory node, or a stream-ordered allocation captured into a graph).
//!
//! A graph allocation's address is fixed when its node is made; its memory
//! is backed when an executable is uploaded or launched, and a freed graph
//! allocation's memory stays with the graph allocator (reserved for the
//! next one) until `cuDeviceGraphMemTrim` or the context's end (cuda.h).
//! So, per device, this process's graph-memory charge follows the driver's
//! `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`, settled after every call that
//! may move it; what a call may add is admitted before the driver sees it:
//!
//! - at instantiation the graph's memory nodes (child graphs included) are
//!   listed and kept for the executable;
//! - an upload or launch is admitted on the bytes of its alloc nodes that
//!   are not live already (an `AUTO_FREE_ON_LAUNCH` relaunch reuses its
//!   own), less the memory the allocator holds unused when this executable
//!   was the last to back memory on that device (its own, freed, memory);
//!   refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver runs it when
//!   the budget cannot hold that, after one try at giving the allocator's
//!   unused memory back (`cuDeviceGraphMemTrim`);
//! - a launch is admitted, made and settled under one lock
//!   ([`crate::ledger::Charges::graphs`]), so two launches never count on
//!   the same memory.
//!
//! A driver that backs more than was admitted (the simulator never does)
//! is still charged what it holds: the ledger shows the device's truth, a
//! warning says so, and nothing else is admitted until it is back under
//! the budget.
use std::sync::atomic::Ordering;

use vgpu_cuda_abi::*;

use super::Mem;
use crate::driver::CuResult;
use crate::ledger::{GraphAlloc, GraphExec, Graphs, DATA};

/// Child graphs deeper than this are not searched for memory nodes.
const MAX_DEPTH: u32 = 8;

/// Bytes per device, in first-seen order.
type PerDev = Vec<(u32, u64)>;

fn add(v: &mut PerDev, dev: u32, bytes: u64) {
    match v.iter_mut().find(|(d, _)| *d == dev) {
        Some((_, b)) => *b = b.saturating_add(bytes),
        None => v.push((dev, bytes)),
    }
}

fn bytes_on(v: &PerDev, dev: u32) -> u64 {
    v.iter().find(|(d, _)| *d == dev).map_or(0, |(_, b)| *b)
}

impl Mem<'_> {
    /// The memory nodes of `graph` and its child graphs: what an executable
    /// of it allocates and frees when it runs (`unlisted` when some of it is
    /// out of sight: a conditional node's body, a child graph too deep).
    pub fn graph_memory_nodes(&self, graph: CUgraph) -> CuResult<GraphExec> {
        let mut e = GraphExec::default();
        self.collect_memory_nodes(graph, &mut e, 0)?;
        Ok(e)
    }

    fn collect_memory_nodes(&self, graph: CUgraph, e: &mut GraphExec, depth: u32) -> CuResult<()> {
        for node in self.drv.graph_nodes(graph)? {
            match self.drv.graph_node_type(node)? {
                CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                    let (dptr, loc, bytes) = self.drv.graph_mem_alloc_node(node)?;
                    // Host-located graph memory takes no device memory.
                    if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 {
                        e.allocs.push(GraphAlloc {
                            dptr,
                            dev: loc.id as u32,
                            bytes: bytes as u64,
                        });
                    }
                }
                CU_GRAPH_NODE_TYPE_MEM_FREE => e.frees.push(self.drv.graph_mem_free_node(node)?),
                CU_GRAPH_NODE_TYPE_GRAPH if depth < MAX_DEPTH => {
                    let child = self.drv.graph_child(node)?;
                    self.collect_memory_nodes(child, e, depth + 1)?;
                }
                // Bodies vgpu does not look into: whatever they allocate is
                // charged after each launch (every device settled).
                CU_GRAPH_NODE_TYPE_GRAPH | CU_GRAPH_NODE_TYPE_CONDITIONAL => e.unlisted = true,
                _ => {}
            }
        }
        Ok(())
    }

    fn graph_reserved(&self, dev: u32) -> CuResult<u64> {
        self.drv
            .graph_mem_attribute(dev as i32, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    }

    /// What running `nodes` (as executable `exec`, if one) may add on each
    /// device: its alloc nodes not live now, less (with `credit`) the
    /// memory the allocator holds unused where `exec` backed last.
    fn graph_needs(
        &self,
        g: &Graphs,
        exec: Option<usize>,
        nodes: &GraphExec,
        credit: bool,
    ) -> PerDev {
        let mut need = PerDev::new();
        for a in nodes
            .allocs
            .iter()
            .filter(|a| !g.live.contains_key(&a.dptr))
        {
            add(&mut need, a.dev, a.bytes);
        }
        if credit && exec.is_some() {
            for (dev, b) in need.iter_mut() {
                if *b == 0 || g.last.get(dev).copied() != exec {
                    continue;
                }
                let attr = |a| self.drv.graph_mem_attribute(*dev as i32, a).ok();
                let (Some(res), Some(used)) = (
                    attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
                    attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
                ) else {
                    continue;
                };
                *b -= (*b).min(res.saturating_sub(used));
            }
        }
        need
    }

    /// Reserves every device's need, all or nothing; the device refused.
    fn reserve_needs(&self, need: &PerDev) -> Result<(), (u32, u64)> {
        for (i, &(dev, b)) in need.iter().enumerate() {
            if self.ledger.reserve(dev, DATA, b).is_err() {
                for &(d, x) in &need[..i] {
                    self.ledger.release(d, DATA, x);
                }
                return Err((dev, b));
            }
        }
        Ok(())
    }

    /// Admission of an upload or launch of `nodes`: the bytes now in the
    /// ledger for it, per device. When the budget cannot hold them, pools
    /// are settled and the graph allocator's unused memory given back
    /// (`cuDeviceGraphMemTrim`) on the refused devices, and the need, with
    /// no credit left, is tried once more.
    fn admit_graph(
        &self,
        g: &mut Graphs,
        exec: Option<usize>,
        nodes: &GraphExec,
    ) -> Result<PerDev, CUresult> {
        crate::attach::refresh_limits(self.ledger);
        let need = self.graph_needs(g, exec, nodes, true);
        if self.reserve_needs(&need).is_ok() {
            return Ok(need);
        }
        self.settle_pools();
        for &(d, _) in &need {
            if g.charged.get(&d).is_some_and(|b| *b > 0) {
                let _ = self.drv.graph_mem_trim(d as i32);
                g.last.remove(&d);
                self.settle_graph_dev(g, d, 0);
            }
        }
        let need = self.graph_needs(g, exec, nodes, false);
        match self.reserve_needs(&need) {
            Ok(()) => Ok(need),
            Err((dev, b)) => Err(self.refuse(dev, "graph memory", b)),
        }
    }

    /// Brings device `dev`'s graph charge to the driver's reserved memory;
    /// `pending`: bytes admitted for a call that just ran (in the ledger,
    /// not yet in the charge). Memory the budget cannot hold is given back
    /// once (a trim) and what the driver still holds is recorded anyway;
    /// false then. When the driver cannot be asked, what the ledger holds
    /// stays charged.
    fn settle_graph_dev(&self, g: &mut Graphs, dev: u32, pending: u64) -> bool {
        let have = g
            .charged
            .get(&dev)
            .copied()
            .unwrap_or(0)
            .saturating_add(pending);
        let Ok(mut now) = self.graph_reserved(dev) else {
            g.charged.insert(dev, have);
            return true;
        };
        let mut within = true;
        if now > have && self.ledger.reserve(dev, DATA, now - have).is_err() {
            let _ = self.drv.graph_mem_trim(dev as i32);
            g.last.remove(&dev);
            now = self.graph_reserved(dev).unwrap_or(now);
            if now > have && self.ledger.reserve(dev, DATA, now - have).is_err() {
                within = false;
                crate::warn!(
                    "the driver backed {} B of graph memory on device {dev} beyond what was admitted; charged over the budget until it is freed and trimmed",
                    now - have
                );
                if self
                    .ledger
                    .record_over_budget(dev, DATA, now - have)
                    .is_err()
                {
                    now = have;
                }
            }
        }
        if now < have {
            self.ledger.release(dev, DATA, have - now);
        }
        if now == 0 {
            g.charged.remove(&dev);
        } else {
            g.charged.insert(dev, now);
        }
        within
    }

    /// Settles every device holding a graph charge; whether any went down.
    pub fn settle_graphs(&self) -> bool {
        let mut g = self.charges.graphs();
        let before: PerDev = g.charged.iter().map(|(d, b)| (*d, *b)).collect();
        let mut lower = false;
        for &(dev, b) in &before {
            self.settle_graph_dev(&mut g, dev, 0);
            lower |= g.charged.get(&dev).copied().unwrap_or(0) < b;
        }
        lower
    }

    /// Records `nodes` for executable `exec` (a reused handle's old record
    /// goes); executables without memory nodes are not kept.
    fn keep_exec(&self, g: &mut Graphs, exec: usize, nodes: Option<GraphExec>) {
        match nodes {
            Some(n) if n.unlisted || !n.allocs.is_empty() || !n.frees.is_empty() => {
                g.execs.insert(exec, n);
            }
            _ => {
                g.execs.remove(&exec);
            }
        }
        g.last.retain(|_, e| *e != exec);
        self.charges
            .graph_execs
            .store(g.execs.len(), Ordering::Relaxed);
    }

    /// `cuGraphInstantiate*` of `graph` with `flags`; `out` reads the
    /// executable `call` made. Its memory nodes are kept for its uploads
    /// and launches; with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` it is
    /// admitted as an upload. A driver that backs memory at instantiation
    /// is settled after it; what the budget cannot hold then is undone (the
    /// executable destroyed, the allocator trimmed) and refused.
    pub fn graph_instantiate(
        &self,
        graph: CUgraph,
        flags: u64,
        out: impl Fn() -> Option<CUgraphExec>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let nodes = match self.graph_memory_nodes(graph) {
            Ok(mut n) => {
                n.auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0;
                n
            }
            Err(e) => {
                crate::warn!("the nodes of a graph could not be listed ({e:?}): its graph memory is charged after each launch, not admitted before it");
                GraphExec {
                    unlisted: true,
                    ..GraphExec::default()
                }
            }
        };
        if !nodes.unlisted && nodes.allocs.is_empty() && nodes.frees.is_empty() {
            let r = call();
            if let (true, Some(x)) = (r.is_success(), out()) {
                self.keep_exec(&mut self.charges.graphs(), x.0 as usize, None);
            }
            return r;
        }
        let upload = flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0;
        let total = nodes.allocs.iter().map(|a| a.bytes).sum();
        let mut g = self.charges.graphs();
        let admitted = if upload {
            match self.admit_graph(&mut g, None, &nodes) {
                Ok(a) => a,
                Err(e) => return e,
            }
        } else {
            PerDev::new()
        };
        let r = call();
        let mut devs = PerDev::new();
        for a in &nodes.allocs {
            add(&mut devs, a.dev, 0);
        }
        let exec = if r.is_success() { out() } else { None };
        if let Some(x) = exec {
            self.keep_exec(&mut g, x.0 as usize, Some(nodes));
            if upload {
                for &(d, _) in &devs {
                    g.last.insert(d, x.0 as usize);
                }
            }
        }
        let mut within = true;
        for &(d, _) in &devs {
            within &= self.settle_graph_dev(&mut g, d, bytes_on(&admitted, d));
        }
        if within || upload {
            return r;
        }
        // Backed at instantiation past the budget: undo.
        let Some(x) = exec else { return r };
        self.keep_exec(&mut g, x.0 as usize, None);
        let _ = self.drv.graph_exec_destroy(x);
        for &(d, _) in &devs {
            let _ = self.drv.graph_mem_trim(d as i32);
            g.last.remove(&d);
            self.settle_graph_dev(&mut g, d, 0);
        }
        let dev = devs.first().map_or(0, |(d, _)| *d);
        self.refuse(dev, "graph instantiation", total)
    }

    /// `cuGraphLaunch` (`launch`) or `cuGraphUpload` of `exec`: admitted on
    /// what it may back, then settled to what the driver holds; a launch
    /// also makes its allocations live and frees what its free nodes free.
    pub fn graph_run(
        &self,
        exec: CUgraphExec,
        launch: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.charges.graph_execs.load(Ordering::Relaxed) == 0 {
            return call();
        }
        let key = exec.0 as usize;
        let mut g = self.charges.graphs();
        let Some(nodes) = g.execs.get(&key).cloned() else {
            drop(g);
            return call();
        };
        let admitted = match self.admit_graph(&mut g, Some(key), &nodes) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let r = call();
        let mut devs = PerDev::new();
        for a in &nodes.allocs {
            add(&mut devs, a.dev, 0);
        }
        if nodes.unlisted {
            for d in 0..self.ndev.max(1) {
                add(&mut devs, d, 0);
            }
        }
        if r.is_success() {
            for &(d, _) in &devs {
                g.last.insert(d, key);
            }
            if launch {
                for a in &nodes.allocs {
                    g.live.insert(a.dptr, (a.dev, a.bytes));
                }
                for f in &nodes.frees {
                    if let Some((d, _)) = g.live.remove(f) {
                        add(&mut devs, d, 0);
                    }
                }
            }
        }
        for &(d, _) in &devs {
            self.settle_graph_dev(&mut g, d, bytes_on(&admitted, d));
        }
        r
    }

    /// `cuGraphExecDestroy`: the executable's record goes; its devices'
    /// charges follow what the driver still holds.
    pub fn graph_exec_destroy(
        &self,
        exec: CUgraphExec,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if !r.is_success() || self.charges.graph_execs.load(Ordering::Relaxed) == 0 {
            return r;
        }
        let mut g = self.charges.graphs();
        let Some(nodes) = g.execs.get(&(exec.0 as usize)).cloned() else {
            return r;
        };
        self.keep_exec(&mut g, exec.0 as usize, None);
        let mut devs = PerDev::new();
        for a in &nodes.allocs {
            add(&mut devs, a.dev, 0);
        }
        for &(d, _) in &devs {
            self.settle_graph_dev(&mut g, d, 0);
        }
        r
    }

    /// `cuDeviceGraphMemTrim` of `dev` returned `r`.
    pub fn graph_trimmed(&self, dev: i32, r: CUresult) {
        if !r.is_success() || dev < 0 {
            return;
        }
        let dev = dev as u32;
        let mut g = self.charges.graphs();
        // Memory an executable kept may be gone: none counts on its own now.
        g.last.remove(&dev);
        if g.charged.contains_key(&dev) {
            self.settle_graph_dev(&mut g, dev, 0);
        }
    }

    /// A free outside a graph (`cuMemFree*`, `cuMemFreeAsync`) of a
    /// pointer vgpu charged nothing for: when it is a live graph
    /// allocation, the device's graph charge follows after it.
    pub(crate) fn graph_free(&self, ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let mut g = self.charges.graphs();
        let Some((dev, b)) = g.live.remove(&ptr) else {
            drop(g);
            return call();
        };
        let r = call();
        if r.is_success() {
            self.settle_graph_dev(&mut g, dev, 0);
        } else {
            g.live.insert(ptr, (dev, b));
        }
        r
    }

    /// A context on `dev` (`None`: any) was torn down: its graph
    /// allocations went with it, and no executable counts on memory it
    /// backed. When no context is left on the device (`gone`), nothing of
    /// this process's graph memory can be left there; otherwise the charge
    /// follows what the driver says.
    pub(crate) fn graph_context_gone(&self, dev: Option<u32>, gone: bool) {
        let mut g = self.charges.graphs();
        if g.charged.is_empty() && g.live.is_empty() {
            return;
        }
        let hit = |d: u32| dev.is_none_or(|x| x == d);
        g.live.retain(|_, (d, _)| !hit(*d));
        g.last.retain(|d, _| !hit(*d));
        let devs: Vec<u32> = g.charged.keys().copied().filter(|d| hit(*d)).collect();
        for d in devs {
            if gone {
                if let Some(b) = g.charged.remove(&d) {
                    self.ledger.release(d, DATA, b);
                }
            } else {
                self.settle_graph_dev(&mut g, d, 0);
            }
        }
    }
}
