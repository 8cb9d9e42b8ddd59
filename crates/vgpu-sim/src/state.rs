//! The shared state file (`$VGPU_SIM_DIR/state`): what a kernel driver would
//! keep for the whole machine. One `#[repr(C)]` layout of plain integers and
//! atomics, mapped `MAP_SHARED` with `MmapRaw` by the daemon and by every
//! process of the simulated driver. Only this module touches raw memory.
//!
//! Writers: the daemon claims and frees process records, and its scheduler
//! thread completes queued launches and appends to the device timelines; a
//! process writes only its own record's counters and launch queue (one
//! producer) and appends to the retain log (slots claimed by `fetch_add`,
//! entries published by a sequence word written last).
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::config::{SimConfig, MAX_DEVICES};

pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUSIM1");
pub const LAYOUT_VERSION: u32 = 5;
pub const MAX_PROCS: usize = 1024;
/// Kernel intervals kept per device (a ring).
pub const KERNEL_RING: usize = 65536;
/// Launch-queue slots per process (the most `kernel.queue_depth` may be).
pub const QUEUE_LEN: usize = 1024;
/// Cold primary-context retains kept (a ring).
pub const RETAIN_RING: usize = 4096;
pub const NAME_LEN: usize = 64;

pub const PROC_FREE: u32 = 0;
pub const PROC_LIVE: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("sim state file {path}: cannot open")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sim state file {path}: cannot map")]
    Map {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sim state file {path}: {problem}")]
    Layout { path: String, problem: String },
}

#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub layout_version: u32,
    pub header_size: u32,
    pub total_size: u64,
    pub device_count: u32,
    pub max_procs: u32,
    pub kernel_ring: u32,
    pub retain_ring: u32,
    pub daemon_pid: u32,
    pub serialize_context_creation: u32,
    pub init_ns: u64,
    pub ctx_create_ns: u64,
    pub ctx_destroy_ns: u64,
    pub primary_retain_cold_ns: u64,
    pub primary_retain_nested_ns: u64,
    pub primary_release_ns: u64,
    pub nvml_snapshot_ns: u64,
    pub kernel_queue_depth: u64,
    pub nvml_window_ns: u64,
    /// How long one context runs before another with pending work gets
    /// the device.
    pub timeslice_ns: u64,
    /// Realtime minus monotonic clock at creation, ns (NVML timestamps are
    /// wall-clock microseconds; the timelines are CLOCK_MONOTONIC).
    pub realtime_offset_ns: i64,
    pub retain_head: AtomicU64,
    /// One past the highest process record ever claimed: scans stop here.
    pub proc_hwm: AtomicU32,
    /// Bumped (and futex-woken) to wake the daemon's scheduler.
    pub doorbell: AtomicU32,
    /// 1 while the scheduler is (about to be) asleep on `doorbell`.
    pub sched_sleeping: AtomicU32,
    /// Per-block time of the kernels of PTX / cubin / fatbin images.
    pub image_block_ns: u64,
}

#[repr(C)]
pub struct DeviceRec {
    pub name: [u8; NAME_LEN],
    pub memory_bytes: u64,
    pub sms: u32,
    pub max_threads_per_sm: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub kernel_head: AtomicU64,
}

/// One kernel's occupancy of a device.
#[repr(C)]
pub struct KernelRec {
    /// Ring index + 1 once the entry is complete.
    pub seq: AtomicU64,
    pub start_ns: AtomicU64,
    pub end_ns: AtomicU64,
    pub host_pid: AtomicU32,
    pub _pad: u32,
}

/// One launched kernel waiting in (or done with) its process's queue.
#[repr(C)]
pub struct QEntry {
    /// The launch's sequence number (1-based) once the entry is written.
    pub seq: AtomicU64,
    pub duration_ns: AtomicU64,
    /// When it was launched: it cannot start earlier.
    pub launch_ns: AtomicU64,
    /// When it completed (written by the scheduler).
    pub done_ns: AtomicU64,
    pub device: AtomicU32,
    pub _pad: u32,
}

/// One process of the simulated driver, keyed by host PID.
#[repr(C)]
pub struct ProcRec {
    pub state: AtomicU32,
    pub host_pid: AtomicU32,
    /// Bumped at every claim so a reader can tell reuse.
    pub generation: AtomicU64,
    pub mem: [AtomicU64; MAX_DEVICES],
    pub contexts: [AtomicU32; MAX_DEVICES],
    /// Launches queued so far (the process writes it; single producer).
    pub q_tail: AtomicU64,
    /// Launches completed so far (the scheduler writes it).
    pub q_done: AtomicU64,
    /// Bumped and futex-woken at every completion; processes wait on it.
    pub q_futex: AtomicU32,
    pub _pad: u32,
    pub queue: [QEntry; QUEUE_LEN],
}

/// One cold primary-context retain, for tests of serialization.
#[repr(C)]
pub struct RetainRec {
    pub seq: AtomicU64,
    pub start_ns: AtomicU64,
    pub end_ns: AtomicU64,
    pub host_pid: AtomicU32,
    pub device: AtomicU32,
}

const fn align(n: usize) -> usize {
    (n + 63) & !63
}
const HEADER_SIZE: usize = align(std::mem::size_of::<Header>());
const DEVICES_OFF: usize = HEADER_SIZE;
const DEVICES_SIZE: usize = align(std::mem::size_of::<DeviceRec>() * MAX_DEVICES);
const PROCS_OFF: usize = DEVICES_OFF + DEVICES_SIZE;
const PROCS_SIZE: usize = align(std::mem::size_of::<ProcRec>() * MAX_PROCS);
const RETAINS_OFF: usize = PROCS_OFF + PROCS_SIZE;
const RETAINS_SIZE: usize = align(std::mem::size_of::<RetainRec>() * RETAIN_RING);
const KERNELS_OFF: usize = RETAINS_OFF + RETAINS_SIZE;
const KERNELS_PER_DEVICE: usize = std::mem::size_of::<KernelRec>() * KERNEL_RING;
pub const TOTAL_SIZE: usize = KERNELS_OFF + KERNELS_PER_DEVICE * MAX_DEVICES;

/// A mapped state file.
pub struct State {
    map: MmapRaw,
    _file: File,
}

impl State {
    /// Create a fresh state file at `path` (the daemon). Written under a
    /// temporary name and renamed, so a reader never sees it half-made.
    pub fn create(path: &Path, cfg: &SimConfig, daemon_pid: u32) -> Result<State, StateError> {
        let p = path.display().to_string();
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|source| StateError::Open {
                path: p.clone(),
                source,
            })?;
        // Sparse: untouched timeline pages cost nothing.
        file.set_len(TOTAL_SIZE as u64)
            .map_err(|source| StateError::Open {
                path: p.clone(),
                source,
            })?;
        let map = MmapRaw::map_raw(&file).map_err(|source| StateError::Map {
            path: p.clone(),
            source,
        })?;
        let mut state = State { map, _file: file };
        {
            let h = state.header_mut_init();
            h.magic = MAGIC;
            h.layout_version = LAYOUT_VERSION;
            h.header_size = HEADER_SIZE as u32;
            h.total_size = TOTAL_SIZE as u64;
            h.device_count = cfg.devices;
            h.max_procs = MAX_PROCS as u32;
            h.kernel_ring = KERNEL_RING as u32;
            h.retain_ring = RETAIN_RING as u32;
            h.daemon_pid = daemon_pid;
            h.serialize_context_creation = u32::from(cfg.cost.serialize_context_creation);
            h.init_ns = cfg.cost.init_ns;
            h.ctx_create_ns = cfg.cost.ctx_create_ns;
            h.ctx_destroy_ns = cfg.cost.ctx_destroy_ns;
            h.primary_retain_cold_ns = cfg.cost.primary_retain_cold_ns;
            h.primary_retain_nested_ns = cfg.cost.primary_retain_nested_ns;
            h.primary_release_ns = cfg.cost.primary_release_ns;
            h.nvml_snapshot_ns = cfg.cost.nvml_snapshot_ns;
            h.kernel_queue_depth = u64::from(cfg.kernel.queue_depth);
            h.nvml_window_ns = cfg.kernel.nvml_window_ns;
            h.timeslice_ns = cfg.kernel.timeslice_ns;
            h.image_block_ns = cfg.kernel.image_block_ns;
            h.realtime_offset_ns =
                crate::clock::realtime_ns() as i64 - crate::clock::now_ns() as i64;
        }
        for i in 0..cfg.devices as usize {
            let d = state.device_mut_init(i);
            d.name = Self::device_label(&cfg.device.name);
            d.memory_bytes = cfg.device.memory_bytes;
            d.sms = cfg.device.sms;
            d.max_threads_per_sm = cfg.device.max_threads_per_sm;
            d.cc_major = cfg.device.cc_major;
            d.cc_minor = cfg.device.cc_minor;
        }
        state.map.flush().map_err(|source| StateError::Map {
            path: p.clone(),
            source,
        })?;
        std::fs::rename(&tmp, path).map_err(|source| StateError::Open { path: p, source })?;
        Ok(state)
    }

    /// Map an existing state file and check its layout.
    pub fn open(path: &Path) -> Result<State, StateError> {
        let p = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| StateError::Open {
                path: p.clone(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| StateError::Open {
                path: p.clone(),
                source,
            })?
            .len();
        if len < TOTAL_SIZE as u64 {
            return Err(StateError::Layout {
                path: p,
                problem: format!("{len} bytes, expected {TOTAL_SIZE}"),
            });
        }
        let map = MmapRaw::map_raw(&file).map_err(|source| StateError::Map {
            path: p.clone(),
            source,
        })?;
        let state = State { map, _file: file };
        let h = state.header();
        let problem = if h.magic != MAGIC {
            Some("bad magic (not a vgpu-sim state file)".to_string())
        } else if h.layout_version != LAYOUT_VERSION
            || h.header_size as usize != HEADER_SIZE
            || h.total_size as usize != TOTAL_SIZE
        {
            Some(format!(
                "layout version {} (header {}, size {}), this build reads {LAYOUT_VERSION} ({HEADER_SIZE}, {TOTAL_SIZE})",
                h.layout_version, h.header_size, h.total_size
            ))
        } else if h.device_count == 0 || h.device_count as usize > MAX_DEVICES {
            Some(format!("device count {} out of range", h.device_count))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(StateError::Layout { path: p, problem }),
            None => Ok(state),
        }
    }

    fn ptr_at<T>(&self, off: usize) -> *mut T {
        debug_assert!(off + std::mem::size_of::<T>() <= TOTAL_SIZE);
        debug_assert_eq!(off % std::mem::align_of::<T>(), 0);
        // SAFETY: `off` is inside the mapping (TOTAL_SIZE checked at
        // open/create) and the mapping is page-aligned, so the pointer stays in
        // bounds; computing it does not dereference.
        unsafe { self.map.as_mut_ptr().add(off).cast::<T>() }
    }

    fn header_mut_init(&mut self) -> &mut Header {
        // SAFETY: only called by `create` before the file is renamed into
        // place, so no other process maps it yet and this is the only
        // reference; the header is in bounds and aligned.
        unsafe { &mut *self.ptr_at::<Header>(0) }
    }

    fn device_mut_init(&mut self, i: usize) -> &mut DeviceRec {
        assert!(i < MAX_DEVICES);
        // SAFETY: as `header_mut_init`: the file is private to its creator
        // until renamed; the record is in bounds and aligned.
        unsafe {
            &mut *self.ptr_at::<DeviceRec>(DEVICES_OFF + i * std::mem::size_of::<DeviceRec>())
        }
    }

    /// The header. Its plain fields are written once, before the file is
    /// published, and never again; the rest are atomics.
    pub fn header(&self) -> &Header {
        // SAFETY: in bounds and aligned; after publication every shared
        // mutation goes through atomics, so a shared reference is sound.
        unsafe { &*self.ptr_at::<Header>(0) }
    }

    pub fn device_count(&self) -> usize {
        self.header().device_count as usize
    }

    /// Device `i` (`i < device_count()`).
    pub fn device(&self, i: usize) -> Option<&DeviceRec> {
        if i >= self.device_count() {
            return None;
        }
        // SAFETY: i < device_count <= MAX_DEVICES, so in bounds; plain fields
        // are immutable after publication, the rest atomics.
        Some(unsafe {
            &*self.ptr_at::<DeviceRec>(DEVICES_OFF + i * std::mem::size_of::<DeviceRec>())
        })
    }

    pub fn proc_rec(&self, i: usize) -> &ProcRec {
        assert!(i < MAX_PROCS, "process record {i} out of range");
        // SAFETY: i < MAX_PROCS, so in bounds and aligned; all fields are
        // atomics.
        unsafe { &*self.ptr_at::<ProcRec>(PROCS_OFF + i * std::mem::size_of::<ProcRec>()) }
    }

    pub fn retain_rec(&self, i: usize) -> &RetainRec {
        let i = i % RETAIN_RING;
        // SAFETY: index reduced modulo the ring, so in bounds; atomics only.
        unsafe { &*self.ptr_at::<RetainRec>(RETAINS_OFF + i * std::mem::size_of::<RetainRec>()) }
    }

    pub fn kernel_rec(&self, dev: usize, i: usize) -> &KernelRec {
        assert!(dev < MAX_DEVICES);
        let i = i % KERNEL_RING;
        let off = KERNELS_OFF + dev * KERNELS_PER_DEVICE + i * std::mem::size_of::<KernelRec>();
        // SAFETY: dev < MAX_DEVICES and index reduced modulo the ring, so in
        // bounds; atomics only.
        unsafe { &*self.ptr_at::<KernelRec>(off) }
    }

    /// The configuration this machine was created with, read back from the
    /// header and device records (`profile` is the matching named profile,
    /// else `custom`; `device.name` is the recorded label, see
    /// [`State::device_label_text`]).
    pub fn config(&self) -> SimConfig {
        let h = self.header();
        let mut cfg = SimConfig {
            devices: h.device_count,
            ..SimConfig::default()
        };
        cfg.cost = crate::config::CostModel {
            init_ns: h.init_ns,
            ctx_create_ns: h.ctx_create_ns,
            ctx_destroy_ns: h.ctx_destroy_ns,
            primary_retain_cold_ns: h.primary_retain_cold_ns,
            primary_retain_nested_ns: h.primary_retain_nested_ns,
            primary_release_ns: h.primary_release_ns,
            nvml_snapshot_ns: h.nvml_snapshot_ns,
            serialize_context_creation: h.serialize_context_creation != 0,
        };
        cfg.kernel.queue_depth = h.kernel_queue_depth as u32;
        cfg.kernel.nvml_window_ns = h.nvml_window_ns;
        cfg.kernel.timeslice_ns = h.timeslice_ns;
        cfg.kernel.image_block_ns = h.image_block_ns;
        if let Some(d) = self.device(0) {
            let end = d.name.iter().position(|b| *b == 0).unwrap_or(NAME_LEN);
            cfg.device.name = String::from_utf8_lossy(&d.name[..end]).into_owned();
            cfg.device.memory_bytes = d.memory_bytes;
            cfg.device.sms = d.sms;
            cfg.device.max_threads_per_sm = d.max_threads_per_sm;
            cfg.device.cc_major = d.cc_major;
            cfg.device.cc_minor = d.cc_minor;
        }
        cfg.profile = cfg.matching_profile().unwrap_or("custom").to_string();
        cfg
    }

    /// What [`State::config`] reads back as `device.name` for a machine
    /// configured with `name`.
    pub fn device_label_text(name: &str) -> String {
        let b = Self::device_label(name);
        let end = b.iter().position(|c| *c == 0).unwrap_or(NAME_LEN);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// A device's name as the state records it (decorated, bounded).
    pub fn device_label(name: &str) -> [u8; NAME_LEN] {
        let mut out = [0u8; NAME_LEN];
        let label = format!("vgpu-sim {name} (simulated)");
        let n = label.len().min(NAME_LEN - 1);
        out[..n].copy_from_slice(&label.as_bytes()[..n]);
        out
    }

    fn proc_scan(&self) -> usize {
        (self.header().proc_hwm.load(Ordering::SeqCst) as usize).min(MAX_PROCS)
    }

    /// Device-wide memory in use: the sum over live process records.
    pub fn used_bytes(&self, dev: usize) -> u64 {
        (0..self.proc_scan())
            .map(|i| self.proc_rec(i))
            .filter(|r| r.state.load(Ordering::SeqCst) == PROC_LIVE)
            .map(|r| r.mem[dev].load(Ordering::SeqCst))
            // Saturating: a sum past u64 reads "full", never a small number.
            .fold(0u64, u64::saturating_add)
    }

    /// Live process records: (index, host pid).
    pub fn live_procs(&self) -> Vec<(usize, u32)> {
        (0..self.proc_scan())
            .filter_map(|i| {
                let r = self.proc_rec(i);
                (r.state.load(Ordering::Acquire) == PROC_LIVE)
                    .then(|| (i, r.host_pid.load(Ordering::Acquire)))
            })
            .collect()
    }

    /// Append a cold-retain interval.
    pub fn record_retain(&self, host_pid: u32, device: u32, start_ns: u64, end_ns: u64) {
        let idx = self.header().retain_head.fetch_add(1, Ordering::AcqRel);
        let r = self.retain_rec(idx as usize);
        r.seq.store(0, Ordering::Release);
        r.start_ns.store(start_ns, Ordering::Relaxed);
        r.end_ns.store(end_ns, Ordering::Relaxed);
        r.host_pid.store(host_pid, Ordering::Relaxed);
        r.device.store(device, Ordering::Relaxed);
        r.seq.store(idx + 1, Ordering::Release);
    }

    /// Every complete cold-retain interval still in the ring:
    /// (host pid, device, start, end).
    pub fn retains(&self) -> Vec<(u32, u32, u64, u64)> {
        let head = self.header().retain_head.load(Ordering::Acquire);
        let first = head.saturating_sub(RETAIN_RING as u64);
        (first..head)
            .filter_map(|idx| {
                let r = self.retain_rec(idx as usize);
                if r.seq.load(Ordering::Acquire) != idx + 1 {
                    return None;
                }
                let v = (
                    r.host_pid.load(Ordering::Relaxed),
                    r.device.load(Ordering::Relaxed),
                    r.start_ns.load(Ordering::Relaxed),
                    r.end_ns.load(Ordering::Relaxed),
                );
                (r.seq.load(Ordering::Acquire) == idx + 1).then_some(v)
            })
            .collect()
    }

    /// Record a kernel interval on `dev`. Back-to-back work of one process
    /// extends its latest entry instead of taking a new one, so the ring
    /// covers the NVML window even for very short kernels.
    pub fn record_kernel(&self, dev: usize, host_pid: u32, start_ns: u64, end_ns: u64) {
        let Some(d) = self.device(dev) else { return };
        let head = d.kernel_head.load(Ordering::Acquire);
        if head > 0 {
            let last = self.kernel_rec(dev, (head - 1) as usize);
            // Ours, complete, and ending exactly where this one starts: the
            // CAS on `end_ns` keeps a racing extender from losing time.
            if last.seq.load(Ordering::Acquire) == head
                && last.host_pid.load(Ordering::Relaxed) == host_pid
                && last
                    .end_ns
                    .compare_exchange(start_ns, end_ns, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
        let idx = d.kernel_head.fetch_add(1, Ordering::AcqRel);
        let r = self.kernel_rec(dev, idx as usize);
        r.seq.store(0, Ordering::Release);
        r.start_ns.store(start_ns, Ordering::Relaxed);
        r.end_ns.store(end_ns, Ordering::Relaxed);
        r.host_pid.store(host_pid, Ordering::Relaxed);
        r.seq.store(idx + 1, Ordering::Release);
    }

    /// Kernel intervals on `dev` that overlap `[from, to)`:
    /// (host pid, start, end).
    pub fn kernels(&self, dev: usize, from: u64, to: u64) -> Vec<(u32, u64, u64)> {
        let Some(d) = self.device(dev) else {
            return Vec::new();
        };
        let head = d.kernel_head.load(Ordering::Acquire);
        let first = head.saturating_sub(KERNEL_RING as u64);
        let mut out = Vec::new();
        for idx in (first..head).rev() {
            let r = self.kernel_rec(dev, idx as usize);
            if r.seq.load(Ordering::Acquire) != idx + 1 {
                continue;
            }
            let (pid, s, e) = (
                r.host_pid.load(Ordering::Relaxed),
                r.start_ns.load(Ordering::Relaxed),
                r.end_ns.load(Ordering::Relaxed),
            );
            if r.seq.load(Ordering::Acquire) != idx + 1 {
                continue;
            }
            if e > from && s < to {
                out.push((pid, s, e));
            }
            // The ring is in near-start order; far older entries end the scan.
            if e + 10_000_000_000 < from {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(std::mem::size_of::<KernelRec>(), 32);
        assert_eq!(std::mem::size_of::<RetainRec>(), 32);
        assert_eq!(std::mem::size_of::<QEntry>(), 40);
        assert_eq!(
            std::mem::size_of::<ProcRec>(),
            16 + 8 * MAX_DEVICES + 4 * MAX_DEVICES + 24 + 40 * QUEUE_LEN
        );
        assert_eq!(HEADER_SIZE % 64, 0);
    }

    #[test]
    fn create_open_and_reject() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let cfg = SimConfig {
            devices: 2,
            ..SimConfig::default()
        };
        let s = State::create(&path, &cfg, 1).unwrap();
        assert_eq!(s.device_count(), 2);
        let o = State::open(&path).unwrap();
        assert_eq!(o.device(1).unwrap().sms, 132);
        assert!(o.device(2).is_none());
        s.record_kernel(0, 7, 10, 20);
        assert_eq!(o.kernels(0, 0, 100), vec![(7, 10, 20)]);
        // Back-to-back work of one process extends its entry; a gap or
        // another process starts a new one.
        s.record_kernel(0, 7, 20, 30);
        assert_eq!(o.kernels(0, 0, 100), vec![(7, 10, 30)]);
        s.record_kernel(0, 8, 30, 40);
        s.record_kernel(0, 8, 45, 50);
        assert_eq!(
            o.kernels(0, 0, 100),
            vec![(8, 45, 50), (8, 30, 40), (7, 10, 30)]
        );
        assert_eq!(o.kernels(0, 41, 44), vec![]);
        s.record_retain(7, 0, 1, 2);
        assert_eq!(o.retains(), vec![(7, 0, 1, 2)]);
        // A wrong file is refused with a reason.
        let bad = dir.path().join("bad");
        std::fs::write(&bad, vec![0u8; TOTAL_SIZE]).unwrap();
        let e = State::open(&bad).err().unwrap().to_string();
        assert!(e.contains("bad magic"), "{e}");
        std::fs::write(&bad, b"short").unwrap();
        assert!(State::open(&bad).is_err());
    }
}
