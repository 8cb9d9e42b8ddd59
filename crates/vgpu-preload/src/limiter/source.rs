//! The limiter's settings from the process's limits source
//! (`limits_source`: the operator's limits file, lowered but never raised
//! by the environment; without a file, the environment lowered by the
//! region's display copy; an unusable file fails closed there), plus the
//! policy, priority, suspend, the node side's priority hold, and the SM
//! ceiling and lending board (the limits file only: lending needs the
//! operator's board, which the environment cannot name).
use vgpu_limiter::{Policy, Priority, Settings};
use vgpu_region::limits;

use crate::attach::Proc;
use crate::config::UtilPolicy;
use crate::limits_source::Snapshot;

fn file_policy(p: limits::Policy) -> Policy {
    match p {
        limits::Policy::Default => Policy::Default,
        limits::Policy::Force => Policy::Force,
        limits::Policy::Disable => Policy::Disable,
    }
}

fn env_policy(p: UtilPolicy) -> Policy {
    match p {
        UtilPolicy::Default => Policy::Default,
        UtilPolicy::Force => Policy::Force,
        UtilPolicy::Disable => Policy::Disable,
    }
}

/// The settings of CUDA ordinal `ord` (region device `idx`, UUID `uuid`)
/// under the snapshot `s` (`None`: not loaded, the environment alone).
pub fn settings(
    p: &Proc,
    s: Option<&Snapshot>,
    ord: u32,
    idx: Option<u32>,
    uuid: &str,
) -> Settings {
    let Some(s) = s else {
        let sm = p.cfg.sm_limit(ord);
        return Settings {
            sm_limit: (sm != 0 && sm < 100).then_some(sm),
            policy: env_policy(p.cfg.util_policy),
            priority: Priority(p.cfg.priority),
            ..Settings::default()
        };
    };
    let region = p.ledger.as_ref().and_then(|l| {
        idx.filter(|_| l.private_cause.is_none())
            .map(|i| l.display_limit(i))
    });
    Settings {
        sm_limit: s.device(Some(ord), uuid, region).sm,
        policy: file_policy(s.policy()),
        priority: Priority(s.priority()),
        suspended: s.suspended(),
        // Applies to a low-priority container only (`vgpu_limiter::target`).
        hold: s.file.as_ref().and_then(|f| f.hold),
        // The ceiling lends only with a board (`super::lend`).
        sm_ceiling: s.file.as_ref().and_then(|f| f.ceiling_for(uuid)),
    }
}

/// The lending board of this process's limits (`board <dir> <name>` in
/// the limits file; never from the environment).
pub fn board(s: Option<&Snapshot>) -> Option<&vgpu_region::limits::BoardRef> {
    s?.file.as_ref()?.board.as_ref()
}
