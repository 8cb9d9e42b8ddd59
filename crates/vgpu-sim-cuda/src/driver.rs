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

    // ---- contexts ----

    pub fn ctx_create(&self, flags: u32, dev: i32) -> R<u64> {
        let dev = self.device(dev)?;
        self.m
            .context_creation(dev, CtxCost::Create)
            .map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(T_CTX);
        g.ctxs.insert(
            id,
            Ctx {
                dev,
                primary: false,
                flags,
                last_seq: 0,
                default_seq: 0,
            },
        );
        drop(g);
        self.m.count_context(dev, 1);
        if let Err(e) = push_current(id) {
            self.teardown(&mut self.lock(), id);
            return Err(e);
        }
        Ok(id)
    }

    /// Destroy a context's resources (memory, streams, events) and forget it.
    fn teardown(&self, g: &mut Inner, ctx: u64) {
        let Some(c) = g.ctxs.remove(&ctx) else { return };
        let dead: Vec<u64> = g
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(k, _)| *k)
            .collect();
        for p in dead {
            if let Some(a) = g.allocs.remove(&p) {
                self.free_alloc(g, p, &a);
            }
        }
        // The context's graph memory goes with it, the device's cached
        // graph memory too.
        self.graph_trim_locked(g, c.dev);
        let dead: Vec<u64> = g
            .arrays
            .iter()
            .filter(|(_, a)| a.2 == ctx)
            .map(|(k, _)| *k)
            .collect();
        for a in dead {
            if let Some((dev, size, _)) = g.arrays.remove(&a) {
                self.m.unreserve(dev, size);
            }
        }
        // Destroying a context synchronizes it.
        self.release_pools_locked(g);
        g.streams.retain(|_, s| s.ctx != ctx);
        self.m.count_context(c.dev, -1);
        g.pt_streams.retain(|(_, c), _| *c != ctx);
        // Other threads may still name it; their calls fail as invalid.
        forget_current(ctx);
    }

    pub fn ctx_destroy(&self, ctx: u64) -> R {
        let g = self.lock();
        let c = g
            .ctxs
            .get(&ctx)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if c.primary {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        let seq = c.last_seq;
        drop(g);
        // Destroy proceeds even if the work can never finish.
        let _ = self.m.wait(seq);
        spend(self.m.header().ctx_destroy_ns);
        let mut g = self.lock();
        self.teardown(&mut g, ctx);
        Ok(())
    }

    pub fn primary_retain(&self, dev: i32) -> R<u64> {
        let dev = self.device(dev)?;
        let _p = lock(&self.primary_lock[dev]);
        let (cold, flags) = {
            let g = self.lock();
            let p = &g.primaries[dev];
            (p.refcount == 0, p.flags)
        };
        if cold {
            self.m
                .context_creation(dev, CtxCost::PrimaryCold)
                .map_err(machine_err)?;
            let mut g = self.lock();
            let id = match g.primaries[dev].ctx {
                0 => g.id(T_CTX),
                id => id,
            };
            g.ctxs.insert(
                id,
                Ctx {
                    dev,
                    primary: true,
                    flags,
                    last_seq: 0,
                    default_seq: 0,
                },
            );
            let p = &mut g.primaries[dev];
            p.ctx = id;
            p.refcount = 1;
            drop(g);
            self.m.count_context(dev, 1);
            Ok(id)
        } else {
            spend(self.m.header().primary_retain_nested_ns);
            let mut g = self.lock();
            let p = &mut g.primaries[dev];
            p.refcount += 1;
            Ok(p.ctx)
        }
    }

    pub fn primary_release(&self, dev: i32) -> R {
        let dev = self.device(dev)?;
        let _p = lock(&self.primary_lock[dev]);
        let mut g = self.lock();
        let p = &mut g.primaries[dev];
        if p.refcount == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        p.refcount -= 1;
        if p.refcount > 0 {
            return Ok(());
        }
        let ctx = p.ctx;
        let seq = g.ctxs.get(&ctx).map(|c| c.last_seq).unwrap_or(0);
        drop(g);
        let _ = self.m.wait(seq);
        spend(self.m.header().primary_release_ns);
        let mut g = self.lock();
        self.teardown(&mut g, ctx);
        Ok(())
    }

    pub fn primary_reset(&self, dev: i32) -> R {
        let d = self.device(dev)?;
        let refs = self.lock().primaries[d].refcount;
        if refs > 0 {
            self.lock().primaries[d].refcount = 1;
            self.primary_release(dev)?;
        }
        Ok(())
    }

    pub fn primary_state(&self, dev: i32) -> R<(u32, bool)> {
        let dev = self.device(dev)?;
        let g = self.lock();
        let p = &g.primaries[dev];
        Ok((p.flags, p.refcount > 0))
    }

    pub fn primary_set_flags(&self, dev: i32, flags: u32) -> R {
        let dev = self.device(dev)?;
        // Scheduling (0x07), map-host (0x08), local-mem-resize (0x10),
        // coredump/cig/sync-memops bits.
        if flags & !0x3ff != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        g.primaries[dev].flags = flags;
        Ok(())
    }

    pub fn ctx_of(&self, ctx: u64) -> R<Ctx> {
        self.lock()
            .ctxs
            .get(&ctx)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }

    pub fn ctx_synchronize(&self) -> R {
        let (c, _) = self.ctx()?;
        let seq = self.lock().ctxs.get(&c).map(|c| c.last_seq).unwrap_or(0);
        self.m.wait(seq).map_err(machine_err)?;
        self.release_pools();
        Ok(())
    }

    // ---- memory ----

    /// Charge and record a device allocation in the current context.
    pub fn mem_alloc(&self, size: u64, v1: bool) -> R<u64> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, dev) = self.ctx()?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let p = match g.va(size, 512, v1) {
            Ok(p) => p,
            Err(e) => {
                self.m.unreserve(dev, size);
                return Err(e);
            }
        };
        g.allocs.insert(
            p,
            Alloc {
                dev,
                ctx,
                size,
                charged: size,
                kind: AllocKind::Device,
                backing: None,
                ipc: None,
            },
        );
        Ok(p)
    }

    pub fn mem_alloc_managed(&self, size: u64, flags: u32) -> R<u64> {
        if size == 0 || !(flags == 1 || flags == 2) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, dev) = self.ctx()?;
        let map = anon(size)?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let p = map.as_mut_ptr();
        let mut g = self.lock();
        g.allocs.insert(
            p as u64,
            Alloc {
                dev,
                ctx,
                size,
                charged: size,
                kind: AllocKind::Managed(Arc::new(map)),
                backing: None,
                ipc: None,
            },
        );
        Ok(p as u64)
    }

    /// Returns an allocation's memory: to the device, or to its pool (which
    /// keeps it reserved until released).
    fn free_alloc(&self, g: &mut Inner, p: u64, a: &Alloc) {
        if let Some((token, nonce)) = a.ipc {
            self.m.ipc_forget(token, nonce);
        }
        crate::data::release_bytes(g, p, a);
        if crate::query::graph_alloc_freed(g, p) {
            // Back to the device's graph memory, reserved until a trim.
            return;
        }
        let AllocKind::Pool(pool, _) = &a.kind else {
            // Managed memory is unmapped as the last `Arc` drops.
            self.m.unreserve(a.dev, a.charged);
            return;
        };
        let Some(p) = g.pools.get_mut(pool) else {
            self.m.unreserve(a.dev, a.charged);
            return;
        };
        p.used = p.used.saturating_sub(a.size);
        p.busy = p.busy.saturating_sub(a.charged);
        if p.destroyed {
            // A destroyed pool keeps only what live allocations occupy.
            self.shrink_pool(p, 0);
            if p.busy == 0 {
                g.pools.remove(pool);
            }
        }
    }

    /// Gives back a pool's unused memory until at most `keep` bytes stay
    /// reserved (or nothing unused is left).
    fn shrink_pool(&self, p: &mut Pool, keep: u64) {
        let rel = p.unused().min(p.reserved.saturating_sub(keep));
        if rel > 0 {
            p.reserved -= rel;
            if !p.host {
                self.m.unreserve(p.dev, rel);
            }
        }
    }

    /// What a stream, event or context synchronization does to pools
    /// (cuda.h, `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`): each pool holding more
    /// than its release threshold gives the unused excess back.
    pub fn release_pools(&self) {
        self.release_pools_locked(&mut self.lock());
    }

    fn release_pools_locked(&self, g: &mut Inner) {
        for p in g.pools.values_mut() {
            let keep = p.release_threshold;
            self.shrink_pool(p, keep);
        }
    }

    pub fn mem_free(&self, p: u64) -> R {
        if p == 0 {
            return Ok(());
        }
        let mut g = self.lock();
        let a = g
            .allocs
            .remove(&p)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.free_alloc(&mut g, p, &a);
        drop(g);
        if matches!(a.kind, AllocKind::Pool(..)) {
            // cuMemFree of a stream-ordered allocation synchronizes first.
            self.release_pools();
        }
        Ok(())
    }

    /// (free, total) of the current context's device.
    pub fn mem_info(&self) -> R<(u64, u64)> {
        let (_, dev) = self.ctx()?;
        let total = self.m.device(dev).map_err(machine_err)?.memory_bytes;
        Ok((total.saturating_sub(self.m.used(dev)), total))
    }

    pub fn host_alloc(&self, size: u64) -> R<usize> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let map = anon(size)?;
        let p = map.as_mut_ptr();
        self.lock().host.insert(p as usize, map);
        Ok(p as usize)
    }

    pub fn host_free(&self, p: usize) -> R {
        // Unmapped as the mapping drops.
        self.lock()
            .host
            .remove(&p)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(())
    }

    pub fn host_register(&self, p: usize, size: usize, flags: u32) -> R {
        if p == 0 || size == 0 || flags & !0xf != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let mut g = self.lock();
        let end = p
            .checked_add(size)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = g
            .registered
            .range(..end)
            .next_back()
            .is_some_and(|(s, l)| s + l > p);
        if overlaps {
            return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        g.registered.insert(p, size);
        Ok(())
    }

    pub fn host_unregister(&self, p: usize) -> R {
        self.ctx()?;
        self.lock()
            .registered
            .remove(&p)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    }

    // ---- pools ----

    pub fn default_pool(&self, dev: i32) -> R<u64> {
        self.default_pool_of(self.device(dev)?)
    }

    /// Default pool of the machine's device `dev` (not a CUDA ordinal).
    fn default_pool_of(&self, dev: usize) -> R<u64> {
        let mut g = self.lock();
        if let Some(p) = g.default_pools.get(&dev) {
            return Ok(*p);
        }
        let id = g.id(T_POOL);
        g.pools.insert(
            id,
            Pool {
                dev,
                ..Pool::default()
            },
        );
        g.default_pools.insert(dev, id);
        Ok(id)
    }

    /// The device's current pool (`cuDeviceGetMemPool`): the default one
    /// unless `cuDeviceSetMemPool` chose another.
    pub fn current_pool(&self, dev: i32) -> R<u64> {
        self.current_pool_of(self.device(dev)?)
    }

    fn current_pool_of(&self, d: usize) -> R<u64> {
        if let Some(p) = self.lock().current_pools.get(&d) {
            return Ok(*p);
        }
        self.default_pool_of(d)
    }

    pub fn set_current_pool(&self, dev: i32, pool: u64) -> R {
        let d = self.device(dev)?;
        let mut g = self.lock();
        match g.pools.get(&pool) {
            Some(p) if p.dev == d && !p.host && !p.destroyed => {
                g.current_pools.insert(d, pool);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemPoolCreate`: pinned memory on a device (`loc_type` DEVICE,
    /// `id` its ordinal) or on a host NUMA node (HOST_NUMA; the sim has
    /// node 0 only); other locations are invalid, as cuda.h says of HOST
    /// and HOST_NUMA_CURRENT.
    pub fn pool_create(&self, alloc_type: u32, loc_type: u32, id: i32, max_size: u64) -> R<u64> {
        const PINNED: u32 = 1;
        const DEVICE: u32 = 1;
        const HOST_NUMA: u32 = 3;
        if alloc_type != PINNED {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (dev, host) = match loc_type {
            DEVICE => (
                self.device(id)
                    .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
                false,
            ),
            HOST_NUMA if id == 0 => (0, true),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let mut g = self.lock();
        let id = g.id(T_POOL);
        g.pools.insert(
            id,
            Pool {
                dev,
                host,
                max_size,
                ..Pool::default()
            },
        );
        Ok(id)
    }

    /// `cuMemPoolDestroy`: not the default pool. Its unused memory goes back
    /// at once; allocations still out keep theirs until freed, and the pool
    /// goes with the last of them (cuda.h).
    pub fn pool_destroy(&self, pool: u64) -> R {
        let mut g = self.lock();
        if g.default_pools.values().any(|p| *p == pool) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = g
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.shrink_pool(p, 0);
        p.destroyed = true;
        if p.busy == 0 {
            g.pools.remove(&pool);
        }
        g.current_pools.retain(|_, p| *p != pool);
        Ok(())
    }

    /// `cuMemPoolTrimTo`: release unused memory until at most `keep` bytes
    /// stay reserved.
    pub fn pool_trim(&self, pool: u64, keep: u64) -> R {
        let mut g = self.lock();
        let p = g
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.shrink_pool(p, keep);
        Ok(())
    }

    /// `cuMemPoolSetAccess`: `(location type, id, flags)` per device. The
    /// owning device always reads and writes its pool.
    pub fn pool_set_access(&self, pool: u64, locs: &[(u32, i32, u32)]) -> R {
        const DEVICE: u32 = 1;
        // CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ, _READWRITE.
        const FLAGS: [u32; 3] = [0, 1, 3];
        let mut want = Vec::with_capacity(locs.len());
        for &(ty, id, flags) in locs {
            if ty != DEVICE || !FLAGS.contains(&flags) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let d = self
                .device(id)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            want.push((d, flags));
        }
        let mut g = self.lock();
        let p = Self::pool_mut(&mut g, pool)?;
        if want.iter().any(|(d, f)| !p.host && *d == p.dev && *f != 3) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // All or nothing: validated above, applied here.
        for (d, f) in want {
            if p.host || d != p.dev {
                p.access.insert(d, f);
            }
        }
        Ok(())
    }

    /// `cuMemPoolGetAccess` from a device, or the CPU for a host pool.
    pub fn pool_get_access(&self, pool: u64, ty: u32, id: i32) -> R<u32> {
        const DEVICE: u32 = 1;
        const HOST_NUMA: u32 = 3;
        const READWRITE: u32 = 3;
        let d = match ty {
            DEVICE => Some(
                self.device(id)
                    .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
            ),
            HOST_NUMA if id == 0 => None,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let mut g = self.lock();
        let p = Self::pool_mut(&mut g, pool)?;
        Ok(match d {
            Some(d) if !p.host && d == p.dev => READWRITE,
            Some(d) => p.access.get(&d).copied().unwrap_or(0),
            // The CPU reaches a host pool by default (cuda.h).
            None if p.host => READWRITE,
            None => 0,
        })
    }

    /// A live pool (not destroyed), for the attribute entry points.
    pub fn pool_mut(g: &mut Inner, pool: u64) -> R<&mut Pool> {
        g.pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// Stream handle -> (ctx, device), resolving the default streams.
    pub fn stream_ctx(&self, stream: u64) -> R<(u64, usize)> {
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            return self.ctx();
        }
        let g = self.lock();
        let s = g
            .streams
            .get(&stream)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let c = g
            .ctxs
            .get(&s.ctx)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        Ok((s.ctx, c.dev))
    }

    /// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync`: reuse the pool's unused
    /// memory first; the pool grows (and the device is charged) only by
    /// what is missing.
    pub fn pool_alloc(&self, size: u64, pool: Option<u64>, stream: u64) -> R<u64> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, sdev) = self.stream_ctx(stream)?;
        let pool = match pool {
            Some(p) => p,
            None => self.current_pool_of(sdev)?,
        };
        let charged = size
            .checked_next_multiple_of(GRANULARITY)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let mut g = self.lock();
        let (dev, host) = {
            let pl = Self::pool_mut(&mut g, pool)?;
            (pl.dev, pl.host)
        };
        if let Some(&graph) = g.captures.get(&stream) {
            // Captured: a graph memory node, made when the graph runs it.
            if host {
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
            let dptr = g.va(size, GRANULARITY, false)?;
            Self::add_node(&mut g, graph, GraphNode::MemAlloc { dptr, size, dev });
            return Ok(dptr);
        }
        let pl = Self::pool_mut(&mut g, pool)?;
        let grow = charged.saturating_sub(pl.unused());
        if pl.max_size != 0 && pl.reserved + grow > pl.max_size {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // Host-located: real host memory the CPU may use, no device memory.
        let (p, backing) = if host {
            let map = anon(size)?;
            (map.as_mut_ptr() as u64, Some(Arc::new(map)))
        } else {
            // Under the lock: two threads must not both count on the same
            // unused memory.
            self.m.reserve(dev, grow).map_err(machine_err)?;
            match g.va(size, 512, false) {
                Ok(p) => (p, None),
                Err(e) => {
                    self.m.unreserve(dev, grow);
                    return Err(e);
                }
            }
        };
        let pl = Self::pool_mut(&mut g, pool)?;
        pl.reserved += grow;
        pl.reserved_high = pl.reserved_high.max(pl.reserved);
        pl.busy += charged;
        pl.used += size;
        pl.used_high = pl.used_high.max(pl.used);
        g.allocs.insert(
            p,
            Alloc {
                dev,
                ctx,
                size,
                charged,
                kind: AllocKind::Pool(pool, backing),
                backing: None,
                ipc: None,
            },
        );
        Ok(p)
    }

    pub fn pool_free(&self, p: u64, stream: u64) -> R {
        self.stream_ctx(stream)?;
        let mut g = self.lock();
        if let Some(&graph) = g.captures.get(&stream) {
            // Captured: a free node of a graph allocation.
            if !crate::query::is_graph_alloc(&g, p) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            Self::add_node(&mut g, graph, GraphNode::MemFree { dptr: p });
            return Ok(());
        }
        match g.allocs.get(&p) {
            // Graph allocations may be freed in stream order too (cuda.h).
            Some(a) if matches!(a.kind, AllocKind::Pool(..)) || g.graph_live.contains_key(&p) => {}
            Some(_) | None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        if let Some(a) = g.allocs.remove(&p) {
            self.free_alloc(&mut g, p, &a);
        }
        Ok(())
    }

    // ---- VMM ----

    pub fn vmm_create(&self, size: u64, loc_type: u32, loc_id: i32, alloc_type: u32) -> R<u64> {
        if alloc_type != 1 || loc_type != 1 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let dev = self
            .device(loc_id)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(T_VMM);
        g.vmm.insert(
            id,
            Vmm {
                dev,
                size,
                maps: 0,
                released: false,
                backing: None,
            },
        );
        Ok(id)
    }

    pub fn vmm_release(&self, h: u64) -> R {
        let mut g = self.lock();
        let v = g
            .vmm
            .get_mut(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if v.released {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        v.released = true;
        if v.maps == 0 {
            let v = g.vmm.remove(&h).expect("present");
            self.m.unreserve(v.dev, v.size);
        }
        Ok(())
    }

    pub fn va_reserve(&self, size: u64, align: u64) -> R<u64> {
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || (align != 0 && !align.is_power_of_two())
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let p = g.va(size, align.max(GRANULARITY), false)?;
        g.reservations.insert(p, size);
        Ok(p)
    }

    pub fn va_free(&self, p: u64, size: u64) -> R {
        let mut g = self.lock();
        match g.reservations.get(&p) {
            Some(s) if *s == size => {}
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        if g.mappings.range(p..p + size).next().is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        g.reservations.remove(&p);
        Ok(())
    }

    fn in_reservation(g: &Inner, p: u64, size: u64) -> bool {
        g.reservations
            .range(..=p)
            .next_back()
            .is_some_and(|(s, l)| p + size <= s + l)
    }

    pub fn vmm_map(&self, p: u64, size: u64, offset: u64, h: u64) -> R {
        let mut g = self.lock();
        let v = g.vmm.get(&h).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if v.released || size == 0 || offset.checked_add(size).is_none_or(|e| e > v.size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !Self::in_reservation(&g, p, size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let clash = g
            .mappings
            .range(..p + size)
            .next_back()
            .is_some_and(|(s, (l, _, _))| s + l > p);
        if clash {
            return Err(CUresult::CUDA_ERROR_ALREADY_MAPPED);
        }
        g.mappings.insert(p, (size, h, offset));
        if let Some(v) = g.vmm.get_mut(&h) {
            v.maps += 1;
        }
        Ok(())
    }

    pub fn vmm_unmap(&self, p: u64, size: u64) -> R {
        let mut g = self.lock();
        let hit: Vec<u64> = g
            .mappings
            .range(p..p.saturating_add(size))
            .map(|(k, _)| *k)
            .collect();
        if hit.is_empty() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for k in hit {
            if let Some((_, h, _)) = g.mappings.remove(&k) {
                if let Some(v) = g.vmm.get_mut(&h) {
                    v.maps = v.maps.saturating_sub(1);
                    if v.released && v.maps == 0 {
                        let v = g.vmm.remove(&h).expect("present");
                        self.m.unreserve(v.dev, v.size);
                    }
                }
            }
        }
        Ok(())
    }

    pub fn vmm_set_access(&self, p: u64, size: u64, locs: &[(u32, i32, u32)]) -> R {
        if locs.is_empty() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for (ty, id, flags) in locs {
            if *ty != 1 || *flags > 3 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            self.device(*id)?;
        }
        let g = self.lock();
        let mapped: u64 = g
            .mappings
            .range(p..p.saturating_add(size))
            .map(|(_, (l, _, _))| *l)
            .sum();
        if mapped < size {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    // ---- arrays ----

    pub fn array_create(&self, size: Option<u64>, tag: u64) -> R<u64> {
        let size = size
            .filter(|s| *s > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (ctx, dev) = self.ctx()?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(tag);
        g.arrays.insert(id, (dev, size, ctx));
        Ok(id)
    }

    pub fn array_destroy(&self, h: u64, tag: u64) -> R {
        if handle_kind(h) != Some(tag) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let (dev, size, _) = self
            .lock()
            .arrays
            .remove(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        self.m.unreserve(dev, size);
        Ok(())
    }

    // ---- modules and launches ----

    pub fn module_load(&self, image: &str) -> R<u64> {
        self.ctx()?;
        let kernels = parse_image(image).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
        let open = kernels.iter().any(|k| k.name == "*");
        let m = self.module_of(kernels.into_iter().filter(|k| k.name != "*").collect())?;
        if open {
            self.lock().open_modules.insert(m);
        }
        Ok(m)
    }

    /// A module offering `kernels`.
    pub fn module_of(&self, kernels: Vec<Kernel>) -> R<u64> {
        let mut g = self.lock();
        let mut fids = Vec::new();
        for k in kernels {
            let f = g.id(T_FUNC);
            g.funcs.insert(f, k);
            fids.push(f);
        }
        let m = g.id(T_MODULE);
        g.modules.insert(m, fids);
        Ok(m)
    }

    pub fn module_unload(&self, m: u64) -> R {
        let mut g = self.lock();
        let fids = g
            .modules
            .remove(&m)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for f in fids {
            g.funcs.remove(&f);
        }
        Ok(())
    }

    pub fn module_function(&self, m: u64, name: &str) -> R<u64> {
        let g = self.lock();
        let fids = g
            .modules
            .get(&m)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(f) = fids
            .iter()
            .copied()
            .find(|f| g.funcs.get(f).is_some_and(|k| k.name == name))
        {
            return Ok(f);
        }
        if !g.open_modules.contains(&m) {
            return Err(CUresult::CUDA_ERROR_NOT_FOUND);
        }
        // An open module (contents unreadable): every kernel it is asked
        // for takes the image per-block time.
        drop(g);
        let block = self.m.header().image_block_ns;
        let mut g = self.lock();
        let f = g.id(T_FUNC);
        g.funcs.insert(
            f,
            Kernel {
                name: name.to_string(),
                block_ns: Some(block),
            },
        );
        if let Some(v) = g.modules.get_mut(&m) {
            v.push(f);
        }
        Ok(f)
    }

    /// Per-block time of `f` given its first parameter (if the kernel
    /// takes its time from there).
    pub fn block_ns(&self, f: u64, param_ns: Option<u64>) -> R<u64> {
        let g = self.lock();
        let k = g.funcs.get(&f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(k.block_ns.or(param_ns).unwrap_or(0))
    }

    pub fn takes_time_param(&self, f: u64) -> bool {
        self.lock()
            .funcs
            .get(&f)
            .is_some_and(|k| k.block_ns.is_none())
    }

    /// Queue a launch of `f` on `stream` (`per_thread`: the per-thread
    /// default stream for handle 0). `max_blocks` caps the grid
    /// (cooperative launches).
    pub fn launch(&self, k: &KernelNode, stream: u64, per_thread: bool, cooperative: bool) -> R {
        let KernelNode {
            func: f,
            grid,
            block,
            param_ns,
        } = *k;
        if grid.contains(&0) || block.contains(&0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
        if threads > 1024 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let block_ns = self.block_ns(f, param_ns)?;
        let (ctx, dev) = self.stream_ctx(stream)?;
        let d = self.m.device(dev).map_err(machine_err)?;
        let sms = u64::from(d.sms.max(1));
        let blocks = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
        if cooperative {
            let per_sm = (u64::from(d.max_threads_per_sm) / threads.max(1)).clamp(1, 32);
            if blocks > sms * per_sm {
                return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
            }
        }
        let waves = blocks.div_ceil(sms);
        let duration = waves.saturating_mul(block_ns);
        let pt = per_thread && stream == 0 || stream == CU_STREAM_PER_THREAD;
        {
            // A captured launch does not run: it becomes a node of the
            // capture's graph.
            let mut g = self.lock();
            if let Some(&graph) = g.captures.get(&stream) {
                Self::add_node(&mut g, graph, GraphNode::Kernel(*k));
                return Ok(());
            }
        }
        // Validates the stream; the process's queue keeps launch order.
        self.stream_seq(ctx, stream, pt)?;
        let seq = self.m.launch(dev, duration).map_err(machine_err)?;
        self.set_stream_seq(ctx, stream, pt, seq);
        Ok(())
    }

    /// Last work queued on a stream.
    pub fn stream_seq(&self, ctx: u64, stream: u64, per_thread: bool) -> R<u64> {
        let g = self.lock();
        if per_thread {
            return Ok(g.pt_streams.get(&(thread_id(), ctx)).copied().unwrap_or(0));
        }
        if stream == 0 || stream == CU_STREAM_LEGACY {
            return Ok(g.ctxs.get(&ctx).map(|c| c.default_seq).unwrap_or(0));
        }
        Ok(g.streams
            .get(&stream)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .last_seq)
    }

    pub fn set_stream_seq(&self, ctx: u64, stream: u64, per_thread: bool, end: u64) {
        let mut g = self.lock();
        if let Some(c) = g.ctxs.get_mut(&ctx) {
            c.last_seq = c.last_seq.max(end);
            if !per_thread && (stream == 0 || stream == CU_STREAM_LEGACY) {
                c.default_seq = c.default_seq.max(end);
            }
        }
        if per_thread {
            let e = g.pt_streams.entry((thread_id(), ctx)).or_insert(0);
            *e = (*e).max(end);
        } else if let Some(s) = g.streams.get_mut(&stream) {
            s.last_seq = s.last_seq.max(end);
        }
    }

    // ---- streams and events ----

    pub fn stream_create(&self, flags: u32, priority: i32) -> R<u64> {
        if flags & !1 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, _) = self.ctx()?;
        let mut g = self.lock();
        let id = g.id(T_STREAM);
        g.streams.insert(
            id,
            Stream {
                ctx,
                flags,
                priority: priority.clamp(-5, 0),
                last_seq: 0,
            },
        );
        Ok(id)
    }

    pub fn stream_destroy(&self, s: u64) -> R {
        self.lock()
            .streams
            .remove(&s)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    fn resolve_seq(&self, stream: u64, per_thread: bool) -> R<u64> {
        let (ctx, _) = self.stream_ctx(stream)?;
        let pt = per_thread && stream == 0 || stream == CU_STREAM_PER_THREAD;
        self.stream_seq(ctx, stream, pt)
    }

    pub fn stream_synchronize(&self, s: u64, per_thread: bool) -> R {
        self.m
            .wait(self.resolve_seq(s, per_thread)?)
            .map_err(machine_err)?;
        self.release_pools();
        Ok(())
    }

    pub fn stream_query(&self, s: u64, per_thread: bool) -> R {
        if !self.m.done(self.resolve_seq(s, per_thread)?) {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    }

    pub fn stream_wait_event(&self, s: u64, e: u64, per_thread: bool) -> R {
        let (ctx, _) = self.stream_ctx(s)?;
        let (mark, remote) = {
            let g = self.lock();
            let ev = g
                .events
                .get(&e)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (ev.mark, ev.remote)
        };
        if let Some((t, n)) = remote {
            // Another process's work cannot join this one's queue: wait
            // for it here, so everything queued afterwards follows it.
            return self.m.ipc_event_wait(t, n).map_err(machine_err);
        }
        let seq = mark.map(|m| m.0).unwrap_or(0);
        // The process's queue already runs launches in order; the stream
        // only has to remember what its synchronization now covers.
        let pt = per_thread && s == 0 || s == CU_STREAM_PER_THREAD;
        self.set_stream_seq(ctx, s, pt, seq);
        Ok(())
    }

    pub fn event_create(&self, flags: u32) -> R<u64> {
        if flags & !0xf != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let mut g = self.lock();
        let id = g.id(T_EVENT);
        g.events.insert(
            id,
            Event {
                flags,
                mark: None,
                ipc: None,
                remote: None,
                captured: false,
            },
        );
        Ok(id)
    }

    pub fn event_record(&self, e: u64, s: u64, per_thread: bool) -> R {
        {
            // Recorded into a capture: part of the graph, not recorded now.
            let mut g = self.lock();
            let capturing = g.captures.contains_key(&s);
            let ev = g
                .events
                .get_mut(&e)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            ev.captured = capturing;
            if capturing {
                return Ok(());
            }
        }
        let seq = self.resolve_seq(s, per_thread)?;
        // Nothing pending before it: the event happens now.
        let at = self.m.done(seq).then(now_ns);
        let mut g = self.lock();
        let ev = g
            .events
            .get_mut(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if ev.remote.is_some() {
            // An opened IPC event is only waited on here.
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        ev.mark = Some((if at.is_some() { 0 } else { seq }, at));
        if let Some((t, n)) = ev.ipc {
            drop(g);
            // Importers wait for what this record waits for.
            self.m.ipc_event_mark(t, n, seq).map_err(machine_err)?;
        }
        Ok(())
    }

    fn event_remote(&self, e: u64) -> R<Option<(u32, u32)>> {
        Ok(self
            .lock()
            .events
            .get(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .remote)
    }

    fn event_mark(&self, e: u64) -> R<Option<(u64, Option<u64>)>> {
        Ok(self
            .lock()
            .events
            .get(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
            .mark)
    }

    pub fn event_synchronize(&self, e: u64) -> R {
        self.event_captured(e)?;
        if let Some((t, n)) = self.event_remote(e)? {
            return self.m.ipc_event_wait(t, n).map_err(machine_err);
        }
        if let Some((seq, _)) = self.event_mark(e)? {
            self.m.wait(seq).map_err(machine_err)?;
        }
        self.release_pools();
        Ok(())
    }

    fn event_captured(&self, e: u64) -> R {
        match self.lock().events.get(&e) {
            Some(ev) if ev.captured => Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
            _ => Ok(()),
        }
    }

    pub fn event_query(&self, e: u64) -> R {
        self.event_captured(e)?;
        if let Some((t, n)) = self.event_remote(e)? {
            return if self.m.ipc_event_done(t, n) {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_NOT_READY)
            };
        }
        match self.event_mark(e)? {
            Some((seq, _)) if !self.m.done(seq) => Err(CUresult::CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    /// When a recorded event happened, once it has.
    fn event_time(&self, e: u64) -> R<u64> {
        let ev = self
            .lock()
            .events
            .get(&e)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        // CU_EVENT_DISABLE_TIMING, or never recorded.
        let Some((seq, at)) = ev.mark.filter(|_| ev.flags & 2 == 0) else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        if let Some(t) = at {
            return Ok(t);
        }
        if !self.m.done(seq) {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        // The queue slot may have been reused long since: then "now" is
        // the best bound left.
        let t = self.m.done_time(seq).unwrap_or_else(now_ns);
        if let Some(ev) = self.lock().events.get_mut(&e) {
            ev.mark = Some((seq, Some(t)));
        }
        Ok(t)
    }

    pub fn event_elapsed(&self, a: u64, b: u64) -> R<f32> {
        self.event_captured(a)?;
        self.event_captured(b)?;
        let (ta, tb) = (self.event_time(a)?, self.event_time(b)?);
        Ok((tb as f64 - ta as f64) as f32 / 1e6)
    }

    pub fn event_destroy(&self, e: u64) -> R {
        self.lock()
            .events
            .remove(&e)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    // ---- graphs ----

    pub fn graph_create(&self, flags: u32) -> R<u64> {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let id = g.id(T_GRAPH);
        g.graphs.insert(id, Vec::new());
        Ok(id)
    }

    pub fn graph_add_kernel(&self, graph: u64, deps: &[u64], node: KernelNode) -> R<u64> {
        let mut g = self.lock();
        if !g.funcs.contains_key(&node.func) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if node.grid.contains(&0) || node.block.contains(&0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !g.graphs.contains_key(&graph) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if deps.iter().any(|d| g.nodes.get(d) != Some(&graph)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Self::add_node(&mut g, graph, GraphNode::Kernel(node)))
    }

    /// Append `node` to `graph` (checked by the caller) and name it.
    pub fn add_node(g: &mut Inner, graph: u64, node: GraphNode) -> u64 {
        let id = g.id(T_NODE);
        let nodes = g.graphs.entry(graph).or_default();
        nodes.push(node);
        let idx = nodes.len() - 1;
        g.nodes.insert(id, graph);
        g.node_index.insert(id, (graph, idx));
        id
    }

    /// `cuGraphInstantiate*` with `flags` (`CUgraphInstantiate_flags`).
    pub fn graph_instantiate(&self, graph: u64, flags: u64) -> R<u64> {
        let mut g = self.lock();
        let nodes = g
            .graphs
            .get(&graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .clone();
        let id = g.id(T_EXEC);
        g.execs.insert(id, nodes);
        if flags & vgpu_cuda_abi::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0 {
            g.exec_auto_free.insert(id);
        }
        Ok(id)
    }

    /// `cuGraphUpload`: this driver backs graph memory when a launch
    /// reaches the node, so an upload only checks its arguments.
    pub fn graph_upload(&self, exec: u64, stream: u64) -> R {
        self.stream_ctx(stream)?;
        if !self.lock().execs.contains_key(&exec) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    pub fn graph_launch(&self, exec: u64, stream: u64, per_thread: bool) -> R {
        let (nodes, auto_free) = {
            let g = self.lock();
            let nodes = g
                .execs
                .get(&exec)
                .cloned()
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            (nodes, g.exec_auto_free.contains(&exec))
        };
        // An allocation of an earlier launch still live: freed first with
        // AUTO_FREE_ON_LAUNCH, else the launch fails before running
        // anything (cuda.h, cuGraphLaunch).
        for n in &nodes {
            if let GraphNode::MemAlloc { dptr, .. } = *n {
                if self.lock().graph_live.contains_key(&dptr) {
                    if !auto_free {
                        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                    }
                    self.graph_free(dptr)?;
                }
            }
        }
        for n in nodes {
            match n {
                GraphNode::Kernel(k) => self.launch(&k, stream, per_thread, false)?,
                GraphNode::MemAlloc { dptr, size, dev } => self.graph_alloc(dptr, size, dev)?,
                GraphNode::MemFree { dptr } => self.graph_free(dptr)?,
            }
        }
        Ok(())
    }

    /// `cuStreamBeginCapture*`: work queued on `stream` (an explicit
    /// stream; the default streams are refused, as the driver refuses the
    /// legacy one) is appended to a new graph until `end_capture`.
    pub fn begin_capture(&self, stream: u64) -> R {
        self.begin_capture_into(stream, None)
    }

    /// `cuStreamBeginCaptureToGraph*`: as `begin_capture`, appending to an
    /// existing graph.
    pub fn begin_capture_into(&self, stream: u64, into: Option<u64>) -> R {
        if stream == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        self.stream_ctx(stream)?;
        let mut g = self.lock();
        if g.captures.contains_key(&stream) {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let graph = match into {
            Some(gr) if g.graphs.contains_key(&gr) => gr,
            Some(_) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            None => {
                let gr = g.id(T_GRAPH);
                g.graphs.insert(gr, Vec::new());
                gr
            }
        };
        g.captures.insert(stream, graph);
        Ok(())
    }

    /// `cuStreamEndCapture*`: the captured graph.
    pub fn end_capture(&self, stream: u64) -> R<u64> {
        self.lock()
            .captures
            .remove(&stream)
            .ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)
    }

    /// `cuStreamIsCapturing*`.
    pub fn is_capturing(&self, stream: u64) -> R<bool> {
        if stream != 0 && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD {
            self.stream_ctx(stream)?;
        }
        Ok(self.lock().captures.contains_key(&stream))
    }

    pub fn graph_exec_destroy(&self, exec: u64) -> R {
        let mut g = self.lock();
        g.exec_auto_free.remove(&exec);
        g.execs
            .remove(&exec)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    pub fn graph_destroy(&self, graph: u64) -> R {
        let mut g = self.lock();
        g.graphs
            .remove(&graph)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        g.nodes.retain(|_, gr| *gr != graph);
        g.node_index.retain(|_, (gr, _)| *gr != graph);
        Ok(())
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

/// Parse a simulated module image (see docs/sim.md):
///
/// ```text
/// vgpu-sim-module v1
/// kernel spin                # per-block ns from the first kernel parameter (u64)
/// kernel busy block_us=500   # fixed per-block time
/// ```
///
/// or the one-line form `vgpu-sim-kernel name=busy block_us=500`.
pub fn parse_image(text: &str) -> Option<Vec<Kernel>> {
    let mut lines = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty());
    let first = lines.next()?;
    let mut out = Vec::new();
    if first == "vgpu-sim-module v1" {
        for l in lines {
            let mut w = l.split_whitespace();
            if w.next()? != "kernel" {
                return None;
            }
            let name = w.next()?.to_string();
            let block_ns = time_kv(w)?;
            out.push(Kernel { name, block_ns });
        }
    } else if let Some(rest) = first.strip_prefix("vgpu-sim-kernel ") {
        for l in std::iter::once(rest)
            .chain(lines.map(|l| l.strip_prefix("vgpu-sim-kernel ").unwrap_or("\u{0}")))
        {
            let mut name = None;
            let mut rest_kv = Vec::new();
            for kv in l.split_whitespace() {
                match kv.strip_prefix("name=") {
                    Some(n) if !n.is_empty() => name = Some(n.to_string()),
                    _ => rest_kv.push(kv),
                }
            }
            out.push(Kernel {
                name: name?,
                block_ns: time_kv(rest_kv.into_iter())?,
            });
        }
    } else {
        return None;
    }
    (!out.is_empty()).then_some(out)
}

/// `block_us=N` / `block_ns=N` (at most one); `Some(None)` when absent.
fn time_kv<'a>(kvs: impl Iterator<Item = &'a str>) -> Option<Option<u64>> {
    let mut t = None;
    for kv in kvs {
        let (k, v) = kv.split_once('=')?;
        let n: f64 = v
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
        let ns = match k {
            "block_us" => n * 1e3,
            "block_ns" => n,
            "block_ms" => n * 1e6,
            _ => return None,
        };
        if t.is_some() {
            return None;
        }
        t = Some(ns.round() as u64);
    }
    Some(t)
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

    #[test]
    fn images() {
        let k = parse_image("vgpu-sim-module v1\nkernel spin\nkernel busy block_us=500\n").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "spin");
        assert_eq!(k[0].block_ns, None);
        assert_eq!(k[1].block_ns, Some(500_000));
        let k = parse_image("vgpu-sim-kernel name=busy block_us=2.5").unwrap();
        assert_eq!((k[0].name.as_str(), k[0].block_ns), ("busy", Some(2500)));
        assert!(parse_image("definitely not a module").is_none());
        assert!(parse_image("vgpu-sim-module v1\n").is_none());
        assert!(parse_image("vgpu-sim-module v1\nkernel x block_us=-1\n").is_none());
        assert!(parse_image("vgpu-sim-module v1\nkernel x speed=3\n").is_none());
        assert!(parse_image("vgpu-sim-kernel block_us=3").is_none());
    }
}
