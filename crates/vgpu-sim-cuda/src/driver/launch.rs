//! Kernel launches and the per-stream order of queued work.
use super::*;

impl Driver {
    /// Queue a launch of `f` on `stream` (`per_thread`: the per-thread
    /// default stream for handle 0). `max_blocks` caps the grid
    /// (cooperative launches).
    pub fn launch(&self, k: &KernelNode, stream: u64, per_thread: bool, cooperative: bool) -> R {
        // A library's kernel in place of a function (CUDA 12 allows it):
        // its function in the stream's context, loaded there at first use.
        let resolved;
        let k = if handle_kind(k.func) == Some(T_KERNEL) {
            let (ctx, _) = self.stream_ctx(stream)?;
            resolved = KernelNode {
                func: self.kernel_function_in(k.func, ctx)?,
                ..*k
            };
            &resolved
        } else {
            k
        };
        let KernelNode {
            func: f,
            grid,
            block,
            param_ns,
        } = *k;
        if grid.contains(&0) || block.contains(&0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
        if threads > 1024 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let block_ns = self.block_ns(f, param_ns)?;
        let (ctx, dev) = self.stream_ctx(stream)?;
        let d = self.m.device(dev).map_err(machine_err)?;
        let sms = u64::from(d.sms.max(1));
        let blocks = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
        if cooperative {
            let per_sm = (u64::from(d.max_threads_per_sm) / threads.max(1)).clamp(1, 32);
            if blocks > sms * per_sm {
                return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
            }
        }
        let waves = blocks.div_ceil(sms);
        let duration = waves.saturating_mul(block_ns);
        let pt = per_thread && stream == 0 || stream == CU_STREAM_PER_THREAD;
        {
            // A captured launch does not run: it becomes a node of the
            // capture's graph.
            let mut g = self.lock();
            if let Some(&graph) = g.captures.get(&stream) {
                Self::add_node(&mut g, graph, GraphNode::Kernel(*k));
                return Ok(());
            }
        }
        // Validates the stream; the process's queue keeps launch order.
        self.stream_seq(ctx, stream, pt)?;
        let seq = self.m.launch(dev, duration).map_err(machine_err)?;
        self.set_stream_seq(ctx, stream, pt, seq);
        Ok(())
    }

    /// Last work queued on a stream.
    pub fn stream_seq(&self, ctx: u64, stream: u64, per_thread: bool) -> R<u64> {
        let g = self.lock();
        if per_thread {
            return Ok(g.pt_streams.get(&(thread_id(), ctx)).copied().unwrap_or(0));
        }
        if stream == 0 || stream == CU_STREAM_LEGACY {
            return Ok(g.ctxs.get(&ctx).map(|c| c.default_seq).unwrap_or(0));
        }
        Ok(g.streams
            .get(&stream)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .last_seq)
    }

    pub fn set_stream_seq(&self, ctx: u64, stream: u64, per_thread: bool, end: u64) {
        let mut g = self.lock();
        if let Some(c) = g.ctxs.get_mut(&ctx) {
            c.last_seq = c.last_seq.max(end);
            if !per_thread && (stream == 0 || stream == CU_STREAM_LEGACY) {
                c.default_seq = c.default_seq.max(end);
            }
        }
        if per_thread {
            let e = g.pt_streams.entry((thread_id(), ctx)).or_insert(0);
            *e = (*e).max(end);
        } else if let Some(s) = g.streams.get_mut(&stream) {
            s.last_seq = s.last_seq.max(end);
        }
    }
}
