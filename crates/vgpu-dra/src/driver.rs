//! The driver's node state: prepare and unprepare of claims, serialized by
//! one mutex, idempotent, and checkpointed (`<plugin dir>/checkpoint.json`,
//! written atomically) so a restarted driver — or a second process after a
//! rolling update — knows what is prepared. A claim is recorded as
//! `PrepareStarted` before any file is written and `PrepareCompleted` after
//! the last; at start a started-but-not-completed claim is undone (the
//! kubelet retries the prepare) and every completed one has its files
//! rewritten (the CDI directory is often a tmpfs). Unprepare works from the
//! checkpoint alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use vgpu_node::allocate::AllocSettings;
use vgpu_node::layout;
use vgpu_node::observe::DraShares;

use crate::cdi;
use crate::plan::{self, ClaimRecord, ClaimState, PlanInput, PreparedDevice};
use crate::slice::GpuFacts;

/// The test hook: abort the process right after the named prepare step
/// (`checkpoint-started`, `limits-written`, `cdi-written`). Test only.
pub const ENV_CRASH_AT: &str = "VGPU_DRA_CRASH_AT";
/// The checkpoint's file name in the plugin directory.
pub const CHECKPOINT: &str = "checkpoint.json";
const CHECKPOINT_VERSION: u32 = 1;

/// Where the driver lives and what it hands out.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Driver name (also the CDI vendor).
    pub driver: String,
    /// Node name (also the pool name).
    pub node: String,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// The driver's own directory (`dra.sock`, the checkpoint).
    pub plugin_dir: PathBuf,
    /// Where transient CDI specs go.
    pub cdi_dir: PathBuf,
    /// Env, mounts and host paths as the device plugin has them.
    pub alloc: AllocSettings,
}

impl DriverConfig {
    /// `<plugin dir>/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }

    /// `<registry dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// `<plugin dir>/checkpoint.json`.
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir.join(CHECKPOINT)
    }
}

/// The checkpoint file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// Claim UID → record.
    pub claims: BTreeMap<String, ClaimRecord>,
}

/// Why the driver failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The checkpoint cannot be read: the driver does not know what is
    /// prepared and refuses to guess.
    #[error("checkpoint {path}: {why} (move it away only if no claim is prepared on this node)")]
    Checkpoint {
        /// Path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A host file.
    #[error("{0}")]
    Host(String),
}

/// The claim the kubelet names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

/// The node state and the API access prepare needs.
pub struct Driver {
    /// Settings.
    pub cfg: DriverConfig,
    client: kube::Client,
    gpus: Box<dyn Fn() -> Vec<GpuFacts> + Send + Sync>,
    state: Mutex<Checkpoint>,
    shares: Arc<DraShares>,
}

fn failpoint(step: &str) {
    if std::env::var(ENV_CRASH_AT).is_ok_and(|v| v == step) {
        eprintln!("vgpu node: {ENV_CRASH_AT}={step}: aborting (test hook)");
        std::process::abort();
    }
}

fn host<E: std::fmt::Display>(what: &str, path: &Path) -> impl FnOnce(E) -> DriverError {
    let (what, path) = (what.to_owned(), path.display().to_string());
    move |e| DriverError::Host(format!("{what} {path}: {e}"))
}

/// Reads the checkpoint (absent: empty).
pub fn load_checkpoint(path: &Path) -> Result<Checkpoint, DriverError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Checkpoint {
                version: CHECKPOINT_VERSION,
                claims: BTreeMap::new(),
            })
        }
        Err(e) => {
            return Err(DriverError::Checkpoint {
                path: path.into(),
                why: e.to_string(),
            })
        }
    };
    let c: Checkpoint = serde_json::from_str(&text).map_err(|e| DriverError::Checkpoint {
        path: path.into(),
        why: e.to_string(),
    })?;
    if c.version != CHECKPOINT_VERSION {
        return Err(DriverError::Checkpoint {
            path: path.into(),
            why: format!(
                "version {} (this driver writes {CHECKPOINT_VERSION})",
                c.version
            ),
        });
    }
    Ok(c)
}

fn save_checkpoint(path: &Path, c: &Checkpoint) -> Result<(), DriverError> {
    let text = serde_json::to_vec_pretty(c).map_err(host("encoding", path))?;
    layout::write_atomic(path, &text, 0o600).map_err(host("writing", path))
}

fn remove_dir(p: &Path) -> Result<(), DriverError> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(host("removing", p)(e)),
    }
}

fn remove_file(p: &Path) -> Result<(), DriverError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(host("removing", p)(e)),
    }
}

/// Writes a claim's limits files, directories and CDI spec (idempotent);
/// in a prepare (`in_prepare`) the failpoints fire after the limits and
/// after the spec (never in the rewrite at start).
pub fn write_files(
    cfg: &DriverConfig,
    uid: &str,
    record: &ClaimRecord,
    in_prepare: bool,
) -> Result<(), DriverError> {
    let l = &cfg.alloc.layout;
    let le = |e: layout::LayoutError| DriverError::Host(e.to_string());
    layout::ensure_dir_all(&l.containers_dir(), 0o755).map_err(le)?;
    layout::ensure_dir_all(&l.limits_root(), 0o755).map_err(le)?;
    layout::ensure_dir_all(&cfg.alloc.lock_dir, 0o1777).map_err(le)?;
    for s in &record.shares {
        // Tenant processes of any uid create the region here.
        layout::ensure_dir(&l.region_dir(&s.key), 0o1777).map_err(le)?;
        layout::ensure_dir(&l.limits_dir(&s.key), 0o755).map_err(le)?;
        let limits = plan::limits(s, &cfg.alloc);
        vgpu_region::limits::write_limits_file_atomic(&l.limits_file(&s.key), &limits)
            .map_err(|e| DriverError::Host(format!("limits file of {}: {e}", s.key)))?;
    }
    if in_prepare {
        failpoint("limits-written");
    }
    layout::ensure_dir_all(&cfg.cdi_dir, 0o755).map_err(le)?;
    let spec = plan::cdi_spec(&cfg.driver, record, &cfg.alloc);
    spec.validate()
        .map_err(|e| DriverError::Host(format!("claim {uid}: {e}")))?;
    let path = cdi::spec_path(&cfg.cdi_dir, &cfg.driver, uid);
    layout::write_atomic(&path, spec.render().as_bytes(), 0o644).map_err(host("writing", &path))?;
    if in_prepare {
        failpoint("cdi-written");
    }
    Ok(())
}

/// Removes a claim's CDI spec, limits and region directories.
pub fn remove_files(
    cfg: &DriverConfig,
    uid: &str,
    record: &ClaimRecord,
) -> Result<(), DriverError> {
    let l = &cfg.alloc.layout;
    remove_file(&cdi::spec_path(&cfg.cdi_dir, &cfg.driver, uid))?;
    for s in &record.shares {
        remove_dir(&l.limits_dir(&s.key))?;
        remove_dir(&l.region_dir(&s.key))?;
    }
    Ok(())
}

impl Driver {
    /// Opens the node state: reads the checkpoint, undoes half-prepared
    /// claims and rewrites the files of prepared ones.
    pub fn open(
        cfg: DriverConfig,
        client: kube::Client,
        gpus: Box<dyn Fn() -> Vec<GpuFacts> + Send + Sync>,
        shares: Arc<DraShares>,
    ) -> Result<Driver, DriverError> {
        layout::ensure_dir_all(&cfg.plugin_dir, 0o750)
            .map_err(|e| DriverError::Host(e.to_string()))?;
        let mut c = load_checkpoint(&cfg.checkpoint())?;
        let started: Vec<String> = c
            .claims
            .iter()
            .filter(|(_, r)| r.state == ClaimState::PrepareStarted)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in started {
            if let Some(r) = c.claims.get(&uid) {
                tracing::warn!(claim = %format!("{}/{}", r.namespace, r.name), %uid, "a prepare was interrupted: undoing it (the kubelet retries)");
                remove_files(&cfg, &uid, r)?;
            }
            c.claims.remove(&uid);
            save_checkpoint(&cfg.checkpoint(), &c)?;
        }
        for (uid, r) in &c.claims {
            write_files(&cfg, uid, r, false)?;
        }
        let d = Driver {
            cfg,
            client,
            gpus,
            state: Mutex::new(c),
            shares,
        };
        d.publish_shares(&d.state.try_lock().map(|s| s.clone()).unwrap_or_default());
        Ok(d)
    }

    fn publish_shares(&self, c: &Checkpoint) {
        let mut map = BTreeMap::new();
        for r in c.claims.values() {
            for s in &r.shares {
                map.insert(
                    s.key.clone(),
                    s.owners
                        .iter()
                        .map(|o| (o.pod_uid.clone(), o.container.clone()))
                        .collect(),
                );
            }
        }
        self.shares.set(map);
    }

    /// A copy of the checkpoint.
    pub async fn checkpoint(&self) -> Checkpoint {
        self.state.lock().await.clone()
    }

    async fn reserving_pods(&self, claim: &ResourceClaim) -> Vec<Pod> {
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let mut out = Vec::new();
        let refs = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.clone())
            .unwrap_or_default();
        for r in refs
            .iter()
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        {
            match api.get_opt(&r.name).await {
                Ok(Some(p)) if p.metadata.uid.as_deref() == Some(r.uid.as_str()) => out.push(p),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{}", r.name), "reading a pod that reserves the claim: {e}")
                }
            }
        }
        out
    }

    /// Prepares the claims of one kubelet call, one at a time under the
    /// lock; each gets its devices or its error.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let r = self.prepare_one(&mut state, c).await;
            if let Err(e) = &r {
                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, "prepare refused: {e}");
            }
            out.insert(c.uid.clone(), r);
        }
        self.publish_shares(&state);
        out
    }

    async fn prepare_one(
        &self,
        state: &mut Checkpoint,
        c: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, String> {
        if let Some(r) = state.claims.get(&c.uid) {
            if r.state == ClaimState::PrepareCompleted {
                // Prepared: the same answer; files someone removed since
                // (a CDI tmpfs emptied) come back first.
                let spec = cdi::spec_path(&self.cfg.cdi_dir, &self.cfg.driver, &c.uid);
                if !spec.exists() {
                    write_files(&self.cfg, &c.uid, r, false).map_err(|e| e.to_string())?;
                }
                return Ok(r.devices.clone());
            }
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api
            .get_opt(&c.name)
            .await
            .map_err(|e| format!("reading claim {}/{}: {e}", c.namespace, c.name))?
            .ok_or_else(|| format!("claim {}/{} not found", c.namespace, c.name))?;
        let pods = self.reserving_pods(&claim).await;
        let gpus = (self.gpus)();
        let input = PlanInput {
            driver: &self.cfg.driver,
            node: &self.cfg.node,
            gpus: &gpus,
            alloc: &self.cfg.alloc,
        };
        let mut record =
            plan::plan_claim(&input, &claim, &c.uid, &pods).map_err(|e| e.to_string())?;
        plan::check_fit(&state.claims, &c.uid, &record, &gpus).map_err(|e| e.to_string())?;
        let ck = self.cfg.checkpoint();
        // A record left half-done (its undo failed at start) goes first.
        if let Some(old) = state.claims.remove(&c.uid) {
            remove_files(&self.cfg, &c.uid, &old).map_err(|e| e.to_string())?;
        }
        state.claims.insert(c.uid.clone(), record.clone());
        save_checkpoint(&ck, state).map_err(|e| e.to_string())?;
        failpoint("checkpoint-started");
        if let Err(e) = write_files(&self.cfg, &c.uid, &record, true) {
            let _ = remove_files(&self.cfg, &c.uid, &record);
            state.claims.remove(&c.uid);
            let _ = save_checkpoint(&ck, state);
            return Err(e.to_string());
        }
        record.state = ClaimState::PrepareCompleted;
        state.claims.insert(c.uid.clone(), record.clone());
        save_checkpoint(&ck, state).map_err(|e| e.to_string())?;
        tracing::info!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, shares = record.shares.len(), "prepared");
        Ok(record.devices)
    }

    /// Unprepares claims from the checkpoint alone; an unknown claim is
    /// already unprepared.
    pub async fn unprepare(&self, uids: &[String]) -> BTreeMap<String, Result<(), String>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for uid in uids {
            let r = match state.claims.get(uid).cloned() {
                None => Ok(()),
                Some(rec) => match remove_files(&self.cfg, uid, &rec) {
                    Ok(()) => {
                        state.claims.remove(uid);
                        save_checkpoint(&self.cfg.checkpoint(), &state)
                            .map(|_| tracing::info!(claim = %format!("{}/{}", rec.namespace, rec.name), %uid, "unprepared"))
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            out.insert(uid.clone(), r);
        }
        self.publish_shares(&state);
        out
    }
}
