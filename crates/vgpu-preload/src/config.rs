//! The whole environment contract (docs/design.md section 4, docs/env.md):
//! nothing else in the library reads the environment.
//!
//! Parsing is pure (it takes the variables as a list) so it is unit-tested
//! without touching the process environment. Every malformed value yields
//! one problem line (logged by the caller) and the documented fallback:
//! the variable is ignored, as if unset. The attachment reads a fresh
//! [`Config`] per process image (a forked child that changed its
//! environment sees the change); [`process_config`] is the one read by
//! code that runs before or without an attachment (NVML-only processes).
//!
//! Must never log (the log reads its level from here) or call a driver.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use vgpu_identity::probe::ProbeOptions;
use vgpu_region::IdentityTier;

/// Where a process finds its container's region when
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is not in its environment (an ssh or
/// `su` session, a child that cleared its env). The device plugin mounts the
/// container's region here; `vgpu run --cache` may point at it too.
pub const DEFAULT_CACHE: &str = "/tmp/vgpu/region.cache";

/// Per-context device-memory estimate charged at context creation and at the
/// first primary-context retain of a device (override: `LIBVGPU_CONTEXT_MEMORY`).
pub const DEFAULT_CONTEXT_MEMORY: u64 = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSource {
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` named it.
    Env,
    /// No variable: [`DEFAULT_CACHE`].
    Default,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UtilPolicy {
    #[default]
    Default,
    Force,
    Disable,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// `CUDA_DEVICE_MEMORY_LIMIT` (0 = none).
    pub mem_all: u64,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>`, visible index -> bytes (wins over `mem_all`).
    pub mem_dev: BTreeMap<u32, u64>,
    /// `CUDA_DEVICE_SM_LIMIT` (0 = none; >= 100 is stored as 0).
    pub sm_all: u32,
    pub sm_dev: BTreeMap<u32, u32>,
    pub cache: PathBuf,
    pub cache_source: CacheSource,
    /// `LIBVGPU_LIMITS_FILE`: the operator's limits file when nothing is at
    /// [`Config::limits_default`] (docs/limits.md).
    pub limits_file: Option<PathBuf>,
    /// Where a container sees its limits file
    /// (`vgpu_region::limits::DEFAULT_PATH`; a field so tests can move it).
    pub limits_default: PathBuf,
    pub visible: Option<String>,
    pub context_memory: u64,
    pub priority: i32,
    pub util_policy: UtilPolicy,
    /// Host-PID identity (`LIBVGPU_IDENTITY*`, `LIBVGPU_HOSTPID_*`,
    /// `LIBVGPU_HOST_PROCFS`).
    pub identity: Identity,
    /// `LIBVGPU_ATTACH=eager`: attach inside `cuInit` (see `init`).
    pub attach_eager: bool,
    /// One line per malformed variable, with the fallback taken.
    pub problems: Vec<String>,
}

/// `lazy` (default) or `eager`.
pub const ENV_IDENTITY_MODE: &str = "LIBVGPU_IDENTITY";
/// `lazy` (default: attach at the first call that needs the region) or
/// `eager` (inside `cuInit`, with its phases in the slot; for measurements).
pub const ENV_ATTACH_MODE: &str = "LIBVGPU_ATTACH";

/// `lazy`/`eager` (surrounding blanks ignored; empty is lazy): whether
/// eager, `None` when neither.
fn eager_mode(v: &str) -> Option<bool> {
    match v.trim() {
        "" | "lazy" => Some(false),
        "eager" => Some(true),
        _ => None,
    }
}

/// Whether the environment asks `cuInit` to attach (`LIBVGPU_ATTACH=eager`,
/// or `LIBVGPU_IDENTITY=eager`, which resolves into the slot there). One
/// `getenv` per name, no configuration parse: this runs inside `cuInit`.
/// A malformed value is lazy here and reported at attach.
pub fn attach_eager_in_env() -> bool {
    let eager = |v: &[u8]| std::str::from_utf8(v).ok().and_then(eager_mode) == Some(true);
    crate::sys::env_matches(c"LIBVGPU_ATTACH", eager)
        || crate::sys::env_matches(c"LIBVGPU_IDENTITY", eager)
}

/// Comma-separated tiers in the order to try them (a subset is fine):
/// `same_namespace`, `broker`, `procfs`, `probe`.
pub const ENV_IDENTITY_TIERS: &str = "LIBVGPU_IDENTITY_TIERS";

/// What the environment asks of host-PID identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Resolve inside `cuInit` (benchmarks) instead of at first need.
    pub eager: bool,
    /// The tiers to try, in order.
    pub tiers: Vec<IdentityTier>,
    pub broker: Option<PathBuf>,
    pub procfs: Option<PathBuf>,
    pub probe: ProbeOptions,
}

impl Default for Identity {
    fn default() -> Identity {
        Identity {
            eager: false,
            tiers: vgpu_identity::DEFAULT_ORDER.to_vec(),
            broker: None,
            procfs: None,
            probe: ProbeOptions::default(),
        }
    }
}

pub use vgpu_region::units::{parse_mem_size, parse_sm_percent};

fn indexed<'a>(name: &'a str, prefix: &str) -> Option<Option<&'a str>> {
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() {
        return Some(None);
    }
    rest.strip_prefix('_').map(Some)
}

impl Config {
    /// Builds the configuration from `(name, value)` pairs (the environment).
    pub fn from_vars<I, K, V>(vars: I) -> Config
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut c = Config {
            mem_all: 0,
            mem_dev: BTreeMap::new(),
            sm_all: 0,
            sm_dev: BTreeMap::new(),
            cache: PathBuf::from(DEFAULT_CACHE),
            cache_source: CacheSource::Default,
            limits_file: None,
            limits_default: PathBuf::from(vgpu_region::limits::DEFAULT_PATH),
            visible: None,
            context_memory: DEFAULT_CONTEXT_MEMORY,
            priority: 0,
            util_policy: UtilPolicy::Default,
            identity: Identity::default(),
            attach_eager: false,
            problems: Vec::new(),
        };
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            c.apply(k, v);
        }
        c
    }

    /// Reads the process environment (non-UTF-8 values are reported as
    /// malformed). Only the variables of the contract are copied.
    pub fn from_env() -> Config {
        let mut bad = Vec::new();
        let vars: Vec<(String, String)> =
            crate::sys::env_with_prefixes(&["CUDA_", "LIBVGPU_", "GPU_CORE"])
                .into_iter()
                .filter_map(|(k, v)| {
                    let k = String::from_utf8(k).ok()?;
                    match String::from_utf8(v) {
                        Ok(v) => Some((k, v)),
                        Err(_) => {
                            bad.push(format!("{k} is not valid UTF-8; ignored"));
                            None
                        }
                    }
                })
                .collect();
        let mut c = Config::from_vars(vars);
        c.problems.extend(bad);
        c
    }

    fn bad(&mut self, k: &str, v: &str, why: impl std::fmt::Display, fallback: &str) {
        self.problems.push(format!("{k}={v:?}: {why}; {fallback}"));
    }

    fn apply(&mut self, k: &str, v: &str) {
        if let Some(idx) = indexed(k, "CUDA_DEVICE_MEMORY_LIMIT") {
            match (idx.map(str::parse::<u32>), parse_mem_size(v)) {
                (Some(Err(_)), _) => self.bad(k, v, "index is not a device number", "ignored"),
                (_, Err(e)) => self.bad(k, v, e, "ignored (no limit from this variable)"),
                (None, Ok(n)) => self.mem_all = n,
                (Some(Ok(i)), Ok(n)) => {
                    self.mem_dev.insert(i, n);
                }
            }
        } else if let Some(idx) = indexed(k, "CUDA_DEVICE_SM_LIMIT") {
            match (idx.map(str::parse::<u32>), parse_sm_percent(v)) {
                (Some(Err(_)), _) => self.bad(k, v, "index is not a device number", "ignored"),
                (_, Err(e)) => self.bad(k, v, e, "ignored (no SM limit from this variable)"),
                (None, Ok(n)) => self.sm_all = if n >= 100 { 0 } else { n },
                (Some(Ok(i)), Ok(n)) => {
                    self.sm_dev.insert(i, if n >= 100 { 0 } else { n });
                }
            }
        } else {
            match k {
                "CUDA_DEVICE_MEMORY_SHARED_CACHE" => {
                    if v.trim().is_empty() {
                        self.bad(
                            k,
                            v,
                            "empty path",
                            &format!("using the default {DEFAULT_CACHE}"),
                        );
                    } else {
                        self.cache = PathBuf::from(v);
                        self.cache_source = CacheSource::Env;
                    }
                }
                "CUDA_VISIBLE_DEVICES" => self.visible = Some(v.to_string()),
                vgpu_region::limits::PATH_ENV => self.limits_file = path(v),
                // Test-only: where the operator's `/etc/vgpu/limits` is.
                #[cfg(feature = "failpoints")]
                "LIBVGPU_FAILPOINT_LIMITS_DEFAULT" if !v.is_empty() => {
                    self.limits_default = PathBuf::from(v)
                }
                "LIBVGPU_CONTEXT_MEMORY" => match parse_mem_size(v) {
                    Ok(n) => self.context_memory = n,
                    Err(e) => self.bad(
                        k,
                        v,
                        e,
                        &format!("using {} MiB", DEFAULT_CONTEXT_MEMORY >> 20),
                    ),
                },
                "CUDA_TASK_PRIORITY" => match v.trim().parse::<i32>() {
                    Ok(n) => self.priority = n,
                    Err(_) => self.bad(k, v, "not an integer", "using 0"),
                },
                "GPU_CORE_UTILIZATION_POLICY" => match v.trim().to_ascii_lowercase().as_str() {
                    "" | "default" => self.util_policy = UtilPolicy::Default,
                    "force" => self.util_policy = UtilPolicy::Force,
                    "disable" => self.util_policy = UtilPolicy::Disable,
                    _ => self.bad(k, v, "expected default, force or disable", "using default"),
                },
                ENV_IDENTITY_MODE => match eager_mode(v) {
                    Some(e) => self.identity.eager = e,
                    None => self
                        .problems
                        .push(format!("{k}={v:?} is not lazy or eager; using lazy")),
                },
                ENV_ATTACH_MODE => match eager_mode(v) {
                    Some(e) => self.attach_eager = e,
                    None => self
                        .problems
                        .push(format!("{k}={v:?} is not lazy or eager; using lazy")),
                },
                ENV_IDENTITY_TIERS => self.identity_tiers(k, v),
                vgpu_identity::resolve::ENV_BROKER => self.identity.broker = path(v),
                vgpu_identity::resolve::ENV_PROCFS => self.identity.procfs = path(v),
                vgpu_identity::resolve::ENV_LOCK => {
                    if let Some(lock) = path(v) {
                        self.identity.probe.lock_path = lock;
                    }
                }
                _ => {}
            }
        }
    }

    fn identity_tiers(&mut self, k: &str, v: &str) {
        if v.trim().is_empty() {
            return;
        }
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for part in v.split(',').filter(|p| !p.trim().is_empty()) {
            match vgpu_identity::parse_tier(part) {
                Some(t) if !out.contains(&t) => out.push(t),
                Some(_) => {}
                None => bad.push(part.trim().to_string()),
            }
        }
        if !bad.is_empty() {
            self.problems.push(format!(
                "{k}={v:?}: unknown tier(s) {} (known: same_namespace, broker, procfs, probe); {}",
                bad.join(", "),
                if out.is_empty() {
                    "using the default order"
                } else {
                    "ignored"
                }
            ));
        }
        self.identity.tiers = if out.is_empty() {
            vgpu_identity::DEFAULT_ORDER.to_vec()
        } else {
            out
        };
    }

    /// Memory limit of visible device `i` from the environment (0 = none).
    pub fn mem_limit(&self, i: u32) -> u64 {
        self.mem_dev.get(&i).copied().unwrap_or(self.mem_all)
    }

    /// SM limit of visible device `i` in percent (0 = none).
    pub fn sm_limit(&self, i: u32) -> u32 {
        self.sm_dev.get(&i).copied().unwrap_or(self.sm_all)
    }

    /// Whether the environment asks for any limit at all.
    pub fn any_limit(&self) -> bool {
        self.mem_all != 0
            || self.sm_all != 0
            || self.mem_dev.values().any(|&n| n != 0)
            || self.sm_dev.values().any(|&n| n != 0)
    }
}

/// An empty value counts as unset.
fn path(v: &str) -> Option<PathBuf> {
    (!v.is_empty()).then(|| PathBuf::from(v))
}

/// The configuration of this process image, read once (for code that runs
/// before or without an attachment).
pub fn process_config() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(Config::from_env)
}

/// `LIBCUDA_LOG_LEVEL`: 0 quiet, 1 errors, 2 warnings (default), 3 info,
/// 4 debug.
pub const DEFAULT_LOG_LEVEL: u8 = 2;

/// Parses a `LIBCUDA_LOG_LEVEL` value; `None` when it is not a level.
pub fn parse_log_level(v: &str) -> Option<u8> {
    match v.trim().parse::<u8>() {
        Ok(n) if n <= 4 => Some(n),
        _ => None,
    }
}

/// The log level from the environment, and the malformed value if any
/// (the log reports it). Read by the log once, apart from [`Config`]: the
/// log must work before (and while) the rest is parsed.
pub fn log_level_from_env() -> (u8, Option<String>) {
    match crate::sys::env_var("LIBCUDA_LOG_LEVEL") {
        None => (DEFAULT_LOG_LEVEL, None),
        Some(v) => {
            let v = String::from_utf8_lossy(&v).into_owned();
            match parse_log_level(&v) {
                Some(n) => (n, None),
                None => (DEFAULT_LOG_LEVEL, Some(v)),
            }
        }
    }
}

// ------------------------------------------------------------ failpoints
// Test-only variables (feature `failpoints`, enabled for this crate's own
// tests): inert and free when the feature is off.

#[cfg(feature = "failpoints")]
fn failpoint_var(name: &str) -> Option<String> {
    crate::sys::env_var(name)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .filter(|v| !v.is_empty())
}

/// `LIBVGPU_FAILPOINT_PANIC=<hook name>`: that hook (or `dlsym`) panics
/// inside its guard. Read once.
#[cfg(feature = "failpoints")]
pub fn failpoint_panic() -> Option<&'static str> {
    static V: OnceLock<Option<String>> = OnceLock::new();
    V.get_or_init(|| failpoint_var("LIBVGPU_FAILPOINT_PANIC"))
        .as_deref()
}

/// `LIBVGPU_FAILPOINT_NVML_STALL_MS=<ms>`: the library's own NVML device
/// count query sleeps that long inside the driver layer (a slow driver,
/// for the fork-while-in-NVML test).
pub fn failpoint_nvml_stall() {
    #[cfg(feature = "failpoints")]
    {
        static V: OnceLock<u64> = OnceLock::new();
        let ms = *V.get_or_init(|| {
            failpoint_var("LIBVGPU_FAILPOINT_NVML_STALL_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        });
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

/// `LIBVGPU_FAILPOINT_OWNED_THREAD=<file>`: attaching starts the owned
/// thread with a heartbeat job that appends its life to `<file>` (for the
/// start / fork-restart / exit-stop test).
pub fn failpoint_owned_thread() -> Option<&'static std::path::Path> {
    #[cfg(feature = "failpoints")]
    {
        static V: OnceLock<Option<PathBuf>> = OnceLock::new();
        V.get_or_init(|| failpoint_var("LIBVGPU_FAILPOINT_OWNED_THREAD").map(PathBuf::from))
            .as_deref()
    }
    #[cfg(not(feature = "failpoints"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_parse_strictly() {
        assert_eq!(parse_log_level("0"), Some(0));
        assert_eq!(parse_log_level(" 4 "), Some(4));
        assert_eq!(parse_log_level("5"), None);
        assert_eq!(parse_log_level("debug"), None);
        assert_eq!(parse_log_level("-1"), None);
    }

    #[test]
    fn attach_mode_lazy_by_default_eager_on_request_bad_values_said() {
        assert!(!cfg(&[]).attach_eager);
        assert!(cfg(&[(ENV_ATTACH_MODE, " eager ")]).attach_eager);
        let c = cfg(&[(ENV_ATTACH_MODE, "now")]);
        assert!(!c.attach_eager, "a bad value keeps the default");
        assert!(c.problems[0].contains("\"now\""), "{:?}", c.problems);
    }

    #[test]
    fn identity_tiers_order_subset_and_bad_names() {
        let s = cfg(&[]).identity;
        assert_eq!(s.tiers, vgpu_identity::DEFAULT_ORDER);
        assert!(!s.eager);
        let c = cfg(&[
            (ENV_IDENTITY_TIERS, "probe, broker,probe"),
            (ENV_IDENTITY_MODE, "eager"),
        ]);
        assert_eq!(
            c.identity.tiers,
            [IdentityTier::NvmlProbe, IdentityTier::Broker]
        );
        assert!(c.identity.eager && c.problems.is_empty());
        let c = cfg(&[
            (ENV_IDENTITY_MODE, "soon"),
            (ENV_IDENTITY_TIERS, "broker,warp"),
        ]);
        assert_eq!(c.identity.tiers, [IdentityTier::Broker]);
        assert!(!c.identity.eager);
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        assert!(c.problems[0].contains("\"soon\""), "{:?}", c.problems);
        assert!(c.problems[1].contains("warp"), "{:?}", c.problems);
        let c = cfg(&[(ENV_IDENTITY_TIERS, "nonsense")]);
        assert_eq!(c.identity.tiers, vgpu_identity::DEFAULT_ORDER);
        assert!(c.problems[0].contains("default order"));
        let c = cfg(&[
            ("LIBVGPU_HOSTPID_BROKER", "/run/b.sock"),
            ("LIBVGPU_HOST_PROCFS", ""),
            ("LIBVGPU_HOSTPID_LOCK", "/x/lock"),
        ]);
        assert_eq!(c.identity.broker, Some(PathBuf::from("/run/b.sock")));
        assert_eq!(c.identity.procfs, None);
        assert_eq!(c.identity.probe.lock_path, PathBuf::from("/x/lock"));
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().copied())
    }

    #[test]
    fn sizes_and_percents_via_region_units() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            ("CUDA_DEVICE_SM_LIMIT", "250"),
        ]);
        assert_eq!(c.mem_limit(0), 4096 << 20);
        assert_eq!(c.sm_limit(0), 0);
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    }

    #[test]
    fn indexed_limit_wins_over_global() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_0", "100"),
        ]);
        assert_eq!(c.mem_limit(0), 1 << 30);
        assert_eq!(c.mem_limit(1), 2 << 30);
        assert_eq!(c.sm_limit(0), 0);
        assert_eq!(c.sm_limit(1), 40);
        assert!(c.any_limit());
        assert!(c.problems.is_empty());
    }

    #[test]
    fn malformed_values_are_reported_and_ignored() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ("CUDA_DEVICE_MEMORY_LIMIT_x", "1g"),
            ("CUDA_DEVICE_SM_LIMIT", "fast"),
            ("LIBVGPU_CONTEXT_MEMORY", "??"),
            ("GPU_CORE_UTILIZATION_POLICY", "maybe"),
            ("CUDA_TASK_PRIORITY", "high"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", " "),
        ]);
        assert_eq!(c.problems.len(), 7, "{:?}", c.problems);
        assert!(c.problems[0].contains("CUDA_DEVICE_MEMORY_LIMIT=\"lots\""));
        assert_eq!(c.mem_limit(0), 0);
        assert_eq!(c.sm_limit(0), 0);
        assert_eq!(c.context_memory, DEFAULT_CONTEXT_MEMORY);
        assert_eq!(c.cache_source, CacheSource::Default);
        assert!(!c.any_limit());
    }

    #[test]
    fn cache_and_unrelated_prefixes() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/y.cache"),
            ("CUDA_DEVICE_MEMORY_LIMITS", "1g"),
        ]);
        assert_eq!(c.cache, PathBuf::from("/x/y.cache"));
        assert_eq!(c.cache_source, CacheSource::Env);
        assert_eq!(c.mem_all, 0);
        assert!(c.problems.is_empty());
    }
}
