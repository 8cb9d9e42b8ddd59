//! The SM limiter's room: every launch hook calls [`launch_gate`] before
//! forwarding, whatever the launch path. Today the gate only does what the
//! library always did: nothing at all without an SM limit (one atomic
//! load), and with one, resolve identity at first need and say once that
//! launches are not paced yet. The limiter proper (pacing by measured GPU
//! time, its owned thread and injected [`clock::Clock`]) moves in here.
//!
//! Must never block a launch without an SM limit, nor switch a configured
//! limit off silently.
use std::sync::atomic::{AtomicBool, Ordering};

use crate::attach::{self, Proc};

pub mod clock;

/// Which launch entry point called the gate (for pacing and accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// `cuLaunchKernel` (and `_ptsz`).
    Kernel,
    /// `cuLaunchKernelEx` (and `_ptsz`).
    KernelEx,
    /// `cuLaunchCooperativeKernel` (and `_ptsz`).
    Cooperative,
    /// `cuGraphLaunch` (and `_ptsz`): not hooked yet (the limiter issue
    /// hooks it; the driver table already has both).
    Graph,
}

/// The launch path's gate: one atomic load when nothing is SM-limited.
#[inline]
pub fn launch_gate(kind: Launch) {
    if let Some(p) = attach::attached() {
        if p.sm_limited {
            limited_launch(p, kind);
        }
    }
}

#[cold]
fn limited_launch(p: &Proc, _kind: Launch) {
    // Identity resolves at the first limited launch (or retries when its
    // backoff is due): the limiter will need the host PID.
    crate::identity::on_limited_launch(p);
    sm_limit_pending();
}

static SM_NOTED: AtomicBool = AtomicBool::new(false);

fn sm_limit_pending() {
    if !SM_NOTED.swap(true, Ordering::Relaxed) {
        crate::warn!("an SM limit is configured but this libvgpu.so has no launch limiter yet; launches are not paced");
    }
}
