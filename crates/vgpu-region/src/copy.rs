//! A private copy of a region file, for readers that must not trust the
//! file's owner (the node agent, `vgpu inspect`).
//!
//! Owns: reading a region file's bytes into anonymous memory of this
//! process with `pread(2)` — only the file's data extents
//! (`SEEK_DATA`/`SEEK_HOLE`; the holes of a sparse region stay untouched
//! zero pages), each chunk read until two reads agree — and the checks that
//! the file did not shrink while it was read. Never maps the file: every
//! process of a container can `ftruncate` its region, and a mapping of a
//! truncated file raises SIGBUS in whoever reads it, while a read of one at
//! worst comes up short.
//!
//! What a copy promises: bytes that were in the file at some instant during
//! the copy, each chunk taken from two reads that agreed (so a word that
//! changed during one read is taken from a read during which it did not,
//! unless it kept changing through all `READS` reads); a file that shrank
//! below the header's length during the copy is refused
//! (`RegionError::ChangedWhileCopied`), never filled in with zeros, and so
//! is one cut below its header (`Region::open_copy` checks the header as
//! copied and as the file holds it afterwards). A file cut above its header
//! and grown back between two of our reads shows zeros where it was cut, as
//! if its owner had written zeros there: the tenant owns the contents
//! anyway, and every reader treats them as untrusted.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::MmapMut;
use rustix::fs::SeekFrom;
use rustix::io::Errno;

use crate::region::RegionError;

/// Bytes read per `pread` (and compared between two reads).
const CHUNK: usize = 64 * 1024;

/// Granularity of the holes kept in the copy.
const PAGE: usize = 4096;

/// At most this many reads of one chunk while looking for two that agree;
/// the last one stands (a page its writers never leave alone).
const READS: u32 = 4;

/// A filled copy and what it took.
pub(crate) struct FileCopy {
    /// `len` bytes: the file's data, zeros in its holes (writable until the
    /// caller seals it with `shm::read_only`).
    pub map: MmapMut,
    /// Bytes of data extents copied (each counted once, whatever the
    /// re-reads): the file's holes are never read.
    pub data_bytes: u64,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn shrank(path: &Path, now: u64, len: u64) -> RegionError {
    RegionError::ChangedWhileCopied {
        path: path.to_owned(),
        what: format!("it shrank to {now} bytes, its header says {len}"),
    }
}

/// Copies the first `len` bytes of `f` (a region file whose header said
/// `len`) into private anonymous memory.
pub(crate) fn copy(f: &File, path: &Path, len: u64) -> Result<FileCopy, RegionError> {
    let mut map = crate::shm::anon(len).map_err(io("map a copy of", path))?;
    let mut buf = vec![0u8; CHUNK];
    let mut spare = vec![0u8; CHUNK];
    let mut data_bytes = 0u64;
    let mut off = 0u64;
    let plan = crate::failpoint::Plan::from_env();
    while off < len {
        let Some((start, end)) = next_extent(f, off, len).map_err(io("seek", path))? else {
            break;
        };
        let mut at = start;
        while at < end {
            let n = (end - at).min(CHUNK as u64) as usize;
            let got =
                read_settled(f, &mut buf[..n], &mut spare[..n], at).map_err(io("read", path))?;
            if got < n {
                return Err(shrank(path, at + got as u64, len));
            }
            // An all-zero page (allocated, never written) stays a hole in
            // the copy too. `at + n <= end <= len`, the copy's length.
            let dst = &mut map[at as usize..at as usize + n];
            for (d, s) in dst.chunks_mut(PAGE).zip(buf[..n].chunks(PAGE)) {
                if s.iter().any(|&b| b != 0) {
                    d.copy_from_slice(s);
                }
            }
            data_bytes += n as u64;
            at += n as u64;
        }
        off = end;
        plan.hit("copy.after_extent");
    }
    // A shrink that `SEEK_DATA` showed as a hole (the rest of the copy kept
    // its zeros) is refused like one a read ran into.
    let now = rustix::fs::fstat(f)
        .map_err(|e| io("stat", path)(e.into()))?
        .st_size
        .max(0) as u64;
    if now < len {
        return Err(shrank(path, now, len));
    }
    Ok(FileCopy { map, data_bytes })
}

/// The next data extent at or after `off`, clipped to `len`: `None` when
/// only holes (or the end of the file) follow. A filesystem without
/// `SEEK_DATA` gives the whole rest as one extent.
fn next_extent(f: &File, off: u64, len: u64) -> std::io::Result<Option<(u64, u64)>> {
    let start = match rustix::fs::seek(f, SeekFrom::Data(off)) {
        Ok(d) => d,
        // Nothing but holes from `off` to the end of the file.
        Err(Errno::NXIO) => return Ok(None),
        Err(Errno::INVAL) | Err(Errno::OPNOTSUPP) => return Ok(Some((off, len))),
        Err(e) => return Err(e.into()),
    };
    if start >= len {
        return Ok(None);
    }
    let end = match rustix::fs::seek(f, SeekFrom::Hole(start)) {
        Ok(h) => h,
        // The file shrank between the two calls: read on, the read comes
        // up short and says so.
        Err(Errno::NXIO) => len,
        Err(e) => return Err(e.into()),
    };
    // Always forward, never past the copy.
    Ok(Some((start, end.clamp(start + 1, len))))
}

/// Reads `buf.len()` bytes at `at` into `buf`, then again into `spare`,
/// until two successive reads agree (at most `READS` reads; the last one
/// stands). The bytes read: fewer than asked only where the file ends.
fn read_settled(f: &File, buf: &mut [u8], spare: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = read_full(f, buf, at)?;
    for _ in 1..READS {
        let m = read_full(f, spare, at)?;
        if m == n && spare[..m] == buf[..n] {
            break;
        }
        buf.copy_from_slice(spare);
        n = m;
    }
    Ok(n)
}

/// `pread` until `buf` is full or the file ends.
fn read_full(f: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
