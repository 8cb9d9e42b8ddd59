//! A placement as the pod's annotations carry it, both ways: what the
//! binder writes (`hami.io/vgpu-node`, `vgpu-time`,
//! `vgpu-devices-to-allocate`, `vgpu-devices-allocated`) and which pods
//! hold GPUs, read back from those annotations (how usage is rebuilt after
//! a restart). The list format is `vgpu-hami`'s; this module only maps it
//! to the ledger.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use vgpu_hami::{keys, ContainerDevice, DeviceListError, PodDevices};

use crate::ledger::{AssignedDevice, Assignment, PodUsage};

/// The device-list annotation value for `assignment`.
pub fn encode(assignment: &Assignment) -> Result<String, DeviceListError> {
    PodDevices {
        containers: assignment
            .iter()
            .map(|c| {
                c.iter()
                    .map(|d| {
                        // Memory comes from an int32 register field: it fits.
                        let mem = u32::try_from(d.memory_mib).unwrap_or(i32::MAX as u32);
                        ContainerDevice::nvidia(d.uuid.clone(), mem, d.cores)
                    })
                    .collect()
            })
            .collect(),
    }
    .encode()
}

/// The annotations a bind writes (the label `hami.io/vgpu-node` too).
pub fn bind_annotations(
    node: &str,
    assignment: &Assignment,
    unix_now: i64,
) -> Result<BTreeMap<String, String>, DeviceListError> {
    let list = encode(assignment)?;
    let now = unix_now.to_string();
    Ok(BTreeMap::from([
        (keys::ASSIGNED_NODE.to_owned(), node.to_owned()),
        (keys::ASSIGNED_TIME.to_owned(), now.clone()),
        (keys::DEVICES_TO_ALLOCATE.to_owned(), list.clone()),
        (keys::DEVICES_ALLOCATED.to_owned(), list),
        (
            keys::BIND_PHASE.to_owned(),
            vgpu_hami::BindPhase::Allocating.as_str().to_owned(),
        ),
        (keys::BIND_TIME.to_owned(), now),
    ]))
}

/// Whether a pod no longer holds anything (it finished).
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// The GPUs a pod holds, from its annotations: `None` when it holds none
/// (not assigned, finished), an error when its device list is unreadable.
pub fn pod_usage(pod: &Pod) -> Option<Result<(String, PodUsage), String>> {
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref()?;
    let node = annotations.get(keys::ASSIGNED_NODE)?;
    let list = annotations.get(keys::DEVICES_ALLOCATED)?;
    if is_finished(pod) {
        return None;
    }
    let uid = meta.uid.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let devices = match PodDevices::parse(list) {
        Ok(d) => d,
        Err(e) => {
            return Some(Err(format!(
                "pod {namespace}/{name}: {}: {e}",
                keys::DEVICES_ALLOCATED
            )))
        }
    };
    let containers: Assignment = devices
        .containers
        .into_iter()
        .map(|c| {
            c.into_iter()
                .filter(|d| d.device_type == keys::NVIDIA)
                .map(|d| AssignedDevice {
                    uuid: d.uuid,
                    memory_mib: u64::from(d.mem_mib),
                    cores: d.cores,
                })
                .collect()
        })
        .collect();
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len);
    Some(Ok((
        uid,
        PodUsage::new(namespace, name, node.clone(), containers, inits),
    )))
}
