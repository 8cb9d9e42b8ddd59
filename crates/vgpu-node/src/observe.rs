//! The join the monitor and the watchdog share: the driver's processes (by
//! host PID) to containers, through each process's cgroup and the pods
//! bound to this node (container IDs in `status.containerStatuses`), with a
//! region slot's recorded host PID as a second way. A process that bypassed
//! the interposer entirely is still attributed: its cgroup says whose it is.
//! Reads `/proc` and NVML; writes nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use crate::cgroup::{self, CgroupIdentity};
use crate::layout;
use crate::nvml::{GpuInfo, Gpus, ProcessMemory, ProcessSample};
use crate::procfs;

/// A pod bound to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Pods by UID and container IDs, from a pod list.
#[derive(Clone, Debug, Default)]
pub struct PodIndex {
    /// UID → pod.
    pub by_uid: HashMap<String, PodRef>,
    /// Container ID → (pod UID, container name).
    pub by_container_id: HashMap<String, (String, String)>,
    /// Pod UID → its container names (init and app).
    pub containers: HashMap<String, Vec<String>>,
    /// The pods themselves, by UID.
    pub pods: HashMap<String, Pod>,
    /// DRA share key → the (pod UID, container) that use it, first the one
    /// its series are labelled with.
    pub dra_owners: HashMap<String, Vec<(String, String)>>,
    /// (pod UID, container) → the DRA share key whose region it uses.
    pub dra_by_container: HashMap<(String, String), String>,
}

/// The containers that use each prepared DRA share, as the DRA driver
/// knows them (from the claim's `reservedFor` pods at prepare time): share
/// key → (pod UID, container) list. The agent folds it into each
/// [`PodIndex`], so the monitor and the watchdog treat a share like a
/// device-plugin container.
#[derive(Default)]
pub struct DraShares {
    inner: std::sync::RwLock<BTreeMap<String, Vec<(String, String)>>>,
}

impl DraShares {
    /// Replaces the map.
    pub fn set(&self, map: BTreeMap<String, Vec<(String, String)>>) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = map;
    }

    /// The current map.
    pub fn get(&self) -> BTreeMap<String, Vec<(String, String)>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl PodIndex {
    /// Indexes `pods`.
    pub fn new(pods: &[Pod]) -> PodIndex {
        let mut ix = PodIndex::default();
        for p in pods {
            let Some(uid) = p.metadata.uid.clone() else {
                continue;
            };
            ix.by_uid.insert(
                uid.clone(),
                PodRef {
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    name: p.metadata.name.clone().unwrap_or_default(),
                    uid: uid.clone(),
                },
            );
            let mut names = Vec::new();
            if let Some(spec) = &p.spec {
                names.extend(
                    spec.init_containers
                        .iter()
                        .flatten()
                        .map(|c| c.name.clone()),
                );
                names.extend(spec.containers.iter().map(|c| c.name.clone()));
            }
            ix.containers.insert(uid.clone(), names);
            if let Some(st) = &p.status {
                let all = st
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .chain(st.container_statuses.iter().flatten());
                for cs in all {
                    if let Some(id) = cs
                        .container_id
                        .as_deref()
                        .and_then(cgroup::status_container_id)
                    {
                        ix.by_container_id
                            .insert(id, (uid.clone(), cs.name.clone()));
                    }
                }
            }
            ix.pods.insert(uid, p.clone());
        }
        ix
    }

    /// Adds the DRA shares' users.
    pub fn with_dra_shares(mut self, shares: &BTreeMap<String, Vec<(String, String)>>) -> PodIndex {
        for (key, owners) in shares {
            for o in owners {
                self.dra_by_container
                    .entry(o.clone())
                    .or_insert_with(|| key.clone());
            }
            self.dra_owners.insert(key.clone(), owners.clone());
        }
        self
    }

    /// The region key of container `name` of pod `uid`: its DRA share when
    /// it uses one, else its device-plugin key.
    fn key_of(&self, uid: &str, name: &str) -> String {
        self.dra_by_container
            .get(&(uid.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_else(|| layout::container_key(uid, name))
    }

    /// The (pod UID, container) a region key belongs to: a device-plugin
    /// key names them, a DRA share its first user.
    pub fn owner_of<'a>(&'a self, key: &'a str) -> Option<(&'a str, &'a str)> {
        if let Some(k) = layout::parse_container_key(key) {
            return Some(k);
        }
        let (uid, ctr) = self.dra_owners.get(key)?.first()?;
        Some((uid.as_str(), ctr.as_str()))
    }

    /// The container a cgroup identity names: by container ID, else the
    /// only container of the named pod.
    pub fn resolve(&self, id: &CgroupIdentity) -> Option<String> {
        if let Some((uid, name)) = self.by_container_id.get(&id.container_id) {
            return Some(self.key_of(uid, name));
        }
        let uid = id.pod_uid.as_ref()?;
        match self.containers.get(uid).map(Vec::as_slice) {
            Some([only]) => Some(self.key_of(uid, only)),
            _ => None,
        }
    }
}

/// `/proc/<pid>/cgroup` lookups, cached by (pid, start time) so a scrape
/// over many processes reads each process's cgroup once.
pub struct Resolver {
    proc_root: PathBuf,
    cache: Mutex<HashMap<(u32, u64), Option<CgroupIdentity>>>,
}

impl Resolver {
    /// Over `proc_root` (`/proc`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Resolver {
        Resolver {
            proc_root: proc_root.into(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The `/proc` in use.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Start time and cgroup identity of `pid` (`None`: gone).
    pub fn lookup(&self, pid: u32) -> Option<(u64, Option<CgroupIdentity>)> {
        let start = procfs::start_time(&self.proc_root, pid)?;
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() > 65536 {
            c.clear();
        }
        let id = c
            .entry((pid, start))
            .or_insert_with(|| cgroup::of_pid(&self.proc_root, pid))
            .clone();
        Some((start, id))
    }
}

/// One driver process, attributed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcObs {
    /// Host PID.
    pub pid: u32,
    /// Start time (ticks), 0 when the process is gone already.
    pub start_time: u64,
    /// Device memory (`None`: NVML cannot tell).
    pub used_bytes: Option<u64>,
    /// Container key (`<podUID>_<ctr>`), when attributed.
    pub container: Option<String>,
}

/// One GPU at one moment.
#[derive(Clone, Debug)]
pub struct DeviceObs {
    /// The GPU.
    pub info: GpuInfo,
    /// (GPU %, memory controller %), when NVML answers.
    pub utilization: Option<(u32, u32)>,
    /// Its compute processes.
    pub processes: Vec<ProcObs>,
    /// Utilization samples returned this time.
    pub samples: Vec<ProcessSample>,
    /// The process query failed (the device may be unhealthy).
    pub failed: bool,
}

/// Everything observed in one pass.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Per GPU.
    pub devices: Vec<DeviceObs>,
}

impl Observation {
    /// Driver memory per (container key, GPU UUID).
    pub fn driver_memory(&self) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            for p in &d.processes {
                if let (Some(k), Some(b)) = (&p.container, p.used_bytes) {
                    *out.entry((k.clone(), d.info.uuid.clone())).or_insert(0u64) += b;
                }
            }
        }
        out
    }
}

/// Queries every GPU and attributes its processes: cgroup first, then
/// `slot_pids` (host PID → container key from region slots).
pub fn observe(
    gpus: &dyn Gpus,
    resolver: &Resolver,
    pods: &PodIndex,
    slot_pids: &HashMap<u32, String>,
    since_us: &dyn Fn(u32) -> u64,
) -> Result<Observation, crate::nvml::NvmlError> {
    let mut out = Observation::default();
    for info in gpus.devices()? {
        let (procs, failed) = match gpus.processes(info.index) {
            Ok(p) => (p, false),
            Err(_) => (Vec::new(), true),
        };
        let processes = procs
            .into_iter()
            .map(|ProcessMemory { pid, used_bytes }| {
                let (start_time, cg) = resolver.lookup(pid).unwrap_or((0, None));
                let container = cg
                    .as_ref()
                    .and_then(|id| pods.resolve(id))
                    .or_else(|| slot_pids.get(&pid).cloned());
                ProcObs {
                    pid,
                    start_time,
                    used_bytes,
                    container,
                }
            })
            .collect();
        let samples = gpus
            .process_utilization(info.index, since_us(info.index))
            .unwrap_or_default();
        out.devices.push(DeviceObs {
            utilization: gpus.utilization(info.index).ok(),
            info,
            processes,
            samples,
            failed,
        });
    }
    Ok(out)
}

/// The container of a PID for utilization samples (processes may not hold
/// memory, so they are resolved on their own).
pub fn container_of(
    resolver: &Resolver,
    pods: &PodIndex,
    slot_pids: &HashMap<u32, String>,
    pid: u32,
) -> Option<String> {
    resolver
        .lookup(pid)
        .and_then(|(_, cg)| cg.and_then(|id| pods.resolve(&id)))
        .or_else(|| slot_pids.get(&pid).cloned())
}

/// One container directory's region, read-only, with its limits file.
#[derive(Debug)]
pub struct ContainerRegion {
    /// `<podUID>_<ctr>`.
    pub key: String,
    /// The region file (`None`: no region yet).
    pub path: Option<PathBuf>,
    /// Its snapshot, or why it could not be read.
    pub snapshot: Option<Result<vgpu_region::Snapshot, String>>,
    /// The operator's limits file, when present and readable.
    pub limits: Option<vgpu_region::limits::Limits>,
}

impl ContainerRegion {
    /// The memory limit of device `d` of the region (bytes, 0 = none): the
    /// limits file when there is one (the authority), else the region's copy.
    pub fn memory_limit(&self, d: &vgpu_region::DeviceSnapshot) -> u64 {
        match &self.limits {
            Some(l) => l.for_device(&d.uuid).memory.unwrap_or(0),
            None => d.limits.mem,
        }
    }

    /// The SM limit of device `d`, percent (0 = none).
    pub fn sm_limit(&self, d: &vgpu_region::DeviceSnapshot) -> u32 {
        match &self.limits {
            Some(l) => l.for_device(&d.uuid).sm.unwrap_or(0),
            None => d.limits.sm,
        }
    }

    /// The SM ceiling of device `d`, percent (the limits file's
    /// `sm-ceiling`; else the limit: a fixed cap; 0 = none).
    pub fn sm_ceiling(&self, d: &vgpu_region::DeviceSnapshot) -> u32 {
        self.limits
            .as_ref()
            .and_then(|l| l.ceiling_for(&d.uuid))
            .unwrap_or_else(|| self.sm_limit(d))
    }
}

/// The region file of a container directory: `region.cache`, else the
/// first `*.cache` (HAMi names its file `<uuid4>.cache`).
pub fn region_file(dir: &Path) -> Option<PathBuf> {
    let main = dir.join(layout::REGION_FILE);
    if std::fs::symlink_metadata(&main).is_ok_and(|m| m.is_file()) {
        return Some(main);
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cache"))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .collect();
    names.sort();
    names.into_iter().next()
}

/// Every container directory under `<hook>/vgpu/containers`, read-only.
/// Each region is read from a private copy (`Region::open_copy`): the
/// container's processes can truncate their region file at any time, and a
/// mapping of it would SIGBUS the agent (monitor, watchdog and GC of every
/// container at once); a file cut under the copy is a refused region.
pub fn scan_regions(l: &layout::Layout) -> Vec<ContainerRegion> {
    let Ok(rd) = std::fs::read_dir(l.containers_dir()) else {
        return Vec::new();
    };
    let mut keys: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|k| layout::is_region_key(k))
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let path = region_file(&l.region_dir(&key));
            let snapshot = path.as_ref().map(|p| {
                vgpu_region::Region::open_copy(p)
                    .map(|r| r.snapshot())
                    .map_err(|e| e.to_string())
            });
            let lf = l.limits_file(&key);
            let limits = vgpu_region::limits::read_limits_file(&lf).ok();
            ContainerRegion {
                key,
                path,
                snapshot,
                limits,
            }
        })
        .collect()
}

/// Host PID → container key for every slot that recorded one.
pub fn slot_pids(regions: &[ContainerRegion]) -> HashMap<u32, String> {
    let mut m = HashMap::new();
    for r in regions {
        if let Some(Ok(s)) = &r.snapshot {
            for slot in &s.slots {
                if slot.host_pid != 0 {
                    m.insert(slot.host_pid, r.key.clone());
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A container that uses a DRA share resolves to the share's region
    /// key, the share's series are labelled with its first user, and the
    /// scan finds share directories beside device-plugin ones.
    #[test]
    fn dra_shares_map_to_their_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"containerStatuses": [
                {"name": "a", "containerID": format!("containerd://{}", "a".repeat(64)), "image": "", "imageID": "", "ready": true, "restartCount": 0},
                {"name": "b", "containerID": format!("containerd://{}", "b".repeat(64)), "image": "", "imageID": "", "ready": true, "restartCount": 0}
            ]},
        }))
        .unwrap();
        let share = layout::dra_share_key("claim-1", "gpu-0", Some("s1"));
        let shares =
            BTreeMap::from([(share.clone(), vec![("pod-1".to_string(), "a".to_string())])]);
        let ix = PodIndex::new(&[pod]).with_dra_shares(&shares);
        let id = |c: &str| CgroupIdentity {
            pod_uid: Some("pod-1".into()),
            container_id: c.repeat(64),
        };
        assert_eq!(ix.resolve(&id("a")), Some(share.clone()));
        assert_eq!(
            ix.resolve(&id("b")),
            Some(layout::container_key("pod-1", "b"))
        );
        assert_eq!(ix.owner_of(&share), Some(("pod-1", "a")));
        assert_eq!(ix.owner_of("pod-1_b"), Some(("pod-1", "b")));
        assert_eq!(
            ix.owner_of(&layout::dra_share_key("gone", "gpu-0", None)),
            None
        );

        let t = tempfile::tempdir().unwrap();
        let l = layout::Layout::new(t.path());
        for k in [share.as_str(), "pod-1_b", "junk"] {
            std::fs::create_dir_all(l.region_dir(k)).unwrap();
        }
        let keys: Vec<String> = scan_regions(&l).into_iter().map(|r| r.key).collect();
        assert_eq!(keys, [share, "pod-1_b".to_string()]);
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The agent reads regions from private copies: a container's process
    /// cutting its region file to half and writing it back in a loop (a
    /// thread here) never SIGBUSes a scan, which a mapping of the file
    /// would (killing this whole test process, as it killed the agent);
    /// every scan reads the region whole or says why not.
    #[test]
    fn a_tenant_truncating_its_region_never_kills_a_scan() {
        let t = tempfile::tempdir().unwrap();
        let l = layout::Layout::new(t.path());
        let dir = l.region_dir("pod_main");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(layout::REGION_FILE);
        let opts = vgpu_region::CreateOptions {
            slots: 0,
            devices: vec![vgpu_region::DeviceConfig {
                uuid: "GPU-0".into(),
                mem_limit: 1 << 30,
                sm_limit: 0,
            }],
        };
        let (r, _) = vgpu_region::Region::open_or_create(&p, &opts).unwrap();
        let s = r.register().unwrap();
        r.reserve(s, 0, vgpu_region::MemKind::Data, 1 << 20)
            .unwrap();
        drop(r);
        let orig = std::fs::read(&p).unwrap();
        let half = orig.len() / 2 / 4096 * 4096;
        let stop = Arc::new(AtomicBool::new(false));
        let cutter = {
            let stop = stop.clone();
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            std::thread::spawn(move || {
                let mut rounds = 0u32;
                // Cut, let the scanner run on the cut file, write it back,
                // let it run on the whole one.
                let pause = || std::thread::sleep(std::time::Duration::from_micros(50));
                while !stop.load(Ordering::Relaxed) {
                    f.set_len(half as u64).unwrap();
                    pause();
                    f.write_all_at(&orig[half..], half as u64).unwrap();
                    pause();
                    rounds += 1;
                }
                rounds
            })
        };
        let (mut ok, mut refused) = (0, 0);
        let t0 = std::time::Instant::now();
        while ok + refused < 500 || (ok == 0 && t0.elapsed().as_secs() < 30) {
            let regions = scan_regions(&l);
            assert_eq!(regions.len(), 1);
            match &regions[0].snapshot {
                Some(Ok(s)) => {
                    assert_eq!(s.slots.len(), 1);
                    assert_eq!(s.devices[0].used, 1 << 20);
                    ok += 1;
                }
                Some(Err(_)) => refused += 1,
                None => panic!("no region file"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let rounds = cutter.join().unwrap();
        eprintln!("{rounds} cuts: {ok} scans read the region, {refused} refused it");
        assert!(
            rounds > 0 && ok > 0,
            "rounds={rounds} ok={ok} refused={refused}"
        );
    }
}
