//! `vgpu bench sm`: the SM limiter's accuracy instrument (issue 11).
//!
//! Each row runs its tenants as real processes (`vgpu-bench-sm-tenant`,
//! each its own container: own region, own limit) through libvgpu.so on
//! the simulated driver (one machine per row, with the row's SM count) or
//! on a real GPU, and takes the truth from the device: the simulator's
//! kernel timeline, or NVML's per-process samples. It reports, per tenant,
//! the share of each second against its target, the mean absolute error
//! after the first second, the settling time, launches per second (an
//! unlimited neighbour's throughput), and for the overhead row the
//! nanoseconds a launch call costs bare, under libvgpu.so unlimited, and
//! limited with budget available. The same rows also run on the law's
//! deterministic model (`vgpu-limiter`, feature `model`), labelled as
//! such: what the control law does, apart from the interposer.
//!
//! Failures are counted, never dropped: a tenant that exits non-zero,
//! prints no report, or overruns its deadline is a failure of its row.

pub mod ffi;
pub mod harness;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod report;
pub mod rows;
pub mod tenant;

/// Which device a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vgpu-sim (a test double), a fresh machine per row.
    Sim,
    /// The machine's NVIDIA GPU.
    Gpu,
    /// The law alone on `vgpu_limiter::model` (no processes, simulated time).
    Model,
}

impl Engine {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Sim => "sim",
            Engine::Gpu => "gpu",
            Engine::Model => "model",
        }
    }
}
