//! The shared region's tests, one test binary with a module per subject
//! (the loom models stay their own binaries: they build only under
//! `--cfg loom`).
mod basic;
#[path = "../common/mod.rs"]
mod common;
mod faults;
mod format;
mod hostile;
mod limits;
mod liveness;
mod namespaces;
mod pacing;
mod race;
mod registration;
