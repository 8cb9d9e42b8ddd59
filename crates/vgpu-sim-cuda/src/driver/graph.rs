//! Graphs: nodes, instantiation, launch and stream capture.
use super::*;

impl Driver {
    // ---- graphs ----

    pub fn graph_create(&self, flags: u32) -> R<u64> {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let id = g.id(T_GRAPH);
        g.graphs.insert(id, Vec::new());
        Ok(id)
    }

    pub fn graph_add_kernel(&self, graph: u64, deps: &[u64], node: KernelNode) -> R<u64> {
        let mut g = self.lock();
        // A library's kernel may stand for a function (resolved in the
        // launching stream's context, as a direct launch is).
        if !g.funcs.contains_key(&node.func) && !g.lib_kernels.contains_key(&node.func) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if node.grid.contains(&0) || node.block.contains(&0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !g.graphs.contains_key(&graph) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if deps.iter().any(|d| g.nodes.get(d) != Some(&graph)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Self::add_node(&mut g, graph, GraphNode::Kernel(node)))
    }

    /// Append `node` to `graph` (checked by the caller) and name it.
    pub fn add_node(g: &mut Inner, graph: u64, node: GraphNode) -> u64 {
        let id = g.id(T_NODE);
        let nodes = g.graphs.entry(graph).or_default();
        nodes.push(node);
        let idx = nodes.len() - 1;
        g.nodes.insert(id, graph);
        g.node_index.insert(id, (graph, idx));
        id
    }

    /// `cuGraphInstantiate*` with `flags` (`CUgraphInstantiate_flags`).
    pub fn graph_instantiate(&self, graph: u64, flags: u64) -> R<u64> {
        let mut g = self.lock();
        let nodes = g
            .graphs
            .get(&graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .clone();
        let id = g.id(T_EXEC);
        g.execs.insert(id, nodes);
        if flags & vgpu_cuda_abi::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0 {
            g.exec_auto_free.insert(id);
        }
        Ok(id)
    }

    /// `cuGraphUpload`: this driver backs graph memory when a launch
    /// reaches the node, so an upload only checks its arguments.
    pub fn graph_upload(&self, exec: u64, stream: u64) -> R {
        self.stream_ctx(stream)?;
        if !self.lock().execs.contains_key(&exec) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    pub fn graph_launch(&self, exec: u64, stream: u64, per_thread: bool) -> R {
        let (nodes, auto_free) = {
            let g = self.lock();
            let nodes = g
                .execs
                .get(&exec)
                .cloned()
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            (nodes, g.exec_auto_free.contains(&exec))
        };
        // An allocation of an earlier launch still live: freed first with
        // AUTO_FREE_ON_LAUNCH, else the launch fails before running
        // anything (cuda.h, cuGraphLaunch).
        for n in &nodes {
            if let GraphNode::MemAlloc { dptr, .. } = *n {
                if self.lock().graph_live.contains_key(&dptr) {
                    if !auto_free {
                        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                    }
                    self.graph_free(dptr)?;
                }
            }
        }
        for n in nodes {
            match n {
                GraphNode::Kernel(k) => self.launch(&k, stream, per_thread, false)?,
                GraphNode::MemAlloc { dptr, size, dev } => self.graph_alloc(dptr, size, dev)?,
                GraphNode::MemFree { dptr } => self.graph_free(dptr)?,
            }
        }
        Ok(())
    }

    /// `cuStreamBeginCapture*`: work queued on `stream` (an explicit
    /// stream; the default streams are refused, as the driver refuses the
    /// legacy one) is appended to a new graph until `end_capture`.
    pub fn begin_capture(&self, stream: u64) -> R {
        self.begin_capture_into(stream, None)
    }

    /// `cuStreamBeginCaptureToGraph*`: as `begin_capture`, appending to an
    /// existing graph.
    pub fn begin_capture_into(&self, stream: u64, into: Option<u64>) -> R {
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        self.stream_ctx(stream)?;
        let mut g = self.lock();
        if g.captures.contains_key(&stream) {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let graph = match into {
            Some(gr) if g.graphs.contains_key(&gr) => gr,
            Some(_) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            None => {
                let gr = g.id(T_GRAPH);
                g.graphs.insert(gr, Vec::new());
                gr
            }
        };
        g.captures.insert(stream, graph);
        Ok(())
    }

    /// `cuStreamEndCapture*`: the captured graph.
    pub fn end_capture(&self, stream: u64) -> R<u64> {
        self.lock()
            .captures
            .remove(&stream)
            .ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)
    }

    /// `cuStreamIsCapturing*`.
    pub fn is_capturing(&self, stream: u64) -> R<bool> {
        if stream != 0 && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD {
            self.stream_ctx(stream)?;
        }
        Ok(self.lock().captures.contains_key(&stream))
    }

    pub fn graph_exec_destroy(&self, exec: u64) -> R {
        let mut g = self.lock();
        g.exec_auto_free.remove(&exec);
        g.execs
            .remove(&exec)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    pub fn graph_destroy(&self, graph: u64) -> R {
        let mut g = self.lock();
        g.graphs
            .remove(&graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        g.nodes.retain(|_, gr| *gr != graph);
        g.node_index.retain(|_, (gr, _)| *gr != graph);
        Ok(())
    }
}
