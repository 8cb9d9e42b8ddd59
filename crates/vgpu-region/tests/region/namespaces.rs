//! A process never judges slots of a PID namespace it cannot see: a worker
//! in its own PID namespace (`unshare --pid --fork --mount-proc`) does not
//! reclaim the host's slot (whose PID it cannot see), and the host does not
//! reclaim the worker's (whose PID means another process here).
use crate::common;

use std::process::Command;

use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region};

#[test]
fn reclaim_stays_within_its_pid_namespace() {
    if Command::new("unshare").arg("--version").output().is_err() {
        common::skip("unshare(1) not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (r, _) = Region::open_or_create(
        &path,
        &CreateOptions {
            slots: 8,
            devices: vec![DeviceConfig {
                uuid: "GPU-ns".into(),
                mem_limit: 0,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    let me = r.register().unwrap();
    r.reserve(me, 0, MemKind::Data, 777).unwrap();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(common::WORKER)
        .arg("script")
        .arg(&path)
        .arg("open,register,reserve:1000,reclaim")
        .env_remove(vgpu_region::failpoint::ENV)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "worker in a new PID namespace failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Inside, our PID does not exist; the worker still left our slot alone.
    assert!(text.contains("reclaimed=0"), "{text}");
    let snap = r.snapshot();
    assert_eq!(snap.slots.len(), 2);
    let mine = snap.slots.iter().find(|s| s.index == me.0).unwrap();
    let theirs = snap.slots.iter().find(|s| s.index != me.0).unwrap();
    assert_ne!(mine.pid_ns, theirs.pid_ns);
    assert_eq!(theirs.pid, 1, "the worker is PID 1 of its namespace");
    // Here, PID 1 is alive (init) with another start time: judging that
    // slot would wrongly call its owner dead. We must not touch it.
    assert_eq!(r.reclaim_dead(), 0);
    assert_eq!(r.live_slots(), 2);
    assert_eq!(r.device_used(0), 1777);
    // An agent that can see every namespace (here: we know the worker's
    // namespace is gone) reclaims it explicitly.
    let gone = theirs.pid_ns;
    let n = r.reclaim_where(|o| {
        assert!(!o.reclaiming);
        o.pid_ns == gone && o.pid == 1
    });
    assert_eq!(n, 1);
    assert_eq!(r.live_slots(), 1);
    assert_eq!(r.device_used(0), 777);
    // Our own slot is never offered as dead, whatever the judge says.
    assert_eq!(r.reclaim_where(|_| true), 0);
    assert_eq!(r.live_slots(), 1);
}
