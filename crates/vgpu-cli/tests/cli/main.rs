//! The `vgpu` binary's tests, one test binary (one compile of the shared
//! harness, one link against the Kubernetes crates) with a module per
//! subject: the node agent (`node_*`, `priority`), the scheduler process,
//! the whole chain, `vgpu run`, `vgpu inspect`, `vgpu sim`.
#[macro_use]
mod node_common;
mod chain;
mod inspect;
mod node_agent;
mod node_manifests;
mod node_plugin;
mod priority;
mod run;
mod scheduler;
mod sim_cli;
