//! The node monitor: `/metrics` and `/healthz` over HTTP. Every scrape
//! reads each container's region (read-only: it never reclaims, never
//! writes), its limits file, NVML (memory, utilization, per-process memory
//! and samples by host PID) and joins processes to containers through
//! cgroups, so per-container utilization is exported whether or not an SM
//! limit is set and without the workload needing `hostPID`. HAMi v2.10's
//! names and labels by default (`zone="vGPU"` on every series), the
//! pre-v2.9 names with `--legacy-metrics`, and vgpu's own `vgpu_*`
//! series. No label ever carries a PID.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::config::NodeConfig;
use crate::nvml::{Gpus, ProcessSample};
use crate::observe::{self, ContainerRegion, Observation, PodIndex, Resolver};

type Labels = Vec<(&'static str, String)>;
/// A figure per (container key, GPU UUID).
pub type PerContainerGpu<T> = HashMap<(String, String), T>;
type G = Family<Labels, Gauge<f64, AtomicU64>>;

/// The pods bound to this node, refreshed by the agent.
#[derive(Default)]
pub struct PodCache {
    inner: std::sync::RwLock<(Arc<PodIndex>, Option<Instant>)>,
}

impl PodCache {
    /// Replaces the index.
    pub fn set(&self, ix: PodIndex) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) =
            (Arc::new(ix), Some(Instant::now()));
    }

    /// The current index.
    pub fn get(&self) -> Arc<PodIndex> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// When the index was last refreshed.
    pub fn refreshed(&self) -> Option<Instant> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// One (container, device) judged against its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    /// `<podUID>_<ctr>`.
    pub key: String,
    /// Device index in the container's view.
    pub vdevice: u32,
    /// GPU UUID.
    pub uuid: String,
    /// The region's ledger (bytes reserved through the interposer).
    pub ledger: u64,
    /// The memory limit (0 = none).
    pub limit: u64,
    /// What the driver reports for the container's processes.
    pub driver: u64,
}

impl Assessment {
    /// Driver bytes the ledger does not account for.
    pub fn unaccounted(&self) -> u64 {
        self.driver.saturating_sub(self.ledger)
    }

    /// Over the limit by more than `tolerance`.
    pub fn over_limit(&self, tolerance: u64) -> bool {
        self.limit > 0 && self.driver > self.limit.saturating_add(tolerance)
    }
}

/// Every (container, device) with a region, a limits file or driver memory.
pub fn assess(
    regions: &[ContainerRegion],
    driver: &BTreeMap<(String, String), u64>,
) -> Vec<Assessment> {
    let mut out = Vec::new();
    let mut covered: HashSet<(String, String)> = HashSet::new();
    for r in regions {
        let mut devs: Vec<(u32, String, u64, u64)> = Vec::new();
        if let Some(Ok(s)) = &r.snapshot {
            for d in &s.devices {
                devs.push((d.index, d.uuid.clone(), d.used, r.memory_limit(d)));
            }
        } else if let Some(l) = &r.limits {
            for (i, line) in l.devices.iter().enumerate() {
                if let vgpu_region::limits::Device::Uuid(u) = &line.device {
                    devs.push((i as u32, u.clone(), 0, line.memory.unwrap_or(0)));
                }
            }
        }
        for (vdevice, uuid, ledger, limit) in devs {
            let k = (r.key.clone(), uuid.clone());
            let drv = driver.get(&k).copied().unwrap_or(0);
            covered.insert(k);
            out.push(Assessment {
                key: r.key.clone(),
                vdevice,
                uuid,
                ledger,
                limit,
                driver: drv,
            });
        }
    }
    for ((key, uuid), drv) in driver {
        if !covered.contains(&(key.clone(), uuid.clone())) {
            out.push(Assessment {
                key: key.clone(),
                vdevice: 0,
                uuid: uuid.clone(),
                ledger: 0,
                limit: 0,
                driver: *drv,
            });
        }
    }
    out
}

/// What the watchdog shares with the monitor.
#[derive(Default)]
pub struct WatchdogStats {
    /// Processes killed.
    pub kills: AtomicU64,
    /// (container, GPU) pairs that went over their limit.
    pub detections: AtomicU64,
    /// Last cycle's duration, ns.
    pub cycle_ns: AtomicU64,
    /// Cycles run.
    pub cycles: AtomicU64,
}

#[derive(Default)]
struct UtilState {
    since: HashMap<u32, u64>,
    window: HashMap<u32, Vec<ProcessSample>>,
    last_active: HashMap<(String, String), i64>,
}

/// `vgpu_init_phase_seconds`: one histogram per cuInit stage.
pub type InitPhases = Family<Vec<(&'static str, &'static str)>, Histogram, fn() -> Histogram>;

fn new_hist() -> Histogram {
    // 10 µs .. ~20 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 22))
}

struct InitHist {
    seen: HashSet<(String, u32, u64)>,
    family: InitPhases,
}

/// The monitor's state across scrapes.
pub struct Monitor {
    cfg: Arc<NodeConfig>,
    gpus: Arc<dyn Gpus>,
    pods: Arc<PodCache>,
    resolver: Resolver,
    util: Mutex<UtilState>,
    init: Mutex<InitHist>,
    watchdog: Arc<WatchdogStats>,
    broker: Option<Arc<crate::broker::BrokerHost>>,
    last_scrape_ns: AtomicU64,
}

/// Samples older than this (behind the newest seen) leave the window.
const UTIL_WINDOW_US: u64 = 5_000_000;

const INIT_STAGES: &[(&str, &str, &str)] = &[
    ("wrapper", "WrapperEnter", "WrapperExit"),
    ("real_init", "RealInitEnter", "RealInitExit"),
    ("region", "WrapperEnter", "RegionMapped"),
    ("slot", "RegionMapped", "SlotClaimed"),
    ("identity", "IdentityEnter", "IdentityExit"),
];

fn gauge(reg: &mut Registry, name: &str, help: &str) -> G {
    let g = G::default();
    reg.register(name, help, g.clone());
    g
}

fn set(g: &G, labels: Labels, v: f64) {
    g.get_or_create(&labels).set(v);
}

impl Monitor {
    /// A monitor over these sources.
    pub fn new(
        cfg: Arc<NodeConfig>,
        gpus: Arc<dyn Gpus>,
        pods: Arc<PodCache>,
        watchdog: Arc<WatchdogStats>,
        broker: Option<Arc<crate::broker::BrokerHost>>,
    ) -> Monitor {
        Monitor {
            cfg,
            gpus,
            pods,
            resolver: Resolver::new("/proc"),
            util: Mutex::new(UtilState::default()),
            init: Mutex::new(InitHist {
                seen: HashSet::new(),
                family: InitPhases::new_with_constructor(new_hist),
            }),
            watchdog,
            broker,
            last_scrape_ns: AtomicU64::new(0),
        }
    }

    fn observe(&self, pods: &PodIndex, slot_pids: &HashMap<u32, String>) -> Observation {
        let since: HashMap<u32, u64> = self
            .util
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .since
            .clone();
        observe::observe(self.gpus.as_ref(), &self.resolver, pods, slot_pids, &|i| {
            since.get(&i).copied().unwrap_or(0)
        })
        .unwrap_or_default()
    }

    /// Per (container, GPU UUID) SM utilization from the sample window, and
    /// the seconds since each was last seen busy.
    fn utilization(
        &self,
        obs: &Observation,
        pods: &PodIndex,
        slot_pids: &HashMap<u32, String>,
    ) -> (PerContainerGpu<u32>, PerContainerGpu<i64>) {
        let mut st = self.util.lock().unwrap_or_else(|e| e.into_inner());
        let mut util: HashMap<(String, String), u32> = HashMap::new();
        for d in &obs.devices {
            let w = st.window.entry(d.info.index).or_default();
            w.extend(d.samples.iter().copied());
            let newest = w.iter().map(|s| s.timestamp_us).max().unwrap_or(0);
            w.retain(|s| s.timestamp_us + UTIL_WINDOW_US >= newest);
            // The latest sample per process.
            let mut latest: HashMap<u32, ProcessSample> = HashMap::new();
            for s in w.iter() {
                let e = latest.entry(s.pid).or_insert(*s);
                if s.timestamp_us >= e.timestamp_us {
                    *e = *s;
                }
            }
            // Processes holding memory are attributed already; look up the rest.
            let known: HashMap<u32, &String> = d
                .processes
                .iter()
                .filter_map(|p| p.container.as_ref().map(|k| (p.pid, k)))
                .collect();
            for (pid, s) in latest {
                let key = match known.get(&pid) {
                    Some(k) => Some((*k).clone()),
                    None => observe::container_of(&self.resolver, pods, slot_pids, pid),
                };
                if let Some(key) = key {
                    let u = util.entry((key, d.info.uuid.clone())).or_insert(0);
                    *u = (*u + s.sm_util).min(100);
                }
            }
            let prev = st.since.get(&d.info.index).copied().unwrap_or(0);
            st.since.insert(d.info.index, newest.max(prev));
        }
        let now = jiff::Timestamp::now().as_second();
        for (k, u) in &util {
            if *u > 0 {
                st.last_active.insert(k.clone(), now);
            }
        }
        let elapsed = st
            .last_active
            .iter()
            .map(|(k, t)| (k.clone(), (now - *t).max(0)))
            .collect();
        (util, elapsed)
    }

    fn observe_init_phases(&self, regions: &[ContainerRegion]) {
        let mut h = self.init.lock().unwrap_or_else(|e| e.into_inner());
        if h.seen.len() > 200_000 {
            h.seen.clear();
        }
        for r in regions {
            let Some(Ok(s)) = &r.snapshot else { continue };
            for slot in &s.slots {
                let id = (r.key.clone(), slot.index, slot.claimed_ns);
                if !slot.phases.iter().any(|(n, _)| *n == "WrapperExit") || !h.seen.insert(id) {
                    continue;
                }
                let at = |name: &str| {
                    slot.phases
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, t)| *t)
                };
                for (stage, from, to) in INIT_STAGES {
                    if let (Some(a), Some(b)) = (at(from), at(to)) {
                        if b >= a {
                            h.family
                                .get_or_create(&vec![("stage", *stage)])
                                .observe((b - a) as f64 / 1e9);
                        }
                    }
                }
            }
        }
    }

    /// Reads everything one scrape exports (the pod index, every region
    /// and limits file, NVML, procfs, the lending boards, the agent's own
    /// counters) and folds the new samples into the utilization window and
    /// the init-phase histogram. All of the scrape's I/O is here.
    pub fn snapshot(&self) -> NodeSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        let pods = self.pods.get();
        let regions = observe::scan_regions(&self.cfg.layout);
        let slot_pids = observe::slot_pids(&regions);
        let obs = self.observe(&pods, &slot_pids);
        let (util, elapsed) = self.utilization(&obs, &pods, &slot_pids);
        self.observe_init_phases(&regions);
        let audit = crate::boards::audit_all(&self.cfg.layout, vgpu_region::monotonic_ns());
        let init_phases = self
            .init
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .family
            .clone();
        NodeSnapshot {
            pods,
            regions,
            obs,
            util,
            elapsed,
            audit,
            agent: AgentFigures {
                init_phases,
                last_scrape_ns: self.last_scrape_ns.load(Relaxed),
                watchdog_kills: self.watchdog.kills.load(Relaxed),
                watchdog_detections: self.watchdog.detections.load(Relaxed),
                watchdog_cycle_ns: self.watchdog.cycle_ns.load(Relaxed),
                broker_ready: self.broker.as_ref().is_some_and(|b| b.ready()),
                broker_text: self
                    .broker
                    .as_ref()
                    .and_then(|b| b.metrics())
                    .map(|m| m.encode()),
            },
        }
    }

    /// One scrape: the OpenMetrics text ([`Monitor::snapshot`], then
    /// [`render`]); its duration is the next scrape's
    /// `vgpu_monitor_scrape_duration_seconds`.
    pub fn scrape(&self) -> String {
        let t0 = Instant::now();
        let out = render(&self.snapshot(), &self.cfg);
        self.last_scrape_ns.store(
            t0.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        out
    }
}

/// What one scrape read: plain data, rendered by [`render`].
pub struct NodeSnapshot {
    /// The pods bound to this node (and the DRA shares' users).
    pub pods: Arc<PodIndex>,
    /// Every container directory's region and limits file.
    pub regions: Vec<ContainerRegion>,
    /// NVML: devices, their utilization and processes joined to containers.
    pub obs: Observation,
    /// SM utilization per (container key, GPU UUID) over the sample window.
    pub util: PerContainerGpu<u32>,
    /// Seconds since each (container key, GPU UUID) was last seen busy.
    pub elapsed: PerContainerGpu<i64>,
    /// Lending-board entries that break their container's limits.
    pub audit: Vec<crate::boards::Violation>,
    /// The agent's own figures.
    pub agent: AgentFigures,
}

/// The agent's own figures at scrape time.
pub struct AgentFigures {
    /// `vgpu_init_phase_seconds` (kept across scrapes by the monitor).
    pub init_phases: InitPhases,
    /// The previous scrape's duration, ns.
    pub last_scrape_ns: u64,
    /// Processes the watchdog killed.
    pub watchdog_kills: u64,
    /// Times a container went over its limit.
    pub watchdog_detections: u64,
    /// The watchdog's last cycle, ns.
    pub watchdog_cycle_ns: u64,
    /// The host-PID broker serves its socket.
    pub broker_ready: bool,
    /// The broker's own exposition text (ends in `# EOF`), when it has one.
    pub broker_text: Option<String>,
}

/// The OpenMetrics text of one scrape: HAMi's series (the pre-v2.9 names
/// too with `legacy_metrics`), vgpu's own, then the broker's. Reads
/// nothing but its arguments.
pub fn render(snap: &NodeSnapshot, cfg: &NodeConfig) -> String {
    let pods = &snap.pods;
    let regions = &snap.regions;
    let obs = &snap.obs;
    let (util, elapsed) = (&snap.util, &snap.elapsed);
    let driver = obs.driver_memory();
    let mut root = Registry::default();
    let reg = root.sub_registry_with_label((Cow::Borrowed("zone"), Cow::Borrowed("vGPU")));
    let legacy = cfg.legacy_metrics;

    // Host GPUs.
    let host_mem = gauge(
        reg,
        "hami_host_gpu_memory_used_bytes",
        "GPU device memory usage in bytes",
    );
    let host_util = gauge(
        reg,
        "hami_host_gpu_utilization_ratio",
        "GPU core utilization ratio (0-100)",
    );
    let host_mcu = gauge(
        reg,
        "hami_host_gpu_memory_controller_utilization_ratio",
        "GPU memory controller utilization ratio (0-100)",
    );
    let (l_host_mem, l_host_util) = if legacy {
        (
            Some(gauge(reg, "HostGPUMemoryUsage", "GPU device memory usage")),
            Some(gauge(reg, "HostCoreUtilization", "GPU core utilization")),
        )
    } else {
        (None, None)
    };
    let unattributed = gauge(
        reg,
        "vgpu_unattributed_memory_bytes",
        "Device memory of GPU processes in no known container (host processes, other pods)",
    );
    for d in &obs.devices {
        let i = d.info.index.to_string();
        let ty = vgpu_hami::register::hami_device_type(&d.info.name);
        let l = vec![
            ("node", cfg.node_name.clone()),
            ("device_index", i.clone()),
            ("device_uuid", d.info.uuid.clone()),
            ("device_type", ty.clone()),
        ];
        set(&host_mem, l.clone(), d.info.memory_used as f64);
        let (gu, mu) = d.utilization.unwrap_or((0, 0));
        set(&host_util, l, f64::from(gu));
        set(
            &host_mcu,
            vec![
                ("device_index", i.clone()),
                ("device_uuid", d.info.uuid.clone()),
                ("device_type", ty.clone()),
            ],
            f64::from(mu),
        );
        if let (Some(m), Some(u)) = (&l_host_mem, &l_host_util) {
            let ll = vec![
                ("nodeid", cfg.node_name.clone()),
                ("deviceidx", i.clone()),
                ("deviceuuid", d.info.uuid.clone()),
                ("devicetype", ty.clone()),
            ];
            set(m, ll.clone(), d.info.memory_used as f64);
            set(u, ll, f64::from(gu));
        }
        let orphan: u64 = d
            .processes
            .iter()
            .filter(|p| p.container.is_none())
            .filter_map(|p| p.used_bytes)
            .sum();
        set(
            &unattributed,
            vec![("device_uuid", d.info.uuid.clone())],
            orphan as f64,
        );
    }

    // Containers.
    let used = gauge(
        reg,
        "hami_vgpu_memory_used_bytes",
        "vGPU device memory usage in bytes",
    );
    let limit = gauge(
        reg,
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit in bytes",
    );
    let dmem = gauge(
        reg,
        "hami_container_device_memory_bytes",
        "Container device memory in bytes",
    );
    let dutil = gauge(
        reg,
        "hami_container_device_utilization_ratio",
        "Container device SM utilization ratio",
    );
    let lastk = gauge(
        reg,
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since last kernel execution in container",
    );
    let ctx = gauge(
        reg,
        "hami_vgpu_memory_context_bytes",
        "Container device memory context size in bytes",
    );
    let module = gauge(
        reg,
        "hami_vgpu_memory_module_bytes",
        "Container device memory module size in bytes",
    );
    let buffer = gauge(
        reg,
        "hami_vgpu_memory_buffer_bytes",
        "Container device memory buffer size in bytes",
    );
    let legacy_c = legacy.then(|| {
        (
            gauge(
                reg,
                "vGPU_device_memory_usage_in_bytes",
                "vGPU device usage",
            ),
            gauge(
                reg,
                "vGPU_device_memory_limit_in_bytes",
                "vGPU device limit",
            ),
            gauge(
                reg,
                "Device_memory_desc_of_container",
                "Container device memory description",
            ),
            gauge(
                reg,
                "Device_utilization_desc_of_container",
                "Container device utilization description",
            ),
            gauge(
                reg,
                "Device_last_kernel_of_container",
                "Container device last kernel description",
            ),
        )
    });
    let procs = gauge(
        reg,
        "vgpu_container_processes",
        "Processes registered in the container's region",
    );
    let ident = gauge(
        reg,
        "vgpu_container_identity_slots",
        "Region slots by host-PID identity tier and state",
    );
    let ident_fail = gauge(
        reg,
        "vgpu_container_identity_failures",
        "Region slots whose host-PID identity failed, by last failure",
    );
    let fallbacks = gauge(
        reg,
        "vgpu_container_fallbacks",
        "Interposer fallback counters summed over the container's slots",
    );
    let smlim = gauge(
        reg,
        "vgpu_container_sm_limit_ratio",
        "Configured SM limit in percent (0 = none)",
    );
    let smceil = gauge(
            reg,
            "vgpu_container_sm_ceiling_ratio",
            "Configured SM ceiling in percent: the most it may reach while others leave time unused (the limit when none; 0 = none)",
        );
    let smshare = gauge(
            reg,
            "vgpu_container_sm_share_ratio",
            "SM share the container paces at now, percent (its guarantee plus what it borrows; 0 = not paced)",
        );
    let driver_g = gauge(
        reg,
        "vgpu_container_driver_memory_bytes",
        "Device memory the driver reports for the container's processes (joined by cgroup)",
    );
    let unacc = gauge(
        reg,
        "vgpu_container_unaccounted_bytes",
        "Driver-reported device memory the container's ledger does not account for",
    );
    let over = gauge(
        reg,
        "vgpu_container_over_limit",
        "1 when the driver reports more than the limit plus the tolerance",
    );
    let held = gauge(
        reg,
        "vgpu_container_priority_held",
        "1 while the container (priority >= 1) carries a priority hold in its limits file, else 0",
    );
    let region_err = gauge(
        reg,
        "vgpu_region_errors",
        "Container directories whose region could not be read, by reason",
    );

    let who = |key: &str| -> Option<(String, String, String)> {
        let (uid, ctr) = pods.owner_of(key)?;
        let p = pods.by_uid.get(uid)?;
        Some((p.namespace.clone(), p.name.clone(), ctr.to_owned()))
    };
    // Lending boards: an entry that does not match its container's
    // limits (a tenant not following the protocol; crate::boards).
    let audit = gauge(
            reg,
            "vgpu_board_audit_violations",
            "1 for each lending-board entry that claims another guarantee or ceiling than the operator's limits, or paces above its ceiling",
        );
    for v in &snap.audit {
        let (ns, pod, ctr) = who(&v.key).unwrap_or_default();
        set(
            &audit,
            vec![
                ("namespace", ns),
                ("pod", pod),
                ("container", ctr),
                ("device_uuid", v.uuid.clone()),
                ("reason", v.why.clone()),
            ],
            1.0,
        );
    }
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    for r in regions {
        let Some((ns, pod, ctr)) = who(&r.key) else {
            *errors.entry("pod_unknown").or_default() += 1;
            continue;
        };
        let base: Labels = vec![
            ("namespace", ns.clone()),
            ("pod", pod.clone()),
            ("container", ctr.clone()),
        ];
        if let Some(l) = r.limits.as_ref().filter(|l| l.priority.is_some()) {
            let on = l.priority.is_some_and(|p| p >= 1) && l.hold.is_some();
            set(&held, base.clone(), if on { 1.0 } else { 0.0 });
        }
        let snap = match &r.snapshot {
            Some(Ok(s)) => s,
            Some(Err(_)) => {
                *errors.entry("unreadable").or_default() += 1;
                continue;
            }
            None => continue,
        };
        set(&procs, base.clone(), snap.slots.len() as f64);
        let mut tiers: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut fails: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut fb: BTreeMap<&'static str, u64> = BTreeMap::new();
        for s in &snap.slots {
            *tiers
                .entry((s.identity.tier.clone(), s.identity.state.clone()))
                .or_default() += 1;
            if s.identity.state == "Failed" {
                let name = vgpu_identity::telemetry::FailureCode(s.identity.failure as u16).name();
                *fails.entry(name).or_default() += 1;
            }
            for (n, c) in &s.fallbacks {
                *fb.entry(n).or_default() += c;
            }
        }
        for ((tier, state), n) in tiers {
            let mut l = base.clone();
            l.push(("tier", tier));
            l.push(("state", state));
            set(&ident, l, n as f64);
        }
        for (f, n) in fails {
            let mut l = base.clone();
            l.push(("failure", f.to_owned()));
            set(&ident_fail, l, n as f64);
        }
        for (f, n) in fb {
            let mut l = base.clone();
            l.push(("fallback", f.to_owned()));
            set(&fallbacks, l, n as f64);
        }
        for d in &snap.devices {
            let mut l = base.clone();
            l.push(("vdevice_index", d.index.to_string()));
            l.push(("device_uuid", d.uuid.clone()));
            let lim = r.memory_limit(d);
            set(&used, l.clone(), d.used as f64);
            set(&limit, l.clone(), lim as f64);
            set(&dmem, l.clone(), d.used as f64);
            set(&ctx, l.clone(), d.context as f64);
            set(&module, l.clone(), d.module as f64);
            set(&buffer, l.clone(), d.data as f64);
            let k = (r.key.clone(), d.uuid.clone());
            let u = util.get(&k).copied().unwrap_or(0);
            set(&dutil, l.clone(), f64::from(u));
            let last = elapsed.get(&k).copied();
            if let Some(e) = last {
                set(&lastk, l.clone(), e as f64);
            }
            set(&smlim, l.clone(), f64::from(r.sm_limit(d)));
            set(&smceil, l.clone(), f64::from(r.sm_ceiling(d)));
            set(
                &smshare,
                l.clone(),
                f64::from(d.pacing.share_ppm) / 10_000.0,
            );
            if let Some((lu, ll, lm, lut, llk)) = &legacy_c {
                let old: Labels = vec![
                    ("podnamespace", ns.clone()),
                    ("podname", pod.clone()),
                    ("ctrname", ctr.clone()),
                    ("vdeviceid", d.index.to_string()),
                    ("deviceuuid", d.uuid.clone()),
                ];
                set(lu, old.clone(), d.used as f64);
                set(ll, old.clone(), lim as f64);
                let offset = d.used.saturating_sub(d.context + d.module + d.data);
                let mut desc = old.clone();
                desc.push(("context", d.context.to_string()));
                desc.push(("module", d.module.to_string()));
                desc.push(("data", d.data.to_string()));
                desc.push(("offset", offset.to_string()));
                set(lm, desc, d.used as f64);
                set(lut, old.clone(), f64::from(u));
                if let Some(e) = last {
                    set(llk, old, e as f64);
                }
            }
        }
    }
    for a in assess(regions, &driver) {
        let Some((ns, pod, ctr)) = who(&a.key) else {
            continue;
        };
        let l: Labels = vec![
            ("namespace", ns),
            ("pod", pod),
            ("container", ctr),
            ("vdevice_index", a.vdevice.to_string()),
            ("device_uuid", a.uuid.clone()),
        ];
        set(&driver_g, l.clone(), a.driver as f64);
        set(&unacc, l.clone(), a.unaccounted() as f64);
        set(
            &over,
            l,
            if a.over_limit(cfg.tolerance_bytes) {
                1.0
            } else {
                0.0
            },
        );
    }
    for (kind, n) in errors {
        set(&region_err, vec![("kind", kind.to_owned())], n as f64);
    }

    // The agent itself.
    let h = snap.agent.init_phases.clone();
    reg.register(
        "vgpu_init_phase_seconds",
        "cuInit stages of each new process (from its slot's phase stamps)",
        h,
    );
    let agent = &snap.agent;
    for (name, help, v) in [
        (
            "vgpu_monitor_scrape_duration_seconds",
            "Duration of the previous scrape",
            agent.last_scrape_ns as f64 / 1e9,
        ),
        (
            "vgpu_watchdog_kills",
            "Processes the watchdog killed (--enforce kill)",
            agent.watchdog_kills as f64,
        ),
        (
            "vgpu_watchdog_detections",
            "Times a container went over its device-memory limit (driver-reported)",
            agent.watchdog_detections as f64,
        ),
        (
            "vgpu_watchdog_cycle_seconds",
            "Duration of the watchdog's last cycle",
            agent.watchdog_cycle_ns as f64 / 1e9,
        ),
        (
            "vgpu_broker_ready",
            "1 while the host-PID broker serves its socket",
            if agent.broker_ready { 1.0 } else { 0.0 },
        ),
    ] {
        set(&gauge(reg, name, help), vec![], v);
    }

    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode_registry(&mut out, &root);
    if let Some(text) = &snap.agent.broker_text {
        out.push_str(text.strip_suffix("# EOF\n").unwrap_or(text));
    }
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// One parsed sample line of the text format: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// Parses exposition text (for tests and `vgpu node` diagnostics): every
/// sample line; comments skipped.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or(rest);
                let mut labels = Vec::new();
                let mut start = 0;
                while start < body.len() {
                    let Some(eq) = body[start..].find("=\"") else {
                        break;
                    };
                    let key = body[start..start + eq].trim_start_matches(',').to_owned();
                    let vstart = start + eq + 2;
                    let mut v = String::new();
                    let mut end = vstart;
                    let mut esc = false;
                    for (i, c) in body[vstart..].char_indices() {
                        end = vstart + i;
                        if esc {
                            v.push(if c == 'n' { '\n' } else { c });
                            esc = false;
                        } else if c == '\\' {
                            esc = true;
                        } else if c == '"' {
                            break;
                        } else {
                            v.push(c);
                        }
                    }
                    labels.push((key, v));
                    start = end + 1;
                }
                (n.to_owned(), labels)
            }
            None => (head.to_owned(), Vec::new()),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::GpuInfo;
    use crate::observe::{DeviceObs, PodRef, ProcObs};
    use vgpu_region::{
        DeviceSnapshot, HeaderInfo, IdentitySnapshot, PacingSnapshot, SlotLimiterSnapshot,
        SlotSnapshot,
    };

    const U: &str = "0a1b2c3d-0000-4000-8000-000000000001";
    const U2: &str = "0a1b2c3d-0000-4000-8000-000000000002";
    const GPU: &str = "GPU-11111111-2222-3333-4444-555555555555";
    const GIB: u64 = 1 << 30;

    fn pods(list: &[(&str, &str, &str)]) -> PodIndex {
        let mut ix = PodIndex::default();
        for (uid, ns, name) in list {
            ix.by_uid.insert(
                (*uid).into(),
                PodRef {
                    namespace: (*ns).into(),
                    name: (*name).into(),
                    uid: (*uid).into(),
                },
            );
        }
        ix
    }

    /// A region device: `used` split into context/module/data, the region's
    /// own copy of the limits, the share it paces at.
    fn dev(used: u64, ctx: u64, module: u64, mem: u64, sm: u32, share_ppm: u32) -> DeviceSnapshot {
        DeviceSnapshot {
            index: 0,
            uuid: GPU.into(),
            limits: vgpu_region::Limits { mem, sm },
            used,
            context: ctx,
            module,
            data: used - ctx - module,
            pacing: PacingSnapshot {
                credit_ns: 0,
                refill_at_ns: 0,
                charged_ns: 0,
                measured_ns: 0,
                waits: 0,
                share_ppm,
                mode: String::new(),
                correction_ppm: 0,
                util_ppm: 0,
                util_source: String::new(),
                util_at_ns: 0,
                util_window_ns: 0,
                sampler: None,
            },
        }
    }

    fn slot(
        index: u32,
        state: &str,
        failure: u32,
        fallbacks: Vec<(&'static str, u64)>,
    ) -> SlotSnapshot {
        SlotSnapshot {
            index,
            state: "live",
            pid: 1,
            pid_ns: 0,
            start_time: 0,
            host_pid: 0,
            claimed_ns: 0,
            identity: IdentitySnapshot {
                tier: "Broker".into(),
                state: state.into(),
                attempts: 1,
                failure,
                duration_ns: 0,
            },
            run_status: String::new(),
            phases: Vec::new(),
            fallbacks,
            devices: Vec::new(),
            limiter: SlotLimiterSnapshot {
                state: String::new(),
                reason: String::new(),
                since_ns: 0,
                devices: Vec::new(),
            },
        }
    }

    fn region(
        key: &str,
        devices: Vec<DeviceSnapshot>,
        slots: Vec<SlotSnapshot>,
    ) -> ContainerRegion {
        ContainerRegion {
            key: key.into(),
            path: None,
            snapshot: Some(Ok(vgpu_region::Snapshot {
                path: String::new(),
                header: HeaderInfo {
                    version: 3,
                    endianness: "little",
                    header_size: 0,
                    device_size: 0,
                    slot_size: 0,
                    slot_count: 0,
                    device_count: 1,
                    layout_hash: 0,
                    creator_pid: 0,
                    created_unix_ns: 0,
                    file_len: 0,
                },
                slot_high_water: slots.len() as u32,
                limits_generation: 0,
                devices,
                slots,
            })),
            limits: None,
        }
    }

    fn with_limits(mut r: ContainerRegion, text: &str) -> ContainerRegion {
        r.limits = Some(vgpu_region::limits::Limits::parse(text).unwrap());
        r
    }

    fn gpu(name: &str, used: u64, util: (u32, u32), processes: Vec<ProcObs>) -> DeviceObs {
        DeviceObs {
            info: GpuInfo {
                index: 0,
                uuid: GPU.into(),
                name: name.into(),
                memory_total: 16 * GIB,
                memory_used: used,
                bus_id: "0000:01:00.0".into(),
            },
            utilization: Some(util),
            processes,
            samples: Vec::new(),
            failed: false,
        }
    }

    fn proc(pid: u32, used: u64, container: Option<&str>) -> ProcObs {
        ProcObs {
            pid,
            start_time: 1,
            used_bytes: Some(used),
            container: container.map(str::to_owned),
        }
    }

    fn snap(
        pods: PodIndex,
        regions: Vec<ContainerRegion>,
        devices: Vec<DeviceObs>,
    ) -> NodeSnapshot {
        NodeSnapshot {
            pods: Arc::new(pods),
            regions,
            obs: Observation { devices },
            util: HashMap::new(),
            elapsed: HashMap::new(),
            audit: Vec::new(),
            agent: AgentFigures {
                init_phases: InitPhases::new_with_constructor(new_hist),
                last_scrape_ns: 0,
                watchdog_kills: 0,
                watchdog_detections: 0,
                watchdog_cycle_ns: 0,
                broker_ready: false,
                broker_text: None,
            },
        }
    }

    /// The value of the one sample `name` with exactly `labels` (and the
    /// `zone="vGPU"` every series carries).
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.push(("zone".into(), "vGPU".into()));
        want.sort();
        let hits: Vec<f64> = parse_exposition(text)
            .into_iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                let mut l = s.labels.clone();
                l.sort();
                l == want
            })
            .map(|s| s.value)
            .collect();
        assert!(hits.len() <= 1, "{name} {labels:?} twice in\n{text}");
        hits.first().copied()
    }

    fn names(text: &str) -> HashSet<String> {
        parse_exposition(text).into_iter().map(|s| s.name).collect()
    }

    fn ctr<'a>(ns: &'a str, pod: &'a str, c: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("namespace", ns),
            ("pod", pod),
            ("container", c),
            ("vdevice_index", "0"),
            ("device_uuid", GPU),
        ]
    }

    #[test]
    fn a_container_gets_memory_limit_usage_and_identity_lines() {
        let key = format!("{U}_main");
        let r = with_limits(
            region(
                &key,
                // The region's copy says 1 GiB / 50 %: the limits file wins.
                vec![dev(3 * GIB, 100, 200, GIB, 50, 300_000)],
                vec![
                    slot(0, "Resolved", 0, vec![("cuMemAllocManaged", 1)]),
                    slot(1, "Failed", 101, vec![("cuMemAllocManaged", 2)]),
                ],
            ),
            &format!("vgpu-limits 1\ndevice {GPU} memory={} sm=30\n", 4 * GIB),
        );
        let mut s = snap(
            pods(&[(U, "team-a", "train")]),
            vec![r],
            vec![gpu(
                "NVIDIA A100",
                5 * GIB,
                (70, 20),
                vec![proc(10, 3 * GIB + GIB / 2, Some(&key))],
            )],
        );
        s.util.insert((key.clone(), GPU.into()), 42);
        s.elapsed.insert((key.clone(), GPU.into()), 7);
        let cfg = NodeConfig::new("node-a");
        let t = render(&s, &cfg);
        let l = ctr("team-a", "train", "main");
        assert_eq!(
            value(&t, "hami_vgpu_memory_used_bytes", &l),
            Some((3 * GIB) as f64)
        );
        assert_eq!(
            value(&t, "hami_container_device_memory_bytes", &l),
            Some((3 * GIB) as f64)
        );
        assert_eq!(
            value(&t, "hami_vgpu_memory_limit_bytes", &l),
            Some((4 * GIB) as f64)
        );
        assert_eq!(value(&t, "hami_vgpu_memory_context_bytes", &l), Some(100.0));
        assert_eq!(value(&t, "hami_vgpu_memory_module_bytes", &l), Some(200.0));
        assert_eq!(
            value(&t, "hami_vgpu_memory_buffer_bytes", &l),
            Some((3 * GIB - 300) as f64)
        );
        assert_eq!(
            value(&t, "hami_container_device_utilization_ratio", &l),
            Some(42.0)
        );
        assert_eq!(
            value(&t, "hami_container_last_kernel_elapsed_seconds", &l),
            Some(7.0)
        );
        assert_eq!(value(&t, "vgpu_container_sm_limit_ratio", &l), Some(30.0));
        assert_eq!(value(&t, "vgpu_container_sm_ceiling_ratio", &l), Some(30.0));
        assert_eq!(value(&t, "vgpu_container_sm_share_ratio", &l), Some(30.0));
        // The driver's figure for the container, joined by cgroup.
        assert_eq!(
            value(&t, "vgpu_container_driver_memory_bytes", &l),
            Some((3 * GIB + GIB / 2) as f64)
        );
        assert_eq!(
            value(&t, "vgpu_container_unaccounted_bytes", &l),
            Some((GIB / 2) as f64)
        );
        assert_eq!(value(&t, "vgpu_container_over_limit", &l), Some(0.0));
        let base = &l[..3];
        assert_eq!(value(&t, "vgpu_container_processes", base), Some(2.0));
        let with = |k, v| [base, &[(k, v)]].concat();
        assert_eq!(
            value(
                &t,
                "vgpu_container_identity_slots",
                &[with("tier", "Broker"), vec![("state", "Failed")]].concat()
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "vgpu_container_identity_failures",
                &with("failure", "BROKER_MISSING")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "vgpu_container_fallbacks",
                &with("fallback", "cuMemAllocManaged")
            ),
            Some(3.0)
        );
        // Host series with HAMi's labels; the memory controller's has no node.
        let host = [
            ("node", "node-a"),
            ("device_index", "0"),
            ("device_uuid", GPU),
            ("device_type", "NVIDIA A100"),
        ];
        assert_eq!(
            value(&t, "hami_host_gpu_memory_used_bytes", &host),
            Some((5 * GIB) as f64)
        );
        assert_eq!(
            value(&t, "hami_host_gpu_utilization_ratio", &host),
            Some(70.0)
        );
        assert_eq!(
            value(
                &t,
                "hami_host_gpu_memory_controller_utilization_ratio",
                &host[1..]
            ),
            Some(20.0)
        );
        assert_eq!(
            value(
                &t,
                "vgpu_unattributed_memory_bytes",
                &[("device_uuid", GPU)]
            ),
            Some(0.0)
        );
        // No priority line, no errors: no series.
        assert!(!names(&t).contains("vgpu_container_priority_held"));
        assert!(!names(&t).contains("vgpu_region_errors"));
        assert!(
            t.contains("# HELP hami_vgpu_memory_limit_bytes vGPU device memory limit in bytes.\n")
        );
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn a_process_that_bypassed_the_interposer_is_attributed_by_its_cgroup() {
        let over = format!("{U}_main");
        let bypass = format!("{U2}_infer");
        let r = region(&over, vec![dev(GIB / 2, 0, 0, GIB, 0, 0)], vec![]);
        let s = snap(
            pods(&[(U, "team-a", "train"), (U2, "team-b", "serve")]),
            vec![r],
            vec![gpu(
                "NVIDIA A100",
                4 * GIB,
                (0, 0),
                vec![
                    // 2 GiB against a 1 GiB limit (tolerance 128 MiB): over.
                    proc(10, 2 * GIB, Some(&over)),
                    // No region at all: only its cgroup says whose it is.
                    proc(11, GIB, Some(&bypass)),
                    // Nobody's.
                    proc(12, 300, None),
                ],
            )],
        );
        let t = render(&s, &NodeConfig::new("node-a"));
        let b = ctr("team-b", "serve", "infer");
        assert_eq!(
            value(&t, "vgpu_container_driver_memory_bytes", &b),
            Some(GIB as f64)
        );
        assert_eq!(
            value(&t, "vgpu_container_unaccounted_bytes", &b),
            Some(GIB as f64)
        );
        assert_eq!(value(&t, "vgpu_container_over_limit", &b), Some(0.0));
        assert_eq!(value(&t, "hami_vgpu_memory_used_bytes", &b), None);
        let o = ctr("team-a", "train", "main");
        assert_eq!(
            value(&t, "vgpu_container_unaccounted_bytes", &o),
            Some((2 * GIB - GIB / 2) as f64)
        );
        assert_eq!(value(&t, "vgpu_container_over_limit", &o), Some(1.0));
        assert_eq!(
            value(
                &t,
                "vgpu_unattributed_memory_bytes",
                &[("device_uuid", GPU)]
            ),
            Some(300.0)
        );
    }

    #[test]
    fn legacy_names_only_when_asked_for() {
        let key = format!("{U}_main");
        let mut s = snap(
            pods(&[(U, "team-a", "train")]),
            vec![region(&key, vec![dev(1000, 100, 200, 4000, 0, 0)], vec![])],
            vec![gpu("NVIDIA A100", 5000, (60, 10), vec![])],
        );
        s.util.insert((key.clone(), GPU.into()), 9);
        let mut cfg = NodeConfig::new("node-a");
        let legacy = [
            "HostGPUMemoryUsage",
            "HostCoreUtilization",
            "vGPU_device_memory_usage_in_bytes",
            "vGPU_device_memory_limit_in_bytes",
            "Device_memory_desc_of_container",
            "Device_utilization_desc_of_container",
            "Device_last_kernel_of_container",
        ];
        let off = render(&s, &cfg);
        for n in legacy {
            assert!(!off.contains(n), "{n} without --legacy-metrics");
        }
        cfg.legacy_metrics = true;
        let on = render(&s, &cfg);
        let host = [
            ("nodeid", "node-a"),
            ("deviceidx", "0"),
            ("deviceuuid", GPU),
            ("devicetype", "NVIDIA A100"),
        ];
        assert_eq!(value(&on, "HostGPUMemoryUsage", &host), Some(5000.0));
        assert_eq!(value(&on, "HostCoreUtilization", &host), Some(60.0));
        let old = [
            ("podnamespace", "team-a"),
            ("podname", "train"),
            ("ctrname", "main"),
            ("vdeviceid", "0"),
            ("deviceuuid", GPU),
        ];
        assert_eq!(
            value(&on, "vGPU_device_memory_usage_in_bytes", &old),
            Some(1000.0)
        );
        assert_eq!(
            value(&on, "vGPU_device_memory_limit_in_bytes", &old),
            Some(4000.0)
        );
        assert_eq!(
            value(&on, "Device_utilization_desc_of_container", &old),
            Some(9.0)
        );
        let desc = [
            &old[..],
            &[
                ("context", "100"),
                ("module", "200"),
                ("data", "700"),
                ("offset", "0"),
            ],
        ]
        .concat();
        assert_eq!(
            value(&on, "Device_memory_desc_of_container", &desc),
            Some(1000.0)
        );
        // Never seen busy: no last-kernel line, old name or new.
        assert!(!names(&on).contains("Device_last_kernel_of_container"));
        assert!(!names(&on).contains("hami_container_last_kernel_elapsed_seconds"));
        // The new names stay.
        assert_eq!(
            value(
                &on,
                "hami_vgpu_memory_used_bytes",
                &ctr("team-a", "train", "main")
            ),
            Some(1000.0)
        );
    }

    #[test]
    fn a_dra_share_is_labelled_with_its_first_user() {
        let share = crate::layout::dra_share_key("claim-1", "gpu-0", Some("s1"));
        let mut ix = pods(&[(U, "team-a", "train"), (U2, "team-b", "serve")]);
        ix.dra_owners.insert(
            share.clone(),
            vec![(U.into(), "main".into()), (U2.into(), "infer".into())],
        );
        let s = snap(
            ix,
            vec![region(&share, vec![dev(2000, 0, 0, 8000, 25, 0)], vec![])],
            vec![],
        );
        let t = render(&s, &NodeConfig::new("node-a"));
        let l = ctr("team-a", "train", "main");
        assert_eq!(value(&t, "hami_vgpu_memory_used_bytes", &l), Some(2000.0));
        assert_eq!(value(&t, "hami_vgpu_memory_limit_bytes", &l), Some(8000.0));
        assert_eq!(value(&t, "vgpu_container_sm_limit_ratio", &l), Some(25.0));
        assert_eq!(
            value(
                &t,
                "hami_vgpu_memory_used_bytes",
                &ctr("team-b", "serve", "infer")
            ),
            None
        );
        assert!(!names(&t).contains("vgpu_region_errors"));
    }

    #[test]
    fn a_device_with_no_containers_and_the_agents_own_figures() {
        let mut s = snap(
            PodIndex::default(),
            vec![],
            vec![gpu("Tesla T4", 700, (3, 1), vec![])],
        );
        s.agent.last_scrape_ns = 1_500_000_000;
        s.agent.watchdog_kills = 2;
        s.agent.watchdog_detections = 5;
        s.agent.watchdog_cycle_ns = 250_000_000;
        s.agent.broker_ready = true;
        s.agent.broker_text = Some("# HELP broker_requests Requests.\n# TYPE broker_requests counter\nbroker_requests_total 4\n# EOF\n".into());
        let t = render(&s, &NodeConfig::new("node-a"));
        let host = [
            ("node", "node-a"),
            ("device_index", "0"),
            ("device_uuid", GPU),
            ("device_type", "NVIDIA-Tesla T4"),
        ];
        assert_eq!(
            value(&t, "hami_host_gpu_memory_used_bytes", &host),
            Some(700.0)
        );
        assert_eq!(
            value(
                &t,
                "vgpu_unattributed_memory_bytes",
                &[("device_uuid", GPU)]
            ),
            Some(0.0)
        );
        let n = names(&t);
        for c in [
            "hami_vgpu_memory_used_bytes",
            "hami_container_device_utilization_ratio",
            "vgpu_container_driver_memory_bytes",
        ] {
            assert!(!n.contains(c), "{c} without a container");
        }
        assert_eq!(
            value(&t, "vgpu_monitor_scrape_duration_seconds", &[]),
            Some(1.5)
        );
        assert_eq!(value(&t, "vgpu_watchdog_kills", &[]), Some(2.0));
        assert_eq!(value(&t, "vgpu_watchdog_detections", &[]), Some(5.0));
        assert_eq!(value(&t, "vgpu_watchdog_cycle_seconds", &[]), Some(0.25));
        assert_eq!(value(&t, "vgpu_broker_ready", &[]), Some(1.0));
        // The broker's series come last, inside the one EOF.
        let b = t.find("broker_requests_total 4\n").unwrap();
        assert!(b > t.find("vgpu_broker_ready").unwrap());
        assert_eq!(t.matches("# EOF").count(), 1);
        assert!(t.ends_with("broker_requests_total 4\n# EOF\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let key = format!("{U}_main");
        let mut s = snap(
            pods(&[(U, "team-a", "train")]),
            vec![region(&key, vec![dev(1, 0, 0, 0, 0, 0)], vec![])],
            vec![gpu("Odd \"GPU\" \\ v2", 1, (0, 0), vec![])],
        );
        s.audit.push(crate::boards::Violation {
            key: key.clone(),
            uuid: GPU.into(),
            why: "claims \"50%\"\nabove".into(),
        });
        let t = render(&s, &NodeConfig::new("node-a"));
        assert!(
            t.contains(r#"device_type="NVIDIA-Odd \"GPU\" \\ v2""#),
            "{t}"
        );
        assert!(t.contains(r#"reason="claims \"50%\"\nabove""#), "{t}");
        let host = [
            ("node", "node-a"),
            ("device_index", "0"),
            ("device_uuid", GPU),
            ("device_type", "NVIDIA-Odd \"GPU\" \\ v2"),
        ];
        assert_eq!(
            value(&t, "hami_host_gpu_memory_used_bytes", &host),
            Some(1.0)
        );
        let audit = [
            ("namespace", "team-a"),
            ("pod", "train"),
            ("container", "main"),
            ("device_uuid", GPU),
            ("reason", "claims \"50%\"\nabove"),
        ];
        assert_eq!(value(&t, "vgpu_board_audit_violations", &audit), Some(1.0));
    }

    #[test]
    fn unknown_pods_and_unreadable_regions_are_counted() {
        let mut bad = region(&format!("{U}_main"), vec![], vec![]);
        bad.snapshot = Some(Err("truncated".into()));
        let stranger = region(&format!("{U2}_x"), vec![dev(5, 0, 0, 0, 0, 0)], vec![]);
        let held = with_limits(
            region(&format!("{U}_low"), vec![], vec![]),
            "vgpu-limits 1\npriority 1\nhold 10\n",
        );
        let s = snap(
            pods(&[(U, "team-a", "train")]),
            vec![bad, stranger, held],
            vec![],
        );
        let t = render(&s, &NodeConfig::new("node-a"));
        assert_eq!(
            value(&t, "vgpu_region_errors", &[("kind", "unreadable")]),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "vgpu_region_errors", &[("kind", "pod_unknown")]),
            Some(1.0)
        );
        let low = [
            ("namespace", "team-a"),
            ("pod", "train"),
            ("container", "low"),
        ];
        assert_eq!(value(&t, "vgpu_container_priority_held", &low), Some(1.0));
        // An unknown pod's region exports nothing under anyone's name.
        assert!(!names(&t).contains("hami_vgpu_memory_used_bytes"));
    }
}
