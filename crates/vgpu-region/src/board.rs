//! A GPU's lending board (docs/limiter.md, "Guarantees and ceilings"): the
//! state every container sharing one physical GPU can see, so that time a
//! container leaves unused can go to the others and come back.
//!
//! One directory per GPU (`<board dir>/<UUID>/`), one small file per
//! container in it (`<name>`, both named by the operator in the container's
//! limits file: `board <dir> <name>`). A container writes only its own file
//! (the node agent mounts that one file writable and the directory
//! read-only; the bench and `vgpu run` use plain directories) and reads
//! every file there each control period. An entry is one fixed 64-byte
//! record with a checksum, rewritten in place with one `pwrite`: a reader
//! that catches a torn write sees a bad checksum and skips that entry for
//! the period, and an entry whose heartbeat is older than [`FRESH_NS`] is
//! a container that stopped (died, was stopped, left): it no longer counts.
//!
//! Never: follow a symlink, block on a FIFO, read more than one record per
//! file, panic on any content, or allocate beyond the entries it returns.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Size of one entry.
pub const RECORD_LEN: usize = 64;
/// Magic of an entry (`VGBD`).
pub const MAGIC: u32 = u32::from_le_bytes(*b"VGBD");
/// Format version.
pub const VERSION: u32 = 1;
/// An entry older than this (CLOCK_MONOTONIC) is a container that stopped
/// writing: ten control periods.
pub const FRESH_NS: u64 = 100_000_000;
/// Most entries read from one GPU's directory.
pub const MAX_ENTRIES: usize = 256;
/// Longest entry name.
pub const MAX_NAME_LEN: usize = 63;

/// Errors of the board.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    /// A name the board cannot hold.
    #[error("board entry name {0:?}: 1-63 of A-Z a-z 0-9 . _ - (not starting with '.')")]
    BadName(String),
    /// The GPU's directory or the entry could not be used.
    #[error("board {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// One container's entry on a GPU's board.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    /// Its guarantee, ppm of the device's time (0: best effort).
    pub guarantee_ppm: u32,
    /// Its ceiling, ppm.
    pub ceiling_ppm: u32,
    /// What it asks for this period, ppm.
    pub want_ppm: u32,
    /// What it used in the last period, ppm.
    pub used_ppm: u32,
    /// What it paces at now, ppm (display).
    pub pace_ppm: u32,
    /// The writing process (display).
    pub pid: u32,
    /// CLOCK_MONOTONIC ns of the write.
    pub heartbeat_ns: u64,
    /// Bumped at every write.
    pub seq: u64,
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Entry {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        let put32 = |b: &mut [u8; RECORD_LEN], at: usize, v: u32| {
            b[at..at + 4].copy_from_slice(&v.to_le_bytes())
        };
        put32(&mut b, 0, MAGIC);
        put32(&mut b, 4, VERSION);
        put32(&mut b, 8, self.guarantee_ppm);
        put32(&mut b, 12, self.ceiling_ppm);
        put32(&mut b, 16, self.want_ppm);
        put32(&mut b, 20, self.used_ppm);
        put32(&mut b, 24, self.pace_ppm);
        put32(&mut b, 28, self.pid);
        b[32..40].copy_from_slice(&self.heartbeat_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.seq.to_le_bytes());
        let sum = fnv(&b[..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// The entry of a record, or `None` when it is not one (foreign, torn,
    /// another version, a ppm over the device).
    pub fn decode(b: &[u8]) -> Option<Entry> {
        let b: &[u8; RECORD_LEN] = b.get(..RECORD_LEN)?.try_into().ok()?;
        let get32 = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let get64 = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        if get32(0) != MAGIC || get32(4) != VERSION || get64(56) != fnv(&b[..56]) {
            return None;
        }
        let e = Entry {
            guarantee_ppm: get32(8),
            ceiling_ppm: get32(12),
            want_ppm: get32(16),
            used_ppm: get32(20),
            pace_ppm: get32(24),
            pid: get32(28),
            heartbeat_ns: get64(32),
            seq: get64(40),
        };
        let ok = [
            e.guarantee_ppm,
            e.ceiling_ppm,
            e.want_ppm,
            e.used_ppm,
            e.pace_ppm,
        ]
        .iter()
        .all(|&v| v <= 1_000_000);
        ok.then_some(e)
    }

    /// Written within [`FRESH_NS`] of `now_ns`.
    pub fn is_fresh(&self, now_ns: u64) -> bool {
        self.heartbeat_ns != 0 && now_ns.saturating_sub(self.heartbeat_ns) <= FRESH_NS
    }
}

/// Whether `name` can name an entry.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The directory of GPU `uuid` under the board directory `dir`.
pub fn gpu_dir(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(uuid)
}

/// A container's own entry on one GPU's board, open for writing.
pub struct Writer {
    file: File,
    path: PathBuf,
    seq: u64,
}

impl Writer {
    /// Opens (creating, mode 0644) the entry `name` in the GPU directory
    /// `gpu_dir` (made, mode 0755, when its parent, the operator's board
    /// directory, exists and it does not). A symlink or anything but a
    /// regular file there is refused.
    pub fn open(gpu_dir: &Path, name: &str) -> Result<Writer, BoardError> {
        if !valid_name(name) {
            return Err(BoardError::BadName(name.to_owned()));
        }
        let path = gpu_dir.join(name);
        let io = |source| BoardError::Io {
            path: path.clone(),
            source,
        };
        if !gpu_dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            // Another container may make it at the same moment: fine.
            let _ = std::fs::DirBuilder::new().mode(0o755).create(gpu_dir);
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(io::Error::other("not a regular file")));
        }
        Ok(Writer { file, path, seq: 0 })
    }

    /// Writes `e` (its `seq` set here) in one `pwrite`.
    pub fn publish(&mut self, e: &Entry) -> Result<(), BoardError> {
        self.seq += 1;
        let e = Entry {
            seq: self.seq,
            ..*e
        };
        self.file
            .write_all_at(&e.encode(), 0)
            .map_err(|source| BoardError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every fresh entry of the GPU directory `gpu_dir` at `now_ns`, by name,
/// into `out` (cleared first; at most [`MAX_ENTRIES`]). Files that are not
/// entries (foreign, torn, stale, a symlink, a FIFO) are skipped; a
/// directory that cannot be read is an error.
pub fn read(gpu_dir: &Path, now_ns: u64, out: &mut Vec<(String, Entry)>) -> Result<(), BoardError> {
    out.clear();
    let rd = std::fs::read_dir(gpu_dir).map_err(|source| BoardError::Io {
        path: gpu_dir.to_path_buf(),
        source,
    })?;
    for de in rd.flatten() {
        if out.len() >= MAX_ENTRIES {
            break;
        }
        let Some(name) = de.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !valid_name(&name) {
            continue;
        }
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(de.path())
        else {
            continue;
        };
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        let mut b = [0u8; RECORD_LEN];
        if f.read_exact_at(&mut b, 0).is_err() {
            continue;
        }
        if let Some(e) = Entry::decode(&b).filter(|e| e.is_fresh(now_ns)) {
            out.push((name, e));
        }
    }
    // Every member computes the same allocation from the same order.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(())
}

/// What the node side checks of an entry against the operator's limits of
/// that container (`guarantee`, `ceiling` in ppm): an entry that claims
/// another guarantee or ceiling, or paces above its ceiling, is a tenant
/// that does not follow the protocol.
pub fn audit(e: &Entry, guarantee_ppm: u32, ceiling_ppm: u32) -> Option<String> {
    if e.guarantee_ppm != guarantee_ppm {
        return Some(format!(
            "claims a guarantee of {} ppm, the operator gave {guarantee_ppm}",
            e.guarantee_ppm
        ));
    }
    if e.ceiling_ppm != ceiling_ppm {
        return Some(format!(
            "claims a ceiling of {} ppm, the operator gave {ceiling_ppm}",
            e.ceiling_ppm
        ));
    }
    if e.pace_ppm > ceiling_ppm.max(guarantee_ppm) {
        return Some(format!(
            "paces at {} ppm, above its ceiling {ceiling_ppm}",
            e.pace_ppm
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(g: u32, now: u64) -> Entry {
        Entry {
            guarantee_ppm: g,
            ceiling_ppm: 1_000_000,
            want_ppm: 500_000,
            used_ppm: 10,
            pace_ppm: g,
            pid: 42,
            heartbeat_ns: now,
            seq: 0,
        }
    }

    #[test]
    fn records_round_trip_and_junk_is_refused() {
        let e = entry(300_000, 7);
        let b = e.encode();
        assert_eq!(Entry::decode(&b), Some(e));
        for i in 0..RECORD_LEN {
            let mut t = b;
            t[i] ^= 0x40;
            assert_eq!(Entry::decode(&t), None, "byte {i} flipped");
        }
        assert_eq!(Entry::decode(&b[..10]), None);
        let mut over = e;
        over.want_ppm = 1_000_001;
        assert_eq!(Entry::decode(&over.encode()), None);
        assert!(valid_name("pod_ctr-1.x"));
        for bad in ["", ".hidden", "a/b", "x y", &"n".repeat(64)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn readers_see_fresh_entries_only_and_skip_foreign_files() {
        let d = tempfile::tempdir().unwrap();
        let now = 10 * FRESH_NS;
        let mut a = Writer::open(d.path(), "a").unwrap();
        let mut b = Writer::open(d.path(), "b").unwrap();
        a.publish(&entry(300_000, now)).unwrap();
        b.publish(&entry(200_000, now - FRESH_NS - 1)).unwrap();
        std::fs::write(d.path().join("junk"), b"hello").unwrap();
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("link")).unwrap();
        let mut out = Vec::new();
        read(d.path(), now, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "a");
        assert_eq!(out[0].1.guarantee_ppm, 300_000);
        assert_eq!(out[0].1.seq, 1);
        // b writes again: fresh.
        b.publish(&entry(200_000, now)).unwrap();
        read(d.path(), now, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(
            Writer::open(d.path(), "link").is_err(),
            "a symlink is refused"
        );
        assert!(Writer::open(d.path(), "../x").is_err());
        assert!(read(&d.path().join("none"), now, &mut out).is_err());
    }

    #[test]
    fn the_node_side_catches_a_lying_entry() {
        let e = entry(300_000, 1);
        assert_eq!(audit(&e, 300_000, 1_000_000), None);
        assert!(audit(&e, 200_000, 1_000_000).unwrap().contains("guarantee"));
        assert!(audit(&e, 300_000, 600_000).unwrap().contains("ceiling"));
        let fast = Entry {
            pace_ppm: 700_000,
            ceiling_ppm: 600_000,
            ..e
        };
        assert!(audit(&fast, 300_000, 600_000).unwrap().contains("paces"));
    }
}
