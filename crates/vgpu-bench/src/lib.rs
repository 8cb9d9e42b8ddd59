//! `vgpu bench init`: the burst-init instrument.
//!
//! The harness ([`harness`]) fork+execs N fresh `vgpu-bench-worker`
//! processes, releases them at once, and times `cuInit` in each; results go
//! through a shared result table ([`slots`]) initialized to "failed". The
//! report ([`report`]) gives nearest-rank percentiles ([`stats`]), failures
//! by reason, and the phase composition of the p50/p95/p99/max worker from
//! libvgpu.so's per-slot phase timestamps ([`phases`], [`region_view`]).
//! [`sweep`] runs several modes and worker counts in random order and fits
//! p99 against N; [`plot`] draws the SVG.
//!
//! [`sm`] is `vgpu bench sm`, the SM limiter's accuracy instrument.
pub mod dl;
pub mod harness;
pub mod phases;
pub mod plot;
pub mod region_view;
pub mod report;
pub mod slots;
pub mod sm;
pub mod stats;
pub mod sweep;
pub mod sys;
pub mod worker;
