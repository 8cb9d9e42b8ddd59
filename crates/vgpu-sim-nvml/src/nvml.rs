//! NVML's library state (reference-counted init) and the safe halves of
//! its queries.
use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_cuda_abi::nvmlReturn_t;
use vgpu_sim::{log, Machine};

pub type R<T = ()> = Result<T, nvmlReturn_t>;

/// The driver version string NVML reports (an r575 driver, CUDA 12.9).
pub const DRIVER_VERSION: &str = "575.51.03";
pub const CUDA_DRIVER_VERSION: i32 = 12090;

/// Device handles point at this library's own per-device records, as a
/// real NVML's do: stable, comparable, aligned user-space addresses. A
/// bogus one is rejected by address, never dereferenced.
#[repr(C, align(64))]
struct DeviceSlot(u8);

static DEVICE_SLOTS: [DeviceSlot; vgpu_sim::config::MAX_DEVICES] =
    [const { DeviceSlot(0) }; vgpu_sim::config::MAX_DEVICES];

struct Lib {
    refs: u32,
    machine: Option<Arc<Machine>>,
}

static LIB: Mutex<Lib> = Mutex::new(Lib {
    refs: 0,
    machine: None,
});

fn lib() -> MutexGuard<'static, Lib> {
    LIB.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn init() -> R {
    let mut l = lib();
    if l.refs == 0 {
        match Machine::connect(false) {
            Ok(m) => l.machine = Some(Arc::new(m)),
            Err(e) => {
                log::log(log::WARN, &format!("nvmlInit: {}", chain(&e)));
                return Err(nvmlReturn_t::NVML_ERROR_DRIVER_NOT_LOADED);
            }
        }
    }
    l.refs += 1;
    Ok(())
}

pub fn shutdown() -> R {
    let mut l = lib();
    if l.refs == 0 {
        return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }
    l.refs -= 1;
    if l.refs == 0 {
        l.machine = None;
    }
    Ok(())
}

pub fn machine() -> R<Arc<Machine>> {
    lib()
        .machine
        .clone()
        .ok_or(nvmlReturn_t::NVML_ERROR_UNINITIALIZED)
}

pub fn handle(dev: usize) -> u64 {
    &DEVICE_SLOTS[dev] as *const DeviceSlot as u64
}

/// Handle -> (machine, device index).
pub fn device(h: u64) -> R<(Arc<Machine>, usize)> {
    let m = machine()?;
    let base = handle(0);
    let size = std::mem::size_of::<DeviceSlot>() as u64;
    let off = h.wrapping_sub(base);
    let i = (off / size) as usize;
    if h < base || !off.is_multiple_of(size) || i >= m.device_count() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((m, i))
}

pub fn chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}
