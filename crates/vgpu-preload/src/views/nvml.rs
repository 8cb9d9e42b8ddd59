//! NVML's view: device count, handles and indices consistent with
//! `CUDA_VISIBLE_DEVICES` (NVML index i is CUDA ordinal i), and memory info
//! consistent with `cuMemGetInfo`.
//!
//! The device map is computed without any lock held (NVML calls can be
//! slow, and a `fork` while a lock is held across one would leave the
//! child waiting forever) and published with one compare-exchange; a
//! racing thread that loses drops its copy.
use std::ffi::c_uint;
use std::sync::atomic::{AtomicPtr, Ordering};

use vgpu_cuda_abi::{nvmlDevice_t, nvmlReturn_t};

use super::visible;
use crate::attach;
use crate::config;
use crate::driver::NvmlDriver;
use crate::ledger::View;

/// Physical NVML devices in CUDA ordinal order: (NVML index, handle).
pub type DeviceMap = [(u32, usize)];

/// A lazily computed, published-once device map.
pub struct VisibleMap(AtomicPtr<Vec<(u32, usize)>>);

impl VisibleMap {
    pub const fn new() -> VisibleMap {
        VisibleMap(AtomicPtr::new(std::ptr::null_mut()))
    }

    fn loaded(&self) -> Option<&'static DeviceMap> {
        let p = self.0.load(Ordering::Acquire);
        // SAFETY: only ever null or a leaked Box published below, never freed.
        unsafe { p.as_ref() }.map(Vec::as_slice)
    }

    /// The map for `visible` (`CUDA_VISIBLE_DEVICES`), or `None` when the
    /// variable is unset (NVML's own numbering applies) or NVML cannot be
    /// asked yet (not initialized: computed again next time).
    pub fn get(&self, nvml: &dyn NvmlDriver, visible: Option<&str>) -> Option<&'static DeviceMap> {
        let var = visible?;
        if let Some(m) = self.loaded() {
            return Some(m);
        }
        let computed = compute(nvml, var)?;
        let mine = Box::into_raw(Box::new(computed));
        match self.0.compare_exchange(
            std::ptr::null_mut(),
            mine,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `mine` was just leaked and is now published for good.
            Ok(_) => Some(unsafe { &*mine }.as_slice()),
            Err(_) => {
                // SAFETY: `mine` was never published; we still own it.
                drop(unsafe { Box::from_raw(mine) });
                self.loaded()
            }
        }
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
    /// limit. `budget` gives (limit, container usage) of a CUDA ordinal.
    pub fn memory(
        &self,
        dev: nvmlDevice_t,
        free: u64,
        total: u64,
        budget: impl Fn(u32) -> (u64, u64),
    ) -> Option<(u64, u64)> {
        let ord = self.ordinal_of(dev)?;
        let (limit, used) = budget(ord);
        (limit != 0).then(|| super::view(limit, used, free, total))
    }
}

/// (limit, container usage) of CUDA ordinal `ord`; limit 0 = none. An
/// attached process asks its own ledger; a process that only asks NVML
/// (nvidia-smi, a monitor) reads the region without claiming a slot; before
/// the region exists (it is created at the first cuInit) the environment's
/// limit applies with nothing in use.
pub fn budget(ord: u32) -> (u64, u64) {
    if let Some(p) = attach::attached() {
        return (p.mem_limit(ord), p.used(ord));
    }
    static VIEW: AtomicPtr<View> = AtomicPtr::new(std::ptr::null_mut());
    let cfg = config::process_config();
    let mut v = VIEW.load(Ordering::Acquire);
    if v.is_null() && cfg.cache.exists() {
        // Opened without a lock held (a file operation, but a fork may come
        // at any time); a racing thread that loses unmaps its copy.
        match View::open(&cfg.cache) {
            Ok(view) => {
                let mine = Box::into_raw(Box::new(view));
                match VIEW.compare_exchange(
                    std::ptr::null_mut(),
                    mine,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => v = mine,
                    Err(cur) => {
                        // SAFETY: `mine` was never published; we own it.
                        drop(unsafe { Box::from_raw(mine) });
                        v = cur;
                    }
                }
            }
            Err(e) => crate::debug!("NVML view without the region: {}", crate::log::chain(&e)),
        }
    }
    // SAFETY: VIEW only holds null or a leaked, never-freed Box<View>.
    match unsafe { v.as_ref() } {
        Some(view) => (view.mem_limit(ord), view.used(ord)),
        None => (cfg.mem_limit(ord), 0),
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
        let budget = |ord: u32| if ord == 0 { (2 * G, G / 2) } else { (0, 0) };
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
