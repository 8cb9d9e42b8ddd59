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

/// One of the container's processes on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// The PID NVML reports (the host PID; the slot's own PID while its
    /// host PID is not known yet).
    pub pid: u32,
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
            pid: if s.host_pid != 0 { s.host_pid } else { s.pid },
            bytes: region.slot(SlotId(s.index)).usage(dev).total,
        })
        .collect()
}

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
pub fn filter<T: Entry>(all: &[T], mine: &[Member], charged: bool) -> Vec<T> {
    all.iter()
        .filter_map(|e| {
            let m = mine.iter().find(|m| m.pid == e.pid())?;
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
) -> Vec<nvmlProcessUtilizationSample_t> {
    all.iter()
        .filter(|s| mine.iter().any(|m| m.pid == s.pid))
        .copied()
        .collect()
}

/// The container's utilization from recent per-process samples: the
/// latest sample of each of its processes, summed, at most 100 %.
pub fn utilization(
    samples: &[nvmlProcessUtilizationSample_t],
    mine: &[Member],
) -> nvmlUtilization_t {
    let mut latest: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
    for s in filter_samples(samples, mine) {
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
            pid: 10,
            bytes: 1024,
        },
        Member { pid: 11, bytes: 0 },
    ];

    #[test]
    fn only_the_containers_processes_with_the_ledgers_bytes() {
        let all = [p(10, 768), p(99, 3 << 30), p(11, 5)];
        let got = filter(&all, &MINE, true);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].pid, got[0].usedGpuMemory), (10, 1024));
        assert_eq!(got[0].gpuInstanceId, 7, "other fields kept");
        assert_eq!((got[1].pid, got[1].usedGpuMemory), (11, 0));
        // Unlimited (the physical view): the driver's bytes stand.
        let got = filter(&all, &MINE, false);
        assert_eq!(got[0].usedGpuMemory, 768);
        let v1 = [nvmlProcessInfo_v1_t {
            pid: 99,
            usedGpuMemory: 1,
        }];
        assert!(filter(&v1, &MINE, true).is_empty());
    }

    #[test]
    fn utilization_is_the_containers_share() {
        let all = [s(99, 5, 99), s(10, 1, 20), s(10, 3, 30), s(11, 2, 90)];
        assert_eq!(filter_samples(&all, &MINE).len(), 3);
        let u = utilization(&all, &MINE);
        // Latest of pid 10 (30) + pid 11 (90), capped.
        assert_eq!(u.gpu, 100);
        let u = utilization(&all, &MINE[..1]);
        assert_eq!((u.gpu, u.memory), (30, 15));
        assert_eq!(utilization(&all, &[]).gpu, 0, "an idle container");
    }
}
