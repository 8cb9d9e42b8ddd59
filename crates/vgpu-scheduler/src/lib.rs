//! vgpu's cluster half: the Kubernetes scheduler extender (`filter`,
//! `prioritize`, `bind`) and the mutating admission webhook that decide
//! which node and which GPUs each container's slice lands on, and write
//! the assignment the node agent's `Allocate` reads. Speaks HAMi v2.10's
//! annotations, resources and node lock, so a cluster can move over
//! node by node (docs/scheduler.md).
//!
//! Modules, lowest first: [`quantity`], [`extender`] (wire types),
//! [`config`], [`request`] (what a pod asks for), [`inventory`] (what a
//! node offers), [`ledger`] (who holds what), [`fit`] (placement on one
//! node), [`assignment`] (placements as pod annotations), [`state`] (the
//! cluster picture), [`decide`] (the filter and prioritize answers),
//! [`webhook`] (admission), [`metrics`], [`scheduler`] (the shared
//! running parts), [`bind`] (node lock and binding), [`watch`] (keeping
//! the picture current), [`server`] (HTTP endpoints), [`run`] (starting
//! it all).

pub mod assignment;
pub mod bind;
pub mod config;
pub mod decide;
pub mod extender;
pub mod fit;
pub mod inventory;
pub mod ledger;
pub mod metrics;
pub mod quantity;
pub mod request;
pub mod run;
pub mod scheduler;
pub mod server;
pub mod state;
pub mod watch;
pub mod webhook;
