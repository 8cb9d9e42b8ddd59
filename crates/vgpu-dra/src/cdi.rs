//! The transient CDI spec of one claim (CDI `SPEC.md`): the types vgpu
//! emits, strict on read (an unknown field is an error, as the runtimes'
//! loaders make it), its file name (`<vendor>-<class>_<claimUID>.json`, the
//! CDI library's transient-spec naming) and the qualified device names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vgpu_node::proto::v1beta1::Mount as PluginMount;

/// The CDI version written: mounts with options and env need nothing newer,
/// and runtimes from containerd 1.7 on accept it.
pub const CDI_VERSION: &str = "0.6.0";
/// The device class under the driver's vendor name.
pub const CLASS: &str = "claim";

/// A CDI spec file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// `cdiVersion`.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// The devices.
    pub devices: Vec<Device>,
    /// Spec-wide edits (vgpu sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_edits: Option<ContainerEdits>,
}

/// One CDI device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Name, unique in the kind.
    pub name: String,
    /// What it adds to a container.
    pub container_edits: ContainerEdits,
}

/// Container edits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Host path.
    pub host_path: String,
    /// Container path.
    pub container_path: String,
    /// `bind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl ContainerEdits {
    /// The device plugin's env and mounts as CDI edits: bind mounts, `ro`
    /// where the plugin says read-only.
    pub fn from_plugin(envs: &BTreeMap<String, String>, mounts: &[PluginMount]) -> ContainerEdits {
        ContainerEdits {
            env: envs.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            mounts: mounts
                .iter()
                .map(|m| Mount {
                    host_path: m.host_path.clone(),
                    container_path: m.container_path.clone(),
                    r#type: Some("bind".into()),
                    options: vec![
                        if m.read_only { "ro" } else { "rw" }.into(),
                        "nosuid".into(),
                        "nodev".into(),
                        "bind".into(),
                    ],
                })
                .collect(),
        }
    }
}

/// `vendor/class` for `driver`: `vgpu.io/claim`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/{CLASS}")
}

/// The CDI device name of a share: `<claimUID>-<device>-<shareID>`, or
/// `<claimUID>-<device>` without a share ID.
pub fn device_name(claim_uid: &str, device: &str, share_id: Option<&str>) -> String {
    match share_id {
        Some(s) => format!("{claim_uid}-{device}-{s}"),
        None => format!("{claim_uid}-{device}"),
    }
}

/// The fully qualified ID: `vgpu.io/claim=<name>`.
pub fn qualified(driver: &str, name: &str) -> String {
    format!("{}={name}", kind(driver))
}

/// The spec file of a claim: `<dir>/<vendor>-claim_<claimUID>.json`.
pub fn spec_path(dir: &Path, driver: &str, claim_uid: &str) -> PathBuf {
    dir.join(format!(
        "{}-{CLASS}_{claim_uid}.json",
        driver.replace('/', "-")
    ))
}

/// Why a spec is refused.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// Not a spec (syntax or an unknown field).
    #[error("CDI spec: {0}")]
    Decode(#[from] serde_json::Error),
    /// A name CDI does not accept.
    #[error("CDI spec: {0}")]
    Invalid(String),
}

fn valid_name(n: &str) -> bool {
    n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

impl Spec {
    /// Parses and checks a spec (kind `vendor/class`, device names, unique).
    pub fn parse(text: &str) -> Result<Spec, CdiError> {
        let s: Spec = serde_json::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    /// The checks CDI's loader makes on what vgpu writes.
    pub fn validate(&self) -> Result<(), CdiError> {
        let bad = |m: String| Err(CdiError::Invalid(m));
        let Some((vendor, class)) = self.kind.split_once('/') else {
            return bad(format!("kind {:?} is not vendor/class", self.kind));
        };
        if vendor.is_empty() || class.is_empty() || !valid_name(class) {
            return bad(format!("kind {:?} is not vendor/class", self.kind));
        }
        let mut seen = std::collections::HashSet::new();
        for d in &self.devices {
            if !valid_name(&d.name) {
                return bad(format!("device name {:?}", d.name));
            }
            if !seen.insert(&d.name) {
                return bad(format!("device {:?} twice", d.name));
            }
            for e in &d.container_edits.env {
                if !e.contains('=') {
                    return bad(format!("env {e:?} is not NAME=value"));
                }
            }
        }
        Ok(())
    }

    /// The spec as written (pretty JSON).
    pub fn render(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_round_trip() {
        let uid = "6f1b2c3d-0000-4000-8000-00000000000a";
        assert_eq!(
            device_name(uid, "gpu-0", Some("a1b2")),
            format!("{uid}-gpu-0-a1b2")
        );
        assert_eq!(device_name(uid, "gpu-1", None), format!("{uid}-gpu-1"));
        assert_eq!(
            qualified("vgpu.io", &device_name(uid, "gpu-0", Some("s"))),
            format!("vgpu.io/claim={uid}-gpu-0-s")
        );
        assert_eq!(
            spec_path(Path::new("/var/run/cdi"), "vgpu.io", uid),
            PathBuf::from(format!("/var/run/cdi/vgpu.io-claim_{uid}.json"))
        );
        let envs = BTreeMap::from([("A".to_string(), "1".to_string())]);
        let mounts = vec![PluginMount {
            container_path: "/etc/vgpu".into(),
            host_path: "/h/limits".into(),
            read_only: true,
        }];
        let spec = Spec {
            cdi_version: CDI_VERSION.into(),
            kind: kind("vgpu.io"),
            devices: vec![Device {
                name: device_name(uid, "gpu-0", Some("s")),
                container_edits: ContainerEdits::from_plugin(&envs, &mounts),
            }],
            container_edits: None,
        };
        let text = spec.render();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], "vgpu.io/claim");
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(v["devices"][0]["containerEdits"]["env"][0], "A=1");
        assert_eq!(
            v["devices"][0]["containerEdits"]["mounts"][0]["options"],
            serde_json::json!(["ro", "nosuid", "nodev", "bind"])
        );
        assert_eq!(Spec::parse(&text).unwrap(), spec);
        // CDI loaders refuse unknown fields; so does this parser.
        let mut v2 = v.clone();
        v2["devices"][0]["containerEdits"]["bogus"] = serde_json::json!(1);
        assert!(Spec::parse(&v2.to_string()).is_err());
        let mut v3 = v;
        v3["kind"] = "noslash".into();
        assert!(matches!(
            Spec::parse(&v3.to_string()),
            Err(CdiError::Invalid(_))
        ));
    }
}
