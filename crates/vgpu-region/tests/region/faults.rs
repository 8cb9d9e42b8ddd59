//! Every fail point: a worker is SIGKILLed there ≥ 50 times (half by its own
//! SIGKILL, half stopped there first and killed by us). While it is stopped
//! mid-step, newcomers still open, register, reserve and release (nothing
//! waits on it); after it dies, one reclaim pass leaves the ledger exact:
//! only the survivor's slot and bytes remain. The copying reader's step
//! (`copy.after_extent`) writes nothing: killed there once each way, it
//! leaves the file byte for byte as it was.
use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region, RegionError, Usage};

const KILLS: usize = 50;
const SURVIVOR_BYTES: u64 = 100 << 20;

fn opts() -> CreateOptions {
    CreateOptions {
        slots: 32,
        devices: vec![DeviceConfig {
            uuid: "GPU-faults".into(),
            mem_limit: 1 << 30,
            sm_limit: 0,
        }],
    }
}

fn run_worker(path: &Path, ops: &str, fail: Option<(&str, &str)>) -> std::process::Child {
    let mut c = worker();
    c.arg("script").arg(path).arg(ops);
    if let Some((step, action)) = fail {
        c.env(vgpu_region::failpoint::ENV, format!("{step}:{action}"));
    }
    c.stdout(std::process::Stdio::null());
    c.spawn().expect("spawn worker")
}

fn assert_killed(c: &mut std::process::Child) {
    let st = c.wait().unwrap();
    assert_eq!(
        st.signal(),
        Some(9),
        "worker was not killed at its fail point: {st:?}"
    );
}

/// A newcomer's full round trip on its own mapping; must not wait on anyone.
fn newcomer(path: &Path) {
    let r = Region::open(path).unwrap();
    let s = r.register().unwrap();
    r.reserve(s, 0, MemKind::Data, 12345).unwrap();
    let rel = r.release(s, 0, MemKind::Data, 12345);
    assert_eq!(rel.released, 12345);
    r.unregister(s);
}

/// Kills a worker at `step` KILLS times; `ops` is its script, `victim`
/// (if any) a script run to death first to leave a slot to reclaim, and
/// `reclaims` how many slots the survivor must reclaim after each kill.
fn fault(step: &str, ops: &str, victim: Option<&str>, reclaims: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (r, _) = Region::open_or_create(&path, &opts()).unwrap();
    let me = r.register().unwrap();
    r.reserve(me, 0, MemKind::Context, SURVIVOR_BYTES).unwrap();
    let mut kills = 0;
    for i in 0..KILLS {
        if let Some(v) = victim {
            let mut c = run_worker(&path, v, None);
            assert_killed(&mut c);
        }
        let stop = i % 2 == 1;
        let mut c = run_worker(&path, ops, Some((step, if stop { "stop" } else { "die" })));
        if stop {
            assert!(
                wait_stopped(&mut c),
                "{step}: worker exited instead of stopping"
            );
            // Stopped, not dead: its slot must not be taken from it...
            assert_eq!(
                r.reclaim_dead(),
                0,
                "{step}: reclaimed a live (stopped) owner"
            );
            // ...and nobody waits for it.
            newcomer(&path);
            sigkill(&c);
        }
        assert_killed(&mut c);
        kills += 1;
        assert_eq!(r.reclaim_dead(), reclaims, "{step}: iteration {i}");
        assert_eq!(r.live_slots(), 1, "{step}: iteration {i}");
        assert_eq!(r.device_used(0), SURVIVOR_BYTES, "{step}: iteration {i}");
        assert_eq!(
            r.slot(me).usage(0),
            Usage {
                context: SURVIVOR_BYTES,
                module: 0,
                data: 0,
                total: SURVIVOR_BYTES
            }
        );
    }
    assert!(kills >= KILLS);
    // The region still works for everyone.
    newcomer(&path);
    assert_eq!(r.device_used(0), SURVIVOR_BYTES);
}

const VICTIM: &str = "open,register,reserve:4096,die";

#[test]
fn kill_before_claim() {
    fault("register.before_claim", "open,register", None, 0);
}

#[test]
fn kill_after_claim_before_owner_details() {
    fault("register.after_claim", "open,register", None, 1);
}

#[test]
fn kill_before_add() {
    fault("reserve.before_add", "open,register,reserve:4096", None, 1);
}

#[test]
fn every_step_has_a_fault_test() {
    let me = include_str!("faults.rs");
    for step in vgpu_region::failpoint::STEPS {
        assert!(
            me.contains(&format!("\"{step}\"")),
            "no fault test for {step}"
        );
    }
}

#[test]
fn kill_between_add_and_admission_check() {
    fault("reserve.after_add", "open,register,reserve:4096", None, 1);
}

#[test]
fn kill_between_admission_and_kind_counter() {
    fault("reserve.before_kind", "open,register,reserve:4096", None, 1);
}

#[test]
fn kill_mid_release() {
    fault(
        "release.before_total",
        "open,register,reserve:4096,release:4096",
        None,
        1,
    );
}

#[test]
fn kill_mid_unregister() {
    fault(
        "unregister.after_mark",
        "open,register,reserve:4096,unregister",
        None,
        1,
    );
}

#[test]
fn kill_reclaimer_after_mark() {
    fault("reclaim.after_mark", "open,reclaim", Some(VICTIM), 1);
}

#[test]
fn kill_reclaimer_mid_clear() {
    fault("reclaim.mid_clear", "open,reclaim", Some(VICTIM), 1);
}

#[test]
fn kill_reclaimer_before_free() {
    fault("reclaim.before_free", "open,reclaim", Some(VICTIM), 1);
}

/// Files in `dir` other than `keep` (a dead creator's leftovers).
fn strays(dir: &Path, keep: &[&Path]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !keep.contains(&p.as_path()))
        .map(|p| p.display().to_string())
        .collect()
}

#[test]
fn kill_creator_mid_init() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..KILLS {
        let path = dir.path().join(format!("region{i}"));
        let stop = i % 2 == 1;
        let mut c = run_worker(
            &path,
            "create:16:1000000",
            Some(("create.mid_init", if stop { "stop" } else { "die" })),
        );
        if stop {
            assert!(wait_stopped(&mut c));
            // The creator builds its file unnamed and links it only when
            // ready: nothing is at `path` yet, and another process neither
            // waits for the stopped creator nor sees its half file; it
            // creates and publishes its own region at once.
            assert!(!path.exists(), "a half-built region was published");
            assert!(matches!(
                Region::open(&path),
                Err(RegionError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound
            ));
            let (r, m) =
                Region::open_or_create_with(&path, &opts(), Duration::from_millis(50)).unwrap();
            assert!(m.is_empty(), "{m:?}");
            assert_eq!(r.slot_count(), 32);
            sigkill(&c);
            assert_killed(&mut c);
            // Still the region we published, ready and usable.
            newcomer(&path);
            assert_eq!(r.live_slots(), 0);
        } else {
            assert_killed(&mut c);
            // The dead creator left nothing at `path` (and, with O_TMPFILE,
            // nothing anywhere): `open` finds no file, `open_or_create`
            // creates without waiting.
            assert!(!path.exists(), "a dead creator's half file was published");
            let (r, m) = Region::open_or_create(&path, &opts()).unwrap();
            assert!(m.is_empty(), "{m:?}");
            assert_eq!(r.limits(0).mem, 1 << 30);
            assert_eq!(r.slot_count(), 32);
            newcomer(&path);
            assert_eq!(r.live_slots(), 0);
        }
    }
    let keep: Vec<_> = (0..KILLS)
        .map(|i| dir.path().join(format!("region{i}")))
        .collect();
    let keep: Vec<&Path> = keep.iter().map(|p| p.as_path()).collect();
    assert_eq!(strays(dir.path(), &keep), Vec::<String>::new());
}

/// Where the filesystem lacks `O_TMPFILE` the creator builds a dot-named
/// temporary and links it: a finished creation leaves only the region, a
/// creator killed mid-init leaves nothing at the path (its temporary stays,
/// named after it) and the next creator does not wait for it.
#[test]
fn named_temporary_fallback_publishes_whole_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let mut c = worker();
    c.arg("script").arg(&path).arg("create:16:1000000,register");
    c.env(vgpu_region::NO_TMPFILE_ENV, "1");
    c.stdout(std::process::Stdio::null());
    assert!(c.status().unwrap().success());
    assert_eq!(strays(dir.path(), &[path.as_path()]), Vec::<String>::new());
    let r = Region::open(&path).unwrap();
    assert_eq!(r.slot_count(), 16);
    assert_eq!(r.limits(0).mem, 1_000_000);

    let path2 = dir.path().join("region2");
    let mut c = worker();
    c.arg("script").arg(&path2).arg("create:16:1000000");
    c.env(vgpu_region::NO_TMPFILE_ENV, "1");
    c.env(vgpu_region::failpoint::ENV, "create.mid_init:die");
    c.stdout(std::process::Stdio::null());
    let mut k = c.spawn().unwrap();
    assert_killed(&mut k);
    assert!(!path2.exists(), "a half-built region was published");
    let left = strays(dir.path(), &[path.as_path()]);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0].contains(".region2.") && left[0].ends_with(".tmp"),
        "{left:?}"
    );
    let (r2, m) = Region::open_or_create_with(&path2, &opts(), Duration::from_millis(50)).unwrap();
    assert!(m.is_empty(), "{m:?}");
    assert_eq!(r2.slot_count(), 32);
    newcomer(&path2);
}

/// A file of the previous protocol (initialized in place under a flock)
/// whose creator died half-way is still repaired by the next creator and
/// refused by plain openers; a stopped in-place creator bounds the wait.
#[test]
fn unfinished_in_place_file_is_repaired_under_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legacy");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    // Hold the creation lock as a stopped in-place creator would (flock
    // belongs to the open file description, so our own second open
    // conflicts with it like another process would).
    let f = std::fs::File::open(&path).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    match Region::open_or_create_with(&path, &opts(), Duration::from_millis(50)) {
        Err(RegionError::LockTimeout { .. }) => {}
        Err(e) => panic!("expected a lock timeout, got {e}"),
        Ok(_) => panic!("opened a file whose creator holds its lock"),
    }
    // Its creator dies: the kernel drops the lock.
    drop(f);
    match Region::open(&path) {
        Err(RegionError::Format {
            source: vgpu_region::FormatError::NotInitialized { .. },
            ..
        }) => {}
        Err(e) => panic!("expected NotInitialized, got {e}"),
        Ok(_) => panic!("open accepted an unfinished file"),
    }
    let (r, m) = Region::open_or_create(&path, &opts()).unwrap();
    assert!(m.is_empty(), "{m:?}");
    assert_eq!(r.slot_count(), 32);
    newcomer(&path);
}

/// A reader of a copy (`Region::open_copy`, the node agent) killed in the
/// middle of its copy, at "copy.after_extent": it never wrote the file,
/// which is byte for byte what it was and opens as before; stopped there
/// instead, nobody waits on it.
#[test]
fn kill_reader_mid_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (r, _) = Region::open_or_create(&path, &opts()).unwrap();
    let s = r.register().unwrap();
    r.reserve(s, 0, MemKind::Data, SURVIVOR_BYTES).unwrap();
    for action in ["die", "stop"] {
        let before = std::fs::read(&path).unwrap();
        let mut c = worker();
        c.args(["hammer", path.to_str().unwrap(), "copy", "1"])
            .env(
                vgpu_region::failpoint::ENV,
                format!("copy.after_extent:{action}"),
            )
            .stdout(std::process::Stdio::null());
        let mut c = c.spawn().unwrap();
        if action == "stop" {
            assert!(wait_stopped(&mut c));
            assert!(std::fs::read(&path).unwrap() == before, "written");
            newcomer(&path);
            sigkill(&c);
        }
        assert_killed(&mut c);
        if action == "die" {
            assert!(std::fs::read(&path).unwrap() == before, "written");
        }
        let copy = Region::open_copy(&path).unwrap();
        assert_eq!(copy.device_used(0), SURVIVOR_BYTES);
    }
}
