//! NVML's view: device count, handles and indices consistent with
//! `CUDA_VISIBLE_DEVICES` (NVML index i is CUDA ordinal i), and memory info
//! consistent with `cuMemGetInfo`.
//!
//! The device map is computed without any lock held (NVML calls can be
//! slow, and a `fork` while a lock is held across one would leave the
//! child waiting forever): it is built once in a [`process::PerImage`]
//! cell, whose claim a forked child does not wait for (the parent's
//! building thread is gone there); a racing thread waits for the builder.
use std::ffi::c_uint;

use vgpu_cuda_abi::{nvmlDevice_t, nvmlReturn_t};

use super::visible;
use crate::attach;
use crate::config;
use crate::driver::NvmlDriver;
use crate::ledger::View;
use crate::limits_source;
use crate::process;
use crate::views::procs::{members, Member};

/// Physical NVML devices in CUDA ordinal order: (NVML index, handle).
pub type DeviceMap = [(u32, usize)];

/// A lazily computed, published-once device map. A forked child keeps it
/// (NVML's handles and order are the parent's memory and stay true there).
pub struct VisibleMap(process::PerImage<Vec<(u32, usize)>>);

impl VisibleMap {
    pub const fn new() -> VisibleMap {
        VisibleMap(process::PerImage::inherited())
    }

    /// The map for `visible` (`CUDA_VISIBLE_DEVICES`), or `None` when the
    /// variable is unset (NVML's own numbering applies) or NVML cannot be
    /// asked yet (not initialized: computed again next time).
    pub fn get(&self, nvml: &dyn NvmlDriver, visible: Option<&str>) -> Option<&'static DeviceMap> {
        let var = visible?;
        self.0
            .get_or_build(|| compute(nvml, var))
            .map(Vec::as_slice)
    }
}

impl Default for VisibleMap {
    fn default() -> Self {
        Self::new()
    }
}

fn compute(nvml: &dyn NvmlDriver, var: &str) -> Option<Vec<(u32, usize)>> {
    let n = nvml.device_count().ok()?;
    let mut handles = Vec::new();
    let mut uuids = Vec::new();
    for i in 0..n {
        let h = nvml.device_by_index(i).ok()?;
        uuids.push(nvml.device_uuid(h).unwrap_or_default());
        handles.push(h.0 as usize);
    }
    Some(
        visible::resolve(Some(var), &uuids)
            .into_iter()
            .map(|i| (i, handles[i as usize]))
            .collect(),
    )
}

/// The NVML view of this process: the driver, `CUDA_VISIBLE_DEVICES` and
/// the device map.
pub struct NvmlView<'a> {
    pub nvml: &'a dyn NvmlDriver,
    pub visible: Option<&'a str>,
    pub map: &'a VisibleMap,
}

static MAP: VisibleMap = VisibleMap::new();

impl NvmlView<'static> {
    /// The process's view over the real NVML.
    pub fn real() -> NvmlView<'static> {
        NvmlView {
            nvml: &crate::driver::REAL_NVML,
            visible: config::process_config().visible.as_deref(),
            map: &MAP,
        }
    }
}

impl NvmlView<'_> {
    fn devices(&self) -> Option<&'static DeviceMap> {
        self.map.get(self.nvml, self.visible)
    }

    /// After a successful `nvmlDeviceGetCount(_v2)`: the count to report
    /// (`None`: NVML's own stands).
    pub fn count(&self) -> Option<c_uint> {
        self.devices().map(|m| m.len() as c_uint)
    }

    /// `nvmlDeviceGetHandleByIndex(_v2)`: the physical index to ask NVML
    /// for, or the error when CUDA ordinal `index` does not exist.
    pub fn handle_index(&self, index: c_uint) -> Result<c_uint, nvmlReturn_t> {
        match self.devices() {
            None => Ok(index),
            Some(m) => m
                .get(index as usize)
                .map(|&(phys, _)| phys)
                .ok_or(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    /// After a successful `nvmlDeviceGetIndex`: the index to report, or the
    /// error when the device is not visible (`None`: NVML's own stands).
    pub fn device_index(&self, dev: nvmlDevice_t) -> Option<Result<c_uint, nvmlReturn_t>> {
        self.visible?;
        Some(
            self.devices()
                .and_then(|m| m.iter().position(|&(_, h)| h == dev.0 as usize))
                .map(|i| i as c_uint)
                .ok_or(nvmlReturn_t::NVML_ERROR_NOT_FOUND),
        )
    }

    /// The CUDA ordinal of an NVML handle (its NVML index when no mapping
    /// applies).
    pub fn ordinal_of(&self, dev: nvmlDevice_t) -> Option<u32> {
        if let Some(m) = self.devices() {
            return m
                .iter()
                .position(|&(_, h)| h == dev.0 as usize)
                .map(|i| i as u32);
        }
        self.nvml.device_index(dev).ok()
    }

    /// After a successful `nvmlDeviceGetMemoryInfo(_v2)` that reported
    /// (`free`, `total`): the virtual (free, total), or `None` without a
    /// limit. `budget` gives (limit, container usage) of a CUDA ordinal and
    /// its device's UUID.
    pub fn memory(
        &self,
        dev: nvmlDevice_t,
        free: u64,
        total: u64,
        budget: impl Fn(u32, &str) -> (Option<u64>, u64),
    ) -> Option<(u64, u64)> {
        let ord = self.ordinal_of(dev)?;
        let uuid = self.nvml.device_uuid(dev).unwrap_or_default();
        let (limit, used) = budget(ord, &uuid);
        limit.map(|l| super::view(Some(l), used, free, total))
    }
}

/// (limit, container usage) of CUDA ordinal `ord`; `None` = no limit. An
/// attached process asks its own ledger; a process that only asks NVML
/// (nvidia-smi, a monitor) reads the region without claiming a slot, with
/// the limits from the limits source (the file, else the environment
/// lowered by the region's copy: never the region alone); before the
/// region exists (its first CUDA process creates it when it attaches)
/// those limits apply with nothing in use.
pub fn budget(ord: u32, uuid: &str) -> (Option<u64>, u64) {
    if let Some(p) = attach::attached() {
        return (p.mem_limit(ord), p.used(ord));
    }
    let cfg = config::process_config();
    let v = nvml_only_view();
    let limits = match (limits_source::snapshot(), v) {
        (Some(_), Some(view)) => {
            // A monitor sees `vgpu limit` changes as the processes do.
            limits_source::refresh_if_changed(u64::from(view.region().limits_generation()));
            limits_source::snapshot()
        }
        (s, _) => s,
    }
    .unwrap_or_else(|| limits_source::SOURCE.load(cfg));
    match v {
        // The region's device of this UUID (the region's order may not be
        // this process's); a region without UUIDs: by index.
        Some(view) => match view.device_index(uuid).or_else(|| {
            (ord < view.device_count() && view.device_uuid(ord).is_empty()).then_some(ord)
        }) {
            Some(d) => (
                limits
                    .device(Some(ord), uuid, Some(view.display_limit(d)))
                    .memory,
                view.used(d),
            ),
            None => (None, 0),
        },
        None => (limits.device(Some(ord), uuid, None).memory, 0),
    }
}

/// The read-only look at the region of a process that only asks NVML
/// (opened once; a forked child keeps the mapping), `None` without one.
fn nvml_only_view() -> Option<&'static View> {
    static VIEW: process::PerImage<View> = process::PerImage::inherited();
    if let Some(v) = VIEW.get() {
        return Some(v);
    }
    let cfg = config::process_config();
    if !cfg.cache.exists() {
        return None;
    }
    VIEW.get_or_build(|| match View::open(&cfg.cache) {
        Ok(view) => Some(view),
        Err(e) => {
            crate::debug!("NVML view without the region: {}", crate::log::chain(&e));
            None
        }
    })
}

impl NvmlView<'_> {
    /// The container's processes on NVML device `dev` (by its UUID in the
    /// region this process uses: shared, private or read-only), and whether
    /// the memory view there is the budget's; `None` when no region
    /// applies (NVML's own lists stand).
    pub fn container(&self, dev: nvmlDevice_t) -> Option<(Vec<Member>, bool)> {
        let uuid = self.nvml.device_uuid(dev).ok()?;
        let region = match attach::attached() {
            Some(p) => p.ledger.as_ref()?.region(),
            None => nvml_only_view()?.region(),
        };
        let d = region.device_index(&uuid)?;
        let charged = self
            .ordinal_of(dev)
            .is_some_and(|o| budget(o, &uuid).0.is_some());
        Some((members(region, d), charged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fake::FakeNvml;

    const G: u64 = 1 << 30;
    const UUIDS: [&str; 3] = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222"];

    fn view<'a>(nvml: &'a FakeNvml, visible: Option<&'a str>, map: &'a VisibleMap) -> NvmlView<'a> {
        NvmlView { nvml, visible, map }
    }

    #[test]
    fn without_visible_devices_nvml_numbering_stands() {
        let nvml = FakeNvml::new(&UUIDS, 80 * G);
        let map = VisibleMap::new();
        let v = view(&nvml, None, &map);
        assert_eq!(v.count(), None);
        assert_eq!(v.handle_index(2), Ok(2));
        assert_eq!(v.device_index(FakeNvml::handle(1)), None);
        assert_eq!(v.ordinal_of(FakeNvml::handle(2)), Some(2));
        assert_eq!(nvml.count("nvmlDeviceGetCount_v2"), 0, "no map computed");
    }

    #[test]
    fn visible_devices_reorder_and_hide() {
        let nvml = FakeNvml::new(&UUIDS, 80 * G);
        let map = VisibleMap::new();
        let v = view(&nvml, Some("2,GPU-aaaa"), &map);
        assert_eq!(v.count(), Some(2));
        assert_eq!(v.handle_index(0), Ok(2));
        assert_eq!(v.handle_index(1), Ok(0));
        assert_eq!(
            v.handle_index(2),
            Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)
        );
        assert_eq!(v.device_index(FakeNvml::handle(2)), Some(Ok(0)));
        assert_eq!(
            v.device_index(FakeNvml::handle(1)),
            Some(Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND))
        );
        assert_eq!(v.ordinal_of(FakeNvml::handle(0)), Some(1));
        // Computed once, then served from the published map.
        assert_eq!(nvml.count("nvmlDeviceGetCount_v2"), 1);
    }

    #[test]
    fn an_uninitialized_nvml_is_asked_again_later() {
        let nvml = FakeNvml::new(&UUIDS, 80 * G);
        nvml.uninitialized
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let map = VisibleMap::new();
        let v = view(&nvml, Some("1"), &map);
        assert_eq!(v.count(), None);
        nvml.uninitialized
            .store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(v.count(), Some(1));
    }

    #[test]
    fn memory_view_with_and_without_a_limit() {
        let nvml = FakeNvml::new(&UUIDS, 80 * G);
        let map = VisibleMap::new();
        let v = view(&nvml, Some("1"), &map);
        // CUDA ordinal 0 is physical 1; only it has a budget.
        let budget = |ord: u32, _: &str| {
            if ord == 0 {
                (Some(2 * G), G / 2)
            } else {
                (None, 0)
            }
        };
        assert_eq!(
            v.memory(FakeNvml::handle(1), 80 * G, 80 * G, budget),
            Some((2 * G - G / 2, 2 * G))
        );
        // A device outside CUDA_VISIBLE_DEVICES has no ordinal: untouched.
        assert_eq!(v.memory(FakeNvml::handle(0), 80 * G, 80 * G, budget), None);
        let none = VisibleMap::new();
        let u = view(&nvml, None, &none);
        assert_eq!(u.memory(FakeNvml::handle(1), 80 * G, 80 * G, budget), None);
    }
}
