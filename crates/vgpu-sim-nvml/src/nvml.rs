//! NVML's library state (reference-counted init) and the safe halves of
//! its queries.
use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_cuda_abi::nvmlReturn_t;
use vgpu_sim::{log, Machine};

pub type R<T = ()> = Result<T, nvmlReturn_t>;

/// The driver version string NVML reports (an r575 driver, CUDA 12.9).
pub const DRIVER_VERSION: &str = "575.51.03";
pub const CUDA_DRIVER_VERSION: i32 = 12090;

/// Device handles are tagged indices: stable, comparable, and a bogus one
/// is rejected rather than dereferenced.
const HANDLE_TAG: u64 = 0x4e56_4d4c_0000_0000;

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
    HANDLE_TAG | (dev as u64 + 1)
}

/// Handle -> (machine, device index).
pub fn device(h: u64) -> R<(Arc<Machine>, usize)> {
    let m = machine()?;
    if h & 0xffff_ffff_0000_0000 != HANDLE_TAG {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = (h & 0xffff_ffff) as usize;
    if i == 0 || i > m.device_count() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((m, i - 1))
}

pub fn chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}
