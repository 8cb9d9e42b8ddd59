//! Streams and events.
use super::*;

impl Driver {
    // ---- streams and events ----

    pub fn stream_create(&self, flags: u32, priority: i32) -> R<u64> {
        if flags & !1 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, _) = self.ctx()?;
        let mut g = self.lock();
        let id = g.id(T_STREAM);
        g.streams.insert(
            id,
            Stream {
                ctx,
                flags,
                priority: priority.clamp(-5, 0),
                last_seq: 0,
            },
        );
        Ok(id)
    }

    pub fn stream_destroy(&self, s: u64) -> R {
        self.lock()
            .streams
            .remove(&s)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    pub(super) fn resolve_seq(&self, stream: u64, per_thread: bool) -> R<u64> {
        let (ctx, _) = self.stream_ctx(stream)?;
        let pt = per_thread && stream == 0 || stream == CU_STREAM_PER_THREAD;
        self.stream_seq(ctx, stream, pt)
    }

    pub fn stream_synchronize(&self, s: u64, per_thread: bool) -> R {
        self.m
            .wait(self.resolve_seq(s, per_thread)?)
            .map_err(machine_err)?;
        self.release_pools();
        Ok(())
    }

    pub fn stream_query(&self, s: u64, per_thread: bool) -> R {
        if !self.m.done(self.resolve_seq(s, per_thread)?) {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    }

    pub fn stream_wait_event(&self, s: u64, e: u64, per_thread: bool) -> R {
        let (ctx, _) = self.stream_ctx(s)?;
        let (mark, remote) = {
            let g = self.lock();
            let ev = g
                .events
                .get(&e)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (ev.mark, ev.remote)
        };
        if let Some((t, n)) = remote {
            // Another process's work cannot join this one's queue: wait
            // for it here, so everything queued afterwards follows it.
            return self.m.ipc_event_wait(t, n).map_err(machine_err);
        }
        let seq = mark.map(|m| m.0).unwrap_or(0);
        // The process's queue already runs launches in order; the stream
        // only has to remember what its synchronization now covers.
        let pt = per_thread && s == 0 || s == CU_STREAM_PER_THREAD;
        self.set_stream_seq(ctx, s, pt, seq);
        Ok(())
    }

    pub fn event_create(&self, flags: u32) -> R<u64> {
        if flags & !0xf != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let mut g = self.lock();
        let id = g.id(T_EVENT);
        g.events.insert(
            id,
            Event {
                flags,
                mark: None,
                ipc: None,
                remote: None,
                captured: false,
            },
        );
        Ok(id)
    }

    pub fn event_record(&self, e: u64, s: u64, per_thread: bool) -> R {
        {
            // Recorded into a capture: part of the graph, not recorded now.
            let mut g = self.lock();
            let capturing = g.captures.contains_key(&s);
            let ev = g
                .events
                .get_mut(&e)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            ev.captured = capturing;
            if capturing {
                return Ok(());
            }
        }
        let seq = self.resolve_seq(s, per_thread)?;
        // Nothing pending before it: the event happens now.
        let at = self.m.done(seq).then(now_ns);
        let mut g = self.lock();
        let ev = g
            .events
            .get_mut(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if ev.remote.is_some() {
            // An opened IPC event is only waited on here.
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        ev.mark = Some((if at.is_some() { 0 } else { seq }, at));
        if let Some((t, n)) = ev.ipc {
            drop(g);
            // Importers wait for what this record waits for.
            self.m.ipc_event_mark(t, n, seq).map_err(machine_err)?;
        }
        Ok(())
    }

    pub(super) fn event_remote(&self, e: u64) -> R<Option<(u32, u32)>> {
        Ok(self
            .lock()
            .events
            .get(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .remote)
    }

    pub(super) fn event_mark(&self, e: u64) -> R<Option<(u64, Option<u64>)>> {
        Ok(self
            .lock()
            .events
            .get(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .mark)
    }

    pub fn event_synchronize(&self, e: u64) -> R {
        self.event_captured(e)?;
        if let Some((t, n)) = self.event_remote(e)? {
            return self.m.ipc_event_wait(t, n).map_err(machine_err);
        }
        if let Some((seq, _)) = self.event_mark(e)? {
            self.m.wait(seq).map_err(machine_err)?;
        }
        self.release_pools();
        Ok(())
    }

    pub(super) fn event_captured(&self, e: u64) -> R {
        match self.lock().events.get(&e) {
            Some(ev) if ev.captured => Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
            _ => Ok(()),
        }
    }

    pub fn event_query(&self, e: u64) -> R {
        self.event_captured(e)?;
        if let Some((t, n)) = self.event_remote(e)? {
            return if self.m.ipc_event_done(t, n) {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_NOT_READY)
            };
        }
        match self.event_mark(e)? {
            Some((seq, _)) if !self.m.done(seq) => Err(CUresult::CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    /// When a recorded event happened, once it has.
    pub(super) fn event_time(&self, e: u64) -> R<u64> {
        let ev = self
            .lock()
            .events
            .get(&e)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        // CU_EVENT_DISABLE_TIMING, or never recorded.
        let Some((seq, at)) = ev.mark.filter(|_| ev.flags & 2 == 0) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        if let Some(t) = at {
            return Ok(t);
        }
        if !self.m.done(seq) {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        // The queue slot may have been reused long since: then "now" is
        // the best bound left.
        let t = self.m.done_time(seq).unwrap_or_else(now_ns);
        if let Some(ev) = self.lock().events.get_mut(&e) {
            ev.mark = Some((seq, Some(t)));
        }
        Ok(t)
    }

    pub fn event_elapsed(&self, a: u64, b: u64) -> R<f32> {
        self.event_captured(a)?;
        self.event_captured(b)?;
        let (ta, tb) = (self.event_time(a)?, self.event_time(b)?);
        Ok((tb as f64 - ta as f64) as f32 / 1e6)
    }

    pub fn event_destroy(&self, e: u64) -> R {
        self.lock()
            .events
            .remove(&e)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
}
