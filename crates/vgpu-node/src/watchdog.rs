//! The watchdog: what only the node side can enforce. Each cycle joins the
//! driver's truth (NVML per-process memory by host PID) to containers
//! through cgroups — a process that bypassed the interposer is attributed
//! all the same — and compares it with the container's limit (the limits
//! file, else the region's copy) and ledger.
//!
//! Observe → decide → act: [`Watchdog::cycle`] observes (regions, NVML,
//! procfs), [`decide`] is pure (what to report, whom to kill), and the
//! cycle applies the kills; [`Watchdog::run`] posts the Events. When a
//! container first goes over, it is reported (log line, metric, Event)
//! with the process most likely at fault: the one whose driver memory its
//! own slot accounts least for (a process without libvgpu.so, one that
//! reached the driver past the hooks or zeroed its counters). With
//! `--enforce kill`, a container still over after the grace loses that
//! process (SIGKILL through a pidfd checked against the start time, so a
//! reused PID is never hit). Nothing else is touched.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::config::{Enforce, NodeConfig};
use crate::kube_api::NodeKube;
use crate::monitor::{assess, Assessment, PodCache, WatchdogStats};
use crate::nvml::Gpus;
use crate::observe::{self, PodIndex, Resolver};

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

/// A (container, GPU) that went over its limit this cycle (it was not the
/// cycle before).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    /// Container key.
    pub key: String,
    /// GPU.
    pub uuid: String,
    /// Driver bytes of the container on that GPU.
    pub driver: u64,
    /// Its limit.
    pub limit: u64,
    /// What its ledger accounts for.
    pub ledger: u64,
    /// The process most likely at fault and the driver bytes its slot does
    /// not account for.
    pub suspect: Option<(u32, u64)>,
}

/// What one cycle found and did.
#[derive(Clone, Debug, Default)]
pub struct CycleReport {
    /// Every (container, GPU) judged.
    pub assessments: Vec<Assessment>,
    /// Those over the limit + tolerance now.
    pub over: Vec<(String, String)>,
    /// Those that went over this cycle.
    pub detections: Vec<Detection>,
    /// Processes killed.
    pub kills: Vec<Kill>,
}

/// One GPU process of a container, as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Container key.
    pub key: String,
    /// GPU.
    pub uuid: String,
    /// Host PID.
    pub pid: u32,
    /// Start time (ticks): what the kill is checked against.
    pub start_time: u64,
    /// Driver bytes.
    pub used: u64,
    /// What its own slot accounts for on that GPU (0: no slot).
    pub ledger: u64,
}

impl Candidate {
    fn unaccounted(&self) -> u64 {
        self.used.saturating_sub(self.ledger)
    }
}

/// The decision's settings.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Kill after the grace, or only report.
    pub enforce: Enforce,
    /// Driver bytes above the limit tolerated.
    pub tolerance: u64,
    /// How long a container stays over before a kill.
    pub grace: Duration,
}

/// What the watchdog does this cycle.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// Over the limit + tolerance now.
    pub over: Vec<(String, String)>,
    /// Newly over.
    pub detections: Vec<Detection>,
    /// (process, why) to kill.
    pub kills: Vec<(Candidate, Kill)>,
    /// When each (container, GPU) still over went over (the grace clock).
    pub over_since: HashMap<(String, String), Instant>,
}

/// The process of `key` on `uuid` most likely at fault: the most driver
/// bytes its own slot does not account for, the newest on a tie.
fn suspect<'a>(candidates: &'a [Candidate], key: &str, uuid: &str) -> Option<&'a Candidate> {
    candidates
        .iter()
        .filter(|c| c.key == key && c.uuid == uuid && c.start_time > 0)
        .max_by_key(|c| (c.unaccounted(), c.start_time, c.pid))
}

/// Pure: what to report and whom to kill, given what was observed and when
/// each (container, GPU) went over.
pub fn decide(
    assessments: &[Assessment],
    candidates: &[Candidate],
    over_since: &HashMap<(String, String), Instant>,
    now: Instant,
    policy: Policy,
) -> Decision {
    let mut d = Decision::default();
    for a in assessments {
        if !a.over_limit(policy.tolerance) {
            continue;
        }
        let k = (a.key.clone(), a.uuid.clone());
        let sus = suspect(candidates, &a.key, &a.uuid);
        let since = match over_since.get(&k) {
            Some(t) => *t,
            None => {
                d.detections.push(Detection {
                    key: a.key.clone(),
                    uuid: a.uuid.clone(),
                    driver: a.driver,
                    limit: a.limit,
                    ledger: a.ledger,
                    suspect: sus.map(|c| (c.pid, c.unaccounted())),
                });
                now
            }
        };
        d.over.push(k.clone());
        if policy.enforce == Enforce::Kill && now.duration_since(since) >= policy.grace {
            if let Some(c) = sus {
                d.kills.push((
                    c.clone(),
                    Kill {
                        key: a.key.clone(),
                        uuid: a.uuid.clone(),
                        pid: c.pid,
                        driver: a.driver,
                        limit: a.limit,
                    },
                ));
            }
            // The grace starts again for whatever is left.
            d.over_since.insert(k, now);
        } else {
            d.over_since.insert(k, since);
        }
    }
    d
}

/// Every attributed GPU process with what its own slot accounts for. A
/// slot names its process by host PID once the interposer knows it; a
/// memory-only process may never need it, so a slot is also matched by
/// (PID namespace, PID inside it, start time) read from the host's procfs.
fn candidates(
    obs: &observe::Observation,
    regions: &[observe::ContainerRegion],
    proc_root: &std::path::Path,
) -> Vec<Candidate> {
    // (slot identity, GPU) → the slot's admission total there.
    let mut by_host: HashMap<(u32, &str), u64> = HashMap::new();
    let mut by_ns: HashMap<((u64, u32, u64), &str), u64> = HashMap::new();
    for r in regions {
        let Some(Ok(s)) = &r.snapshot else { continue };
        for slot in &s.slots {
            for sd in &slot.devices {
                let Some(dev) = s.devices.iter().find(|d| d.index == sd.index) else {
                    continue;
                };
                let uuid = dev.uuid.as_str();
                if slot.host_pid != 0 {
                    *by_host.entry((slot.host_pid, uuid)).or_default() += sd.usage.total;
                } else if slot.pid_ns != 0 {
                    *by_ns
                        .entry(((slot.pid_ns, slot.pid, slot.start_time), uuid))
                        .or_default() += sd.usage.total;
                }
            }
        }
    }
    let mut out = Vec::new();
    for d in &obs.devices {
        let uuid = d.info.uuid.as_str();
        for p in &d.processes {
            let (Some(key), Some(used)) = (&p.container, p.used_bytes) else {
                continue;
            };
            let ledger = by_host.get(&(p.pid, uuid)).copied().or_else(|| {
                let i = crate::procfs::info(proc_root, p.pid)?;
                by_ns
                    .get(&((i.pid_ns?, i.ns_pid?, i.start_time), uuid))
                    .copied()
            });
            out.push(Candidate {
                key: key.clone(),
                uuid: d.info.uuid.clone(),
                pid: p.pid,
                start_time: p.start_time,
                used,
                ledger: ledger.unwrap_or(0),
            });
        }
    }
    out
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

/// A Warning Event the watchdog posts about a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct OverLimitEvent {
    /// The pod.
    pub pod: Pod,
    /// `VgpuMemoryOverLimitDetected` or `VgpuMemoryOverLimit` (a kill).
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// The Events for one cycle's detections and kills, for the containers of
/// pods the index knows (others are logged only).
pub fn events(rep: &CycleReport, pods: &PodIndex, cfg: &NodeConfig) -> Vec<OverLimitEvent> {
    let pod_of = |key: &str| {
        let (uid, ctr) = pods.owner_of(key)?;
        Some((pods.pods.get(uid)?, ctr.to_owned()))
    };
    let mut out = Vec::new();
    for det in &rep.detections {
        let Some((pod, ctr)) = pod_of(&det.key) else {
            continue;
        };
        let suspect = match det.suspect {
            Some((pid, b)) => format!(
                "; most unaccounted: host pid {pid} ({} MiB its slot does not account for)",
                b >> 20
            ),
            None => String::new(),
        };
        let message = format!(
            "vgpu watchdog: the driver reports {} MiB for container {ctr} on {} against a limit of {} MiB (tolerance {} MiB; the ledger accounts for {} MiB){suspect}; enforce={}",
            det.driver >> 20,
            det.uuid,
            det.limit >> 20,
            cfg.tolerance_bytes >> 20,
            det.ledger >> 20,
            if cfg.enforce == Enforce::Kill { "kill" } else { "report" },
        );
        out.push(OverLimitEvent {
            pod: pod.clone(),
            reason: "VgpuMemoryOverLimitDetected",
            message,
        });
    }
    for kill in &rep.kills {
        let Some((pod, ctr)) = pod_of(&kill.key) else {
            continue;
        };
        let message = format!(
            "vgpu watchdog killed host pid {} of container {ctr}: the driver reports {} MiB on {} against a limit of {} MiB (tolerance {} MiB, grace {} s)",
            kill.pid,
            kill.driver >> 20,
            kill.uuid,
            kill.limit >> 20,
            cfg.tolerance_bytes >> 20,
            cfg.grace.as_secs()
        );
        out.push(OverLimitEvent {
            pod: pod.clone(),
            reason: "VgpuMemoryOverLimit",
            message,
        });
    }
    out
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

    /// One cycle at `now`: observe, decide, kill.
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
        let policy = Policy {
            enforce: self.cfg.enforce,
            tolerance: self.cfg.tolerance_bytes,
            grace: self.cfg.grace,
        };
        let d = decide(
            &assessments,
            &candidates(&obs, &regions, self.resolver.proc_root()),
            &self.over_since,
            now,
            policy,
        );
        for det in &d.detections {
            self.stats.detections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                container = %det.key, device = %det.uuid, driver = det.driver, limit = det.limit,
                ledger = det.ledger, suspect_pid = det.suspect.map(|s| s.0),
                "container over its device-memory limit (driver-reported)"
            );
        }
        let mut rep = CycleReport {
            over: d.over,
            detections: d.detections,
            ..CycleReport::default()
        };
        for (c, kill) in d.kills {
            match kill_checked(self.resolver.proc_root(), c.pid, c.start_time) {
                Ok(()) => {
                    self.stats.kills.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(container = %kill.key, device = %kill.uuid, pid = c.pid, "killed the container's most unaccounted GPU process");
                    rep.kills.push(kill);
                }
                Err(e) => tracing::warn!(pid = c.pid, "not killed: {e}"),
            }
        }
        self.over_since = d.over_since;
        rep.assessments = assessments;
        self.stats.cycles.fetch_add(1, Ordering::Relaxed);
        self.stats
            .cycle_ns
            .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        rep
    }

    /// Runs cycles every `watchdog_interval` until `shutdown`, posting an
    /// Event for each detection and each kill.
    pub async fn run<K: NodeKube>(
        mut self,
        kube: Option<K>,
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
                for e in events(&rep, &self.pods.get(), &self.cfg) {
                    if let Err(err) = k.pod_event(&e.pod, "Warning", e.reason, &e.message).await {
                        tracing::warn!("recording {} as an Event: {err}", e.reason);
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn over(key: &str, driver: u64) -> Assessment {
        Assessment {
            key: key.into(),
            vdevice: 0,
            uuid: "GPU-0".into(),
            ledger: 512 * MIB,
            limit: 1024 * MIB,
            driver,
        }
    }

    fn proc(key: &str, pid: u32, start: u64, used: u64, ledger: u64) -> Candidate {
        Candidate {
            key: key.into(),
            uuid: "GPU-0".into(),
            pid,
            start_time: start,
            used,
            ledger,
        }
    }

    fn policy(enforce: Enforce) -> Policy {
        Policy {
            enforce,
            tolerance: 64 * MIB,
            grace: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_container_going_over_is_detected_once_with_its_least_accounted_process() {
        let now = Instant::now();
        // The bypassing process (no slot) is older than the limited one:
        // "newest" would have picked the wrong one.
        let cands = [
            proc("a", 10, 100, 1024 * MIB, 0),
            proc("a", 11, 200, 768 * MIB, 768 * MIB),
            proc("b", 12, 300, 4096 * MIB, 0),
        ];
        let a = [over("a", 1792 * MIB), over("b", 100 * MIB)];
        let d = decide(&a, &cands, &HashMap::new(), now, policy(Enforce::Report));
        assert_eq!(d.over, [("a".to_owned(), "GPU-0".to_owned())]);
        assert_eq!(d.detections.len(), 1);
        assert_eq!(d.detections[0].suspect, Some((10, 1024 * MIB)));
        assert!(d.kills.is_empty(), "report mode kills nothing");
        // The next cycle: still over, not detected again.
        let d2 = decide(
            &a,
            &cands,
            &d.over_since,
            now + Duration::from_secs(5),
            policy(Enforce::Report),
        );
        assert!(d2.detections.is_empty());
        assert_eq!(d2.over_since[&("a".to_owned(), "GPU-0".to_owned())], now);
    }

    #[test]
    fn kill_waits_for_the_grace_and_takes_the_suspect_only() {
        let now = Instant::now();
        let cands = [
            proc("a", 10, 100, 1024 * MIB, 0),
            proc("a", 11, 200, 768 * MIB, 768 * MIB),
        ];
        let a = [over("a", 1792 * MIB)];
        let d = decide(&a, &cands, &HashMap::new(), now, policy(Enforce::Kill));
        assert!(d.kills.is_empty(), "within the grace");
        let later = now + Duration::from_millis(1500);
        let d = decide(&a, &cands, &d.over_since, later, policy(Enforce::Kill));
        assert_eq!(d.kills.len(), 1);
        assert_eq!(d.kills[0].0.pid, 10);
        assert_eq!(d.kills[0].1.driver, 1792 * MIB);
        // The grace restarts for what is left.
        assert_eq!(d.over_since[&("a".to_owned(), "GPU-0".to_owned())], later);
    }

    #[test]
    fn a_process_that_zeroed_its_own_counters_is_the_suspect() {
        let now = Instant::now();
        // Both have slots; 11 reports 0 in its slot while holding 1 GiB.
        let cands = [
            proc("a", 10, 300, 600 * MIB, 600 * MIB),
            proc("a", 11, 100, 1024 * MIB, 0),
        ];
        let d = decide(
            &[over("a", 1624 * MIB)],
            &cands,
            &HashMap::new(),
            now,
            policy(Enforce::Report),
        );
        assert_eq!(d.detections[0].suspect, Some((11, 1024 * MIB)));
        // All accounted: the newest (the allocation that crossed is likely its).
        let cands = [
            proc("a", 10, 300, 900 * MIB, 900 * MIB),
            proc("a", 11, 100, 900 * MIB, 900 * MIB),
        ];
        let d = decide(
            &[over("a", 1800 * MIB)],
            &cands,
            &HashMap::new(),
            now,
            policy(Enforce::Report),
        );
        assert_eq!(d.detections[0].suspect, Some((10, 0)));
    }

    #[test]
    fn under_the_tolerance_or_unlimited_is_never_over_and_a_gone_process_is_not_a_suspect() {
        let now = Instant::now();
        let mut unlimited = over("a", 10_000 * MIB);
        unlimited.limit = 0;
        let d = decide(
            &[over("a", 1024 * MIB + 64 * MIB), unlimited],
            &[proc("a", 10, 100, 5000 * MIB, 0)],
            &HashMap::new(),
            now,
            policy(Enforce::Kill),
        );
        assert!(d.over.is_empty() && d.detections.is_empty());
        // Over, but its only process already exited (start time 0).
        let since: HashMap<_, _> = [(("a".to_owned(), "GPU-0".to_owned()), now)].into();
        let d = decide(
            &[over("a", 2048 * MIB)],
            &[proc("a", 10, 0, 2048 * MIB, 0)],
            &since,
            now + Duration::from_secs(10),
            policy(Enforce::Kill),
        );
        assert!(d.kills.is_empty());
    }

    #[test]
    fn events_name_the_pod_container_figures_and_mode() {
        let uid = "0a1b2c3d-0000-4000-8000-000000000001";
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": "team-a", "name": "train", "uid": uid },
            "spec": { "containers": [{ "name": "main" }] },
        }))
        .unwrap();
        let pods = PodIndex::new(std::slice::from_ref(&pod));
        let key = format!("{uid}_main");
        let rep = CycleReport {
            detections: vec![
                Detection {
                    key: key.clone(),
                    uuid: "GPU-0".into(),
                    driver: 2048 * MIB,
                    limit: 1024 * MIB,
                    ledger: 512 * MIB,
                    suspect: Some((4242, 1536 * MIB)),
                },
                // A container of a pod the index does not know: no Event.
                Detection {
                    key: "0a1b2c3d-0000-4000-8000-00000000ffff_x".into(),
                    uuid: "GPU-0".into(),
                    driver: 2048 * MIB,
                    limit: 1024 * MIB,
                    ledger: 0,
                    suspect: None,
                },
            ],
            kills: vec![Kill {
                key,
                uuid: "GPU-0".into(),
                pid: 4242,
                driver: 2048 * MIB,
                limit: 1024 * MIB,
            }],
            ..CycleReport::default()
        };
        let mut cfg = NodeConfig::new("node-a");
        cfg.enforce = Enforce::Kill;
        cfg.tolerance_bytes = 64 * MIB;
        cfg.grace = Duration::from_secs(30);
        let ev = events(&rep, &pods, &cfg);
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(ev.iter().all(|e| e.pod == pod));
        assert_eq!(ev[0].reason, "VgpuMemoryOverLimitDetected");
        assert_eq!(
            ev[0].message,
            "vgpu watchdog: the driver reports 2048 MiB for container main on GPU-0 against a limit of 1024 MiB (tolerance 64 MiB; the ledger accounts for 512 MiB); most unaccounted: host pid 4242 (1536 MiB its slot does not account for); enforce=kill"
        );
        assert_eq!(ev[1].reason, "VgpuMemoryOverLimit");
        assert_eq!(
            ev[1].message,
            "vgpu watchdog killed host pid 4242 of container main: the driver reports 2048 MiB on GPU-0 against a limit of 1024 MiB (tolerance 64 MiB, grace 30 s)"
        );
        cfg.enforce = Enforce::Report;
        let rep = CycleReport {
            kills: vec![],
            ..rep
        };
        let ev = events(&rep, &pods, &cfg);
        assert_eq!(ev.len(), 1);
        assert!(
            ev[0].message.ends_with("; enforce=report"),
            "{}",
            ev[0].message
        );
    }
}
