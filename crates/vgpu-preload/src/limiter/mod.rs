//! The SM limiter in the interposer (docs/limiter.md, "What the interposer
//! wires"): every launch hook forwards through [`launch`], every
//! synchronizing hook calls [`before_sync`] / [`after_sync`], and the owned
//! thread ([`job`]) polls markers, re-reads the limits on a generation bump
//! and runs the NVML correction sampler.
//!
//! The wiring is methods of [`Limiter`], which is built over the drivers and
//! the clock it is given (`&'static dyn CudaDriver`, `NvmlDriver`,
//! [`clock::Clock`]): the real ones for the process's limiter (the statics
//! below and the exported hooks are the only places that name them), the
//! fakes and a `FakeClock` in the unit tests (`tests.rs`).
//!
//! Per device, one `vgpu_limiter::Pacer` over the container's bucket in the
//! region (one bucket per container and device, shared by its processes),
//! or a private `LocalBucket` when no region can be used and a limit is
//! configured (fail closed, logged).
//!
//! The launch path: one relaxed load while nothing is paced in this
//! process image. The first launch of an image takes the slow path once
//! (builds the per-device state, reads the limits, starts the owned
//! thread), so an unlimited process is still measured and a live limit
//! change reaches it. Waits happen here, on the launching thread, never in
//! a signal handler. Must never block a launch that is not paced, nor
//! switch a configured limit off silently.
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use vgpu_cuda_abi::{CUevent, CUgraphExec, CUresult, CUstream};
use vgpu_limiter::{Admit, Cells, Kind, Pacer, Params};
use vgpu_region::pacing::{Bucket, LocalBucket, SlotPacing};

use crate::attach::{self, Proc};
use crate::driver::{self, CudaDriver, NvmlDriver, REAL_CUDA, REAL_NVML};
use crate::process;

pub use crate::clock;
mod job;
mod lend;
pub mod markers;
pub mod source;
#[cfg(test)]
mod tests;

use clock::Clock;
use markers::DriverMarkers;

/// Which launch entry point called the gate (for pacing and accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// `cuLaunchKernel` (and `_ptsz`).
    Kernel,
    /// `cuLaunchKernelEx` (and `_ptsz`).
    KernelEx,
    /// `cuLaunchCooperativeKernel` (and `_ptsz`).
    Cooperative,
    /// `cuLaunchCooperativeKernelMultiDevice`: charged as one launch on
    /// the calling context's device.
    CooperativeMultiDevice,
    /// `cuGraphLaunch` (and `_ptsz`): charged by the executable's own
    /// measured cost.
    Graph(CUgraphExec),
}

impl Launch {
    fn charge(self) -> Kind {
        match self {
            Launch::Graph(g) => Kind::Graph(g.0 as u64),
            _ => Kind::Kernel,
        }
    }
}

/// True while this image may pace a launch (or has not built its state
/// yet: the slow path builds it). The unlimited launch path is this load.
static SLOW: AtomicBool = AtomicBool::new(true);
/// This image's state (`build_for` leaks it; an older generation's is the
/// parent's, stale in a forked child, which builds its own).
static LIM: process::PerImage<&'static Limiter> = process::PerImage::new();
/// This image's stream captures in progress.
static CAPTURES: Captures = Captures::new();
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// One device's limiter.
pub struct Dev {
    /// The CUDA ordinal.
    pub ord: u32,
    /// The region device it is (by UUID; the ordinal when none).
    pub idx: u32,
    pub uuid: String,
    pub pacer: Pacer<CUevent>,
    pub markers: DriverMarkers,
    pub bucket: Bucket<'static>,
    pub slot: SlotPacing<'static>,
    /// The bucket is this process's own (a private ledger, or no region
    /// device for this ordinal): the limit holds per process.
    pub local: bool,
}

impl Dev {
    pub fn cells(&self) -> Cells<'static> {
        Cells {
            bucket: self.bucket,
            slot: self.slot,
            dev: self.idx,
        }
    }
}

/// This process image's limiter.
pub struct Limiter {
    pub p: &'static Proc,
    pub devs: Vec<Dev>,
    /// What it measures and asks with, and its time.
    pub cuda: &'static dyn CudaDriver,
    pub nvml: &'static dyn NvmlDriver,
    pub clock: &'static dyn Clock,
    job: std::sync::Mutex<job::State>,
}

/// Stream captures in progress (`cuStreamBeginCapture` … `EndCapture`):
/// while any is, a launch asks the driver whether its stream is captured.
#[derive(Default)]
pub struct Captures(AtomicU32);

impl Captures {
    pub const fn new() -> Captures {
        Captures(AtomicU32::new(0))
    }

    /// Whether work queued on `stream` now is captured into a graph rather
    /// than run (asked of `drv` only while a capture is in progress).
    #[inline]
    pub fn captured(&self, drv: &dyn CudaDriver, stream: CUstream, per_thread: bool) -> bool {
        self.0.load(Ordering::Acquire) > 0
            && drv.stream_is_capturing(stream, per_thread).unwrap_or(false)
    }

    /// A capture began with result `r`.
    pub fn begun(&self, r: CUresult) {
        if r.is_success() {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A capture's end returned `r` (it ends, or was already over; an
    /// invalid stream was never capturing).
    pub fn ended(&self, r: CUresult) {
        if r != CUresult::CUDA_ERROR_INVALID_VALUE {
            let _ = self
                .0
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// Captures in progress.
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    fn reset(&self) {
        self.0.store(0, Ordering::Release);
    }
}

/// The state if built for this image (never builds).
#[inline]
fn current() -> Option<&'static Limiter> {
    LIM.get().copied()
}

/// The state, built first if needed.
fn get() -> Option<&'static Limiter> {
    current().or_else(build)
}

/// Builds this image's state: one thread builds, the others of the image
/// wait for it; `None` when re-entered on the building thread or when the
/// process cannot attach.
#[cold]
fn build() -> Option<&'static Limiter> {
    let mut built = false;
    let l = LIM
        .get_or_build(|| {
            let l = attach::proc().map(build_for)?;
            built = true;
            Some(l)
        })
        .copied()?;
    if built {
        job::first_refresh(l);
        // Without a region nothing can change later (no limits
        // generation to watch, no utilization to publish), so an
        // unlimited process without one needs no thread.
        if l.p.ledger.is_some() || SLOW.load(Ordering::Acquire) {
            job::start();
        }
    }
    Some(l)
}

fn build_for(p: &'static Proc) -> &'static Limiter {
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        process::on_fork_child(forked);
        process::on_exit(job::at_exit);
    }
    Box::leak(Box::new(Limiter::new(
        p,
        &REAL_CUDA,
        &REAL_NVML,
        &clock::TSC,
    )))
}

/// Fork child: the parent's limiter stays the parent's (stale by its
/// generation); the launch path takes the slow path to build the child's.
/// Atomics only.
fn forked() {
    SLOW.store(true, Ordering::Release);
    CAPTURES.reset();
    clock::TSC.forked();
}

/// Recomputes the hot-path word from the devices' targets.
fn set_slow(l: &Limiter) {
    SLOW.store(l.any_paced(), Ordering::Release);
}

impl Limiter {
    /// The limiter of `p` over these
    /// drivers and clock: one device per CUDA ordinal the process sees,
    /// each on its container bucket, or a private one (fail closed).
    pub fn new(
        p: &'static Proc,
        cuda: &'static dyn CudaDriver,
        nvml: &'static dyn NvmlDriver,
        clock: &'static dyn Clock,
    ) -> Limiter {
        let region = p.ledger.as_ref();
        let mut n = p.ndev.load(Ordering::Relaxed);
        if n == 0 {
            n = region.map_or(0, |l| l.device_count());
        }
        if n == 0 {
            n = cuda.device_count().unwrap_or(1);
        }
        let n = n.clamp(1, vgpu_region::layout::MAX_DEVICES as u32);
        let devs = (0..n)
            .map(|ord| {
                // The region device this ordinal is (bound by UUID).
                let idx = region.and_then(|l| l.index(ord));
                let shared = region.zip(idx).and_then(|(l, i)| l.region().bucket(i));
                let (bucket, local) = match shared {
                    Some(b) => (b, region.is_some_and(|l| l.private_cause.is_some())),
                    None => {
                        let lb: &'static LocalBucket = Box::leak(Box::new(LocalBucket::new()));
                        (lb.bucket(), true)
                    }
                };
                let slot = match (region, idx) {
                    (Some(l), Some(_)) => l.region().slot_pacing(l.slot()),
                    _ => SlotPacing::new(None, 0),
                };
                let uuid = match (region, idx) {
                    (Some(l), Some(i)) => l.device_uuid(i),
                    _ => driver::ordinal_uuid(cuda, ord).unwrap_or_default(),
                };
                Dev {
                    ord,
                    idx: idx.unwrap_or(ord),
                    uuid,
                    pacer: Pacer::new(Params::default()),
                    markers: DriverMarkers::new(cuda),
                    bucket,
                    slot,
                    local,
                }
            })
            .collect();
        Limiter {
            p,
            devs,
            cuda,
            nvml,
            clock,
            job: std::sync::Mutex::new(job::State::default()),
        }
    }

    /// Whether any device paces (else the hot-path word may be cleared).
    fn any_paced(&self) -> bool {
        self.devs.iter().any(|d| !d.pacer.target().is_pass())
    }

    /// The device a launch on the calling thread's context goes to.
    fn dev_for_launch(&self) -> Option<&Dev> {
        if self.devs.len() == 1 {
            return self.devs.first();
        }
        let d = self.cuda.ctx_device().ok()?;
        usize::try_from(d).ok().and_then(|i| self.devs.get(i))
    }

    /// A launch through `call`, paced when its device is limited: waits
    /// (on the clock) until the bucket admits it, charges it, meters it.
    /// Work queued on a stream under capture (`caps`) passes uncharged:
    /// it is charged when its graph launches.
    #[inline]
    pub fn launch(
        &self,
        caps: &Captures,
        kind: Launch,
        stream: CUstream,
        per_thread: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if caps.captured(self.cuda, stream, per_thread) {
            return call();
        }
        let Some(d) = self.dev_for_launch() else {
            return call();
        };
        let key = markers::stream_key(stream, per_thread);
        let charge = kind.charge();
        let cells = d.cells();
        let start = self.clock.now_ns();
        let mut now = start;
        loop {
            match d.pacer.admit(&d.markers, &cells, now, key, charge) {
                Admit::Pass => return call(),
                Admit::Go(ticket) => {
                    let r = call();
                    // The gate's time stands for the return's too: one
                    // clock read per paced launch, not two (even from the
                    // TSC a read is 15-30 ns, a fair share of the paced
                    // path's cost). The meter
                    // dates the launch into its burst a call's length
                    // early: the burst closes at most one launch later.
                    d.pacer.launched(
                        &d.markers,
                        &cells,
                        ticket,
                        r.is_success(),
                        now.saturating_sub(start),
                        now,
                    );
                    return r;
                }
                Admit::Wait { until_ns } | Admit::Suspended { until_ns } => {
                    if until_ns > now {
                        self.clock.sleep_ns(until_ns - now);
                    }
                    now = self.clock.now_ns();
                }
            }
        }
    }

    /// Before a synchronize: every device's open bursts close.
    pub fn before_sync(&self) {
        let now = self.clock.now_ns();
        for d in &self.devs {
            d.pacer.before_sync(&d.markers, now);
        }
    }

    /// After a synchronize: what finished is measured and charged.
    pub fn after_sync(&self) {
        for d in &self.devs {
            if !d.pacer.target().is_pass() {
                d.pacer.poll(&d.markers, &d.cells());
            }
        }
    }
}

/// A launch of `kind` on `stream` (`per_thread`: a `_ptsz` entry point),
/// forwarded by `call`: paced when its device's container is limited.
#[inline]
pub fn launch(
    kind: Launch,
    stream: CUstream,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !SLOW.load(Ordering::Relaxed) {
        return call();
    }
    paced(kind, stream, per_thread, call)
}

#[inline(never)]
fn paced(
    kind: Launch,
    stream: CUstream,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(l) = get() else { return call() };
    l.launch(&CAPTURES, kind, stream, per_thread, call)
}

/// Before a synchronize, a blocking copy or an application's query: the
/// open bursts close, so none spans the host's time that follows.
#[inline]
pub fn before_sync() {
    if !SLOW.load(Ordering::Relaxed) {
        return;
    }
    if let Some(l) = current() {
        l.before_sync();
    }
}

/// After a synchronize returned: what finished is measured now.
#[inline]
pub fn after_sync() {
    if !SLOW.load(Ordering::Relaxed) {
        return;
    }
    if let Some(l) = current() {
        l.after_sync();
    }
}

/// Whether work queued on `stream` now is captured into a graph rather
/// than run (asked of the driver only while a capture is in progress).
#[inline]
pub fn captured(stream: CUstream, per_thread: bool) -> bool {
    CAPTURES.captured(&REAL_CUDA, stream, per_thread)
}

/// `cuStreamBeginCapture*` (and `cuStreamBeginCaptureToGraph*`) returned `r`.
pub fn capture_begun(r: CUresult) {
    CAPTURES.begun(r);
}

/// `cuStreamEndCapture*` returned (a capture ends, or was already over).
pub fn capture_ended(r: CUresult) {
    CAPTURES.ended(r);
}

/// For `vgpu inspect`-like checks in tests: the pacing target of device
/// `dev` in this image, if built.
pub fn target_of(dev: u32) -> Option<vgpu_limiter::Target> {
    current()?.devs.get(dev as usize).map(|d| d.pacer.target())
}
