//! Node registration as HAMi's scheduler reads it: the GPUs in
//! `hami.io/node-nvidia-register` (HAMi's JSON, `omitempty` quirks
//! included, via vgpu-hami), patched when it differs from what the node
//! carries (checked every `register_interval`, HAMi: 30 s), and the
//! `hami.io/node-handshake` reply: a scheduler's `Requesting_<stamp>` is
//! answered `Reported_<now>`.

use std::collections::BTreeMap;

use vgpu_hami::register::{self, GpuFacts, NodeDevice};
use vgpu_hami::{keys, Handshake, HandshakeState};

use crate::config::NodeConfig;
use crate::kube_api::{KubeApi, KubeError};
use crate::nvml::{self, GpuInfo};

/// The registration entries for `gpus` (`healthy[i]` per GPU).
pub fn node_devices(
    cfg: &NodeConfig,
    gpus: &[GpuInfo],
    healthy: &dyn Fn(u32) -> bool,
) -> Vec<NodeDevice> {
    gpus.iter()
        .map(|g| {
            NodeDevice::from_gpu(
                &GpuFacts {
                    uuid: &g.uuid,
                    index: g.index,
                    memory_bytes: g.memory_total,
                    model: &g.name,
                    numa: nvml::numa_node(&g.bus_id),
                    healthy: healthy(g.index),
                },
                &cfg.scaling(),
            )
        })
        .collect()
}

/// What one registration pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterOutcome {
    /// The register annotation was written.
    pub registered: bool,
    /// The handshake was answered.
    pub answered: bool,
}

/// One pass: writes the annotations that differ from the node's.
pub async fn register_once(
    kube: &KubeApi,
    devices: &[NodeDevice],
) -> Result<RegisterOutcome, KubeError> {
    let node = kube.node().await?;
    let annos = node.metadata.annotations.clone().unwrap_or_default();
    let want = register::encode(devices);
    let mut patch: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut out = RegisterOutcome::default();
    if annos.get(keys::NODE_REGISTER) != Some(&want) {
        patch.insert(keys::NODE_REGISTER.to_owned(), Some(want));
        out.registered = true;
    }
    if let Some(h) = annos.get(keys::NODE_HANDSHAKE) {
        if Handshake::parse(h).is_ok_and(|h| h.state == HandshakeState::Requesting) {
            let now = jiff::Zoned::now().datetime();
            patch.insert(
                keys::NODE_HANDSHAKE.to_owned(),
                Some(Handshake::reported(now).to_string()),
            );
            out.answered = true;
        }
    }
    if !patch.is_empty() {
        kube.patch_node_annotations(&patch, None).await?;
    }
    Ok(out)
}
