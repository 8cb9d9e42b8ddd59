//! What bindings and JIT-compiling clients ask of a context beyond
//! allocating and launching, in safe Rust: limits, cache configuration,
//! peer access, function attributes and occupancy, module images in NVIDIA's
//! formats (PTX, cubin, fatbin) and linking, and graph memory nodes. The
//! kernel model is untouched: image kernels are ordinary timed kernels.
use vgpu_cuda_abi::*;

use crate::driver::{Driver, GraphNode, Inner, Kernel, R, T_LINK};
use crate::image::{self, Format, Kernels};

/// A `cuLinkCreate` state.
#[derive(Clone, Debug, Default)]
pub struct Link {
    pub kernels: Kernels,
    pub inputs: usize,
    /// The linked image (`cuLinkComplete`), valid until `cuLinkDestroy`.
    pub output: Option<Vec<u8>>,
}

/// Limits of a context before `cuCtxSetLimit` (an A100's defaults).
pub fn default_limit(limit: u32) -> Option<u64> {
    Some(match limit {
        CU_LIMIT_STACK_SIZE => 1024,
        CU_LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
        CU_LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH => 2,
        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => 2048,
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY => 64,
        CU_LIMIT_PERSISTING_L2_CACHE_SIZE => 0,
        _ => return None,
    })
}

/// One device's graph memory in this process, as the driver's graph
/// allocator keeps it: a launch reaching an alloc node takes memory the
/// allocator already reserved and no live allocation uses, and reserves
/// (charges the device for) only what is missing; a freed graph
/// allocation's memory stays reserved for the next one until
/// `cuDeviceGraphMemTrim` (or the context's end) gives it back (cuda.h:
/// "Free unused memory that was cached on the specified device for use
/// with graphs back to the OS").
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphMem {
    /// Bytes of live graph allocations (`USED_MEM_CURRENT`).
    pub used: u64,
    pub used_high: u64,
    /// Bytes the device is charged for (`RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    pub reserved_high: u64,
}

/// The live graph allocation at `p` was freed (any way): its memory stays
/// reserved for graphs. False when `p` is no graph allocation.
pub fn graph_alloc_freed(g: &mut Inner, p: u64) -> bool {
    let Some((dev, size)) = g.graph_live.remove(&p) else {
        return false;
    };
    let e = g.graph_mem.entry(dev).or_default();
    e.used = e.used.saturating_sub(size);
    true
}

/// Whether `p` is a graph allocation: live, or the address of an alloc
/// node of some graph.
pub fn is_graph_alloc(g: &Inner, p: u64) -> bool {
    g.graph_live.contains_key(&p)
        || g.graphs
            .values()
            .flatten()
            .any(|n| matches!(n, GraphNode::MemAlloc { dptr, .. } if *dptr == p))
}

/// Kernels an image of known format offers.
pub fn image_kernels(fmt: Format, bytes: &[u8]) -> R<Kernels> {
    match fmt {
        Format::Ptx => Ok(Kernels {
            names: image::ptx_kernels(&String::from_utf8_lossy(bytes)),
            open: false,
        }),
        Format::Cubin => image::elf_kernels(bytes)
            .map(|names| Kernels { names, open: false })
            .ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE),
        Format::Fatbin => Ok(image::fatbin_kernels(bytes)),
        Format::SimText | Format::FatbinWrapper => Err(CUresult::CUDA_ERROR_INVALID_IMAGE),
    }
}

impl Driver {
    // ---- limits, cache config, peers ----

    pub fn ctx_limit(&self, limit: u32) -> R<u64> {
        let (c, _) = self.ctx()?;
        let d = default_limit(limit).ok_or(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        Ok(self.lock().limits.get(&(c, limit)).copied().unwrap_or(d))
    }

    pub fn set_ctx_limit(&self, limit: u32, v: u64) -> R {
        let (c, _) = self.ctx()?;
        default_limit(limit).ok_or(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        // The hardware caps what a thread's stack and the FIFO may be.
        if limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH && v > 24 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.lock().limits.insert((c, limit), v);
        Ok(())
    }

    pub fn cache_config(&self) -> R<u32> {
        let (c, _) = self.ctx()?;
        Ok(self
            .lock()
            .cache_config
            .get(&c)
            .copied()
            .unwrap_or(CU_FUNC_CACHE_PREFER_NONE))
    }

    pub fn set_cache_config(&self, cfg: u32) -> R {
        let (c, _) = self.ctx()?;
        if cfg > CU_FUNC_CACHE_PREFER_EQUAL {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.lock().cache_config.insert(c, cfg);
        Ok(())
    }

    /// Every pair of distinct devices reaches each other (an HGX board's
    /// NVSwitch).
    pub fn can_access_peer(&self, dev: i32, peer: i32) -> R<bool> {
        let (a, b) = (self.device(dev)?, self.device(peer)?);
        Ok(a != b)
    }

    pub fn enable_peer(&self, peer_ctx: u64, enable: bool) -> R {
        let (c, dev) = self.ctx()?;
        let peer = self.ctx_of(peer_ctx)?;
        if peer.dev == dev {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        let mut g = self.lock();
        match (enable, g.peers.contains(&(c, peer_ctx))) {
            (true, true) => Err(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
            (false, false) => Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
            (true, false) => {
                g.peers.insert((c, peer_ctx));
                Ok(())
            }
            (false, true) => {
                g.peers.remove(&(c, peer_ctx));
                Ok(())
            }
        }
    }

    // ---- functions ----

    /// `cuFuncGetAttribute` (what an A100 reports for a small kernel,
    /// overridden by `cuFuncSetAttribute`).
    pub fn func_attribute(&self, f: u64, attr: u32) -> R<i32> {
        let g = self.lock();
        g.funcs.get(&f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(v) = g.func_attrs.get(&(f, attr)) {
            return Ok(*v);
        }
        drop(g);
        let (_, dev) = self.ctx()?;
        self.default_func_attribute(dev, attr)
    }

    /// A function attribute's value on device `dev` (machine index) before
    /// any `cuFuncSetAttribute`.
    pub fn default_func_attribute(&self, dev: usize, attr: u32) -> R<i32> {
        let d = self.m.device(dev).map_err(crate::driver::machine_err)?;
        let cc = (d.cc_major * 10 + d.cc_minor) as i32;
        Ok(match attr {
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
            CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
            CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => cc,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => 48 << 10,
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            a if a < CU_FUNC_ATTRIBUTE_MAX => 0,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })
    }

    pub fn set_func_attribute(&self, f: u64, attr: u32, v: i32) -> R {
        let mut g = self.lock();
        g.funcs.get(&f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let ok = match attr {
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => (0..=166_912).contains(&v),
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => (-1..=100).contains(&v),
            // Cluster attributes (10..16) are settable; the rest read-only.
            a => (10..CU_FUNC_ATTRIBUTE_MAX).contains(&a),
        };
        if !ok {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        g.func_attrs.insert((f, attr), v);
        Ok(())
    }

    pub fn func_name(&self, f: u64) -> R<String> {
        self.lock()
            .funcs
            .get(&f)
            .map(|k| k.name.clone())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: blocks of
    /// `block_size` threads one SM holds by threads, the 32-block cap and
    /// shared memory (the kernel model itself runs one block per SM per
    /// wave).
    pub fn occupancy(&self, f: u64, block_size: i32, dyn_smem: usize) -> R<i32> {
        self.lock()
            .funcs
            .get(&f)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if !(1..=1024).contains(&block_size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (_, dev) = self.ctx()?;
        let d = self.m.device(dev).map_err(crate::driver::machine_err)?;
        let warps = (block_size as u32).div_ceil(32) * 32;
        let by_threads = d.max_threads_per_sm / warps;
        let by_smem = if dyn_smem == 0 {
            u32::MAX
        } else {
            (167_936 / dyn_smem.max(1)) as u32
        };
        Ok(by_threads.min(32).min(by_smem) as i32)
    }

    // ---- images and linking ----

    /// A module of an image in NVIDIA's formats: each kernel named in it
    /// takes the configured image per-block time.
    pub fn module_from_kernels(&self, k: Kernels) -> R<u64> {
        self.ctx()?;
        let block = self.m.header().image_block_ns;
        let m = self.module_of(
            k.names
                .into_iter()
                .map(|name| Kernel {
                    name,
                    block_ns: Some(block),
                })
                .collect(),
        )?;
        if k.open {
            self.lock().open_modules.insert(m);
        }
        Ok(m)
    }

    pub fn link_create(&self) -> R<u64> {
        self.ctx()?;
        let mut g = self.lock();
        let id = g.id(T_LINK);
        g.links.insert(id, Link::default());
        Ok(id)
    }

    /// One input: its kernels join the link.
    pub fn link_add(&self, link: u64, ty: u32, bytes: &[u8]) -> R {
        let k = match ty {
            CU_JIT_INPUT_PTX => image_kernels(Format::Ptx, bytes)?,
            CU_JIT_INPUT_CUBIN => image_kernels(Format::Cubin, bytes)?,
            CU_JIT_INPUT_FATBINARY => image_kernels(Format::Fatbin, bytes)?,
            // Host objects and archives carry fatbins somewhere inside.
            CU_JIT_INPUT_OBJECT | CU_JIT_INPUT_LIBRARY => image::fatbin_kernels(bytes),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let mut g = self.lock();
        let l = g
            .links
            .get_mut(&link)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if l.output.is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for n in k.names {
            if !l.kernels.names.contains(&n) {
                l.kernels.names.push(n);
            }
        }
        l.kernels.open |= k.open;
        l.inputs += 1;
        Ok(())
    }

    /// `cuLinkComplete`: the linked image, in the sim's module text (what
    /// `cuModuleLoadData` takes back), NUL-terminated; it lives until
    /// `cuLinkDestroy`. Returns its address and length.
    pub fn link_complete(&self, link: u64) -> R<(usize, usize)> {
        let block = self.m.header().image_block_ns;
        let mut g = self.lock();
        let l = g
            .links
            .get_mut(&link)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if l.inputs == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut text = String::from("vgpu-sim-module v1\n");
        for n in &l.kernels.names {
            text.push_str(&format!("kernel {n} block_ns={block}\n"));
        }
        if l.kernels.open {
            text.push_str(&format!("kernel * block_ns={block}\n"));
        }
        let mut bytes = text.into_bytes();
        bytes.push(0);
        let out = l.output.insert(bytes);
        Ok((out.as_ptr() as usize, out.len()))
    }

    pub fn link_destroy(&self, link: u64) -> R {
        self.lock()
            .links
            .remove(&link)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    // ---- graph memory nodes ----

    /// `cuGraphAddMemAllocNode`: the address is fixed now; memory is made
    /// and charged when the graph runs the node.
    pub fn graph_add_mem_alloc(
        &self,
        graph: u64,
        deps: &[u64],
        loc_type: u32,
        loc_id: i32,
        size: u64,
    ) -> R<(u64, u64)> {
        if loc_type != CU_MEM_LOCATION_TYPE_DEVICE || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let dev = self
            .device(loc_id)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let mut g = self.lock();
        Self::check_graph(&g, graph, deps)?;
        let dptr = g.va(size, crate::driver::GRANULARITY, false)?;
        let node = Self::add_node(&mut g, graph, GraphNode::MemAlloc { dptr, size, dev });
        Ok((node, dptr))
    }

    /// `cuGraphAddMemFreeNode` of a graph allocation's address.
    pub fn graph_add_mem_free(&self, graph: u64, deps: &[u64], dptr: u64) -> R<u64> {
        let mut g = self.lock();
        Self::check_graph(&g, graph, deps)?;
        if !is_graph_alloc(&g, dptr) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Self::add_node(&mut g, graph, GraphNode::MemFree { dptr }))
    }

    fn check_graph(g: &Inner, graph: u64, deps: &[u64]) -> R {
        if !g.graphs.contains_key(&graph) || deps.iter().any(|d| g.nodes.get(d) != Some(&graph)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    /// `cuGraphGetNodes`: a graph's nodes in the order they were added.
    pub fn graph_nodes(&self, graph: u64) -> R<Vec<u64>> {
        let g = self.lock();
        if !g.graphs.contains_key(&graph) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut v: Vec<(usize, u64)> = g
            .node_index
            .iter()
            .filter(|(_, (gr, _))| *gr == graph)
            .map(|(n, (_, i))| (*i, *n))
            .collect();
        v.sort_unstable();
        Ok(v.into_iter().map(|(_, n)| n).collect())
    }

    /// `cuGraphNodeGetType`.
    pub fn graph_node_type(&self, node: u64) -> R<u32> {
        Ok(match self.graph_node(node)? {
            GraphNode::Kernel(_) => CU_GRAPH_NODE_TYPE_KERNEL,
            GraphNode::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            GraphNode::MemFree { .. } => CU_GRAPH_NODE_TYPE_MEM_FREE,
        })
    }

    /// A node's own description.
    pub fn graph_node(&self, node: u64) -> R<GraphNode> {
        let g = self.lock();
        let (graph, i) = *g
            .node_index
            .get(&node)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        g.graphs
            .get(&graph)
            .and_then(|v| v.get(i))
            .copied()
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// A launch reached a mem-alloc node: the allocation lives from now
    /// until a free node, `cuMemFree*`/`cuMemFreeAsync` or the context's
    /// end; its memory comes from what the device's graph memory has
    /// reserved and no live allocation uses, the rest is reserved (charged
    /// to the device) now.
    pub fn graph_alloc(&self, dptr: u64, size: u64, dev: usize) -> R {
        let (ctx, _) = self.ctx()?;
        let mut g = self.lock();
        if g.allocs.contains_key(&dptr) {
            // Launched again before its allocation was freed.
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let gm = g.graph_mem.entry(dev).or_default();
        let grow = size.saturating_sub(gm.reserved.saturating_sub(gm.used));
        // Under the lock: two launches must not count on the same memory.
        self.m
            .reserve(dev, grow)
            .map_err(crate::driver::machine_err)?;
        gm.reserved += grow;
        gm.reserved_high = gm.reserved_high.max(gm.reserved);
        gm.used += size;
        gm.used_high = gm.used_high.max(gm.used);
        g.allocs.insert(
            dptr,
            crate::driver::Alloc {
                dev,
                ctx,
                size,
                charged: size,
                kind: crate::driver::AllocKind::Device,
                backing: None,
                ipc: None,
            },
        );
        g.graph_live.insert(dptr, (dev, size));
        Ok(())
    }

    /// A launch reached a mem-free node.
    pub fn graph_free(&self, dptr: u64) -> R {
        if !self.lock().graph_live.contains_key(&dptr) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.mem_free(dptr)
    }

    /// `cuDeviceGetGraphMemAttribute`.
    pub fn graph_mem_attr(&self, dev: i32, attr: u32) -> R<u64> {
        let d = self.device(dev)?;
        let m = self.lock().graph_mem.get(&d).copied().unwrap_or_default();
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => Ok(m.used),
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => Ok(m.used_high),
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => Ok(m.reserved),
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => Ok(m.reserved_high),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuDeviceGraphMemTrim`: the memory no live graph allocation uses
    /// goes back to the device.
    pub fn graph_trim(&self, dev: i32) -> R {
        let d = self.device(dev)?;
        self.graph_trim_locked(&mut self.lock(), d);
        Ok(())
    }

    /// [`Driver::graph_trim`] of machine device `d` under the lock.
    pub fn graph_trim_locked(&self, g: &mut Inner, d: usize) {
        if let Some(m) = g.graph_mem.get_mut(&d) {
            let unused = m.reserved.saturating_sub(m.used);
            if unused > 0 {
                self.m.unreserve(d, unused);
                m.reserved -= unused;
            }
        }
    }

    /// `cuDeviceSetGraphMemAttribute`: only the high-water marks, reset to 0.
    pub fn reset_graph_mem_high(&self, dev: i32, attr: u32, v: u64) -> R {
        let d = self.device(dev)?;
        if v != 0
            || !matches!(
                attr,
                CU_GRAPH_MEM_ATTR_USED_MEM_HIGH | CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH
            )
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let e = g.graph_mem.entry(d).or_default();
        if attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH {
            e.used_high = e.used;
        } else {
            e.reserved_high = e.reserved;
        }
        Ok(())
    }
}
