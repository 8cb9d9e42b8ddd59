//! Where the limiter's settings come from: the operator's limits file
//! (docs/limits.md: `LIBVGPU_LIMITS_FILE` or the default path), lowered
//! but never raised by the environment; without a file, the region's
//! display copy of the creating process's environment, else this
//! process's environment. Re-read by the owned thread when the region's
//! limits generation moves.
//!
//! A file that exists but cannot be read keeps the last good reading (or
//! the environment's limits): never unlimited because of a bad file.
use std::path::PathBuf;

use vgpu_limiter::{Policy, Priority, Settings};
use vgpu_region::limits::{self, DeviceLimit, Limits};

use crate::attach::Proc;
use crate::config::UtilPolicy;

/// One reading of the limits file.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// The file's contents (`None`: no file applies).
    pub file: Option<Limits>,
}

/// The limits file this process must read, if any.
pub fn locate(p: &Proc) -> Option<PathBuf> {
    limits::locate(p.cfg.limits_file.as_deref().map(|x| x.as_os_str())).map(|(f, _)| f)
}

/// Reads the file; `last` is kept (and the failure logged by the caller)
/// when it exists but cannot be used.
pub fn read(p: &Proc, last: &Reading) -> Result<Reading, (Reading, String)> {
    let Some(path) = locate(p) else {
        return Ok(Reading::default());
    };
    match limits::read_limits_file(&path) {
        Ok(l) => Ok(Reading { file: Some(l) }),
        Err(e) if e.is_not_found() => Ok(Reading::default()),
        Err(e) => Err((
            last.clone(),
            format!(
                "limits file {}: {}; keeping the last limits read",
                path.display(),
                crate::log::chain(&e)
            ),
        )),
    }
}

fn policy_of(p: UtilPolicy) -> Policy {
    match p {
        UtilPolicy::Default => Policy::Default,
        UtilPolicy::Force => Policy::Force,
        UtilPolicy::Disable => Policy::Disable,
    }
}

fn file_policy(p: limits::Policy) -> Policy {
    match p {
        limits::Policy::Default => Policy::Default,
        limits::Policy::Force => Policy::Force,
        limits::Policy::Disable => Policy::Disable,
    }
}

/// The settings of device `dev` (UUID `uuid`) under `r`.
pub fn settings(p: &Proc, r: &Reading, dev: u32, uuid: &str) -> Settings {
    let env_sm = p.cfg.sm_limit(dev);
    let env = DeviceLimit {
        memory: None,
        sm: (env_sm != 0 && env_sm < 100).then_some(env_sm),
    };
    let sm = match &r.file {
        Some(f) => limits::effective(Some(f.for_device(uuid)), env).sm,
        None => {
            let region = p.ledger.as_ref().map_or(0, |l| l.sm_limit(dev));
            if region != 0 && region < 100 {
                Some(region)
            } else {
                env.sm
            }
        }
    };
    let file = r.file.as_ref();
    Settings {
        sm_limit: sm,
        policy: file
            .and_then(|f| f.policy)
            .map_or(policy_of(p.cfg.util_policy), file_policy),
        priority: Priority(file.and_then(|f| f.priority).unwrap_or(p.cfg.priority)),
        suspended: file.is_some_and(Limits::is_suspended),
        // The node side's priority hold (applies to a low-priority
        // container only; `vgpu_limiter::target` ignores it otherwise).
        hold: file.and_then(|f| f.hold),
    }
}
