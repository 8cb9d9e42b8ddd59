//! vgpu's SM limiter core: the control law that holds a container's share
//! of a GPU's time on every launch path (docs/limiter.md).
//!
//! - [`policy`]: settings (limit, policy, priority, suspend, hold) → what to
//!   pace to, HAMi's names.
//! - [`law`]: the token bucket in GPU time over the container's shared
//!   bucket (`vgpu_region::pacing`); `gate` per launch.
//! - [`lend`]: guarantees and ceilings: how a GPU's containers lend
//!   unused time to one another (the allocation every member computes).
//! - [`meter`]: stream-event markers around bursts of launches, so every
//!   charge is replaced by what the device spent.
//! - [`estimate`]: the charge before the measurement.
//! - [`pacer`]: the three joined for one process and device: what the
//!   interposer calls.
//! - [`sampler`]: the slow correction from NVML's per-process time, and the
//!   container's utilization.
//! - `model` (feature `model`): a deterministic time-sliced device the law
//!   is tested on, under a simulated clock.
//!
//! Pure: no FFI, no threads, no I/O, no allocation on the launch path, no
//! panics, no logging. Time comes in as arguments (CLOCK_MONOTONIC ns from
//! the caller's clock), so every test runs on a fake clock with no sleeps.

pub mod estimate;
pub mod law;
pub mod lend;
pub mod meter;
#[cfg(feature = "model")]
pub mod model;
pub mod pacer;
pub mod policy;
pub mod sampler;

pub use estimate::Kind;
pub use law::{Decision, Params};
pub use meter::{Elapsed, Markers};
pub use pacer::{Admit, Cells, Pacer, Ticket};
pub use policy::{target, target_with, Measurement, Policy, Priority, Settings, Target, PPM};
pub use sampler::{Corrector, Published, Window};
