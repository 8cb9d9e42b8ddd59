// One definition for the Rust core and the C front (build.rs `include!`s
// this file and passes the value to the C compiler). Bump it when
// `vgpu_core_bind`'s arguments change.
/// Version of the front ↔ core binding.
pub const BIND_ABI: u32 = 1;
