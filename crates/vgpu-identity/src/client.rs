//! Broker client: ask the node's host-PID broker for this process's host PID.
//!
//! Written to run inside `libvgpu.so` (an `LD_PRELOAD` library loaded into
//! arbitrary processes): raw syscalls through `rustix`, no threads, no global
//! state, no logging, no panics, no signals (`MSG_NOSIGNAL`), one short-lived
//! `O_CLOEXEC` socket. Every failure is a [`BrokerError`] the caller logs
//! (with the path, which errors leave out) and falls through on.
//!
//! Before connecting, the endpoint is checked with `lstat` so that a
//! container cannot redirect the query to a socket it serves itself: the
//! socket must not be a symlink, must be a socket and owned by the trusted
//! uid (root), and its parent directory must be owned by the trusted uid and
//! not group/world writable (so nobody else can swap the entry between the
//! check and the connect).
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::codec::{self, FrameError, Request, Status, REQUEST_LEN, RESPONSE_LEN};
use crate::telemetry::FailureCode;

/// Longest deadline a query may be given; longer ones are cut to this.
pub const MAX_DEADLINE: Duration = Duration::from_millis(500);
/// A sensible default for callers without their own.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(250);

/// Options beyond the path and deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Total time for connect, write and read; clamped to [`MAX_DEADLINE`].
    pub deadline: Duration,
    /// The uid that must own the socket and its directory (root).
    pub trusted_uid: u32,
    /// Retry (with 1-16 ms backoff, within the deadline) when the broker
    /// answers BUSY.
    pub retry_busy: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: DEFAULT_DEADLINE,
            trusted_uid: 0,
            retry_busy: true,
        }
    }
}

/// Why an endpoint was not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeEndpoint {
    /// The socket path is a symbolic link.
    #[error("the socket path is a symlink")]
    Symlink,
    /// The path is not a socket.
    #[error("the path is not a socket (mode {mode:#o})")]
    NotSocket {
        /// `st_mode`.
        mode: u32,
    },
    /// The socket is owned by someone other than the trusted uid.
    #[error("the socket is owned by uid {uid}, not the trusted uid {trusted}")]
    SocketOwner {
        /// Owner seen.
        uid: u32,
        /// Owner required.
        trusted: u32,
    },
    /// The parent is not a directory.
    #[error("the parent is not a directory")]
    ParentNotDirectory,
    /// The parent directory has the wrong owner.
    #[error("the parent directory is owned by uid {uid}, not the trusted uid {trusted}")]
    ParentOwner {
        /// Owner seen.
        uid: u32,
        /// Owner required.
        trusted: u32,
    },
    /// The parent directory is group or world writable.
    #[error("the parent directory is group/world writable (mode {mode:#o})")]
    ParentWritable {
        /// Permission bits.
        mode: u32,
    },
}

/// Which step of the exchange failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Checking the path.
    Check,
    /// Connecting.
    Connect,
    /// Sending the request.
    Write,
    /// Receiving the response.
    Read,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Check => "check",
            Stage::Connect => "connect",
            Stage::Write => "write",
            Stage::Read => "read",
        })
    }
}

/// Why the broker gave no PID. Errors leave the path out (the caller has it)
/// so that building one never allocates.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Nothing at the path (the tier is not deployed on this node).
    #[error("broker socket does not exist")]
    Missing,
    /// The endpoint failed a safety check.
    #[error("broker endpoint not trusted")]
    Unsafe(#[source] UnsafeEndpoint),
    /// A syscall failed at some stage.
    #[error("broker {stage} failed")]
    Os {
        /// The stage.
        stage: Stage,
        /// The errno.
        #[source]
        source: Errno,
    },
    /// The deadline passed.
    #[error("broker did not answer within the deadline (stage {stage})")]
    Timeout {
        /// The stage that was waiting.
        stage: Stage,
    },
    /// The peer closed before a full exchange.
    #[error("broker closed the connection during {stage} after {got} bytes")]
    Eof {
        /// The stage.
        stage: Stage,
        /// Bytes transferred before EOF.
        got: usize,
    },
    /// The response was not a well-formed v1 frame (includes pid 0).
    #[error("malformed broker response")]
    Frame(#[source] FrameError),
    /// The broker answered with a non-OK status.
    #[error("broker answered with status {0}")]
    Status(Status),
}

impl BrokerError {
    /// Stable telemetry code.
    pub fn failure_code(&self) -> FailureCode {
        match self {
            BrokerError::Missing => FailureCode::BROKER_MISSING,
            BrokerError::Unsafe(_) => FailureCode::BROKER_UNSAFE_ENDPOINT,
            BrokerError::Os {
                stage: Stage::Check | Stage::Connect,
                ..
            } => FailureCode::BROKER_CONNECT,
            BrokerError::Os { .. } => FailureCode::BROKER_IO,
            BrokerError::Timeout { .. } => FailureCode::BROKER_TIMEOUT,
            BrokerError::Eof {
                stage: Stage::Read, ..
            }
            | BrokerError::Frame(_) => FailureCode::BROKER_BAD_FRAME,
            BrokerError::Eof { .. } => FailureCode::BROKER_IO,
            BrokerError::Status(_) => FailureCode::BROKER_STATUS,
        }
    }
}

/// Asks the broker at `path` for the caller's host PID, with the default
/// trusted uid (root) and `deadline` (clamped to [`MAX_DEADLINE`]).
pub fn query_broker(path: &Path, deadline: Duration) -> Result<u32, BrokerError> {
    query_broker_with(
        path,
        &ClientOptions {
            deadline,
            ..ClientOptions::default()
        },
    )
}

/// [`query_broker`] with explicit options.
pub fn query_broker_with(path: &Path, opts: &ClientOptions) -> Result<u32, BrokerError> {
    let start = Instant::now();
    let deadline = start + opts.deadline.min(MAX_DEADLINE);
    check_endpoint(path, opts.trusted_uid)?;
    // BUSY means "at the bound right now": retry within the deadline. Once
    // a BUSY was seen, running out of time reports BUSY (the real cause).
    let mut backoff = Duration::from_millis(1);
    let mut saw_busy = false;
    loop {
        match exchange(path, deadline) {
            Err(BrokerError::Status(Status::BUSY)) if opts.retry_busy => {
                saw_busy = true;
                let left = deadline
                    .checked_duration_since(Instant::now())
                    .unwrap_or_default();
                if left <= backoff {
                    return Err(BrokerError::Status(Status::BUSY));
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(16));
            }
            Err(BrokerError::Timeout { .. }) if saw_busy => {
                return Err(BrokerError::Status(Status::BUSY));
            }
            other => return other,
        }
    }
}

/// One connection: connect, send the request, read and decode the answer.
fn exchange(path: &Path, deadline: Instant) -> Result<u32, BrokerError> {
    let fd = connect(path, deadline)?;
    let mut buf = [0u8; RESPONSE_LEN + 1];
    if let Err(e) = write_full(&fd, &codec::encode_request(Request::GET_PID), deadline) {
        // A server may answer (BUSY, NO_PEER_PID) and close before reading
        // the request; its answer is still queued for us. Prefer it.
        let closed = matches!(
            e,
            BrokerError::Os {
                source: Errno::PIPE | Errno::CONNRESET,
                ..
            }
        );
        if !closed || read_full(&fd, &mut buf, deadline).is_err() {
            return Err(e);
        }
    } else {
        read_full(&fd, &mut buf, deadline)?;
    }
    let frame = buf.get(..RESPONSE_LEN).unwrap_or(&[]);
    let resp = codec::decode_response(frame).map_err(BrokerError::Frame)?;
    if resp.status != Status::OK {
        return Err(BrokerError::Status(resp.status));
    }
    Ok(resp.pid)
}

/// The `lstat` checks on the socket and its directory.
pub fn check_endpoint(path: &Path, trusted_uid: u32) -> Result<(), BrokerError> {
    let st = match rustix::fs::lstat(path) {
        Ok(st) => st,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Err(BrokerError::Missing),
        Err(source) => {
            return Err(BrokerError::Os {
                stage: Stage::Check,
                source,
            })
        }
    };
    let ft = FileType::from_raw_mode(st.st_mode);
    if ft == FileType::Symlink {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::Symlink));
    }
    if ft != FileType::Socket {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::NotSocket {
            mode: st.st_mode,
        }));
    }
    if st.st_uid != trusted_uid {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::SocketOwner {
            uid: st.st_uid,
            trusted: trusted_uid,
        }));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let pst = rustix::fs::stat(parent).map_err(|source| BrokerError::Os {
        stage: Stage::Check,
        source,
    })?;
    if FileType::from_raw_mode(pst.st_mode) != FileType::Directory {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::ParentNotDirectory));
    }
    if pst.st_uid != trusted_uid {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::ParentOwner {
            uid: pst.st_uid,
            trusted: trusted_uid,
        }));
    }
    let perm = Mode::from_raw_mode(pst.st_mode);
    if perm.intersects(Mode::WGRP | Mode::WOTH) {
        return Err(BrokerError::Unsafe(UnsafeEndpoint::ParentWritable {
            mode: pst.st_mode & 0o7777,
        }));
    }
    Ok(())
}

fn os(stage: Stage) -> impl Fn(Errno) -> BrokerError {
    move |source| BrokerError::Os { stage, source }
}

fn connect(path: &Path, deadline: Instant) -> Result<OwnedFd, BrokerError> {
    let addr = SocketAddrUnix::new(path).map_err(os(Stage::Connect))?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(os(Stage::Connect))?;
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => return Ok(fd),
            Err(Errno::INPROGRESS) | Err(Errno::INTR) => {
                // The connection completes asynchronously; SO_ERROR says how.
                wait(&fd, PollFlags::OUT, deadline, Stage::Connect)?;
                return match rustix::net::sockopt::socket_error(&fd) {
                    Ok(Ok(())) => Ok(fd),
                    Ok(Err(e)) | Err(e) => Err(os(Stage::Connect)(e)),
                };
            }
            Err(Errno::AGAIN) => {
                // A Unix socket's accept queue is full: nothing is pending on
                // our side, so back off briefly and try again.
                let left = remaining(deadline, Stage::Connect)?;
                std::thread::sleep(left.min(Duration::from_micros(200)));
            }
            Err(Errno::NOENT) => return Err(BrokerError::Missing),
            Err(e) => return Err(os(Stage::Connect)(e)),
        }
    }
}

fn remaining(deadline: Instant, stage: Stage) -> Result<Duration, BrokerError> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(BrokerError::Timeout { stage }),
    }
}

/// Polls `fd` for `flags` until ready or the deadline; EINTR restarts with
/// the time that is left.
pub(crate) fn wait(
    fd: &OwnedFd,
    flags: PollFlags,
    deadline: Instant,
    stage: Stage,
) -> Result<(), BrokerError> {
    loop {
        let left = remaining(deadline, stage)?;
        let ts = Timespec {
            tv_sec: left.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(fd, flags)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => return Err(BrokerError::Timeout { stage }),
            // Readiness, error or hangup: the next transfer says which.
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os(stage)(e)),
        }
    }
}

/// Sends all of `buf`, through EINTR and short writes; never raises SIGPIPE.
pub(crate) fn write_full(fd: &OwnedFd, buf: &[u8], deadline: Instant) -> Result<(), BrokerError> {
    let mut off = 0;
    while let Some(rest) = buf.get(off..).filter(|r| !r.is_empty()) {
        match rustix::net::send(fd.as_fd(), rest, SendFlags::NOSIGNAL) {
            Ok(0) => {
                return Err(BrokerError::Eof {
                    stage: Stage::Write,
                    got: off,
                })
            }
            Ok(n) => off += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => wait(fd, PollFlags::OUT, deadline, Stage::Write)?,
            Err(e) => return Err(os(Stage::Write)(e)),
        }
    }
    Ok(())
}

/// Reads into `buf` until at least `min` bytes are in, `buf` is full, or
/// EOF, through EINTR and short reads; returns the bytes read (fewer than
/// `min` only at EOF). A `buf` one byte longer than the frame catches bytes
/// queued after it in the same read, without an extra syscall.
pub(crate) fn read_upto(
    fd: &OwnedFd,
    buf: &mut [u8],
    min: usize,
    deadline: Instant,
    stage: Stage,
) -> Result<usize, BrokerError> {
    let mut off = 0;
    while off < min {
        let Some(rest) = buf.get_mut(off..).filter(|r| !r.is_empty()) else {
            break;
        };
        match rustix::net::recv(fd.as_fd(), rest, RecvFlags::empty()) {
            Ok((0, _)) => break,
            Ok((n, _)) => off += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => wait(fd, PollFlags::IN, deadline, stage)?,
            Err(e) => return Err(os(stage)(e)),
        }
    }
    Ok(off)
}

/// Reads one response frame; EOF before its end is a truncated frame, bytes
/// beyond it are trailing bytes (the decoder refuses both).
fn read_full(
    fd: &OwnedFd,
    buf: &mut [u8; RESPONSE_LEN + 1],
    deadline: Instant,
) -> Result<usize, BrokerError> {
    let got = read_upto(fd, buf, RESPONSE_LEN, deadline, Stage::Read)?;
    if got != RESPONSE_LEN {
        let part = buf.get(..got).unwrap_or(&[]);
        return Err(match codec::decode_response(part) {
            Err(e) => BrokerError::Frame(e),
            Ok(_) => BrokerError::Eof {
                stage: Stage::Read,
                got,
            },
        });
    }
    Ok(got)
}

// Keep the request length visible to readers of this module.
const _: () = assert!(REQUEST_LEN == 8 && RESPONSE_LEN == 12);
