//! The environment contract (docs/design.md section 4), parsed once per process.
//!
//! Parsing is pure (it takes the variables as a list) so it is unit-tested
//! without touching the process environment. Every malformed value yields
//! one problem line (logged by the caller) and the documented fallback:
//! the variable is ignored, as if unset.
use std::collections::BTreeMap;
use std::path::PathBuf;

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
    pub visible: Option<String>,
    pub context_memory: u64,
    pub priority: i32,
    pub util_policy: UtilPolicy,
    /// One line per malformed variable, with the fallback taken.
    pub problems: Vec<String>,
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
            visible: None,
            context_memory: DEFAULT_CONTEXT_MEMORY,
            priority: 0,
            util_policy: UtilPolicy::Default,
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
                _ => {}
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
