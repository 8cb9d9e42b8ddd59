//! Placement on one node: which GPUs each container of a pod gets, or why
//! the node cannot take the pod, and how good a home the node is.
//!
//! The rules are HAMi's (`pkg/device/nvidia/device.go` `Fit`): per card,
//! in this order, health, cordon, mode, type, UUID, free slot, memory,
//! cores, exclusive use (100 cores wants an unused card), and no
//! core-less tenant on a card whose cores are all promised. Cards that
//! pass are ranked by the GPU policy on their use after this request
//! (binpack: fullest first; spread: emptiest first), ties broken by NUMA
//! node then index. Pure: no I/O, no clock, no allocation of reasons
//! unless the node is refused.

use std::collections::HashMap;
use std::fmt;

use crate::config::{GpuPolicy, NodePolicy};
use crate::extender::MAX_EXTENDER_PRIORITY;
use crate::inventory::{GpuDevice, NodeHealth, NodeInventory};
use crate::ledger::{AssignedDevice, Assignment, DeviceUsage};
use crate::request::{GpuRequest, PodRequest};
use vgpu_hami::keys;

/// Why one card cannot serve one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CardRefusal {
    Unhealthy,
    Cordoned,
    /// MIG or MPS: not a card vgpu's interposer shares.
    ModeUnsupported,
    /// `nvidia.com/vgpu-mode` excludes the card's mode.
    ModeMismatch,
    TypeMismatch,
    UuidMismatch,
    SlotsExhausted,
    /// `mutex` policy and somebody uses the card.
    InUse,
    /// The card has less memory in total than one vGPU asks for.
    CardTooSmall,
    InsufficientMemory,
    InsufficientCores,
    /// 100 cores asks for the card alone, and it has a tenant.
    ExclusiveInUse,
    /// All cores are promised; a tenant asking for none would get none.
    CoresExhausted,
    /// Cores are guarantees (docs/limiter.md): with `deviceCoreScaling`
    /// above 1 a card offers more than 100 cores, but the guarantees on
    /// one card may not sum over 100 % of its time.
    OverGuaranteed,
}

const CARD_REFUSALS: usize = 14;

impl CardRefusal {
    fn all() -> [CardRefusal; CARD_REFUSALS] {
        use CardRefusal::*;
        [
            Unhealthy,
            Cordoned,
            ModeUnsupported,
            ModeMismatch,
            TypeMismatch,
            UuidMismatch,
            SlotsExhausted,
            InUse,
            CardTooSmall,
            InsufficientMemory,
            InsufficientCores,
            ExclusiveInUse,
            CoresExhausted,
            OverGuaranteed,
        ]
    }

    pub fn label(self) -> &'static str {
        use CardRefusal::*;
        match self {
            Unhealthy => "unhealthy",
            Cordoned => "cordoned",
            ModeUnsupported => "not in hami-core mode",
            ModeMismatch => "mode excluded by nvidia.com/vgpu-mode",
            TypeMismatch => "type excluded",
            UuidMismatch => "UUID excluded",
            SlotsExhausted => "all vGPU slots taken",
            InUse => "in use (mutex policy)",
            CardTooSmall => "too little memory on the card",
            InsufficientMemory => "insufficient free memory",
            InsufficientCores => "insufficient free cores",
            ExclusiveInUse => "in use (100 cores asks for an unused card)",
            CoresExhausted => "all cores allocated",
            OverGuaranteed => "cores are guarantees: they would sum over 100 % of the card",
        }
    }

    /// Whether evicting other pods could change this answer.
    pub fn resolvable(self) -> bool {
        use CardRefusal::*;
        matches!(
            self,
            SlotsExhausted
                | InUse
                | InsufficientMemory
                | InsufficientCores
                | ExclusiveInUse
                | CoresExhausted
                | OverGuaranteed
        )
    }
}

/// Why a node cannot take the pod: the text kube-scheduler shows per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable register annotation.
    NoGpus(String),
    Unhealthy {
        stamp: String,
    },
    TooFewCards {
        container: String,
        wanted: u32,
        cards: usize,
    },
    Container {
        container: String,
        wanted: u32,
        fitting: u32,
        cards: usize,
        /// How many cards were refused for each reason (reasons in
        /// [`CardRefusal`] order, zero counts left out).
        reasons: Vec<(CardRefusal, u32)>,
        /// Enough cards fit, but not on one NUMA node.
        numa_split: bool,
    },
}

impl Refusal {
    /// Whether preemption could make the node fit.
    pub fn resolvable(&self) -> bool {
        match self {
            Refusal::Container {
                reasons,
                numa_split,
                ..
            } => *numa_split || reasons.iter().any(|(r, _)| r.resolvable()),
            _ => false,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoGpus(why) => write!(f, "no GPUs: {why}"),
            Refusal::Unhealthy { stamp } => write!(
                f,
                "GPU device plugin gone: handshake {stamp:?} is stale and the node \
                 advertises no allocatable GPU"
            ),
            Refusal::TooFewCards {
                container,
                wanted,
                cards,
            } => write!(
                f,
                "container {container:?} needs {wanted} GPUs, the node has {cards}"
            ),
            Refusal::Container {
                container,
                wanted,
                fitting,
                cards,
                reasons,
                numa_split,
            } => {
                let numa = if *numa_split { " on one NUMA node" } else { "" };
                write!(
                    f,
                    "container {container:?} needs {wanted} GPUs{numa}, {fitting} of {cards} fit"
                )?;
                if *numa_split {
                    write!(f, " but on different NUMA nodes")?;
                }
                if !reasons.is_empty() {
                    f.write_str(" (")?;
                    for (i, (r, n)) in reasons.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{n} {}", r.label())?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
}

/// Where a pod's containers go on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Per container, init containers first.
    pub containers: Assignment,
    /// The node's use after this pod, 0..=1, averaged over slots, cores
    /// and memory.
    pub utilization: f64,
}

/// The extender score (0..=10) of a node that fits.
pub fn node_score(policy: NodePolicy, utilization: f64) -> i64 {
    let u = utilization.clamp(0.0, 1.0);
    let s = match policy {
        NodePolicy::Binpack => u,
        NodePolicy::Spread => 1.0 - u,
    };
    (s * MAX_EXTENDER_PRIORITY as f64).round() as i64
}

/// Fits `req` on `node` whose GPUs are used as `usage` says (by UUID).
pub fn fit_pod(
    req: &PodRequest,
    node: &NodeInventory,
    usage: Option<&HashMap<String, DeviceUsage>>,
) -> Result<Placement, Refusal> {
    if let NodeHealth::StaleHandshake { stamp } = &node.health {
        return Err(Refusal::Unhealthy {
            stamp: stamp.clone(),
        });
    }
    if node.devices.is_empty() {
        return Err(Refusal::NoGpus(node.register_error.clone().unwrap_or_else(
            || "the node has no hami.io/node-nvidia-register devices".into(),
        )));
    }
    let base: Vec<DeviceUsage> = node
        .devices
        .iter()
        .map(|d| {
            usage
                .and_then(|u| u.get(&d.uuid))
                .copied()
                .unwrap_or_default()
        })
        .collect();
    let mut work = base.clone();
    // Per card, the largest init container (they run one at a time).
    let mut init_peak = vec![DeviceUsage::default(); node.devices.len()];
    let mut containers: Assignment = Vec::with_capacity(req.containers.len());
    for c in &req.containers {
        let Some(gpu) = c.gpu else {
            containers.push(Vec::new());
            continue;
        };
        if gpu.count as usize > node.devices.len() {
            return Err(Refusal::TooFewCards {
                container: c.name.clone(),
                wanted: gpu.count,
                cards: node.devices.len(),
            });
        }
        // Init containers run alone before the app containers start.
        let against = if c.init { &base } else { &work };
        let chosen = pick_cards(req, node, against, gpu, &c.name)?;
        let mut assigned = Vec::with_capacity(chosen.len());
        for &i in &chosen {
            let d = &node.devices[i];
            let memory_mib = gpu.memory.on_card(d.memory_mib);
            if c.init {
                let p = &mut init_peak[i];
                p.slots = 1;
                p.memory_mib = p.memory_mib.max(memory_mib);
                p.cores = p.cores.max(gpu.cores);
            } else {
                let w = &mut work[i];
                w.slots += 1;
                w.memory_mib += memory_mib;
                w.cores += gpu.cores;
            }
            assigned.push(AssignedDevice {
                uuid: d.uuid.clone(),
                memory_mib,
                cores: gpu.cores,
            });
        }
        containers.push(assigned);
    }
    let utilization = utilization_after(node, &base, &work, &init_peak);
    Ok(Placement {
        containers,
        utilization,
    })
}

/// Chooses `gpu.count` distinct cards for one container.
fn pick_cards(
    req: &PodRequest,
    node: &NodeInventory,
    usage: &[DeviceUsage],
    gpu: GpuRequest,
    container: &str,
) -> Result<Vec<usize>, Refusal> {
    let mut refused = [0u32; CARD_REFUSALS];
    let mut fitting: Vec<(usize, f64)> = Vec::with_capacity(node.devices.len());
    for (i, d) in node.devices.iter().enumerate() {
        match check_card(req, node, d, &usage[i], gpu) {
            Ok(rank) => fitting.push((i, rank)),
            Err(r) => refused[r as usize] += 1,
        }
    }
    let devices = &node.devices;
    fitting.sort_by(|&(a, ra), &(b, rb)| {
        let by_rank = match req.gpu_policy {
            GpuPolicy::Binpack => rb.total_cmp(&ra),
            GpuPolicy::Spread => ra.total_cmp(&rb),
        };
        by_rank
            .then(devices[a].numa.cmp(&devices[b].numa))
            .then(devices[a].index.cmp(&devices[b].index))
    });
    let want = gpu.count as usize;
    let chosen: Option<Vec<usize>> = if req.numa_bind {
        // The first NUMA node to collect enough cards, walking in rank order.
        let mut by_numa: Vec<(i32, Vec<usize>)> = Vec::new();
        let mut done = None;
        for &(i, _) in &fitting {
            let numa = devices[i].numa;
            let slot = match by_numa.iter().position(|(n, _)| *n == numa) {
                Some(p) => p,
                None => {
                    by_numa.push((numa, Vec::new()));
                    by_numa.len() - 1
                }
            };
            by_numa[slot].1.push(i);
            if by_numa[slot].1.len() == want {
                done = Some(std::mem::take(&mut by_numa[slot].1));
                break;
            }
        }
        done
    } else if fitting.len() >= want {
        Some(fitting.iter().take(want).map(|&(i, _)| i).collect())
    } else {
        None
    };
    chosen.ok_or_else(|| Refusal::Container {
        container: container.to_owned(),
        wanted: gpu.count,
        fitting: fitting.len() as u32,
        cards: devices.len(),
        reasons: CardRefusal::all()
            .into_iter()
            .filter(|&r| refused[r as usize] > 0)
            .map(|r| (r, refused[r as usize]))
            .collect(),
        numa_split: req.numa_bind && fitting.len() >= want,
    })
}

/// Whether one card can serve one vGPU of `gpu`, and its rank: the card's
/// use after it would, summed over slots, cores and memory.
fn check_card(
    req: &PodRequest,
    node: &NodeInventory,
    d: &GpuDevice,
    u: &DeviceUsage,
    gpu: GpuRequest,
) -> Result<f64, CardRefusal> {
    let sel = &req.selector;
    if !d.healthy {
        return Err(CardRefusal::Unhealthy);
    }
    if node.cordoned.contains(&d.uuid) {
        return Err(CardRefusal::Cordoned);
    }
    if d.mode != keys::MODE_HAMI_CORE {
        return Err(CardRefusal::ModeUnsupported);
    }
    if !sel.mode_allowed(&d.mode) {
        return Err(CardRefusal::ModeMismatch);
    }
    if !sel.type_allowed(&d.model) {
        return Err(CardRefusal::TypeMismatch);
    }
    if !sel.uuid_allowed(&d.uuid) {
        return Err(CardRefusal::UuidMismatch);
    }
    if u.slots >= d.slots {
        return Err(CardRefusal::SlotsExhausted);
    }
    if req.idle_gpus_only && u.slots > 0 {
        return Err(CardRefusal::InUse);
    }
    let memory = gpu.memory.on_card(d.memory_mib);
    if memory > d.memory_mib {
        return Err(CardRefusal::CardTooSmall);
    }
    if d.memory_mib.saturating_sub(u.memory_mib) < memory {
        return Err(CardRefusal::InsufficientMemory);
    }
    if d.cores.saturating_sub(u.cores) < gpu.cores {
        return Err(CardRefusal::InsufficientCores);
    }
    // Whatever the card offers (core scaling), guarantees fit in its time.
    if gpu.cores > 0 && u.cores.saturating_add(gpu.cores) > 100 {
        return Err(CardRefusal::OverGuaranteed);
    }
    if d.cores == 100 && gpu.cores == 100 && u.slots > 0 {
        return Err(CardRefusal::ExclusiveInUse);
    }
    if d.cores != 0 && u.cores >= d.cores && gpu.cores == 0 {
        return Err(CardRefusal::CoresExhausted);
    }
    let frac = |used: f64, total: f64| if total > 0.0 { used / total } else { 0.0 };
    Ok(frac(f64::from(u.slots + 1), f64::from(d.slots))
        + frac(f64::from(u.cores + gpu.cores), f64::from(d.cores))
        + frac((u.memory_mib + memory) as f64, d.memory_mib as f64))
}

/// The node's use once the pod runs: per card the larger of its app
/// containers' sum (`work`, base included) and base plus its largest init
/// container; slots, cores and memory fractions averaged.
fn utilization_after(
    node: &NodeInventory,
    base: &[DeviceUsage],
    work: &[DeviceUsage],
    init_peak: &[DeviceUsage],
) -> f64 {
    let (mut slots, mut cores, mut mem) = (0.0, 0.0, 0.0);
    let (mut slots_total, mut cores_total, mut mem_total) = (0.0, 0.0, 0.0);
    for (i, d) in node.devices.iter().enumerate() {
        let (b, w, p) = (&base[i], &work[i], &init_peak[i]);
        slots += f64::from(w.slots.max(b.slots + p.slots));
        cores += f64::from(w.cores.max(b.cores + p.cores));
        mem += w.memory_mib.max(b.memory_mib + p.memory_mib) as f64;
        slots_total += f64::from(d.slots);
        cores_total += f64::from(d.cores);
        mem_total += d.memory_mib as f64;
    }
    let frac = |used: f64, total: f64| {
        if total > 0.0 {
            (used / total).min(1.0)
        } else {
            0.0
        }
    };
    (frac(slots, slots_total) + frac(cores, cores_total) + frac(mem, mem_total)) / 3.0
}
