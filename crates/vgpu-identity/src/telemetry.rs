//! What identity resolution did, in a shape a shared-memory slot can hold:
//! small stable numeric codes with names, counts and a duration.
use std::time::Duration;

/// Which tier produced (or last tried to produce) the host PID.
///
/// A `u8` newtype so a slot can store it in an atomic; values are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Tier(pub u8);

impl Tier {
    /// Nothing tried yet / no tier configured.
    pub const NONE: Tier = Tier(0);
    /// Host-PID broker over a Unix socket.
    pub const BROKER: Tier = Tier(1);
    /// Trusted host procfs mount.
    pub const PROCFS: Tier = Tier(2);
    /// NVML probe (retain a primary context, diff the process list).
    pub const PROBE: Tier = Tier(3);
    /// The process runs in the initial PID namespace: `getpid()` is the
    /// host PID (same value as `vgpu_region::IdentityTier::SameNamespace`).
    pub const SAME_NAMESPACE: Tier = Tier(4);

    /// Stable lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::NONE => "none",
            Tier::BROKER => "broker",
            Tier::PROCFS => "procfs",
            Tier::PROBE => "probe",
            Tier::SAME_NAMESPACE => "same_namespace",
            _ => "unknown",
        }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Telemetry {
    /// The tier that produced the PID, or the last one tried on failure.
    pub tier: Tier,
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
        assert_eq!(Tier::BROKER.name(), "broker");
    }
}
