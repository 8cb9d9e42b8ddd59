//! Per-slot telemetry vocabulary. Stored as u32/indices in the file; the
//! enums here are the Rust view (values a newer writer may add read back
//! as `Unknown`, never as undefined behaviour).

use serde::Serialize;

macro_rules! coded {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
        pub enum $name { $($(#[$vm])* $v),+ }
        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// The stored code.
            pub fn code(self) -> u32 { match self { $($name::$v => $n),+ } }
            /// From a stored code (`None` for a code this build lacks).
            pub fn from_code(c: u32) -> Option<Self> { match c { $($n => Some($name::$v),)+ _ => None } }
            /// Stable lower-case name (JSON, inspect output).
            pub fn name(self) -> &'static str {
                match self { $($name::$v => stringify!($v)),+ }
            }
        }
    };
}

coded!(
    /// Steps of the interposer's `cuInit` (architecture.md), timestamped in
    /// CLOCK_MONOTONIC ns.
    Phase {
        /// First entry of the library into any hook.
        LoaderReady = 0,
        /// `cuInit` wrapper entered.
        WrapperEnter = 1,
        /// Region mapped.
        RegionMapped = 2,
        /// Slot claimed.
        SlotClaimed = 3,
        /// Real `cuInit` called.
        RealInitEnter = 4,
        /// Real `cuInit` returned.
        RealInitExit = 5,
        /// Identity started (0 when it ran off the path).
        IdentityEnter = 6,
        /// Identity finished.
        IdentityExit = 7,
        /// Post-init work done.
        PostInitExit = 8,
        /// Wrapper returns.
        WrapperExit = 9,
    }
);

coded!(
    /// Which host-PID tier produced `host_pid` (docs/design.md section 6).
    IdentityTier {
        /// None yet.
        None = 0,
        /// Broker socket.
        Broker = 1,
        /// Trusted host procfs.
        HostProcfs = 2,
        /// NVML probe.
        NvmlProbe = 3,
        /// The process already runs in the host PID namespace.
        SameNamespace = 4,
    }
);

coded!(
    /// Where identity stands.
    IdentityState {
        /// Not started (not needed yet).
        NotStarted = 0,
        /// Running or scheduled for retry.
        Pending = 1,
        /// Host PID known.
        Resolved = 2,
        /// Every tier failed so far (retried; see attempts/failure).
        Failed = 3,
        /// Not needed (no SM limit, no monitor join).
        NotNeeded = 4,
    }
);

coded!(
    /// Degraded paths the interposer took, counted per slot.
    Fallback {
        /// A setting was missing or bad; a default was used.
        BadSetting = 0,
        /// The region could not be opened; running without one.
        RegionUnavailable = 1,
        /// No slot could be claimed.
        SlotUnavailable = 2,
        /// An identity tier failed and the next was tried.
        IdentityTierFailed = 3,
        /// A release larger than the reservation was clamped.
        ReleaseClamped = 4,
        /// The real driver lacked a symbol; a fallback was used.
        MissingSymbol = 5,
        /// Anything else.
        Other = 6,
    }
);

coded!(
    /// Suspend/run status of a slot's process (set by its owner or by a
    /// monitor request).
    RunStatus {
        /// Running normally.
        Running = 0,
        /// Asked to suspend.
        SuspendRequested = 1,
        /// Suspended.
        Suspended = 2,
        /// Asked to resume.
        ResumeRequested = 3,
    }
);

coded!(
    /// Where a process's SM limiter stands (per slot; the container bucket
    /// shows the last writer's). docs/limiter.md describes each.
    LimiterState {
        /// Not decided yet (no launch seen, or no limiter in this build).
        NotStarted = 0,
        /// No SM limit applies: launches pass; utilization is still measured.
        Unlimited = 1,
        /// Paced, with the full measurement (markers corrected by NVML's
        /// per-process time).
        Active = 2,
        /// Paced, host PID unknown: markers only (a wider band, never above
        /// the limit by more than the band); identity is retried.
        DegradedIdentity = 3,
        /// Paced without markers (the driver refused events): charged by
        /// estimate and host time, a wider band.
        DegradedTiming = 4,
        /// `policy disable`: not paced, utilization still measured.
        Disabled = 5,
        /// Suspended (`vgpu suspend`): new launches wait, queries answer.
        Suspended = 6,
        /// Paced below its limit because a busy high-priority container
        /// holds this low-priority one.
        Held = 7,
    }
);

coded!(
    /// Why a limiter is degraded (0 = it is not).
    DegradedReason {
        /// Not degraded.
        None = 0,
        /// Identity has not resolved yet (retrying).
        IdentityPending = 1,
        /// Every identity tier failed so far (retrying with backoff).
        IdentityFailed = 2,
        /// The driver refused to create or record events.
        NoEvents = 3,
        /// NVML is unavailable or refused per-process samples.
        NvmlUnavailable = 4,
    }
);

coded!(
    /// What a container's utilization figure was measured with.
    UtilSource {
        /// Never measured.
        None = 0,
        /// NVML per-process samples of the container's host PIDs (the
        /// device's own accounting).
        NvmlProcess = 1,
        /// The container's stream markers (host PIDs unknown).
        Markers = 2,
        /// NVML's device-wide utilization: an upper bound (host PIDs
        /// unknown and nothing paced).
        DeviceBound = 3,
    }
);

/// A device's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Memory limit, bytes; 0 = none.
    pub mem: u64,
    /// SM limit, percent; 0 = none.
    pub sm: u32,
}

/// One slot's counters for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Context memory.
    pub context: u64,
    /// Module memory.
    pub module: u64,
    /// Data allocations: the total less context and module (no counter of
    /// its own in the region; see `core::data_of`).
    pub data: u64,
    /// Admission total (≥ the sum of the three).
    pub total: u64,
}

impl Usage {
    /// A slot's usage from its admission total and kind counters.
    pub fn of(total: u64, context: u64, module: u64) -> Usage {
        Usage {
            context,
            module,
            data: crate::core::data_of(total, context, module),
            total,
        }
    }
}

const _: () = {
    assert!(Phase::ALL.len() <= 16);
    assert!(Fallback::ALL.len() <= 8);
};
