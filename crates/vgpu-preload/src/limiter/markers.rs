//! Stream-event markers over a driver (the real one in the library, the
//! fake in tests) (the law's `Markers`): an
//! event from a small per-device pool, recorded on the launch's stream;
//! `cuEventQuery` then `cuEventElapsedTime` once both happened.
//!
//! Called with the pacer's lock held, from application threads (record,
//! on the launch's own context) and the owned thread (query, elapsed,
//! release; events carry their context). Never allocates after creation
//! (the pool's capacity is reserved), never blocks beyond its own
//! uncontended lock.
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use vgpu_cuda_abi::{CUevent, CUresult, CUstream, CU_STREAM_PER_THREAD};
use vgpu_limiter::{Elapsed, Markers};

use crate::driver::CudaDriver;

/// Events kept for reuse per device (more are destroyed on release).
const POOL: usize = 64;

/// `CU_EVENT_DEFAULT`: timing enabled.
const TIMED: u32 = 0;

/// The stream key of a launch: the handle, with a null stream of a
/// per-thread-default-stream (`_ptsz`) entry point spelled as
/// `CU_STREAM_PER_THREAD` (its own stream, not the legacy one).
pub fn stream_key(stream: CUstream, per_thread: bool) -> u64 {
    if stream.is_null() && per_thread {
        CU_STREAM_PER_THREAD as u64
    } else {
        stream.0 as u64
    }
}

/// One device's markers.
pub struct DriverMarkers {
    drv: &'static dyn CudaDriver,
    pool: Mutex<Vec<CUevent>>,
    /// Events the driver refused to create or record.
    pub failures: AtomicU64,
    /// Events recorded.
    pub recorded: AtomicU64,
}

impl DriverMarkers {
    /// Markers over `drv`'s events.
    pub fn new(drv: &'static dyn CudaDriver) -> Self {
        DriverMarkers {
            drv,
            pool: Mutex::new(Vec::with_capacity(POOL)),
            failures: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        }
    }
}

impl DriverMarkers {
    fn take(&self) -> Option<CUevent> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give(&self, ev: CUevent) {
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < POOL {
            p.push(ev);
        } else {
            drop(p);
            let _ = self.drv.event_destroy(ev);
        }
    }

    /// Forgets the pool without touching the driver (a forked child: the
    /// events are the parent's).
    pub fn forget(&self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl Markers for DriverMarkers {
    type Mark = CUevent;

    fn record(&self, stream: u64) -> Option<CUevent> {
        let ev = match self.take() {
            Some(e) => e,
            None => match self.drv.event_create(TIMED) {
                Ok(e) => e,
                Err(_) => {
                    self.failures.fetch_add(1, Relaxed);
                    return None;
                }
            },
        };
        let r = if stream == CU_STREAM_PER_THREAD as u64 {
            self.drv.event_record_ptsz(ev, CUstream::NULL)
        } else {
            self.drv.event_record(ev, CUstream(stream as *mut c_void))
        };
        if r.is_success() {
            self.recorded.fetch_add(1, Relaxed);
            Some(ev)
        } else {
            self.failures.fetch_add(1, Relaxed);
            self.give(ev);
            None
        }
    }

    fn elapsed(&self, start: CUevent, end: CUevent) -> Elapsed {
        match self.drv.event_query(end) {
            CUresult::CUDA_SUCCESS => {}
            CUresult::CUDA_ERROR_NOT_READY => return Elapsed::Pending,
            _ => return Elapsed::Failed,
        }
        match self.drv.event_elapsed_ms(start, end) {
            Ok(ms) if ms.is_finite() && ms >= 0.0 => Elapsed::Ready((ms as f64 * 1e6) as u64),
            Ok(_) => Elapsed::Ready(0),
            Err(CUresult::CUDA_ERROR_NOT_READY) => Elapsed::Pending,
            Err(_) => Elapsed::Failed,
        }
    }

    fn release(&self, m: CUevent) {
        self.give(m);
    }
}
