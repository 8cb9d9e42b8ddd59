//! Prepare planning without I/O: which shares a claim's allocation gives
//! this node (one per result of our driver in our pool, keyed by claim
//! UID, device and share ID), each share's limits, CDI device and the
//! devices the kubelet gets back; who uses each share (the claim's
//! reserving pods and their containers); the refusals (a claim that is not
//! the one asked for or not allocated, an unknown device, a container that
//! would get two shares, shares that do not fit their GPU); and the
//! checkpoint's records.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use vgpu_hami::ContainerDevice;
use vgpu_node::allocate::{self, AllocSettings};
use vgpu_node::layout;
use vgpu_region::limits::{Device as LimitDevice, DeviceLine, Limits};

use crate::cdi;
use crate::quantity;
use crate::slice::{self, GpuFacts, CORES, MEMORY};

/// A container that uses a share.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container: String,
}

/// One share of a GPU for one claim: its own budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// Region and limits directory name (`layout::dra_share_key`).
    pub key: String,
    /// Device name (`gpu-<index>`).
    pub device: String,
    /// The allocation's share ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The request's base name (`/subrequest` stripped).
    pub request: String,
    /// GPU UUID.
    pub uuid: String,
    /// Memory budget, bytes.
    pub memory: u64,
    /// SM share, percent; `None`: no SM limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// CDI device name.
    pub cdi_name: String,
    /// The containers that use it (sorted).
    #[serde(default)]
    pub owners: Vec<Owner>,
}

/// A device handed back to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// Request names.
    pub request_names: Vec<String>,
    /// Pool.
    pub pool_name: String,
    /// Device.
    pub device_name: String,
    /// Qualified CDI IDs.
    pub cdi_device_ids: Vec<String>,
    /// Share ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// Where a claim's preparation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Recorded before any file was written: a restart finds it and undoes
    /// whatever was written.
    PrepareStarted,
    /// Every file is in place.
    PrepareCompleted,
}

/// A claim as the checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    /// State.
    pub state: ClaimState,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Shares.
    pub shares: Vec<Share>,
    /// What the kubelet got.
    pub devices: Vec<PreparedDevice>,
}

/// Why a claim is refused (the kubelet shows the message in the pod's events).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Another claim under that name now.
    #[error("claim {name}: UID {found} is not the {wanted} the kubelet asked for (the claim was replaced)")]
    Uid {
        /// Claim name.
        name: String,
        /// UID found.
        found: String,
        /// UID asked for.
        wanted: String,
    },
    /// No allocation.
    #[error("claim {0} is not allocated")]
    NotAllocated(String),
    /// A device name we do not publish.
    #[error("claim {claim}: device {device} is not a GPU of this node")]
    UnknownDevice {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
    },
    /// A consumed capacity that is not a whole, in-range number.
    #[error("claim {claim}, device {device}: consumed {key} {value:?}: {why}")]
    Capacity {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Key.
        key: String,
        /// Value.
        value: String,
        /// Why.
        why: String,
    },
    /// A container would get two budgets whose edits collide.
    #[error("claim {claim}: container {container} of pod {pod} references {shares} vgpu shares (requests {requests}); each share is a separate budget and one container can hold one: give each container its own request (one device each)")]
    TwoShares {
        /// Claim.
        claim: String,
        /// Pod.
        pod: String,
        /// Container.
        container: String,
        /// How many.
        shares: usize,
        /// Which requests.
        requests: String,
    },
    /// Shares over a GPU's capacity.
    #[error("claim {claim}: the shares prepared on {device} would exceed it ({what}); refusing rather than over-committing")]
    Misfit {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// What overflows.
        what: String,
    },
}

/// What a plan needs besides the claim.
pub struct PlanInput<'a> {
    /// Driver name.
    pub driver: &'a str,
    /// Node (and pool) name.
    pub node: &'a str,
    /// The GPUs.
    pub gpus: &'a [GpuFacts],
    /// The Allocate settings (env and mounts come from the device plugin's
    /// function).
    pub alloc: &'a AllocSettings,
}

/// The request's base name: `gpu/sub` → `gpu`.
pub fn base_request(r: &str) -> &str {
    r.split_once('/').map_or(r, |(b, _)| b)
}

fn capacity(
    claim: &str,
    device: &str,
    consumed: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
) -> Result<Option<u64>, PlanError> {
    let Some(v) = consumed.and_then(|c| c.get(key)) else {
        return Ok(None);
    };
    quantity::parse_units(&v.0)
        .map(Some)
        .map_err(|e| PlanError::Capacity {
            claim: claim.into(),
            device: device.into(),
            key: key.into(),
            value: v.0.clone(),
            why: e.to_string(),
        })
}

/// The containers of `pod` that use `claim_name`, with the requests each
/// names (`None`: every request of the claim).
fn users(pod: &Pod, claim_name: &str) -> Vec<(String, Option<BTreeSet<String>>)> {
    let mut pod_names: BTreeSet<&str> = BTreeSet::new();
    if let Some(spec) = &pod.spec {
        for c in spec.resource_claims.iter().flatten() {
            if c.resource_claim_name.as_deref() == Some(claim_name) {
                pod_names.insert(&c.name);
            }
        }
    }
    let status = pod.status.as_ref();
    for s in status
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if s.resource_claim_name.as_deref() == Some(claim_name) {
            pod_names.insert(&s.name);
        }
    }
    let mut out: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    if let Some(spec) = &pod.spec {
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for c in all {
            for rc in c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .into_iter()
                .flatten()
            {
                if !pod_names.contains(rc.name.as_str()) {
                    continue;
                }
                let entry = out.entry(c.name.clone()).or_insert(Some(BTreeSet::new()));
                match rc.request.as_deref().filter(|r| !r.is_empty()) {
                    None => *entry = None,
                    Some(r) => {
                        if let Some(set) = entry {
                            set.insert(r.to_owned());
                        }
                    }
                }
            }
        }
    }
    // Extended resources backed by DRA (KEP-5004): the claim's requests
    // are mapped to containers in the pod's status.
    if let Some(ext) = status.and_then(|s| s.extended_resource_claim_status.as_ref()) {
        if ext.resource_claim_name == claim_name {
            for m in &ext.request_mappings {
                let entry = out
                    .entry(m.container_name.clone())
                    .or_insert(Some(BTreeSet::new()));
                if let Some(set) = entry {
                    set.insert(m.request_name.clone());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The claim's record for this node, or why not. `pods` are the pods in
/// its `reservedFor` (those that could be read).
pub fn plan_claim(
    input: &PlanInput,
    claim: &ResourceClaim,
    wanted_uid: &str,
    pods: &[Pod],
) -> Result<ClaimRecord, PlanError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != wanted_uid {
        return Err(PlanError::Uid {
            name,
            found,
            wanted: wanted_uid.into(),
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| PlanError::NotAllocated(format!("{namespace}/{name}")))?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .cloned()
        .unwrap_or_default();
    let mut shares: Vec<Share> = Vec::new();
    for r in results
        .iter()
        .filter(|r| r.driver == input.driver && r.pool == input.node)
    {
        let gpu = slice::parse_device_name(&r.device)
            .and_then(|i| input.gpus.iter().find(|g| g.index == i))
            .ok_or_else(|| PlanError::UnknownDevice {
                claim: name.clone(),
                device: r.device.clone(),
            })?;
        let consumed = r.consumed_capacity.as_ref();
        let full = slice::device_memory(gpu);
        let memory = capacity(&name, &r.device, consumed, MEMORY)?.unwrap_or(full);
        let cores = capacity(&name, &r.device, consumed, CORES)?;
        let cap_err = |key: &str, v: u64, why: &str| PlanError::Capacity {
            claim: name.clone(),
            device: r.device.clone(),
            key: key.into(),
            value: v.to_string(),
            why: why.into(),
        };
        if memory == 0 || memory > full {
            return Err(cap_err(
                MEMORY,
                memory,
                "outside 1 byte ..= the GPU's memory",
            ));
        }
        let cores = match cores {
            None | Some(100) => None,
            Some(c @ 1..=99) => Some(c as u32),
            Some(c) => return Err(cap_err(CORES, c, "outside 1..=100")),
        };
        let share_id = r.share_id.clone().filter(|s| !s.is_empty());
        shares.push(Share {
            key: layout::dra_share_key(wanted_uid, &r.device, share_id.as_deref()),
            device: r.device.clone(),
            request: base_request(&r.request).to_owned(),
            uuid: gpu.uuid.clone(),
            memory,
            cores,
            cdi_name: cdi::device_name(wanted_uid, &r.device, share_id.as_deref()),
            share_id,
            owners: Vec::new(),
        });
    }
    // Who uses which share; a container that would get two is refused.
    for pod in pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_ns = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        for (ctr, requests) in users(pod, &name) {
            let idx: Vec<usize> = shares
                .iter()
                .enumerate()
                .filter(|(_, s)| requests.as_ref().is_none_or(|set| set.contains(&s.request)))
                .map(|(i, _)| i)
                .collect();
            if idx.len() > 1 {
                let reqs: BTreeSet<&str> =
                    idx.iter().map(|&i| shares[i].request.as_str()).collect();
                return Err(PlanError::TwoShares {
                    claim: format!("{namespace}/{name}"),
                    pod: format!("{pod_ns}/{pod_name}"),
                    container: ctr,
                    shares: idx.len(),
                    requests: reqs.into_iter().collect::<Vec<_>>().join(","),
                });
            }
            if let Some(&i) = idx.first() {
                shares[i].owners.push(Owner {
                    namespace: pod_ns.clone(),
                    pod: pod_name.clone(),
                    pod_uid: pod_uid.clone(),
                    container: ctr,
                });
            }
        }
    }
    let devices = shares
        .iter()
        .map(|s| {
            let mut ids = vec![cdi::qualified(input.driver, &s.cdi_name)];
            if input.alloc.device_list.cdi_cri || input.alloc.device_list.cdi_annotations {
                ids.push(format!("{}={}", allocate::CDI_GPU_KIND, s.uuid));
            }
            PreparedDevice {
                request_names: vec![s.request.clone()],
                pool_name: input.node.to_owned(),
                device_name: s.device.clone(),
                cdi_device_ids: ids,
                share_id: s.share_id.clone(),
            }
        })
        .collect();
    for s in &mut shares {
        s.owners.sort();
        s.owners.dedup();
    }
    Ok(ClaimRecord {
        state: ClaimState::PrepareStarted,
        namespace,
        name,
        shares,
        devices,
    })
}

/// Checks that the shares of every prepared claim plus `new` fit their
/// GPUs: memory summed ≤ the GPU's (as published), SM shares with a limit
/// summed ≤ 100. The scheduler accounts the same way; this is the node's
/// last line of defence.
pub fn check_fit(
    prepared: &BTreeMap<String, ClaimRecord>,
    new_uid: &str,
    new: &ClaimRecord,
    gpus: &[GpuFacts],
) -> Result<(), PlanError> {
    let mut mem: BTreeMap<&str, u64> = BTreeMap::new();
    let mut cores: BTreeMap<&str, u64> = BTreeMap::new();
    let others = prepared
        .iter()
        .filter(|(u, _)| u.as_str() != new_uid)
        .flat_map(|(_, r)| &r.shares);
    for s in others.chain(&new.shares) {
        *mem.entry(&s.device).or_default() += s.memory;
        *cores.entry(&s.device).or_default() += u64::from(s.cores.unwrap_or(0));
    }
    for s in &new.shares {
        let Some(g) =
            slice::parse_device_name(&s.device).and_then(|i| gpus.iter().find(|g| g.index == i))
        else {
            continue;
        };
        let m = mem[s.device.as_str()];
        let c = cores[s.device.as_str()];
        let misfit = |what: String| PlanError::Misfit {
            claim: format!("{}/{}", new.namespace, new.name),
            device: s.device.clone(),
            what,
        };
        if m > slice::device_memory(g) {
            return Err(misfit(format!(
                "memory {} MiB of {} MiB",
                m >> 20,
                slice::device_memory(g) >> 20
            )));
        }
        if c > 100 {
            return Err(misfit(format!("cores {c} of 100")));
        }
    }
    Ok(())
}

/// A share's limits file: exactly its memory, its SM share when limited.
pub fn limits(share: &Share, alloc: &AllocSettings) -> Limits {
    Limits {
        devices: vec![DeviceLine {
            device: LimitDevice::Uuid(share.uuid.clone()),
            memory: Some(share.memory),
            sm: share.cores,
        }],
        policy: alloc.core_policy,
        priority: None,
        suspended: None,
        hold: None,
        // A share's cores are a fixed cap (the guarantee is the ceiling):
        // DRA shares take no part in lending yet (no board entry).
        ceilings: Vec::new(),
        board: None,
    }
}

/// A share's env and mounts, from the device plugin's function.
pub fn edits(share: &Share, alloc: &AllocSettings) -> allocate::Edits {
    let d = ContainerDevice::nvidia(
        share.uuid.clone(),
        u32::try_from(share.memory >> 20).unwrap_or(u32::MAX),
        share.cores.unwrap_or(100),
    );
    allocate::container_edits(alloc, &share.key, &[d], true)
}

/// The claim's CDI spec: one device per share.
pub fn cdi_spec(driver: &str, record: &ClaimRecord, alloc: &AllocSettings) -> cdi::Spec {
    cdi::Spec {
        cdi_version: cdi::CDI_VERSION.into(),
        kind: cdi::kind(driver),
        devices: record
            .shares
            .iter()
            .map(|s| {
                let e = edits(s, alloc);
                cdi::Device {
                    name: s.cdi_name.clone(),
                    container_edits: cdi::ContainerEdits::from_plugin(&e.envs, &e.mounts),
                }
            })
            .collect(),
        container_edits: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vgpu_node::config::DeviceListStrategies;
    use vgpu_node::layout::Layout;

    fn alloc() -> AllocSettings {
        AllocSettings {
            layout: Layout::new("/usr/local"),
            lib_path: "/usr/local/vgpu/libvgpu.so".into(),
            lock_dir: "/tmp/vgpulock".into(),
            broker_socket: None,
            log_level: None,
            core_policy: None,
            memory_scaling: 1.0,
            device_list: DeviceListStrategies::default(),
        }
    }

    fn gpus() -> Vec<GpuFacts> {
        vec![GpuFacts {
            index: 0,
            uuid: "GPU-a".into(),
            product_name: "X".into(),
            memory_total: (16 << 30) + 5,
            bus_id: String::new(),
            numa: None,
            compute_capability: None,
            driver_version: None,
            architecture: None,
        }]
    }

    /// A claim `c` (UID `u`) with `results` = (request, shareID, consumed).
    fn claim(results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn result(req: &str, share: &str, consumed: serde_json::Value) -> serde_json::Value {
        json!({"request": req, "driver": "vgpu.io", "pool": "n", "device": "gpu-0", "shareID": share, "consumedCapacity": consumed})
    }

    /// A pod whose containers reference the claim with these requests
    /// (`""`: the whole claim).
    fn pod(ctrs: &[(&str, &[&str])]) -> Pod {
        let containers: Vec<_> = ctrs
            .iter()
            .map(|(n, reqs)| json!({"name": n, "resources": {"claims": reqs.iter().map(|r| if r.is_empty() { json!({"name": "g"}) } else { json!({"name": "g", "request": r}) }).collect::<Vec<_>>()}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pu"},
            "spec": {"containers": containers, "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "c"}]},
        }))
        .unwrap()
    }

    fn input<'a>(a: &'a AllocSettings, g: &'a [GpuFacts]) -> PlanInput<'a> {
        PlanInput {
            driver: "vgpu.io",
            node: "n",
            gpus: g,
            alloc: a,
        }
    }

    #[test]
    fn shares_owners_and_refusals() {
        let (a, g) = (alloc(), gpus());
        let i = input(&a, &g);
        let c = claim(json!([
            result("r1", "s1", json!({"memory": "1Gi", "cores": "30"})),
            result("r2/sub", "s2", json!({"memory": "2Gi", "cores": "100"})),
            // Another driver's and another pool's results are not ours.
            {"request": "r3", "driver": "other", "pool": "n", "device": "gpu-0"},
            {"request": "r4", "driver": "vgpu.io", "pool": "m", "device": "gpu-0"},
        ]));
        // Two containers on r1 share its budget; r2's container has its own.
        let p = pod(&[("a", &["r1"]), ("b", &["r1"]), ("c", &["r2"])]);
        let r = plan_claim(&i, &c, "u", &[p]).unwrap();
        assert_eq!(r.shares.len(), 2);
        let owners = |k: usize| -> Vec<&str> {
            r.shares[k]
                .owners
                .iter()
                .map(|o| o.container.as_str())
                .collect()
        };
        assert_eq!(owners(0), ["a", "b"]);
        assert_eq!(owners(1), ["c"]);
        assert_eq!(r.shares[0].key, "dra_u_gpu-0_s1");
        assert_eq!((r.shares[0].memory, r.shares[0].cores), (1 << 30, Some(30)));
        assert_eq!((r.shares[1].memory, r.shares[1].cores), (2 << 30, None));
        assert_eq!(r.devices[1].request_names, ["r2"]);
        assert_eq!(r.devices[1].cdi_device_ids, ["vgpu.io/claim=u-gpu-0-s2"]);
        // The same claim planned again: the same IDs.
        let again = plan_claim(&i, &c, "u", &[pod(&[("a", &["r1"])])]).unwrap();
        assert_eq!(again.devices, r.devices);

        // A container on the whole claim, or on a request with two results.
        for p in [pod(&[("x", &[""])]), pod(&[("x", &["r1", "r2"])])] {
            let e = plan_claim(&i, &c, "u", &[p]).unwrap_err();
            assert!(matches!(e, PlanError::TwoShares { shares: 2, .. }), "{e}");
        }
        let count2 = claim(json!([
            result("r", "s1", json!({"memory": "1Gi"})),
            result("r", "s2", json!({"memory": "1Gi"})),
        ]));
        let e = plan_claim(&i, &count2, "u", &[pod(&[("x", &["r"])])]).unwrap_err();
        assert!(
            e.to_string()
                .contains("give each container its own request"),
            "{e}"
        );

        // No consumed capacity: the whole GPU as published (16 GiB).
        let whole =
            claim(json!([{"request": "r", "driver": "vgpu.io", "pool": "n", "device": "gpu-0"}]));
        let w = plan_claim(&i, &whole, "u", &[]).unwrap();
        assert_eq!((w.shares[0].memory, w.shares[0].cores), (16 << 30, None));
        assert_eq!(w.shares[0].key, "dra_u_gpu-0");
        assert_eq!(w.devices[0].share_id, None);

        // Refusals.
        assert!(matches!(
            plan_claim(&i, &c, "v", &[]),
            Err(PlanError::Uid { .. })
        ));
        let mut unalloc = c.clone();
        unalloc.status = None;
        assert!(matches!(
            plan_claim(&i, &unalloc, "u", &[]),
            Err(PlanError::NotAllocated(_))
        ));
        let bad_dev =
            claim(json!([{"request": "r", "driver": "vgpu.io", "pool": "n", "device": "gpu-7"}]));
        assert!(matches!(
            plan_claim(&i, &bad_dev, "u", &[]),
            Err(PlanError::UnknownDevice { .. })
        ));
        for consumed in [
            json!({"memory": "17Gi"}),
            json!({"memory": "0"}),
            json!({"cores": "101"}),
            json!({"memory": "1.5"}),
        ] {
            let c = claim(json!([result("r", "s", consumed.clone())]));
            assert!(
                matches!(
                    plan_claim(&i, &c, "u", &[]),
                    Err(PlanError::Capacity { .. })
                ),
                "{consumed}"
            );
        }
    }

    #[test]
    fn fit_counts_every_prepared_share() {
        let (a, g) = (alloc(), gpus());
        let i = input(&a, &g);
        let mk = |uid: &str, mem: &str, cores: &str| {
            let mut c = claim(json!([result(
                "r",
                &format!("s-{uid}"),
                json!({"memory": mem, "cores": cores})
            )]));
            c.metadata.uid = Some(uid.into());
            plan_claim(&i, &c, uid, &[]).unwrap()
        };
        let mut prepared = BTreeMap::new();
        prepared.insert("a".to_string(), mk("a", "8Gi", "50"));
        check_fit(&prepared, "b", &mk("b", "8Gi", "50"), &g).unwrap();
        let e = check_fit(&prepared, "b", &mk("b", "8193Mi", "10"), &g).unwrap_err();
        assert!(
            e.to_string().contains("memory 16385 MiB of 16384 MiB"),
            "{e}"
        );
        let e = check_fit(&prepared, "b", &mk("b", "1Gi", "51"), &g).unwrap_err();
        assert!(e.to_string().contains("cores 101"), "{e}");
        // Cores 100 is no SM limit: it does not count against the others.
        check_fit(&prepared, "b", &mk("b", "1Gi", "100"), &g).unwrap();
        // A claim prepared again is not counted twice.
        check_fit(&prepared, "a", &mk("a", "16Gi", "100"), &g).unwrap();
    }

    #[test]
    fn limits_and_edits_of_a_share() {
        let (a, g) = (alloc(), gpus());
        let c = claim(json!([result(
            "r",
            "s1",
            json!({"memory": "8000Mi", "cores": "30"})
        )]));
        let r = plan_claim(&input(&a, &g), &c, "u", &[]).unwrap();
        let s = &r.shares[0];
        assert_eq!(
            limits(s, &a).render(),
            format!(
                "vgpu-limits 1\ndevice GPU-a memory={} sm=30\n",
                8000u64 << 20
            )
        );
        let e = edits(s, &a);
        assert_eq!(e.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "8000m");
        assert_eq!(e.envs["CUDA_DEVICE_SM_LIMIT"], "30");
        assert_eq!(e.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
        let spec = cdi_spec("vgpu.io", &r, &a);
        spec.validate().unwrap();
        assert_eq!(spec.devices[0].name, "u-gpu-0-s1");
        // The device plugin's function: the same mounts, in its order.
        let cps: Vec<&str> = spec.devices[0]
            .container_edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(
            cps,
            [
                "/usr/local/vgpu/libvgpu.so",
                "/usr/local/vgpu/libvgpu_core.so",
                "/usr/local/vgpu",
                "/tmp/vgpu",
                "/etc/vgpu",
                "/tmp/vgpulock",
                "/etc/ld.so.preload",
            ]
        );
        assert_eq!(base_request("gpu/small"), "gpu");
        assert_eq!(base_request("gpu"), "gpu");
    }
}
