//! The virtual views: what `cuMemGetInfo`, `cuDeviceTotalMem` and NVML
//! report to a process with a budget (a GPU of the budget's size, with the
//! container's usage), and NVML's device numbering after
//! `CUDA_VISIBLE_DEVICES` ([`nvml`]).
//!
//! Pure over values: the attachment, a driver trait and the ledger, so the
//! views are unit-tested over the fakes. Must never show a limit that is
//! not enforced, nor bytes a dead process held (the ledger reclaims first).
use crate::attach::Proc;
use crate::driver::CudaDriver;
use crate::memory::{self, Mem};

pub mod nvml;
pub mod visible;

/// The virtual (free, total) for a device: total = min(limit, physical),
/// free = total − the container's usage (never below zero, never above
/// the physical free). Limit 0: the physical values.
pub fn view(limit: u64, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64) {
    if limit == 0 {
        return (phys_free, phys_total);
    }
    let total = limit.min(phys_total);
    (total.saturating_sub(used).min(phys_free), total)
}

/// `cuMemGetInfo_v2` after the driver answered (`phys_free`,
/// `phys_total`): the virtual (free, total) of the current device, or
/// `None` when it has no limit (the driver's answer stands).
pub fn mem_info(
    p: &Proc,
    drv: &dyn CudaDriver,
    phys_free: u64,
    phys_total: u64,
) -> Option<(u64, u64)> {
    let ndev = p.ndev.load(std::sync::atomic::Ordering::Relaxed);
    let dev = memory::current_dev(ndev, drv);
    let limit = p.mem_limit(dev);
    if limit == 0 {
        return None;
    }
    // Pools may have given memory back unseen: their charges follow first.
    if let Some(m) = Mem::of(p, drv) {
        m.settle_all_pools();
    }
    Some(view(limit, p.used(dev), phys_free, phys_total))
}

/// `cuDeviceTotalMem_v2` after the driver answered `phys`: the limit
/// (capped by the physical total), or `None` without one.
pub fn total_mem(p: &Proc, dev: i32, phys: u64) -> Option<u64> {
    let limit = p.mem_limit(dev.max(0) as u32);
    (limit != 0).then(|| limit.min(phys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    use crate::config::Config;
    use crate::driver::fake::FakeCuda;
    use crate::ledger::{Charges, Ledger, NewDevice, DATA};

    const G: u64 = 1 << 30;

    fn proc_with(ledger: Option<Ledger>, env: &[(&str, &str)], ndev: u32) -> Proc {
        Proc {
            cfg: Config::from_vars(env.iter().copied()),
            ledger,
            pid: 1,
            ndev: AtomicU32::new(ndev),
            charges: Charges::default(),
            sm_limited: false,
        }
    }

    #[test]
    fn view_never_underflows() {
        assert_eq!(view(0, 5, 7, 9), (7, 9));
        assert_eq!(view(2 * G, G / 2, 70 * G, 80 * G), (2 * G - G / 2, 2 * G));
        assert_eq!(view(2 * G, 3 * G, 70 * G, 80 * G), (0, 2 * G));
        assert_eq!(view(100 * G, 0, 70 * G, 80 * G), (70 * G, 80 * G));
        assert_eq!(view(2 * G, 0, G, 80 * G), (G, 2 * G));
    }

    #[test]
    fn views_with_a_region_show_the_budget_and_the_containers_usage() {
        let dir = tempfile::tempdir().unwrap();
        let devs = vec![
            NewDevice {
                uuid: "GPU-a".into(),
                mem_limit: 2 * G,
                sm_limit: 0,
            },
            NewDevice {
                uuid: "GPU-b".into(),
                mem_limit: 0,
                sm_limit: 0,
            },
        ];
        let (l, _) = Ledger::create(&dir.path().join("r"), 8, devs).unwrap();
        l.reserve(0, DATA, G / 2).unwrap();
        let p = proc_with(Some(l), &[], 2);
        let drv = FakeCuda::new(2, 80 * G);
        // Device 0 is current: the budget, minus what the container uses.
        assert_eq!(
            mem_info(&p, &drv, 79 * G, 80 * G),
            Some((2 * G - G / 2, 2 * G))
        );
        assert_eq!(total_mem(&p, 0, 80 * G), Some(2 * G));
        // Device 1 has no limit: the driver's answers stand.
        drv.set_current(1);
        assert_eq!(mem_info(&p, &drv, 79 * G, 80 * G), None);
        assert_eq!(total_mem(&p, 1, 80 * G), None);
    }

    #[test]
    fn views_without_a_region_use_the_environment_or_nothing() {
        let drv = FakeCuda::new(1, 80 * G);
        // A limit but no region (it could not be used): the limit, nothing used.
        let p = proc_with(None, &[("CUDA_DEVICE_MEMORY_LIMIT", "4g")], 1);
        assert_eq!(mem_info(&p, &drv, 80 * G, 80 * G), Some((4 * G, 4 * G)));
        assert_eq!(total_mem(&p, 0, 80 * G), Some(4 * G));
        // No limit anywhere: untouched, and no device query was needed.
        let p = proc_with(None, &[], 1);
        assert_eq!(mem_info(&p, &drv, 80 * G, 80 * G), None);
        assert_eq!(total_mem(&p, 0, 80 * G), None);
        assert_eq!(drv.count("cuCtxGetDevice"), 0);
        // A limit larger than the device: the device's size.
        let p = proc_with(None, &[("CUDA_DEVICE_MEMORY_LIMIT", "100g")], 1);
        assert_eq!(total_mem(&p, 0, 80 * G), Some(80 * G));
    }
}
