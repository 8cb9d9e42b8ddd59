//! HAMi's Kubernetes contract (HAMi v2.10.0), as pure codecs.
//!
//! Owns the names and value formats that HAMi's scheduler, device plugin
//! and monitor exchange through the Kubernetes API, so vgpu's node agent and
//! scheduler speak them byte for byte and a cluster can move from HAMi node
//! by node:
//!
//! - [`keys`]: annotation and label keys, env names, device type words;
//! - [`resources`]: extended resource names;
//! - [`devices`]: the pod device list (`UUID,NVIDIA,MemMiB,Cores:` per
//!   device, `;` per container, init containers first) and device IDs;
//! - [`register`]: the node registration JSON (`hami.io/node-nvidia-register`,
//!   Go `encoding/json` output including its `omitempty` and HTML escaping)
//!   and the pre-v2.8 colon form (decode only);
//! - [`lock`]: the node lock value (`<RFC3339>,<namespace>,<pod>`, legacy bare
//!   RFC 3339);
//! - [`handshake`]: `Requesting_<2006-01-02 15:04:05>` / `Reported_...`;
//! - [`phase`]: the bind phase.
//!
//! Never does I/O, never reads the clock (callers pass the time in), never
//! panics on input: every decoder returns its module's error.

pub mod devices;
pub mod fuzz_checks;
pub mod handshake;
pub mod keys;
pub mod lock;
pub mod phase;
pub mod register;
pub mod resources;

pub use devices::{ContainerDevice, ContainerSlot, DeviceListError, PodDevices};
pub use handshake::{Handshake, HandshakeError, HandshakeState};
pub use lock::{LockError, LockOwner, NodeLock};
pub use phase::{BindPhase, PhaseError};
pub use register::{MigPlacement, MigProfile, NodeDevice, RegisterError};
