//! The pod device list (`hami.io/vgpu-devices-to-allocate`,
//! `hami.io/vgpu-devices-allocated`; HAMi `pkg/device/devices.go`
//! `EncodePodSingleDevice`/`DecodePodDevices`) and the device plugin's
//! device IDs (`<UUID>-<i>`, `pkg/device-plugin/.../rm/devices.go`).
//!
//! Format: per device `UUID,Type,MemMiB,Cores` followed by `:`; per
//! container the devices followed by `;`; one entry per container, init
//! containers first, then app containers; a container without devices is an
//! empty entry. Example: `GPU-a,NVIDIA,3000,0:;;GPU-b,NVIDIA,5000,30:;`.
//!
//! Decoding is strict where HAMi writes only one form (exactly four fields,
//! decimal non-negative `int32` numbers) and lenient where HAMi's own
//! decoder is (a missing final `:` or `;`, empty pieces). What decodes
//! re-encodes in HAMi's canonical form.

use std::fmt;

/// One device of one container.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerDevice {
    /// Physical GPU UUID (`GPU-…`).
    pub uuid: String,
    /// Device type word (`NVIDIA`).
    pub device_type: String,
    /// Device memory for this container on this GPU, MiB.
    pub mem_mib: u32,
    /// SM share, percent (0 = no core limit; 100 = exclusive).
    pub cores: u32,
}

/// Why a device list does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceListError {
    /// A device entry has other than four comma-separated fields.
    #[error("container {container}, device {device}: expected 4 fields UUID,Type,MemMiB,Cores, found {found} in {entry:?}")]
    FieldCount {
        /// Container entry index (init containers first).
        container: usize,
        /// Device index within the container.
        device: usize,
        /// Fields found.
        found: usize,
        /// The entry.
        entry: String,
    },
    /// An empty UUID or type field.
    #[error("container {container}, device {device}: empty {field} in {entry:?}")]
    EmptyField {
        /// Container entry index.
        container: usize,
        /// Device index.
        device: usize,
        /// `uuid` or `type`.
        field: &'static str,
        /// The entry.
        entry: String,
    },
    /// Memory or cores is not a decimal in `0..=i32::MAX`.
    #[error("container {container}, device {device}: {field} {value:?} is not a decimal in 0..=2147483647")]
    BadNumber {
        /// Container entry index.
        container: usize,
        /// Device index.
        device: usize,
        /// `memory` or `cores`.
        field: &'static str,
        /// The field text.
        value: String,
    },
    /// A field contains a separator or whitespace the format cannot carry.
    #[error("{field} {value:?} contains one of ',' ':' ';' or whitespace")]
    Unencodable {
        /// `uuid` or `type`.
        field: &'static str,
        /// The value.
        value: String,
    },
}

fn parse_i32_decimal(s: &str) -> Option<u32> {
    // Go's strconv.ParseInt(s, 10, 32) also takes a sign; HAMi never writes
    // one and a negative size has no meaning, so only plain digits pass.
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u64 = s.parse().ok()?;
    (v <= i32::MAX as u64).then_some(v as u32)
}

fn check_word(field: &'static str, value: &str) -> Result<(), DeviceListError> {
    if value
        .chars()
        .any(|c| matches!(c, ',' | ':' | ';') || c.is_whitespace())
    {
        return Err(DeviceListError::Unencodable {
            field,
            value: value.to_owned(),
        });
    }
    Ok(())
}

impl ContainerDevice {
    /// A device of type `NVIDIA`.
    pub fn nvidia(uuid: impl Into<String>, mem_mib: u32, cores: u32) -> Self {
        ContainerDevice {
            uuid: uuid.into(),
            device_type: crate::keys::NVIDIA.to_owned(),
            mem_mib,
            cores,
        }
    }

    fn parse(entry: &str, container: usize, device: usize) -> Result<Self, DeviceListError> {
        let fields: Vec<&str> = entry.split(',').collect();
        if fields.len() != 4 {
            return Err(DeviceListError::FieldCount {
                container,
                device,
                found: fields.len(),
                entry: entry.to_owned(),
            });
        }
        for (field, v) in [("uuid", fields[0]), ("type", fields[1])] {
            if v.is_empty() {
                return Err(DeviceListError::EmptyField {
                    container,
                    device,
                    field,
                    entry: entry.to_owned(),
                });
            }
            check_word(field, v)?;
        }
        let num = |field: &'static str, v: &str| {
            parse_i32_decimal(v).ok_or_else(|| DeviceListError::BadNumber {
                container,
                device,
                field,
                value: v.to_owned(),
            })
        };
        Ok(ContainerDevice {
            uuid: fields[0].to_owned(),
            device_type: fields[1].to_owned(),
            mem_mib: num("memory", fields[2])?,
            cores: num("cores", fields[3])?,
        })
    }

    fn check(&self) -> Result<(), DeviceListError> {
        check_word("uuid", &self.uuid)?;
        check_word("type", &self.device_type)?;
        if self.uuid.is_empty() || self.device_type.is_empty() {
            return Err(DeviceListError::EmptyField {
                container: 0,
                device: 0,
                field: if self.uuid.is_empty() { "uuid" } else { "type" },
                entry: String::new(),
            });
        }
        if self.mem_mib > i32::MAX as u32 || self.cores > i32::MAX as u32 {
            return Err(DeviceListError::BadNumber {
                container: 0,
                device: 0,
                field: if self.mem_mib > i32::MAX as u32 {
                    "memory"
                } else {
                    "cores"
                },
                value: self.mem_mib.max(self.cores).to_string(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for ContainerDevice {
    /// `UUID,Type,MemMiB,Cores` (without the `:` terminator).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{},{}",
            self.uuid, self.device_type, self.mem_mib, self.cores
        )
    }
}

/// Where a device-list entry belongs in the pod spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerSlot {
    /// `spec.initContainers[i]`.
    Init(usize),
    /// `spec.containers[i]`.
    App(usize),
}

/// A whole pod's device list: one entry per container, init containers
/// first. An entry with no devices is a container without GPUs (or one the
/// device plugin has already served).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDevices {
    /// Per container entry.
    pub containers: Vec<Vec<ContainerDevice>>,
}

impl PodDevices {
    /// Decodes an annotation value. `""` is a pod with no entries.
    pub fn parse(s: &str) -> Result<PodDevices, DeviceListError> {
        let mut pieces: Vec<&str> = s.split(';').collect();
        // Every entry is terminated by ';': the piece after the last one is
        // the terminator's, not a container (a value without the final ';'
        // is accepted as HAMi's decoder does).
        if pieces.last() == Some(&"") {
            pieces.pop();
        }
        let mut containers = Vec::with_capacity(pieces.len());
        for (ci, piece) in pieces.iter().enumerate() {
            let mut devs = Vec::new();
            for entry in piece.split(':') {
                if entry.is_empty() {
                    continue;
                }
                devs.push(ContainerDevice::parse(entry, ci, devs.len())?);
            }
            containers.push(devs);
        }
        Ok(PodDevices { containers })
    }

    /// Encodes in HAMi's canonical form (every device `:`-terminated, every
    /// container `;`-terminated). Fails on a field the format cannot carry.
    pub fn encode(&self) -> Result<String, DeviceListError> {
        let mut out = String::new();
        for c in &self.containers {
            for d in c {
                d.check()?;
                out.push_str(&d.to_string());
                out.push(':');
            }
            out.push(';');
        }
        Ok(out)
    }

    /// Maps entry `index` to the pod spec, given the number of init and app
    /// containers; `None` when the index is past both.
    pub fn slot_of(index: usize, init_count: usize, app_count: usize) -> Option<ContainerSlot> {
        if index < init_count {
            Some(ContainerSlot::Init(index))
        } else if index - init_count < app_count {
            Some(ContainerSlot::App(index - init_count))
        } else {
            None
        }
    }

    /// The first entry that still has devices (HAMi's
    /// `popNextContainerDevices` order), with its index.
    pub fn next_pending(&self) -> Option<(usize, &[ContainerDevice])> {
        self.containers
            .iter()
            .enumerate()
            .find(|(_, c)| !c.is_empty())
            .map(|(i, c)| (i, c.as_slice()))
    }

    /// Removes and returns the first entry with devices, leaving an empty
    /// entry in its place so the other indices keep their containers.
    pub fn pop_next(&mut self) -> Option<(usize, Vec<ContainerDevice>)> {
        let i = self.containers.iter().position(|c| !c.is_empty())?;
        Some((i, std::mem::take(&mut self.containers[i])))
    }

    /// True when no entry has devices left (every container served).
    pub fn all_served(&self) -> bool {
        self.containers.iter().all(|c| c.is_empty())
    }

    /// Every device of every container.
    pub fn devices(&self) -> impl Iterator<Item = &ContainerDevice> {
        self.containers.iter().flatten()
    }
}

/// The device plugin's ID of replica `i` of GPU `uuid`: `<UUID>-<i>`.
pub fn replica_id(uuid: &str, i: u32) -> String {
    format!("{uuid}-{i}")
}

/// The physical UUID of a device ID: `<UUID>-<i>` → `<UUID>`, as HAMi's
/// `physicalDeviceID` reads it (a GPU UUID has five dashes, a replica ID six
/// with a decimal last part); anything else is returned unchanged.
pub fn physical_id(id: &str) -> &str {
    if id.matches('-').count() == 6 {
        if let Some((head, tail)) = id.rsplit_once('-') {
            if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
                return head;
            }
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_round_trip() {
        let s = ";GPU-a,NVIDIA,1024,30:GPU-b,NVIDIA,2048,30:;;";
        let p = PodDevices::parse(s).unwrap();
        assert_eq!(p.containers.len(), 3);
        assert!(p.containers[0].is_empty());
        assert_eq!(p.containers[1].len(), 2);
        assert_eq!(p.encode().unwrap(), s);
    }

    #[test]
    fn lenient_terminators() {
        let p = PodDevices::parse("GPU-a,NVIDIA,1,2").unwrap();
        assert_eq!(
            p.containers,
            vec![vec![ContainerDevice::nvidia("GPU-a", 1, 2)]]
        );
        assert_eq!(PodDevices::parse("").unwrap().containers.len(), 0);
        assert_eq!(PodDevices::parse(";").unwrap().containers, vec![vec![]]);
    }

    #[test]
    fn strict_fields() {
        assert!(matches!(
            PodDevices::parse("GPU-a,NVIDIA,1:"),
            Err(DeviceListError::FieldCount { found: 3, .. })
        ));
        assert!(matches!(
            PodDevices::parse("GPU-a,NVIDIA,-1,0:"),
            Err(DeviceListError::BadNumber {
                field: "memory",
                ..
            })
        ));
        assert!(matches!(
            PodDevices::parse("GPU-a,NVIDIA,2147483648,0:"),
            Err(DeviceListError::BadNumber { .. })
        ));
        assert!(matches!(
            PodDevices::parse(",NVIDIA,1,0:"),
            Err(DeviceListError::EmptyField { field: "uuid", .. })
        ));
    }

    #[test]
    fn pop_keeps_indices() {
        let mut p = PodDevices::parse(";GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,2,0:;").unwrap();
        assert_eq!(p.pop_next().unwrap().0, 1);
        assert_eq!(p.encode().unwrap(), ";;GPU-b,NVIDIA,2,0:;");
        assert_eq!(p.pop_next().unwrap().0, 2);
        assert!(p.all_served());
        assert_eq!(p.encode().unwrap(), ";;;");
        assert!(p.pop_next().is_none());
    }

    #[test]
    fn ids() {
        let u = "GPU-4617e643-f070-4b90-b715-30c57f977a9a";
        assert_eq!(physical_id(&replica_id(u, 7)), u);
        assert_eq!(physical_id(u), u);
        assert_eq!(physical_id("GPU-x-y-z-w-v-abc"), "GPU-x-y-z-w-v-abc");
        assert_eq!(PodDevices::slot_of(0, 1, 2), Some(ContainerSlot::Init(0)));
        assert_eq!(PodDevices::slot_of(2, 1, 2), Some(ContainerSlot::App(1)));
        assert_eq!(PodDevices::slot_of(3, 1, 2), None);
    }
}
