//! The node registration annotation (`hami.io/node-nvidia-register`).
//!
//! Since HAMi v2.8 it is the JSON array `MarshalNodeDevices` writes
//! (`pkg/device/devices.go`: `DeviceInfo` with `omitempty` on every field,
//! copied field by field so only id, index, count, devmem, devcore, type,
//! numa, mode, migProfiles and health can appear, in that order), read back
//! by `UnMarshalNodeDevices` (Go `encoding/json`: unknown keys ignored,
//! `null` = no devices). [`encode`] writes the bytes Go would write, HTML
//! escaping of `<`, `>`, `&` included; [`decode`] accepts everything HAMi's
//! plugin writes (MIG profiles too) and refuses wrong types.
//!
//! Before v2.8 the value was a colon list (`DecodeNodeDevices`:
//! `id,count,devmem,devcore,type,numa,health[,index,mode]:`);
//! [`decode_legacy`] reads it so a scheduler can meet an old node.
//!
//! [`NodeDevice::from_gpu`] applies the device plugin's arithmetic
//! (`pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go`): memory
//! scaling, core scaling, the `NVIDIA-` type prefix.

use serde::{Deserialize, Serialize};

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}
fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

/// One registered GPU (HAMi's `DeviceInfo` as it travels).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDevice {
    /// GPU UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// NVML index (Go `uint`; omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub index: u64,
    /// vGPUs the card is split into (`deviceSplitCount`).
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub count: i32,
    /// MiB × `deviceMemoryScaling`.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub devmem: i32,
    /// 100 × `deviceCoreScaling`.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub devcore: i32,
    /// `NVIDIA-<model>` (or the model when it already starts with `NVIDIA`).
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub device_type: String,
    /// NUMA node (Go `int`; omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub numa: i64,
    /// `hami-core`, `mig` or `mps`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// MIG placement capabilities (MIG mode only).
    #[serde(rename = "migProfiles", default, skip_serializing_if = "Vec::is_empty")]
    pub mig_profiles: Vec<MigProfile>,
    /// Healthy (omitted when false).
    #[serde(default, skip_serializing_if = "is_false")]
    pub health: bool,
}

/// A MIG profile a GPU can host (HAMi's `MigProfile`; no `omitempty`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// Profile name, e.g. `1g.10gb`.
    #[serde(default)]
    pub name: String,
    /// Memory of one instance, MB.
    #[serde(rename = "memoryMB", default)]
    pub memory_mb: i32,
    /// Percent of the GPU's SMs.
    #[serde(default)]
    pub core: i32,
    /// Memory slices.
    #[serde(rename = "sliceCount", default)]
    pub slice_count: u32,
    /// Possible placements; Go writes a nil slice as `null`.
    #[serde(default)]
    pub placements: Option<Vec<MigPlacement>>,
}

/// One MIG placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPlacement {
    /// First slice.
    #[serde(default)]
    pub start: u32,
    /// Slices.
    #[serde(default)]
    pub size: u32,
}

/// Why a registration value does not decode.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Not the JSON array HAMi writes (syntax or a field of the wrong type).
    #[error("node registration is not HAMi's JSON device array: {0}")]
    Json(#[from] serde_json::Error),
    /// Legacy colon form: no `:` at all.
    #[error("legacy node registration has no ':' device separator")]
    LegacyNoSeparator,
    /// Legacy colon form: a segment with the wrong number of fields.
    #[error("legacy node registration segment {segment:?}: expected 7 or 9 fields, found {found}")]
    LegacyFieldCount {
        /// The segment.
        segment: String,
        /// Fields found.
        found: usize,
    },
    /// Legacy colon form: a field that does not parse.
    #[error("legacy node registration segment {segment:?}: bad {field} {value:?}")]
    LegacyField {
        /// The segment.
        segment: String,
        /// Field name.
        field: &'static str,
        /// Field text.
        value: String,
    },
}

/// Inputs of one registration entry, as the device plugin measures them.
#[derive(Clone, Debug)]
pub struct GpuFacts<'a> {
    /// UUID.
    pub uuid: &'a str,
    /// NVML index.
    pub index: u32,
    /// Total memory, bytes (NVML).
    pub memory_bytes: u64,
    /// NVML device name.
    pub model: &'a str,
    /// NUMA node (0 when unknown).
    pub numa: i64,
    /// Healthy now.
    pub healthy: bool,
}

/// Registration settings (`devicePlugin.*` Helm values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegisterScaling {
    /// `deviceSplitCount`.
    pub split_count: u32,
    /// `deviceMemoryScaling`.
    pub memory_scaling: f64,
    /// `deviceCoreScaling`.
    pub core_scaling: f64,
}

impl Default for RegisterScaling {
    fn default() -> Self {
        RegisterScaling {
            split_count: 10,
            memory_scaling: 1.0,
            core_scaling: 1.0,
        }
    }
}

/// Go's `int32(f)` for the finite, in-range values the plugin produces:
/// truncation toward zero, saturated at the ends instead of Go's
/// implementation-defined wrap.
fn go_int32(f: f64) -> i32 {
    if f.is_nan() {
        0
    } else {
        f.trunc().clamp(i32::MIN as f64, i32::MAX as f64) as i32
    }
}

/// HAMi's registered type for an NVML device name: unchanged when it starts
/// with `NVIDIA`, else prefixed `NVIDIA-`.
pub fn hami_device_type(model: &str) -> String {
    if model.starts_with("NVIDIA") {
        model.to_owned()
    } else {
        format!("NVIDIA-{model}")
    }
}

impl NodeDevice {
    /// The entry HAMi's device plugin registers for one GPU in `hami-core`
    /// mode: devmem = `int32(MiB × memory_scaling)` (MiB alone when the
    /// scaling is exactly 1), devcore = `int32(core_scaling × 100)`.
    pub fn from_gpu(g: &GpuFacts<'_>, s: &RegisterScaling) -> NodeDevice {
        let mib = go_int32((g.memory_bytes / 1024 / 1024) as f64);
        let devmem = if s.memory_scaling != 1.0 {
            go_int32(mib as f64 * s.memory_scaling)
        } else {
            mib
        };
        NodeDevice {
            id: g.uuid.to_owned(),
            index: g.index as u64,
            count: go_int32(s.split_count as f64),
            devmem,
            devcore: go_int32(s.core_scaling * 100.0),
            device_type: hami_device_type(g.model),
            numa: g.numa,
            mode: crate::keys::MODE_HAMI_CORE.to_owned(),
            mig_profiles: Vec::new(),
            health: g.healthy,
        }
    }
}

/// serde_json's compact output with Go's extra escapes: `encoding/json`
/// HTML-escapes `<`, `>`, `&` and escapes U+2028/U+2029 by default; every
/// other escape (quote, backslash, `\b \f \n \r \t`, other controls as
/// lowercase `\u00XX`) is already the same.
struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(esc.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// The annotation value Go's `MarshalNodeDevices` writes for `devices`.
pub fn encode(devices: &[NodeDevice]) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    // Serializing plain structs of strings and integers into memory cannot
    // fail; an empty array is the safe answer if it ever did.
    if devices.serialize(&mut ser).is_err() {
        return "[]".to_owned();
    }
    String::from_utf8(out).unwrap_or_else(|_| "[]".to_owned())
}

/// Decodes the JSON value (`null` = no devices, as Go reads it).
pub fn decode(s: &str) -> Result<Vec<NodeDevice>, RegisterError> {
    let v: Option<Vec<NodeDevice>> = serde_json::from_str(s)?;
    Ok(v.unwrap_or_default())
}

fn go_parse_int32(s: &str) -> Option<i32> {
    // strconv.ParseInt(s, 10, 32): optional sign, decimal digits.
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i32>().ok()
}

/// Decodes the pre-v2.8 colon form, as HAMi's `DecodeNodeDevices` does.
pub fn decode_legacy(s: &str) -> Result<Vec<NodeDevice>, RegisterError> {
    if !s.contains(':') {
        return Err(RegisterError::LegacyNoSeparator);
    }
    let mut out = Vec::new();
    for seg in s.split(':').filter(|x| !x.is_empty()) {
        let f: Vec<&str> = seg.split(',').collect();
        if f.len() != 7 && f.len() != 9 {
            return Err(RegisterError::LegacyFieldCount {
                segment: seg.to_owned(),
                found: f.len(),
            });
        }
        let bad = |field: &'static str, value: &str| RegisterError::LegacyField {
            segment: seg.to_owned(),
            field,
            value: value.to_owned(),
        };
        let int = |field, v: &str| go_parse_int32(v).ok_or_else(|| bad(field, v));
        let health = crate::keys::parse_go_bool(f[6]).ok_or_else(|| bad("health", f[6]))?;
        let numa = go_parse_int32(f[5]).ok_or_else(|| bad("numa", f[5]))? as i64;
        let (index, mode) = if f.len() == 9 {
            let idx = go_parse_int32(f[7])
                .filter(|v| *v >= 0)
                .ok_or_else(|| bad("index", f[7]))?;
            (idx as u64, f[8].to_owned())
        } else {
            (0, crate::keys::MODE_HAMI_CORE.to_owned())
        };
        out.push(NodeDevice {
            id: f[0].to_owned(),
            index,
            count: int("count", f[1])?,
            devmem: int("devmem", f[2])?,
            devcore: int("devcore", f[3])?,
            device_type: f[4].to_owned(),
            numa,
            mode,
            mig_profiles: Vec::new(),
            health,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitempty_and_order() {
        let d = NodeDevice {
            id: "GPU-a".into(),
            count: 10,
            devmem: 1024,
            devcore: 100,
            device_type: "NVIDIA-T4".into(),
            mode: "hami-core".into(),
            ..NodeDevice::default()
        };
        assert_eq!(
            encode(&[d]),
            r#"[{"id":"GPU-a","count":10,"devmem":1024,"devcore":100,"type":"NVIDIA-T4","mode":"hami-core"}]"#
        );
        assert_eq!(encode(&[]), "[]");
    }

    #[test]
    fn go_html_escapes() {
        let d = NodeDevice {
            device_type: "a<b>&c\u{2028}\"\n".into(),
            ..NodeDevice::default()
        };
        assert_eq!(
            encode(std::slice::from_ref(&d)),
            r#"[{"type":"a\u003cb\u003e\u0026c\u2028\"\n"}]"#
        );
        assert_eq!(decode(&encode(std::slice::from_ref(&d))).unwrap(), vec![d]);
    }

    #[test]
    fn scaling_arithmetic() {
        let g = GpuFacts {
            uuid: "GPU-a",
            index: 1,
            memory_bytes: 16 << 30,
            model: "Tesla T4",
            numa: 0,
            healthy: true,
        };
        let d = NodeDevice::from_gpu(
            &g,
            &RegisterScaling {
                split_count: 4,
                memory_scaling: 1.5,
                core_scaling: 0.5,
            },
        );
        assert_eq!((d.devmem, d.devcore, d.count), (24576, 50, 4));
        assert_eq!(d.device_type, "NVIDIA-Tesla T4");
        assert_eq!(
            hami_device_type("NVIDIA A100-SXM4-80GB"),
            "NVIDIA A100-SXM4-80GB"
        );
    }

    #[test]
    fn null_and_wrong_types() {
        assert!(decode("null").unwrap().is_empty());
        assert!(decode(r#"[{"index":-1}]"#).is_err());
        assert!(decode(r#"[{"devmem":"1"}]"#).is_err());
        assert!(decode(r#"[{"devmem":2147483648}]"#).is_err());
        assert!(decode("{").is_err());
        // Unknown keys are ignored, as Go does.
        assert_eq!(decode(r#"[{"id":"x","future":1}]"#).unwrap()[0].id, "x");
    }
}
