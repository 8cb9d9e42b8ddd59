//! Trusted host procfs tier: the host PID from `NStgid` of `<mount>/self/status`.
//!
//! `NStgid` lists the thread-group id of the reading process in every PID
//! namespace from the namespace *of the procfs mount* down to the process's
//! own, so its first field is the PID as the mount's namespace sees it. With
//! the host's procfs bind-mounted into a container that is the host PID.
//!
//! # Which mounts are trusted
//!
//! The trap is a mount of the process's *own* procfs (the container's
//! `/proc`): `NStgid` there has exactly one level and the first field is the
//! inner PID, plausible and wrong. The rule, using only what the kernel says:
//!
//! 1. The file read must live on procfs (`fstatfs` magic `PROC_SUPER_MAGIC`),
//!    so a directory the container controls cannot fake a status file.
//! 2. `NStgid` must parse strictly (see [`parse_nstgid`]).
//! 3. Depth ≥ 2: the mount belongs to an ancestor PID namespace of the
//!    process (the kernel only resolves `self` where the process is
//!    visible); the first field is the PID there. Accepted.
//! 4. Depth 1: the mount's namespace *is* the process's own namespace. That
//!    is the host PID only when that namespace is the initial one, which is
//!    checked through `<mount>/self/ns/pid`: its inode is the kernel's
//!    fixed `PROC_PID_INIT_INO` only for the initial namespace. Otherwise the
//!    mount is the process's private `/proc` and is refused with
//!    [`ProcfsError::OwnNamespace`].
use std::io::Read;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::telemetry::FailureCode;

/// Most levels `NStgid` can have: the initial namespace plus the kernel's
/// `MAX_PID_NS_LEVEL` (32) nested ones.
pub const MAX_NS_LEVELS: usize = 33;

/// The inode number of the initial PID namespace (`PROC_PID_INIT_INO` in
/// `include/linux/proc_ns.h`), fixed by the kernel ABI.
pub const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// Filesystem magic of nsfs (`NSFS_MAGIC`), where `/proc/*/ns/*` links lead.
const NSFS_MAGIC: u64 = 0x6e73_6673;

/// Largest `status` file read; real ones are ~1.5 KiB.
const STATUS_MAX: usize = 64 * 1024;

/// `NStgid` values, outermost (mount's namespace) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsTgid {
    levels: [u32; MAX_NS_LEVELS],
    len: usize,
}

impl NsTgid {
    /// The PID in the procfs mount's namespace (the first field).
    pub fn outermost(&self) -> u32 {
        self.levels[0]
    }

    /// The PID in the process's own namespace (the last field).
    pub fn innermost(&self) -> u32 {
        self.levels[self.len.saturating_sub(1)]
    }

    /// Number of levels (1 when the mount is the process's own namespace).
    pub fn depth(&self) -> usize {
        self.len
    }

    /// All levels, outermost first.
    pub fn as_slice(&self) -> &[u32] {
        &self.levels[..self.len]
    }
}

/// What is wrong with an `NStgid` field (or its absence).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// No line starts with exactly `NStgid:` (kernels before 4.1 lack it).
    #[error("no NStgid: line")]
    Missing,
    /// More than one `NStgid:` line.
    #[error("more than one NStgid: line")]
    Duplicate,
    /// The line has no value.
    #[error("NStgid: has no value")]
    Empty,
    /// A field is not a plain decimal (sign, leading zero, other byte).
    #[error("NStgid field {index} is not a plain decimal: {field:?}")]
    NotDecimal {
        /// 0-based field index.
        index: usize,
        /// The offending text, lossily decoded and cut to 32 bytes.
        field: String,
    },
    /// A field is 0 or above `INT_MAX`.
    #[error("NStgid field {index} is out of range (1..=2147483647)")]
    OutOfRange {
        /// 0-based field index.
        index: usize,
    },
    /// More levels than the kernel can nest.
    #[error("NStgid has more than {MAX_NS_LEVELS} levels")]
    TooDeep,
}

/// Why the procfs tier gave no host PID.
#[derive(Debug, thiserror::Error)]
pub enum ProcfsError {
    /// `<mount>/self/status` could not be opened or read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not on procfs.
    #[error("{path} is not on procfs (filesystem magic {magic:#x})")]
    NotProcfs {
        /// The file.
        path: PathBuf,
        /// The filesystem magic seen.
        magic: u64,
    },
    /// The status file did not parse.
    #[error("bad NStgid in {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: ParseError,
    },
    /// The mount is the process's own (private) procfs, not the host's.
    #[error(
        "{mount} is this process's own procfs (NStgid has one level and the PID namespace is not the initial one); it would give the inner PID"
    )]
    OwnNamespace {
        /// The mount given.
        mount: PathBuf,
    },
}

impl ProcfsError {
    /// Stable telemetry code.
    pub fn failure_code(&self) -> FailureCode {
        match self {
            ProcfsError::Read { .. } => FailureCode::PROCFS_READ,
            ProcfsError::NotProcfs { .. } => FailureCode::PROCFS_NOT_PROCFS,
            ProcfsError::Parse { .. } => FailureCode::PROCFS_PARSE,
            ProcfsError::OwnNamespace { .. } => FailureCode::PROCFS_OWN_NAMESPACE,
        }
    }
}

fn is_sep(b: u8) -> bool {
    b == b'\t' || b == b' '
}

fn parse_field(index: usize, f: &[u8]) -> Result<u32, ParseError> {
    let not_decimal = || ParseError::NotDecimal {
        index,
        field: String::from_utf8_lossy(&f[..f.len().min(32)]).into_owned(),
    };
    // Kernel output never has a sign or a leading zero: either is junk.
    if f.is_empty() || f.len() > 10 || !f.iter().all(u8::is_ascii_digit) || f[0] == b'0' {
        return Err(not_decimal());
    }
    let v = f.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
    if v == 0 || v > u64::from(crate::codec::PID_MAX) {
        return Err(ParseError::OutOfRange { index });
    }
    Ok(v as u32)
}

/// Parses the `NStgid:` line of a `/proc/<pid>/status` file.
///
/// Strict: the field name must match exactly and start a line; values are
/// separated by tabs or spaces; each is a decimal in `1..=INT_MAX` without
/// sign or leading zero; nothing else may follow on the line; at most
/// [`MAX_NS_LEVELS`] values; exactly one such line.
pub fn parse_nstgid(status: &[u8]) -> Result<NsTgid, ParseError> {
    const KEY: &[u8] = b"NStgid:";
    let mut found: Option<NsTgid> = None;
    for line in status.split(|&b| b == b'\n') {
        let Some(rest) = line.strip_prefix(KEY) else {
            continue;
        };
        if found.is_some() {
            return Err(ParseError::Duplicate);
        }
        let mut out = NsTgid {
            levels: [0; MAX_NS_LEVELS],
            len: 0,
        };
        for (index, field) in rest
            .split(|&b| is_sep(b))
            .filter(|f| !f.is_empty())
            .enumerate()
        {
            if index >= MAX_NS_LEVELS {
                return Err(ParseError::TooDeep);
            }
            out.levels[index] = parse_field(index, field)?;
            out.len = index + 1;
        }
        if out.len == 0 {
            return Err(ParseError::Empty);
        }
        found = Some(out);
    }
    found.ok_or(ParseError::Missing)
}

fn read_status(path: &Path) -> Result<Vec<u8>, ProcfsError> {
    let read_err = |source: std::io::Error| ProcfsError::Read {
        path: path.to_owned(),
        source,
    };
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| read_err(e.into()))?;
    let sfs = rustix::fs::fstatfs(&fd).map_err(|e| read_err(e.into()))?;
    // f_type's integer type differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = sfs.f_type as u64;
    #[allow(clippy::unnecessary_cast)]
    if magic != rustix::fs::PROC_SUPER_MAGIC as u64 {
        return Err(ProcfsError::NotProcfs {
            path: path.to_owned(),
            magic,
        });
    }
    let mut buf = Vec::with_capacity(2048);
    std::fs::File::from(fd)
        .take(STATUS_MAX as u64)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    Ok(buf)
}

/// The host PID of the calling process from a trusted procfs mount.
///
/// See the module docs for the rule that refuses the process's own `/proc`.
pub fn host_pid_from_mount(mount: &Path) -> Result<u32, ProcfsError> {
    let status_path = mount.join("self/status");
    let status = read_status(&status_path)?;
    let ns = parse_nstgid(&status).map_err(|source| ProcfsError::Parse {
        path: status_path.clone(),
        source,
    })?;
    if ns.depth() >= 2 {
        return Ok(ns.outermost());
    }
    // One level: the mount's namespace is our own; only the initial one is
    // the host's.
    let ns_path = mount.join("self/ns/pid");
    let st = rustix::fs::stat(&ns_path).map_err(|e| ProcfsError::Read {
        path: ns_path,
        source: e.into(),
    })?;
    if st.st_ino == PROC_PID_INIT_INO {
        Ok(ns.outermost())
    } else {
        Err(ProcfsError::OwnNamespace {
            mount: mount.to_owned(),
        })
    }
}

/// Whether the calling process runs in the initial PID namespace, judged by
/// `<proc>/self/ns/pid` (normally `/proc`): the link must lead to nsfs and
/// carry the kernel's fixed `PROC_PID_INIT_INO`. Then `getpid()` is the host
/// PID and no tier is needed. `proc` itself must be procfs.
pub fn in_initial_pid_namespace(proc: &Path) -> Result<bool, ProcfsError> {
    let ns_path = proc.join("self/ns/pid");
    let read_err = |e: rustix::io::Errno| ProcfsError::Read {
        path: ns_path.clone(),
        source: e.into(),
    };
    #[allow(clippy::unnecessary_cast)]
    let magic = rustix::fs::statfs(proc).map_err(read_err)?.f_type as u64;
    #[allow(clippy::unnecessary_cast)]
    if magic != rustix::fs::PROC_SUPER_MAGIC as u64 {
        return Err(ProcfsError::NotProcfs {
            path: proc.to_owned(),
            magic,
        });
    }
    // Opening the link follows it to the namespace inode on nsfs.
    let fd = rustix::fs::open(&ns_path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(read_err)?;
    #[allow(clippy::unnecessary_cast)]
    let ns_magic = rustix::fs::fstatfs(&fd).map_err(read_err)?.f_type as u64;
    let st = rustix::fs::fstat(&fd).map_err(read_err)?;
    Ok(ns_magic == NSFS_MAGIC && st.st_ino == PROC_PID_INIT_INO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_shape() {
        let s = b"Name:\tx\nTgid:\t1\nNgid:\t0\nNStgid:\t8011\t1\nNSpid:\t8011\t1\n";
        let n = parse_nstgid(s).unwrap();
        assert_eq!(n.as_slice(), &[8011, 1]);
        assert_eq!(n.outermost(), 8011);
        assert_eq!(n.innermost(), 1);
        let one = parse_nstgid(b"NStgid:\t42").unwrap();
        assert_eq!(one.depth(), 1);
        let spaces = parse_nstgid(b"NStgid:  7  3 \n").unwrap();
        assert_eq!(spaces.as_slice(), &[7, 3]);
    }

    #[test]
    fn refuses_junk() {
        use ParseError::*;
        assert_eq!(parse_nstgid(b"Tgid:\t5\n"), Err(Missing));
        assert_eq!(parse_nstgid(b"nstgid:\t5\n"), Err(Missing));
        assert_eq!(parse_nstgid(b" NStgid:\t5\n"), Err(Missing));
        assert_eq!(parse_nstgid(b"NStgid :\t5\n"), Err(Missing));
        assert_eq!(parse_nstgid(b"NStgid:\t5\nNStgid:\t5\n"), Err(Duplicate));
        assert_eq!(parse_nstgid(b"NStgid:\t\n"), Err(Empty));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t5x\n"),
            Err(NotDecimal { index: 0, .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t5\t+3\n"),
            Err(NotDecimal { index: 1, .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t-5\n"),
            Err(NotDecimal { .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t05\n"),
            Err(NotDecimal { .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t0\n"),
            Err(NotDecimal { .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t5\r\n"),
            Err(NotDecimal { .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t5,6\n"),
            Err(NotDecimal { .. })
        ));
        assert!(matches!(
            parse_nstgid(b"NStgid:\t99999999999\n"),
            Err(NotDecimal { .. })
        ));
        assert_eq!(
            parse_nstgid(b"NStgid:\t2147483648\n"),
            Err(OutOfRange { index: 0 })
        );
        assert_eq!(
            parse_nstgid(b"NStgid:\t2147483647\n").unwrap().outermost(),
            i32::MAX as u32
        );
    }

    #[test]
    fn bounds_depth() {
        let mut ok = b"NStgid:".to_vec();
        for i in 0..MAX_NS_LEVELS {
            ok.extend_from_slice(format!("\t{}", i + 1).as_bytes());
        }
        assert_eq!(parse_nstgid(&ok).unwrap().depth(), MAX_NS_LEVELS);
        ok.extend_from_slice(b"\t9");
        assert_eq!(parse_nstgid(&ok), Err(ParseError::TooDeep));
    }

    #[test]
    fn own_proc_in_initial_namespace_is_the_host() {
        // The test process runs in the host PID namespace here.
        let ns = std::fs::metadata("/proc/self/ns/pid").unwrap();
        if std::os::unix::fs::MetadataExt::ino(&ns) != PROC_PID_INIT_INO {
            eprintln!("skipping: not in the initial PID namespace");
            return;
        }
        assert_eq!(
            host_pid_from_mount(Path::new("/proc")).unwrap(),
            std::process::id()
        );
    }

    #[test]
    fn initial_namespace_is_recognised() {
        let here = in_initial_pid_namespace(Path::new("/proc")).unwrap();
        let ino =
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/self/ns/pid").unwrap());
        assert_eq!(here, ino == PROC_PID_INIT_INO);
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            in_initial_pid_namespace(dir.path()),
            Err(ProcfsError::NotProcfs { .. })
        ));
    }

    #[test]
    fn non_procfs_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("self/status"), b"NStgid:\t4242\t1\n").unwrap();
        let err = host_pid_from_mount(dir.path()).unwrap_err();
        assert!(matches!(err, ProcfsError::NotProcfs { .. }), "{err}");
        assert_eq!(err.failure_code(), FailureCode::PROCFS_NOT_PROCFS);
        let missing = host_pid_from_mount(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, ProcfsError::Read { .. }), "{missing}");
    }
}
