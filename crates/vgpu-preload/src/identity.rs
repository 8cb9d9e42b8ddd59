//! Host-PID identity seam. Memory limits need no host PID, so `cuInit`
//! never waits for identity. The identity tiers (broker, trusted procfs,
//! probe; `vgpu-identity`) plug in behind [`host_pid`], which resolves
//! lazily at first need (the watcher or the first limited launch) and keeps
//! its state visible in the slot.
use std::sync::atomic::{AtomicU32, Ordering};

/// 0: not resolved yet.
static HOST_PID: AtomicU32 = AtomicU32::new(0);

/// The host PID if some tier has resolved it; never blocks.
pub fn host_pid() -> Option<u32> {
    match HOST_PID.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Records a resolved host PID (for the tiers wired in later).
pub fn set_host_pid(pid: u32) {
    HOST_PID.store(pid, Ordering::Release);
}
