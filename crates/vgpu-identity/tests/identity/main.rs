//! vgpu-identity's tests in one binary, a module per subject (`processes`
//! re-executes its own binary by test name and `signals` has no harness:
//! both stay their own binaries).
mod broker;
#[path = "../common/mod.rs"]
mod common;
mod golden;
mod props;
