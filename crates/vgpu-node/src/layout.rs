//! Host and container paths of the node agent (HAMi's layout under the hook
//! path, plus vgpu's limits directory), and creating them safely: explicit
//! modes (the umask is not a policy), never through a symlink, never
//! reusing a path that is not a directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// In the container: the region directory (HAMi's `<hook>/vgpu`) is also
/// mounted here, where a process that lost its environment looks
/// (`docs/env.md`).
pub const CONTAINER_DEFAULT_REGION_DIR: &str = "/tmp/vgpu";
/// In the container: the read-only limits directory.
pub const CONTAINER_LIMITS_DIR: &str = "/etc/vgpu";
/// In the container and on the host: the node-wide probe lock directory.
pub const LOCK_DIR: &str = "/tmp/vgpulock";
/// In the container: the preload list.
pub const CONTAINER_LD_SO_PRELOAD: &str = "/etc/ld.so.preload";
/// The region file's name inside the region directory.
pub const REGION_FILE: &str = "region.cache";
/// The interposer proper, which the front `libvgpu.so` loads from its own
/// directory (`docs/interposer.md`): it must sit beside the front, on the
/// host and in the container.
pub const CORE_LIB: &str = "libvgpu_core.so";

/// `libvgpu_core.so` beside the front library at `lib`.
pub fn core_beside(lib: &Path) -> PathBuf {
    lib.parent().unwrap_or(Path::new("/")).join(CORE_LIB)
}

/// Paths under one hook path (`global.gpuHookPath`, default `/usr/local`;
/// HAMi uses the same path on the host and in the container).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The hook path.
    pub hook: PathBuf,
}

/// Why a directory could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Something other than a directory is at the path.
    #[error("{0} exists and is not a directory (a symlink or file there is refused)")]
    NotADirectory(PathBuf),
    /// mkdir/chmod/lstat failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Layout {
    /// A layout rooted at `hook`.
    pub fn new(hook: impl Into<PathBuf>) -> Layout {
        Layout { hook: hook.into() }
    }

    /// `<hook>/vgpu` (host) — also the region directory's container path.
    pub fn vgpu_dir(&self) -> PathBuf {
        self.hook.join("vgpu")
    }

    /// `<hook>/vgpu/containers`.
    pub fn containers_dir(&self) -> PathBuf {
        self.vgpu_dir().join("containers")
    }

    /// `<hook>/vgpu/limits`.
    pub fn limits_root(&self) -> PathBuf {
        self.vgpu_dir().join("limits")
    }

    /// `<hook>/vgpu/containers/<podUID>_<ctr>` (region, read-write).
    pub fn region_dir(&self, key: &str) -> PathBuf {
        self.containers_dir().join(key)
    }

    /// `<hook>/vgpu/limits/<podUID>_<ctr>` (mounted read-only at `/etc/vgpu`).
    pub fn limits_dir(&self, key: &str) -> PathBuf {
        self.limits_root().join(key)
    }

    /// `<hook>/vgpu/limits/<podUID>_<ctr>/limits`.
    pub fn limits_file(&self, key: &str) -> PathBuf {
        self.limits_dir(key).join("limits")
    }

    /// `<hook>/vgpu/ld.so.preload` (host).
    pub fn ld_so_preload(&self) -> PathBuf {
        self.vgpu_dir().join("ld.so.preload")
    }

    /// `<hook>/vgpu/libvgpu.so`: where the library is mounted in the
    /// container (and HAMi's default host path).
    pub fn container_lib(&self) -> PathBuf {
        self.vgpu_dir().join("libvgpu.so")
    }

    /// `<hook>/vgpu/libvgpu_core.so`: the core, mounted beside the front.
    pub fn container_core_lib(&self) -> PathBuf {
        self.vgpu_dir().join(CORE_LIB)
    }

    /// The region file's path in the container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`).
    pub fn container_region_file(&self) -> PathBuf {
        self.vgpu_dir().join(REGION_FILE)
    }

    /// `<hook>/vgpu/boards` (host): the GPUs' lending boards, one
    /// directory per GPU UUID (docs/limiter.md, "Guarantees and ceilings").
    pub fn boards_dir(&self) -> PathBuf {
        self.vgpu_dir().join("boards")
    }

    /// `<hook>/vgpu/boards/<UUID>/<podUID>_<ctr>`: a container's entry on
    /// one GPU's board (the one file of the board it may write).
    pub fn board_entry(&self, uuid: &str, key: &str) -> PathBuf {
        self.boards_dir().join(uuid).join(key)
    }
}

/// Where a container sees the lending boards: read-only, with its own
/// entry on each of its GPUs mounted writable on top.
pub const CONTAINER_BOARDS_DIR: &str = "/etc/vgpu-boards";

/// `<podUID>_<container>`, HAMi's directory name.
pub fn container_key(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}_{container}")
}

/// Splits a directory name into (pod UID, container); container names are
/// DNS labels and pod UIDs have no `_`, so the first `_` separates them. A
/// DRA share's key ([`dra_share_key`]) is not a container key.
pub fn parse_container_key(name: &str) -> Option<(&str, &str)> {
    if name.starts_with(DRA_KEY_PREFIX) {
        return None;
    }
    let (uid, ctr) = name.split_once('_')?;
    (!uid.is_empty() && !ctr.is_empty()).then_some((uid, ctr))
}

/// The prefix of a DRA share's directory name.
pub const DRA_KEY_PREFIX: &str = "dra_";

/// The directory name of a DRA share: `dra_<claimUID>_<device>_<shareID>`
/// (`dra_<claimUID>_<device>` for a result without a share ID). Claim UIDs,
/// device names (DNS labels) and share IDs (UIDs) have no `_`. The DRA
/// driver owns these directories (created at prepare, removed at
/// unprepare): the cache GC leaves them alone.
pub fn dra_share_key(claim_uid: &str, device: &str, share_id: Option<&str>) -> String {
    match share_id {
        Some(s) => format!("{DRA_KEY_PREFIX}{claim_uid}_{device}_{s}"),
        None => format!("{DRA_KEY_PREFIX}{claim_uid}_{device}"),
    }
}

/// Splits a DRA share key into (claim UID, device, share ID).
pub fn parse_dra_share_key(name: &str) -> Option<(&str, &str, Option<&str>)> {
    let rest = name.strip_prefix(DRA_KEY_PREFIX)?;
    let mut it = rest.split('_');
    let uid = it.next().filter(|s| !s.is_empty())?;
    let dev = it.next().filter(|s| !s.is_empty())?;
    let share = match it.next() {
        Some(s) if !s.is_empty() => Some(s),
        Some(_) => return None,
        None => None,
    };
    it.next().is_none().then_some((uid, dev, share))
}

/// A directory name of the containers directory that holds a region: a
/// device-plugin container key or a DRA share key.
pub fn is_region_key(name: &str) -> bool {
    parse_container_key(name).is_some() || parse_dra_share_key(name).is_some()
}

/// Creates `path` (one level) with `mode`, or checks the existing one is a
/// real directory, then sets `mode` explicitly.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), LayoutError> {
    let io = |op, source| LayoutError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("mkdir", e)),
    }
    let md = std::fs::symlink_metadata(path).map_err(|e| io("lstat", e))?;
    if !md.file_type().is_dir() {
        return Err(LayoutError::NotADirectory(path.to_owned()));
    }
    if md.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io("chmod", e))?;
    }
    Ok(())
}

/// [`ensure_dir`] for every missing ancestor (mode 0755) and then `path`.
pub fn ensure_dir_all(path: &Path, mode: u32) -> Result<(), LayoutError> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && std::fs::symlink_metadata(parent).is_err() {
            ensure_dir_all(parent, 0o755)?;
        }
    }
    ensure_dir(path, mode)
}

/// Writes `text` to `path` atomically (temporary in the same directory,
/// mode set explicitly, fsync, rename).
pub fn write_atomic(path: &Path, text: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let res = (|| {
        f.write_all(text)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_paths() {
        let l = Layout::new("/usr/local");
        let k = container_key("0b1c2d3e-0000-4000-8000-000000000001", "main");
        assert_eq!(
            l.region_dir(&k).to_str().unwrap(),
            "/usr/local/vgpu/containers/0b1c2d3e-0000-4000-8000-000000000001_main"
        );
        assert_eq!(
            l.limits_file(&k).to_str().unwrap(),
            "/usr/local/vgpu/limits/0b1c2d3e-0000-4000-8000-000000000001_main/limits"
        );
        assert_eq!(
            parse_container_key(&k),
            Some(("0b1c2d3e-0000-4000-8000-000000000001", "main"))
        );
        assert_eq!(parse_container_key("nounderscore"), None);
        let d = dra_share_key("c0ffee00-0000-4000-8000-000000000002", "gpu-0", Some("s1"));
        assert_eq!(d, "dra_c0ffee00-0000-4000-8000-000000000002_gpu-0_s1");
        assert_eq!(
            parse_dra_share_key(&d),
            Some(("c0ffee00-0000-4000-8000-000000000002", "gpu-0", Some("s1")))
        );
        assert_eq!(
            parse_dra_share_key(&dra_share_key("u", "gpu-1", None)),
            Some(("u", "gpu-1", None))
        );
        assert_eq!(parse_container_key(&d), None, "a share is no container");
        assert!(is_region_key(&d) && is_region_key(&k) && !is_region_key("x"));
        assert_eq!(parse_dra_share_key("dra_u_gpu-0_s_x"), None);
        // The vgpu-region rule finds the limits file from the region path.
        let region = l.region_dir(&k).join(REGION_FILE);
        assert_eq!(
            vgpu_region::limits::path_for_region(&region),
            l.limits_file(&k)
        );
    }

    #[test]
    fn ensure_dir_modes_and_refusals() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b/c");
        ensure_dir_all(&d, 0o1777).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            ensure_dir(&link, 0o755),
            Err(LayoutError::NotADirectory(_))
        ));
        let f = t.path().join("file");
        std::fs::write(&f, "x").unwrap();
        assert!(matches!(
            ensure_dir(&f, 0o755),
            Err(LayoutError::NotADirectory(_))
        ));
        write_atomic(&t.path().join("w"), b"hello", 0o644).unwrap();
        assert_eq!(std::fs::read(t.path().join("w")).unwrap(), b"hello");
    }
}
