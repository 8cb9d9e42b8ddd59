//! The client half of the daemon protocol (see `daemon`).
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::daemon::{sock_path, CMD_ATTACH, MAGIC, STATUS_OK};

/// Where a process finds its simulated machine when `VGPU_SIM_DIR` is unset.
pub const DEFAULT_DIR: &str = "/tmp/vgpu-sim";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no vgpu-sim daemon at {path} (start one with `vgpu sim env`)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("vgpu-sim daemon at {path}: request failed")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("vgpu-sim daemon at {path}: bad reply")]
    BadReply { path: PathBuf },
    #[error("vgpu-sim daemon at {path}: refused with status {status}")]
    Refused { path: PathBuf, status: u32 },
}

/// The machine directory: `$VGPU_SIM_DIR`, else `/tmp/vgpu-sim`.
pub fn sim_dir() -> PathBuf {
    match std::env::var_os("VGPU_SIM_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// Reply to one request: (host pid of the caller, record index).
pub fn request(dir: &Path, cmd: u8) -> Result<(u32, u32), ClientError> {
    let path = sock_path(dir);
    let mut s = UnixStream::connect(&path).map_err(|source| ClientError::Connect {
        path: path.clone(),
        source,
    })?;
    let io = |source| ClientError::Io {
        path: path.clone(),
        source,
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut req = [0u8; 8];
    req[..4].copy_from_slice(MAGIC);
    req[4] = cmd;
    s.write_all(&req).map_err(io)?;
    let mut rep = [0u8; 16];
    s.read_exact(&mut rep).map_err(io)?;
    if &rep[..4] != MAGIC {
        return Err(ClientError::BadReply { path });
    }
    let word = |i: usize| u32::from_le_bytes([rep[i], rep[i + 1], rep[i + 2], rep[i + 3]]);
    if word(4) != STATUS_OK {
        return Err(ClientError::Refused {
            path,
            status: word(4),
        });
    }
    Ok((word(8), word(12)))
}

/// An IPC request (see `daemon`): `(x, y, descriptor)` of the reply.
pub fn ipc_request(
    dir: &Path,
    cmd: u8,
    a: u64,
    b: u64,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(u32, u64, Option<std::os::fd::OwnedFd>), ClientError> {
    use rustix::net::{
        recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
        SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    };
    let path = sock_path(dir);
    let s = UnixStream::connect(&path).map_err(|source| ClientError::Connect {
        path: path.clone(),
        source,
    })?;
    let io = |source: std::io::Error| ClientError::Io {
        path: path.clone(),
        source,
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut req = [0u8; 24];
    req[..4].copy_from_slice(MAGIC);
    req[4] = cmd;
    req[8..16].copy_from_slice(&a.to_le_bytes());
    req[16..24].copy_from_slice(&b.to_le_bytes());
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(f) = fd {
        fds = [f];
        anc.push(SendAncillaryMessage::ScmRights(&fds));
    }
    let sent = sendmsg(
        &s,
        &[std::io::IoSlice::new(&req)],
        &mut anc,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| io(e.into()))?;
    if sent != req.len() {
        return Err(ClientError::BadReply { path });
    }
    let mut rep = [0u8; 24];
    let mut got = 0;
    let mut out_fd = None;
    while got < rep.len() {
        let mut rspace = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut ranc = RecvAncillaryBuffer::new(&mut rspace);
        let mut iov = [std::io::IoSliceMut::new(&mut rep[got..])];
        let r = match recvmsg(&s, &mut iov, &mut ranc, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io(e.into())),
        };
        for msg in ranc.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    out_fd.get_or_insert(f);
                }
            }
        }
        if r.bytes == 0 {
            return Err(ClientError::BadReply { path });
        }
        got += r.bytes;
    }
    if &rep[..4] != MAGIC {
        return Err(ClientError::BadReply { path });
    }
    let status = u32::from_le_bytes([rep[4], rep[5], rep[6], rep[7]]);
    if status != STATUS_OK {
        return Err(ClientError::Refused { path, status });
    }
    let x = u32::from_le_bytes([rep[12], rep[13], rep[14], rep[15]]);
    let y = u64::from_le_bytes(rep[16..24].try_into().unwrap_or([0; 8]));
    Ok((x, y, out_fd))
}

/// Is a daemon serving `dir`? Returns its pid (0 if it left no pid file).
pub fn ping(dir: &Path) -> Result<u32, ClientError> {
    request(dir, CMD_ATTACH)?;
    Ok(std::fs::read_to_string(crate::daemon::pid_path(dir))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0))
}
