//! Process plumbing for the harness: close-on-exec pipes, fork+exec of a
//! worker that inherits exactly the fds it is given, and `wait4` with
//! resource usage. All of this module's `unsafe` is here.
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

/// A pipe with both ends close-on-exec: no process inherits an end unless
/// [`spawn_with_fds`] hands it over.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(Into::into)
}

/// Fork+exec `cmd`, keeping `fds` open (same numbers) in the child only.
/// The fds stay close-on-exec in this process, so workers spawned by other
/// threads (parallel tests) never inherit them.
pub fn spawn_with_fds(cmd: &mut Command, fds: &[RawFd]) -> std::io::Result<u32> {
    let fds: Vec<RawFd> = fds.to_vec();
    // SAFETY: the closure runs in the forked child before exec; it only calls
    // fcntl(2), which is async-signal-safe, and allocates nothing (the Vec
    // was built before the fork and is only read).
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::null());
    let child = cmd.spawn()?;
    // We reap with wait4 ourselves (for rusage); the Child handle is dropped
    // without waiting, which std allows.
    Ok(child.id())
}

/// How a child ended, with its CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub utime_us: u64,
    pub stime_us: u64,
}

/// Blocking `wait4` on one child, retrying EINTR.
pub fn wait_child(pid: u32) -> std::io::Result<Exit> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `ru` are valid writable locals; pid is our child.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
        if r == pid as libc::pid_t {
            break;
        }
        let e = std::io::Error::last_os_error();
        if r == -1 && e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Ok(Exit {
        code,
        signal,
        utime_us: tv(ru.ru_utime),
        stime_us: tv(ru.ru_stime),
    })
}

/// SIGKILL one child (ignoring "already gone").
pub fn kill(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// Read from `fd` until EOF or `deadline`, counting bytes. Returns
/// `(bytes, reached_eof)`.
pub fn drain_until_eof(fd: &OwnedFd, deadline: Instant) -> std::io::Result<(usize, bool)> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut total = 0usize;
    let mut buf = [0u8; 4096];
    let mut file = std::fs::File::from(fd.try_clone()?);
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok((total, false));
        }
        let left = deadline - now;
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs().min(1) as _,
            tv_nsec: if left.as_secs() >= 1 {
                0
            } else {
                left.subsec_nanos() as _
            },
        };
        let mut pfd = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut pfd, Some(&ts)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        match file.read(&mut buf) {
            Ok(0) => return Ok((total, true)),
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Signal name for reports.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// The raw fd number (for worker arguments).
pub fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn child_exit_and_signal_are_reported() {
        let pid = spawn_with_fds(Command::new("sh").args(["-c", "exit 7"]), &[]).unwrap();
        let e = wait_child(pid).unwrap();
        assert_eq!((e.code, e.signal), (Some(7), None));
        let pid = spawn_with_fds(Command::new("sh").args(["-c", "kill -ABRT $$"]), &[]).unwrap();
        let e = wait_child(pid).unwrap();
        assert_eq!((e.code, e.signal), (None, Some(libc::SIGABRT)));
        assert_eq!(signal_name(libc::SIGABRT), "SIGABRT");
    }

    #[test]
    fn handed_fd_is_inherited_and_eof_arrives_when_writers_close() {
        let (r, w) = pipe().unwrap();
        let fd = raw(&w);
        let pid = spawn_with_fds(
            Command::new("sh").args(["-c", &format!("printf ab >&{fd}")]),
            &[fd],
        )
        .unwrap();
        drop(w);
        let (n, eof) = drain_until_eof(&r, Instant::now() + Duration::from_secs(30)).unwrap();
        assert_eq!((n, eof), (2, true));
        assert_eq!(wait_child(pid).unwrap().code, Some(0));
    }

    #[test]
    fn unhanded_fd_is_not_inherited() {
        let (r, w) = pipe().unwrap();
        let fd = raw(&w);
        // The child cannot write to an fd it did not inherit: the shell fails.
        let pid = spawn_with_fds(
            Command::new("sh").args(["-c", &format!("printf ab >&{fd} 2>/dev/null")]),
            &[],
        )
        .unwrap();
        drop(w);
        let (n, eof) = drain_until_eof(&r, Instant::now() + Duration::from_secs(30)).unwrap();
        assert_eq!((n, eof), (0, true));
        assert_ne!(wait_child(pid).unwrap().code, Some(0));
    }
}
