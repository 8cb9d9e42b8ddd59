//! Where a shared library defines a symbol, read from its ELF file's
//! dynamic symbol table: for clients that must call the driver's own entry
//! point past a preloaded interposer (whose `dlsym` and `dlvsym` answer a
//! driver name with its hook). The benchmarks time the driver's own call
//! beside the interposed one in the same process this way. ELF64,
//! little-endian (x86_64, aarch64): the parse is plain byte reads; the one
//! unsafe call asks the loader where it mapped the library.
use std::ffi::{c_char, c_void, CStr};

/// `SHT_DYNSYM`.
const SHT_DYNSYM: usize = 11;
/// Size of one `Elf64_Sym`.
const SYM_SIZE: usize = 24;

/// `N` bytes at `at + off` (`None` past the end, or when the sum wraps:
/// every offset here comes from the file).
fn bytes<const N: usize>(b: &[u8], at: usize, off: usize) -> Option<[u8; N]> {
    let start = at.checked_add(off)?;
    b.get(start..start.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize, off: usize) -> Option<u16> {
    bytes(b, at, off).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize, off: usize) -> Option<usize> {
    usize::try_from(u32::from_le_bytes(bytes(b, at, off)?)).ok()
}

fn u64_at(b: &[u8], at: usize, off: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(bytes(b, at, off)?)).ok()
}

/// The value (offset from the load base) of the symbol `name` that the
/// ELF64 little-endian image `elf` defines in its dynamic symbol table;
/// `None` when it defines none of that name or the image is not one.
pub fn dynsym_value(elf: &[u8], name: &str) -> Option<u64> {
    // ELFCLASS64, ELFDATA2LSB.
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = u64_at(elf, 0, 0x28)?;
    let shentsize = usize::from(u16_at(elf, 0, 0x3a)?);
    let shnum = usize::from(u16_at(elf, 0, 0x3c)?);
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    for i in 0..shnum {
        let sh = section(i)?;
        if u32_at(elf, sh, 4)? != SHT_DYNSYM {
            continue;
        }
        let (off, size) = (u64_at(elf, sh, 0x18)?, u64_at(elf, sh, 0x20)?);
        let strtab = u64_at(elf, section(u32_at(elf, sh, 0x28)?)?, 0x18)?;
        let syms = elf.get(off..off.checked_add(size)?)?;
        for sym in syms.chunks_exact(SYM_SIZE) {
            // st_shndx 0: an undefined reference, not a definition.
            if u16_at(sym, 0, 6)? == 0 {
                continue;
            }
            let rest = elf.get(strtab.checked_add(u32_at(sym, 0, 0)?)?..)?;
            let end = rest.iter().position(|&c| c == 0)?;
            if &rest[..end] == name.as_bytes() {
                return u64::try_from(u64_at(sym, 0, 8)?).ok();
            }
        }
    }
    None
}

/// The start of glibc's `struct link_map` (link.h, public ABI).
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const c_char,
}

/// `name` as the library behind `handle` itself defines it, never a
/// preloaded interposer's: its file's dynamic symbol table, at the address
/// the loader mapped it.
///
/// # Safety
/// `handle` is a handle `dlopen` returned that stays open while the
/// result is used.
pub unsafe fn own_symbol(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    let mut lm: *const LinkMapHead = std::ptr::null();
    // SAFETY: the caller's open handle; RTLD_DI_LINKMAP writes one
    // `struct link_map *` through the pointer it is given.
    let r = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut lm as *mut *const LinkMapHead).cast(),
        )
    };
    if r != 0 || lm.is_null() {
        return Err("dlinfo(RTLD_DI_LINKMAP) failed".into());
    }
    // SAFETY: the loader's map of a library the caller keeps open; its
    // `l_name` is a NUL-terminated path kept for the map's life.
    let (base, path) = unsafe {
        let m = &*lm;
        (
            m.l_addr,
            CStr::from_ptr(m.l_name).to_string_lossy().into_owned(),
        )
    };
    let image = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let value = dynsym_value(&image, name).ok_or_else(|| format!("{path} defines no {name}"))?;
    Ok(base.wrapping_add(value as usize) as *mut c_void)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_an_elf_image_defines_nothing() {
        assert_eq!(dynsym_value(b"", "malloc"), None);
        assert_eq!(dynsym_value(b"\x7fELF\x01\x01", "malloc"), None);
        let mut truncated = b"\x7fELF\x02\x01".to_vec();
        truncated.resize(0x40, 0xff);
        assert_eq!(dynsym_value(&truncated, "malloc"), None);
    }

    /// What the fuzz target `elf_dynsym` checks, on stable: a real image
    /// (this test's own executable) with its header, its section headers
    /// or any byte changed at random never panics the lookup.
    #[test]
    fn mutated_images_never_panic() {
        let mut img = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // The executable imports `malloc` (an undefined entry): not a
        // definition, so not found.
        assert_eq!(dynsym_value(&img, "malloc"), None);
        let shoff = u64_at(&img, 0, 0x28).unwrap();
        let shtab = usize::from(u16_at(&img, 0, 0x3a).unwrap())
            * usize::from(u16_at(&img, 0, 0x3c).unwrap());
        assert!(
            shoff + shtab <= img.len(),
            "section headers inside the file"
        );
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as usize
        };
        for round in 0..4000 {
            let mut saved = Vec::new();
            for _ in 0..1 + next() % 6 {
                let at = match round % 3 {
                    0 => next() % 0x40,
                    1 => shoff + next() % shtab,
                    _ => next() % img.len(),
                };
                saved.push((at, img[at]));
                img[at] = next() as u8;
            }
            let _ = dynsym_value(&img, "malloc");
            for (at, b) in saved.into_iter().rev() {
                img[at] = b;
            }
        }
    }
}
