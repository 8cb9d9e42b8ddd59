//! C ABI of the CUDA driver API and NVML, for the subset vgpu interposes and
//! simulates. Layouts follow `cuda.h` / `nvml.h` from CUDA 12.9; the
//! `layout` tests pin sizes and offsets against the values those headers
//! produce on x86_64 Linux.
//!
//! Result codes are `#[repr(transparent)]` newtypes, never Rust enums: a newer
//! driver may return a code this crate does not know, and an enum would make
//! that undefined behaviour.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

pub mod cuda;
pub mod cuda_data;
pub mod elf;
pub mod functions;
pub mod nvml;
pub mod nvml_device;

pub use cuda::*;
pub use cuda_data::*;
pub use functions::{sig, signatures, Signature};
pub use nvml::*;
pub use nvml_device::*;
