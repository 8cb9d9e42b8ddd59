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
            clamped: true
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
