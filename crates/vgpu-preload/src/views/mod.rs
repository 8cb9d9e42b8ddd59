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
pub mod procs;
pub mod visible;

/// The virtual (free, total) for a device: total = min(limit, physical),
/// free = total − the container's usage (never below zero, never above
/// the physical free). No limit: the physical values; a zero budget (a
/// process failing closed with nothing to go on) shows a GPU of 0 bytes.
pub fn view(limit: Option<u64>, used: u64, phys_free: u64, phys_total: u64) -> (u64, u64) {
    let Some(limit) = limit else {
        return (phys_free, phys_total);
    };
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
    let limit = p.mem_limit(dev)?;
    // Pools and graph memory may have given memory back unseen: their
    // charges follow first.
    if let Some(m) = Mem::of(p, drv) {
        m.settle_all_pools();
        m.settle_graphs();
    }
    Some(view(Some(limit), p.used(dev), phys_free, phys_total))
}

/// `cuDeviceTotalMem_v2` after the driver answered `phys`: the limit
/// (capped by the physical total), or `None` without one.
pub fn total_mem(p: &Proc, dev: i32, phys: u64) -> Option<u64> {
    p.mem_limit(dev.max(0) as u32).map(|l| l.min(phys))
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
            limits: &crate::limits_source::SOURCE,
        }
    }

    #[test]
    fn view_never_underflows() {
        assert_eq!(view(None, 5, 7, 9), (7, 9));
        assert_eq!(view(Some(0), 0, 7, 9), (0, 0));
        let g2 = Some(2 * G);
        assert_eq!(view(g2, G / 2, 70 * G, 80 * G), (2 * G - G / 2, 2 * G));
        assert_eq!(view(g2, 3 * G, 70 * G, 80 * G), (0, 2 * G));
        assert_eq!(view(Some(100 * G), 0, 70 * G, 80 * G), (70 * G, 80 * G));
        assert_eq!(view(g2, 0, G, 80 * G), (G, 2 * G));
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
    fn views_show_exactly_what_is_enforced() {
        let drv = FakeCuda::new(1, 80 * G);
        // The shared region could not be used but a limit is configured: a
        // private ledger holds it, and the view is that ledger's.
        let dev = |lim| {
            vec![NewDevice {
                uuid: "GPU-a".into(),
                mem_limit: lim,
                sm_limit: 0,
            }]
        };
        let l = Ledger::private(dev(4 * G), vgpu_region::Unusable::Corrupt).unwrap();
        l.reserve(0, DATA, G).unwrap();
        assert!(l.reserve(0, DATA, 3 * G + 1).is_err(), "enforced");
        let p = proc_with(Some(l), &[("CUDA_DEVICE_MEMORY_LIMIT", "4g")], 1);
        assert_eq!(mem_info(&p, &drv, 80 * G, 80 * G), Some((3 * G, 4 * G)));
        assert_eq!(total_mem(&p, 0, 80 * G), Some(4 * G));
        // No ledger (no limit configured anywhere): the driver's answers,
        // even if the environment names a limit nothing enforces.
        let p = proc_with(None, &[("CUDA_DEVICE_MEMORY_LIMIT", "4g")], 1);
        assert_eq!(mem_info(&p, &drv, 80 * G, 80 * G), None);
        assert_eq!(total_mem(&p, 0, 80 * G), None);
        assert_eq!(drv.count("cuCtxGetDevice"), 0);
        // A zero budget (failing closed with nothing to go on): a 0-byte GPU.
        let l = Ledger::private(dev(0), vgpu_region::Unusable::Corrupt).unwrap();
        l.set_budget(crate::ledger::Loc::Shared(0), Some(0));
        assert!(l.reserve(0, DATA, 1).is_err());
        let p = proc_with(Some(l), &[], 1);
        assert_eq!(mem_info(&p, &drv, 80 * G, 80 * G), Some((0, 0)));
        // A limit larger than the device: the device's size.
        let l = Ledger::private(dev(100 * G), vgpu_region::Unusable::Corrupt).unwrap();
        let p = proc_with(Some(l), &[], 1);
        assert_eq!(total_mem(&p, 0, 80 * G), Some(80 * G));
    }
}
