//! Opening and publishing a region file without trusting its path.
//!
//! Owns: the directory fd every file operation works relative to, the
//! checks on that directory and on what is at the path, and the mode a new
//! region gets. Never: follows a symlink at the region path, blocks opening
//! a FIFO, opens anything but a regular file, or leaves the mode to the
//! umask. Paths above the directory may be symlinks (the operator's
//! layout); the file itself never is.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::clock::monotonic_ns;
use crate::region::RegionError;

/// The mode every region gets, set with `fchmod` whatever the umask: every
/// process of the container (any user) must be able to write it, or it runs
/// on a private ledger. Who can reach the file at all is the directory's
/// business (`vgpu run`: a private 0700 directory; the node agent: the
/// container's own directory).
pub const REGION_MODE: u32 = 0o666;

/// Test builds only (feature `failpoints`): set, creators use the named
/// temporary file instead of `O_TMPFILE`, as on a filesystem without it.
pub const NO_TMPFILE_ENV: &str = "VGPU_REGION_NO_TMPFILE";

/// The region's directory, opened and checked once.
pub(crate) struct Dir {
    fd: OwnedFd,
    name: OsString,
    uid: u32,
    mode: u32,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> RegionError + 'a {
    move |e| RegionError::Io {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// Effective uid of this process.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

impl Dir {
    /// Opens the directory of `path` and checks it is one we may trust:
    /// owned by root or by us (a directory another user owns lets that user
    /// swap the file under us at any time).
    pub(crate) fn open(path: &Path) -> Result<Dir, RegionError> {
        let name = path
            .file_name()
            .ok_or_else(|| RegionError::BadOptions {
                what: format!("{} names no file", path.display()),
            })?
            .to_owned();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err("open directory", dir))?;
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat directory", dir))?;
        let me = euid();
        if st.st_uid != 0 && st.st_uid != me {
            return Err(RegionError::UntrustedDirectory {
                path: dir.to_owned(),
                owner: st.st_uid,
                mode: st.st_mode & 0o7777,
            });
        }
        Ok(Dir {
            fd,
            name,
            uid: st.st_uid,
            mode: st.st_mode,
        })
    }

    /// Others may create files here, and the sticky bit keeps them from
    /// removing ours (/tmp): a file found here is trusted only when it is
    /// root's, ours or the directory owner's (the kernel's
    /// `protected_regular` rule, applied whatever the sysctl says).
    fn shared_sticky(&self) -> bool {
        self.mode & 0o1000 != 0 && self.mode & 0o022 != 0
    }

    fn stat_at(&self) -> Option<Stat> {
        rustix::fs::statat(&self.fd, self.name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
    }

    /// Opens the file at the path: never through a symlink, never blocking,
    /// a regular file only. Returns it with its `fstat`.
    pub(crate) fn open_file(
        &self,
        path: &Path,
        writable: bool,
    ) -> Result<(File, Stat), RegionError> {
        let access = if writable {
            OFlags::RDWR
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::openat(
            &self.fd,
            self.name.as_os_str(),
            access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::LOOP => RegionError::Symlink {
                path: path.to_owned(),
            },
            // A socket (open(2) of one is ENXIO), a directory opened for
            // writing (EISDIR).
            Errno::NXIO | Errno::ISDIR => RegionError::NotRegularFile {
                path: path.to_owned(),
                kind: self.stat_at().map_or("socket", |st| {
                    crate::limits::file_kind(FileType::from_raw_mode(st.st_mode))
                }),
            },
            Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::TXTBSY => {
                let st = self.stat_at();
                RegionError::Permission {
                    path: path.to_owned(),
                    writing: writable,
                    mode: st.as_ref().map_or(0, |s| s.st_mode & 0o7777),
                    owner: st.as_ref().map_or(u32::MAX, |s| s.st_uid),
                    source: e.into(),
                }
            }
            e => io_err("open", path)(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat", path))?;
        let ft = FileType::from_raw_mode(st.st_mode);
        if ft != FileType::RegularFile {
            return Err(RegionError::NotRegularFile {
                path: path.to_owned(),
                kind: crate::limits::file_kind(ft),
            });
        }
        let me = euid();
        if self.shared_sticky() && st.st_uid != 0 && st.st_uid != me && st.st_uid != self.uid {
            return Err(RegionError::UntrustedFile {
                path: path.to_owned(),
                why: format!(
                    "owned by uid {} in a shared sticky directory (mode {:o})",
                    st.st_uid,
                    self.mode & 0o7777
                ),
            });
        }
        Ok((File::from(fd), st))
    }

    /// An unpublished file in this directory for a new region: `O_TMPFILE`
    /// (unnamed), else a dot-named temporary created exclusively (its name
    /// returned). Mode `REGION_MODE`, set explicitly.
    pub(crate) fn new_file(&self, path: &Path) -> Result<(File, Option<OsString>), RegionError> {
        let private = Mode::from_raw_mode(0o600);
        // Test builds can force the fallback (`VGPU_REGION_NO_TMPFILE`).
        let tmp = if cfg!(feature = "failpoints") && std::env::var_os(NO_TMPFILE_ENV).is_some() {
            Err(Errno::OPNOTSUPP)
        } else {
            rustix::fs::openat(
                &self.fd,
                ".",
                OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
                private,
            )
        };
        let (fd, named) = match tmp {
            Ok(fd) => (fd, None),
            // Filesystems (or kernels) without O_TMPFILE.
            Err(Errno::OPNOTSUPP) | Err(Errno::ISDIR) | Err(Errno::INVAL) => {
                let mut t = OsString::from(".");
                t.push(&self.name);
                t.push(format!(
                    ".{}.{}.tmp",
                    rustix::process::getpid().as_raw_nonzero(),
                    monotonic_ns()
                ));
                let fd = rustix::fs::openat(
                    &self.fd,
                    t.as_os_str(),
                    OFlags::RDWR
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    private,
                )
                .map_err(io_err("create", path))?;
                (fd, Some(t))
            }
            Err(e) => return Err(io_err("create in the directory of", path)(e)),
        };
        let f = File::from(fd);
        if let Err(e) = set_region_mode(&f, path) {
            if let Some(t) = &named {
                self.remove(t);
            }
            return Err(e);
        }
        Ok((f, named))
    }

    /// Links a finished file at the path. False when something is already
    /// there (`link(2)` never follows or replaces it).
    pub(crate) fn publish(
        &self,
        f: &File,
        named: Option<&OsString>,
        path: &Path,
    ) -> Result<bool, RegionError> {
        let r = match named {
            Some(t) => rustix::fs::linkat(
                &self.fd,
                t.as_os_str(),
                &self.fd,
                self.name.as_os_str(),
                AtFlags::empty(),
            ),
            None => {
                // Through /proc/self/fd (no privilege needed), else
                // AT_EMPTY_PATH (needs CAP_DAC_READ_SEARCH, e.g. without
                // procfs).
                use std::os::fd::AsRawFd;
                let proc_path = format!("/proc/self/fd/{}", f.as_raw_fd());
                match rustix::fs::linkat(
                    rustix::fs::CWD,
                    proc_path.as_str(),
                    &self.fd,
                    self.name.as_os_str(),
                    AtFlags::SYMLINK_FOLLOW,
                ) {
                    Err(Errno::NOENT) if !Path::new("/proc/self/fd").exists() => {
                        rustix::fs::linkat(
                            f,
                            "",
                            &self.fd,
                            self.name.as_os_str(),
                            AtFlags::EMPTY_PATH,
                        )
                    }
                    r => r,
                }
            }
        };
        match r {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(io_err("link", path)(e)),
        }
    }

    /// Removes a named temporary.
    pub(crate) fn remove(&self, named: &OsString) {
        let _ = rustix::fs::unlinkat(&self.fd, named.as_os_str(), AtFlags::empty());
    }
}

/// `fchmod(REGION_MODE)`.
pub(crate) fn set_region_mode(f: &File, path: &Path) -> Result<(), RegionError> {
    rustix::fs::fchmod(f, Mode::from_raw_mode(REGION_MODE)).map_err(io_err("chmod", path))
}

/// A file name for a memfd-backed private region.
pub(crate) fn private_path() -> PathBuf {
    PathBuf::from("(process-private ledger)")
}
