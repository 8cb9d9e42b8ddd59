//! Module images a client may load: the sim's own text format, PTX text,
//! cubin (ELF) and fatbin containers. No code runs on the simulated
//! device, so what matters is which kernels an image names: PTX `.entry`
//! declarations, a cubin's `.text.<kernel>` sections, and whatever PTX or
//! cubin a fatbin holds. A fatbin whose contents cannot be read (e.g.
//! compressed) is an "open" module: any kernel name resolves. Pure parsing
//! of byte slices; the caller bounds them.

/// What a loaded image offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kernels {
    pub names: Vec<String>,
    /// Any name resolves (contents not readable).
    pub open: bool,
}

/// How an image announces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `vgpu-sim-module v1` / `vgpu-sim-kernel` text (docs/sim.md).
    SimText,
    Ptx,
    Cubin,
    Fatbin,
    /// `__fatBinC_Wrapper_t`: a pointer to a fatbin.
    FatbinWrapper,
}

pub const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
pub const FATBIN_MAGIC: u32 = 0xba55_ed50;
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// The format an image's first bytes announce (`head`: at least 16).
pub fn format(head: &[u8]) -> Option<Format> {
    if head.starts_with(ELF_MAGIC) {
        return Some(Format::Cubin);
    }
    match u32_at(head, 0) {
        Some(FATBIN_MAGIC) => return Some(Format::Fatbin),
        Some(FATBIN_WRAPPER_MAGIC) => return Some(Format::FatbinWrapper),
        _ => {}
    }
    let text = String::from_utf8_lossy(head);
    let t = text.trim_start();
    if t.starts_with("vgpu-sim-module") || t.starts_with("vgpu-sim-kernel") {
        return Some(Format::SimText);
    }
    // PTX starts with a directive or a comment (ptxas/nvrtc output does).
    if t.starts_with('.') || t.starts_with("//") || t.starts_with("/*") {
        return Some(Format::Ptx);
    }
    None
}

/// A cubin's full length from its ELF header and section table, if the
/// header is ELF64 little-endian. `head` is at least 64 bytes; `sections`
/// reads `len` bytes at an offset.
pub fn elf_len(head: &[u8], sections: impl Fn(u64, usize) -> Option<Vec<u8>>) -> Option<u64> {
    if !head.starts_with(ELF_MAGIC) || head.get(4) != Some(&2) || head.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(head, 0x28)?;
    let shentsize = u64::from(u16_at(head, 0x3a)?);
    let shnum = u64::from(u16_at(head, 0x3c)?);
    if shentsize < 0x40 || shnum > 65_000 {
        return None;
    }
    let table_end = shoff.checked_add(shentsize * shnum)?;
    let table = sections(shoff, (shentsize * shnum) as usize)?;
    let mut end = table_end.max(64);
    for i in 0..shnum as usize {
        let e = &table[i * shentsize as usize..];
        let ty = u32_at(e, 4)?;
        let off = u64_at(e, 0x18)?;
        let size = u64_at(e, 0x20)?;
        // SHT_NOBITS occupies no file bytes.
        if ty != 8 {
            end = end.max(off.checked_add(size)?);
        }
    }
    Some(end)
}

/// Kernel names of a cubin: its `.text.<name>` sections.
pub fn elf_kernels(b: &[u8]) -> Option<Vec<String>> {
    let shoff = usize::try_from(u64_at(b, 0x28)?).ok()?;
    let shentsize = usize::from(u16_at(b, 0x3a)?);
    let shnum = usize::from(u16_at(b, 0x3c)?);
    let shstrndx = usize::from(u16_at(b, 0x3e)?);
    let sh = |i: usize| b.get(shoff + i * shentsize..shoff + (i + 1) * shentsize);
    let strtab = sh(shstrndx)?;
    let (stroff, strsize) = (
        usize::try_from(u64_at(strtab, 0x18)?).ok()?,
        usize::try_from(u64_at(strtab, 0x20)?).ok()?,
    );
    let names = b.get(stroff..stroff.checked_add(strsize)?)?;
    let mut out = Vec::new();
    for i in 0..shnum {
        let e = sh(i)?;
        let n = u32_at(e, 0)? as usize;
        let name = names.get(n..)?;
        let end = name.iter().position(|c| *c == 0)?;
        let name = std::str::from_utf8(&name[..end]).ok()?;
        if let Some(k) = name.strip_prefix(".text.") {
            if !k.is_empty() {
                out.push(k.to_string());
            }
        }
    }
    Some(out)
}

/// Kernel names a PTX text declares (`.entry name(`).
pub fn ptx_kernels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".entry") {
        let rest = &text[i + ".entry".len()..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// What a fatbin holds: the kernels of the PTX and cubins it carries
/// uncompressed; open if none could be read.
pub fn fatbin_kernels(b: &[u8]) -> Kernels {
    let mut names: Vec<String> = Vec::new();
    let mut add = |v: Vec<String>| {
        for n in v {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    };
    // Embedded cubins.
    let mut at = 0;
    while let Some(pos) = b[at..].windows(4).position(|w| w == ELF_MAGIC) {
        let o = at + pos;
        if let Some(k) = elf_kernels(&b[o..]) {
            add(k);
        }
        at = o + 4;
    }
    // Embedded PTX.
    add(ptx_kernels(&String::from_utf8_lossy(b)));
    Kernels {
        open: names.is_empty(),
        names,
    }
}

/// A fatbin's full length from its 16-byte header.
pub fn fatbin_len(head: &[u8]) -> Option<u64> {
    if u32_at(head, 0)? != FATBIN_MAGIC {
        return None;
    }
    let hdr = u64::from(u16_at(head, 6)?);
    hdr.checked_add(u64_at(head, 8)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with sections "", ".shstrtab", ".text.spin",
    /// ".text._Z4busyv".
    fn cubin() -> Vec<u8> {
        let names = b"\0.shstrtab\0.text.spin\0.text._Z4busyv\0".to_vec();
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        let stroff = b.len() as u64;
        b.extend_from_slice(&names);
        let text = b.len() as u64;
        b.extend_from_slice(&[0u8; 16]);
        while !b.len().is_multiple_of(8) {
            b.push(0);
        }
        let shoff = b.len() as u64;
        let sec = |name: u32, ty: u32, off: u64, size: u64| {
            let mut e = vec![0u8; 64];
            e[0..4].copy_from_slice(&name.to_le_bytes());
            e[4..8].copy_from_slice(&ty.to_le_bytes());
            e[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            e[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            e
        };
        b.extend(sec(0, 0, 0, 0));
        b.extend(sec(1, 3, stroff, names.len() as u64));
        b.extend(sec(11, 1, text, 8));
        b.extend(sec(22, 1, text + 8, 8));
        b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        b
    }

    #[test]
    fn formats_and_kernels() {
        let c = cubin();
        assert_eq!(format(&c), Some(Format::Cubin));
        let len = elf_len(&c[..64], |o, n| {
            c.get(o as usize..o as usize + n).map(<[u8]>::to_vec)
        });
        assert_eq!(len, Some(c.len() as u64));
        assert_eq!(elf_kernels(&c).unwrap(), vec!["spin", "_Z4busyv"]);
        let ptx = ".version 7.0\n.target sm_50\n.visible .entry spin(.param .u64 a)\n{ ret; }\n.entry two()\n{}\n";
        assert_eq!(format(ptx.as_bytes()), Some(Format::Ptx));
        assert_eq!(ptx_kernels(ptx), vec!["spin", "two"]);
        assert_eq!(format(b"vgpu-sim-module v1\n"), Some(Format::SimText));
        assert_eq!(format(b"\x00\x01garbage........"), None);
        // A fatbin holding the cubin and the PTX.
        let mut f = Vec::new();
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        let body: Vec<u8> = [vec![0u8; 32], c.clone(), ptx.as_bytes().to_vec()].concat();
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend(body);
        assert_eq!(format(&f), Some(Format::Fatbin));
        assert_eq!(fatbin_len(&f), Some(f.len() as u64));
        let k = fatbin_kernels(&f);
        assert_eq!(k.names, vec!["spin", "_Z4busyv", "two"]);
        assert!(!k.open);
        // Compressed (unreadable) contents: an open module.
        let mut z = f[..16].to_vec();
        z.extend(vec![0x5au8; 64]);
        assert!(fatbin_kernels(&z).open);
    }
}
