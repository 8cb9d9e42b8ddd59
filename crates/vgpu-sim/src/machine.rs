//! A process's view of the simulated machine: what the simulated CUDA and
//! NVML libraries call. Memory admission, context counts, the cost model
//! (with cross-process serialization of context creation by `flock`), the
//! launch queue the daemon's scheduler runs, and NVML's view of the device
//! timelines.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use rustix::fs::{flock, FlockOperation};

use crate::backing::Backing;
use crate::client::{self, ClientError};
use crate::clock::{now_ns, spend};
use crate::daemon::{
    ctx_lock_path, state_path, CMD_ATTACH, CMD_IPC_EVENT_EXPORT, CMD_IPC_EVENT_MARK,
    CMD_IPC_EVENT_WAIT, CMD_IPC_EXPORT, CMD_IPC_FORGET, CMD_IPC_OPEN, CMD_REGISTER,
};
use crate::state::{DeviceRec, ProcRec, State, StateError, PROC_LIVE, QUEUE_LEN};

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("cannot reach the simulated machine")]
    Client(#[source] ClientError),
    #[error("cannot map the simulated machine's state")]
    State(#[source] StateError),
    #[error("this process's record on the simulated machine was released")]
    Released,
    #[error("the simulated machine's daemon is gone; queued kernels will never run")]
    DaemonGone,
    #[error("no such simulated device {0}")]
    NoDevice(usize),
    #[error("simulated device {device} out of memory: {requested} bytes requested, {free} free")]
    OutOfMemory {
        device: usize,
        requested: u64,
        free: u64,
    },
    #[error("IPC handle refused by the simulated machine")]
    Ipc(#[source] ClientError),
    #[error("IPC memory received from the simulated machine is unusable")]
    IpcBacking(#[source] crate::backing::BackingError),
    #[error("cannot take the context-creation lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// PCI identity of every simulated device (an A100-SXM4-80GB's ids).
pub const PCI_VENDOR_ID: u32 = 0x10de;
pub const PCI_DEVICE_ID: u32 = 0x20b2;
pub const PCI_SUBSYSTEM_ID: u32 = 0x147f_10de;

/// PCI bus of device `dev` (domain 0, device 0, function 0).
pub fn pci_bus(dev: usize) -> u32 {
    0x10 + dev as u32
}

/// `0000:10:00.0`, as CUDA prints a bus id.
pub fn pci_bus_id(dev: usize) -> String {
    format!("0000:{:02x}:00.0", pci_bus(dev))
}

/// What kind of context creation a cost is paid for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CtxCost {
    /// Primary-context retain that creates it (recorded in the retain log).
    PrimaryCold,
    /// `cuCtxCreate*`.
    Create,
}

pub struct Machine {
    pub dir: PathBuf,
    pub state: State,
    pub host_pid: u32,
    /// `getpid()` when registered (differs after fork).
    pub local_pid: u32,
    record: Option<(usize, u64)>,
    /// Serializes this process's threads as the queue's one producer.
    enqueue: Mutex<()>,
    /// When a launch last rang the scheduler.
    last_ring: std::sync::atomic::AtomicU64,
}

impl Machine {
    /// Connect to the machine in `sim_dir()`. `register` claims a process
    /// record (the CUDA driver); NVML only attaches.
    pub fn connect(register: bool) -> Result<Machine, MachineError> {
        Self::connect_dir(&client::sim_dir(), register)
    }

    pub fn connect_dir(dir: &Path, register: bool) -> Result<Machine, MachineError> {
        let cmd = if register { CMD_REGISTER } else { CMD_ATTACH };
        let (host_pid, rec) = client::request(dir, cmd).map_err(MachineError::Client)?;
        let state = State::open(&state_path(dir)).map_err(MachineError::State)?;
        let record = if register {
            let r = state.proc_rec(rec as usize);
            Some((rec as usize, r.generation.load(Ordering::Acquire)))
        } else {
            None
        };
        Ok(Machine {
            dir: dir.to_path_buf(),
            state,
            host_pid,
            local_pid: std::process::id(),
            record,
            enqueue: Mutex::new(()),
            last_ring: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn device_count(&self) -> usize {
        self.state.device_count()
    }

    pub fn device(&self, dev: usize) -> Result<&DeviceRec, MachineError> {
        self.state.device(dev).ok_or(MachineError::NoDevice(dev))
    }

    /// Device name as NVML and CUDA report it (says "simulated").
    pub fn device_name(&self, dev: usize) -> Result<String, MachineError> {
        let d = self.device(dev)?;
        let end = d.name.iter().position(|b| *b == 0).unwrap_or(d.name.len());
        Ok(String::from_utf8_lossy(&d.name[..end]).into_owned())
    }

    /// Stable per-device UUID bytes (derived from the index).
    pub fn device_uuid(dev: usize) -> [u8; 16] {
        // splitmix64 of the index: stable, and distinct from the first
        // digits on, so short UUID prefixes (CUDA_VISIBLE_DEVICES=GPU-1a2b)
        // pick one device as on real hardware.
        let mix = |mut z: u64| {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&mix(0x7667_7075_0000_0000 | dev as u64).to_be_bytes());
        u[8..].copy_from_slice(&mix(0x7369_6d00_0000_0000 | dev as u64).to_be_bytes());
        // RFC 4122 version/variant bits, so it prints like a real GPU UUID.
        u[6] = (u[6] & 0x0f) | 0x40;
        u[8] = (u[8] & 0x3f) | 0x80;
        u
    }

    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML prints it.
    pub fn device_uuid_string(dev: usize) -> String {
        let u = Self::device_uuid(dev);
        let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            h[0..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..16].concat()
        )
    }

    fn rec(&self) -> Result<&ProcRec, MachineError> {
        let (i, generation) = self.record.ok_or(MachineError::Released)?;
        let r = self.state.proc_rec(i);
        if r.state.load(Ordering::Acquire) != PROC_LIVE
            || r.generation.load(Ordering::Acquire) != generation
        {
            return Err(MachineError::Released);
        }
        Ok(r)
    }

    /// Device memory in use on `dev` by every process.
    pub fn used(&self, dev: usize) -> u64 {
        self.state.used_bytes(dev)
    }

    /// Admit `bytes` on `dev` for this process or fail with out-of-memory.
    /// The request goes into this process's record first, then the device
    /// total is checked: two racers for the last bytes can never both win.
    pub fn reserve(&self, dev: usize, bytes: u64) -> Result<(), MachineError> {
        let cap = self.device(dev)?.memory_bytes;
        let r = self.rec()?;
        let oom = |used: u64| MachineError::OutOfMemory {
            device: dev,
            requested: bytes,
            free: cap.saturating_sub(used),
        };
        // More than the device holds can never fit; refusing it before it
        // touches a counter keeps every counter representable (a
        // `cuMemAlloc(SIZE_MAX)` must not wrap them).
        if bytes > cap {
            return Err(oom(self.state.used_bytes(dev)));
        }
        // Checked: the record never wraps, whatever was in it before.
        if r.mem[dev]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_add(bytes))
            .is_err()
        {
            return Err(oom(self.state.used_bytes(dev)));
        }
        let used = self.state.used_bytes(dev);
        if used > cap {
            r.mem[dev].fetch_sub(bytes, Ordering::SeqCst);
            return Err(oom(used.saturating_sub(bytes)));
        }
        Ok(())
    }

    pub fn unreserve(&self, dev: usize, bytes: u64) {
        if let Ok(r) = self.rec() {
            let _ = r.mem[dev].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(bytes))
            });
        }
    }

    /// This process's memory on `dev`.
    pub fn my_mem(&self, dev: usize) -> u64 {
        self.rec()
            .map(|r| r.mem[dev].load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// A context on `dev` came (+1) or went (-1).
    pub fn count_context(&self, dev: usize, delta: i32) {
        if let Ok(r) = self.rec() {
            if delta >= 0 {
                r.contexts[dev].fetch_add(delta as u32, Ordering::SeqCst);
            } else {
                let d = delta.unsigned_abs();
                let _ = r.contexts[dev].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    Some(v.saturating_sub(d))
                });
            }
        }
    }

    /// Pay the cost of creating a context; serialized machine-wide by a
    /// `flock` (released by the kernel if the holder dies) when the cost
    /// model says the driver serializes context creation.
    pub fn context_creation(&self, dev: usize, kind: CtxCost) -> Result<(), MachineError> {
        let h = self.state.header();
        let cost = match kind {
            CtxCost::PrimaryCold => h.primary_retain_cold_ns,
            CtxCost::Create => h.ctx_create_ns,
        };
        let _lock = if h.serialize_context_creation != 0 {
            let path = ctx_lock_path(&self.dir);
            let lock_err = |source: std::io::Error| MachineError::Lock {
                path: path.clone(),
                source,
            };
            let f = File::options()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(lock_err)?;
            loop {
                match flock(&f, FlockOperation::LockExclusive) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(lock_err(e.into())),
                }
            }
            Some(f)
        } else {
            None
        };
        let start = now_ns();
        spend(cost);
        let end = now_ns();
        if kind == CtxCost::PrimaryCold {
            self.state
                .record_retain(self.host_pid, dev as u32, start, end);
        }
        // Dropping the file closes it, which releases the lock.
        Ok(())
    }

    pub fn header(&self) -> &crate::state::Header {
        self.state.header()
    }

    /// Queue a kernel occupying `dev` for `duration_ns` and return its
    /// sequence number. Blocks first while this process has
    /// `kernel_queue_depth` launches unfinished (a full pushbuffer). The
    /// daemon's scheduler runs queued kernels, time-slicing the device
    /// between processes; a process's kernels complete in launch order.
    pub fn launch(&self, dev: usize, duration_ns: u64) -> Result<u64, MachineError> {
        self.device(dev)?;
        let r = self.rec()?;
        let depth = (self.header().kernel_queue_depth as usize).clamp(1, QUEUE_LEN) as u64;
        // One producer per process: threads take turns.
        let _g = self.enqueue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let f = r.q_futex.load(Ordering::Acquire);
            let tail = r.q_tail.load(Ordering::Relaxed);
            if tail - r.q_done.load(Ordering::Acquire) < depth {
                break;
            }
            self.rec()?;
            self.ring_if_asleep();
            futex_wait(&r.q_futex, f, 50_000_000);
            if r.q_futex.load(Ordering::Acquire) == f && !self.daemon_alive() {
                return Err(MachineError::DaemonGone);
            }
        }
        let tail = r.q_tail.load(Ordering::Relaxed);
        let seq = tail + 1;
        let e = &r.queue[(tail % QUEUE_LEN as u64) as usize];
        e.seq.store(0, Ordering::Release);
        e.duration_ns.store(duration_ns, Ordering::Relaxed);
        e.launch_ns.store(now_ns(), Ordering::Relaxed);
        e.done_ns.store(0, Ordering::Relaxed);
        e.device.store(dev as u32, Ordering::Relaxed);
        e.seq.store(seq, Ordering::Release);
        r.q_tail.store(seq, Ordering::SeqCst);
        // Wake a sleeping scheduler, at most every 200 us from a launch
        // loop: it back-dates, so lateness costs no device time, and a
        // syscall per launch would dwarf a launch. Waiters always ring.
        let now = now_ns();
        if now.saturating_sub(self.last_ring.load(Ordering::Relaxed)) >= 200_000
            && self.ring_if_asleep()
        {
            self.last_ring.store(now, Ordering::Relaxed);
        }
        Ok(seq)
    }

    /// Ring the scheduler's doorbell if it sleeps; true if it rang.
    fn ring_if_asleep(&self) -> bool {
        let h = self.header();
        // SeqCst pairs with the scheduler's store of `sched_sleeping` before
        // its scan: either it sees our work or we see it asleep.
        if h.sched_sleeping.load(Ordering::SeqCst) == 0 {
            return false;
        }
        h.doorbell.fetch_add(1, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(
            &h.doorbell,
            rustix::thread::futex::Flags::empty(),
            u32::MAX,
        );
        true
    }

    /// Has launch `seq` (0: nothing) completed?
    pub fn done(&self, seq: u64) -> bool {
        seq == 0
            || self
                .rec()
                .map(|r| r.q_done.load(Ordering::Acquire) >= seq)
                .unwrap_or(true)
    }

    /// Block until launch `seq` has completed. Fails if the daemon (whose
    /// scheduler runs kernels) is gone: the work will never finish.
    pub fn wait(&self, seq: u64) -> Result<(), MachineError> {
        let Ok(r) = self.rec() else { return Ok(()) };
        loop {
            let f = r.q_futex.load(Ordering::Acquire);
            if r.q_done.load(Ordering::Acquire) >= seq || self.rec().is_err() {
                return Ok(());
            }
            self.ring_if_asleep();
            futex_wait(&r.q_futex, f, 50_000_000);
            if r.q_futex.load(Ordering::Acquire) == f && !self.daemon_alive() {
                return Err(MachineError::DaemonGone);
            }
        }
    }

    /// The daemon still serves this machine (its socket is there and its
    /// process lives).
    pub fn daemon_alive(&self) -> bool {
        let pid = self.header().daemon_pid as i32;
        crate::daemon::sock_path(&self.dir).exists()
            && rustix::process::Pid::from_raw(pid).is_some_and(|p| {
                !matches!(
                    rustix::process::test_kill_process(p),
                    Err(rustix::io::Errno::SRCH)
                )
            })
    }

    /// When launch `seq` completed, if it has and the queue still holds it.
    pub fn done_time(&self, seq: u64) -> Option<u64> {
        let r = self.rec().ok()?;
        if seq == 0 || r.q_done.load(Ordering::Acquire) < seq {
            return None;
        }
        let e = &r.queue[((seq - 1) % QUEUE_LEN as u64) as usize];
        let t = e.done_ns.load(Ordering::Acquire);
        (e.seq.load(Ordering::Acquire) == seq && t > 0).then_some(t)
    }

    /// Launches queued so far.
    pub fn launched(&self) -> u64 {
        self.rec()
            .map(|r| r.q_tail.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Busy nanoseconds on `dev` within `[from, to)`, in total and per host pid.
    pub fn busy(&self, dev: usize, from: u64, to: u64) -> (u64, Vec<(u32, u64)>) {
        let mut total = 0;
        let mut per: Vec<(u32, u64)> = Vec::new();
        for (pid, s, e) in self.state.kernels(dev, from, to) {
            let b = e.min(to).saturating_sub(s.max(from));
            total += b;
            match per.iter_mut().find(|(p, _)| *p == pid) {
                Some((_, v)) => *v += b,
                None => per.push((pid, b)),
            }
        }
        (total, per)
    }

    /// Percent of the NVML sample window ending now in which a kernel ran.
    pub fn utilization(&self, dev: usize) -> u32 {
        let w = self.header().nvml_window_ns.max(1);
        let now = now_ns();
        let (busy, _) = self.busy(dev, now.saturating_sub(w), now);
        ((busy.min(w) * 100 + w / 2) / w) as u32
    }

    /// Per-process SM utilization since `since_realtime_us` (0: the whole
    /// window), as (host pid, percent, sample time in realtime us). Only
    /// processes with non-zero utilization are listed.
    pub fn process_utilization(&self, dev: usize, since_realtime_us: u64) -> Vec<(u32, u32, u64)> {
        let h = self.header();
        let w = h.nvml_window_ns.max(1);
        let now = now_ns();
        let mut from = now.saturating_sub(w);
        if since_realtime_us > 0 {
            let since_mono = (i128::from(since_realtime_us) * 1000
                - i128::from(h.realtime_offset_ns))
            .clamp(0, i128::from(u64::MAX)) as u64;
            from = from.max(since_mono);
        }
        if from >= now {
            return Vec::new();
        }
        let span = now - from;
        let stamp = ((now as i64 + h.realtime_offset_ns) / 1000) as u64;
        let (_, per) = self.busy(dev, from, now);
        per.into_iter()
            .filter(|(_, b)| *b > 0)
            .map(|(pid, b)| (pid, ((b.min(span) * 100 + span / 2) / span) as u32, stamp))
            .collect()
    }

    /// Hand `backing` to the daemon so other processes can open it:
    /// (token, nonce) for the IPC handle.
    pub fn ipc_export(&self, backing: &Backing) -> Result<(u32, u32), MachineError> {
        let (token, nonce, _) = client::ipc_request(
            &self.dir,
            CMD_IPC_EXPORT,
            backing.size(),
            0,
            Some(backing.fd()),
        )
        .map_err(MachineError::Ipc)?;
        Ok((token, nonce as u32))
    }

    /// The memory another process exported.
    pub fn ipc_open(&self, token: u32, nonce: u32) -> Result<Backing, MachineError> {
        let (_, size, fd) = client::ipc_request(
            &self.dir,
            CMD_IPC_OPEN,
            u64::from(token),
            u64::from(nonce),
            None,
        )
        .map_err(MachineError::Ipc)?;
        let fd = fd.ok_or(MachineError::Ipc(ClientError::BadReply {
            path: crate::daemon::sock_path(&self.dir),
        }))?;
        Backing::from_fd(fd, size).map_err(MachineError::IpcBacking)
    }

    /// The exporter freed the memory: no new opens.
    pub fn ipc_forget(&self, token: u32, nonce: u32) {
        let _ = client::ipc_request(
            &self.dir,
            CMD_IPC_FORGET,
            u64::from(token),
            u64::from(nonce),
            None,
        );
    }

    /// Export an event: (token, nonce).
    pub fn ipc_event_export(&self) -> Result<(u32, u32), MachineError> {
        let (t, n, _) = client::ipc_request(&self.dir, CMD_IPC_EVENT_EXPORT, 0, 0, None)
            .map_err(MachineError::Ipc)?;
        Ok((t, n as u32))
    }

    /// An exported event was recorded: it waits for launch `seq` of ours.
    pub fn ipc_event_mark(&self, token: u32, nonce: u32, seq: u64) -> Result<(), MachineError> {
        let a = (u64::from(token) << 32) | u64::from(nonce);
        client::ipc_request(&self.dir, CMD_IPC_EVENT_MARK, a, seq, None)
            .map_err(MachineError::Ipc)?;
        Ok(())
    }

    /// Has another process's exported event happened? (Its owner gone:
    /// yes, nothing of it is left to wait for.)
    pub fn ipc_event_done(&self, token: u32, nonce: u32) -> bool {
        let a = (u64::from(token) << 32) | u64::from(nonce);
        match client::ipc_request(&self.dir, CMD_IPC_EVENT_WAIT, a, 0, None) {
            Ok((rec, seq, _)) => {
                let r = self
                    .state
                    .proc_rec((rec as usize).min(crate::state::MAX_PROCS - 1));
                r.state.load(Ordering::Acquire) != PROC_LIVE
                    || r.q_done.load(Ordering::Acquire) >= seq
            }
            Err(_) => true,
        }
    }

    /// Block until another process's exported event has happened.
    pub fn ipc_event_wait(&self, token: u32, nonce: u32) -> Result<(), MachineError> {
        while !self.ipc_event_done(token, nonce) {
            if !self.daemon_alive() {
                return Err(MachineError::DaemonGone);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Ok(())
    }

    /// How many processes hold a context on `dev` (no snapshot cost).
    pub fn context_holders(&self, dev: usize) -> usize {
        self.state
            .live_procs()
            .into_iter()
            .filter(|(i, _)| self.state.proc_rec(*i).contexts[dev].load(Ordering::SeqCst) > 0)
            .count()
    }

    /// Processes holding a context on `dev`: (host pid, memory bytes).
    pub fn compute_processes(&self, dev: usize) -> Vec<(u32, u64)> {
        spend(self.header().nvml_snapshot_ns);
        self.state
            .live_procs()
            .into_iter()
            .filter_map(|(i, pid)| {
                let r = self.state.proc_rec(i);
                (r.contexts[dev].load(Ordering::SeqCst) > 0)
                    .then(|| (pid, r.mem[dev].load(Ordering::SeqCst)))
            })
            .collect()
    }
}

/// Wait on a shared (cross-process) futex word while it holds `val`, at
/// most `timeout_ns`. Spurious and early returns are fine: callers loop.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, val: u32, timeout_ns: u64) {
    let t = rustix::time::Timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as i64,
        tv_nsec: (timeout_ns % 1_000_000_000) as i64,
    };
    let _ = rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), val, Some(&t));
}
