//! What the operator asked for and what it means for pacing right now:
//! settings (limit, policy, priority, suspend, hold) in, one `Target` out.
//! Owns the HAMi-compatible names and the rules between them; never reads
//! the environment or a file (the interposer's config does) and never
//! waits.

use vgpu_region::LimiterState;

/// Parts per million of the device's time (1_000_000 = the whole device).
pub const PPM: u32 = 1_000_000;

/// `GPU_CORE_UTILIZATION_POLICY` / the limits file's `policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// The limit applies whenever one is set, a lone tenant too.
    #[default]
    Default,
    /// The same as `Default` in vgpu (HAMi's `force` meant "limit a lone
    /// tenant too", which vgpu's default already does); accepted so HAMi
    /// configurations keep their meaning.
    Force,
    /// No pacing; utilization is still measured and published.
    Disable,
}

impl Policy {
    /// HAMi's spelling (case-insensitive; empty = default).
    pub fn parse(s: &str) -> Option<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "default" => Some(Policy::Default),
            "force" => Some(Policy::Force),
            "disable" => Some(Policy::Disable),
            _ => None,
        }
    }

    /// The name as written.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Default => "default",
            Policy::Force => "force",
            Policy::Disable => "disable",
        }
    }
}

/// `CUDA_TASK_PRIORITY` (HAMi: 0 high, 1 low; anything above 0 is low).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Priority(pub i32);

impl Priority {
    /// High priority: never held for another container.
    pub fn is_high(self) -> bool {
        self.0 <= 0
    }
}

/// Everything that decides a container's pacing on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// SM limit, percent of the device's time (`None`, 0 or ≥ 100: none).
    pub sm_limit: Option<u32>,
    /// Limiter policy.
    pub policy: Policy,
    /// Priority.
    pub priority: Priority,
    /// `vgpu suspend`: launches wait until resumed.
    pub suspended: bool,
    /// A hold from the node side: a busy high-priority container on this
    /// device caps this (low-priority) one at this percent. Ignored for a
    /// high-priority container.
    pub hold: Option<u32>,
    /// SM ceiling, percent: the most it may reach while the GPU's other
    /// containers leave time unused (`None`: the limit is a fixed cap).
    /// Used only with a lending board (`crate::lend`).
    pub sm_ceiling: Option<u32>,
}

impl Settings {
    /// Lends and borrows on a board: a guaranteed container with a ceiling
    /// above its guarantee, or a best-effort one (no limit; paced at what
    /// the guarantees of others leave).
    pub fn elastic(&self) -> bool {
        match share_of_percent(self.sm_limit) {
            Some(g) => self
                .sm_ceiling
                .is_some_and(|c| c.min(100) * (PPM / 100) > g),
            None => true,
        }
    }

    /// (guarantee, ceiling) in ppm, as published on the board: no limit
    /// is a guarantee of 0 (best effort); no ceiling is the guarantee (a
    /// best-effort container's: the whole device).
    pub fn guarantee_and_ceiling(&self) -> (u32, u32) {
        let g = share_of_percent(self.sm_limit).unwrap_or(0);
        let c = match (self.sm_ceiling, g) {
            (Some(c), _) => (c.clamp(1, 100) * (PPM / 100)).max(g),
            (None, 0) => PPM,
            (None, g) => g,
        };
        (g, c)
    }
}

/// How the container's time is being measured (what the law can trust).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measurement {
    /// Markers (stream events) work on this driver.
    pub markers: bool,
    /// The process's host PID is known, so NVML's per-process time can
    /// correct the markers.
    pub identity: bool,
}

/// What the launch gate does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The state to publish (and act on).
    pub state: LimiterState,
    /// Share to pace to, ppm (0 when not paced).
    pub share_ppm: u32,
}

impl Target {
    /// Launches go straight through.
    #[inline]
    pub fn is_pass(&self) -> bool {
        matches!(
            self.state,
            LimiterState::NotStarted | LimiterState::Unlimited | LimiterState::Disabled
        )
    }

    /// Launches wait until resumed.
    #[inline]
    pub fn is_suspended(&self) -> bool {
        self.state == LimiterState::Suspended
    }

    /// Packs into one word (for a process-wide atomic the gate reads with
    /// one load): state code in the high half, share in the low.
    pub fn pack(self) -> u64 {
        ((self.state.code() as u64) << 32) | self.share_ppm as u64
    }

    /// Unpacks; an unknown state code reads as `NotStarted` (pass).
    #[inline]
    pub fn unpack(w: u64) -> Target {
        Target {
            state: LimiterState::from_code((w >> 32) as u32).unwrap_or(LimiterState::NotStarted),
            share_ppm: (w as u32).min(PPM),
        }
    }
}

/// A limit in percent as a share, or `None` for "no limit" (0, ≥ 100).
pub fn share_of_percent(pct: Option<u32>) -> Option<u32> {
    match pct {
        Some(p) if p > 0 && p < 100 => Some(p * (PPM / 100)),
        _ => None,
    }
}

/// The rules, in order: suspended wins (launches wait, whatever the limit);
/// `disable` turns pacing off; the share is the limit, lowered by a hold
/// for a low-priority container (a hold alone paces an unlimited one); no
/// share means unlimited. A paced container whose measurement is partial is
/// still paced, in a degraded state that says why.
pub fn target(s: &Settings, m: Measurement) -> Target {
    target_with(s, m, share_of_percent(s.sm_limit))
}

/// [`target`] with the share to pace at given in ppm (`None`: no limit):
/// what lending (`crate::lend`) computed in place of the fixed limit. The
/// other rules (suspend, disable, a priority hold) apply as they do there.
pub fn target_with(s: &Settings, m: Measurement, limit: Option<u32>) -> Target {
    if s.suspended {
        return Target {
            state: LimiterState::Suspended,
            share_ppm: 0,
        };
    }
    if s.policy == Policy::Disable {
        return Target {
            state: LimiterState::Disabled,
            share_ppm: 0,
        };
    }
    let hold = if s.priority.is_high() {
        None
    } else {
        // A hold of 0 % still lets a launch through now and then (1 %): a
        // held container makes progress and answers, it is not suspended.
        s.hold.map(|h| h.clamp(1, 100) * (PPM / 100))
    };
    let (share, held) = match (limit, hold) {
        (None, None) => {
            return Target {
                state: LimiterState::Unlimited,
                share_ppm: 0,
            }
        }
        (Some(l), None) => (l, false),
        (None, Some(h)) => (h, h < PPM),
        (Some(l), Some(h)) => (l.min(h), h < l),
    };
    if share >= PPM {
        return Target {
            state: LimiterState::Unlimited,
            share_ppm: 0,
        };
    }
    let state = if held {
        LimiterState::Held
    } else if !m.markers {
        LimiterState::DegradedTiming
    } else if !m.identity {
        LimiterState::DegradedIdentity
    } else {
        LimiterState::Active
    };
    Target {
        state,
        share_ppm: share,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: Measurement = Measurement {
        markers: true,
        identity: true,
    };

    fn s(limit: Option<u32>) -> Settings {
        Settings {
            sm_limit: limit,
            ..Settings::default()
        }
    }

    #[test]
    fn limits_policies_and_suspend() {
        assert_eq!(target(&s(Some(30)), FULL).share_ppm, 300_000);
        assert_eq!(target(&s(Some(30)), FULL).state, LimiterState::Active);
        for none in [None, Some(0), Some(100), Some(250)] {
            assert_eq!(target(&s(none), FULL).state, LimiterState::Unlimited);
            assert!(target(&s(none), FULL).is_pass());
        }
        let force = Settings {
            policy: Policy::Force,
            ..s(Some(30))
        };
        assert_eq!(target(&force, FULL), target(&s(Some(30)), FULL));
        let off = Settings {
            policy: Policy::Disable,
            ..s(Some(30))
        };
        assert_eq!(target(&off, FULL).state, LimiterState::Disabled);
        assert!(target(&off, FULL).is_pass());
        let sus = Settings {
            suspended: true,
            ..off
        };
        assert!(
            target(&sus, FULL).is_suspended(),
            "suspend wins over disable"
        );
        assert_eq!(Policy::parse(" FORCE "), Some(Policy::Force));
        assert_eq!(Policy::parse(""), Some(Policy::Default));
        assert_eq!(Policy::parse("sometimes"), None);
    }

    #[test]
    fn holds_apply_to_low_priority_only() {
        let low = |limit, hold| Settings {
            sm_limit: limit,
            priority: Priority(1),
            hold,
            ..Settings::default()
        };
        let t = target(&low(Some(50), Some(20)), FULL);
        assert_eq!((t.state, t.share_ppm), (LimiterState::Held, 200_000));
        // A hold above the limit changes nothing.
        let t = target(&low(Some(50), Some(80)), FULL);
        assert_eq!((t.state, t.share_ppm), (LimiterState::Active, 500_000));
        // An unlimited low-priority container is paced by a hold.
        let t = target(&low(None, Some(10)), FULL);
        assert_eq!((t.state, t.share_ppm), (LimiterState::Held, 100_000));
        let t = target(&low(None, Some(0)), FULL);
        assert_eq!(t.share_ppm, 10_000);
        // High priority: never held.
        let high = Settings {
            priority: Priority(0),
            ..low(Some(50), Some(20))
        };
        assert_eq!(target(&high, FULL).share_ppm, 500_000);
    }

    #[test]
    fn partial_measurement_degrades_but_still_paces() {
        let m = Measurement {
            markers: true,
            identity: false,
        };
        let t = target(&s(Some(30)), m);
        assert_eq!(
            (t.state, t.share_ppm),
            (LimiterState::DegradedIdentity, 300_000)
        );
        let m = Measurement {
            markers: false,
            identity: false,
        };
        assert_eq!(target(&s(Some(30)), m).state, LimiterState::DegradedTiming);
    }

    #[test]
    fn targets_round_trip_one_word() {
        for t in [
            target(&s(Some(30)), FULL),
            target(&s(None), FULL),
            Target {
                state: LimiterState::Suspended,
                share_ppm: 0,
            },
        ] {
            assert_eq!(Target::unpack(t.pack()), t);
        }
        assert_eq!(Target::unpack(u64::MAX).state, LimiterState::NotStarted);
        assert_eq!(Target::unpack(u64::MAX).share_ppm, PPM);
    }
}
