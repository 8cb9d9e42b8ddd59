//! libvgpu.so's process tests, one test binary with a module per subject.
//! Two stay their own binaries: `limiter` (timing bands: it pairs only with
//! itself) and `identity` (its workers re-execute that binary by test
//! name).
mod cli;
#[path = "../common/mod.rs"]
mod common;
mod dead_views;
mod fork;
mod front;
mod harden;
mod layers;
mod limits;
mod signatures;
mod views;
