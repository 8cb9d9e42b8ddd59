//! The simulated machine's daemon: owns the state file, hands out process
//! records, and releases a process's memory and contexts when it dies.
//!
//! Wire protocol on `$VGPU_SIM_DIR/sock` (one request per connection):
//! request 8 bytes `"VSIM"`, u8 command (`R` register, `A` attach, `Q`
//! quit), 3 zero bytes; response 16 bytes `"VSIM"`, u32 status (0 ok),
//! u32 host pid, u32 record index (u32::MAX for attach), little-endian.
//! The host PID comes from `SO_PEERCRED`, which the kernel translates into
//! the daemon's PID namespace, so a client inside
//! `unshare --pid --fork --mount-proc` is known by its host PID.
use std::collections::HashMap;
use std::io::{Read, Write};
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
    buf: [u8; 8],
    got: usize,
    since: Instant,
}

/// A bound daemon, ready to `serve`.
pub struct Daemon {
    dir: PathBuf,
    state: State,
    listener: UnixListener,
    /// record index -> pidfd of its process.
    watched: HashMap<usize, OwnedFd>,
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
                    match p.conn.read(&mut p.buf[p.got..]) {
                        Ok(0) => continue,
                        Ok(n) => p.got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => continue,
                    }
                    if p.got == p.buf.len() {
                        quit |= self.handle(p.conn, p.buf);
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
                                    buf: [0; 8],
                                    got: 0,
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
    fn handle(&mut self, mut conn: UnixStream, req: [u8; 8]) -> bool {
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
        let r = self.state.proc_rec(i);
        r.state.store(PROC_FREE, Ordering::SeqCst);
        for d in 0..r.mem.len() {
            r.mem[d].store(0, Ordering::SeqCst);
            r.contexts[d].store(0, Ordering::SeqCst);
        }
    }
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
