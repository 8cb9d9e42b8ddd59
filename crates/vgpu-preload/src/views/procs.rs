//! NVML's process and utilization view inside a container: the process
//! lists (`nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses*`)
//! and per-process samples (`nvmlDeviceGetProcessUtilization`) keep only
//! the container's processes (the host PIDs of the region's live slots),
//! with each process's memory as the ledger charges it (context included,
//! so the list sums to the memory view's `used`); the device's utilization
//! rate is the container's processes' share, not the card's.
//!
//! Pure over values (the lists and the container's processes) so the
//! filtering is unit-tested; the hooks in `ffi::nvml` gather the values.
//! Without a region nothing is filtered (NVML's own answers stand).
use vgpu_cuda_abi::{
    nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t, nvmlProcessUtilizationSample_t, nvmlUtilization_t,
};
use vgpu_region::{Region, SlotId};

pub use crate::sys::ProcId;

/// One of the container's processes on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Member {
    /// Its host PID, the one NVML reports (0: not resolved yet).
    pub host_pid: u32,
    /// Its PID in its own namespace, start time (clock ticks since boot)
    /// and PID-namespace inode, as its slot records them: the key when the
    /// host PID is not known.
    pub pid: u32,
    pub start_ticks: u64,
    pub pid_ns: u64,
    /// What the ledger charges it on this device (context included).
    pub bytes: u64,
}

/// The container's processes on region device `dev` of `region`.
pub fn members(region: &Region, dev: u32) -> Vec<Member> {
    region
        .snapshot()
        .slots
        .iter()
        .filter(|s| s.state == "live")
        .map(|s| Member {
            host_pid: s.host_pid,
            pid: s.pid,
            start_ticks: s.start_time,
            pid_ns: s.pid_ns,
            bytes: region.slot(SlotId(s.index)).usage(dev).total,
        })
        .collect()
}

/// Which member NVML's PID `pid` is: by host PID, else (a slot whose host
/// PID is not resolved: no SM limit, so identity never ran) by the PID in
/// its own namespace, the namespace and the start time of the process
/// `pid` names in our procfs (`probe`: `sys::proc_identity`), which
/// together only the same process has.
pub fn member_of<'a>(pid: u32, mine: &'a [Member], probe: &Probe) -> Option<&'a Member> {
    if let Some(m) = mine.iter().find(|m| m.host_pid != 0 && m.host_pid == pid) {
        return Some(m);
    }
    if !mine.iter().any(|m| m.host_pid == 0) {
        return None;
    }
    let id = probe(pid)?;
    mine.iter().find(|m| {
        m.host_pid == 0
            && m.pid == id.inner_pid
            && m.start_ticks != 0
            && m.start_ticks == id.start_ticks
            && m.pid_ns != 0
            && m.pid_ns == id.pid_ns
    })
}

/// Who a PID in our procfs is (`sys::proc_identity`; a fake in tests).
pub type Probe = dyn Fn(u32) -> Option<ProcId>;

/// A process-list entry of any ABI version.
pub trait Entry: Copy + Default {
    fn pid(&self) -> u32;
    fn set_used(&mut self, bytes: u64);
}

impl Entry for nvmlProcessInfo_v1_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

impl Entry for nvmlProcessInfo_v2_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

/// The driver's list `all` reduced to the container's processes; with
/// `charged` (the memory view is the budget's) each shows what the ledger
/// charges it, so the list agrees with the memory info.
pub fn filter<T: Entry>(all: &[T], mine: &[Member], charged: bool, probe: &Probe) -> Vec<T> {
    all.iter()
        .filter_map(|e| {
            let m = member_of(e.pid(), mine, probe)?;
            let mut e = *e;
            if charged {
                e.set_used(m.bytes);
            }
            Some(e)
        })
        .collect()
}

/// Per-process samples of the container's processes only.
pub fn filter_samples(
    all: &[nvmlProcessUtilizationSample_t],
    mine: &[Member],
    probe: &Probe,
) -> Vec<nvmlProcessUtilizationSample_t> {
    all.iter()
        .filter(|s| member_of(s.pid, mine, probe).is_some())
        .copied()
        .collect()
}

/// The container's utilization from recent per-process samples: the
/// latest sample of each of its processes, summed, at most 100 %.
pub fn utilization(
    samples: &[nvmlProcessUtilizationSample_t],
    mine: &[Member],
    probe: &Probe,
) -> nvmlUtilization_t {
    let mut latest: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
    for s in filter_samples(samples, mine, probe) {
        match latest.iter_mut().find(|l| l.pid == s.pid) {
            Some(l) if l.timeStamp < s.timeStamp => *l = s,
            Some(_) => {}
            None => latest.push(s),
        }
    }
    let sum = |f: fn(&nvmlProcessUtilizationSample_t) -> u32| {
        latest
            .iter()
            .map(f)
            .fold(0u32, u32::saturating_add)
            .min(100)
    };
    nvmlUtilization_t {
        gpu: sum(|s| s.smUtil),
        memory: sum(|s| s.memUtil),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, mem: u64) -> nvmlProcessInfo_v2_t {
        nvmlProcessInfo_v2_t {
            pid,
            usedGpuMemory: mem,
            gpuInstanceId: 7,
            computeInstanceId: 8,
        }
    }

    fn s(pid: u32, ts: u64, sm: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            timeStamp: ts,
            smUtil: sm,
            memUtil: sm / 2,
            encUtil: 0,
            decUtil: 0,
        }
    }

    const MINE: [Member; 2] = [
        Member {
            host_pid: 10,
            pid: 10,
            start_ticks: 1,
            pid_ns: 1,
            bytes: 1024,
        },
        Member {
            host_pid: 11,
            pid: 11,
            start_ticks: 2,
            pid_ns: 1,
            bytes: 0,
        },
    ];

    fn none(_: u32) -> Option<ProcId> {
        None
    }

    fn id(start_ticks: u64, pid_ns: u64, inner_pid: u32) -> Option<ProcId> {
        Some(ProcId {
            start_ticks,
            pid_ns,
            inner_pid,
        })
    }

    #[test]
    fn only_the_containers_processes_with_the_ledgers_bytes() {
        let all = [p(10, 768), p(99, 3 << 30), p(11, 5)];
        let got = filter(&all, &MINE, true, &none);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].pid, got[0].usedGpuMemory), (10, 1024));
        assert_eq!(got[0].gpuInstanceId, 7, "other fields kept");
        assert_eq!((got[1].pid, got[1].usedGpuMemory), (11, 0));
        // Unlimited (the physical view): the driver's bytes stand.
        let got = filter(&all, &MINE, false, &none);
        assert_eq!(got[0].usedGpuMemory, 768);
        let v1 = [nvmlProcessInfo_v1_t {
            pid: 99,
            usedGpuMemory: 1,
        }];
        assert!(filter(&v1, &MINE, true, &none).is_empty());
    }

    #[test]
    fn an_unresolved_host_pid_matches_by_start_time_and_namespace() {
        let unresolved = [Member {
            host_pid: 0,
            pid: 1,
            start_ticks: 500,
            pid_ns: 4026531836,
            bytes: 64,
        }];
        let probe = |pid: u32| match pid {
            // The same process, seen through our procfs (pid 1 inside).
            20 => id(500, 4026531836, 1),
            // Started in the same tick, another PID in the namespace.
            24 => id(500, 4026531836, 2),
            // Another namespace; another start time.
            21 => id(500, 4026532000, 1),
            22 => id(501, 4026531836, 1),
            _ => None,
        };
        let all = [p(20, 1), p(21, 1), p(22, 1), p(23, 1), p(24, 1)];
        let got = filter(&all, &unresolved, true, &probe);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].pid, got[0].usedGpuMemory), (20, 64));
        // Resolved members never need the probe.
        let panics = |_: u32| -> Option<ProcId> { panic!("probed") };
        assert_eq!(filter(&all, &MINE, true, &panics).len(), 0);
    }

    #[test]
    fn utilization_is_the_containers_share() {
        let all = [s(99, 5, 99), s(10, 1, 20), s(10, 3, 30), s(11, 2, 90)];
        assert_eq!(filter_samples(&all, &MINE, &none).len(), 3);
        let u = utilization(&all, &MINE, &none);
        // Latest of pid 10 (30) + pid 11 (90), capped.
        assert_eq!(u.gpu, 100);
        let u = utilization(&all, &MINE[..1], &none);
        assert_eq!((u.gpu, u.memory), (30, 15));
        assert_eq!(utilization(&all, &[], &none).gpu, 0, "an idle container");
    }
}
