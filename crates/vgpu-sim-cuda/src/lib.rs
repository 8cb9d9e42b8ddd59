//! `libcuda.so.1` of the simulated machine (`vgpu-sim`): the CUDA driver
//! API's C ABI for the subset vgpu uses, with the versioned export names
//! `cuda.h` spells and a `cuGetProcAddress` version table. A test double:
//! see `docs/sim.md` for what it simulates and what it does not.
pub mod data;
pub mod driver;
pub mod ffi;
pub mod image;
pub mod procaddr;
pub mod query;
