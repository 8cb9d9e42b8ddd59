//! What identity resolution did, in a shape a shared-memory slot can hold:
//! small stable numeric codes with names, counts and a duration.
use std::time::Duration;

/// Which tier produced (or last tried to produce) the host PID: the one
/// tier type, shared with the region's slot telemetry.
pub use vgpu_region::IdentityTier;

/// The tiers in the default order: no experiment when a cheap answer exists.
pub const DEFAULT_ORDER: [IdentityTier; 4] = [
    IdentityTier::SameNamespace,
    IdentityTier::Broker,
    IdentityTier::HostProcfs,
    IdentityTier::NvmlProbe,
];

/// A tier's stable lower-case name, as `LIBVGPU_IDENTITY_TIERS` and the
/// log spell it.
pub fn tier_name(t: IdentityTier) -> &'static str {
    match t {
        IdentityTier::None => "none",
        IdentityTier::Broker => "broker",
        IdentityTier::HostProcfs => "procfs",
        IdentityTier::NvmlProbe => "probe",
        IdentityTier::SameNamespace => "same_namespace",
    }
}

/// A tier from its configuration name (and a few aliases); `None` for
/// anything else (and for `none`, which is not a tier to try).
pub fn parse_tier(s: &str) -> Option<IdentityTier> {
    match s.trim().to_ascii_lowercase().as_str() {
        "same_namespace" | "same-namespace" | "ns" => Some(IdentityTier::SameNamespace),
        "broker" => Some(IdentityTier::Broker),
        "procfs" | "host_procfs" => Some(IdentityTier::HostProcfs),
        "probe" | "nvml_probe" => Some(IdentityTier::NvmlProbe),
        _ => None,
    }
}

/// Why a tier (or the whole resolution) failed. A `u16` newtype with stable
/// values; 0 means no failure. Codes are grouped by tier (1xx broker,
/// 2xx procfs, 3xx probe, 9xx overall).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct FailureCode(pub u16);

macro_rules! failure_codes {
    ($($name:ident = $val:expr, $text:expr;)*) => {
        impl FailureCode {
            $(
                #[doc = $text]
                pub const $name: FailureCode = FailureCode($val);
            )*

            /// Every defined code, for tables and tests.
            pub const ALL: &'static [FailureCode] = &[$(FailureCode::$name),*];

            /// Stable name: the constant's own (`"UNKNOWN"` for an undefined value).
            pub fn name(self) -> &'static str {
                $(
                    if self == FailureCode::$name {
                        return stringify!($name);
                    }
                )*
                "UNKNOWN"
            }
        }
    };
}

failure_codes! {
    NONE = 0, "No failure.";
    BROKER_NOT_CONFIGURED = 100, "`LIBVGPU_HOSTPID_BROKER` unset.";
    BROKER_MISSING = 101, "The broker socket does not exist.";
    BROKER_UNSAFE_ENDPOINT = 102, "The socket or its directory failed the ownership/type checks.";
    BROKER_CONNECT = 103, "Connecting failed (refused, permission, ...).";
    BROKER_TIMEOUT = 104, "The deadline passed before a full answer.";
    BROKER_IO = 105, "Reading or writing the socket failed or hit EOF early.";
    BROKER_BAD_FRAME = 106, "The answer was not a well-formed v1 response.";
    BROKER_STATUS = 107, "The broker answered with a non-OK status.";
    PROCFS_NOT_CONFIGURED = 200, "`LIBVGPU_HOST_PROCFS` unset.";
    PROCFS_READ = 201, "`<mount>/self/status` could not be read.";
    PROCFS_NOT_PROCFS = 202, "The mount is not procfs.";
    PROCFS_PARSE = 203, "`NStgid` did not parse.";
    PROCFS_OWN_NAMESPACE = 204, "The mount is the process's own private procfs.";
    PROBE_NOT_AVAILABLE = 300, "No probe driver was given.";
    PROBE_LOCK = 301, "The node-wide probe lock could not be opened or taken in time.";
    PROBE_DRIVER = 302, "An NVML or CUDA call of the probe failed.";
    PROBE_NO_CANDIDATE = 303, "No new PID appeared after retaining the primary context.";
    PROBE_AMBIGUOUS = 304, "More than one new PID appeared.";
    PROBE_TIMEOUT = 305, "The probe's total time budget ran out.";
}

impl std::fmt::Display for FailureCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// The outcome of one identity resolution, for the slot and `vgpu inspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Telemetry {
    /// The tier that produced the PID, or the last one tried on failure.
    pub tier: IdentityTier,
    /// The host PID, if resolved.
    pub host_pid: Option<u32>,
    /// Tier attempts made (each tier tried counts one; probe rounds count
    /// one each).
    pub attempts: u32,
    /// Why the last tier failed ([`FailureCode::NONE`] on success).
    pub failure: FailureCode,
    /// Wall time spent, monotonic.
    pub duration: Duration,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        Telemetry {
            tier: IdentityTier::None,
            host_pid: None,
            attempts: 0,
            failure: FailureCode::NONE,
            duration: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_named() {
        let mut seen = std::collections::HashSet::new();
        for c in FailureCode::ALL {
            assert!(seen.insert(c.0), "duplicate code {}", c.0);
            assert_ne!(c.name(), "UNKNOWN");
        }
        assert_eq!(FailureCode(9999).name(), "UNKNOWN");
        assert_eq!(
            FailureCode::PROBE_AMBIGUOUS.to_string(),
            "PROBE_AMBIGUOUS (304)"
        );
        assert_eq!(tier_name(IdentityTier::Broker), "broker");
        for t in DEFAULT_ORDER {
            assert_eq!(parse_tier(tier_name(t)), Some(t));
        }
        assert_eq!(parse_tier("none"), None);
    }
}
