//! Node registration as HAMi's scheduler reads it: the GPUs in
//! `hami.io/node-nvidia-register` (HAMi's JSON, `omitempty` quirks
//! included, via vgpu-hami), patched when it differs from what the node
//! carries (checked every `register_interval`, HAMi: 30 s, and at once when
//! the devices change). Nothing else of the node is written: the
//! `hami.io/node-handshake` belongs to the scheduler, as in HAMi v2.10,
//! whose device plugin never answers it. A `Reported_` answer would make
//! HAMi's scheduler (and vgpu's) write `Requesting_` again on its next
//! cycle, for ever: two Node writes per cycle per node for nothing.

use std::collections::BTreeMap;

use vgpu_hami::keys;
use vgpu_hami::register::{self, GpuFacts, NodeDevice};

use crate::config::NodeConfig;
use crate::kube_api::{KubeApi, KubeError};
use crate::plugin::DeviceSet;

/// The registration entries for `set`. An unknown NUMA node registers as
/// 0, as HAMi's plugin does (the JSON has no "unknown"; `numa-bind` then
/// sees one node, which is the truth on a machine sysfs calls single-node).
pub fn node_devices(cfg: &NodeConfig, set: &DeviceSet) -> Vec<NodeDevice> {
    set.gpus
        .iter()
        .zip(&set.healthy)
        .map(|(g, ok)| {
            NodeDevice::from_gpu(
                &GpuFacts {
                    uuid: &g.uuid,
                    index: g.index,
                    memory_bytes: g.memory_total,
                    model: &g.name,
                    numa: g.numa.unwrap_or(0),
                    healthy: *ok,
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
}

/// One pass: reads the node and writes the register annotation only when
/// it differs from `devices`.
pub async fn register_once(
    kube: &KubeApi,
    devices: &[NodeDevice],
) -> Result<RegisterOutcome, KubeError> {
    let node = kube.node().await?;
    let want = register::encode(devices);
    let have = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::NODE_REGISTER));
    if have == Some(&want) {
        return Ok(RegisterOutcome::default());
    }
    let patch = BTreeMap::from([(keys::NODE_REGISTER.to_owned(), Some(want))]);
    kube.patch_node_annotations(&patch, None).await?;
    Ok(RegisterOutcome { registered: true })
}
