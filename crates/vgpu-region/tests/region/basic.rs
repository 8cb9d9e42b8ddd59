//! Single-process behaviour of the region API.
use std::time::Duration;
use vgpu_region::*;

fn opts(mem: u64) -> CreateOptions {
    CreateOptions {
        slots: 8,
        devices: vec![DeviceConfig {
            uuid: "GPU-0000".into(),
            mem_limit: mem,
            sm_limit: 50,
        }],
    }
}

#[test]
fn create_register_reserve_release() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let (r, m) = Region::open_or_create(&p, &opts(1000)).unwrap();
    assert!(m.is_empty());
    assert_eq!(r.device_count(), 1);
    assert_eq!(r.device_uuid(0), "GPU-0000");
    assert_eq!(r.limits(0), Limits { mem: 1000, sm: 50 });
    let s = r.register().unwrap();
    r.reserve(s, 0, MemKind::Data, 600).unwrap();
    r.reserve(s, 0, MemKind::Context, 400).unwrap();
    let e = r.reserve(s, 0, MemKind::Data, 1).unwrap_err();
    assert_eq!(
        e,
        AdmissionError::OverLimit {
            limit: 1000,
            in_use: 1000,
            requested: 1
        }
    );
    assert_eq!(r.device_used(0), 1000);
    let rel = r.release(s, 0, MemKind::Data, 700);
    assert_eq!(
        rel,
        Release {
            released: 600,
            clamped: true,
            rejected: false
        }
    );
    assert_eq!(r.device_used(0), 400);
    assert_eq!(
        r.slot(s).usage(0),
        Usage {
            context: 400,
            module: 0,
            data: 0,
            total: 400
        }
    );
    // A second opener with other limits is told, and the recorded ones stay.
    let (r2, m) = Region::open_or_create(&p, &opts(5)).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].field, "memory limit");
    assert_eq!(m[0].recorded, "1000");
    assert_eq!(m[0].requested, "5");
    assert_eq!(r2.limits(0).mem, 1000);
    let mut other = opts(1000);
    other.slots = 99;
    let (_, m) = Region::open_or_create(&p, &other).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].field, m[0].recorded.as_str()), ("slot count", "8"));
    assert!(m[0].to_string().contains("99"), "{}", m[0]);
    // Live limit change seen by the first mapping at its next reservation.
    r2.set_limits(0, Limits { mem: 2000, sm: 0 });
    r.reserve(s, 0, MemKind::Data, 1600).unwrap();
    assert_eq!(r.device_used(0), 2000);
    r.unregister(s);
    assert_eq!(r.live_slots(), 0);
    assert_eq!(r.device_used(0), 0);
}

#[test]
fn fork_child_registers_as_itself() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu-region-worker"))
        .arg("script")
        .arg(&p)
        .arg("create:8:0,register,fork")
        .env_remove(vgpu_region::failpoint::ENV)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("slot=0"), "{text}");
    assert!(
        text.contains("child pid=") && text.contains("slot=1 owner=Some("),
        "{text}"
    );
    assert!(text.contains("child exit=0"), "{text}");
    // Parent and child both exited without unregistering: both reclaimed.
    let r = Region::open(&p).unwrap();
    assert_eq!(r.live_slots(), 2);
    assert_eq!(r.reclaim_dead(), 2);
    assert_eq!(r.live_slots(), 0);
}

#[test]
fn a_dead_process_bytes_are_reclaimed_by_a_refused_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let (r, _) = Region::open_or_create(&p, &opts(1000)).unwrap();
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu-region-worker"))
        .arg("script")
        .arg(&p)
        .arg("open,register,reserve:900,die")
        .env_remove(vgpu_region::failpoint::ENV)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success());
    assert_eq!(r.device_used(0), 900);
    let s = r.register().unwrap();
    // 900 + 500 > 1000, but the 900 belong to a dead process.
    r.reserve(s, 0, MemKind::Data, 500).unwrap();
    assert_eq!(r.device_used(0), 500);
    assert_eq!(r.live_slots(), 1);
}

/// A SIGKILLed process's bytes stay in the admission figure until its slot
/// is reclaimed, but never in a view: `device_used_live` skips dead owners
/// (read-only mappings too), and a rate-limited reclaim frees their slots.
#[test]
fn views_never_count_a_dead_process() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let (r, _) = Region::open_or_create(&p, &opts(1000)).unwrap();
    let mine = r.register().unwrap();
    r.reserve(mine, 0, MemKind::Data, 100).unwrap();
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu-region-worker"))
        .arg("script")
        .arg(&p)
        .arg("open,register,reserve:700,die")
        .env_remove(vgpu_region::failpoint::ENV)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success());
    assert_eq!(
        r.device_used(0),
        800,
        "dead bytes still admitted until reclaim"
    );
    assert_eq!(r.device_used_live(0), 100);
    let ro = Region::open_read_only(&p).unwrap();
    assert_eq!(ro.device_used_live(0), 100);
    assert_eq!(ro.device_used(0), 800);
    assert_eq!(r.live_slots(), 2, "a view does not reclaim");
    // The first rate-limited pass runs, the next one within the bound does not.
    assert_eq!(r.reclaim_dead_at_most_every(Duration::from_secs(3600)), 1);
    assert_eq!(r.device_used(0), 100);
    assert_eq!(r.live_slots(), 1);
    assert_eq!(r.reclaim_dead_at_most_every(Duration::from_secs(3600)), 0);
    assert_eq!(r.reclaim_dead_at_most_every(Duration::ZERO), 0);
}

#[test]
fn read_only_mapping_reads_and_never_writes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let (r, _) = Region::open_or_create(&p, &opts(1000)).unwrap();
    let s = r.register().unwrap();
    r.reserve(s, 0, MemKind::Data, 300).unwrap();
    r.slot(s).set_phase(Phase::SlotClaimed, 42);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&p).unwrap();
    let ro = Region::open_read_only(&p).unwrap();
    assert!(!ro.is_writable());
    assert_eq!(ro.device_used(0), 300);
    assert_eq!(ro.slot(s).usage(0).data, 300);
    assert_eq!(ro.slot(s).phase(Phase::SlotClaimed), 42);
    assert_eq!(ro.snapshot().slots.len(), 1);
    // Every writer refuses or does nothing (a store would fault).
    assert!(matches!(ro.register(), Err(RegionError::ReadOnly)));
    assert!(ro.reserve(s, 0, MemKind::Data, 1).is_err());
    assert_eq!(ro.release(s, 0, MemKind::Data, 300).released, 0);
    assert!(matches!(
        ro.try_set_limits(0, Limits { mem: 1, sm: 0 }),
        Err(RegionError::ReadOnly)
    ));
    ro.set_limits(0, Limits { mem: 1, sm: 0 });
    ro.slot(s).set_phase(Phase::SlotClaimed, 7);
    ro.slot(s).bump_fallback(Fallback::Other);
    ro.unregister(s);
    assert_eq!(ro.reclaim_dead(), 0);
    assert_eq!(std::fs::read(&p).unwrap(), before);
    assert_eq!(r.device_used(0), 300);
}

/// A failed `cuMemAlloc(SIZE_MAX)` on an unlimited region used to wrap the
/// slot's counters (8 GiB in use read as 0, and after a live limit of 10
/// GiB the process held 16). Sizes that cannot be represented are refused
/// both ways; nothing wraps.
#[test]
fn unrepresentable_sizes_are_refused_and_counters_never_wrap() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = Region::open_or_create(&dir.path().join("r"), &opts(0)).unwrap();
    let s = r.register().unwrap();
    r.reserve(s, 0, MemKind::Data, 8 * GIB).unwrap();
    // The interposer's sequence: reserve, the driver fails, release.
    assert_eq!(
        r.reserve(s, 0, MemKind::Data, u64::MAX),
        Err(AdmissionError::Unrepresentable {
            requested: u64::MAX
        })
    );
    let rel = r.release(s, 0, MemKind::Data, u64::MAX);
    assert!(rel.rejected && rel.released == 0, "{rel:?}");
    assert_eq!(r.device_used(0), 8 * GIB);
    assert_eq!(r.slot(s).usage(0).data, 8 * GIB);
    // A live limit then holds.
    r.set_limits(
        0,
        Limits {
            mem: 10 * GIB,
            sm: 0,
        },
    );
    assert!(matches!(
        r.reserve(s, 0, MemKind::Data, 8 * GIB),
        Err(AdmissionError::OverLimit { .. })
    ));
    r.reserve(s, 0, MemKind::Data, 2 * GIB).unwrap();
    assert_eq!(r.device_used(0), 10 * GIB);
    // The largest representable request, again and again on an unlimited
    // region: the slot's total stops short of 2^64 instead of wrapping.
    let (u, _) = Region::open_or_create(&dir.path().join("u"), &opts(0)).unwrap();
    let s = u.register().unwrap();
    assert!(u.reserve(s, 0, MemKind::Data, MAX_RESERVATION + 1).is_err());
    let mut admitted = 0u64;
    while u.reserve(s, 0, MemKind::Module, MAX_RESERVATION).is_ok() {
        admitted += 1;
        assert!(admitted < 1000, "no bound");
    }
    assert_eq!(admitted, u64::MAX / MAX_RESERVATION);
    assert_eq!(u.device_used(0), admitted * MAX_RESERVATION);
    assert_eq!(u.slot(s).usage(0).module, admitted * MAX_RESERVATION);
    // The limited path refuses the same way before any add.
    let (l, _) = Region::open_or_create(&dir.path().join("l"), &opts(u64::MAX)).unwrap();
    let s = l.register().unwrap();
    assert!(matches!(
        l.reserve(s, 0, MemKind::Data, u64::MAX),
        Err(AdmissionError::Unrepresentable { .. })
    ));
    assert_eq!(l.device_used(0), 0);
}

/// A tenant that writes `limit = 0` into the mapped header changes what
/// `reserve` enforces, but not what `reserve_within` (the limit from the
/// operator's file) enforces.
#[test]
fn reserve_within_ignores_the_writable_header() {
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = Region::open_or_create(&dir.path().join("r"), &opts(1000)).unwrap();
    let s = r.register().unwrap();
    r.reserve_within(s, 0, MemKind::Data, 600, 1000).unwrap();
    // The "tenant" lifts the header's limit.
    let (t, _) = Region::open_or_create(&dir.path().join("r"), &CreateOptions::default()).unwrap();
    t.set_limits(0, Limits { mem: 0, sm: 0 });
    assert!(r.reserve_within(s, 0, MemKind::Data, 600, 1000).is_err());
    r.reserve(s, 0, MemKind::Data, 600).unwrap();
    assert_eq!(r.device_used(0), 1200);
    assert!(r.reserve_within(s, 0, MemKind::Data, 1, 1000).is_err());
    r.reserve_within(s, 0, MemKind::Data, 1, 0).unwrap();
}

/// The header's limits are a display copy of the limits file: compared
/// and rewritten by UUID, with limits_generation bumped on every write.
#[test]
fn the_display_copy_follows_the_limits_file() {
    use vgpu_region::limits::Limits as File;
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(1000);
    o.devices.push(DeviceConfig {
        uuid: "GPU-0001".into(),
        mem_limit: 1000,
        sm_limit: 0,
    });
    let (r, _) = Region::open_or_create(&dir.path().join("r"), &o).unwrap();
    assert_eq!(r.device_index("gpu-0001"), Some(1));
    assert_eq!(r.device_index("GPU-none"), None);
    // Device 0 has its own line without sm: the header's 50 % is stale.
    let f = File::parse("vgpu-limits 1\ndevice * memory=1000 sm=50\ndevice GPU-0000 memory=1000\n")
        .unwrap();
    let m = r.display_mismatches(&f);
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(
        (m[0].device, m[0].field, m[0].region, m[0].file),
        (0, "SM limit", 50, 0)
    );
    assert_eq!(
        (m[1].device, m[1].field, m[1].region, m[1].file),
        (1, "SM limit", 0, 50)
    );
    let f = File::parse("vgpu-limits 1\ndevice * memory=4096\n").unwrap();
    let m = r.display_mismatches(&f);
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(
        m[0].to_string().contains("the limits file applies"),
        "{}",
        m[0]
    );
    let g = r.limits_generation();
    let changes = r.write_display_copy(&f).unwrap();
    assert_eq!(changes.len(), 2);
    assert_eq!(r.limits_generation(), g + 1);
    assert!(r.display_mismatches(&f).is_empty());
    assert_eq!(r.limits(0), Limits { mem: 4096, sm: 0 });
    assert_eq!(r.bump_limits_generation().unwrap(), g + 2);
    let ro = Region::open_read_only(&dir.path().join("r")).unwrap();
    assert!(ro.write_display_copy(&f).is_err());
    assert!(ro.bump_limits_generation().is_err());
    // The node agent's bump goes through the file, not a mapping: a mapping
    // sees it; a truncated file is refused (no SIGBUS, nothing written).
    let path = dir.path().join("r");
    assert_eq!(
        Region::bump_limits_generation_in_file(&path).unwrap(),
        g + 3
    );
    assert_eq!(r.limits_generation(), g + 3);
    let len = std::fs::metadata(&path).unwrap().len();
    drop((r, ro));
    for cut in [len / 2, 100, 0] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        assert!(
            Region::bump_limits_generation_in_file(&path).is_err(),
            "cut to {cut}"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            cut,
            "nothing written"
        );
    }
}

/// `open_copy` reads a sparse default-size region's data extents only (a
/// few pages of its ~2 MiB), and its snapshot is the file's; the copy is
/// read-only and detached: later changes to the file do not reach it.
#[test]
fn a_copy_reads_only_data_extents_and_snapshots_like_the_file() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let (r, _) = Region::open_or_create(
        &p,
        &CreateOptions {
            slots: 0,
            devices: opts(1 << 40).devices,
        },
    )
    .unwrap();
    let mut slots = Vec::new();
    for i in 0..8u64 {
        let s = r.register().unwrap();
        r.reserve(s, 0, MemKind::Data, (i + 1) << 20).unwrap();
        r.reserve(s, 0, MemKind::Context, 4096).unwrap();
        r.slot(s).set_host_pid(50_000 + i as u32);
        r.slot(s).set_phase(Phase::SlotClaimed, 1_000 + i);
        slots.push(s);
    }
    // Released slots leave their pages behind: data, but no claimed slot.
    let gone = r.register().unwrap();
    r.reserve(gone, 0, MemKind::Data, 1 << 20).unwrap();
    r.unregister(gone);

    let c = Region::open_copy(&p).unwrap();
    let m = std::fs::metadata(&p).unwrap();
    let copied = c.copied_bytes().unwrap();
    let allocated = m.blocks() * 512;
    eprintln!(
        "file {} bytes, {} allocated, {} copied",
        m.len(),
        allocated,
        copied
    );
    assert_eq!(m.len(), 2_048_000);
    assert!(copied > 0 && copied <= allocated, "{copied} > {allocated}");
    assert!(
        copied <= 64 << 10,
        "copied {copied} bytes of a sparse region"
    );
    assert_eq!(Region::open_read_only(&p).unwrap().copied_bytes(), None);

    let want = serde_json::to_value(r.snapshot()).unwrap();
    assert_eq!(serde_json::to_value(c.snapshot()).unwrap(), want);
    assert_eq!(c.snapshot().slots.len(), 8);
    assert_eq!(c.device_used(0), r.device_used(0));
    assert_eq!(c.path(), p.as_path());

    // Read-only: no writer gets through.
    assert!(!c.is_writable());
    assert!(matches!(c.register(), Err(RegionError::ReadOnly)));
    assert!(c.bucket(0).is_none());
    assert_eq!(c.reclaim_where(|_| true), 0);

    // Detached: the file moves on, the copy does not.
    r.reserve(slots[0], 0, MemKind::Data, 1 << 30).unwrap();
    r.set_limits(0, Limits { mem: 7, sm: 0 });
    assert_eq!(serde_json::to_value(c.snapshot()).unwrap(), want);
    std::fs::remove_file(&p).unwrap();
    assert_eq!(c.snapshot().slots.len(), 8);
}
