//! The bytes of simulated device memory, in safe Rust: where a pointer's
//! bytes live (a device allocation's sparse backing, a VMM handle's, or
//! host memory the CPU reaches), ordering of copies with the kernel model,
//! pointer attributes, and IPC of memory and events between processes.
//! The host side of a copy (raw C pointers) is `ffi`'s.
use std::sync::Arc;

use vgpu_cuda_abi::CUresult;
use vgpu_sim::backing::Backing;

use crate::driver::{machine_err, AllocKind, Driver, Inner, R, VA32_BASE, VA_BASE};

/// Where bytes at a pointer live.
#[derive(Clone, Debug)]
pub enum Target {
    /// Memory the CPU reaches at this address (host, managed, host pools).
    Host(usize),
    /// Device memory: a backing and the offset in it.
    Device(Arc<Backing>, u64),
}

/// What an entry point says a pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// A host pointer (`cuMemcpyHtoD`'s source).
    Host,
    /// A device pointer (`CUdeviceptr`).
    Device,
    /// Either (`cuMemcpy`, unified addressing).
    Any,
}

/// What `cuPointerGetAttribute` reports about an allocation.
#[derive(Clone, Debug)]
pub struct PtrInfo {
    pub ctx: u64,
    pub dev: usize,
    pub base: u64,
    pub size: u64,
    /// CU_MEMORYTYPE_HOST (1) or _DEVICE (2).
    pub memory_type: u32,
    pub managed: bool,
    pub host_ptr: Option<u64>,
    pub pool: Option<u64>,
    pub ipc_capable: bool,
    /// Process-wide unique id (the allocation's base).
    pub buffer_id: u64,
}

const IPC_MAGIC: &[u8; 8] = b"VGPUIPCM";
const IPC_EVENT_MAGIC: &[u8; 8] = b"VGPUIPCE";

fn err(e: vgpu_sim::backing::BackingError) -> CUresult {
    vgpu_sim::log::log(vgpu_sim::log::ERROR, &crate::driver::chain(&e));
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

fn within(start: u64, size: u64, ptr: u64, len: u64) -> bool {
    ptr >= start
        && ptr
            .checked_add(len)
            .is_some_and(|e| e <= start + size.max(1))
}

/// Span of the process's device-memory backing: the 32-bit range, then
/// the 64-bit one (2^56 bytes of addresses; sparse, so free).
const DEV_MEM_SPAN: u64 = 1 << 56;
/// Where the 64-bit device range starts in the backing.
const VA64_IN_BACKING: u64 = 1 << 32;

/// Offset of device address `p` in the process's device-memory backing.
pub fn va_offset(p: u64) -> Option<u64> {
    if p < VA64_IN_BACKING {
        return Some(p);
    }
    let off = p.checked_sub(VA_BASE)?.checked_add(VA64_IN_BACKING)?;
    (off < DEV_MEM_SPAN).then_some(off)
}

/// The most a 64-bit device address may be (what the backing spans).
pub const VA_END: u64 = VA_BASE + DEV_MEM_SPAN - VA64_IN_BACKING;

/// A freed allocation's bytes go back (a hole in the backing), so freed
/// device memory costs nothing and a later reader of the range sees zeros.
pub fn release_bytes(g: &mut Inner, p: u64, a: &crate::driver::Alloc) {
    if !matches!(a.kind, AllocKind::Device | AllocKind::Pool(_, None)) {
        return;
    }
    if let (Some(b), Some(off)) = (&g.dev_mem, va_offset(p)) {
        let _ = b.fill(off, &[0], a.size);
    }
}

impl Inner {
    /// This process's device-memory backing, made at the first access.
    fn process_backing(&mut self) -> R<Arc<Backing>> {
        if let Some(b) = &self.dev_mem {
            return Ok(b.clone());
        }
        let b = Arc::new(Backing::new(DEV_MEM_SPAN).map_err(err)?);
        self.dev_mem = Some(b.clone());
        Ok(b)
    }

    /// A pointer inside the address ranges this driver hands out for
    /// device memory (so never host memory to dereference).
    fn in_device_va(&self, p: u64) -> bool {
        (VA_BASE..self.next_va).contains(&p) || (VA32_BASE..self.next_va32).contains(&p)
    }

    /// Device-side target of `[ptr, ptr+len)`, if an allocation or a VMM
    /// mapping holds it; backings are made here, at the first access.
    fn device_target(&mut self, ptr: u64, len: u64) -> Option<R<Target>> {
        if let Some((&start, a)) = self.allocs.range_mut(..=ptr).next_back() {
            if ptr < start + a.size.max(1) {
                if !within(start, a.size, ptr, len) {
                    return Some(Err(CUresult::CUDA_ERROR_INVALID_VALUE));
                }
                return Some(match &a.kind {
                    AllocKind::Managed(_) | AllocKind::Pool(_, Some(_)) => {
                        Ok(Target::Host(ptr as usize))
                    }
                    AllocKind::Ipc => {
                        let (b, off) = a.backing.clone()?;
                        Ok(Target::Device(b, off + (ptr - start)))
                    }
                    AllocKind::Device | AllocKind::Pool(_, None) => {
                        let b = match self.process_backing() {
                            Ok(b) => b,
                            Err(e) => return Some(Err(e)),
                        };
                        Ok(Target::Device(b, va_offset(ptr)?))
                    }
                });
            }
        }
        if let Some((&start, &(size, h, off))) = self.mappings.range(..=ptr).next_back() {
            if ptr < start + size {
                if !within(start, size, ptr, len) {
                    return Some(Err(CUresult::CUDA_ERROR_INVALID_VALUE));
                }
                let v = self.vmm.get_mut(&h)?;
                if v.backing.is_none() {
                    match Backing::new(v.size) {
                        Ok(b) => v.backing = Some(Arc::new(b)),
                        Err(e) => return Some(Err(err(e))),
                    }
                }
                let b = v.backing.clone()?;
                return Some(Ok(Target::Device(b, off + (ptr - start))));
            }
        }
        None
    }
}

impl Driver {
    /// Where `len` bytes at `ptr` live, as the entry point's `side` says
    /// the pointer is. Unknown pointers are host memory (pageable) unless
    /// they lie in the device address space or must be device pointers.
    pub fn target(&self, ptr: u64, len: u64, side: Side) -> R<Target> {
        if ptr == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        if let Some(t) = g.device_target(ptr, len) {
            let t = t?;
            return match (side, &t) {
                (Side::Host, Target::Device(..)) => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
                _ => Ok(t),
            };
        }
        let host_known = g.host.keys().any(|&h| {
            g.host
                .get(&h)
                .is_some_and(|m| within(h as u64, m.len() as u64, ptr, len))
        }) || g
            .registered
            .range(..=(ptr as usize))
            .next_back()
            .is_some_and(|(&s, &l)| within(s as u64, l as u64, ptr, len));
        if host_known {
            return Ok(Target::Host(ptr as usize));
        }
        if side == Side::Device || g.in_device_va(ptr) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        ptr.checked_add(len)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(Target::Host(ptr as usize))
    }

    /// A synchronous copy or set: after all work queued in the current
    /// context (what the legacy default stream waits for, and more).
    pub fn before_sync_op(&self) -> R {
        let (c, _) = self.ctx()?;
        let seq = self.lock().ctxs.get(&c).map(|c| c.last_seq).unwrap_or(0);
        self.m.wait(seq).map_err(machine_err)
    }

    /// An asynchronous copy or set on `stream`: after the work queued on
    /// it. (The sim performs it then, which CUDA allows: such a call "may
    /// be synchronous".)
    pub fn before_stream_op(&self, stream: u64, per_thread: bool) -> R {
        let (ctx, _) = self.stream_ctx(stream)?;
        let pt = per_thread && stream == 0 || stream == crate::driver::CU_STREAM_PER_THREAD;
        let seq = self.stream_seq(ctx, stream, pt)?;
        self.m.wait(seq).map_err(machine_err)
    }

    /// The allocation holding `ptr`, for pointer attributes and
    /// `cuMemGetAddressRange`.
    pub fn ptr_info(&self, ptr: u64) -> Option<PtrInfo> {
        let g = self.lock();
        if let Some((&start, a)) = g.allocs.range(..=ptr).next_back() {
            if ptr < start + a.size.max(1) {
                let (memory_type, managed, host_ptr, pool) = match &a.kind {
                    AllocKind::Managed(_) => (2, true, Some(start), None),
                    AllocKind::Pool(p, Some(_)) => (1, false, Some(start), Some(*p)),
                    AllocKind::Pool(p, None) => (2, false, None, Some(*p)),
                    AllocKind::Device | AllocKind::Ipc => (2, false, None, None),
                };
                return Some(PtrInfo {
                    ctx: a.ctx,
                    dev: a.dev,
                    base: start,
                    size: a.size,
                    memory_type,
                    managed,
                    host_ptr,
                    pool,
                    ipc_capable: matches!(a.kind, AllocKind::Device),
                    buffer_id: start,
                });
            }
        }
        if let Some((&start, &(size, h, _))) = g.mappings.range(..=ptr).next_back() {
            if ptr < start + size {
                let dev = g.vmm.get(&h).map_or(0, |v| v.dev);
                return Some(PtrInfo {
                    ctx: 0,
                    dev,
                    base: start,
                    size,
                    memory_type: 2,
                    managed: false,
                    host_ptr: None,
                    pool: None,
                    ipc_capable: false,
                    buffer_id: start,
                });
            }
        }
        let host = g
            .host
            .iter()
            .map(|(&h, m)| (h as u64, m.len() as u64))
            .chain(g.registered.iter().map(|(&s, &l)| (s as u64, l as u64)))
            .find(|&(s, l)| ptr >= s && ptr < s + l);
        host.map(|(s, l)| PtrInfo {
            ctx: crate::driver::current_ctx().unwrap_or(0),
            dev: self.visible.first().copied().unwrap_or(0),
            base: s,
            size: l,
            memory_type: 1,
            managed: false,
            host_ptr: Some(s),
            pool: None,
            ipc_capable: false,
            buffer_id: s,
        })
    }

    // ---- IPC ----

    /// `cuIpcGetMemHandle`: the 64-byte handle of the `cuMemAlloc`
    /// allocation holding `ptr`. The memory stays charged to this process.
    pub fn ipc_get_mem(&self, ptr: u64) -> R<[u8; 64]> {
        let mut g = self.lock();
        let (start, size) = match g.allocs.range(..=ptr).next_back() {
            Some((&s, a)) if ptr < s + a.size && matches!(a.kind, AllocKind::Device) => (s, a.size),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // The process's device memory is shared whole; the handle names
        // the allocation's place in it. Exported once per allocation.
        let backing = g.process_backing()?;
        let off = va_offset(start).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let a = g
            .allocs
            .get_mut(&start)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (token, nonce) = match a.ipc {
            Some(x) => x,
            None => {
                let x = self.m.ipc_export(&backing).map_err(machine_err)?;
                a.ipc = Some(x);
                x
            }
        };
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(IPC_MAGIC);
        h[8..12].copy_from_slice(&token.to_le_bytes());
        h[12..16].copy_from_slice(&nonce.to_le_bytes());
        h[16..24].copy_from_slice(&size.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..36].copy_from_slice(&self.m.host_pid.to_le_bytes());
        Ok(h)
    }

    /// `cuIpcOpenMemHandle`: map another process's allocation into the
    /// current context; not charged here (its owner pays for it).
    pub fn ipc_open_mem(&self, h: &[u8; 64], flags: u32) -> R<u64> {
        // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS is the only flag.
        if flags & !1 != 0 || &h[..8] != IPC_MAGIC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let dword = |i: usize| u64::from(word(i)) | (u64::from(word(i + 4)) << 32);
        let (token, nonce, size, off) = (word(8), word(12), dword(16), dword(24));
        let (ctx, dev) = self.ctx()?;
        let backing = self.m.ipc_open(token, nonce).map_err(|e| {
            vgpu_sim::log::log(vgpu_sim::log::INFO, &crate::driver::chain(&e));
            CUresult::CUDA_ERROR_INVALID_HANDLE
        })?;
        if off.checked_add(size).is_none_or(|e| e > backing.size()) || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let mut g = self.lock();
        let p = g.va(size, 512, false)?;
        g.allocs.insert(
            p,
            crate::driver::Alloc {
                dev,
                ctx,
                size,
                charged: 0,
                kind: AllocKind::Ipc,
                backing: Some((Arc::new(backing), off)),
                ipc: None,
            },
        );
        Ok(p)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close_mem(&self, ptr: u64) -> R {
        let mut g = self.lock();
        match g.allocs.get(&ptr) {
            Some(a) if matches!(a.kind, AllocKind::Ipc) => {
                g.allocs.remove(&ptr);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuIpcGetEventHandle`: only events made with
    /// `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`.
    pub fn ipc_get_event(&self, e: u64) -> R<[u8; 64]> {
        let mut g = self.lock();
        let ev = g
            .events
            .get_mut(&e)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if ev.flags & 0x6 != 0x6 || ev.remote.is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (token, nonce) = match ev.ipc {
            Some(x) => x,
            None => {
                let x = self.m.ipc_event_export().map_err(machine_err)?;
                // A record made before the export is what it waits for.
                let seq = ev.mark.map(|m| m.0).unwrap_or(0);
                self.m.ipc_event_mark(x.0, x.1, seq).map_err(machine_err)?;
                ev.ipc = Some(x);
                x
            }
        };
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(IPC_EVENT_MAGIC);
        h[8..12].copy_from_slice(&token.to_le_bytes());
        h[12..16].copy_from_slice(&nonce.to_le_bytes());
        Ok(h)
    }

    /// `cuIpcOpenEventHandle`: an event that happens when the exporter's
    /// does.
    pub fn ipc_open_event(&self, h: &[u8; 64]) -> R<u64> {
        if &h[..8] != IPC_EVENT_MAGIC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.ctx()?;
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let remote = (word(8), word(12));
        let mut g = self.lock();
        let id = g.id(crate::driver::T_EVENT);
        g.events.insert(
            id,
            crate::driver::Event {
                flags: 0x6,
                mark: None,
                ipc: None,
                remote: Some(remote),
            },
        );
        Ok(id)
    }
}
