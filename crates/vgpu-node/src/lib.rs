//! vgpu's Kubernetes node agent (`vgpu node`), drop-in compatible with
//! HAMi v2.10's device plugin and vGPU monitor:
//!
//! - [`plugin`]: the kubelet device plugin (API v1beta1 over a Unix socket):
//!   registration, re-registration after a kubelet restart, ListAndWatch
//!   with health, HAMi's Allocate (env, mounts, the read-only limits file),
//!   GetPreferredAllocation, PreStartContainer;
//! - [`register`]: the node's `hami.io/node-nvidia-register` annotation
//!   (the handshake is left to the scheduler, as HAMi's plugin does);
//! - [`broker`]: the host-PID broker (vgpu-identity's server) hosted in the
//!   agent, in the host PID namespace;
//! - [`monitor`]: `/metrics` (HAMi's names, legacy names behind a flag,
//!   vgpu's extras) and `/healthz`, reading every region at scrape time;
//! - [`watchdog`]: the driver's per-process memory joined to containers
//!   through cgroups, compared with limits and ledgers, optionally enforced;
//! - [`gc`]: dead slots reclaimed in any namespace, directories of pods gone
//!   removed after a grace;
//! - [`priority`]: the priority arbiter, writing and removing the `hold`
//!   of low-priority containers while a high-priority one is busy;
//! - [`manifests`]: the Kubernetes objects the Helm chart renders.
//!
//! Pure parts ([`allocate`], [`cgroup`], [`layout`]) do no I/O beyond what
//! their names say; the agent ([`agent`]) wires them to NVML, the API
//! server and the filesystem.

pub mod agent;
pub mod allocate;
pub mod boards;
pub mod broker;
pub mod cgroup;
pub mod config;
pub mod gc;
pub mod kube_api;
pub mod layout;
pub mod manifests;
pub mod monitor;
pub mod nvml;
pub mod observe;
pub mod plugin;
pub mod priority;
pub mod procfs;
pub mod proto;
pub mod register;
pub mod watchdog;
