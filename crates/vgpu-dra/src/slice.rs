//! The node's ResourceSlice, built without I/O: one device per GPU
//! (`gpu-<index>`) that several claims may share
//! (`allowMultipleAllocations`), with a `memory` capacity (bytes rounded
//! down to 1 Mi, requests in 1 Mi steps, default the whole GPU) and a
//! `cores` capacity (100, steps of 1, default 100), and what NVML tells of
//! the GPU as attributes; plus the API server's validation of a capacity's
//! request policy, and the check that the server kept the
//! consumable-capacity fields (a server with `DRAConsumableCapacity` off
//! drops them silently).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::quantity::{self, Quantity, MI};

/// Capacity key of device memory (bytes).
pub const MEMORY: &str = "memory";
/// Capacity key of the SM share (percent).
pub const CORES: &str = "cores";
/// The standard attribute of a device's NUMA node.
pub const NUMA_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// What the slice says of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFacts {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Product name.
    pub product_name: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// PCI bus ID, when known.
    pub bus_id: String,
    /// NUMA node, when known.
    pub numa: Option<i64>,
    /// CUDA compute capability (major, minor), when known.
    pub compute_capability: Option<(u32, u32)>,
    /// Driver version, when known.
    pub driver_version: Option<String>,
    /// Architecture name, when known.
    pub architecture: Option<String>,
}

/// The device name of GPU `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index a device name names.
pub fn parse_device_name(name: &str) -> Option<u32> {
    let n = name.strip_prefix("gpu-")?;
    (!n.starts_with('+') && (n == "0" || !n.starts_with('0')))
        .then(|| n.parse().ok())
        .flatten()
}

/// The architecture NVIDIA names for a compute capability major version.
pub fn architecture_of(cc: (u32, u32)) -> Option<&'static str> {
    Some(match cc {
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0) | (7, 2) => "Volta",
        (7, 5) => "Turing",
        (8, 0) | (8, 6) | (8, 7) => "Ampere",
        (8, 9) => "Ada Lovelace",
        (9, 0) => "Hopper",
        (10, _) | (12, _) => "Blackwell",
        _ => return None,
    })
}

/// A driver version as a semantic version (`550.54.15`, `535.104.05` →
/// `535.104.5`, `550.54` → `550.54.0`); `None` when it is not numeric.
pub fn semver(v: &str) -> Option<String> {
    let parts: Vec<u64> = v
        .trim()
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [a] => Some(format!("{a}.0.0")),
        [a, b] => Some(format!("{a}.{b}.0")),
        [a, b, c] => Some(format!("{a}.{b}.{c}")),
        _ => None,
    }
}

fn q(s: impl Into<String>) -> KQuantity {
    KQuantity(s.into())
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn version(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(s.into()),
        ..Default::default()
    }
}

/// The slice device of one GPU.
pub fn device(g: &GpuFacts) -> Device {
    let mem = quantity::format_mi(quantity::round_down_mi(g.memory_total));
    let mut attributes = BTreeMap::new();
    attributes.insert("uuid".to_owned(), string(&g.uuid));
    attributes.insert("productName".to_owned(), string(&g.product_name));
    let arch = g.architecture.clone().or_else(|| {
        g.compute_capability
            .and_then(architecture_of)
            .map(str::to_owned)
    });
    if let Some(a) = arch {
        attributes.insert("architecture".to_owned(), string(a));
    }
    if let Some((ma, mi)) = g.compute_capability {
        attributes.insert(
            "cudaComputeCapability".to_owned(),
            version(format!("{ma}.{mi}.0")),
        );
    }
    if let Some(v) = g.driver_version.as_deref().and_then(semver) {
        attributes.insert("driverVersion".to_owned(), version(v));
    }
    if !g.bus_id.is_empty() {
        attributes.insert("pcieBusID".to_owned(), string(g.bus_id.to_lowercase()));
    }
    if let Some(n) = g.numa {
        attributes.insert(
            NUMA_ATTRIBUTE.to_owned(),
            DeviceAttribute {
                int: Some(n),
                ..Default::default()
            },
        );
    }
    let mut capacity = BTreeMap::new();
    capacity.insert(
        MEMORY.to_owned(),
        DeviceCapacity {
            value: q(&mem),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q(&mem)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("1Mi"),
                    step: Some(q("1Mi")),
                    max: Some(q(&mem)),
                }),
                valid_values: None,
            }),
        },
    );
    capacity.insert(
        CORES.to_owned(),
        DeviceCapacity {
            value: q("100"),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("100")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("1"),
                    step: Some(q("1")),
                    max: Some(q("100")),
                }),
                valid_values: None,
            }),
        },
    );
    Device {
        name: device_name(g.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// The slice's object name: `<node>-<driver>` (both DNS subdomains).
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{}", driver.replace('/', "-"))
}

/// The node's slice: pool = node name, owned by the Node (it goes with it).
pub fn build(
    driver: &str,
    node: &str,
    node_uid: &str,
    generation: i64,
    gpus: &[GpuFacts],
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node, driver)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: node_uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

/// Why a capacity's request policy is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// A quantity that does not parse.
    #[error("device {device}, capacity {key}: {source}")]
    Quantity {
        /// Device.
        device: String,
        /// Capacity key.
        key: String,
        /// Why.
        #[source]
        source: quantity::QuantityError,
    },
    /// A rule of the API server's validation broken.
    #[error("device {device}, capacity {key}: {rule}")]
    Rule {
        /// Device.
        device: String,
        /// Capacity key.
        key: String,
        /// Which rule.
        rule: String,
    },
    /// The API server kept the slice without a consumable-capacity field.
    #[error("the API server dropped consumable-capacity fields of device {device} ({what}): enable the DRAConsumableCapacity feature gate on kube-apiserver, kube-scheduler and kube-controller-manager (Kubernetes 1.34/1.35; on by default from 1.36)")]
    Dropped {
        /// Device.
        device: String,
        /// What is missing.
        what: String,
    },
}

/// The API server's checks of each capacity's `validRange` (K
/// `validateRequestPolicyRange`): min ≤ default ≤ max ≤ value,
/// min + step ≤ value, default and max whole steps above min.
pub fn validate(device: &Device) -> Result<(), SliceError> {
    for (key, cap) in device.capacity.iter().flatten() {
        let p = |s: &KQuantity| {
            Quantity::parse(&s.0).map_err(|source| SliceError::Quantity {
                device: device.name.clone(),
                key: key.clone(),
                source,
            })
        };
        let rule = |r: &str| SliceError::Rule {
            device: device.name.clone(),
            key: key.clone(),
            rule: r.to_owned(),
        };
        let value = p(&cap.value)?;
        let Some(policy) = &cap.request_policy else {
            continue;
        };
        let Some(range) = &policy.valid_range else {
            continue;
        };
        let min = p(&range.min)?;
        let max = range.max.as_ref().map(p).transpose()?;
        let step = range.step.as_ref().map(p).transpose()?;
        let default = policy.default.as_ref().map(p).transpose()?;
        if min.0 < 0 {
            return Err(rule("min must not be negative"));
        }
        if min > value {
            return Err(rule("min must not exceed the value"));
        }
        if let Some(m) = max {
            if m > value {
                return Err(rule("max must not exceed the value"));
            }
            if m < min {
                return Err(rule("max must not be below min"));
            }
        }
        if let Some(d) = default {
            if d < min || max.is_some_and(|m| d > m) || d > value {
                return Err(rule("default must be within [min, max]"));
            }
        }
        if let Some(s) = step {
            if s.0 <= 0 {
                return Err(rule("step must be positive"));
            }
            if Quantity(min.0 + s.0) > value {
                return Err(rule("min + step must not exceed the value"));
            }
            for (what, v) in [("default", default), ("max", max)] {
                if let Some(v) = v {
                    if (v.0 - min.0) % s.0 != 0 {
                        return Err(rule(&format!(
                            "{what} must be min plus a whole number of steps"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks that the slice as the API server stored it still carries what
/// consumable capacity needs (`allowMultipleAllocations`, each capacity's
/// `requestPolicy`).
pub fn check_kept(stored: &ResourceSlice) -> Result<(), SliceError> {
    for d in stored.spec.devices.iter().flatten() {
        if d.allow_multiple_allocations != Some(true) {
            return Err(SliceError::Dropped {
                device: d.name.clone(),
                what: "allowMultipleAllocations".into(),
            });
        }
        for key in [MEMORY, CORES] {
            let kept = d
                .capacity
                .as_ref()
                .and_then(|c| c.get(key))
                .is_some_and(|c| c.request_policy.is_some());
            if !kept {
                return Err(SliceError::Dropped {
                    device: d.name.clone(),
                    what: format!("capacity {key} requestPolicy"),
                });
            }
        }
    }
    Ok(())
}

/// Whether two slices publish the same thing (ignoring generation and
/// server-set metadata). Quantities compare by value: the API server hands
/// back the canonical form (`80Gi` for the `81920Mi` written), and a slice
/// rewritten for that alone bumps the pool generation for nothing.
pub fn same_content(a: &ResourceSlice, b: &ResourceSlice) -> bool {
    comparable(&a.spec) == comparable(&b.spec)
}

/// `spec` without its generation, each quantity in one form (nano-units).
fn comparable(spec: &ResourceSliceSpec) -> ResourceSliceSpec {
    // One that does not parse stays as written: equal only to itself.
    fn canonical(q: &mut KQuantity) {
        if let Ok(v) = Quantity::parse(&q.0) {
            q.0 = format!("{}n", v.0);
        }
    }
    let mut spec = spec.clone();
    spec.pool.generation = 0;
    for set in spec.shared_counters.iter_mut().flatten() {
        set.counters
            .values_mut()
            .for_each(|c| canonical(&mut c.value));
    }
    for d in spec.devices.iter_mut().flatten() {
        for used in d.consumes_counters.iter_mut().flatten() {
            used.counters
                .values_mut()
                .for_each(|c| canonical(&mut c.value));
        }
        for cap in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            canonical(&mut cap.value);
            let Some(policy) = &mut cap.request_policy else {
                continue;
            };
            policy.default.iter_mut().for_each(canonical);
            policy.valid_values.iter_mut().flatten().for_each(canonical);
            if let Some(range) = &mut policy.valid_range {
                canonical(&mut range.min);
                range.step.iter_mut().for_each(canonical);
                range.max.iter_mut().for_each(canonical);
            }
        }
    }
    spec
}

/// The memory a slice device offers, bytes.
pub fn device_memory(g: &GpuFacts) -> u64 {
    quantity::round_down_mi(g.memory_total).max(MI)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn a100() -> GpuFacts {
        GpuFacts {
            index: 0,
            uuid: "GPU-4617e643-f070-4b90-b715-30c57f977a9a".into(),
            product_name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total: (80 << 30) + 4095,
            bus_id: "00000000:3B:00.0".into(),
            numa: Some(1),
            compute_capability: Some((8, 0)),
            driver_version: Some("535.104.05".into()),
            architecture: None,
        }
    }

    #[test]
    fn device_of_a_gpu() {
        let d = device(&a100());
        assert_eq!(d.name, "gpu-0");
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["capacity"]["memory"]["value"], "81920Mi");
        assert_eq!(
            v["capacity"]["memory"]["requestPolicy"],
            serde_json::json!({"default": "81920Mi", "validRange": {"min": "1Mi", "step": "1Mi", "max": "81920Mi"}})
        );
        assert_eq!(
            v["capacity"]["cores"]["requestPolicy"],
            serde_json::json!({"default": "100", "validRange": {"min": "1", "step": "1", "max": "100"}})
        );
        assert_eq!(v["attributes"]["architecture"]["string"], "Ampere");
        assert_eq!(v["attributes"]["cudaComputeCapability"]["version"], "8.0.0");
        assert_eq!(v["attributes"]["driverVersion"]["version"], "535.104.5");
        assert_eq!(v["attributes"]["pcieBusID"]["string"], "00000000:3b:00.0");
        assert_eq!(v["attributes"][NUMA_ATTRIBUTE]["int"], 1);
        validate(&d).unwrap();
        let mut bare = a100();
        bare.compute_capability = None;
        bare.driver_version = None;
        bare.numa = None;
        bare.bus_id.clear();
        let b = serde_json::to_value(device(&bare)).unwrap();
        let keys: Vec<&String> = b["attributes"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["productName", "uuid"]);
    }

    #[test]
    fn odd_memory_sizes_still_validate() {
        // Any size rounds down to whole Mi, so every rule holds.
        for mem in [(1 << 20) * 2, (24 << 30) - 1, 40 << 30, (141 << 30) + 77] {
            let g = GpuFacts {
                memory_total: mem,
                ..a100()
            };
            validate(&device(&g)).unwrap_or_else(|e| panic!("{mem}: {e}"));
        }
    }

    #[test]
    fn validation_rules() {
        let base = device(&a100());
        let with = |key: &str, f: &dyn Fn(&mut DeviceCapacity)| {
            let mut d = base.clone();
            f(d.capacity.as_mut().unwrap().get_mut(key).unwrap());
            validate(&d)
        };
        fn range(c: &mut DeviceCapacity) -> &mut CapacityRequestPolicyRange {
            c.request_policy
                .as_mut()
                .unwrap()
                .valid_range
                .as_mut()
                .unwrap()
        }
        type Edit = Box<dyn Fn(&mut DeviceCapacity)>;
        let bad: Vec<(&str, Edit, &str)> = vec![
            (
                "memory",
                Box::new(|c| c.value = q("81919.5Mi")),
                "max must not exceed",
            ),
            (
                "cores",
                Box::new(|c| range(c).min = q("101")),
                "min must not exceed",
            ),
            ("cores", Box::new(|c| range(c).min = q("100")), "min + step"),
            (
                "cores",
                Box::new(|c| c.request_policy.as_mut().unwrap().default = Some(q("0"))),
                "default",
            ),
            (
                "cores",
                Box::new(|c| range(c).step = Some(q("7"))),
                "default must be min plus",
            ),
            (
                "memory",
                Box::new(|c| range(c).max = Some(q("0"))),
                "max must not be below",
            ),
            (
                "memory",
                Box::new(|c| range(c).step = Some(q("0"))),
                "step must be positive",
            ),
        ];
        for (key, f, want) in bad {
            let e = with(key, &*f).unwrap_err().to_string();
            assert!(e.contains(want), "{key}: {e} (wanted {want})");
        }
        // A step that divides: 2 .. 100 by 2 from min 0.
        with("cores", &|c| {
            range(c).min = q("0");
            range(c).step = Some(q("2"));
        })
        .unwrap();
    }

    #[test]
    fn dropped_fields_are_seen() {
        let s = build("vgpu.io", "n1", "uid", 1, &[a100()]);
        check_kept(&s).unwrap();
        let mut dropped = s.clone();
        for d in dropped.spec.devices.as_mut().unwrap() {
            d.allow_multiple_allocations = None;
        }
        let e = check_kept(&dropped).unwrap_err().to_string();
        assert!(e.contains("allowMultipleAllocations"), "{e}");
        let mut dropped = s.clone();
        for d in dropped.spec.devices.as_mut().unwrap() {
            for c in d.capacity.as_mut().unwrap().values_mut() {
                c.request_policy = None;
            }
        }
        assert!(check_kept(&dropped).is_err());
        let mut g2 = s.clone();
        g2.spec.pool.generation = 7;
        assert!(same_content(&s, &g2));
        let other = build(
            "vgpu.io",
            "n1",
            "uid",
            1,
            &[GpuFacts { index: 1, ..a100() }],
        );
        assert!(!same_content(&s, &other));
    }

    /// The slice as the API server returns it: each quantity in canonical
    /// form (`81920Mi` reads back as `80Gi`).
    fn as_stored(s: &ResourceSlice, forms: &[(&str, &str)]) -> ResourceSlice {
        let mut v = serde_json::to_value(s).unwrap();
        fn walk(v: &mut serde_json::Value, forms: &[(&str, &str)]) {
            match v {
                serde_json::Value::String(x) => {
                    if let Some((_, to)) = forms.iter().find(|(from, _)| from == x) {
                        *x = (*to).to_owned();
                    }
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(|v| walk(v, forms)),
                serde_json::Value::Object(o) => o.values_mut().for_each(|v| walk(v, forms)),
                _ => {}
            }
        }
        walk(&mut v["spec"]["devices"], forms);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn canonical_quantities_are_the_same_content() {
        let s = build("vgpu.io", "n1", "uid", 1, &[a100()]);
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            json.contains("81920Mi") && json.contains("\"1Mi\""),
            "{json}"
        );
        // What kube-apiserver stores, and other spellings of the same values.
        for forms in [
            &[("81920Mi", "80Gi")][..],
            &[("81920Mi", "80Gi"), ("1Mi", "1048576")],
            &[("100", "100"), ("1", "1")],
            &[
                ("1Mi", "1024Ki"),
                ("100", "0.1k"),
                ("81920Mi", "85899345920"),
            ],
        ] {
            let mut stored = as_stored(&s, forms);
            stored.spec.pool.generation = 4;
            assert!(same_content(&stored, &s), "{forms:?}");
            assert!(same_content(&s, &stored), "{forms:?}");
        }
        // A different value is a change, whatever its form.
        for forms in [
            &[("81920Mi", "79Gi")][..],
            &[("1Mi", "1048575")],
            &[("100", "99")],
            &[("1", "2")],
            &[("81920Mi", "80G")],
            &[("1Mi", "not-a-quantity")],
        ] {
            let stored = as_stored(&s, forms);
            assert!(!same_content(&stored, &s), "{forms:?}");
        }
        // A GPU with less memory is a change.
        let smaller = build(
            "vgpu.io",
            "n1",
            "uid",
            1,
            &[GpuFacts {
                memory_total: 40 << 30,
                ..a100()
            }],
        );
        assert!(!same_content(
            &as_stored(&s, &[("81920Mi", "80Gi")]),
            &smaller
        ));
        // An attribute that changed is a change.
        let mut other_driver = a100();
        other_driver.driver_version = Some("550.54.15".into());
        let newer = build("vgpu.io", "n1", "uid", 1, &[other_driver]);
        assert!(!same_content(
            &as_stored(&s, &[("81920Mi", "80Gi")]),
            &newer
        ));
    }

    #[test]
    fn names() {
        assert_eq!(parse_device_name("gpu-0"), Some(0));
        assert_eq!(parse_device_name("gpu-12"), Some(12));
        assert_eq!(parse_device_name("gpu-01"), None);
        assert_eq!(parse_device_name("gpu-+1"), None);
        assert_eq!(parse_device_name("cpu-1"), None);
        assert_eq!(slice_name("node-a", "vgpu.io"), "node-a-vgpu.io");
        assert_eq!(semver("550.54"), Some("550.54.0".into()));
        assert_eq!(semver("x.1"), None);
    }
}
