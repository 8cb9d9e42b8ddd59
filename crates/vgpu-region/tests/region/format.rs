//! Refusal of files that are not a usable region, each with its own error,
//! without overwriting them; the header parser never panics.
use std::path::Path;

use proptest::prelude::*;
use vgpu_region::layout::{self, *};
use vgpu_region::{CreateOptions, DeviceConfig, FormatError, Region, RegionError};

fn opts() -> CreateOptions {
    CreateOptions {
        slots: 4,
        devices: vec![DeviceConfig {
            uuid: "GPU-fmt".into(),
            mem_limit: 1 << 20,
            sm_limit: 30,
        }],
    }
}

fn valid_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    Region::open_or_create(&p, &opts()).unwrap();
    std::fs::read(&p).unwrap()
}

fn refusal(path: &Path) -> FormatError {
    let before = std::fs::read(path).unwrap();
    let e1 = match Region::open(path) {
        Err(RegionError::Format { source, .. }) => source,
        Err(e) => panic!("open: expected a format refusal, got {e}"),
        Ok(_) => panic!("open accepted a bad file"),
    };
    let e2 = match Region::open_or_create(path, &opts()) {
        Err(RegionError::Format { source, .. }) => source,
        Err(e) => panic!("open_or_create: expected a format refusal, got {e}"),
        Ok(_) => panic!("open_or_create accepted a bad file"),
    };
    assert_eq!(e1, e2);
    assert_eq!(
        std::fs::read(path).unwrap(),
        before,
        "a refused file was modified"
    );
    e1
}

fn patched(f: impl FnOnce(&mut Vec<u8>)) -> FormatError {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let mut b = valid_bytes();
    f(&mut b);
    std::fs::write(&p, &b).unwrap();
    refusal(&p)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

#[test]
fn layout_is_pinned() {
    assert_eq!(HEADER_SIZE, 4096);
    assert_eq!(SLOT_SIZE, 1280);
    assert_eq!(DEVICE_SIZE, 128);
    assert_eq!(PACING_SIZE, 128);
    assert_eq!(SLOT_PACING_SIZE, 576);
    // header | owners (page-padded) | totals (16 devices, page-padded) |
    // slots | pacing: 16 container buckets (a page), then one record per
    // slot (each part page-aligned).
    assert_eq!(pacing_offset(1024), 4096 + 8192 + 16 * 8192 + 1024 * 1280);
    assert_eq!(slot_pacing_offset(1024), pacing_offset(1024) + 4096);
    assert_eq!(file_len(1024), slot_pacing_offset(1024) + 1024 * 576);
    assert_eq!(totals_offset(4), 8192);
    assert_eq!(slots_offset(4), 12288);
    assert_eq!(pacing_offset(4), 12288 + 8192);
    assert_eq!(slot_pacing_offset(4), 12288 + 8192 + 4096);
    assert_eq!(file_len(4), 12288 + 8192 + 4096 + 4 * 576);
    assert_eq!(MAGIC, *b"VGPUREG\0");
    // A created file carries exactly these values at these offsets.
    let b = valid_bytes();
    assert_eq!(&b[0..8], &MAGIC);
    assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), VERSION);
    assert_eq!(
        u32::from_ne_bytes(b[12..16].try_into().unwrap()),
        ENDIAN_MARK
    );
    assert_eq!(
        u32::from_le_bytes(b[12..16].try_into().unwrap()),
        ENDIAN_MARK
    );
    assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 1280);
    assert_eq!(u32::from_ne_bytes(b[28..32].try_into().unwrap()), 4);
    assert_eq!(u32::from_ne_bytes(b[72..76].try_into().unwrap()), 128);
    assert_eq!(u32::from_ne_bytes(b[76..80].try_into().unwrap()), 576);
    assert_eq!(
        u64::from_ne_bytes(b[40..48].try_into().unwrap()),
        layout_hash()
    );
    assert_eq!(
        u32::from_ne_bytes(b[48..52].try_into().unwrap()),
        STATE_READY
    );
    assert_eq!(b.len() as u64, file_len(4));
    // Device 0's memory limit lives at 704 + 64.
    assert_eq!(u64::from_ne_bytes(b[768..776].try_into().unwrap()), 1 << 20);
}

#[test]
fn truncated_files_are_refused() {
    match patched(|b| b.truncate(HEADER_SIZE + 100)) {
        FormatError::Truncated { len, need } => {
            assert_eq!(len, HEADER_SIZE as u64 + 100);
            assert_eq!(need, file_len(4));
        }
        e => panic!("{e}"),
    }
    assert!(matches!(
        patched(|b| b.truncate(40)),
        FormatError::Truncated { .. }
    ));
}

#[test]
fn foreign_files_are_refused() {
    let e = patched(|b| {
        b[..4].copy_from_slice(b"\x7fELF");
    });
    assert!(
        matches!(e, FormatError::ForeignMagic { found } if &found[..4] == b"\x7fELF"),
        "{e}"
    );
    // A short foreign text file too.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(&p, b"hello, this is not a region").unwrap();
    assert!(matches!(refusal(&p), FormatError::ForeignMagic { .. }));
}

#[test]
fn other_versions_are_refused() {
    assert_eq!(
        patched(|b| put_u32(b, 8, 1)),
        FormatError::OtherVersion { found: 1 }
    );
    // Version 2: the layout before the pacing section.
    assert_eq!(
        patched(|b| put_u32(b, 8, 2)),
        FormatError::OtherVersion { found: 2 }
    );
    assert_eq!(
        patched(|b| put_u32(b, 8, 4)),
        FormatError::OtherVersion { found: 4 }
    );
}

#[test]
fn other_byte_order_is_refused() {
    assert_eq!(
        patched(|b| put_u32(b, 12, ENDIAN_MARK.swap_bytes())),
        FormatError::OtherEndianness {
            found: ENDIAN_MARK.swap_bytes()
        }
    );
}

#[test]
fn other_layouts_are_refused() {
    match patched(|b| put_u32(b, 24, 1024)) {
        FormatError::OtherLayout {
            what,
            found,
            expected,
        } => {
            assert_eq!((what, found, expected), ("slot_size", 1024, 1280));
        }
        e => panic!("{e}"),
    }
    match patched(|b| put_u32(b, 76, 512)) {
        FormatError::OtherLayout {
            what,
            found,
            expected,
        } => {
            assert_eq!((what, found, expected), ("slot_pacing_size", 512, 576));
        }
        e => panic!("{e}"),
    }
    match patched(|b| b[40] ^= 1) {
        FormatError::OtherLayout { what, .. } => assert_eq!(what, "layout_hash"),
        e => panic!("{e}"),
    }
}

#[test]
fn corrupt_headers_are_refused() {
    assert_eq!(
        patched(|b| put_u32(b, 28, 0)),
        FormatError::Corrupt {
            what: "slot_count",
            found: 0
        }
    );
    assert_eq!(
        patched(|b| put_u32(b, 32, 99)),
        FormatError::Corrupt {
            what: "device_count",
            found: 99
        }
    );
    // A slot count larger than the file: truncated, not mapped past its end.
    assert!(matches!(
        patched(|b| put_u32(b, 28, 5000)),
        FormatError::Truncated { .. }
    ));
}

#[test]
fn errors_name_the_problem() {
    let msg = format!("{}", FormatError::OtherVersion { found: 1 });
    assert!(
        msg.contains("version 1") && msg.contains(&VERSION.to_string()),
        "{msg}"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    std::fs::write(&p, b"garbage!garbage!").unwrap();
    let e = Region::open(&p).err().unwrap();
    let full = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        full.contains("refusing") && full.contains("not a vgpu region"),
        "{full}"
    );
}

#[test]
fn empty_file_is_initialized_by_creators_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(
        Region::open(&p),
        Err(RegionError::Format {
            source: FormatError::NotInitialized { .. },
            ..
        })
    ));
    let (r, _) = Region::open_or_create(&p, &opts()).unwrap();
    assert_eq!(r.limits(0).sm, 30);
    assert!(matches!(
        Region::open(dir.path().join("missing").as_path()),
        Err(RegionError::Io { .. })
    ));
}

#[test]
fn bad_options_are_refused_before_touching_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let mut o = opts();
    o.devices[0].uuid = "G".repeat(64);
    assert!(matches!(
        Region::open_or_create(&p, &o),
        Err(RegionError::BadOptions { .. })
    ));
    o = opts();
    o.devices[0].sm_limit = 101;
    assert!(matches!(
        Region::open_or_create(&p, &o),
        Err(RegionError::BadOptions { .. })
    ));
    assert!(!p.exists());
}

/// Seeds of the fuzz target (`fuzz/fuzz_targets/region_header.rs`) live in
/// tests/data/header-seeds; replay them and a few built here.
#[test]
fn fuzz_seeds_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/header-seeds");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        layout::fuzz_header(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= 4, "seed corpus missing from {}", dir.display());
    let v = valid_bytes();
    let mut seed = (v.len() as u64).to_le_bytes().to_vec();
    seed.extend_from_slice(&v[..HEADER_SIZE]);
    layout::fuzz_header(&seed);
    assert!(parse_header(&v[..HEADER_SIZE], v.len() as u64).is_ok());
}

/// Writes the seed corpus: `cargo test -p vgpu-region --test format --
/// --ignored write_seeds` (a tool, not a test: it asserts nothing).
#[test]
#[ignore = "writes the fuzz seed corpus; run by hand"]
fn write_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/header-seeds");
    std::fs::create_dir_all(&dir).unwrap();
    let v = valid_bytes();
    let seed = |len: u64, head: &[u8]| {
        let mut s = len.to_le_bytes().to_vec();
        s.extend_from_slice(head);
        s
    };
    let mut other = v[..PARSE_MIN].to_vec();
    put_u32(&mut other, 8, 1);
    std::fs::write(dir.join("valid"), seed(v.len() as u64, &v[..PARSE_MIN])).unwrap();
    std::fs::write(dir.join("truncated"), seed(100, &v[..PARSE_MIN])).unwrap();
    std::fs::write(dir.join("version1"), seed(v.len() as u64, &other)).unwrap();
    std::fs::write(dir.join("foreign"), seed(4096, b"\x7fELF\x02\x01\x01\0")).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        layout::fuzz_header(&data);
    }

    #[test]
    fn any_single_byte_change_is_accepted_consistently_or_refused(
        off in 0usize..PARSE_MIN, val in any::<u8>(), len_cut in 0u64..20_000,
    ) {
        let v = valid_bytes_cached();
        let mut h = v[..PARSE_MIN].to_vec();
        h[off] = val;
        let len = (v.len() as u64).saturating_sub(len_cut);
        match parse_header(&h, len) {
            Ok(info) => {
                prop_assert!(len >= info.file_len);
                prop_assert_eq!(info.slot_count, u32::from_ne_bytes(h[28..32].try_into().unwrap()));
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

fn valid_bytes_cached() -> &'static [u8] {
    static V: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    V.get_or_init(valid_bytes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A valid header over garbage (another writer's bug, a bit flip):
    /// every reader and writer stays in bounds and never panics.
    #[test]
    fn garbage_body_never_panics(seed in any::<u64>(), hw in any::<u32>()) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        let mut b = valid_bytes_cached().to_vec();
        let mut x = seed | 1;
        for byte in b[HEADER_SIZE..].iter_mut() {
            // xorshift: cheap noise over owners, totals and slots.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        b[64..68].copy_from_slice(&hw.to_ne_bytes()); // slot_high_water
        std::fs::write(&p, &b).unwrap();
        let ro = Region::open_read_only(&p).unwrap();
        let snap = ro.snapshot();
        prop_assert!(snap.slots.len() <= 4);
        let json = serde_json::to_string(&snap).unwrap();
        let object = json.starts_with('{') && json.ends_with('}');
        prop_assert!(object, "snapshot is not a JSON object");
        // Garbage counters are read as they are (saturating), never wrapped
        // into a panic or an out-of-bounds slot.
        let _used = ro.device_used(0);
        let _usage = ro.slot(vgpu_region::SlotId(3)).usage(0);
        let rw = Region::open(&p).unwrap();
        prop_assert!(rw.reclaim_dead() <= 4, "reclaimed more slots than exist");
        prop_assert!(rw.live_slots() <= 4, "more live slots than exist");
        let s = vgpu_region::SlotId(2);
        // A grant over garbage counters is given back exactly.
        if rw.reserve(s, 0, vgpu_region::MemKind::Data, 4096).is_ok() {
            let r = rw.release(s, 0, vgpu_region::MemKind::Data, 4096);
            prop_assert_eq!(r.released, 4096, "a granted reserve not given back whole");
        }
        let r = rw.release(s, 0, vgpu_region::MemKind::Module, u64::MAX);
        // u64::MAX is no size a reservation can have had: refused whole.
        prop_assert!(r.rejected && r.released == 0, "release of u64::MAX: {:?}", r);
        prop_assert!(rw.snapshot().slots.len() <= 4);
    }
}
