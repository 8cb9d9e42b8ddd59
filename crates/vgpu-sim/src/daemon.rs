//! The simulated machine's daemon: owns the state file, hands out process
//! records, and releases a process's memory and contexts when it dies.
//!
//! Wire protocol on `$VGPU_SIM_DIR/sock` (one request per connection):
//! request 8 bytes `"VSIM"`, u8 command (`R` register, `A` attach, `Q`
//! quit), 3 zero bytes; response 16 bytes `"VSIM"`, u32 status (0 ok),
//! u32 host pid, u32 record index (u32::MAX for attach), little-endian.
//!
//! IPC memory (what a kernel driver does for `cuIpcGetMemHandle`): the
//! daemon holds the exporter's memory descriptor so that another process
//! can map the same bytes. Requests are 24 bytes: the 8 above with command
//! `X` (export; the descriptor rides along as `SCM_RIGHTS`), `O` (open) or
//! `F` (forget), then u64 `a`, u64 `b`; replies are 24 bytes: `"VSIM"`,
//! u32 status, u32 host pid, u32 `x`, u64 `y`. Export: `a` = size; reply
//! `x` = token, `y` = nonce. Open: `a` = token, `b` = nonce; reply `y` =
//! size and the descriptor as `SCM_RIGHTS`. Forget (the owner only): `a`,
//! `b` as for open. An exporter's descriptors go when it dies.
//!
//! IPC events: `V` exports one (reply `x` = token, `y` = nonce), `M` marks
//! it recorded (`a` = token << 32 | nonce, `b` = the owner's launch
//! sequence number it waits for; the owner only), `W` asks what it waits
//! for (`a` as for `M`; reply `x` = the owner's record, `y` = sequence
//! number). An exporter's events go when it dies (`W` then answers
//! `STATUS_GONE`: nothing left to wait for).
//! The host PID comes from `SO_PEERCRED`, which the kernel translates into
//! the daemon's PID namespace, so a client inside
//! `unshare --pid --fork --mount-proc` is known by its host PID.
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

use crate::config::SimConfig;
use crate::state::{State, StateError, MAX_PROCS, PROC_FREE, PROC_LIVE};

pub const MAGIC: &[u8; 4] = b"VSIM";
pub const CMD_REGISTER: u8 = b'R';
pub const CMD_ATTACH: u8 = b'A';
pub const CMD_QUIT: u8 = b'Q';
pub const CMD_IPC_EXPORT: u8 = b'X';
pub const CMD_IPC_OPEN: u8 = b'O';
pub const CMD_IPC_FORGET: u8 = b'F';
pub const CMD_IPC_EVENT_EXPORT: u8 = b'V';
pub const CMD_IPC_EVENT_MARK: u8 = b'M';
pub const CMD_IPC_EVENT_WAIT: u8 = b'W';
/// Length of a request with this command byte.
pub fn request_len(cmd: u8) -> usize {
    match cmd {
        CMD_IPC_EXPORT | CMD_IPC_OPEN | CMD_IPC_FORGET | CMD_IPC_EVENT_EXPORT
        | CMD_IPC_EVENT_MARK | CMD_IPC_EVENT_WAIT => 24,
        _ => 8,
    }
}
pub const STATUS_OK: u32 = 0;
pub const STATUS_FULL: u32 = 1;
pub const STATUS_DENIED: u32 = 2;
pub const STATUS_BAD_REQUEST: u32 = 3;
pub const STATUS_GONE: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot create sim dir {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the sim state")]
    State(#[source] StateError),
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another vgpu-sim daemon (pid {pid}) already serves {path}")]
    AlreadyRunning { path: PathBuf, pid: u32 },
    #[error("daemon poll failed")]
    Poll(#[source] std::io::Error),
}

/// File names inside a sim dir.
pub fn sock_path(dir: &Path) -> PathBuf {
    dir.join("sock")
}
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join("state")
}
pub fn pid_path(dir: &Path) -> PathBuf {
    dir.join("daemon.pid")
}
/// flock'd by processes that create contexts while the machine serializes
/// context creation; the kernel drops it when the holder dies.
pub fn ctx_lock_path(dir: &Path) -> PathBuf {
    dir.join("ctx.lock")
}

/// An accepted connection whose request has not fully arrived.
struct Pending {
    conn: UnixStream,
    buf: [u8; 24],
    got: usize,
    /// Bytes this request has (8 until its command byte arrived).
    need: usize,
    /// A descriptor that came with it (IPC export).
    fd: Option<OwnedFd>,
    since: Instant,
}

/// An event one process exported: what its last record waits for.
struct IpcEvent {
    owner: usize,
    nonce: u32,
    seq: u64,
}

/// Memory one process exported for others to open.
struct IpcEntry {
    owner: usize,
    nonce: u32,
    size: u64,
    fd: OwnedFd,
}

/// A bound daemon, ready to `serve`.
pub struct Daemon {
    dir: PathBuf,
    state: State,
    listener: UnixListener,
    /// record index -> pidfd of its process.
    watched: HashMap<usize, OwnedFd>,
    /// IPC token -> exported memory.
    ipc: HashMap<u32, IpcEntry>,
    events: HashMap<u32, IpcEvent>,
    next_token: u32,
}

impl Daemon {
    /// Create the state file and the socket in `dir`.
    pub fn bind(dir: &Path, cfg: &SimConfig) -> Result<Daemon, DaemonError> {
        std::fs::create_dir_all(dir).map_err(|source| DaemonError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let sock = sock_path(dir);
        // A live daemon answers; a stale socket from a dead one is replaced.
        if let Ok(pid) = crate::client::ping(dir) {
            return Err(DaemonError::AlreadyRunning { path: sock, pid });
        }
        let _ = std::fs::remove_file(&sock);
        let state =
            State::create(&state_path(dir), cfg, std::process::id()).map_err(DaemonError::State)?;
        std::fs::File::create(ctx_lock_path(dir)).map_err(|source| DaemonError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let listener = UnixListener::bind(&sock).map_err(|source| DaemonError::Listen {
            path: sock.clone(),
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| DaemonError::Listen { path: sock, source })?;
        // Any user's processes may use the machine (containers often run
        // as another uid than the daemon).
        for p in [state_path(dir), ctx_lock_path(dir), sock_path(dir)] {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666));
        }
        let _ = std::fs::write(pid_path(dir), format!("{}\n", std::process::id()));
        Ok(Daemon {
            dir: dir.to_path_buf(),
            state,
            listener,
            watched: HashMap::new(),
            ipc: HashMap::new(),
            events: HashMap::new(),
            next_token: 0,
        })
    }

    /// Serve until a `Q` request, or until `stop` becomes readable (or hangs up).
    ///
    /// One thread, never blocked by a client: accepted connections wait in
    /// the poll set until their request has arrived (or 2 s pass).
    pub fn serve(mut self, stop: Option<OwnedFd>) -> Result<(), DaemonError> {
        let mut pending: Vec<Pending> = Vec::new();
        let sched_stop = Arc::new(AtomicBool::new(false));
        let sched = {
            let (path, flag) = (state_path(&self.dir), sched_stop.clone());
            std::thread::Builder::new()
                .name("vgpu-sim-sched".into())
                .spawn(move || crate::scheduler::run(path, flag))
                .map_err(DaemonError::Poll)?
        };
        loop {
            let idxs: Vec<usize> = self.watched.keys().copied().collect();
            let (listen_ready, stop_ready, dead, readable) = {
                let mut fds = Vec::with_capacity(idxs.len() + pending.len() + 2);
                fds.push(PollFd::new(&self.listener, PollFlags::IN));
                if let Some(s) = &stop {
                    fds.push(PollFd::new(s, PollFlags::IN));
                }
                for i in &idxs {
                    fds.push(PollFd::new(&self.watched[i], PollFlags::IN));
                }
                for p in &pending {
                    fds.push(PollFd::new(&p.conn, PollFlags::IN));
                }
                let tick = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                match poll(&mut fds, (!pending.is_empty()).then_some(&tick)) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(DaemonError::Poll(e.into())),
                }
                let ready = |k: usize| !fds[k].revents().is_empty();
                let base = if stop.is_some() { 2 } else { 1 };
                let dead: Vec<usize> = idxs
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| ready(base + k))
                    .map(|(_, i)| *i)
                    .collect();
                let pbase = base + idxs.len();
                let readable: Vec<bool> = (0..pending.len()).map(|k| ready(pbase + k)).collect();
                (ready(0), stop.is_some() && ready(1), dead, readable)
            };
            for i in dead {
                self.release(i);
            }
            if stop_ready {
                break;
            }
            let mut quit = false;
            let mut keep = Vec::with_capacity(pending.len());
            for (mut p, r) in pending.into_iter().zip(readable) {
                if r {
                    match read_some(&mut p) {
                        Ok(0) => continue,
                        Ok(_) => {}
                        Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
                        Err(_) => continue,
                    }
                    if p.need == 8 && p.got > 4 {
                        p.need = request_len(p.buf[4]);
                    }
                    if p.got == p.need {
                        quit |= self.handle(p.conn, p.buf, p.fd);
                        continue;
                    }
                }
                // A client that connects and stalls is dropped, never waited on.
                if p.since.elapsed() < Duration::from_secs(2) {
                    keep.push(p);
                }
            }
            pending = keep;
            if listen_ready {
                loop {
                    match self.listener.accept() {
                        Ok((conn, _)) => {
                            if conn.set_nonblocking(true).is_ok() {
                                pending.push(Pending {
                                    conn,
                                    buf: [0; 24],
                                    got: 0,
                                    need: 8,
                                    fd: None,
                                    since: Instant::now(),
                                });
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
            }
            if quit {
                break;
            }
        }
        sched_stop.store(true, Ordering::Release);
        crate::scheduler::ring(&self.state);
        let _ = sched.join();
        let _ = std::fs::remove_file(sock_path(&self.dir));
        let _ = std::fs::remove_file(pid_path(&self.dir));
        Ok(())
    }

    /// One complete request. Returns true on an accepted quit.
    fn handle(&mut self, mut conn: UnixStream, req: [u8; 24], fd: Option<OwnedFd>) -> bool {
        // The 16-byte reply fits an empty socket buffer; never block long.
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_write_timeout(Some(Duration::from_millis(500)));
        let cred = match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(c) => c,
            Err(_) => return false,
        };
        let pid = cred.pid.as_raw_nonzero().get() as u32;
        let reply = |conn: &mut UnixStream, status: u32, rec: u32| {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(MAGIC);
            out[4..8].copy_from_slice(&status.to_le_bytes());
            out[8..12].copy_from_slice(&pid.to_le_bytes());
            out[12..16].copy_from_slice(&rec.to_le_bytes());
            conn.write_all(&out).is_ok()
        };
        if &req[..4] != MAGIC {
            reply(&mut conn, STATUS_BAD_REQUEST, u32::MAX);
            return false;
        }
        match req[4] {
            CMD_ATTACH => {
                reply(&mut conn, STATUS_OK, u32::MAX);
                false
            }
            CMD_QUIT => {
                let me = rustix::process::geteuid();
                let ok = cred.uid.is_root() || cred.uid == me;
                reply(
                    &mut conn,
                    if ok { STATUS_OK } else { STATUS_DENIED },
                    u32::MAX,
                );
                ok
            }
            CMD_IPC_EXPORT | CMD_IPC_OPEN | CMD_IPC_FORGET | CMD_IPC_EVENT_EXPORT
            | CMD_IPC_EVENT_MARK | CMD_IPC_EVENT_WAIT => {
                let word =
                    |i: usize| u64::from_le_bytes(req[i..i + 8].try_into().unwrap_or([0; 8]));
                let (status, x, y, out_fd) = self.ipc(pid, req[4], word(8), word(16), fd);
                let mut out = [0u8; 24];
                out[..4].copy_from_slice(MAGIC);
                out[4..8].copy_from_slice(&status.to_le_bytes());
                out[8..12].copy_from_slice(&pid.to_le_bytes());
                out[12..16].copy_from_slice(&x.to_le_bytes());
                out[16..24].copy_from_slice(&y.to_le_bytes());
                send_with_fd(&conn, &out, out_fd.as_ref());
                false
            }
            CMD_REGISTER => {
                match self.register(pid) {
                    Ok(i) => {
                        if !reply(&mut conn, STATUS_OK, i as u32) {
                            // The client died before hearing back.
                            self.release(i);
                        }
                    }
                    Err(status) => {
                        reply(&mut conn, status, u32::MAX);
                    }
                }
                false
            }
            _ => {
                reply(&mut conn, STATUS_BAD_REQUEST, u32::MAX);
                false
            }
        }
    }

    /// The live record of host pid `pid`, if it registered.
    fn record_of(&self, pid: u32) -> Option<usize> {
        self.watched
            .keys()
            .copied()
            .find(|i| self.state.proc_rec(*i).host_pid.load(Ordering::Acquire) == pid)
    }

    /// An IPC request: (status, x, y, descriptor to send back).
    fn ipc(
        &mut self,
        pid: u32,
        cmd: u8,
        a: u64,
        b: u64,
        fd: Option<OwnedFd>,
    ) -> (u32, u32, u64, Option<OwnedFd>) {
        let refused = (STATUS_DENIED, 0, 0, None);
        let (etoken, enonce) = ((a >> 32) as u32, a as u32);
        match cmd {
            CMD_IPC_EXPORT => {
                let (Some(owner), Some(fd)) = (self.record_of(pid), fd) else {
                    return (STATUS_BAD_REQUEST, 0, 0, None);
                };
                let (token, nonce) = self.fresh_token();
                self.ipc.insert(
                    token,
                    IpcEntry {
                        owner,
                        nonce,
                        size: a,
                        fd,
                    },
                );
                (STATUS_OK, token, u64::from(nonce), None)
            }
            CMD_IPC_EVENT_EXPORT => {
                let Some(owner) = self.record_of(pid) else {
                    return (STATUS_BAD_REQUEST, 0, 0, None);
                };
                let (token, nonce) = self.fresh_token();
                self.events.insert(
                    token,
                    IpcEvent {
                        owner,
                        nonce,
                        seq: 0,
                    },
                );
                (STATUS_OK, token, u64::from(nonce), None)
            }
            CMD_IPC_EVENT_MARK => {
                let owner = self.record_of(pid);
                match self.events.get_mut(&etoken) {
                    Some(e) if e.nonce == enonce && Some(e.owner) == owner => {
                        e.seq = b;
                        (STATUS_OK, 0, 0, None)
                    }
                    _ => refused,
                }
            }
            CMD_IPC_EVENT_WAIT => match self.events.get(&etoken) {
                Some(e) if e.nonce == enonce => (STATUS_OK, e.owner as u32, e.seq, None),
                _ => (STATUS_GONE, 0, 0, None),
            },
            CMD_IPC_OPEN => match self.ipc.get(&(a as u32)) {
                Some(e) if u64::from(e.nonce) == b => match e.fd.try_clone() {
                    Ok(fd) => (STATUS_OK, 0, e.size, Some(fd)),
                    Err(_) => (STATUS_GONE, 0, 0, None),
                },
                _ => (STATUS_GONE, 0, 0, None),
            },
            _ => {
                let owner = self.record_of(pid);
                match self.ipc.get(&(a as u32)) {
                    Some(e) if u64::from(e.nonce) == b && Some(e.owner) == owner => {
                        self.ipc.remove(&(a as u32));
                        (STATUS_OK, 0, 0, None)
                    }
                    _ => refused,
                }
            }
        }
    }

    /// A token no live export uses (never 0) and a nonce to go with it.
    fn fresh_token(&mut self) -> (u32, u32) {
        loop {
            self.next_token = self.next_token.wrapping_add(1).max(1);
            let t = self.next_token;
            if !self.ipc.contains_key(&t) && !self.events.contains_key(&t) {
                let nonce = (crate::clock::realtime_ns() as u32 ^ t.wrapping_mul(0x9e37_79b9)) | 1;
                return (t, nonce);
            }
        }
    }

    fn register(&mut self, pid: u32) -> Result<usize, u32> {
        // The same live process registering again keeps its record.
        let existing: Vec<usize> = self
            .watched
            .keys()
            .copied()
            .filter(|i| self.state.proc_rec(*i).host_pid.load(Ordering::Acquire) == pid)
            .collect();
        for i in existing {
            if process_alive(&self.watched[&i]) {
                return Ok(i);
            }
            // Dead and its PID reused before we saw the death.
            self.release(i);
        }
        let raw = Pid::from_raw(pid as i32).ok_or(STATUS_BAD_REQUEST)?;
        let pidfd = pidfd_open(raw, PidfdFlags::empty()).map_err(|_| STATUS_GONE)?;
        let i = (0..MAX_PROCS)
            .find(|i| {
                !self.watched.contains_key(i)
                    && self.state.proc_rec(*i).state.load(Ordering::Acquire) == PROC_FREE
            })
            .ok_or(STATUS_FULL)?;
        let r = self.state.proc_rec(i);
        for d in 0..r.mem.len() {
            r.mem[d].store(0, Ordering::SeqCst);
            r.contexts[d].store(0, Ordering::SeqCst);
        }
        r.q_tail.store(0, Ordering::SeqCst);
        r.q_done.store(0, Ordering::SeqCst);
        r.generation.fetch_add(1, Ordering::AcqRel);
        r.host_pid.store(pid, Ordering::Release);
        // Published before the record goes live, so every scan covers it.
        self.state
            .header()
            .proc_hwm
            .fetch_max(i as u32 + 1, Ordering::SeqCst);
        r.state.store(PROC_LIVE, Ordering::SeqCst);
        self.watched.insert(i, pidfd);
        Ok(i)
    }

    /// A process died (or never heard back): its memory and contexts go,
    /// as a kernel driver releases them at process teardown.
    fn release(&mut self, i: usize) {
        self.watched.remove(&i);
        self.ipc.retain(|_, e| e.owner != i);
        self.events.retain(|_, e| e.owner != i);
        let r = self.state.proc_rec(i);
        r.state.store(PROC_FREE, Ordering::SeqCst);
        for d in 0..r.mem.len() {
            r.mem[d].store(0, Ordering::SeqCst);
            r.contexts[d].store(0, Ordering::SeqCst);
        }
    }
}

/// Read what has arrived of a pending request (and any descriptor with it).
fn read_some(p: &mut Pending) -> Result<usize, rustix::io::Errno> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let need = p.need.max(p.got + 1).min(p.buf.len());
    let mut iov = [std::io::IoSliceMut::new(&mut p.buf[p.got..need])];
    let r = recvmsg(
        &p.conn,
        &mut iov,
        &mut anc,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    )?;
    for msg in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for fd in fds {
                // Only the first is kept; extras close here.
                if p.fd.is_none() {
                    p.fd = Some(fd);
                }
            }
        }
    }
    p.got += r.bytes;
    Ok(r.bytes)
}

/// Write a reply, with a descriptor as `SCM_RIGHTS` when given.
fn send_with_fd(conn: &UnixStream, out: &[u8], fd: Option<&OwnedFd>) {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(f) = fd {
        fds = [f.as_fd()];
        anc.push(SendAncillaryMessage::ScmRights(&fds));
    }
    let _ = sendmsg(
        conn,
        &[std::io::IoSlice::new(out)],
        &mut anc,
        SendFlags::NOSIGNAL,
    );
}

fn process_alive(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(0))
}

/// Bind and serve in the calling thread (the `vgpu-simd` binary, `vgpu sim
/// daemon`) until a quit request, SIGTERM or SIGINT.
pub fn run(dir: &Path, cfg: &SimConfig) -> Result<(), DaemonError> {
    let daemon = Daemon::bind(dir, cfg)?;
    let (wake, stop) = UnixStream::pair().map_err(DaemonError::Poll)?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::low_level::pipe::register(sig, wake.try_clone().map_err(DaemonError::Poll)?)
            .map_err(DaemonError::Poll)?;
    }
    daemon.serve(Some(OwnedFd::from(stop)))
}

/// The stop end for `serve`: dropping or writing to the returned stream
/// wakes the daemon and makes it exit.
pub fn stop_pair() -> std::io::Result<(UnixStream, OwnedFd)> {
    let (a, b) = UnixStream::pair()?;
    Ok((a, OwnedFd::from(b)))
}
