//! The NVML probe's driver: `vgpu_identity::probe::ProbeDriver` over
//! [`CudaDriver`] and [`NvmlDriver`] (the real ones in the library, fakes
//! in tests).
//!
//! Device numbering: the probe is given a CUDA ordinal (what the process's
//! context is for). NVML numbers devices physically and ignores
//! `CUDA_VISIBLE_DEVICES`, so the NVML handle is found by the device's UUID;
//! only when the UUID is unavailable is the ordinal used as the NVML index.
use std::ffi::CString;

use vgpu_cuda_abi::{nvmlDevice_t, nvmlReturn_t};
use vgpu_identity::probe::{DriverCall, DriverError, ProbeDriver};

use crate::driver::api::Fn;
use crate::driver::{self, CudaDriver, NvmlDriver};

/// CUDA and NVML calls for one probe (NVML initialised for its lifetime).
pub struct Probe<'a> {
    cuda: &'a dyn CudaDriver,
    nvml: &'a dyn NvmlDriver,
    /// (CUDA ordinal, NVML handle) of the last lookup.
    cached: Option<(u32, nvmlDevice_t)>,
}

/// The probe over `cuda` and `nvml` (the real drivers in the library);
/// `None` when an entry it needs is missing or NVML does not initialise:
/// the probe tier is then not available.
pub fn over<'a>(cuda: &'a dyn CudaDriver, nvml: &'a dyn NvmlDriver) -> Option<Probe<'a>> {
    let have = cuda.has(Fn::cuDevicePrimaryCtxRetain)
        && cuda.has(Fn::cuDevicePrimaryCtxRelease_v2)
        && cuda.has(Fn::cuDeviceGet)
        && (nvml.has(Fn::nvmlDeviceGetComputeRunningProcesses_v3)
            || nvml.has(Fn::nvmlDeviceGetComputeRunningProcesses_v2)
            || nvml.has(Fn::nvmlDeviceGetComputeRunningProcesses));
    if !have {
        return None;
    }
    Probe::new(cuda, nvml)
}

impl<'a> Probe<'a> {
    /// Initialises NVML (balanced by drop); `None` when it does not.
    pub fn new(cuda: &'a dyn CudaDriver, nvml: &'a dyn NvmlDriver) -> Option<Probe<'a>> {
        nvml.init().is_success().then_some(Probe {
            cuda,
            nvml,
            cached: None,
        })
    }

    fn nvml_handle(&mut self, ordinal: u32) -> Result<nvmlDevice_t, DriverError> {
        if let Some((o, h)) = self.cached {
            if o == ordinal {
                return Ok(h);
            }
        }
        let err = |r: nvmlReturn_t| DriverError {
            call: DriverCall::NvmlPids,
            code: r.0 as i32,
        };
        let h = match driver::ordinal_uuid(self.cuda, ordinal) {
            Some(u) => {
                let c =
                    CString::new(u).map_err(|_| err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT))?;
                self.nvml.device_by_uuid(&c)
            }
            None => self.nvml.device_by_index(ordinal),
        }
        .map_err(err)?;
        self.cached = Some((ordinal, h));
        Ok(h)
    }

    fn cuda_device(&self, ordinal: u32, call: DriverCall) -> Result<i32, DriverError> {
        self.cuda.device_get(ordinal).map_err(|r| DriverError {
            call,
            code: r.0 as i32,
        })
    }
}

impl ProbeDriver for Probe<'_> {
    fn nvml_pids(&mut self, device: u32) -> Result<Vec<u32>, DriverError> {
        let h = self.nvml_handle(device)?;
        self.nvml
            .running_processes(h)
            .map(|v| v.iter().map(|p| p.pid).collect())
            .map_err(|r| DriverError {
                call: DriverCall::NvmlPids,
                code: r.0 as i32,
            })
    }

    fn retain_primary(&mut self, device: u32) -> Result<(), DriverError> {
        let d = self.cuda_device(device, DriverCall::RetainPrimary)?;
        self.cuda
            .primary_retain(d)
            .map(|_| ())
            .map_err(|r| DriverError {
                call: DriverCall::RetainPrimary,
                code: r.0 as i32,
            })
    }

    fn release_primary(&mut self, device: u32) -> Result<(), DriverError> {
        let d = self.cuda_device(device, DriverCall::ReleasePrimary)?;
        driver::cu_ok(self.cuda.primary_release(d)).map_err(|r| DriverError {
            call: DriverCall::ReleasePrimary,
            code: r.0 as i32,
        })
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        // Balances the init of `new`.
        let _ = self.nvml.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fake::{FakeCuda, FakeNvml};
    use crate::driver::ProcessInfo;

    #[test]
    fn probe_finds_the_nvml_device_by_uuid_and_balances_init() {
        let cuda = FakeCuda::new(2, 1 << 30);
        let uuid1 = crate::driver::ordinal_uuid(&cuda, 1).unwrap();
        let nvml = FakeNvml::new(&["GPU-other", &uuid1], 1 << 30);
        nvml.processes.lock().unwrap()[1] = vec![ProcessInfo {
            pid: 4242,
            used_gpu_memory: 0,
        }];
        {
            let mut p = Probe::new(&cuda, &nvml).unwrap();
            // CUDA ordinal 1 is NVML index 1 here, found by its UUID.
            assert_eq!(p.nvml_pids(1).unwrap(), vec![4242]);
            assert!(p.nvml_pids(0).is_err(), "ordinal 0's UUID is not in NVML");
            p.retain_primary(1).unwrap();
            assert_eq!(cuda.state().primary[&1], 1);
            p.release_primary(1).unwrap();
            assert_eq!(cuda.state().primary[&1], 0);
            assert!(p.release_primary(1).is_err(), "nothing left to release");
        }
        assert_eq!(nvml.count("nvmlInit_v2"), 1);
        assert_eq!(nvml.count("nvmlShutdown"), 1);
    }

    #[test]
    fn probe_needs_every_entry_it_calls_and_one_process_list() {
        let cuda = FakeCuda::new(1, 1 << 30);
        let nvml = FakeNvml::new(&["GPU-x"], 1 << 30);
        assert!(over(&cuda, &nvml).is_some());
        assert_eq!(nvml.count("nvmlInit_v2"), 1, "a usable probe inits NVML");
        // Any one of the three process lists will do.
        *nvml.missing.lock().unwrap() = vec![
            Fn::nvmlDeviceGetComputeRunningProcesses_v3,
            Fn::nvmlDeviceGetComputeRunningProcesses_v2,
        ];
        assert!(over(&cuda, &nvml).is_some());
        nvml.missing
            .lock()
            .unwrap()
            .push(Fn::nvmlDeviceGetComputeRunningProcesses);
        assert!(over(&cuda, &nvml).is_none(), "no process list at all");
        nvml.missing.lock().unwrap().clear();
        cuda.state().missing = vec![Fn::cuDevicePrimaryCtxRelease_v2];
        assert!(over(&cuda, &nvml).is_none(), "a retain it cannot release");
        // Refused before NVML was touched: inits stay balanced.
        assert_eq!(nvml.count("nvmlInit_v2"), 2);
        assert_eq!(nvml.count("nvmlShutdown"), 2);
    }
}
