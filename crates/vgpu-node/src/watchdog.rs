//! The watchdog: what only the node side can enforce. Each cycle joins the
//! driver's truth (NVML per-process memory by host PID) to containers
//! through cgroups — a process that bypassed the interposer is attributed
//! all the same — and compares it with the container's limit (the limits
//! file, else the region's copy) and ledger. Report only by default; with
//! `--enforce kill`, a container over its limit beyond the tolerance for
//! longer than the grace loses its newest process on that GPU (SIGKILL
//! through a pidfd checked against the start time, so a reused PID is never
//! hit), and the pod gets a Kubernetes Event. Nothing else is touched.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Enforce, NodeConfig};
use crate::kube_api::KubeApi;
use crate::monitor::{assess, Assessment, PodCache, WatchdogStats};
use crate::nvml::Gpus;
use crate::observe::{self, Resolver};

/// A process the watchdog killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    /// Container key.
    pub key: String,
    /// GPU.
    pub uuid: String,
    /// Host PID (for the Event message and the log; never a metric label).
    pub pid: u32,
    /// Driver bytes of the container on that GPU.
    pub driver: u64,
    /// Its limit.
    pub limit: u64,
}

/// What one cycle found and did.
#[derive(Clone, Debug, Default)]
pub struct CycleReport {
    /// Every (container, GPU) judged.
    pub assessments: Vec<Assessment>,
    /// Those over the limit + tolerance now.
    pub over: Vec<(String, String)>,
    /// Processes killed.
    pub kills: Vec<Kill>,
}

/// The watchdog's state across cycles.
pub struct Watchdog {
    cfg: Arc<NodeConfig>,
    gpus: Arc<dyn Gpus>,
    pods: Arc<PodCache>,
    resolver: Resolver,
    stats: Arc<WatchdogStats>,
    over_since: HashMap<(String, String), Instant>,
}

fn kill_checked(proc_root: &std::path::Path, pid: u32, start_time: u64) -> Result<(), String> {
    let p = rustix::process::Pid::from_raw(pid as i32).ok_or("pid 0")?;
    let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open: {e}"))?;
    // The pidfd pins the process: if it is still the one we judged, the
    // signal reaches it and nothing else.
    if crate::procfs::start_time(proc_root, pid) != Some(start_time) {
        return Err("the process changed (exited, PID reused)".into());
    }
    rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL)
        .map_err(|e| format!("pidfd_send_signal: {e}"))
}

impl Watchdog {
    /// A watchdog over these sources.
    pub fn new(
        cfg: Arc<NodeConfig>,
        gpus: Arc<dyn Gpus>,
        pods: Arc<PodCache>,
        stats: Arc<WatchdogStats>,
    ) -> Watchdog {
        Watchdog {
            cfg,
            gpus,
            pods,
            resolver: Resolver::new("/proc"),
            stats,
            over_since: HashMap::new(),
        }
    }

    /// One cycle at `now`.
    pub fn cycle(&mut self, now: Instant) -> CycleReport {
        let t0 = Instant::now();
        let pods = self.pods.get();
        let regions = observe::scan_regions(&self.cfg.layout);
        let slot_pids = observe::slot_pids(&regions);
        // Memory only: utilization samples are the monitor's.
        let obs = observe::observe(
            self.gpus.as_ref(),
            &self.resolver,
            &pods,
            &slot_pids,
            &|_| u64::MAX,
        )
        .unwrap_or_default();
        let assessments = assess(&regions, &obs.driver_memory());
        let mut rep = CycleReport::default();
        let tol = self.cfg.tolerance_bytes;
        let mut still_over = HashMap::new();
        for a in &assessments {
            if !a.over_limit(tol) {
                continue;
            }
            let k = (a.key.clone(), a.uuid.clone());
            let since = *self.over_since.get(&k).unwrap_or(&now);
            rep.over.push(k.clone());
            tracing::warn!(
                container = %a.key, device = %a.uuid, driver = a.driver, limit = a.limit, ledger = a.ledger,
                "container over its device-memory limit (driver-reported)"
            );
            if self.cfg.enforce == Enforce::Kill && now.duration_since(since) >= self.cfg.grace {
                let newest = obs
                    .devices
                    .iter()
                    .filter(|d| d.info.uuid == a.uuid)
                    .flat_map(|d| d.processes.iter())
                    .filter(|p| p.container.as_deref() == Some(a.key.as_str()) && p.start_time > 0)
                    .max_by_key(|p| (p.start_time, p.pid));
                if let Some(p) = newest {
                    match kill_checked(self.resolver.proc_root(), p.pid, p.start_time) {
                        Ok(()) => {
                            self.stats.kills.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(container = %a.key, device = %a.uuid, pid = p.pid, "killed the container's newest GPU process");
                            rep.kills.push(Kill {
                                key: a.key.clone(),
                                uuid: a.uuid.clone(),
                                pid: p.pid,
                                driver: a.driver,
                                limit: a.limit,
                            });
                        }
                        Err(e) => tracing::warn!(pid = p.pid, "not killed: {e}"),
                    }
                }
                // The grace starts again for whatever is left.
                still_over.insert(k, now);
            } else {
                still_over.insert(k, since);
            }
        }
        self.over_since = still_over;
        rep.assessments = assessments;
        self.stats.cycles.fetch_add(1, Ordering::Relaxed);
        self.stats
            .cycle_ns
            .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        rep
    }

    /// Runs cycles every `watchdog_interval` until `shutdown`, posting an
    /// Event for each kill.
    pub async fn run(
        mut self,
        kube: Option<KubeApi>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let every = self.cfg.watchdog_interval.max(Duration::from_millis(100));
        loop {
            let (me, rep) = match tokio::task::spawn_blocking(move || {
                let rep = self.cycle(Instant::now());
                (self, rep)
            })
            .await
            {
                Ok(x) => x,
                Err(_) => return,
            };
            self = me;
            if let Some(k) = &kube {
                let pods = self.pods.get();
                for kill in &rep.kills {
                    let Some((uid, ctr)) = crate::layout::parse_container_key(&kill.key) else {
                        continue;
                    };
                    let Some(pod) = pods.pods.get(uid) else {
                        continue;
                    };
                    let msg = format!(
                        "vgpu watchdog killed host pid {} of container {ctr}: the driver reports {} MiB on {} against a limit of {} MiB (tolerance {} MiB, grace {} s)",
                        kill.pid,
                        kill.driver >> 20,
                        kill.uuid,
                        kill.limit >> 20,
                        self.cfg.tolerance_bytes >> 20,
                        self.cfg.grace.as_secs()
                    );
                    if let Err(e) = k
                        .pod_event(pod, "Warning", "VgpuMemoryOverLimit", &msg)
                        .await
                    {
                        tracing::warn!("recording the kill as an Event: {e}");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
