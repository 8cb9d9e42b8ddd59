//! `Region`: a mapped region file and every operation on it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;

use crate::clock::{monotonic_ns, realtime_ns};
use crate::core::{self, AdmissionError, Env, MemKind, Owner, Release, View};
use crate::failpoint::Plan;
use crate::ident::{self, ProcIdentity};
use crate::layout::*;
use crate::open::Dir;
use crate::snapshot::{self, Snapshot};
use crate::sync::Ordering::{Acquire, Relaxed, Release as Rel, SeqCst};
use crate::telemetry::*;

/// How to create a region when none exists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Slots (processes at once); 0 means the default, 1024.
    pub slots: u32,
    /// Devices, in CUDA index order (at most 16).
    pub devices: Vec<DeviceConfig>,
}

/// One device's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    /// UUID, e.g. "GPU-…" (at most 63 bytes).
    pub uuid: String,
    /// Memory limit in bytes; 0 = none.
    pub mem_limit: u64,
    /// SM limit in percent; 0 = none.
    pub sm_limit: u32,
}

/// The recorded configuration differs from what an opener asked for; the
/// recorded value stays (change it with `set_limits` / `vgpu limit`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LimitMismatch {
    /// Device index.
    pub device: u32,
    /// "memory limit", "SM limit", "uuid", "device count" or "slot count"
    /// (the last two are region-wide; `device` is 0).
    pub field: &'static str,
    /// Value in the region.
    pub recorded: String,
    /// Value the opener asked for.
    pub requested: String,
}

impl std::fmt::Display for LimitMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {}: {} recorded in the region is {}, this process asked for {}; keeping {}",
            self.device, self.field, self.recorded, self.requested, self.recorded
        )
    }
}

/// The region header's display copy of a limit differs from the limits
/// file (`Region::display_mismatches`); the file's value is the one that
/// applies.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DisplayMismatch {
    /// Device index.
    pub device: u32,
    /// Its UUID.
    pub uuid: String,
    /// "memory limit" or "SM limit".
    pub field: &'static str,
    /// The header's value (0 = none).
    pub region: u64,
    /// The file's value (0 = none).
    pub file: u64,
}

impl std::fmt::Display for DisplayMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = |n: u64| {
            if n == 0 {
                "none".to_string()
            } else {
                n.to_string()
            }
        };
        write!(
            f,
            "device {} ({}): {} in the region header is {}, the limits file says {}; the limits file applies",
            self.device,
            self.uuid,
            self.field,
            v(self.region),
            v(self.file)
        )
    }
}

/// Who holds a claimed slot, as `reclaim_where` shows it to its judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SlotOwner {
    /// The slot.
    pub slot: SlotId,
    /// The slot is being cleared by the process named here (which died
    /// mid-way if it is gone), not held by its original owner.
    pub reclaiming: bool,
    /// PID in its namespace.
    pub pid: u32,
    /// Inode of that PID namespace (0 = unknown).
    pub pid_ns: u64,
    /// Start time, low 34 bits of clock ticks since boot (as in the owner word).
    pub start_time_low34: u64,
    /// Full start time (clock ticks since boot; 0 when reclaiming or not yet
    /// published).
    pub start_time: u64,
    /// Host PID when identity found it (0 = unknown or reclaiming).
    pub host_pid: u32,
}

/// A claimed slot (index into the region's slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct SlotId(pub u32);

impl SlotId {
    /// The slot index.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// Why a region cannot be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// A system call on the file failed.
    #[error("{op} {path}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but is not a region this build can use.
    #[error("refusing {path}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Which kind of refusal.
        #[source]
        source: FormatError,
    },
    /// Another process holds the creation lock for longer than we wait (a
    /// creator that is stopped, not dead: the kernel would have released
    /// the lock of a dead one).
    #[error("{path}: creation lock still held after {waited:?}")]
    LockTimeout {
        /// The file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The options cannot be recorded.
    #[error("bad region options: {what}")]
    BadOptions {
        /// What is wrong.
        what: String,
    },
    /// Every slot is held by a live process.
    #[error("all {slots} slots are held by live processes")]
    Full {
        /// Slot count.
        slots: u32,
    },
    /// The region was opened read-only.
    #[error("the region was opened read-only")]
    ReadOnly,
    /// Processes of too many PID namespaces share this region.
    #[error("the region's PID-namespace table is full ({NS_TABLE_LEN} namespaces)")]
    NamespaceTableFull,
    /// A device index out of range.
    #[error("device {dev} is not in this region ({count} devices)")]
    NoSuchDevice {
        /// Index asked for.
        dev: u32,
        /// Devices configured.
        count: u32,
    },
    /// A symlink at the region path: never followed (someone may have
    /// planted it to make us write another file).
    #[error("{}: a symbolic link (a region path is never followed)", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// A FIFO, socket, device or directory at the region path.
    #[error("{}: not a regular file ({kind})", path.display())]
    NotRegularFile {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// The region's directory is owned by another user, who could swap the
    /// file under us at any time.
    #[error("{}: directory owned by uid {owner} (mode {mode:o}), neither root nor this process's user", path.display())]
    UntrustedDirectory {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// A file at the region path that this process must not use (another
    /// user's in a shared sticky directory, or hard-linked elsewhere).
    #[error("{}: refusing a file {why}", path.display())]
    UntrustedFile {
        /// The path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// This process may not open the file as it needs (its mode or owner,
    /// a read-only filesystem): the "wrong mode" case.
    #[error("{}: cannot open for {} (mode {mode:o}, owner uid {owner}; regions are created {:o})", path.display(), if *writing { "writing" } else { "reading" }, crate::open::REGION_MODE)]
    Permission {
        /// The path.
        path: PathBuf,
        /// Whether we asked to write.
        writing: bool,
        /// The file's permission bits (0 when unknown).
        mode: u32,
        /// Its owner (u32::MAX when unknown).
        owner: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file changed under `Region::open_copy` in a way that leaves no
    /// copy worth reading: it shrank below its header's length, or its
    /// header was rewritten, while it was being copied.
    #[error("{}: changed while it was copied: {what}", path.display())]
    ChangedWhileCopied {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// A HAMi-core shared region (HAMi's own `libvgpu.so`) at the same
    /// path: a leftover of a HAMi installation, never reinterpreted.
    #[error("{}: a HAMi-core shared region (version {major}.{minor}), not a vgpu region: remove it or use another path", path.display())]
    HamiRegion {
        /// The path.
        path: PathBuf,
        /// HAMi's major version field.
        major: u32,
        /// HAMi's minor version field.
        minor: u32,
    },
}

/// Why a region cannot be used, as one small value: the interposer maps
/// every cause to the same fail-closed behaviour (a private ledger with the
/// configured limit) and names the cause in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Unusable {
    /// No file (or no directory) at the path; `open_or_create` creates it.
    Missing,
    /// A symlink at the path.
    Symlink,
    /// A FIFO, socket, device or directory at the path.
    NotRegularFile,
    /// An untrusted directory or file (owner, hard links).
    Untrusted,
    /// Not openable as needed: mode, owner, read-only filesystem.
    Permission,
    /// A HAMi-core shared region (a HAMi leftover at the same path).
    HamiRegion,
    /// Some other file that is not a vgpu region.
    Foreign,
    /// A vgpu region of another version, layout or byte order.
    OtherVersion,
    /// Truncated, a corrupt header, never finished, or changed under a
    /// copy.
    Corrupt,
    /// Another process holds the creation lock too long.
    Busy,
    /// Every slot is held by a live process.
    Full,
    /// The PID-namespace table is full.
    NamespaceTableFull,
    /// Another system error.
    Io,
    /// A caller error (bad options, device index, a read-only mapping).
    Misuse,
}

impl Unusable {
    /// Stable lower-case name, for log lines and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Unusable::Missing => "missing",
            Unusable::Symlink => "symlink",
            Unusable::NotRegularFile => "not-regular-file",
            Unusable::Untrusted => "untrusted",
            Unusable::Permission => "permission",
            Unusable::HamiRegion => "hami-region",
            Unusable::Foreign => "foreign",
            Unusable::OtherVersion => "other-version",
            Unusable::Corrupt => "corrupt",
            Unusable::Busy => "busy",
            Unusable::Full => "full",
            Unusable::NamespaceTableFull => "namespace-table-full",
            Unusable::Io => "io",
            Unusable::Misuse => "misuse",
        }
    }
}

impl RegionError {
    /// The cause, classified.
    pub fn unusable(&self) -> Unusable {
        match self {
            RegionError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Unusable::Missing
            }
            RegionError::Io { .. } => Unusable::Io,
            RegionError::Format { source, .. } => match source {
                FormatError::ForeignMagic { .. } => Unusable::Foreign,
                FormatError::OtherVersion { .. }
                | FormatError::OtherEndianness { .. }
                | FormatError::OtherLayout { .. } => Unusable::OtherVersion,
                FormatError::Truncated { .. }
                | FormatError::Corrupt { .. }
                | FormatError::NotInitialized { .. } => Unusable::Corrupt,
            },
            RegionError::ChangedWhileCopied { .. } => Unusable::Corrupt,
            RegionError::LockTimeout { .. } => Unusable::Busy,
            RegionError::Full { .. } => Unusable::Full,
            RegionError::NamespaceTableFull => Unusable::NamespaceTableFull,
            RegionError::BadOptions { .. }
            | RegionError::ReadOnly
            | RegionError::NoSuchDevice { .. } => Unusable::Misuse,
            RegionError::Symlink { .. } => Unusable::Symlink,
            RegionError::NotRegularFile { .. } => Unusable::NotRegularFile,
            RegionError::UntrustedDirectory { .. } | RegionError::UntrustedFile { .. } => {
                Unusable::Untrusted
            }
            RegionError::Permission { .. } => Unusable::Permission,
            RegionError::HamiRegion { .. } => Unusable::HamiRegion,
        }
    }
}

pub use crate::open::{NO_TMPFILE_ENV, REGION_MODE};

/// How long `open`/`open_or_create` wait for another process's creation.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(10);

/// A mapped region. `Send + Sync`; cheap to share by reference.
pub struct Region {
    map: MmapRaw,
    /// `map`'s sections, checked against its length once.
    layout: crate::shm::Layout,
    slot_count: u32,
    device_count: u32,
    path: PathBuf,
    plan: Plan,
    ident: ident::IdentityCache,
    /// CLOCK_MONOTONIC ns of the last rate-limited reclaim (a refused
    /// reservation, a memory view): bounds that cost for a program that
    /// keeps hitting its limit or asking for its free memory.
    last_oom_reclaim: std::sync::atomic::AtomicU64,
    /// False for `open_read_only` and `open_copy`: every writer refuses or
    /// does nothing (a store to the read-only mapping would fault).
    writable: bool,
    /// A `Region::private` ledger (memfd, no path).
    private: bool,
    /// `open_copy`: the bytes of the file's data extents it copied.
    copied: Option<u64>,
}

/// At most one reclaim pass per this many ns on the refusal path.
const OOM_RECLAIM_EVERY_NS: u64 = 50_000_000;

/// The algorithms' view of the outside world for one call.
struct CallEnv<'a> {
    me: ProcIdentity,
    plan: &'a Plan,
}

impl Env for CallEnv<'_> {
    fn is_dead(&self, o: Owner) -> bool {
        ident::is_dead(&self.me, o.pid, o.start34)
    }
    #[inline(always)]
    fn step(&self, name: &'static str) {
        self.plan.hit(name);
    }
}

/// A hot-path environment that never judges liveness (reserve/release).
struct StepEnv<'a>(&'a Plan);

impl Env for StepEnv<'_> {
    fn is_dead(&self, _o: Owner) -> bool {
        false
    }
    #[inline(always)]
    fn step(&self, name: &'static str) {
        self.0.hit(name);
    }
}

/// flock held on the region file; released on drop (and by the kernel if
/// we die).
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn acquire(f: &'a File, path: &Path, wait: Duration) -> Result<Self, RegionError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(FileLock(f)),
                Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(RegionError::Io {
                        op: "lock",
                        path: path.to_owned(),
                        source: e.into(),
                    })
                }
            }
            let waited = start.elapsed();
            if waited >= wait {
                return Err(RegionError::LockTimeout {
                    path: path.to_owned(),
                    waited,
                });
            }
            std::thread::sleep(pause.min(wait - waited));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, rustix::fs::FlockOperation::Unlock);
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn validate(opts: &CreateOptions) -> Result<(), RegionError> {
    let bad = |what: String| Err(RegionError::BadOptions { what });
    if opts.slots > MAX_SLOTS {
        return bad(format!("{} slots (at most {MAX_SLOTS})", opts.slots));
    }
    if opts.devices.len() > MAX_DEVICES {
        return bad(format!(
            "{} devices (at most {MAX_DEVICES})",
            opts.devices.len()
        ));
    }
    for (i, d) in opts.devices.iter().enumerate() {
        if d.uuid.len() >= UUID_LEN || d.uuid.contains('\0') {
            return bad(format!(
                "device {i}: uuid {:?} longer than 63 bytes or holds NUL",
                d.uuid
            ));
        }
        if d.sm_limit > 100 {
            return bad(format!("device {i}: SM limit {}% is above 100", d.sm_limit));
        }
    }
    Ok(())
}

/// Reads up to a header's worth of bytes from the start of the file; `len`
/// is its length when the caller just stat'ed it.
fn read_head(f: &File, path: &Path, len: Option<u64>) -> Result<(Vec<u8>, u64), RegionError> {
    let len = match len {
        Some(l) => l,
        // fstat(2), not std's statx: the cheaper call, inside cuInit.
        None => rustix::fs::fstat(f)
            .map_err(|e| io("stat", path)(e.into()))?
            .st_size
            .max(0) as u64,
    };
    let mut buf = vec![0u8; (len.min(HEADER_SIZE as u64)) as usize];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io("read", path)(e)),
        }
    }
    buf.truncate(n);
    Ok((buf, len))
}

/// Is this file a creation that never finished (empty, all zero, or our
/// magic without the ready mark)? Only such a file may be initialized.
fn unfinished(head: &[u8]) -> bool {
    if head.iter().all(|&b| b == 0) {
        return true;
    }
    head.len() >= PARSE_MIN
        && head[..8] == MAGIC
        && u32::from_ne_bytes([head[48], head[49], head[50], head[51]]) != STATE_READY
}

/// HAMi-core's `initialized_flag` (the first native i32 of its shared
/// region), followed by its major and minor version: a file HAMi's own
/// interposer left at the same path.
const HAMI_REGION_FLAG: i32 = 19_920_718;

fn hami_versions(head: &[u8]) -> Option<(u32, u32)> {
    let word = |i: usize| -> Option<[u8; 4]> { head.get(i..i + 4)?.try_into().ok() };
    if i32::from_ne_bytes(word(0)?) != HAMI_REGION_FLAG {
        return None;
    }
    Some((u32::from_ne_bytes(word(4)?), u32::from_ne_bytes(word(8)?)))
}

/// `parse_header`, with HAMi-core's region told apart from other foreign
/// files.
fn parse(head: &[u8], len: u64, path: &Path) -> Result<HeaderInfo, RegionError> {
    parse_header(head, len).map_err(|source| match (&source, hami_versions(head)) {
        (FormatError::ForeignMagic { .. }, Some((major, minor))) => RegionError::HamiRegion {
            path: path.to_owned(),
            major,
            minor,
        },
        _ => RegionError::Format {
            path: path.to_owned(),
            source,
        },
    })
}

impl Region {
    /// Opens the region at `path`, creating it when it does not exist.
    /// A creator builds the whole file unnamed and publishes it with
    /// `link(2)` only once it is ready (see `create_published`), so an
    /// opener that finds the file never waits for anyone. Returns the
    /// differences between the recorded configuration and `opts` (the
    /// recorded one stays in force); an `opts` without devices asks for
    /// nothing.
    ///
    /// The file is opened relative to its directory (checked: owned by
    /// root or by us), never through a symlink, never blocking, and only if
    /// it is a regular file; see `RegionError::unusable` for every refusal.
    pub fn open_or_create(
        path: &Path,
        opts: &CreateOptions,
    ) -> Result<(Region, Vec<LimitMismatch>), RegionError> {
        Self::open_or_create_with(path, opts, DEFAULT_LOCK_WAIT)
    }

    /// `open_or_create` with a chosen bound on waiting for a creator of the
    /// previous protocol (one that initializes the file in place under a
    /// flock: an empty or unfinished file found at `path`).
    pub fn open_or_create_with(
        path: &Path,
        opts: &CreateOptions,
        wait: Duration,
    ) -> Result<(Region, Vec<LimitMismatch>), RegionError> {
        validate(opts)?;
        let dir = Dir::open(path)?;
        // Each round either opens the file at `path` or publishes ours; a
        // file unlinked between a lost `link` and our `open` (an operator
        // removing it) costs another round.
        for _ in 0..8 {
            let r = match dir.open_file(path, true) {
                Ok((f, st)) => Self::attach(f, &st, path, Some(opts), wait, true)?,
                Err(RegionError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    match Self::create_published(&dir, path, opts)? {
                        Some(r) => r,
                        None => continue,
                    }
                }
                Err(e) => return Err(e),
            };
            let m = r.mismatches(opts);
            return Ok((r, m));
        }
        Err(io("open", path)(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the file vanished each time another creator had published it",
        )))
    }

    /// Builds a ready region in an unnamed file of `path`'s directory
    /// (`O_TMPFILE`; a dot-named temporary where the filesystem lacks it)
    /// and links it at `path`. `None`: another creator linked first (the
    /// caller opens theirs). A creator that dies mid-way leaves nothing at
    /// `path` (and, with `O_TMPFILE`, nothing at all).
    fn create_published(
        dir: &Dir,
        path: &Path,
        opts: &CreateOptions,
    ) -> Result<Option<Region>, RegionError> {
        let (f, named) = dir.new_file(path)?;
        let published =
            Self::initialize(&f, path, opts).and_then(|()| dir.publish(&f, named.as_ref(), path));
        if let Some(t) = &named {
            dir.remove(t);
        }
        if !published? {
            return Ok(None);
        }
        let (head, len) = read_head(&f, path, None)?;
        let info = parse(&head, len, path)?;
        Self::map_ready(f, path, &info, true, false).map(Some)
    }

    /// A region only this process (and its fork children, which share the
    /// mapping) can see: an anonymous memory file (`memfd`, close-on-exec)
    /// built exactly like a shared one, with the same admission, release
    /// and reclaim. For a process whose shared region is unusable but that
    /// has a limit to keep: it enforces the limit alone rather than run
    /// unlimited (fail closed). `path()` names it "(process-private
    /// ledger)".
    pub fn private(opts: &CreateOptions) -> Result<Region, RegionError> {
        validate(opts)?;
        let path = crate::open::private_path();
        let fd = rustix::fs::memfd_create("vgpu-private-region", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| io("memfd_create", &path)(e.into()))?;
        let f = File::from(fd);
        Self::initialize(&f, &path, opts)?;
        let (head, len) = read_head(&f, &path, None)?;
        let info = parse(&head, len, &path)?;
        Self::map_ready(f, &path, &info, true, true)
    }

    /// Whether this is a `private` region (no file).
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// Opens an existing region (never creates or initializes one), with
    /// the same checks as `open_or_create`.
    pub fn open(path: &Path) -> Result<Region, RegionError> {
        Self::open_with(path, DEFAULT_LOCK_WAIT)
    }

    /// `open` with a chosen bound on waiting for a creator.
    pub fn open_with(path: &Path, wait: Duration) -> Result<Region, RegionError> {
        let (f, st) = Dir::open(path)?.open_file(path, true)?;
        Self::attach(f, &st, path, None, wait, true)
    }

    /// Opens an existing region read-only (monitors, `vgpu inspect`, a
    /// read-only mount): snapshots and getters work; register, reserve,
    /// set_limits and reclaim refuse or do nothing. Never writes the file,
    /// never blocks opening it (a FIFO at the path is refused at once).
    pub fn open_read_only(path: &Path) -> Result<Region, RegionError> {
        let (f, st) = Dir::open(path)?.open_file(path, false)?;
        Self::attach(f, &st, path, None, DEFAULT_LOCK_WAIT, false)
    }

    /// Opens a private copy of the region at `path`, for a reader that must
    /// not trust the file's owner (the node agent, `vgpu inspect`): every
    /// process of a container can `ftruncate` its region, and a reader of a
    /// mapping of the file (`open_read_only`) takes SIGBUS if that happens
    /// while it reads. This one never maps the file: it reads the file's
    /// data extents (`pread`; the holes of a sparse region are not read)
    /// into anonymous memory of this process and maps that, read-only, so
    /// snapshots and getters work as on `open_read_only` on what the file
    /// held while it was copied, and nothing the file's owner does
    /// afterwards can reach it. The same checks on the path as every open
    /// (no symlink, no FIFO, a trusted directory); never writes the file.
    /// Never waits for another process's creation lock: a file whose header
    /// is not ready is refused at once (`LockTimeout` while someone holds
    /// the lock). A file that shrank or whose header was rewritten during
    /// the copy is refused (`ChangedWhileCopied`, `Unusable::Corrupt`); see
    /// the `copy` module for what a copy promises.
    pub fn open_copy(path: &Path) -> Result<Region, RegionError> {
        let (f, st) = Dir::open(path)?.open_file(path, false)?;
        let info = Self::ready_info(&f, &st, path, None, Duration::ZERO)?;
        let copy = crate::copy::copy(&f, path, info.file_len)?;
        // The header, as copied and as the file holds it now, must still be
        // the one we checked: a file cut below its header (and grown back)
        // or given another header during the copy is refused, not read as
        // half one region, half zeros or another.
        let (now, now_len) = read_head(&f, path, None)?;
        drop(f);
        for (which, head, len) in [
            ("copied", &copy.map[..HEADER_SIZE], info.file_len),
            ("file's", &now[..], now_len),
        ] {
            let what = match parse_header(head, len) {
                Ok(c) if c == info => continue,
                Ok(_) => format!("the {which} header is another region's"),
                Err(e) => format!("the {which} header is refused: {e}"),
            };
            return Err(RegionError::ChangedWhileCopied {
                path: path.to_owned(),
                what,
            });
        }
        let map = crate::shm::read_only(copy.map).map_err(io("protect the copy of", path))?;
        Ok(Self::with_map(
            map,
            path,
            &info,
            false,
            false,
            Some(copy.data_bytes),
        ))
    }

    /// For a region opened with `open_copy`, the bytes it read from the
    /// file (its data extents; holes are never read); `None` for every
    /// other open.
    pub fn copied_bytes(&self) -> Option<u64> {
        self.copied
    }

    /// Whether this mapping may write (false after `open_read_only` and
    /// `open_copy`).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    fn attach(
        f: File,
        st: &rustix::fs::Stat,
        path: &Path,
        create: Option<&CreateOptions>,
        wait: Duration,
        writable: bool,
    ) -> Result<Region, RegionError> {
        let info = Self::ready_info(&f, st, path, create, wait)?;
        Self::map_ready(f, path, &info, writable, false)
    }

    /// The header of the file `f` once it is ready to map: at once for a
    /// ready file; else under its creation lock (bounded by `wait`),
    /// initializing it when `create` says how and it was never finished.
    fn ready_info(
        f: &File,
        st: &rustix::fs::Stat,
        path: &Path,
        create: Option<&CreateOptions>,
        wait: Duration,
    ) -> Result<HeaderInfo, RegionError> {
        // Fast path, no lock: a ready region (the common case for every
        // process after the first).
        let (head, len) = read_head(f, path, Some(st.st_size.max(0) as u64))?;
        if let Ok(info) = parse_header(&head, len) {
            return Ok(info);
        }
        // Slow path: wait for (or become) the creator. A refusal is only
        // final under the lock: a read racing a creator's stores (pread
        // copies bytes in no promised order) may see a torn header.
        let lock = FileLock::acquire(f, path, wait)?;
        let (head, len) = read_head(f, path, None)?;
        if unfinished(&head) {
            let Some(opts) = create else {
                let state = if head.len() >= PARSE_MIN {
                    u32::from_ne_bytes([head[48], head[49], head[50], head[51]])
                } else {
                    0
                };
                return Err(RegionError::Format {
                    path: path.to_owned(),
                    source: FormatError::NotInitialized { state },
                });
            };
            // Initializing in place writes the file: never one that is also
            // linked elsewhere (a planted hard link to someone's file).
            if st.st_nlink != 1 {
                return Err(RegionError::UntrustedFile {
                    path: path.to_owned(),
                    why: format!(
                        "with {} hard links (an unfinished region is only re-initialized when it has one)",
                        st.st_nlink
                    ),
                });
            }
            Self::initialize(f, path, opts)?;
            // Ours now: the decided mode, whatever the previous creator's
            // umask left (not our file to change if another user owns it).
            if st.st_uid == rustix::process::geteuid().as_raw() {
                crate::open::set_region_mode(f, path)?;
            }
        }
        let (head, len) = if unfinished(&head) {
            read_head(f, path, None)?
        } else {
            (head, len)
        };
        let info = parse(&head, len, path)?;
        drop(lock);
        Ok(info)
    }

    fn map_ready(
        f: File,
        path: &Path,
        info: &HeaderInfo,
        writable: bool,
        private: bool,
    ) -> Result<Region, RegionError> {
        let map = crate::shm::map(&f, info.file_len, writable).map_err(io("map", path))?;
        Ok(Self::with_map(map, path, info, writable, private, None))
    }

    fn with_map(
        map: MmapRaw,
        path: &Path,
        info: &HeaderInfo,
        writable: bool,
        private: bool,
        copied: Option<u64>,
    ) -> Region {
        // No MADV_POPULATE_WRITE: measured in a fresh process it costs more
        // (~8 µs) than the three page faults a claim takes on demand. No
        // readahead either: the first process to touch a page of a fresh
        // (sparse) region would otherwise allocate and zero-fill a whole
        // window of pages in its fault, hundreds of µs inside cuInit.
        let _ = map.advise(memmap2::Advice::Random);
        let r = Region {
            layout: crate::shm::Layout::of(&map, info.slot_count),
            map,
            slot_count: info.slot_count,
            device_count: info.device_count,
            path: path.to_owned(),
            plan: Plan::from_env(),
            ident: ident::IdentityCache::default(),
            last_oom_reclaim: std::sync::atomic::AtomicU64::new(0),
            writable,
            private,
            copied,
        };
        // Read procfs now, while mapping, so `register` is a compare-exchange
        // and a few stores (a fork child reads its own on first use).
        r.ident.get();
        r
    }

    /// Writes a fresh region: into a new unnamed file before it is
    /// published, or in place under the flock (a file of the previous
    /// protocol whose creator died).
    fn initialize(f: &File, path: &Path, opts: &CreateOptions) -> Result<(), RegionError> {
        let slots = if opts.slots == 0 {
            DEFAULT_SLOTS
        } else {
            opts.slots
        };
        let len = file_len(slots);
        // Truncating to zero first discards whatever a dead creator left, so
        // every slot and counter starts at zero.
        f.set_len(0).map_err(io("truncate", path))?;
        f.set_len(len).map_err(io("resize", path))?;
        let map = crate::shm::map(f, len, true).map_err(io("map", path))?;
        // The file is a hole: without this, the first store's fault reads
        // ahead (allocates and zero-fills) a large window of it, most of
        // the creator's cost; one page is all it needs.
        let _ = map.advise(memmap2::Advice::Random);
        let h = crate::shm::header(&map);
        h.magic.store(u64::from_ne_bytes(MAGIC), Relaxed);
        h.state.store(STATE_INITIALIZING, Relaxed);
        h.version.store(VERSION, Relaxed);
        h.endian.store(ENDIAN_MARK, Relaxed);
        h.header_size.store(HEADER_SIZE as u32, Relaxed);
        h.device_size.store(DEVICE_SIZE as u32, Relaxed);
        h.slot_size.store(SLOT_SIZE as u32, Relaxed);
        h.slot_count.store(slots, Relaxed);
        h.device_count.store(opts.devices.len() as u32, Relaxed);
        h.max_devices.store(MAX_DEVICES as u32, Relaxed);
        h.pacing_size.store(PACING_SIZE as u32, Relaxed);
        h.slot_pacing_size.store(SLOT_PACING_SIZE as u32, Relaxed);
        h.layout_hash.store(layout_hash(), Relaxed);
        h.creator_pid.store(
            rustix::process::getpid().as_raw_nonzero().get() as u32,
            Relaxed,
        );
        h.created_unix_ns.store(realtime_ns(), Relaxed);
        for (d, cfg) in h.devices.iter().zip(&opts.devices) {
            let mut uuid = [0u8; UUID_LEN];
            uuid[..cfg.uuid.len()].copy_from_slice(cfg.uuid.as_bytes());
            for (cell, chunk) in d.uuid.iter().zip(uuid.chunks_exact(8)) {
                let mut w = [0u8; 8];
                w.copy_from_slice(chunk);
                cell.store(u64::from_ne_bytes(w), Relaxed);
            }
            d.mem_limit.store(cfg.mem_limit, Relaxed);
            d.sm_limit.store(cfg.sm_limit, Relaxed);
        }
        Plan::from_env().hit("create.mid_init");
        // Publishes everything above to readers that check `state` (Acquire).
        h.state.store(STATE_READY, Rel);
        // The link (or the flock) is what orders us before the next
        // opener's reads: a MAP_SHARED store is in the page cache the
        // moment it lands, and both are system calls on either side.
        Ok(())
    }

    fn mismatches(&self, opts: &CreateOptions) -> Vec<LimitMismatch> {
        let mut out = Vec::new();
        if opts.slots != 0 && opts.slots != self.slot_count {
            out.push(LimitMismatch {
                device: 0,
                field: "slot count",
                recorded: self.slot_count.to_string(),
                requested: opts.slots.to_string(),
            });
        }
        if opts.devices.is_empty() {
            return out;
        }
        if opts.devices.len() as u32 != self.device_count {
            out.push(LimitMismatch {
                device: 0,
                field: "device count",
                recorded: self.device_count.to_string(),
                requested: opts.devices.len().to_string(),
            });
        }
        for (i, want) in opts
            .devices
            .iter()
            .enumerate()
            .take(self.device_count as usize)
        {
            let dev = i as u32;
            let have = self.limits(dev);
            let uuid = self.device_uuid(dev);
            if uuid != want.uuid {
                out.push(LimitMismatch {
                    device: dev,
                    field: "uuid",
                    recorded: uuid,
                    requested: want.uuid.clone(),
                });
            }
            if have.mem != want.mem_limit {
                out.push(LimitMismatch {
                    device: dev,
                    field: "memory limit",
                    recorded: have.mem.to_string(),
                    requested: want.mem_limit.to_string(),
                });
            }
            if have.sm != want.sm_limit {
                out.push(LimitMismatch {
                    device: dev,
                    field: "SM limit",
                    recorded: have.sm.to_string(),
                    requested: want.sm_limit.to_string(),
                });
            }
        }
        out
    }

    #[inline]
    pub(crate) fn view(&self) -> View<'_> {
        crate::shm::view_at(&self.map, &self.layout)
    }

    fn owner_of(&self, me: &ProcIdentity) -> Result<Owner, RegionError> {
        let ns = core::ns_index(self.view().header, me.pidns_inode)
            .ok_or(RegionError::NamespaceTableFull)?;
        Ok(Owner {
            ns_index: ns,
            pid: me.pid,
            start34: me.start_ticks & core::START_MASK,
        })
    }

    /// The file this region maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Slots in the file.
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// Claims a slot for the calling process (a fork child registers as
    /// itself). Lock-free; reclaims dead owners' slots when none is free.
    pub fn register(&self) -> Result<SlotId, RegionError> {
        if !self.writable {
            return Err(RegionError::ReadOnly);
        }
        let me = self.ident.get();
        let owner = self.owner_of(&me)?;
        let env = CallEnv {
            me,
            plan: &self.plan,
        };
        let v = self.view();
        let idx = match core::claim(&v, owner, &env) {
            Some(i) => i,
            None => {
                core::reclaim_dead(&v, owner, &env);
                core::claim(&v, owner, &env).ok_or(RegionError::Full {
                    slots: self.slot_count,
                })?
            }
        };
        let s = &v.slots[idx];
        s.pid.store(me.pid, SeqCst);
        s.start_time.store(me.start_ticks, SeqCst);
        s.claimed_ns.store(monotonic_ns(), SeqCst);
        Ok(SlotId(idx as u32))
    }

    /// Frees the caller's slot; its reservations vanish. Does nothing if the
    /// slot is not the calling process's.
    pub fn unregister(&self, slot: SlotId) {
        if !self.writable {
            return;
        }
        let me = self.ident.get();
        let Ok(owner) = self.owner_of(&me) else {
            return;
        };
        let env = CallEnv {
            me,
            plan: &self.plan,
        };
        core::unregister(&self.view(), slot.0 as usize, owner, &env);
    }

    fn check_slot(&self, slot: SlotId) -> Result<usize, AdmissionError> {
        // A read-only mapping owns no slot.
        if self.writable && slot.0 < self.slot_count {
            Ok(slot.0 as usize)
        } else {
            Err(AdmissionError::NoSuchSlot { slot: slot.0 })
        }
    }

    /// Admits `bytes` of `kind` on device `dev` for `slot`, or refuses when
    /// the device's live total would exceed its memory limit (read at each
    /// call, so a live limit change applies to the next allocation). Before
    /// refusing, dead processes' slots are reclaimed (rate-limited) and the
    /// request tried once more. The limit is the header's, which every
    /// process of the container can write: a process that has its limits
    /// from the limits file uses `reserve_within`.
    pub fn reserve(
        &self,
        slot: SlotId,
        dev: u32,
        kind: MemKind,
        bytes: u64,
    ) -> Result<(), AdmissionError> {
        self.admit(slot, dev, kind, bytes, None)
    }

    /// `reserve` against a limit the caller holds (0 = none) instead of the
    /// header's: the limit from the operator's limits file, so that a
    /// tenant writing the mapped header changes nothing that is enforced.
    /// The admission is the same exact one; processes that disagree on the
    /// limit each keep their own against the same shared total.
    pub fn reserve_within(
        &self,
        slot: SlotId,
        dev: u32,
        kind: MemKind,
        bytes: u64,
        limit: u64,
    ) -> Result<(), AdmissionError> {
        self.admit(slot, dev, kind, bytes, Some(limit))
    }

    fn admit(
        &self,
        slot: SlotId,
        dev: u32,
        kind: MemKind,
        bytes: u64,
        fixed: Option<u64>,
    ) -> Result<(), AdmissionError> {
        let idx = self.check_slot(slot)?;
        let d = core::check_dev(dev, self.device_count)?;
        let v = self.view();
        let limit = || fixed.unwrap_or_else(|| v.header.devices[d].mem_limit.load(SeqCst));
        let env = StepEnv(&self.plan);
        match core::reserve(&v, idx, d, kind, bytes, limit(), &env) {
            Err(AdmissionError::OverLimit { .. }) if self.oom_reclaim() > 0 => {
                core::reserve(&v, idx, d, kind, bytes, limit(), &env)
            }
            r => r,
        }
    }

    /// A refused reservation first frees dead processes' slots (whose bytes
    /// still count), at most once per `OOM_RECLAIM_EVERY_NS`.
    fn oom_reclaim(&self) -> usize {
        self.reclaim_dead_at_most_every(Duration::from_nanos(OOM_RECLAIM_EVERY_NS))
    }

    /// `reclaim_dead`, unless this mapping already ran a reclaim pass less
    /// than `every` ago (then 0). For paths that must not show a dead
    /// process's bytes but may run often (memory views): the pass costs a
    /// signal-0 probe and a procfs read per claimed slot of our namespace.
    pub fn reclaim_dead_at_most_every(&self, every: Duration) -> usize {
        // The tick-resolution clock: this runs on every memory view
        // (`cuMemGetInfo`), where a full clock read was its largest cost.
        let now = crate::clock::coarse_monotonic_ns();
        let last = self.last_oom_reclaim.load(Relaxed);
        let every = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return 0;
        }
        self.last_oom_reclaim.store(now, Relaxed);
        self.reclaim_dead()
    }

    /// Gives back `bytes` of `kind` on `dev`; a release larger than the
    /// slot holds is clamped (reported in the result), never wrapped.
    pub fn release(&self, slot: SlotId, dev: u32, kind: MemKind, bytes: u64) -> Release {
        let (Ok(idx), Ok(d)) = (
            self.check_slot(slot),
            core::check_dev(dev, self.device_count),
        ) else {
            return Release {
                released: 0,
                clamped: bytes > 0,
                rejected: false,
            };
        };
        core::release(&self.view(), idx, d, kind, bytes, &StepEnv(&self.plan))
    }

    /// `slot`'s admission total on `dev` (0 out of range): what the
    /// admission sum counts for it.
    pub fn slot_total(&self, slot: SlotId, dev: u32) -> u64 {
        match (
            self.check_slot(slot),
            core::check_dev(dev, self.device_count),
        ) {
            (Ok(idx), Ok(d)) => self.view().total(d, idx).load(SeqCst),
            _ => 0,
        }
    }

    /// Puts `slot`'s admission total on `dev` back from `seen` to `mine`
    /// (what the owner knows it holds, from its own memory), only if it
    /// still reads `seen`: every process of the container can write the
    /// mapped file, and one that zeroed the counters must not be admitted
    /// against them, while a change made since the owner looked (its own
    /// free) must not be undone. True when it was put back; nothing on a
    /// read-only mapping.
    pub fn restore_total(&self, slot: SlotId, dev: u32, seen: u64, mine: u64) -> bool {
        match (
            self.check_slot(slot),
            core::check_dev(dev, self.device_count),
        ) {
            (Ok(idx), Ok(d)) if self.writable && seen < mine => self
                .view()
                .total(d, idx)
                .compare_exchange(seen, mine, SeqCst, SeqCst)
                .is_ok(),
            _ => false,
        }
    }

    /// Devices configured.
    pub fn device_count(&self) -> u32 {
        self.device_count
    }

    /// A device's UUID ("" for an index out of range).
    pub fn device_uuid(&self, dev: u32) -> String {
        let Ok(d) = core::check_dev(dev, self.device_count) else {
            return String::new();
        };
        let mut bytes = Vec::with_capacity(UUID_LEN);
        for cell in &self.view().header.devices[d].uuid {
            bytes.extend_from_slice(&cell.load(Relaxed).to_ne_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// A device's limits (zeros for an index out of range).
    pub fn limits(&self, dev: u32) -> Limits {
        let Ok(d) = core::check_dev(dev, self.device_count) else {
            return Limits::default();
        };
        let rd = &self.view().header.devices[d];
        Limits {
            mem: rd.mem_limit.load(SeqCst),
            sm: rd.sm_limit.load(SeqCst),
        }
    }

    /// Changes a device's limits live (ignored for an index out of range;
    /// see `try_set_limits`). Lowering the memory limit below what is in use
    /// refuses new reservations until usage falls; nothing is revoked.
    pub fn set_limits(&self, dev: u32, l: Limits) {
        let _ = self.try_set_limits(dev, l);
    }

    /// `set_limits` that reports a bad device index or SM percent.
    pub fn try_set_limits(&self, dev: u32, l: Limits) -> Result<(), RegionError> {
        if !self.writable {
            return Err(RegionError::ReadOnly);
        }
        let d = core::check_dev(dev, self.device_count).map_err(|_| RegionError::NoSuchDevice {
            dev,
            count: self.device_count,
        })?;
        if l.sm > 100 {
            return Err(RegionError::BadOptions {
                what: format!("SM limit {}% is above 100", l.sm),
            });
        }
        let h = self.view().header;
        h.devices[d].mem_limit.store(l.mem, SeqCst);
        h.devices[d].sm_limit.store(l.sm, SeqCst);
        h.limits_generation.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Bumped by every live limit change.
    pub fn limits_generation(&self) -> u32 {
        self.view().header.limits_generation.load(Acquire)
    }

    /// `bump_limits_generation` on the file at `path` without mapping it,
    /// for the node agent: every process of a container can `ftruncate` its
    /// region, and a writer through a mapping of a truncated file takes
    /// SIGBUS. The file is opened and its header checked as `open` does
    /// (never waiting for a creator); the counter is read and written with
    /// `pread`/`pwrite`. Another writer bumping at the same instant may make
    /// the two bumps one: both are a change, which is all a reader looks for.
    pub fn bump_limits_generation_in_file(path: &Path) -> Result<u32, RegionError> {
        let (f, st) = Dir::open(path)?.open_file(path, true)?;
        Self::ready_info(&f, &st, path, None, Duration::ZERO)?;
        let off = std::mem::offset_of!(RawHeader, limits_generation) as u64;
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, off).map_err(io("read", path))?;
        let next = u32::from_ne_bytes(b).wrapping_add(1);
        f.write_all_at(&next.to_ne_bytes(), off)
            .map_err(io("write", path))?;
        Ok(next)
    }

    /// Tells every process to re-read the limits file (a change the header
    /// does not show, e.g. policy). Refused on a read-only mapping.
    pub fn bump_limits_generation(&self) -> Result<u32, RegionError> {
        if !self.writable {
            return Err(RegionError::ReadOnly);
        }
        Ok(self
            .view()
            .header
            .limits_generation
            .fetch_add(1, SeqCst)
            .wrapping_add(1))
    }

    /// The index of the device with this UUID (ASCII case ignored).
    pub fn device_index(&self, uuid: &str) -> Option<u32> {
        (0..self.device_count).find(|&d| self.device_uuid(d).eq_ignore_ascii_case(uuid))
    }

    /// Where the header's display copy differs from what the limits file
    /// says for each configured device (by its UUID). The file wins: an
    /// interposer warns, `vgpu inspect` shows it, `write_display_copy`
    /// fixes it.
    pub fn display_mismatches(&self, file: &crate::limits::Limits) -> Vec<DisplayMismatch> {
        let mut out = Vec::new();
        for dev in 0..self.device_count {
            let uuid = self.device_uuid(dev);
            let want = file.for_device(&uuid).to_region();
            let have = self.limits(dev);
            // The header stores "no SM limit" as 0 or 100.
            let have_sm = if have.sm >= 100 { 0 } else { have.sm };
            if have.mem != want.mem {
                out.push(DisplayMismatch {
                    device: dev,
                    uuid: uuid.clone(),
                    field: "memory limit",
                    region: have.mem,
                    file: want.mem,
                });
            }
            if have_sm != want.sm {
                out.push(DisplayMismatch {
                    device: dev,
                    uuid: uuid.clone(),
                    field: "SM limit",
                    region: have.sm as u64,
                    file: want.sm as u64,
                });
            }
        }
        out
    }

    /// Copies the limits file's values into the header's display copy (each
    /// device by its UUID) and bumps `limits_generation` once, whether or
    /// not a value changed: the writer of the file calls it after every
    /// write so processes re-read the file. Returns (device, old, new).
    pub fn write_display_copy(
        &self,
        file: &crate::limits::Limits,
    ) -> Result<Vec<(u32, Limits, Limits)>, RegionError> {
        if !self.writable {
            return Err(RegionError::ReadOnly);
        }
        let h = self.view().header;
        let mut changes = Vec::new();
        for dev in 0..self.device_count {
            let new = file.for_device(&self.device_uuid(dev)).to_region();
            let old = self.limits(dev);
            let rd = &h.devices[dev as usize];
            rd.mem_limit.store(new.mem, SeqCst);
            rd.sm_limit.store(new.sm, SeqCst);
            changes.push((dev, old, new));
        }
        h.limits_generation.fetch_add(1, SeqCst);
        Ok(changes)
    }

    /// Bytes reserved on `dev` by claimed slots (the admission figure: a
    /// dead process's bytes count until its slot is reclaimed).
    pub fn device_used(&self, dev: u32) -> u64 {
        match core::check_dev(dev, self.device_count) {
            Ok(d) => core::device_total(&self.view(), d),
            Err(_) => 0,
        }
    }

    /// Bytes reserved on `dev` by claimed slots whose owners are not
    /// certainly dead: `device_used` without the bytes of processes of the
    /// caller's PID namespace that died and were not reclaimed yet (slots of
    /// other namespaces count; nothing is written, so it works on a
    /// read-only mapping). Costs a liveness check per claimed slot.
    pub fn device_used_live(&self, dev: u32) -> u64 {
        let Ok(d) = core::check_dev(dev, self.device_count) else {
            return 0;
        };
        let v = self.view();
        let me = self.ident.get();
        let inode = if me.pidns_inode == 0 {
            u64::MAX
        } else {
            me.pidns_inode
        };
        // Looked up, never claimed: a read-only mapping must not write.
        let my_ns = v
            .header
            .ns_table
            .iter()
            .position(|c| c.load(SeqCst) == inode);
        let n = (v.header.slot_high_water.load(SeqCst) as usize).min(v.slots.len());
        let mut sum: u64 = 0;
        for (i, o) in v.owners.iter().enumerate().take(n) {
            let (st, owner) = core::decode(o.load(SeqCst));
            if st == core::ST_FREE {
                continue;
            }
            let t = v.totals[d * v.slots.len() + i].load(SeqCst);
            if t == 0 {
                continue;
            }
            let dead = st == core::ST_LIVE
                && my_ns == Some(owner.ns_index as usize)
                && ident::is_dead(&me, owner.pid, owner.start34);
            if !dead {
                sum = sum.saturating_add(t);
            }
        }
        sum
    }

    /// Frees the slots of dead processes of the caller's PID namespace.
    pub fn reclaim_dead(&self) -> usize {
        if !self.writable {
            return 0;
        }
        let me = self.ident.get();
        let Ok(owner) = self.owner_of(&me) else {
            return 0;
        };
        let env = CallEnv {
            me,
            plan: &self.plan,
        };
        core::reclaim_dead(&self.view(), owner, &env)
    }

    /// Reclaims claimed slots of *any* PID namespace that `dead` judges
    /// gone: for an agent that can see every namespace (the node agent in
    /// the host namespace, joining slots to host processes by `host_pid` or
    /// by each process's NSpid), e.g. after a container restarted into a new
    /// namespace and left its old slots behind. The caller's judgement is
    /// trusted; a wrong "dead" frees a live process's bytes.
    pub fn reclaim_where(&self, dead: impl Fn(&SlotOwner) -> bool) -> usize {
        if !self.writable {
            return 0;
        }
        let me = self.ident.get();
        let Ok(owner) = self.owner_of(&me) else {
            return 0;
        };
        let env = CallEnv {
            me,
            plan: &self.plan,
        };
        let v = self.view();
        core::reclaim_if(&v, owner, &env, |idx, st, o| {
            let reclaiming = st == core::ST_RECLAIMING;
            let s = &v.slots[idx];
            let ns = v
                .header
                .ns_table
                .get(o.ns_index as usize)
                .map_or(0, |c| c.load(SeqCst));
            dead(&SlotOwner {
                slot: SlotId(idx as u32),
                reclaiming,
                pid: o.pid,
                pid_ns: if ns == u64::MAX { 0 } else { ns },
                start_time_low34: o.start34,
                start_time: if reclaiming {
                    0
                } else {
                    s.start_time.load(SeqCst)
                },
                host_pid: if reclaiming {
                    0
                } else {
                    s.host_pid.load(SeqCst)
                },
            })
        })
    }

    /// Claimed slots (live or being reclaimed).
    pub fn live_slots(&self) -> u32 {
        self.view()
            .owners
            .iter()
            .filter(|o| o.load(SeqCst) != core::ST_FREE)
            .count() as u32
    }

    /// A consistent-enough copy for readers (monitor, tools); only loads,
    /// so writers never wait.
    pub fn snapshot(&self) -> Snapshot {
        snapshot::take(self)
    }

    /// The container's pacing bucket on `dev` (the SM limiter's shared
    /// state); `None` on a read-only mapping or for a device out of range.
    pub fn bucket(&self, dev: u32) -> Option<crate::pacing::Bucket<'_>> {
        let d = core::check_dev(dev, self.device_count).ok()?;
        self.writable
            .then(|| crate::pacing::Bucket::new(&self.view().pacing[d]))
    }

    /// The pacing record of `slot` (its setters do nothing on a read-only
    /// mapping or for a slot out of range).
    pub fn slot_pacing(&self, slot: SlotId) -> crate::pacing::SlotPacing<'_> {
        let raw = self
            .view()
            .slot_pacing
            .get(slot.0 as usize)
            .filter(|_| self.writable);
        crate::pacing::SlotPacing::new(raw, self.device_count)
    }

    /// Telemetry access to a slot.
    pub fn slot(&self, slot: SlotId) -> SlotRef<'_> {
        let v = self.view();
        SlotRef {
            raw: v.slots.get(slot.0 as usize),
            total: v.totals,
            idx: slot.0 as usize,
            slots: self.slot_count as usize,
            devices: self.device_count,
            writable: self.writable,
        }
    }

    pub(crate) fn header_info(&self) -> HeaderInfo {
        let h = self.view().header;
        HeaderInfo {
            version: h.version.load(Relaxed),
            endianness: "little",
            header_size: h.header_size.load(Relaxed),
            device_size: h.device_size.load(Relaxed),
            slot_size: h.slot_size.load(Relaxed),
            slot_count: self.slot_count,
            device_count: self.device_count,
            layout_hash: h.layout_hash.load(Relaxed),
            creator_pid: h.creator_pid.load(Relaxed),
            created_unix_ns: h.created_unix_ns.load(Relaxed),
            file_len: file_len(self.slot_count),
        }
    }
}

/// A slot's telemetry cells. Setters on an out-of-range slot do nothing.
pub struct SlotRef<'a> {
    raw: Option<&'a RawSlot>,
    /// The region's totals table (device-major).
    total: &'a [crate::sync::AtomicU64],
    idx: usize,
    slots: usize,
    devices: u32,
    writable: bool,
}

impl SlotRef<'_> {
    /// The slot, for writing (none on a read-only mapping).
    fn w(&self) -> Option<&RawSlot> {
        self.raw.filter(|_| self.writable)
    }

    /// Records when `phase` happened (CLOCK_MONOTONIC ns, see `monotonic_ns`).
    pub fn set_phase(&self, phase: Phase, ns: u64) {
        if let Some(s) = self.w() {
            s.phases[phase.code() as usize].store(ns, Relaxed);
        }
    }

    /// When `phase` happened (0 = not yet).
    pub fn phase(&self, phase: Phase) -> u64 {
        self.raw
            .map_or(0, |s| s.phases[phase.code() as usize].load(Relaxed))
    }

    /// Records the host PID.
    pub fn set_host_pid(&self, pid: u32) {
        if let Some(s) = self.w() {
            s.host_pid.store(pid, Relaxed);
        }
    }

    /// The host PID (0 = unknown).
    pub fn host_pid(&self) -> u32 {
        self.raw.map_or(0, |s| s.host_pid.load(Relaxed))
    }

    /// Records the identity outcome.
    pub fn set_identity(
        &self,
        tier: IdentityTier,
        state: IdentityState,
        attempts: u32,
        failure: u32,
        duration_ns: u64,
    ) {
        if let Some(s) = self.w() {
            s.identity_tier.store(tier.code(), Relaxed);
            s.identity_attempts.store(attempts, Relaxed);
            s.identity_failure.store(failure, Relaxed);
            s.identity_ns.store(duration_ns, Relaxed);
            s.identity_state.store(state.code(), Relaxed);
        }
    }

    /// Counts one use of a fallback.
    pub fn bump_fallback(&self, f: Fallback) {
        if let Some(s) = self.w() {
            s.fallbacks[f.code() as usize].fetch_add(1, Relaxed);
        }
    }

    /// Records a monitor sample for device `dev`.
    pub fn set_monitor_sample(&self, dev: u32, mem: u64, sm_util: u32) {
        if let (Some(s), true) = (self.w(), dev < self.devices) {
            s.devices[dev as usize].monitor_mem.store(mem, Relaxed);
            s.devices[dev as usize]
                .monitor_sm_util
                .store(sm_util, Relaxed);
        }
    }

    /// Sets the suspend/run status.
    pub fn set_run_status(&self, st: RunStatus) {
        if let Some(s) = self.w() {
            s.run_status.store(st.code(), SeqCst);
        }
    }

    /// The suspend/run status (unknown codes read as Running).
    pub fn run_status(&self) -> RunStatus {
        self.raw
            .and_then(|s| RunStatus::from_code(s.run_status.load(SeqCst)))
            .unwrap_or(RunStatus::Running)
    }

    /// This slot's counters for `dev`.
    pub fn usage(&self, dev: u32) -> Usage {
        match (self.raw, dev < self.devices) {
            (Some(s), true) => {
                let d = &s.devices[dev as usize];
                let total = self
                    .total
                    .get(dev as usize * self.slots + self.idx)
                    .map_or(0, |t| t.load(SeqCst));
                Usage::of(total, d.context.load(SeqCst), d.module.load(SeqCst))
            }
            _ => Usage::default(),
        }
    }
}
