//! Host-PID identity for vgpu.
//!
//! NVML reports host-namespace PIDs; a process in a container knows only its
//! inner PID. This crate provides the tiers that learn the host PID
//! (docs/design.md section 6), first that works wins:
//!
//! 1. [`client`]: ask the node's broker over a Unix socket
//!    (`LIBVGPU_HOSTPID_BROKER`); the broker answers with the `SO_PEERCRED`
//!    PID the kernel reports. Protocol in [`codec`]; server in `server`
//!    (cargo feature `server`, off by default so `libvgpu.so` does not
//!    compile it).
//! 2. [`procfs`]: the first `NStgid` field of a trusted host procfs mount
//!    (`LIBVGPU_HOST_PROCFS`), refusing the process's own `/proc`.
//! 3. [`probe`]: the NVML probe (retain a primary context, diff the process
//!    list), serialized node-wide by `flock`, over a [`probe::ProbeDriver`]
//!    the interposer implements.
//!
//! [`resolve()`] runs the tiers in order and returns a [`Telemetry`] record
//! shaped for a shared-memory slot. Nothing here logs, spawns threads or
//! keeps global state: the caller decides when identity runs (off the
//! `cuInit` path) and what to log.
pub mod client;
pub mod codec;
#[doc(hidden)]
pub mod fuzz_checks;
pub mod probe;
pub mod procfs;
pub mod resolve;
#[cfg(feature = "server")]
pub mod server;
pub mod telemetry;

pub use client::{query_broker, BrokerError};
pub use procfs::{host_pid_from_mount, parse_nstgid, ProcfsError};
pub use resolve::{resolve, ResolveConfig};
pub use telemetry::{parse_tier, tier_name, FailureCode, IdentityTier, Telemetry, DEFAULT_ORDER};
