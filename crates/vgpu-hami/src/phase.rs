//! The pod's bind phase (`hami.io/bind-phase`, `pkg/util/types.go`): the
//! scheduler writes `allocating` at bind, the device plugin `success` once
//! every container got its devices, or `failed`.

use std::fmt;
use std::str::FromStr;

/// One of the three phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindPhase {
    /// Bound by the scheduler; the device plugin has work left.
    Allocating,
    /// Every container's devices were handed out.
    Success,
    /// The device plugin refused the assignment.
    Failed,
}

/// A value that is not one of the phases.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown bind phase {0:?} (expected allocating, success or failed)")]
pub struct PhaseError(pub String);

impl BindPhase {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            BindPhase::Allocating => "allocating",
            BindPhase::Success => "success",
            BindPhase::Failed => "failed",
        }
    }
}

impl fmt::Display for BindPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BindPhase {
    type Err = PhaseError;
    fn from_str(s: &str) -> Result<Self, PhaseError> {
        match s {
            "allocating" => Ok(BindPhase::Allocating),
            "success" => Ok(BindPhase::Success),
            "failed" => Ok(BindPhase::Failed),
            _ => Err(PhaseError(s.to_owned())),
        }
    }
}
