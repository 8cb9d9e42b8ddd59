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

/// Whether the region in `region_dir` has a slot whose owner is alive. A
/// region that exists but cannot be read counts as in use: only a region
/// whose every owner is proved dead may go (never fail open).
pub fn region_in_use(region_dir: &Path, live: &LiveProcesses) -> bool {
    observe::region_file(region_dir).is_some_and(|p| match vgpu_region::Region::open_read_only(&p) {
        Err(e) if p.exists() => {
            tracing::warn!(region = %p.display(), "cannot read the region, treating it as in use: {}", vgpu_errors::chain(&e));
            true
        }
        Err(_) => false,
        Ok(r) => r.snapshot().slots.iter().any(|s| {
            !live.owner_dead(&vgpu_region::SlotOwner {
                slot: vgpu_region::SlotId(s.index),
                reclaiming: false,
                pid: s.pid,
                pid_ns: s.pid_ns,
                start_time_low34: 0,
                start_time: s.start_time,
                host_pid: s.host_pid,
            })
        }),
    })
}

/// What Allocate found in a container's region directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionReuse {
    /// No region yet: the container's first process creates it.
    Fresh,
    /// A region no live process owns (an earlier Allocate of the same
    /// container, all its processes gone): removed, so the new assignment,
    /// whose GPUs and limits may differ, starts from a clean ledger.
    Cleared(Vec<std::path::PathBuf>),
    /// A region a live process still owns: kept, so that process's memory
    /// keeps counting against the container's budget.
    KeptInUse,
}

/// Called by Allocate before it hands out `region_dir` again. A container
/// restart never gets here (the kubelet reuses its checkpointed answer and
/// the region with it); a second Allocate for the same container does.
pub fn prepare_region_dir(region_dir: &Path, live: &LiveProcesses) -> std::io::Result<RegionReuse> {
    if observe::region_file(region_dir).is_none() {
        return Ok(RegionReuse::Fresh);
    }
    if region_in_use(region_dir, live) {
        return Ok(RegionReuse::KeptInUse);
    }
    let mut removed = Vec::new();
    // The fixed name and HAMi's `<uuid>.cache` alike.
    for e in std::fs::read_dir(region_dir)?.filter_map(|e| e.ok()) {
        let p = e.path();
        let is_cache = p.extension().is_some_and(|x| x == "cache");
        if is_cache && e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(&p)?;
            removed.push(p);
        }
    }
    removed.sort();
    Ok(RegionReuse::Cleared(removed))
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
            let in_use = region_in_use(&region_dir, live);
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

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(300);

    /// Both directories of `key`, with mtimes `age` in the past.
    fn dirs(l: &Layout, key: &str, age: Duration) {
        for d in [l.region_dir(key), l.limits_dir(key)] {
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("f"), b"x").unwrap();
            let t = SystemTime::now() - age;
            std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
        }
    }

    fn exists(l: &Layout, key: &str) -> (bool, bool) {
        (l.region_dir(key).exists(), l.limits_dir(key).exists())
    }

    #[test]
    fn a_gone_pod_keeps_its_directories_for_the_grace_then_loses_both() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        dirs(&l, "gone_main", GRACE * 2);
        dirs(&l, "here_main", GRACE * 2);
        let pods: HashSet<String> = ["here".to_owned()].into();
        let live = LiveProcesses::scan(Path::new("/proc"));
        let mut gc = CacheGc::default();
        let t0 = Instant::now();
        let r = gc.pass(&l, &pods, &live, GRACE, t0);
        assert_eq!(r.waiting, vec!["gone_main".to_owned()]);
        assert!(r.removed.is_empty());
        let r = gc.pass(
            &l,
            &pods,
            &live,
            GRACE,
            t0 + GRACE - Duration::from_millis(1),
        );
        assert!(r.removed.is_empty());
        assert_eq!(exists(&l, "gone_main"), (true, true));
        let r = gc.pass(&l, &pods, &live, GRACE, t0 + GRACE);
        assert_eq!(r.removed, vec!["gone_main".to_owned()]);
        assert_eq!(exists(&l, "gone_main"), (false, false));
        // The pod that exists is never touched, whatever the time.
        let r = gc.pass(&l, &pods, &live, GRACE, t0 + GRACE * 10);
        assert!(r.removed.is_empty() && r.waiting.is_empty());
        assert_eq!(exists(&l, "here_main"), (true, true));
    }

    #[test]
    fn a_pod_that_comes_back_restarts_the_grace_and_a_fresh_directory_waits() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        dirs(&l, "p_main", GRACE * 2);
        let live = LiveProcesses::scan(Path::new("/proc"));
        let mut gc = CacheGc::default();
        let t0 = Instant::now();
        gc.pass(&l, &HashSet::new(), &live, GRACE, t0);
        // Listed again (e.g. the API answered late): the clock is dropped.
        gc.pass(&l, &["p".to_owned()].into(), &live, GRACE, t0 + GRACE / 2);
        let r = gc.pass(&l, &HashSet::new(), &live, GRACE, t0 + GRACE);
        assert!(r.removed.is_empty(), "the grace restarted");
        let r = gc.pass(&l, &HashSet::new(), &live, GRACE, t0 + GRACE * 2);
        assert_eq!(r.removed, vec!["p_main".to_owned()]);

        // A directory younger than the grace (a pod the list has not shown
        // yet) waits however long the UID has been missing.
        dirs(&l, "new_main", Duration::ZERO);
        let t1 = t0 + GRACE * 3;
        gc.pass(&l, &HashSet::new(), &live, GRACE, t1);
        let r = gc.pass(&l, &HashSet::new(), &live, GRACE, t1 + GRACE * 2);
        assert_eq!(r.waiting, vec!["new_main".to_owned()]);
        assert_eq!(exists(&l, "new_main"), (true, true));
    }

    #[test]
    fn a_region_with_a_live_process_is_never_removed() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        dirs(&l, "busy_main", GRACE * 2);
        let opts = vgpu_region::CreateOptions {
            slots: 4,
            devices: vec![vgpu_region::DeviceConfig {
                uuid: "GPU-0".into(),
                mem_limit: 1 << 30,
                sm_limit: 0,
            }],
        };
        let path = l.region_dir("busy_main").join(layout::REGION_FILE);
        let (r, _) = vgpu_region::Region::open_or_create(&path, &opts).unwrap();
        // This test process is the slot's live owner.
        let _slot = r.register().unwrap();
        // Old enough: only the live slot keeps it.
        dirs(&l, "busy_main", GRACE * 2);
        let live = LiveProcesses::scan(Path::new("/proc"));
        let mut gc = CacheGc::default();
        let t0 = Instant::now();
        gc.pass(&l, &HashSet::new(), &live, GRACE, t0);
        let rep = gc.pass(&l, &HashSet::new(), &live, GRACE, t0 + GRACE * 5);
        assert_eq!(rep.waiting, vec!["busy_main".to_owned()]);
        assert!(path.exists() && l.limits_dir("busy_main").exists());
    }

    #[test]
    fn a_second_allocate_clears_a_dead_region_and_keeps_a_live_one() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        let dir = l.region_dir("p_main");
        std::fs::create_dir_all(&dir).unwrap();
        let live = LiveProcesses::scan(Path::new("/proc"));
        assert_eq!(prepare_region_dir(&dir, &live).unwrap(), RegionReuse::Fresh);

        let opts = vgpu_region::CreateOptions {
            slots: 4,
            devices: vec![vgpu_region::DeviceConfig {
                uuid: "GPU-0".into(),
                mem_limit: 1 << 30,
                sm_limit: 0,
            }],
        };
        let path = dir.join(layout::REGION_FILE);
        let (r, _) = vgpu_region::Region::open_or_create(&path, &opts).unwrap();
        let _slot = r.register().unwrap();
        // This process owns a slot: the region stays, with its ledger.
        let live = LiveProcesses::scan(Path::new("/proc"));
        assert_eq!(
            prepare_region_dir(&dir, &live).unwrap(),
            RegionReuse::KeptInUse
        );
        assert!(path.exists());
        drop(r);

        // Only dead owners (a process of another, gone namespace) and a
        // HAMi-named file beside it: both go.
        std::fs::write(dir.join("0b5e-uuid.cache"), b"hami").unwrap();
        std::fs::remove_file(&path).unwrap();
        let (r, _) = vgpu_region::Region::open_or_create(&path, &opts).unwrap();
        drop(r);
        let gone = LiveProcesses::default();
        let got = prepare_region_dir(&dir, &gone).unwrap();
        assert_eq!(
            got,
            RegionReuse::Cleared(vec![dir.join("0b5e-uuid.cache"), path.clone()])
        );
        assert!(!path.exists() && dir.exists());
    }

    #[test]
    fn a_region_that_cannot_be_read_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        dirs(&l, "odd_main", GRACE * 2);
        // Not a region vgpu can read (a foreign or torn file): its owners
        // cannot be proved dead, so it stays.
        let path = l.region_dir("odd_main").join(layout::REGION_FILE);
        std::fs::write(&path, b"not a region").unwrap();
        dirs(&l, "odd_main", GRACE * 2);
        let live = LiveProcesses::scan(Path::new("/proc"));
        let mut gc = CacheGc::default();
        let t0 = Instant::now();
        gc.pass(&l, &HashSet::new(), &live, GRACE, t0);
        let rep = gc.pass(&l, &HashSet::new(), &live, GRACE, t0 + GRACE * 5);
        assert_eq!(rep.waiting, vec!["odd_main".to_owned()]);
        assert!(rep.removed.is_empty());
        assert!(path.exists() && l.limits_dir("odd_main").exists());
    }
}
