//! `libnvidia-ml.so.1` of the simulated machine (`vgpu-sim`): the NVML C
//! ABI for the subset vgpu uses, reading the machine's shared state. It
//! reports processes by their host PID, only while they hold a context.
//! A test double: see `docs/sim.md`.
pub mod ffi;
pub mod nvml;
