//! Prometheus metrics on `:9395`, HAMi's names (constant label
//! `zone="vGPU"`): per GPU `hami_gpu_memory_limit_bytes`,
//! `hami_gpu_core_limit_ratio`, `hami_gpu_memory_allocated_bytes`,
//! `hami_gpu_shared_count`, `hami_gpu_core_allocated_ratio`,
//! `hami_node_gpu_overview`, `hami_node_gpu_memory_allocated_ratio`; per
//! container `hami_vgpu_memory_allocated_bytes`,
//! `hami_vgpu_core_allocated_ratio`; HAMi's pre-2.9 names behind
//! `--legacy-metrics`. The values are HAMi's too (its "core ratio" metrics
//! carry percent, 0..100). Ours: filter, prioritize and bind latency
//! histograms and bind outcomes, under `vgpu_scheduler_`.
//!
//! Owns the registry and the scrape-time reading of the cluster picture;
//! labels are finite (nodes, GPUs and pods that exist).

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::state::ClusterState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

/// Our own counters and histograms (seconds).
#[derive(Debug)]
pub struct Timings {
    pub filter: Histogram,
    pub prioritize: Histogram,
    pub bind: Histogram,
    pub webhook: Histogram,
    pub binds: Family<OutcomeLabels, Counter>,
}

impl Default for Timings {
    fn default() -> Self {
        // 100 us .. ~26 s.
        let buckets = || Histogram::new(exponential_buckets(0.0001, 2.0, 19));
        Self {
            filter: buckets(),
            prioritize: buckets(),
            bind: buckets(),
            webhook: buckets(),
            binds: Family::default(),
        }
    }
}

/// The scrape-time view of the cluster picture.
#[derive(Debug)]
struct ClusterCollector {
    state: Arc<RwLock<ClusterState>>,
    legacy: bool,
}

/// One family: name, help, and (labels, value) samples.
type Samples = Vec<(Vec<(&'static str, String)>, f64)>;

fn emit(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &Samples,
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (labels, value) in samples {
        let gauge = ConstGauge::new(*value);
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        gauge.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

const MIB: f64 = 1024.0 * 1024.0;

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(state) = self.state.read() else {
            return Ok(());
        };
        let (mut mem_limit, mut core_limit, mut mem_alloc, mut shared, mut core_alloc) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let (mut overview, mut mem_ratio) = (Samples::new(), Samples::new());
        let mut names: Vec<&String> = state.nodes.keys().collect();
        names.sort();
        for name in names {
            let inv = &state.nodes[name];
            for d in &inv.devices {
                let u = state.ledger.device(name, &d.uuid);
                let base = vec![
                    ("node", name.clone()),
                    ("device_uuid", d.uuid.clone()),
                    ("device_index", d.index.to_string()),
                ];
                let with_type = |mut l: Vec<(&'static str, String)>| {
                    l.push(("device_type", d.model.clone()));
                    l
                };
                mem_limit.push((with_type(base.clone()), d.memory_mib as f64 * MIB));
                core_limit.push((with_type(base.clone()), f64::from(d.cores)));
                let mut with_cores = base.clone();
                with_cores.push(("device_cores", d.cores.to_string()));
                mem_alloc.push((with_type(with_cores.clone()), u.memory_mib as f64 * MIB));
                shared.push((with_type(base.clone()), f64::from(u.slots)));
                core_alloc.push((with_type(base.clone()), f64::from(u.cores)));
                with_cores.push(("device_memory_limit", d.memory_mib.to_string()));
                overview.push((with_type(with_cores), u.memory_mib as f64 * MIB));
                if d.memory_mib > 0 {
                    mem_ratio.push((with_type(base), u.memory_mib as f64 / d.memory_mib as f64));
                }
            }
        }
        let (mut vmem, mut vcore) = (Samples::new(), Samples::new());
        let mut pods: Vec<_> = state.ledger.pods().collect();
        pods.sort_by(|a, b| a.0.cmp(b.0));
        for (_, p) in pods {
            for (ctr, devices) in p.containers.iter().enumerate() {
                for d in devices {
                    let labels = vec![
                        ("namespace", p.namespace.clone()),
                        ("node", p.node.clone()),
                        ("pod", p.name.clone()),
                        ("container_index", ctr.to_string()),
                        ("device_uuid", d.uuid.clone()),
                    ];
                    vmem.push((labels.clone(), d.memory_mib as f64 * MIB));
                    vcore.push((labels, f64::from(d.cores)));
                }
            }
        }
        let families: [(&str, &str, &Samples); 9] = [
            (
                "hami_gpu_memory_limit_bytes",
                "Device memory limit for a certain GPU",
                &mem_limit,
            ),
            (
                "hami_gpu_core_limit_ratio",
                "Device core limit for a certain GPU",
                &core_limit,
            ),
            (
                "hami_gpu_memory_allocated_bytes",
                "Device memory allocated for a certain GPU",
                &mem_alloc,
            ),
            (
                "hami_gpu_shared_count",
                "Number of containers sharing this GPU",
                &shared,
            ),
            (
                "hami_gpu_core_allocated_ratio",
                "Device core allocated for a certain GPU",
                &core_alloc,
            ),
            (
                "hami_node_gpu_overview",
                "GPU overview on a certain node",
                &overview,
            ),
            (
                "hami_node_gpu_memory_allocated_ratio",
                "GPU Memory Allocated Percentage on a certain GPU",
                &mem_ratio,
            ),
            (
                "hami_vgpu_memory_allocated_bytes",
                "vGPU memory allocated from a container",
                &vmem,
            ),
            (
                "hami_vgpu_core_allocated_ratio",
                "vGPU core allocated from a container",
                &vcore,
            ),
        ];
        for (name, help, samples) in families {
            emit(&mut encoder, name, help, samples)?;
        }
        if self.legacy {
            for (new, old, help, samples) in legacy_families(&families) {
                let _ = new;
                emit(&mut encoder, old, help, &samples)?;
            }
        }
        Ok(())
    }
}

/// HAMi's pre-2.9 names and label spellings for the same samples.
fn legacy_families<'a>(
    families: &[(&'a str, &'a str, &Samples); 9],
) -> Vec<(&'a str, &'static str, &'a str, Samples)> {
    let rename = |k: &str| -> &'static str {
        match k {
            "node" => "nodeid",
            "device_uuid" => "deviceuuid",
            "device_index" => "deviceidx",
            "device_type" => "devicetype",
            "device_cores" => "devicecores",
            "device_memory_limit" => "devicememorylimit",
            "namespace" => "podnamespace",
            "pod" => "podname",
            "container_index" => "containeridx",
            _ => "unknown",
        }
    };
    let old_name = |new: &str| -> Option<&'static str> {
        Some(match new {
            "hami_gpu_memory_limit_bytes" => "GPUDeviceMemoryLimit",
            "hami_gpu_core_limit_ratio" => "GPUDeviceCoreLimit",
            "hami_gpu_memory_allocated_bytes" => "GPUDeviceMemoryAllocated",
            "hami_gpu_shared_count" => "GPUDeviceSharedNum",
            "hami_gpu_core_allocated_ratio" => "GPUDeviceCoreAllocated",
            "hami_node_gpu_overview" => "nodeGPUOverview",
            "hami_node_gpu_memory_allocated_ratio" => "nodeGPUMemoryPercentage",
            "hami_vgpu_memory_allocated_bytes" => "vGPUMemoryAllocated",
            "hami_vgpu_core_allocated_ratio" => "vGPUCoreAllocated",
            _ => return None,
        })
    };
    families
        .iter()
        .filter_map(|(new, help, samples)| {
            let old = old_name(new)?;
            let vgpu = new.starts_with("hami_vgpu_");
            let renamed: Samples = samples
                .iter()
                .map(|(labels, v)| {
                    let labels = labels
                        .iter()
                        // HAMi's legacy per-container metrics name the node `nodename`,
                        // and its memory percentage has no device type.
                        .filter(|(k, _)| {
                            !(*new == "hami_node_gpu_memory_allocated_ratio" && *k == "device_type")
                        })
                        .map(|(k, v)| {
                            (
                                if vgpu && *k == "node" {
                                    "nodename"
                                } else {
                                    rename(k)
                                },
                                v.clone(),
                            )
                        })
                        .collect();
                    (labels, *v)
                })
                .collect();
            Some((*new, old, *help, renamed))
        })
        .collect()
}

/// The registry served on the metrics port.
pub struct Metrics {
    registry: Registry,
    pub timings: Arc<Timings>,
}

impl Metrics {
    pub fn new(state: Arc<RwLock<ClusterState>>, legacy: bool) -> Self {
        let mut registry = Registry::with_labels(std::iter::once(("zone".into(), "vGPU".into())));
        registry.register_collector(Box::new(ClusterCollector { state, legacy }));
        let timings = Arc::new(Timings::default());
        let ours = registry.sub_registry_with_prefix("vgpu_scheduler");
        ours.register(
            "filter_duration_seconds",
            "Time to answer a filter call",
            timings.filter.clone(),
        );
        ours.register(
            "prioritize_duration_seconds",
            "Time to answer a prioritize call",
            timings.prioritize.clone(),
        );
        ours.register(
            "bind_duration_seconds",
            "Time to answer a bind call",
            timings.bind.clone(),
        );
        ours.register(
            "webhook_duration_seconds",
            "Time to answer an admission review",
            timings.webhook.clone(),
        );
        ours.register("binds", "Bind calls by outcome", timings.binds.clone());
        Self { registry, timings }
    }

    /// The text exposition (OpenMetrics text format).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            let _ = writeln!(out, "# metrics encoding failed");
        }
        out
    }
}
