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
    let scrape = gauge(
        reg,
        "vgpu_monitor_scrape_duration_seconds",
        "Duration of the previous scrape",
    );
    set(&scrape, vec![], snap.agent.last_scrape_ns as f64 / 1e9);
    let kills = gauge(
        reg,
        "vgpu_watchdog_kills",
        "Processes the watchdog killed (--enforce kill)",
    );
    set(&kills, vec![], snap.agent.watchdog_kills as f64);
    let detections = gauge(
        reg,
        "vgpu_watchdog_detections",
        "Times a container went over its device-memory limit (driver-reported)",
    );
    set(&detections, vec![], snap.agent.watchdog_detections as f64);
    let cycle = gauge(
        reg,
        "vgpu_watchdog_cycle_seconds",
        "Duration of the watchdog's last cycle",
    );
    set(&cycle, vec![], snap.agent.watchdog_cycle_ns as f64 / 1e9);
    let bready = gauge(
        reg,
        "vgpu_broker_ready",
        "1 while the host-PID broker serves its socket",
    );
    set(
        &bready,
        vec![],
        if snap.agent.broker_ready { 1.0 } else { 0.0 },
    );

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
                            v.push(c);
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
