//! Read-only copies of a region for the monitor and tools. Built from
//! atomic loads only: writers never wait, and each counter is read whole
//! (one atomic), though different counters may be from slightly different
//! instants.

use serde::Serialize;

use crate::core::{self, decode};
use crate::layout::{HeaderInfo, RawPacing, RawSlotPacing};
use crate::region::Region;
use crate::sync::Ordering::SeqCst;
use crate::telemetry::*;

/// A region at one moment (give or take concurrent writers).
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The file.
    pub path: String,
    /// Header fields.
    pub header: HeaderInfo,
    /// One past the highest slot ever claimed.
    pub slot_high_water: u32,
    /// Live-limit change counter.
    pub limits_generation: u32,
    /// Devices with limits and totals.
    pub devices: Vec<DeviceSnapshot>,
    /// Claimed slots only.
    pub slots: Vec<SlotSnapshot>,
}

/// One device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSnapshot {
    /// Index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Limits.
    pub limits: Limits,
    /// Sum of the slots' admission totals.
    pub used: u64,
    /// Sums per kind.
    pub context: u64,
    /// Module bytes.
    pub module: u64,
    /// Data bytes.
    pub data: u64,
    /// The SM limiter's container bucket and utilization.
    pub pacing: PacingSnapshot,
}

/// A container bucket (layout version 3's pacing section).
#[derive(Clone, Debug, Serialize)]
pub struct PacingSnapshot {
    /// Credit, GPU-ns (negative: debt).
    pub credit_ns: i64,
    /// CLOCK_MONOTONIC ns of the last refill (0 = never paced).
    pub refill_at_ns: u64,
    /// GPU-ns charged, cumulative.
    pub charged_ns: u64,
    /// GPU-ns measured by markers, cumulative.
    pub measured_ns: u64,
    /// Launches that waited, cumulative.
    pub waits: u64,
    /// Share the last refiller paced with, ppm.
    pub share_ppm: u32,
    /// Limiter state of the last refiller (name or "code N").
    pub mode: String,
    /// Measurement correction, ppm (0 = none yet).
    pub correction_ppm: u32,
    /// Container utilization, ppm of the device's time.
    pub util_ppm: u32,
    /// What measured it (name or "code N").
    pub util_source: String,
    /// When, CLOCK_MONOTONIC ns (0 = never).
    pub util_at_ns: u64,
    /// Over what window, ns.
    pub util_window_ns: u64,
    /// Slot holding the sampler lease, and its expiry (CLOCK_MONOTONIC ms).
    pub sampler: Option<(u32, u64)>,
}

/// A slot's limiter record.
#[derive(Clone, Debug, Serialize)]
pub struct SlotLimiterSnapshot {
    /// State name (or "code N").
    pub state: String,
    /// Degraded reason name (or "code N").
    pub reason: String,
    /// CLOCK_MONOTONIC ns of the last state change.
    pub since_ns: u64,
    /// Per-device counters (configured devices).
    pub devices: Vec<SlotLimiterDevice>,
}

/// A slot's limiter counters on one device.
#[derive(Clone, Debug, Serialize)]
pub struct SlotLimiterDevice {
    /// Device index.
    pub index: u32,
    /// GPU-ns measured by this process's markers.
    pub measured_ns: u64,
    /// Launches through the gate.
    pub launches: u64,
    /// Time waited at the gate, ns.
    pub waited_ns: u64,
    /// Current per-launch estimate, GPU-ns.
    pub estimate_ns: u64,
}

/// One claimed slot.
#[derive(Clone, Debug, Serialize)]
pub struct SlotSnapshot {
    /// Slot index.
    pub index: u32,
    /// "live" or "reclaiming".
    pub state: &'static str,
    /// PID in the owner's namespace.
    pub pid: u32,
    /// PID-namespace inode of the owner (0 = unknown).
    pub pid_ns: u64,
    /// Process start time, clock ticks since boot.
    pub start_time: u64,
    /// Host PID (0 = unknown).
    pub host_pid: u32,
    /// CLOCK_MONOTONIC ns of the claim.
    pub claimed_ns: u64,
    /// Identity.
    pub identity: IdentitySnapshot,
    /// Suspend/run status.
    pub run_status: String,
    /// Phase name → CLOCK_MONOTONIC ns, for phases reached.
    pub phases: Vec<(&'static str, u64)>,
    /// Fallback name → count, non-zero only.
    pub fallbacks: Vec<(&'static str, u64)>,
    /// Per-device usage (configured devices).
    pub devices: Vec<SlotDeviceSnapshot>,
    /// The SM limiter's record.
    pub limiter: SlotLimiterSnapshot,
}

/// Identity cells of a slot.
#[derive(Clone, Debug, Serialize)]
pub struct IdentitySnapshot {
    /// Tier name (or "code N").
    pub tier: String,
    /// State name (or "code N").
    pub state: String,
    /// Attempts.
    pub attempts: u32,
    /// Last failure code.
    pub failure: u32,
    /// Duration, ns.
    pub duration_ns: u64,
}

/// A slot's use of one device.
#[derive(Clone, Debug, Serialize)]
pub struct SlotDeviceSnapshot {
    /// Device index.
    pub index: u32,
    /// Counters.
    pub usage: Usage,
    /// Monitor memory sample.
    pub monitor_mem: u64,
    /// Monitor SM utilization sample.
    pub monitor_sm_util: u32,
}

fn name_or_code<T>(
    code: u32,
    f: impl Fn(u32) -> Option<T>,
    name: impl Fn(T) -> &'static str,
) -> String {
    f(code).map_or_else(|| format!("code {code}"), |v| name(v).to_owned())
}

fn pacing_of(p: &RawPacing) -> PacingSnapshot {
    PacingSnapshot {
        credit_ns: p.credit_ns.load(SeqCst),
        refill_at_ns: p.refill_at_ns.load(SeqCst),
        charged_ns: p.charged_ns.load(SeqCst),
        measured_ns: p.measured_ns.load(SeqCst),
        waits: p.waits.load(SeqCst),
        share_ppm: p.share_ppm.load(SeqCst),
        mode: name_or_code(
            p.mode.load(SeqCst),
            LimiterState::from_code,
            LimiterState::name,
        ),
        correction_ppm: p.correction_ppm.load(SeqCst),
        util_ppm: p.util_ppm.load(SeqCst),
        util_source: name_or_code(
            p.util_source.load(SeqCst),
            UtilSource::from_code,
            UtilSource::name,
        ),
        util_at_ns: p.util_at_ns.load(SeqCst),
        util_window_ns: p.util_window_ns.load(SeqCst),
        sampler: crate::pacing::lease_holder(p.sampler_lease.load(SeqCst)),
    }
}

fn limiter_of(p: Option<&RawSlotPacing>, ndev: u32) -> SlotLimiterSnapshot {
    let Some(p) = p else {
        return SlotLimiterSnapshot {
            state: LimiterState::NotStarted.name().into(),
            reason: DegradedReason::None.name().into(),
            since_ns: 0,
            devices: Vec::new(),
        };
    };
    SlotLimiterSnapshot {
        state: name_or_code(
            p.state.load(SeqCst),
            LimiterState::from_code,
            LimiterState::name,
        ),
        reason: name_or_code(
            p.reason.load(SeqCst),
            DegradedReason::from_code,
            DegradedReason::name,
        ),
        since_ns: p.state_since_ns.load(SeqCst),
        devices: p
            .devices
            .iter()
            .take(ndev as usize)
            .enumerate()
            .map(|(i, d)| SlotLimiterDevice {
                index: i as u32,
                measured_ns: d.measured_ns.load(SeqCst),
                launches: d.launches.load(SeqCst),
                waited_ns: d.waited_ns.load(SeqCst),
                estimate_ns: d.estimate_ns.load(SeqCst),
            })
            .collect(),
    }
}

pub(crate) fn take(r: &Region) -> Snapshot {
    let v = r.view();
    let ndev = r.device_count();
    let mut devices: Vec<DeviceSnapshot> = (0..ndev)
        .map(|d| DeviceSnapshot {
            index: d,
            uuid: r.device_uuid(d),
            limits: r.limits(d),
            used: core::device_total(&v, d as usize),
            context: 0,
            module: 0,
            data: 0,
            pacing: pacing_of(&v.pacing[d as usize]),
        })
        .collect();
    let mut slots = Vec::new();
    for (i, (cell, s)) in v.owners.iter().zip(v.slots).enumerate() {
        let w = cell.load(SeqCst);
        if w == core::ST_FREE {
            continue;
        }
        let (st, o) = decode(w);
        let mut sdev = Vec::new();
        for (d, dev) in devices.iter_mut().enumerate() {
            let c = &s.devices[d];
            let usage = Usage::of(
                v.total(d, i).load(SeqCst),
                c.context.load(SeqCst),
                c.module.load(SeqCst),
            );
            dev.context = dev.context.saturating_add(usage.context);
            dev.module = dev.module.saturating_add(usage.module);
            dev.data = dev.data.saturating_add(usage.data);
            sdev.push(SlotDeviceSnapshot {
                index: d as u32,
                usage,
                monitor_mem: c.monitor_mem.load(SeqCst),
                monitor_sm_util: c.monitor_sm_util.load(SeqCst),
            });
        }
        let phases = Phase::ALL
            .iter()
            .map(|p| (p.name(), s.phases[p.code() as usize].load(SeqCst)))
            .filter(|(_, t)| *t != 0)
            .collect();
        let fallbacks = Fallback::ALL
            .iter()
            .map(|f| (f.name(), s.fallbacks[f.code() as usize].load(SeqCst)))
            .filter(|(_, n)| *n != 0)
            .collect();
        let ns_inode = v
            .header
            .ns_table
            .get(o.ns_index as usize)
            .map_or(0, |c| c.load(SeqCst));
        slots.push(SlotSnapshot {
            index: i as u32,
            state: if st == core::ST_LIVE {
                "live"
            } else {
                "reclaiming"
            },
            pid: o.pid,
            pid_ns: if ns_inode == u64::MAX { 0 } else { ns_inode },
            start_time: s.start_time.load(SeqCst),
            host_pid: s.host_pid.load(SeqCst),
            claimed_ns: s.claimed_ns.load(SeqCst),
            identity: IdentitySnapshot {
                tier: name_or_code(
                    s.identity_tier.load(SeqCst),
                    IdentityTier::from_code,
                    IdentityTier::name,
                ),
                state: name_or_code(
                    s.identity_state.load(SeqCst),
                    IdentityState::from_code,
                    IdentityState::name,
                ),
                attempts: s.identity_attempts.load(SeqCst),
                failure: s.identity_failure.load(SeqCst),
                duration_ns: s.identity_ns.load(SeqCst),
            },
            run_status: name_or_code(
                s.run_status.load(SeqCst),
                RunStatus::from_code,
                RunStatus::name,
            ),
            phases,
            fallbacks,
            devices: sdev,
            limiter: limiter_of(v.slot_pacing.get(i), ndev),
        });
    }
    Snapshot {
        path: r.path().display().to_string(),
        header: r.header_info(),
        slot_high_water: v.header.slot_high_water.load(SeqCst),
        limits_generation: v.header.limits_generation.load(SeqCst),
        devices,
        slots,
    }
}
