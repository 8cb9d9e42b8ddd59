//! Bytes of simulated device memory: each allocation is a sparse memfd,
//! so an 80 GiB device costs only the pages written, and reads of
//! untouched memory return zeros without allocating. Data moves with
//! positioned reads and writes (no mapping, no `unsafe`); a memset of zero
//! punches a hole. The same file descriptor can be handed to another
//! process (IPC), which then sees the same bytes, as CUDA IPC shares them.
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use rustix::fs::{fallocate, memfd_create, FallocateFlags, MemfdFlags};

/// Chunk for fills and device-to-device copies.
const CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    #[error("cannot create device memory backing of {size} bytes")]
    Create {
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("device memory access failed")]
    Io(#[from] std::io::Error),
    #[error("access of {len} bytes at offset {off} is outside a {size}-byte allocation")]
    OutOfRange { off: u64, len: u64, size: u64 },
}

#[derive(Debug)]
pub struct Backing {
    file: File,
    size: u64,
}

impl Backing {
    /// A zero-filled, sparse backing of `size` bytes.
    pub fn new(size: u64) -> Result<Backing, BackingError> {
        let create = |source: std::io::Error| BackingError::Create { size, source };
        let fd = memfd_create("vgpu-sim-device-memory", MemfdFlags::CLOEXEC)
            .map_err(|e| create(e.into()))?;
        let file = File::from(fd);
        file.set_len(size).map_err(create)?;
        Ok(Backing { file, size })
    }

    /// Adopt a backing another process shared (IPC).
    pub fn from_fd(fd: OwnedFd, size: u64) -> Result<Backing, BackingError> {
        let file = File::from(fd);
        let len = file.metadata()?.len();
        if len < size {
            return Err(BackingError::OutOfRange {
                off: 0,
                len: size,
                size: len,
            });
        }
        Ok(Backing { file, size })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The descriptor, to share with another process.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    fn check(&self, off: u64, len: u64) -> Result<(), BackingError> {
        match off.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(BackingError::OutOfRange {
                off,
                len,
                size: self.size,
            }),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BackingError> {
        self.check(off, buf.len() as u64)?;
        self.file.read_exact_at(buf, off)?;
        Ok(())
    }

    pub fn write(&self, off: u64, buf: &[u8]) -> Result<(), BackingError> {
        self.check(off, buf.len() as u64)?;
        self.file.write_all_at(buf, off)?;
        Ok(())
    }

    /// Fill `count` elements of `pattern` (1, 2 or 4 bytes) from `off`.
    pub fn fill(&self, off: u64, pattern: &[u8], count: u64) -> Result<(), BackingError> {
        let len = count
            .checked_mul(pattern.len() as u64)
            .ok_or(BackingError::OutOfRange {
                off,
                len: u64::MAX,
                size: self.size,
            })?;
        self.check(off, len)?;
        if len == 0 {
            return Ok(());
        }
        if pattern.iter().all(|b| *b == 0) {
            // Zeros cost nothing: give the pages back.
            let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if fallocate(&self.file, mode, off, len).is_ok() {
                return Ok(());
            }
        }
        let per = CHUNK / pattern.len() * pattern.len();
        let buf: Vec<u8> = pattern.iter().copied().cycle().take(per).collect();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(per as u64) as usize;
            self.file.write_all_at(&buf[..n], off + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Copy `len` bytes to `dst` at `dst_off` (the two may be the same
    /// backing; overlapping ranges copy as `memmove` does).
    pub fn copy_to(
        &self,
        off: u64,
        dst: &Backing,
        dst_off: u64,
        len: u64,
    ) -> Result<(), BackingError> {
        self.check(off, len)?;
        dst.check(dst_off, len)?;
        let mut buf = vec![0u8; (len as usize).min(CHUNK)];
        // Backwards when the destination overlaps the source's tail.
        let backwards = std::ptr::eq(self, dst) && dst_off > off && dst_off < off + len;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64);
            let at = if backwards { len - done - n } else { done };
            let b = &mut buf[..n as usize];
            self.file.read_exact_at(b, off + at)?;
            dst.file.write_all_at(b, dst_off + at)?;
            done += n;
        }
        Ok(())
    }

    /// Bytes of memory the backing holds now (pages written).
    pub fn resident_bytes(&self) -> Result<u64, BackingError> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks() * 512)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_backing_costs_only_what_is_written() {
        let b = Backing::new(80 << 30).unwrap();
        assert_eq!(b.size(), 80 << 30);
        let mut z = [7u8; 16];
        b.read((40 << 30) + 3, &mut z).unwrap();
        assert_eq!(z, [0; 16], "untouched memory reads zero");
        b.write(1 << 30, b"hello").unwrap();
        let mut h = [0u8; 5];
        b.read(1 << 30, &mut h).unwrap();
        assert_eq!(&h, b"hello");
        assert!(b.resident_bytes().unwrap() <= 1 << 20, "only a page or so");
        assert!(b.read(80 << 30, &mut h).is_err());
        assert!(b.write(u64::MAX - 1, b"xx").is_err());
    }

    #[test]
    fn fills_and_copies() {
        let b = Backing::new(3 << 20).unwrap();
        b.fill(1, &[0xab, 0xcd], (2 << 20) / 2).unwrap();
        let mut v = vec![0u8; 6];
        b.read(0, &mut v).unwrap();
        assert_eq!(v, [0, 0xab, 0xcd, 0xab, 0xcd, 0xab]);
        b.fill(2, &[0], 2).unwrap();
        b.read(0, &mut v).unwrap();
        assert_eq!(v, [0, 0xab, 0, 0, 0xcd, 0xab]);
        let c = Backing::new(4096).unwrap();
        b.copy_to(1, &c, 10, 5).unwrap();
        let mut w = vec![0u8; 5];
        c.read(10, &mut w).unwrap();
        assert_eq!(w, [0xab, 0, 0, 0xcd, 0xab]);
        // Overlapping forward move within one backing.
        c.write(0, b"abcdef").unwrap();
        c.copy_to(0, &c, 2, 4).unwrap();
        let mut m = vec![0u8; 6];
        c.read(0, &mut m).unwrap();
        assert_eq!(&m, b"ababcd");
        assert!(b.fill(3 << 20, &[1], 1).is_err());
    }
}
