//! Broker server (cargo feature `server`): tells each caller its own host PID.
//!
//! The server runs in the host PID namespace (the node agent, or
//! `vgpu broker`). For each connection it first reads the peer's credentials
//! with `SO_PEERCRED` — the kernel translates the peer's PID into the
//! server's namespace — and only then reads the request. The request carries
//! no PID, so a caller can only ever learn its own.
//!
//! Concurrency is bounded: a request already readable when the connection is
//! accepted is answered inline (no blocking is possible), the rest go to a
//! pool of handler threads grown on demand up to `max_concurrent`, each
//! connection limited by the per-connection deadline; past the bound a
//! connection gets a BUSY answer and is counted in `rejected_load`.
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::FileType;
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::client::{self, BrokerError, Stage};
use crate::codec::{self, Response, Status, REQUEST_LEN};

pub mod metrics;
pub mod sys;

pub use metrics::{Metrics, MetricsServer, MetricsSnapshot};

/// Default socket path (the node agent mounts its directory into pods).
pub const DEFAULT_SOCKET: &str = "/run/vgpu/hostpid.sock";

/// Server settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// The socket path; its directory is created (0755) if missing.
    pub socket: PathBuf,
    /// Most connections waiting for their request at once (and so most
    /// handler threads, spawned on demand).
    pub max_concurrent: usize,
    /// Per-connection deadline, accept to answer.
    pub deadline: Duration,
    /// `listen(2)` backlog (the kernel caps it at `somaxconn`).
    pub backlog: i32,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            max_concurrent: 256,
            deadline: Duration::from_millis(500),
            backlog: 4096,
        }
    }
}

/// Why the broker could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A setting is out of range.
    #[error("invalid broker setting: {0}")]
    Config(&'static str),
    /// The socket path has no parent directory.
    #[error("socket path {0} has no parent directory")]
    NoParent(PathBuf),
    /// The directory could not be created or inspected.
    #[error("cannot prepare socket directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The directory exists with an owner other than the server's euid.
    #[error("socket directory {path} is owned by uid {uid}, not this process's uid {euid}")]
    DirOwner {
        /// The directory.
        path: PathBuf,
        /// Owner seen.
        uid: u32,
        /// Our euid.
        euid: u32,
    },
    /// The directory is group/world writable (clients would refuse it).
    #[error("socket directory {path} is group/world writable (mode {mode:#o}); clients refuse it")]
    DirWritable {
        /// The directory.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Something other than a socket sits at the path.
    #[error("{path} exists and is not a socket (mode {mode:#o}); refusing to remove it")]
    NotSocket {
        /// The path.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A socket owned by someone else sits at the path.
    #[error("{path} is owned by uid {uid}, not this process's uid {euid}; refusing to remove it")]
    ForeignSocket {
        /// The path.
        path: PathBuf,
        /// Owner seen.
        uid: u32,
        /// Our euid.
        euid: u32,
    },
    /// A live broker answers at the path.
    #[error("another broker is already serving {0}")]
    AlreadyServing(PathBuf),
    /// Inspecting, removing or binding the socket failed.
    #[error("cannot {what} {path}")]
    Socket {
        /// What was attempted.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Handler threads or the wake channel could not be created.
    #[error("cannot start the broker's {0}")]
    Start(&'static str, #[source] std::io::Error),
    /// The event loop failed.
    #[error("broker event loop failed")]
    Poll(#[source] std::io::Error),
}

struct Shutdown {
    stop: AtomicBool,
    wake: UnixStream,
}

/// Stops a running [`Broker::serve`] from any thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shutdown>);

impl std::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownHandle").finish_non_exhaustive()
    }
}

impl ShutdownHandle {
    /// Asks `serve` to stop accepting, finish in-flight connections, remove
    /// the socket and return.
    pub fn shutdown(&self) {
        self.0.stop.store(true, Ordering::Release);
        // Non-blocking: a full pipe already means "wake up".
        let _ = rustix::io::write(self.0.wake.as_fd(), &[1]);
    }
}

/// A bound broker.
pub struct Broker {
    cfg: BrokerConfig,
    listener: OwnedFd,
    /// (dev, ino) of the socket we bound, so we only ever remove our own.
    id: (u64, u64),
    metrics: Arc<Metrics>,
    shutdown: Arc<Shutdown>,
    wake_rx: UnixStream,
    removed: AtomicBool,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A connection whose request is not complete yet.
struct Conn {
    fd: OwnedFd,
    start: Instant,
    deadline: Instant,
    pid: u32,
    buf: [u8; REQUEST_LEN + 1],
    got: usize,
}

enum Progress {
    Complete,
    WouldBlock,
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn prepare_dir(dir: &Path) -> Result<(), ServerError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir_err = |source| ServerError::Dir {
        path: dir.to_owned(),
        source,
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(dir_err)?;
        // The umask may have trimmed it; clients of any uid must traverse it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(dir_err)?;
    }
    let md = std::fs::metadata(dir).map_err(dir_err)?;
    if !md.is_dir() {
        return Err(dir_err(std::io::Error::from(
            std::io::ErrorKind::NotADirectory,
        )));
    }
    if md.uid() != euid() {
        return Err(ServerError::DirOwner {
            path: dir.to_owned(),
            uid: md.uid(),
            euid: euid(),
        });
    }
    if md.mode() & 0o022 != 0 {
        return Err(ServerError::DirWritable {
            path: dir.to_owned(),
            mode: md.mode() & 0o7777,
        });
    }
    Ok(())
}

fn sock_err<'a>(what: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> ServerError + 'a {
    move |source| ServerError::Socket {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Removes a stale socket at `path`, only if it is a socket we own and no
/// live broker answers on it.
fn remove_stale(path: &Path) -> Result<(), ServerError> {
    let st = match rustix::fs::lstat(path) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(sock_err("inspect", path)(e.into())),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
        return Err(ServerError::NotSocket {
            path: path.to_owned(),
            mode: st.st_mode,
        });
    }
    if st.st_uid != euid() {
        return Err(ServerError::ForeignSocket {
            path: path.to_owned(),
            uid: st.st_uid,
            euid: euid(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServerError::AlreadyServing(path.to_owned())),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            Err(ServerError::AlreadyServing(path.to_owned()))
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
            ) =>
        {
            match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(sock_err("remove stale socket", path)(e)),
            }
        }
        Err(e) => Err(sock_err("probe existing socket", path)(e)),
    }
}

impl Broker {
    /// Prepares the directory, clears a stale socket, binds and listens.
    pub fn bind(cfg: BrokerConfig) -> Result<Broker, ServerError> {
        if cfg.max_concurrent == 0 || cfg.max_concurrent > 4096 {
            return Err(ServerError::Config("max_concurrent must be 1..=4096"));
        }
        if cfg.deadline.is_zero() || cfg.deadline > Duration::from_secs(60) {
            return Err(ServerError::Config("deadline must be in (0, 60 s]"));
        }
        let path = cfg.socket.as_path();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => return Err(ServerError::NoParent(path.to_owned())),
        };
        prepare_dir(dir)?;
        remove_stale(path)?;
        let addr = SocketAddrUnix::new(path).map_err(|e| sock_err("address", path)(e.into()))?;
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| sock_err("create socket for", path)(e.into()))?;
        rustix::net::bind(&fd, &addr).map_err(|e| sock_err("bind", path)(e.into()))?;
        let finish = || -> Result<rustix::fs::Stat, ServerError> {
            use std::os::unix::fs::PermissionsExt;
            // Clients of any uid must be able to connect (write permission).
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
                .map_err(sock_err("chmod", path))?;
            rustix::net::listen(&fd, cfg.backlog)
                .map_err(|e| sock_err("listen on", path)(e.into()))?;
            rustix::fs::lstat(path).map_err(|e| sock_err("inspect", path)(e.into()))
        };
        let st = match finish() {
            Ok(st) => st,
            Err(e) => {
                // Leave no socket behind that nobody serves.
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let (wake_tx, wake_rx) =
            UnixStream::pair().map_err(|e| ServerError::Start("wake channel", e))?;
        wake_tx
            .set_nonblocking(true)
            .map_err(|e| ServerError::Start("wake channel", e))?;
        Ok(Broker {
            id: (st.st_dev, st.st_ino),
            cfg,
            listener: fd,
            metrics: Arc::new(Metrics::new()),
            shutdown: Arc::new(Shutdown {
                stop: AtomicBool::new(false),
                wake: wake_tx,
            }),
            wake_rx,
            removed: AtomicBool::new(false),
        })
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.cfg.socket
    }

    /// The metrics (shared with a [`MetricsServer`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// A handle that stops [`Broker::serve`] from another thread or a signal
    /// waiter.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Same as `self.shutdown_handle().shutdown()`.
    pub fn shutdown(&self) {
        self.shutdown_handle().shutdown();
    }

    /// Serves until shut down, then finishes in-flight connections (each
    /// bounded by the deadline), removes the socket and returns.
    pub fn serve(&self) -> Result<(), ServerError> {
        let mut pool = Pool::new(self.cfg.max_concurrent, self.metrics.clone());
        let result = self.accept_loop(&mut pool);
        pool.join();
        self.remove_socket();
        result
    }

    fn accept_loop(&self, pool: &mut Pool) -> Result<(), ServerError> {
        loop {
            if self.shutdown.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let mut fds = [
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(&self.wake_rx, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(ServerError::Poll(e.into())),
            }
            if self.shutdown.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            loop {
                match rustix::net::accept_with(
                    &self.listener,
                    SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
                ) {
                    Ok(fd) => self.on_accept(fd, pool),
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) | Err(Errno::CONNABORTED) => {}
                    Err(_) => {
                        // EMFILE and friends: the connection stays queued;
                        // pause instead of spinning on it.
                        self.metrics.io_errors.inc();
                        std::thread::sleep(Duration::from_millis(10));
                        break;
                    }
                }
            }
        }
    }

    fn on_accept(&self, fd: OwnedFd, pool: &mut Pool) {
        let m = &*self.metrics;
        m.accepted.inc();
        let start = Instant::now();
        let deadline = start + self.cfg.deadline;
        // Credentials first: nothing the peer sent is looked at before the
        // kernel has said who it is.
        let pid = match sys::peer_cred(fd.as_fd()) {
            Ok(c) if c.pid > 0 => c.pid as u32,
            _ => {
                m.peercred_failures.inc();
                // Inline: never wait for a slow reader on the accept thread.
                let _ = client::write_full(
                    &fd,
                    &codec::encode_response(Response::error(Status::NO_PEER_PID)),
                    Instant::now(),
                );
                m.duration.observe(start.elapsed().as_secs_f64());
                return;
            }
        };
        let mut conn = Conn {
            fd,
            start,
            deadline,
            pid,
            buf: [0; REQUEST_LEN + 1],
            got: 0,
        };
        match read_nonblocking(&mut conn) {
            Ok(Progress::Complete) => answer(&mut conn, m, Instant::now()),
            Ok(Progress::WouldBlock) => {
                if let Err(conn) = pool.submit(conn) {
                    m.rejected_load.inc();
                    let busy = codec::encode_response(Response::error(Status::BUSY));
                    let _ = rustix::net::send(
                        &conn.fd,
                        &busy,
                        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                    );
                }
            }
            Err(_) => {
                m.io_errors.inc();
            }
        }
    }

    fn remove_socket(&self) {
        if self.removed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Only our own socket: another broker may have replaced it.
        if let Ok(st) = rustix::fs::lstat(&self.cfg.socket) {
            if (st.st_dev, st.st_ino) == self.id {
                let _ = std::fs::remove_file(&self.cfg.socket);
            }
        }
    }
}

/// Handler threads for connections whose request has not arrived yet.
/// Threads are spawned on demand (only when all existing ones are busy) up
/// to `max`; `inflight` counts connections handed over and not finished.
struct Pool {
    tx: Option<mpsc::Sender<Conn>>,
    rx: Arc<Mutex<mpsc::Receiver<Conn>>>,
    inflight: Arc<AtomicUsize>,
    workers: Vec<std::thread::JoinHandle<()>>,
    metrics: Arc<Metrics>,
    max: usize,
}

impl Pool {
    fn new(max: usize, metrics: Arc<Metrics>) -> Pool {
        let (tx, rx) = mpsc::channel::<Conn>();
        Pool {
            tx: Some(tx),
            rx: Arc::new(Mutex::new(rx)),
            inflight: Arc::new(AtomicUsize::new(0)),
            workers: Vec::new(),
            metrics,
            max,
        }
    }

    fn spawn_worker(&mut self) -> std::io::Result<()> {
        let rx = self.rx.clone();
        let inflight = self.inflight.clone();
        let metrics = self.metrics.clone();
        let h = std::thread::Builder::new()
            .name(format!("broker-{}", self.workers.len()))
            .stack_size(128 * 1024)
            .spawn(move || loop {
                // The guard is a temporary, dropped before handling.
                let next = match rx.lock() {
                    Ok(r) => r.recv(),
                    Err(_) => break,
                };
                let Ok(mut conn) = next else { break };
                finish_blocking(&mut conn, &metrics);
                inflight.fetch_sub(1, Ordering::AcqRel);
            })?;
        self.workers.push(h);
        Ok(())
    }

    /// Hands `conn` to a handler, or gives it back when at the bound.
    fn submit(&mut self, conn: Conn) -> Result<(), Conn> {
        let n = self.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        // Every worker busy: grow (a failed spawn still leaves the others).
        if n > self.max
            || (n > self.workers.len() && self.spawn_worker().is_err() && self.workers.is_empty())
        {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(conn);
        }
        let Some(tx) = self.tx.as_ref() else {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(conn);
        };
        tx.send(conn).map_err(|mpsc::SendError(conn)| {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            conn
        })
    }

    /// Lets the handlers finish what they hold (each bounded by its
    /// deadline) and waits for them.
    fn join(&mut self) {
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.remove_socket();
    }
}

/// Reads what is already there without blocking.
fn read_nonblocking(c: &mut Conn) -> Result<Progress, Errno> {
    while c.got < REQUEST_LEN {
        // Up to one byte more than a frame: trailing bytes show up here.
        let Some(rest) = c.buf.get_mut(c.got..) else {
            break;
        };
        match rustix::net::recv(&c.fd, rest, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(Progress::Complete),
            Ok((n, _)) => c.got += n,
            Err(Errno::AGAIN) => return Ok(Progress::WouldBlock),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Progress::Complete)
}

/// A handler thread's part: wait (up to the deadline) for the rest of the
/// request, then answer.
fn finish_blocking(c: &mut Conn, m: &Metrics) {
    let need = REQUEST_LEN.saturating_sub(c.got);
    let Some(rest) = c.buf.get_mut(c.got..) else {
        return;
    };
    match client::read_upto(&c.fd, rest, need, c.deadline, Stage::Read) {
        Ok(n) => {
            c.got += n;
            let deadline = c.deadline;
            answer(c, m, deadline);
        }
        Err(BrokerError::Timeout { .. }) => {
            m.timeouts.inc();
        }
        Err(_) => {
            m.io_errors.inc();
        }
    }
}

/// Decodes the request (with any byte read past it) and answers, waiting
/// for a full socket buffer at most until `deadline` (the accept thread
/// passes "now": it never waits on one client).
fn answer(c: &mut Conn, m: &Metrics, deadline: Instant) {
    let frame = c.buf.get(..c.got).unwrap_or(&[]);
    let resp = match codec::decode_request(frame) {
        Ok(_) => Response::ok(c.pid),
        Err(e) => {
            m.bad_frame(e.kind());
            Response::error(e.status())
        }
    };
    let written = client::write_full(&c.fd, &codec::encode_response(resp), deadline);
    // The duration first, so whoever sees `ok` move also sees it.
    m.duration.observe(c.start.elapsed().as_secs_f64());
    match written {
        Ok(()) if resp.status == Status::OK => {
            m.ok.inc();
        }
        Ok(()) => {}
        Err(BrokerError::Timeout { .. }) => {
            m.timeouts.inc();
        }
        Err(_) => {
            m.io_errors.inc();
        }
    }
}
