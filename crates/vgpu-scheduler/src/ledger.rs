//! Device bookkeeping: which pod holds what on which GPU, and the totals
//! per GPU that placement reads.
//!
//! A pod's containers are recorded as assigned (init containers first,
//! as in the device-list annotation); the totals use the pod's effective
//! footprint: init containers run one at a time, so per GPU a pod takes
//! the larger of its biggest init container and the sum of its app
//! containers. Owns only arithmetic on that state; it never reads
//! annotations or the API server, and never goes negative.

use std::collections::HashMap;

/// Use of one GPU: vGPU slots taken, MiB and core percent promised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    pub slots: u32,
    pub memory_mib: u64,
    pub cores: u32,
}

impl DeviceUsage {
    fn add(&mut self, other: &DeviceUsage) {
        self.slots = self.slots.saturating_add(other.slots);
        self.memory_mib = self.memory_mib.saturating_add(other.memory_mib);
        self.cores = self.cores.saturating_add(other.cores);
    }

    fn sub(&mut self, other: &DeviceUsage) {
        self.slots = self.slots.saturating_sub(other.slots);
        self.memory_mib = self.memory_mib.saturating_sub(other.memory_mib);
        self.cores = self.cores.saturating_sub(other.cores);
    }

    pub fn is_zero(&self) -> bool {
        *self == DeviceUsage::default()
    }
}

/// One GPU given to one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedDevice {
    pub uuid: String,
    pub memory_mib: u64,
    pub cores: u32,
}

/// Per container (init containers first), the GPUs it was given; a
/// container without GPUs has an empty entry.
pub type Assignment = Vec<Vec<AssignedDevice>>;

/// The per-GPU footprint of a whole pod, sorted by UUID.
pub fn effective_usage(
    assignment: &Assignment,
    init_containers: usize,
) -> Vec<(String, DeviceUsage)> {
    let mut init_peak: HashMap<&str, DeviceUsage> = HashMap::new();
    let mut app_sum: HashMap<&str, DeviceUsage> = HashMap::new();
    for (i, devices) in assignment.iter().enumerate() {
        for d in devices {
            if i < init_containers {
                let u = init_peak.entry(&d.uuid).or_default();
                u.slots = 1;
                u.memory_mib = u.memory_mib.max(d.memory_mib);
                u.cores = u.cores.max(d.cores);
            } else {
                app_sum.entry(&d.uuid).or_default().add(&DeviceUsage {
                    slots: 1,
                    memory_mib: d.memory_mib,
                    cores: d.cores,
                });
            }
        }
    }
    let mut out: Vec<(String, DeviceUsage)> = init_peak
        .keys()
        .chain(app_sum.keys())
        .copied()
        .collect::<std::collections::BTreeSet<&str>>()
        .into_iter()
        .map(|uuid| {
            let i = init_peak.get(uuid).copied().unwrap_or_default();
            let a = app_sum.get(uuid).copied().unwrap_or_default();
            let u = DeviceUsage {
                slots: i.slots.max(a.slots).max(1),
                memory_mib: i.memory_mib.max(a.memory_mib),
                cores: i.cores.max(a.cores),
            };
            (uuid.to_owned(), u)
        })
        .collect();
    out.shrink_to_fit();
    out
}

/// A pod's entry in the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub containers: Assignment,
    pub effective: Vec<(String, DeviceUsage)>,
}

impl PodUsage {
    pub fn new(
        namespace: String,
        name: String,
        node: String,
        containers: Assignment,
        init_containers: usize,
    ) -> Self {
        let effective = effective_usage(&containers, init_containers);
        Self {
            namespace,
            name,
            node,
            containers,
            effective,
        }
    }
}

/// All pods holding GPUs, and the totals per node and GPU.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    nodes: HashMap<String, HashMap<String, DeviceUsage>>,
    pods: HashMap<String, PodUsage>,
}

impl Ledger {
    /// Records (or replaces) the pod with this UID.
    pub fn upsert(&mut self, uid: &str, pod: PodUsage) {
        self.remove(uid);
        let node = self.nodes.entry(pod.node.clone()).or_default();
        for (uuid, u) in &pod.effective {
            node.entry(uuid.clone()).or_default().add(u);
        }
        self.pods.insert(uid.to_owned(), pod);
    }

    pub fn remove(&mut self, uid: &str) -> Option<PodUsage> {
        let pod = self.pods.remove(uid)?;
        if let Some(node) = self.nodes.get_mut(&pod.node) {
            for (uuid, u) in &pod.effective {
                if let Some(total) = node.get_mut(uuid) {
                    total.sub(u);
                    if total.is_zero() {
                        node.remove(uuid);
                    }
                }
            }
            if node.is_empty() {
                self.nodes.remove(&pod.node);
            }
        }
        Some(pod)
    }

    pub fn pod(&self, uid: &str) -> Option<&PodUsage> {
        self.pods.get(uid)
    }

    pub fn pods(&self) -> impl Iterator<Item = (&String, &PodUsage)> {
        self.pods.iter()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Totals per GPU UUID on one node (`None`: nothing used there).
    pub fn node(&self, node: &str) -> Option<&HashMap<String, DeviceUsage>> {
        self.nodes.get(node)
    }

    pub fn device(&self, node: &str, uuid: &str) -> DeviceUsage {
        self.nodes
            .get(node)
            .and_then(|n| n.get(uuid))
            .copied()
            .unwrap_or_default()
    }

    /// Drops every pod on `node` and records `pods` instead: the fresh
    /// view a binder reads under the node lock.
    pub fn replace_node(&mut self, node: &str, pods: Vec<(String, PodUsage)>) {
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.node == node)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            self.remove(&uid);
        }
        for (uid, pod) in pods {
            self.upsert(&uid, pod);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(uuid: &str, memory_mib: u64, cores: u32) -> AssignedDevice {
        AssignedDevice {
            uuid: uuid.into(),
            memory_mib,
            cores,
        }
    }

    #[test]
    fn init_containers_count_at_their_peak_app_containers_add_up() {
        // init: 8000 on A; init: 3000 on A and B; app: 2000 + 1000 on A, 500 on B.
        let a = vec![
            vec![dev("A", 8000, 50)],
            vec![dev("A", 3000, 10), dev("B", 3000, 10)],
            vec![dev("A", 2000, 20)],
            vec![],
            vec![dev("A", 1000, 20), dev("B", 500, 5)],
        ];
        let eff = effective_usage(&a, 2);
        assert_eq!(
            eff,
            vec![
                (
                    "A".into(),
                    DeviceUsage {
                        slots: 2,
                        memory_mib: 8000,
                        cores: 50
                    }
                ),
                (
                    "B".into(),
                    DeviceUsage {
                        slots: 1,
                        memory_mib: 3000,
                        cores: 10
                    }
                ),
            ]
        );
    }

    #[test]
    fn upsert_replace_and_remove_keep_totals_exact() {
        let mut l = Ledger::default();
        let p = |node: &str, mem| {
            PodUsage::new(
                "ns".into(),
                "p".into(),
                node.into(),
                vec![vec![dev("A", mem, 10)]],
                0,
            )
        };
        l.upsert("u1", p("n1", 1000));
        l.upsert("u2", p("n1", 2000));
        assert_eq!(
            l.device("n1", "A"),
            DeviceUsage {
                slots: 2,
                memory_mib: 3000,
                cores: 20
            }
        );
        // Re-recording a pod replaces it rather than adding twice.
        l.upsert("u2", p("n1", 500));
        assert_eq!(l.device("n1", "A").memory_mib, 1500);
        assert!(l.remove("u1").is_some());
        assert!(l.remove("u1").is_none());
        assert_eq!(
            l.device("n1", "A"),
            DeviceUsage {
                slots: 1,
                memory_mib: 500,
                cores: 10
            }
        );
        l.replace_node("n1", vec![("u3".into(), p("n1", 42))]);
        assert!(l.pod("u2").is_none());
        assert_eq!(l.device("n1", "A").memory_mib, 42);
        l.remove("u3");
        assert!(l.node("n1").is_none(), "empty nodes are dropped");
        assert_eq!(l.pod_count(), 0);
    }
}
