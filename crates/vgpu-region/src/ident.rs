//! Who a process is: (pid, start time, PID-namespace inode), read from
//! procfs, and whether a recorded owner is certainly dead.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The calling process as the region records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcIdentity {
    /// `getpid()`.
    pub pid: u32,
    /// Start time in clock ticks since boot (/proc/self/stat field 22);
    /// 0 when procfs could not tell.
    pub start_ticks: u64,
    /// Inode of /proc/self/ns/pid; 0 when unknown.
    pub pidns_inode: u64,
    /// Whether /proc is this namespace's procfs (its idea of "self" is us),
    /// so other PIDs read through it are the ones our owner words hold.
    pub procfs_ok: bool,
}

/// Reading procfs failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// /proc/<pid>/stat could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// /proc/<pid>/stat did not parse.
    #[error("malformed {path}: {why}")]
    Malformed {
        /// The path.
        path: String,
        /// What was wrong.
        why: &'static str,
    },
}

/// Fields of /proc/<pid>/stat we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFields {
    /// Field 1.
    pub pid: u32,
    /// Field 3 (R, S, D, Z, X, …).
    pub state: u8,
    /// Field 22.
    pub start_ticks: u64,
}

/// Parses the text of /proc/<pid>/stat. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(text: &str) -> Option<StatFields> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text[close + 1..].split_ascii_whitespace();
    let state = *rest.next()?.as_bytes().first()?;
    // After the state (field 3), field 22 is the 19th more.
    let start_ticks = rest.nth(18)?.parse().ok()?;
    Some(StatFields {
        pid,
        state,
        start_ticks,
    })
}

fn read_stat(path: &str) -> Result<StatFields, IdentityError> {
    let mut f = std::fs::File::open(path).map_err(|source| IdentityError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut buf = [0u8; 1024];
    let mut n = 0;
    // procfs hands out the whole line in one read; stop at its newline
    // (no second read for EOF: one syscall less on the cuInit path), loop
    // for short reads anyway.
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if buf[n - 1] == b'\n' {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(IdentityError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        }
    }
    let text = std::str::from_utf8(&buf[..n]).map_err(|_| IdentityError::Malformed {
        path: path.to_owned(),
        why: "not UTF-8",
    })?;
    parse_stat(text).ok_or(IdentityError::Malformed {
        path: path.to_owned(),
        why: "fields missing",
    })
}

/// Reads /proc/<pid>/stat.
pub fn stat_of(pid: u32) -> Result<StatFields, IdentityError> {
    // The thread-group leader's task entry: what `/proc/{pid}/stat` says on
    // a kernel, and what an emulator passes through even for its own PID
    // (see `current`).
    read_stat(&format!("/proc/{pid}/task/{pid}/stat"))
}

/// The calling process. Never fails: what procfs cannot tell is recorded as
/// unknown (and then this process never judges others dead).
pub fn current() -> ProcIdentity {
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    // The main thread's entry, not `/proc/self/stat`: the same start time
    // on a kernel, but an emulator (qemu-user, which runs the aarch64 tests)
    // fabricates `/proc/self/stat` and `/proc/<own pid>/stat` with its own
    // clock and per thread, and other processes read the kernel's value
    // when they judge this slot's owner: a mismatch there reads as a reused
    // PID, and a live owner's slot is reclaimed.
    let (start_ticks, procfs_ok) = match read_stat(&format!("/proc/self/task/{pid}/stat")) {
        Ok(s) if s.pid == pid => (s.start_ticks, true),
        _ => (0, false),
    };
    let pidns_inode = pidns_inode();
    ProcIdentity {
        pid,
        start_ticks,
        pidns_inode,
        procfs_ok: procfs_ok && pidns_inode != 0,
    }
}

/// Inode of our PID namespace: the link text "pid:[N]" is cheaper to read
/// than a stat of the namespace file; fall back to the stat.
fn pidns_inode() -> u64 {
    if let Ok(t) = std::fs::read_link("/proc/self/ns/pid") {
        if let Some(n) = t
            .to_str()
            .and_then(|t| t.strip_prefix("pid:["))
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse().ok())
        {
            return n;
        }
    }
    rustix::fs::stat("/proc/self/ns/pid")
        .map(|st| st.st_ino)
        .unwrap_or(0)
}

/// The calling process's identity, read from procfs once per process: a
/// fork child (another PID) reads its own. Process-local (lives in the
/// `Region` value, not in the shared file).
#[derive(Debug, Default)]
pub struct IdentityCache {
    pid: AtomicU32,
    start_ticks: AtomicU64,
    pidns_inode: AtomicU64,
    procfs_ok: AtomicBool,
}

impl IdentityCache {
    /// The caller's identity (cached while the PID is unchanged).
    pub fn get(&self) -> ProcIdentity {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        if self.pid.load(Ordering::Acquire) == pid {
            return ProcIdentity {
                pid,
                start_ticks: self.start_ticks.load(Ordering::Relaxed),
                pidns_inode: self.pidns_inode.load(Ordering::Relaxed),
                procfs_ok: self.procfs_ok.load(Ordering::Relaxed),
            };
        }
        let id = current();
        // Threads of one process store identical values, so racing fills
        // are harmless; the PID goes last and publishes the rest.
        self.start_ticks.store(id.start_ticks, Ordering::Relaxed);
        self.pidns_inode.store(id.pidns_inode, Ordering::Relaxed);
        self.procfs_ok.store(id.procfs_ok, Ordering::Relaxed);
        self.pid.store(id.pid, Ordering::Release);
        id
    }
}

/// Is the process (pid, start34) of our own namespace certainly gone?
/// Dead means proved dead: `kill(pid, 0)` says no such process, or procfs
/// shows a zombie or another start time (a reused PID). A process whose
/// liveness cannot be proved is alive: `EPERM` from the probe means the PID
/// exists (another user's process), and a `/proc/<pid>` entry we cannot
/// read (`hidepid=2` hides other users' processes, a stat that fails) says
/// nothing about it.
pub fn is_dead(me: &ProcIdentity, pid: u32, start34: u64) -> bool {
    if !me.procfs_ok || pid == 0 {
        return false;
    }
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    match rustix::process::test_kill_process(p) {
        Err(rustix::io::Errno::SRCH) => return true,
        Ok(()) | Err(rustix::io::Errno::PERM) => {}
        Err(_) => return false,
    }
    match stat_of(pid) {
        Ok(s) => {
            s.state == b'Z'
                || s.state == b'X'
                || (s.start_ticks & crate::core::START_MASK) != start34
        }
        // The PID existed a moment ago; its entry is hidden from us or it
        // just exited. Only a second probe that finds no process proves the
        // latter.
        Err(_) => matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let t = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        let s = parse_stat(t).unwrap();
        assert_eq!(s.pid, 42);
        assert_eq!(s.state, b'S');
        assert_eq!(s.start_ticks, 987654);
        assert_eq!(parse_stat("42 (x) S 1"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn self_is_alive_and_known() {
        let me = current();
        assert!(me.procfs_ok);
        assert!(me.start_ticks > 0);
        let s34 = me.start_ticks & crate::core::START_MASK;
        assert!(!is_dead(&me, me.pid, s34));
        // Same PID, another start time: a reused PID, so the owner is gone.
        assert!(is_dead(&me, me.pid, s34 ^ 1));
        let c = IdentityCache::default();
        assert_eq!(c.get(), me);
        assert_eq!(c.get(), me);
        let ns =
            std::fs::metadata("/proc/self/ns/pid").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        assert_eq!(me.pidns_inode, ns.unwrap());
    }
}
