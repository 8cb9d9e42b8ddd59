//! `vgpu-sim`: a simulated NVIDIA GPU machine for GPU-free testing. It is a
//! test double: everything it stands in for must also run against the real
//! driver. See `docs/sim.md`.
//!
//! - [`backing`]: the bytes of device memory (sparse memfds).
//! - [`config`]: profiles, `config.toml`, `VGPU_SIM_*` env.
//! - [`state`]: the shared state file every driver process maps.
//! - [`daemon`] / [`client`]: the machine's daemon (process records by host
//!   PID, release on death) and its protocol.
//! - [`machine`]: a process's view (memory, contexts, costs, kernels) that
//!   the simulated `libcuda.so.1` / `libnvidia-ml.so.1` are thin over.
//! - [`telemetry`]: clocks, power, thermals NVML reports.
//! - [`SimHandle`]: a private machine for tests.
pub mod backing;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
mod handle;
pub mod log;
pub mod machine;
pub mod scheduler;
pub mod state;
pub mod telemetry;

pub use config::{ConfigError, CostModel, SimConfig};
pub use handle::{link_libs, locate_artifact, SimError, SimHandle, SimOptions, LIB_LINKS};
pub use machine::{CtxCost, Machine, MachineError};
