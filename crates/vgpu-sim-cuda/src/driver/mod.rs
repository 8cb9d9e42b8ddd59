//! The simulated CUDA driver's per-process state, in safe Rust. Handles
//! are tagged integers looked up in maps, so a bogus handle is an error,
//! never a crash. Device-wide state (memory, contexts, kernel timelines,
//! costs) lives in `vgpu_sim::Machine`.
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vgpu_cuda_abi::CUresult;
use vgpu_sim::backing::Backing;
use vgpu_sim::clock::{now_ns, spend};
use vgpu_sim::{log, CtxCost, Machine, MachineError};

mod context;
mod graph;
mod launch;
mod memory;
mod module;
mod pool;
mod stream;
mod vmm;

pub use module::{parse_image, LibKernel, Library};

pub type R<T = ()> = Result<T, CUresult>;

/// The driver version this simulation reports (CUDA 12.9).
pub const DRIVER_VERSION: i32 = 12090;
/// VMM / pool granularity.
pub const GRANULARITY: u64 = 2 << 20;
/// Stream handle values with fixed meaning in `cuda.h`.
pub const CU_STREAM_LEGACY: u64 = 0x1;
pub const CU_STREAM_PER_THREAD: u64 = 0x2;

// Handle kinds. A handle is a pointer-like value a real driver could hand
// out: a 16-byte-aligned user-space address (top bit clear, so bindings
// that keep handles as signed 64-bit integers take them), with the kind in
// bits 40..44 so that one kind is never taken for another.
pub const T_CTX: u64 = 1;
pub const T_STREAM: u64 = 2;
pub const T_EVENT: u64 = 3;
pub const T_MODULE: u64 = 4;
pub const T_FUNC: u64 = 5;
pub const T_POOL: u64 = 6;
pub const T_GRAPH: u64 = 7;
pub const T_NODE: u64 = 8;
pub const T_EXEC: u64 = 9;
pub const T_ARRAY: u64 = 10;
pub const T_MIPMAP: u64 = 11;
pub const T_VMM: u64 = 12;
pub const T_LINK: u64 = 13;
pub const T_LIBRARY: u64 = 14;
pub const T_KERNEL: u64 = 15;
/// Handles live in `[HANDLE_BASE, HANDLE_BASE + 2^44)`.
pub const HANDLE_BASE: u64 = 0x5000_0000_0000;

/// The kind of a handle this driver made (None: not one of ours).
pub fn handle_kind(h: u64) -> Option<u64> {
    (h & !((1 << 44) - 1) == HANDLE_BASE && h.is_multiple_of(16)).then_some((h >> 40) & 0xf)
}

/// Device addresses (64-bit API) start here; v1 (32-bit) ones low.
pub(crate) const VA_BASE: u64 = 0x7f00_0000_0000 - (1 << 44);
pub(crate) const VA32_BASE: u64 = 0x1000_0000;
const VA32_END: u64 = 0xffff_0000;

#[derive(Clone, Debug)]
pub struct Ctx {
    pub dev: usize,
    pub primary: bool,
    pub flags: u32,
    /// Sequence number of the last launch in this context.
    pub last_seq: u64,
    /// ... and on its legacy default stream.
    pub default_seq: u64,
}

#[derive(Clone, Debug)]
pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    pub last_seq: u64,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub flags: u32,
    /// Once recorded: the launch it waits for (0: none) and, once known,
    /// when that completed.
    pub mark: Option<(u64, Option<u64>)>,
    /// Exported (`cuIpcGetEventHandle`): its records are published.
    pub ipc: Option<(u32, u32)>,
    /// Opened from another process (`cuIpcOpenEventHandle`): it happens
    /// when that process's event does.
    pub remote: Option<(u32, u32)>,
    /// Last recorded on a stream being captured: the record became part
    /// of the graph, so the event cannot be queried now.
    pub captured: bool,
}

#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    /// Fixed per-block time; `None` takes it from the first kernel
    /// parameter (a u64 of nanoseconds).
    pub block_ns: Option<u64>,
}

#[derive(Clone, Debug)]
pub enum AllocKind {
    Device,
    /// Host-visible memory (managed), unmapped when dropped.
    Managed(Arc<memmap2::MmapRaw>),
    /// From a pool; host-located pools back it with host memory.
    Pool(u64, Option<Arc<memmap2::MmapRaw>>),
    /// Another process's memory opened by `cuIpcOpenMemHandle`: charged to
    /// its owner, not here.
    Ipc,
}

#[derive(Clone, Debug)]
pub struct Alloc {
    pub dev: usize,
    pub ctx: u64,
    pub size: u64,
    /// What the device is charged (pools round up).
    pub charged: u64,
    pub kind: AllocKind,
    /// Where its bytes live when not in this process's device memory (IPC:
    /// the exporter's backing and the offset of this allocation in it).
    pub backing: Option<(Arc<Backing>, u64)>,
    /// The IPC export (token, nonce), once `cuIpcGetMemHandle` made one.
    pub ipc: Option<(u32, u32)>,
}

/// A stream-ordered memory pool. `reserved` is what the device is charged
/// for it; `busy` the part live allocations occupy (each rounded to the
/// granularity); the rest is freed memory the pool keeps for reuse until a
/// synchronization finds it above the release threshold, or a trim.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    pub dev: usize,
    /// Bytes of live allocations as requested (`USED_MEM_CURRENT`).
    pub used: u64,
    pub used_high: u64,
    pub reserved: u64,
    pub reserved_high: u64,
    pub busy: u64,
    pub release_threshold: u64,
    pub reuse: [i32; 3],
    /// Located in host memory (`CU_MEM_LOCATION_TYPE_HOST_NUMA`): no
    /// device memory is charged for it.
    pub host: bool,
    /// `CUmemPoolProps::maxSize`: reserved memory never exceeds it (0: no cap).
    pub max_size: u64,
    /// `cuMemPoolSetAccess` grants to other devices (machine index -> flags).
    pub access: BTreeMap<usize, u32>,
    /// `cuMemPoolDestroy` ran while allocations were still out: the handle
    /// is dead, the pool goes once the last of them is freed.
    pub destroyed: bool,
}

impl Pool {
    /// Reserved memory no live allocation occupies.
    pub fn unused(&self) -> u64 {
        self.reserved.saturating_sub(self.busy)
    }
}

#[derive(Clone, Debug)]
pub struct Vmm {
    pub dev: usize,
    pub size: u64,
    pub maps: u32,
    pub released: bool,
    /// Its bytes, made at the first data access through a mapping.
    pub backing: Option<Arc<Backing>>,
}

#[derive(Clone, Copy, Debug)]
pub struct KernelNode {
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub param_ns: Option<u64>,
}

/// One node of a graph.
#[derive(Clone, Copy, Debug)]
pub enum GraphNode {
    Kernel(KernelNode),
    /// Stream-ordered allocation (`cuGraphAddMemAllocNode`): its address is
    /// fixed at creation; the memory is made (and charged) at launch.
    MemAlloc {
        dptr: u64,
        size: u64,
        dev: usize,
    },
    /// `cuGraphAddMemFreeNode`: frees a graph allocation at launch.
    MemFree {
        dptr: u64,
    },
}

#[derive(Default)]
pub struct Primary {
    pub refcount: u32,
    pub flags: u32,
    pub ctx: u64,
}

#[derive(Default)]
pub struct Inner {
    next_id: u64,
    pub(crate) next_va: u64,
    pub(crate) next_va32: u64,
    pub ctxs: HashMap<u64, Ctx>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Vec<u64>>,
    pub funcs: HashMap<u64, Kernel>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub host: HashMap<usize, memmap2::MmapRaw>,
    pub registered: BTreeMap<usize, usize>,
    pub pools: HashMap<u64, Pool>,
    pub default_pools: HashMap<usize, u64>,
    pub current_pools: HashMap<usize, u64>,
    pub vmm: HashMap<u64, Vmm>,
    pub reservations: BTreeMap<u64, u64>,
    /// Mapped ranges: start -> (size, vmm handle, offset in the handle).
    pub mappings: BTreeMap<u64, (u64, u64, u64)>,
    pub arrays: HashMap<u64, (usize, u64, u64)>,
    pub graphs: HashMap<u64, Vec<GraphNode>>,
    pub nodes: HashMap<u64, u64>,
    pub execs: HashMap<u64, Vec<GraphNode>>,
    /// Graph node handle -> (graph, index of the node in it).
    pub node_index: HashMap<u64, (u64, usize)>,
    /// Modules whose kernels could not be read: any name resolves.
    pub open_modules: std::collections::HashSet<u64>,
    /// This process's graph memory per device (`cuDeviceGetGraphMemAttribute`).
    pub graph_mem: HashMap<usize, crate::query::GraphMem>,
    /// Live graph allocations: address -> (device, size).
    pub graph_live: HashMap<u64, (usize, u64)>,
    /// Executables instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
    pub exec_auto_free: std::collections::HashSet<u64>,
    /// Per-context limits set by `cuCtxSetLimit`, cache configs, and
    /// peer access granted by `cuCtxEnablePeerAccess`.
    pub limits: HashMap<(u64, u32), u64>,
    pub cache_config: HashMap<u64, u32>,
    pub peers: std::collections::HashSet<(u64, u64)>,
    /// Function attributes set by `cuFuncSetAttribute`.
    pub func_attrs: HashMap<(u64, u32), i32>,
    /// Link states: inputs' kernels so far, and the output once complete.
    pub links: HashMap<u64, crate::query::Link>,
    /// Libraries (`cuLibraryLoad*`) and their kernels (`CUkernel`).
    pub libraries: HashMap<u64, module::Library>,
    pub lib_kernels: HashMap<u64, module::LibKernel>,
    pub primaries: Vec<Primary>,
    /// This process's device memory: one sparse backing over the whole
    /// device address range (made at the first data access), so touched
    /// allocations cost pages, not a descriptor each.
    pub dev_mem: Option<Arc<Backing>>,
    /// Last work of each thread's per-thread default stream, per context
    /// (by thread id: no TLS, see `CtxStack`).
    pub pt_streams: HashMap<(i32, u64), u64>,
    /// Streams being captured (`cuStreamBeginCapture`): stream -> the graph
    /// their work is appended to instead of running.
    pub captures: HashMap<u64, u64>,
}

impl Inner {
    pub fn id(&mut self, kind: u64) -> u64 {
        self.next_id += 1;
        // 2^36 handles before the counter would reach the kind bits.
        HANDLE_BASE | (kind << 40) | ((self.next_id & ((1 << 36) - 1)) << 4)
    }

    /// A fresh device address range of `size` bytes aligned to `align`.
    pub fn va(&mut self, size: u64, align: u64, v1: bool) -> R<u64> {
        let align = align.max(512);
        let (cur, end) = if v1 {
            (&mut self.next_va32, VA32_END)
        } else {
            (&mut self.next_va, crate::data::VA_END)
        };
        if *cur == 0 {
            *cur = if v1 { VA32_BASE } else { VA_BASE };
        }
        let start = cur
            .checked_add(align - 1)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?
            / align
            * align;
        // A guard gap keeps neighbours apart, like a real VA allocator.
        let next = start
            .checked_add(size.max(1))
            .and_then(|v| v.checked_add(GRANULARITY))
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        if next > end {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        *cur = next;
        Ok(start)
    }
}

pub struct Driver {
    pub m: Machine,
    /// CUDA ordinal -> machine device index.
    pub visible: Vec<usize>,
    pub inner: Mutex<Inner>,
    /// Per device, held across primary-context retain/release (including
    /// their cost), like the real driver's per-device lock.
    pub primary_lock: Vec<Mutex<()>>,
}

static DRIVER: OnceLock<Arc<Driver>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// How deep one thread's context stack may grow (`cuCtxPushCurrent`).
pub const CTX_STACK_DEPTH: usize = 256;

/// One thread's context stack (top = current). Plain data with no
/// destructor, so it stays readable while the thread's TLS is torn down:
/// C++ runtimes release primary contexts from thread-local destructors and
/// `atexit` handlers, and those calls must not find the stack gone.
#[derive(Clone, Copy)]
struct CtxStack {
    len: usize,
    items: [u64; CTX_STACK_DEPTH],
}

thread_local! {
    static CTX_STACK: RefCell<CtxStack> =
        const { RefCell::new(CtxStack { len: 0, items: [0; CTX_STACK_DEPTH] }) };
}

/// The calling thread's id, without TLS (usable during TLS teardown).
fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn machine_err(e: MachineError) -> CUresult {
    match e {
        MachineError::OutOfMemory { .. } => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        MachineError::NoDevice(_) => CUresult::CUDA_ERROR_INVALID_DEVICE,
        MachineError::Released => CUresult::CUDA_ERROR_DEINITIALIZED,
        MachineError::DaemonGone => {
            log::log(
                log::ERROR,
                "the sim daemon is gone: queued kernels never finish",
            );
            CUresult::CUDA_ERROR_LAUNCH_FAILED
        }
        other => {
            log::log(log::ERROR, &chain(&other));
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

pub fn chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}

/// `cuInit`.
pub fn init(flags: u32) -> R {
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(d) = DRIVER.get() {
        return if d.m.local_pid == std::process::id() {
            Ok(())
        } else {
            // A forked child: the parent's driver state is not its own.
            Err(CUresult::CUDA_ERROR_NOT_INITIALIZED)
        };
    }
    let _g = lock(&INIT_LOCK);
    if DRIVER.get().is_some() {
        return Ok(());
    }
    let m = match Machine::connect(true) {
        Ok(m) => m,
        Err(e) => {
            log::log(log::WARN, &format!("cuInit: {}", chain(&e)));
            return Err(CUresult::CUDA_ERROR_NO_DEVICE);
        }
    };
    let visible = visible_devices(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        m.device_count(),
    );
    if visible.is_empty() {
        log::log(log::INFO, "cuInit: CUDA_VISIBLE_DEVICES hides every device");
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    spend(m.header().init_ns);
    let n = m.device_count();
    let inner = Inner {
        primaries: (0..n).map(|_| Primary::default()).collect(),
        ..Inner::default()
    };
    let _ = DRIVER.set(Arc::new(Driver {
        m,
        visible,
        inner: Mutex::new(inner),
        primary_lock: (0..n).map(|_| Mutex::new(())).collect(),
    }));
    Ok(())
}

/// The driver, once `cuInit` succeeded in this process.
pub fn drv() -> R<&'static Driver> {
    match DRIVER.get() {
        Some(d) if d.m.local_pid == std::process::id() => Ok(d),
        _ => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

pub fn current_ctx() -> Option<u64> {
    CTX_STACK.with(|s| {
        let s = s.borrow();
        s.len.checked_sub(1).map(|i| s.items[i])
    })
}

pub fn set_current(ctx: Option<u64>) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        match ctx {
            Some(c) if s.len == 0 => {
                s.items[0] = c;
                s.len = 1;
            }
            Some(c) => {
                let top = s.len - 1;
                s.items[top] = c;
            }
            None => s.len = s.len.saturating_sub(1),
        }
    })
}

/// Push `ctx` on this thread's stack; a full stack is an error.
pub fn push_current(ctx: u64) -> R {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if s.len == CTX_STACK_DEPTH {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = s.len;
        s.items[n] = ctx;
        s.len += 1;
        Ok(())
    })
}

pub fn pop_current() -> Option<u64> {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.len = s.len.checked_sub(1)?;
        Some(s.items[s.len])
    })
}

/// Drop `ctx` wherever it sits in this thread's stack.
fn forget_current(ctx: u64) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        let n = s.len;
        let mut kept = 0;
        for i in 0..n {
            if s.items[i] != ctx {
                s.items[kept] = s.items[i];
                kept += 1;
            }
        }
        s.len = kept;
    })
}

impl Driver {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// CUDA device ordinal -> the machine's device index (through
    /// `CUDA_VISIBLE_DEVICES`).
    pub fn device(&self, dev: i32) -> R<usize> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.visible.get(d).copied())
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    /// The machine's device index -> CUDA device ordinal.
    pub fn ordinal(&self, phys: usize) -> i32 {
        self.visible
            .iter()
            .position(|p| *p == phys)
            .map_or(-1, |o| o as i32)
    }

    /// Devices this process sees.
    pub fn device_count(&self) -> usize {
        self.visible.len()
    }

    /// The current context, which must be live.
    pub fn ctx(&self) -> R<(u64, usize)> {
        let c = current_ctx().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let g = self.lock();
        let ctx = g.ctxs.get(&c).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        Ok((c, ctx.dev))
    }
}

/// `CUDA_VISIBLE_DEVICES` as the driver reads it: unset = every device;
/// otherwise a comma-separated list of indices or (unique prefixes of)
/// `GPU-…` UUIDs, read up to the first invalid or repeated entry.
pub fn visible_devices(var: Option<&str>, n: usize) -> Vec<usize> {
    let Some(var) = var else {
        return (0..n).collect();
    };
    let mut out: Vec<usize> = Vec::new();
    for item in var.split(',').map(str::trim) {
        let hit = if let Ok(i) = item.parse::<usize>() {
            (i < n).then_some(i)
        } else if item.len() > 4 && item[..4].eq_ignore_ascii_case("GPU-") {
            let m: Vec<usize> = (0..n)
                .filter(|d| {
                    Machine::device_uuid_string(*d)
                        .to_ascii_lowercase()
                        .starts_with(&item.to_ascii_lowercase())
                })
                .collect();
            (m.len() == 1).then(|| m[0])
        } else {
            None
        };
        match hit {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

/// Zeroed, page-aligned host memory the application may use freely; a
/// raw mapping because C code writes it behind our back.
fn anon(size: u64) -> R<memmap2::MmapRaw> {
    let len = usize::try_from(size).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    memmap2::MmapOptions::new()
        .len(len)
        .map_anon()
        .map(memmap2::MmapRaw::from)
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices() {
        assert_eq!(visible_devices(None, 3), vec![0, 1, 2]);
        assert_eq!(visible_devices(Some("1"), 3), vec![1]);
        assert_eq!(visible_devices(Some("1,0"), 3), vec![1, 0]);
        assert_eq!(
            visible_devices(Some("2,7,0"), 3),
            vec![2],
            "stops at the invalid entry"
        );
        assert_eq!(
            visible_devices(Some("1,1"), 3),
            vec![1],
            "stops at a repeat"
        );
        assert_eq!(visible_devices(Some(""), 3), Vec::<usize>::new());
        assert_eq!(visible_devices(Some("-1"), 3), Vec::<usize>::new());
        let u2 = Machine::device_uuid_string(2);
        assert_eq!(visible_devices(Some(&format!("{u2},0")), 3), vec![2, 0]);
        assert_eq!(
            visible_devices(Some(&u2[..10].to_uppercase()), 3),
            vec![2],
            "unique prefix"
        );
        assert_eq!(visible_devices(Some("GPU-"), 3), Vec::<usize>::new());
        assert_eq!(visible_devices(Some("MIG-1"), 3), Vec::<usize>::new());
    }
}
