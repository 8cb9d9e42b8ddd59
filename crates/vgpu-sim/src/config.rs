//! Simulated-machine configuration: named cost profiles, a strict
//! `config.toml`, and the `VGPU_SIM_*` environment overrides.
//!
//! Precedence (lowest first): the profile (`VGPU_SIM_PROFILE`, else the
//! file's `profile`, else `zero`), then the file's explicit keys, then
//! `VGPU_SIM_DEVICES`.
use std::path::{Path, PathBuf};

/// Most devices one simulated machine can have (fixed by the state layout).
pub const MAX_DEVICES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("sim config {path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sim config {origin}: not valid TOML")]
    Syntax {
        origin: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("sim config {origin}: field `{field}`: {problem}")]
    Field {
        origin: String,
        field: String,
        problem: String,
    },
    #[error("sim config {path}: not a regular file ({kind}); give a small text file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("sim config {path}: larger than {limit} bytes; a sim config is a few lines of TOML")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("sim config {path}: not UTF-8 text")]
    NotText { path: PathBuf },
    #[error("unknown sim profile `{0}` (known: zero, a100-burst)")]
    UnknownProfile(String),
}

/// The most a config file may hold: it is a few lines of TOML.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Read a config file: a regular file of at most [`MAX_CONFIG_BYTES`] of
/// UTF-8. Opened without blocking, so a FIFO (or a device) at the path is
/// refused at once instead of hanging or growing without bound.
pub fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let read_err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read_err)?;
    let ft = file.metadata().map_err(read_err)?.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a plain file"
        };
        return Err(ConfigError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    let mut buf = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    String::from_utf8(buf).map_err(|_| ConfigError::NotText {
        path: path.to_path_buf(),
    })
}

/// Driver cost model, all in nanoseconds. Zero means free.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CostModel {
    /// First `cuInit` of a process.
    pub init_ns: u64,
    /// `cuCtxCreate*` of a non-primary context.
    pub ctx_create_ns: u64,
    /// `cuCtxDestroy*`.
    pub ctx_destroy_ns: u64,
    /// Primary-context retain that actually creates it (refcount 0 -> 1).
    pub primary_retain_cold_ns: u64,
    /// Primary-context retain when it already exists.
    pub primary_retain_nested_ns: u64,
    /// Primary-context release that destroys it (refcount 1 -> 0).
    pub primary_release_ns: u64,
    /// One NVML running-process snapshot.
    pub nvml_snapshot_ns: u64,
    /// Context creation (cold retain, `cuCtxCreate`) is serialized across
    /// every process of the machine, as the kernel driver does.
    pub serialize_context_creation: bool,
}

/// One simulated device model (every device of a machine is alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceModel {
    pub name: String,
    pub memory_bytes: u64,
    pub sms: u32,
    pub max_threads_per_sm: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
}

impl Default for DeviceModel {
    fn default() -> Self {
        DeviceModel {
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: 80 << 30,
            sms: 132,
            max_threads_per_sm: 2048,
            cc_major: 8,
            cc_minor: 0,
        }
    }
}

/// Kernel-execution model knobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelModel {
    /// Launches a process may have queued (not yet finished) before the next
    /// launch blocks, like a full pushbuffer.
    pub queue_depth: u32,
    /// NVML utilization sample window.
    pub nvml_window_ns: u64,
    /// Time slice of one context while others wait for the device.
    pub timeslice_ns: u64,
    /// Per-block time of every kernel of a PTX, cubin or fatbin image
    /// (such kernels run no code here; they only take time).
    pub image_block_ns: u64,
}

/// Default per-block time of the kernels of PTX / cubin / fatbin images.
pub const DEFAULT_IMAGE_BLOCK_NS: u64 = 10_000;

impl Default for KernelModel {
    fn default() -> Self {
        KernelModel {
            queue_depth: 1024,
            nvml_window_ns: 1_000_000_000,
            timeslice_ns: 1_000_000,
            image_block_ns: DEFAULT_IMAGE_BLOCK_NS,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub profile: String,
    pub devices: u32,
    pub device: DeviceModel,
    pub cost: CostModel,
    pub kernel: KernelModel,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            profile: "zero".into(),
            devices: 1,
            device: DeviceModel::default(),
            cost: CostModel::default(),
            kernel: KernelModel::default(),
        }
    }
}

/// The cost of a named profile.
pub fn profile(name: &str) -> Result<CostModel, ConfigError> {
    match name {
        "zero" => Ok(CostModel::default()),
        // Published A100 figures: cold primary-context retain ~31 ms,
        // release ~12 ms, nested retain ~1 us, NVML snapshot ~12 ms; the
        // driver serializes context creation across processes.
        "a100-burst" => Ok(CostModel {
            init_ns: 15_000_000,
            ctx_create_ns: 31_000_000,
            ctx_destroy_ns: 12_000_000,
            primary_retain_cold_ns: 31_000_000,
            primary_retain_nested_ns: 1_000,
            primary_release_ns: 12_000_000,
            nvml_snapshot_ns: 12_000_000,
            serialize_context_creation: true,
        }),
        other => Err(ConfigError::UnknownProfile(other.to_string())),
    }
}

impl SimConfig {
    /// Profile only.
    pub fn with_profile(name: &str) -> Result<SimConfig, ConfigError> {
        Ok(SimConfig {
            profile: name.to_string(),
            cost: profile(name)?,
            ..SimConfig::default()
        })
    }

    /// The configuration the environment asks for (`VGPU_SIM_PROFILE`,
    /// `VGPU_SIM_CONFIG`, `VGPU_SIM_DEVICES`).
    pub fn from_env() -> Result<SimConfig, ConfigError> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self::resolve(
            get("VGPU_SIM_PROFILE").as_deref(),
            get("VGPU_SIM_CONFIG").map(PathBuf::from).as_deref(),
            get("VGPU_SIM_DEVICES").as_deref(),
        )
    }

    /// Profile, then file, then device count, each optional.
    pub fn resolve(
        profile_name: Option<&str>,
        file: Option<&Path>,
        devices: Option<&str>,
    ) -> Result<SimConfig, ConfigError> {
        let text = match file {
            Some(p) => Some((read_config_file(p)?, p.display().to_string())),
            None => None,
        };
        let mut cfg = match &text {
            Some((t, origin)) => Self::parse_toml(t, origin, profile_name)?,
            None => Self::with_profile(profile_name.unwrap_or("zero"))?,
        };
        if let Some(d) = devices {
            cfg.devices = parse_devices(d).map_err(|problem| ConfigError::Field {
                origin: "environment".into(),
                field: "VGPU_SIM_DEVICES".into(),
                problem,
            })?;
        }
        Ok(cfg)
    }

    /// Parse a `config.toml`. `profile_override` (from the environment or
    /// command line) wins over the file's `profile` key.
    pub fn parse_toml(
        text: &str,
        origin: &str,
        profile_override: Option<&str>,
    ) -> Result<SimConfig, ConfigError> {
        let table: toml::Table = text.parse().map_err(|source| ConfigError::Syntax {
            origin: origin.to_string(),
            source,
        })?;
        let field = |field: &str, problem: String| ConfigError::Field {
            origin: origin.to_string(),
            field: field.to_string(),
            problem,
        };
        let file_profile = match table.get("profile") {
            None => None,
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(field(
                    "profile",
                    format!("expected a string, got {}", v.type_str()),
                ))
            }
        };
        let name = profile_override
            .map(str::to_string)
            .or(file_profile)
            .unwrap_or_else(|| "zero".into());
        let mut cfg = match Self::with_profile(&name) {
            Ok(c) => c,
            Err(ConfigError::UnknownProfile(p)) => {
                return Err(field(
                    "profile",
                    format!("unknown profile `{p}` (known: zero, a100-burst)"),
                ))
            }
            Err(e) => return Err(e),
        };
        for (key, value) in &table {
            match key.as_str() {
                "profile" => {}
                "devices" => {
                    let n = int(value).ok_or_else(|| field("devices", expected_int(value)))?;
                    cfg.devices = parse_devices(&n.to_string()).map_err(|p| field("devices", p))?;
                }
                "device" => {
                    let t =
                        sub_table(value).ok_or_else(|| field("device", expected_table(value)))?;
                    for (k, v) in t {
                        let name = format!("device.{k}");
                        match k.as_str() {
                            "name" => match v {
                                toml::Value::String(s) if !s.is_empty() && s.len() < 60 => {
                                    cfg.device.name = s.clone()
                                }
                                _ => {
                                    return Err(field(
                                        &name,
                                        "expected a non-empty string under 60 bytes".into(),
                                    ))
                                }
                            },
                            "memory" => {
                                cfg.device.memory_bytes = bytes(v).map_err(|p| field(&name, p))?;
                            }
                            "sms" => {
                                cfg.device.sms = positive_u32(v).map_err(|p| field(&name, p))?
                            }
                            "max_threads_per_sm" => {
                                cfg.device.max_threads_per_sm =
                                    positive_u32(v).map_err(|p| field(&name, p))?
                            }
                            "compute_capability" => {
                                let s = match v {
                                    toml::Value::String(s) => s.as_str(),
                                    _ => "",
                                };
                                let (a, b) = s
                                    .split_once('.')
                                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                                    .ok_or_else(|| {
                                        field(&name, "expected a string like \"8.0\"".into())
                                    })?;
                                cfg.device.cc_major = a;
                                cfg.device.cc_minor = b;
                            }
                            _ => return Err(field(&name, "unknown field".into())),
                        }
                    }
                }
                "cost" => {
                    let t = sub_table(value).ok_or_else(|| field("cost", expected_table(value)))?;
                    for (k, v) in t {
                        let name = format!("cost.{k}");
                        let c = &mut cfg.cost;
                        let slot = match k.as_str() {
                            "init_us" => &mut c.init_ns,
                            "ctx_create_us" => &mut c.ctx_create_ns,
                            "ctx_destroy_us" => &mut c.ctx_destroy_ns,
                            "primary_retain_cold_us" => &mut c.primary_retain_cold_ns,
                            "primary_retain_nested_us" => &mut c.primary_retain_nested_ns,
                            "primary_release_us" => &mut c.primary_release_ns,
                            "nvml_snapshot_us" => &mut c.nvml_snapshot_ns,
                            "serialize_context_creation" => match v {
                                toml::Value::Boolean(b) => {
                                    c.serialize_context_creation = *b;
                                    continue;
                                }
                                _ => {
                                    return Err(field(
                                        &name,
                                        format!("expected true or false, got {}", v.type_str()),
                                    ))
                                }
                            },
                            _ => return Err(field(&name, "unknown field".into())),
                        };
                        *slot = micros(v).map_err(|p| field(&name, p))?;
                    }
                }
                "kernel" => {
                    let t =
                        sub_table(value).ok_or_else(|| field("kernel", expected_table(value)))?;
                    for (k, v) in t {
                        let name = format!("kernel.{k}");
                        match k.as_str() {
                            "queue_depth" => {
                                let d = positive_u32(v).map_err(|p| field(&name, p))?;
                                let max = crate::state::QUEUE_LEN as u32;
                                if d > max {
                                    return Err(field(
                                        &name,
                                        format!("{d} is over the {max} maximum"),
                                    ));
                                }
                                cfg.kernel.queue_depth = d;
                            }
                            "timeslice_us" => {
                                let us = positive_u32(v).map_err(|p| field(&name, p))?;
                                cfg.kernel.timeslice_ns = u64::from(us) * 1000;
                            }
                            "image_block_us" => {
                                cfg.kernel.image_block_ns =
                                    micros(v).map_err(|p| field(&name, p))?;
                            }
                            "nvml_window_ms" => {
                                let ms = positive_u32(v).map_err(|p| field(&name, p))?;
                                if ms > 60_000 {
                                    return Err(field(
                                        &name,
                                        format!("{ms} is over the 60000 ms maximum"),
                                    ));
                                }
                                cfg.kernel.nvml_window_ns = u64::from(ms) * 1_000_000;
                            }
                            _ => return Err(field(&name, "unknown field".into())),
                        }
                    }
                }
                other => return Err(field(other, "unknown field".into())),
            }
        }
        Ok(cfg)
    }
}

/// One field on which two configurations differ: (name as in a config
/// file, this side's value, the other side's).
pub type Difference = (String, String, String);

impl SimConfig {
    /// Every field (named as in a config file) on which `self` and `other`
    /// differ. The profile name itself is not compared: a profile is its
    /// costs.
    pub fn differences(&self, other: &SimConfig) -> Vec<Difference> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push((name.to_string(), a, b));
            }
        };
        cmp(
            "devices",
            self.devices.to_string(),
            other.devices.to_string(),
        );
        let (d, e) = (&self.device, &other.device);
        cmp("device.name", d.name.clone(), e.name.clone());
        cmp(
            "device.memory",
            d.memory_bytes.to_string(),
            e.memory_bytes.to_string(),
        );
        cmp("device.sms", d.sms.to_string(), e.sms.to_string());
        cmp(
            "device.max_threads_per_sm",
            d.max_threads_per_sm.to_string(),
            e.max_threads_per_sm.to_string(),
        );
        cmp(
            "device.compute_capability",
            format!("{}.{}", d.cc_major, d.cc_minor),
            format!("{}.{}", e.cc_major, e.cc_minor),
        );
        let us = |ns: u64| format!("{}", ns as f64 / 1000.0);
        let (c, k) = (&self.cost, &other.cost);
        for (name, a, b) in [
            ("cost.init_us", c.init_ns, k.init_ns),
            ("cost.ctx_create_us", c.ctx_create_ns, k.ctx_create_ns),
            ("cost.ctx_destroy_us", c.ctx_destroy_ns, k.ctx_destroy_ns),
            (
                "cost.primary_retain_cold_us",
                c.primary_retain_cold_ns,
                k.primary_retain_cold_ns,
            ),
            (
                "cost.primary_retain_nested_us",
                c.primary_retain_nested_ns,
                k.primary_retain_nested_ns,
            ),
            (
                "cost.primary_release_us",
                c.primary_release_ns,
                k.primary_release_ns,
            ),
            (
                "cost.nvml_snapshot_us",
                c.nvml_snapshot_ns,
                k.nvml_snapshot_ns,
            ),
        ] {
            cmp(name, us(a), us(b));
        }
        cmp(
            "cost.serialize_context_creation",
            c.serialize_context_creation.to_string(),
            k.serialize_context_creation.to_string(),
        );
        let (a, b) = (&self.kernel, &other.kernel);
        cmp(
            "kernel.queue_depth",
            a.queue_depth.to_string(),
            b.queue_depth.to_string(),
        );
        cmp(
            "kernel.timeslice_us",
            us(a.timeslice_ns),
            us(b.timeslice_ns),
        );
        cmp(
            "kernel.nvml_window_ms",
            (a.nvml_window_ns / 1_000_000).to_string(),
            (b.nvml_window_ns / 1_000_000).to_string(),
        );
        out
    }

    /// The named profile whose costs these are, if any.
    pub fn matching_profile(&self) -> Option<&'static str> {
        ["zero", "a100-burst"]
            .into_iter()
            .find(|p| profile(p).is_ok_and(|c| c == self.cost))
    }
}

fn parse_devices(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_DEVICES as u32).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a device count from 1 to {MAX_DEVICES}, got `{s}`"
        )),
    }
}

fn int(v: &toml::Value) -> Option<i64> {
    match v {
        toml::Value::Integer(i) => Some(*i),
        _ => None,
    }
}

fn sub_table(v: &toml::Value) -> Option<&toml::Table> {
    match v {
        toml::Value::Table(t) => Some(t),
        _ => None,
    }
}

fn expected_int(v: &toml::Value) -> String {
    format!("expected an integer, got {}", v.type_str())
}

fn expected_table(v: &toml::Value) -> String {
    format!("expected a table, got {}", v.type_str())
}

fn positive_u32(v: &toml::Value) -> Result<u32, String> {
    match int(v) {
        Some(i) if i > 0 && i <= i64::from(u32::MAX) => Ok(i as u32),
        Some(i) => Err(format!("expected a positive integer, got {i}")),
        None => Err(expected_int(v)),
    }
}

/// Microseconds (non-negative integer or float) to nanoseconds.
fn micros(v: &toml::Value) -> Result<u64, String> {
    let us = match v {
        toml::Value::Integer(i) => *i as f64,
        toml::Value::Float(f) => *f,
        _ => {
            return Err(format!(
                "expected microseconds as a number, got {}",
                v.type_str()
            ))
        }
    };
    if !(0.0..=3.6e9).contains(&us) {
        return Err(format!("expected 0 to 3600000000 microseconds, got {us}"));
    }
    Ok((us * 1000.0).round() as u64)
}

/// Bytes as an integer or a string with a binary suffix (`80GiB`, `512m`).
pub fn bytes(v: &toml::Value) -> Result<u64, String> {
    let n = match v {
        toml::Value::Integer(i) if *i > 0 => *i as u64,
        toml::Value::String(s) => parse_size(s)?,
        _ => {
            return Err(format!(
                "expected bytes (e.g. 85899345920 or \"80GiB\"), got {v}"
            ))
        }
    };
    if n == 0 {
        return Err("expected a non-zero size".into());
    }
    Ok(n)
}

/// `"80GiB"`, `"4096m"`, `"1024"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suf) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("expected a size like \"80GiB\", got \"{s}\""))?;
    let shift = match suf.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => {
            return Err(format!(
                "unknown size suffix in \"{s}\" (use k/m/g/t or KiB/MiB/GiB/TiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("size \"{s}\" is zero or too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles() {
        assert_eq!(profile("zero").unwrap(), CostModel::default());
        let a = profile("a100-burst").unwrap();
        assert_eq!(a.primary_retain_cold_ns, 31_000_000);
        assert!(a.serialize_context_creation);
        assert!(matches!(
            profile("h100"),
            Err(ConfigError::UnknownProfile(_))
        ));
    }

    #[test]
    fn full_file() {
        let c = SimConfig::parse_toml(
            "profile = \"a100-burst\"\ndevices = 2\n[device]\nmemory = \"40GiB\"\nsms = 108\n\
             [cost]\nprimary_retain_cold_us = 1000\nserialize_context_creation = false\n\
             [kernel]\nqueue_depth = 8\nnvml_window_ms = 200\nimage_block_us = 2.5\n",
            "t",
            None,
        )
        .unwrap();
        assert_eq!(c.devices, 2);
        assert_eq!(c.device.memory_bytes, 40 << 30);
        assert_eq!(c.device.sms, 108);
        assert_eq!(c.cost.primary_retain_cold_ns, 1_000_000);
        assert_eq!(c.cost.primary_release_ns, 12_000_000, "profile value kept");
        assert!(!c.cost.serialize_context_creation);
        assert_eq!(c.kernel.queue_depth, 8);
        assert_eq!(c.kernel.nvml_window_ns, 200_000_000);
        assert_eq!(c.kernel.image_block_ns, 2_500);
        assert_eq!(SimConfig::default().kernel.image_block_ns, 10_000);
    }

    fn err(text: &str) -> String {
        SimConfig::parse_toml(text, "cfg.toml", None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn malformed_names_the_field() {
        assert!(err("[cost]\nprimary_retain_cold_us = \"fast\"\n")
            .contains("`cost.primary_retain_cold_us`"));
        assert!(err("[device]\nsms = 0\n").contains("`device.sms`"));
        assert!(err("[device]\nmemory = \"80 zebras\"\n").contains("`device.memory`"));
        assert!(err("devices = 99\n").contains("`devices`"));
        assert!(err("[kernel]\nqueue_deep = 3\n").contains("`kernel.queue_deep`: unknown field"));
        assert!(err("profile = \"h100\"\n").contains("`profile`"));
        assert!(err("gpus = 1\n").contains("`gpus`"));
        assert!(err("[cost]\nserialize_context_creation = 1\n")
            .contains("`cost.serialize_context_creation`"));
        // Syntax errors carry the origin and the parser's own position.
        let e = SimConfig::parse_toml("devices = = 2", "cfg.toml", None).unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }));
    }

    #[test]
    fn env_devices_validated() {
        let e = SimConfig::resolve(None, None, Some("0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("VGPU_SIM_DEVICES"), "{e}");
        assert_eq!(
            SimConfig::resolve(Some("a100-burst"), None, Some("3"))
                .unwrap()
                .devices,
            3
        );
    }

    proptest::proptest! {
        /// Any text either parses or gives an error; never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            let _ = SimConfig::parse_toml(&text, "p", None);
        }

        /// A bad value under any known key is an error naming that key.
        #[test]
        fn bad_values_name_their_field(
            key in proptest::sample::select(vec![
                "cost.init_us", "cost.ctx_create_us", "cost.primary_release_us",
                "cost.serialize_context_creation", "device.sms", "device.memory",
                "kernel.queue_depth", "kernel.nvml_window_ms", "kernel.image_block_us",
            ]),
            bad in proptest::sample::select(vec!["\"x\"", "-5", "[1]", "{a = 1}", "1e30"]),
        ) {
            let (table, field) = key.split_once('.').unwrap();
            let text = format!("[{table}]\n{field} = {bad}\n");
            match SimConfig::parse_toml(&text, "p", None) {
                Ok(c) => proptest::prop_assert!(false, "{text} accepted as {c:?}"),
                Err(e) => proptest::prop_assert!(e.to_string().contains(&format!("`{key}`")), "{text}: {e}"),
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096m").unwrap(), 4096 << 20);
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert!(parse_size("1x").is_err());
        assert!(parse_size("0").is_err());
    }
}
