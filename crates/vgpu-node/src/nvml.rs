//! The driver's view through NVML, loaded at run time (`libnvidia-ml.so.1`,
//! or a named file: tests load the simulated driver's), behind the [`Gpus`]
//! trait so the rest of the agent can run on a fake. The only `unsafe` of
//! the crate (FFI calls) lives here. Never keeps a device handle across an
//! NVML shutdown; serializes calls (one mutex) so the agent's tasks never
//! interleave a query.

use std::ffi::{c_char, c_uint, CStr};
use std::path::Path;
use std::sync::Mutex;

use libloading::Library;
use vgpu_cuda_abi::nvml::*;
use vgpu_cuda_abi::sig;

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Device name (`NVIDIA A100-SXM4-80GB`).
    pub name: String,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// Used memory, bytes.
    pub memory_used: u64,
    /// PCI bus id (`0000:3b:00.0`), for the NUMA node.
    pub bus_id: String,
}

/// A compute process on a GPU, by host PID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Host PID.
    pub pid: u32,
    /// Device memory it holds (`None`: NVML cannot tell).
    pub used_bytes: Option<u64>,
}

/// One utilization sample of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host PID.
    pub pid: u32,
    /// SM utilization, percent.
    pub sm_util: u32,
    /// CPU timestamp of the sample, µs.
    pub timestamp_us: u64,
}

/// An NVML call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded or lacks an entry point.
    #[error("cannot load NVML ({0})")]
    Load(String),
    /// A call returned an error code.
    #[error("{call} returned {code}")]
    Call {
        /// Entry point.
        call: &'static str,
        /// `nvmlReturn_t`.
        code: u32,
    },
}

/// What the agent asks the driver.
pub trait Gpus: Send + Sync {
    /// Every GPU.
    fn devices(&self) -> Result<Vec<GpuInfo>, NvmlError>;
    /// Compute processes on GPU `index`.
    fn processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError>;
    /// Process utilization samples on GPU `index` newer than `since_us`.
    fn process_utilization(
        &self,
        index: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessSample>, NvmlError>;
    /// (GPU %, memory controller %) of GPU `index`.
    fn utilization(&self, index: u32) -> Result<(u32, u32), NvmlError>;
    /// CUDA compute capability (major, minor) of GPU `index`, when the
    /// driver tells it (the DRA slice's attribute).
    fn compute_capability(&self, _index: u32) -> Option<(u32, u32)> {
        None
    }
    /// The driver's version string, when the driver tells it.
    fn driver_version(&self) -> Option<String> {
        None
    }
}

/// The entry points, typed by the workspace's one signature list.
struct Entry {
    init: sig::nvmlInit_v2,
    shutdown: sig::nvmlShutdown,
    count: sig::nvmlDeviceGetCount_v2,
    handle: sig::nvmlDeviceGetHandleByIndex_v2,
    uuid: sig::nvmlDeviceGetUUID,
    name: sig::nvmlDeviceGetName,
    memory: sig::nvmlDeviceGetMemoryInfo,
    pci: sig::nvmlDeviceGetPciInfo_v3,
    procs: sig::nvmlDeviceGetComputeRunningProcesses_v3,
    util: sig::nvmlDeviceGetUtilizationRates,
    putil: sig::nvmlDeviceGetProcessUtilization,
    // Optional: only the DRA slice's attributes use them.
    cc: Option<sig::nvmlDeviceGetCudaComputeCapability>,
    driver_version: Option<sig::nvmlSystemGetDriverVersion>,
}

/// NVML, initialized once for the agent's life.
pub struct Nvml {
    entry: Entry,
    lock: Mutex<()>,
    // Kept last: the entry points above point into it.
    _lib: Library,
}

fn check(call: &'static str, r: nvmlReturn_t) -> Result<(), NvmlError> {
    if r == nvmlReturn_t::NVML_SUCCESS {
        Ok(())
    } else {
        Err(NvmlError::Call { call, code: r.0 })
    }
}

fn c_string(buf: &[c_char]) -> String {
    // SAFETY: `buf` is a local array NVML filled; the slice bound keeps the
    // read inside it even when NVML wrote no terminator (checked below).
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Nvml {
    /// Loads `path` (or `libnvidia-ml.so.1` through the loader) and calls
    /// `nvmlInit_v2`.
    pub fn open(path: Option<&Path>) -> Result<Nvml, NvmlError> {
        let name = path.map_or_else(|| "libnvidia-ml.so.1".into(), |p| p.as_os_str().to_owned());
        // SAFETY: loading NVML runs its constructors, which depend on no
        // state of ours.
        let lib = unsafe { Library::new(&name) }.map_err(|e| NvmlError::Load(e.to_string()))?;
        /// The entry point `name`, typed as the list types it.
        macro_rules! sym {
            ($name:ident) => {
                // SAFETY: `sig::$name` is the C type of the symbol of that
                // name (the list is checked against nvml.h); the library
                // outlives the copy (it is dropped after the entries, see
                // `Nvml`).
                unsafe { lib.get::<sig::$name>(stringify!($name).as_bytes()) }
                    .map(|s| *s)
                    .map_err(|e| NvmlError::Load(e.to_string()))
            };
        }
        // Same C type: v3's nvmlProcessInfo_t is v2's struct.
        let procs = sym!(nvmlDeviceGetComputeRunningProcesses_v3)
            .or_else(|_| sym!(nvmlDeviceGetComputeRunningProcesses_v2))?;
        let entry = Entry {
            init: sym!(nvmlInit_v2)?,
            shutdown: sym!(nvmlShutdown)?,
            count: sym!(nvmlDeviceGetCount_v2)?,
            handle: sym!(nvmlDeviceGetHandleByIndex_v2)?,
            uuid: sym!(nvmlDeviceGetUUID)?,
            name: sym!(nvmlDeviceGetName)?,
            memory: sym!(nvmlDeviceGetMemoryInfo)?,
            pci: sym!(nvmlDeviceGetPciInfo_v3)?,
            procs,
            util: sym!(nvmlDeviceGetUtilizationRates)?,
            putil: sym!(nvmlDeviceGetProcessUtilization)?,
            cc: sym!(nvmlDeviceGetCudaComputeCapability).ok(),
            driver_version: sym!(nvmlSystemGetDriverVersion).ok(),
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        check("nvmlInit_v2", unsafe { (entry.init)() })?;
        Ok(Nvml {
            entry,
            lock: Mutex::new(()),
            _lib: lib,
        })
    }

    fn handle(&self, index: u32) -> Result<nvmlDevice_t, NvmlError> {
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        // SAFETY: out-pointer to a local.
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.entry.handle)(index, &mut h)
        })?;
        Ok(h)
    }

    fn string(
        &self,
        f: sig::nvmlDeviceGetUUID,
        call: &'static str,
        h: nvmlDevice_t,
    ) -> Result<String, NvmlError> {
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        // SAFETY: a local buffer and its true length.
        check(call, unsafe { f(h, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        *buf.last_mut().unwrap_or(&mut 0) = 0;
        Ok(c_string(&buf))
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: paired with the init in `open`; no handle outlives self.
        let _ = unsafe { (self.entry.shutdown)() };
    }
}

impl Gpus for Nvml {
    fn compute_capability(&self, index: u32) -> Option<(u32, u32)> {
        let f = self.entry.cc?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.handle(index).ok()?;
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: out-pointers to locals; `f` has the nvml.h signature.
        let r = unsafe { f(h, &mut major, &mut minor) };
        (r == nvmlReturn_t::NVML_SUCCESS && major > 0).then(|| (major as u32, minor.max(0) as u32))
    }

    fn driver_version(&self) -> Option<String> {
        let f = self.entry.driver_version?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = [0 as c_char; 96];
        // SAFETY: a local buffer and its true length.
        let r = unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) };
        *buf.last_mut().unwrap_or(&mut 0) = 0;
        let v = c_string(&buf);
        (r == nvmlReturn_t::NVML_SUCCESS && !v.is_empty()).then_some(v)
    }

    fn devices(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut n: c_uint = 0;
        // SAFETY: out-pointer to a local.
        check("nvmlDeviceGetCount_v2", unsafe {
            (self.entry.count)(&mut n)
        })?;
        let mut out = Vec::with_capacity(n as usize);
        for index in 0..n {
            let h = self.handle(index)?;
            let uuid = self.string(self.entry.uuid, "nvmlDeviceGetUUID", h)?;
            let name = self.string(self.entry.name, "nvmlDeviceGetName", h)?;
            let mut m = nvmlMemory_t::default();
            // SAFETY: out-pointer to a local.
            check("nvmlDeviceGetMemoryInfo", unsafe {
                (self.entry.memory)(h, &mut m)
            })?;
            // SAFETY: all-zero is a valid nvmlPciInfo_t (integers and char arrays).
            let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: out-pointer to a local.
            let bus_id = if unsafe { (self.entry.pci)(h, &mut pci) } == nvmlReturn_t::NVML_SUCCESS {
                let mut b = pci.busId;
                *b.last_mut().unwrap_or(&mut 0) = 0;
                c_string(&b)
            } else {
                String::new()
            };
            out.push(GpuInfo {
                index,
                uuid,
                name,
                memory_total: m.total,
                memory_used: m.used,
                bus_id,
            });
        }
        Ok(out)
    }

    fn processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.handle(index)?;
        let mut cap: c_uint = 64;
        loop {
            let mut buf = vec![nvmlProcessInfo_t::default(); cap as usize];
            let mut n = cap;
            // SAFETY: a buffer of `n` entries and its length.
            let r = unsafe { (self.entry.procs)(h, &mut n, buf.as_mut_ptr()) };
            if r == nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE && n > cap && cap < 65536 {
                cap = n + 16;
                continue;
            }
            check("nvmlDeviceGetComputeRunningProcesses", r)?;
            buf.truncate(n as usize);
            return Ok(buf
                .into_iter()
                .map(|p| ProcessMemory {
                    pid: p.pid,
                    used_bytes: (p.usedGpuMemory != NVML_VALUE_NOT_AVAILABLE)
                        .then_some(p.usedGpuMemory),
                })
                .collect());
        }
    }

    fn process_utilization(
        &self,
        index: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessSample>, NvmlError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.handle(index)?;
        let mut n: c_uint = 0;
        // SAFETY: a null buffer with count 0 asks for the size.
        let r = unsafe { (self.entry.putil)(h, std::ptr::null_mut(), &mut n, since_us) };
        if r == nvmlReturn_t::NVML_ERROR_NOT_FOUND || (r == nvmlReturn_t::NVML_SUCCESS && n == 0) {
            return Ok(Vec::new());
        }
        if r != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE && r != nvmlReturn_t::NVML_SUCCESS {
            check("nvmlDeviceGetProcessUtilization", r)?;
        }
        let mut buf = vec![nvmlProcessUtilizationSample_t::default(); n as usize + 8];
        let mut m = buf.len() as c_uint;
        // SAFETY: a buffer of `m` entries and its length.
        let r = unsafe { (self.entry.putil)(h, buf.as_mut_ptr(), &mut m, since_us) };
        if r == nvmlReturn_t::NVML_ERROR_NOT_FOUND {
            return Ok(Vec::new());
        }
        check("nvmlDeviceGetProcessUtilization", r)?;
        buf.truncate(m as usize);
        Ok(buf
            .into_iter()
            .map(|s| ProcessSample {
                pid: s.pid,
                sm_util: s.smUtil,
                timestamp_us: s.timeStamp,
            })
            .collect())
    }

    fn utilization(&self, index: u32) -> Result<(u32, u32), NvmlError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.handle(index)?;
        let mut u = nvmlUtilization_t::default();
        // SAFETY: out-pointer to a local.
        check("nvmlDeviceGetUtilizationRates", unsafe {
            (self.entry.util)(h, &mut u)
        })?;
        Ok((u.gpu, u.memory))
    }
}

/// The NUMA node of a PCI device from sysfs; `None` when sysfs does not
/// say (no file, `-1` on a single-node machine, junk): never guessed, since a
/// wrong node changes what the kubelet's topology manager admits.
pub fn numa_node(bus_id: &str) -> Option<i64> {
    numa_node_in(std::path::Path::new("/sys/bus/pci/devices"), bus_id)
}

/// [`numa_node`] under another sysfs devices directory (tests).
pub fn numa_node_in(devices_dir: &Path, bus_id: &str) -> Option<i64> {
    let id = bus_id.to_ascii_lowercase();
    // NVML writes an 8-digit domain (00000000:3B:00.0); sysfs uses 4.
    let id = if id.len() == 16 && id.starts_with("0000") {
        id[4..].to_owned()
    } else {
        id
    };
    if id.is_empty() || id.contains('/') {
        return None;
    }
    std::fs::read_to_string(devices_dir.join(&id).join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0)
}

/// Only for messages: an NVML error code's name.
pub fn error_name(code: u32) -> &'static str {
    match code {
        1 => "UNINITIALIZED",
        2 => "INVALID_ARGUMENT",
        3 => "NOT_SUPPORTED",
        6 => "NOT_FOUND",
        9 => "DRIVER_NOT_LOADED",
        12 => "LIBRARY_NOT_FOUND",
        15 => "GPU_IS_LOST",
        _ => "ERROR",
    }
}

/// A fixed, in-memory set of GPUs (tests, benchmarks, and a node with no
/// driver where the agent must still answer).
#[derive(Default)]
pub struct StaticGpus {
    /// Devices.
    pub devices: Mutex<Vec<GpuInfo>>,
    /// Processes per device index.
    pub processes: Mutex<std::collections::BTreeMap<u32, Vec<ProcessMemory>>>,
    /// Samples per device index.
    pub samples: Mutex<std::collections::BTreeMap<u32, Vec<ProcessSample>>>,
    /// Devices whose queries fail (unhealthy).
    pub failing: Mutex<std::collections::BTreeSet<u32>>,
}

impl StaticGpus {
    fn fail(&self, index: u32) -> Result<(), NvmlError> {
        if self
            .failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&index)
        {
            Err(NvmlError::Call {
                call: "static",
                code: 15,
            })
        } else {
            Ok(())
        }
    }
}

impl Gpus for StaticGpus {
    fn devices(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        Ok(self
            .devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone())
    }
    fn processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        self.fail(index)?;
        Ok(self
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .cloned()
            .unwrap_or_default())
    }
    fn process_utilization(
        &self,
        index: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessSample>, NvmlError> {
        self.fail(index)?;
        Ok(self
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .map(|v| {
                v.iter()
                    .filter(|s| s.timestamp_us > since_us)
                    .copied()
                    .collect()
            })
            .unwrap_or_default())
    }
    fn utilization(&self, index: u32) -> Result<(u32, u32), NvmlError> {
        self.fail(index)?;
        Ok((0, 0))
    }
}

/// Health of one device: its memory query answers.
pub fn healthy(g: &dyn Gpus, index: u32) -> bool {
    g.utilization(index).is_ok()
}

/// `CStr` helper for tests of the loader's error text.
pub fn cstr_lossy(p: &CStr) -> String {
    p.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_from_sysfs_or_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let dev = |id: &str, v: &str| {
            std::fs::create_dir_all(dir.path().join(id)).unwrap();
            std::fs::write(dir.path().join(id).join("numa_node"), v).unwrap();
        };
        dev("0000:3b:00.0", "1\n");
        dev("0000:5e:00.0", "-1\n");
        // NVML's 8-digit domain, upper case.
        assert_eq!(numa_node_in(dir.path(), "00000000:3B:00.0"), Some(1));
        assert_eq!(numa_node_in(dir.path(), "0000:3b:00.0"), Some(1));
        // -1 (no NUMA information), missing, empty: unknown, not 0.
        assert_eq!(numa_node_in(dir.path(), "00000000:5E:00.0"), None);
        assert_eq!(numa_node_in(dir.path(), "00000000:AF:00.0"), None);
        assert_eq!(numa_node_in(dir.path(), ""), None);
    }
}
