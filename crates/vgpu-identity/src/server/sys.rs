//! The server's raw libc calls: peer credentials and signal masks. rustix's
//! `UCred` stores the pid as a non-zero type, but the kernel reports 0 for a
//! peer whose PID is not visible in our namespace, so `SO_PEERCRED` is read
//! here into `libc::ucred` instead.
use std::os::fd::{AsRawFd, BorrowedFd};

/// Peer credentials as the kernel reports them (pid may be 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Peer PID in the server's PID namespace; 0 when not visible there.
    pub pid: i32,
    /// Peer uid.
    pub uid: u32,
    /// Peer gid.
    pub gid: u32,
}

/// `getsockopt(SO_PEERCRED)`.
pub fn peer_cred(fd: BorrowedFd<'_>) -> std::io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live locals of the sizes the kernel is
    // told; the fd is borrowed, so it stays open for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "short SO_PEERCRED answer",
        ));
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The termination signals a broker handles: SIGTERM, SIGINT, SIGHUP.
fn term_set() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value to hand to sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live, writable sigset_t; the signal numbers are
    // valid, so these calls cannot fail.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
    }
    set
}

/// Blocks SIGTERM/SIGINT/SIGHUP in the calling thread (and so in every thread
/// it spawns afterwards), so that [`wait_termination`] can take them
/// synchronously instead of through an async handler.
pub fn block_termination_signals() -> std::io::Result<()> {
    let set = term_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for one of the blocked termination signals and returns its number.
pub fn wait_termination() -> std::io::Result<i32> {
    let set = term_set();
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised and `sig` is a live out-parameter.
    let rc = unsafe { libc::sigwait(&set, &mut sig) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(sig)
}
