//! Slots and caches. The agent sees every PID namespace (`hostPID`), so it
//! frees region slots whose owners are gone in any namespace — e.g. the
//! slots a restarted container left in its old namespace, whose bytes would
//! otherwise count forever — judging a slot dead only when no live process
//! of the slot's namespace has the slot's PID (never on a guess: an unknown
//! namespace is alive). It removes `containers/<podUID>_<ctr>` and
//! `limits/<podUID>_<ctr>` once the pod has been gone from the API for the
//! grace (HAMi: 5 min) and the directory is that old too. A pod that exists
//! keeps its directories whatever its state; a failed pod list removes
//! nothing.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use crate::layout::{self, Layout};
use crate::observe;
use crate::procfs;

/// Live processes by (PID namespace inode, PID in it).
#[derive(Clone, Debug, Default)]
pub struct LiveProcesses {
    by_ns: HashMap<u64, HashSet<u32>>,
}

impl LiveProcesses {
    /// Scans `proc_root`.
    pub fn scan(proc_root: &Path) -> LiveProcesses {
        let mut by_ns: HashMap<u64, HashSet<u32>> = HashMap::new();
        for pid in procfs::list_pids(proc_root) {
            if let Some(i) = procfs::info(proc_root, pid) {
                if let (Some(ns), Some(p)) = (i.pid_ns, i.ns_pid) {
                    by_ns.entry(ns).or_default().insert(p);
                }
            }
        }
        LiveProcesses { by_ns }
    }

    /// Is the owner of a slot dead? Only when its namespace is known and no
    /// live process there has its PID. A namespace with no live process at
    /// all (the container is gone) makes every slot of it dead.
    pub fn owner_dead(&self, o: &vgpu_region::SlotOwner) -> bool {
        if o.pid_ns == 0 {
            return false;
        }
        !self
            .by_ns
            .get(&o.pid_ns)
            .is_some_and(|s| s.contains(&o.pid))
    }
}

/// Frees dead slots in every region under `layout`; returns how many.
pub fn reclaim_slots(layout: &Layout, live: &LiveProcesses) -> usize {
    let Ok(rd) = std::fs::read_dir(layout.containers_dir()) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.filter_map(|e| e.ok()) {
        let Some(path) = observe::region_file(&e.path()) else {
            continue;
        };
        // Read-only first: most regions have nothing to free.
        let any_dead = vgpu_region::Region::open_read_only(&path)
            .map(|r| r.snapshot())
            .is_ok_and(|s| {
                s.slots.iter().any(|sl| {
                    live.owner_dead(&vgpu_region::SlotOwner {
                        slot: vgpu_region::SlotId(sl.index),
                        reclaiming: sl.state != "live",
                        pid: sl.pid,
                        pid_ns: sl.pid_ns,
                        start_time_low34: 0,
                        start_time: sl.start_time,
                        host_pid: sl.host_pid,
                    })
                })
            });
        if !any_dead {
            continue;
        }
        match vgpu_region::Region::open(&path) {
            Ok(r) => {
                let freed = r.reclaim_where(|o| live.owner_dead(o));
                if freed > 0 {
                    tracing::info!(region = %path.display(), freed, "reclaimed slots of dead processes");
                }
                n += freed;
            }
            Err(e) => tracing::warn!(region = %path.display(), "cannot open for reclaim: {e}"),
        }
    }
    n
}

/// Tracks since when each pod UID has been missing.
#[derive(Debug, Default)]
pub struct CacheGc {
    gone_since: HashMap<String, Instant>,
}

/// What one pass removed and kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Keys whose directories were removed.
    pub removed: Vec<String>,
    /// Keys of gone pods still inside the grace.
    pub waiting: Vec<String>,
}

fn older_than(path: &Path, grace: Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() >= grace)
        .unwrap_or(false)
}

impl CacheGc {
    /// One pass: `pod_uids` are the pods bound to this node now (a
    /// successful list); `live` judges whether a region still has a live
    /// process (then nothing is removed whatever the API says).
    pub fn pass(
        &mut self,
        layout: &Layout,
        pod_uids: &HashSet<String>,
        live: &LiveProcesses,
        grace: Duration,
        now: Instant,
    ) -> GcReport {
        let mut rep = GcReport::default();
        let mut keys: HashSet<String> = HashSet::new();
        for dir in [layout.containers_dir(), layout.limits_root()] {
            if let Ok(rd) = std::fs::read_dir(&dir) {
                keys.extend(
                    rd.filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|k| layout::parse_container_key(k).is_some()),
                );
            }
        }
        let mut missing = HashSet::new();
        let mut keys: Vec<String> = keys.into_iter().collect();
        keys.sort();
        for key in keys {
            let Some((uid, _)) = layout::parse_container_key(&key) else {
                continue;
            };
            if pod_uids.contains(uid) {
                continue;
            }
            missing.insert(uid.to_owned());
            let since = *self.gone_since.entry(uid.to_owned()).or_insert(now);
            let region_dir = layout.region_dir(&key);
            let in_use = observe::region_file(&region_dir)
                .and_then(|p| vgpu_region::Region::open_read_only(&p).ok())
                .is_some_and(|r| {
                    r.snapshot().slots.iter().any(|s| {
                        !live.owner_dead(&vgpu_region::SlotOwner {
                            slot: vgpu_region::SlotId(s.index),
                            reclaiming: false,
                            pid: s.pid,
                            pid_ns: s.pid_ns,
                            start_time_low34: 0,
                            start_time: s.start_time,
                            host_pid: s.host_pid,
                        })
                    })
                });
            let dirs = [region_dir, layout.limits_dir(&key)];
            let old = dirs.iter().all(|d| !d.exists() || older_than(d, grace));
            if in_use || now.duration_since(since) < grace || !old {
                rep.waiting.push(key);
                continue;
            }
            let mut ok = true;
            for d in &dirs {
                if std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()) {
                    if let Err(e) = std::fs::remove_dir_all(d) {
                        tracing::warn!(dir = %d.display(), "cache GC: {e}");
                        ok = false;
                    }
                }
            }
            if ok {
                tracing::info!(container = %key, "cache GC: removed the directories of a pod gone for {:?}", now.duration_since(since));
                rep.removed.push(key);
            }
        }
        self.gone_since.retain(|uid, _| missing.contains(uid));
        rep
    }
}
