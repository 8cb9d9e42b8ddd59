//! vgpu's DRA driver (`vgpu node --mode dra|both`, docs/dra.md): a kubelet
//! plugin that publishes each GPU as a device several claims share through
//! consumable capacity (`memory`, `cores`), and prepares each share of a
//! claim as the device plugin prepares a container — a read-only limits
//! file with exactly the share's memory and SM share, a region directory
//! the monitor, watchdog and GC know, HAMi's env and vgpu's mounts — handed
//! to the runtime as a transient CDI spec per claim.
//!
//! - [`proto`]: the generated kubelet APIs;
//! - [`quantity`]: exact Kubernetes quantities, the allocator's rounding;
//! - [`slice`]: the ResourceSlice (pure), its validation, the dropped-field check;
//! - [`cdi`]: CDI spec types and names;
//! - [`plan`]: prepare planning (pure): shares, users, refusals, fit, limits, edits;
//! - [`driver`]: node state, checkpoint, prepare/unprepare with files;
//! - [`authority`]: the kubelet's socket-path `:authority`, rewritten for h2;
//! - [`server`]: the registration and DRA gRPC services on Unix sockets;
//! - [`publisher`]: the ResourceSlice kept in the API server.
//!
//! Each module imports only modules listed above it (pure ones first, I/O
//! last); [`run`] wires them into the agent.

pub mod authority;
pub mod cdi;
pub mod driver;
pub mod plan;
pub mod proto;
pub mod publisher;
pub mod quantity;
pub mod server;
pub mod slice;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use vgpu_node::agent::AgentContext;
use vgpu_node::allocate::AllocSettings;
use vgpu_node::nvml::{self, Gpus};

pub use driver::DriverConfig;

/// The `vgpu node` flags of DRA mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraFlags {
    /// `--dra-driver-name`.
    pub driver: String,
    /// `--dra-registry-dir`.
    pub registry_dir: PathBuf,
    /// `--dra-plugin-dir` (default `/var/lib/kubelet/plugins/<driver>`).
    pub plugin_dir: Option<PathBuf>,
    /// `--cdi-dir`.
    pub cdi_dir: PathBuf,
}

/// The default driver name.
pub const DEFAULT_DRIVER: &str = "vgpu.io";
/// The kubelet's plugin registry.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The kubelet's plugin directory root.
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// Dynamic CDI specs.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

impl DraFlags {
    /// The driver's settings on `node` with the agent's Allocate settings.
    pub fn config(&self, node: &str, alloc: AllocSettings) -> DriverConfig {
        DriverConfig {
            driver: self.driver.clone(),
            node: node.to_owned(),
            registry_dir: self.registry_dir.clone(),
            plugin_dir: self
                .plugin_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(PLUGINS_DIR).join(&self.driver)),
            cdi_dir: self.cdi_dir.clone(),
            alloc,
        }
    }
}

/// What NVML tells of the GPUs, as the slice says it.
pub fn gpu_facts(gpus: &dyn Gpus) -> Vec<slice::GpuFacts> {
    let driver_version = gpus.driver_version();
    gpus.devices()
        .unwrap_or_default()
        .into_iter()
        .map(|g| slice::GpuFacts {
            compute_capability: gpus.compute_capability(g.index),
            numa: nvml::numa_node(&g.bus_id),
            index: g.index,
            uuid: g.uuid,
            product_name: g.name,
            memory_total: g.memory_total,
            bus_id: g.bus_id,
            driver_version: driver_version.clone(),
            architecture: None,
        })
        .collect()
}

/// Runs the DRA driver in the agent until shutdown: node state (the
/// checkpoint recovered), the ResourceSlice publisher, the sockets.
pub async fn run(ctx: AgentContext, flags: DraFlags) -> Result<(), String> {
    let cfg = flags.config(&ctx.cfg.node_name, AllocSettings::from_config(&ctx.cfg));
    let g1 = ctx.gpus.clone();
    let d = driver::Driver::open(
        cfg.clone(),
        ctx.client.clone(),
        Box::new(move || gpu_facts(g1.as_ref())),
        ctx.dra_shares.clone(),
    )
    .map_err(|e| format!("DRA driver: {e}"))?;
    let d = Arc::new(d);
    let g2 = ctx.gpus.clone();
    let publisher = publisher::Publisher {
        client: ctx.client.clone(),
        driver: cfg.driver.clone(),
        node: cfg.node.clone(),
        gpus: Box::new(move || gpu_facts(g2.as_ref())),
        period: Duration::from_secs(30),
    };
    tokio::spawn(publisher.run(ctx.shutdown.clone()));
    server::serve(d, ctx.stats.clone(), ctx.shutdown.clone(), |sock| {
        println!("vgpu node: dra plugin on {}", sock.display());
        use std::io::Write;
        let _ = std::io::stdout().flush();
    })
    .await
    .map_err(|e| format!("DRA driver: {e}"))
}
