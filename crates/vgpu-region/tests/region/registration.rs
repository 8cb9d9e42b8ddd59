//! 256 fork+exec workers released together register without a global lock.
use crate::common;

use std::collections::HashSet;
use std::io::BufReader;
use std::os::unix::process::ExitStatusExt;

use common::*;
use vgpu_region::{CreateOptions, DeviceConfig, Region};

#[test]
fn burst_of_256_registers_exactly_and_reclaims_to_zero() {
    const N: usize = 256;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (r, _) = Region::open_or_create(
        &path,
        &CreateOptions {
            slots: 1024,
            devices: vec![DeviceConfig {
                uuid: "GPU-burst".into(),
                mem_limit: 0,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    let mut gate = Gate::closed(&dir.path().join("gate"));
    let mut hold = Gate::closed(&dir.path().join("hold"));
    let mut kids = Vec::new();
    for _ in 0..N {
        let mut c = worker();
        c.args(["burst", path.to_str().unwrap()])
            .arg(&gate.path)
            .arg(&hold.path)
            .arg("cas");
        let mut k = spawn(c);
        let out = BufReader::new(k.stdout.take().unwrap());
        kids.push((k, out));
    }
    // Everyone has mapped the region and waits at the gate.
    for (_, out) in kids.iter_mut() {
        assert_eq!(read_line(out), "ready");
    }
    gate.open();
    let mut pids = HashSet::new();
    let mut slots = HashSet::new();
    for (k, out) in kids.iter_mut() {
        let line = read_line(out);
        let field = |name: &str| -> u32 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                .parse()
                .unwrap()
        };
        assert_eq!(field("pid="), k.id());
        assert!(pids.insert(field("pid=")));
        assert!(
            slots.insert(field("slot=")),
            "slot handed out twice: {line}"
        );
    }
    // All alive and holding: exactly N live slots, one per PID.
    let snap = r.snapshot();
    assert_eq!(snap.slots.len(), N);
    let snap_pids: HashSet<u32> = snap.slots.iter().map(|s| s.pid).collect();
    assert_eq!(snap_pids, pids);
    let snap_slots: HashSet<u32> = snap.slots.iter().map(|s| s.index).collect();
    assert_eq!(snap_slots, slots);
    assert_eq!(r.device_used(0), N as u64 * 4096);
    hold.open();
    for (mut k, _) in kids {
        let st = k.wait().unwrap();
        assert!(st.success(), "worker failed: {st:?} {:?}", st.signal());
    }
    // They exited without unregistering: reclaim finds every one dead.
    assert_eq!(r.reclaim_dead(), N);
    assert_eq!(r.live_slots(), 0);
    assert_eq!(r.device_used(0), 0);
    assert_eq!(r.reclaim_dead(), 0);
}

#[test]
fn concurrent_creators_initialize_exactly_once() {
    const N: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    for round in 0..15 {
        let path = dir.path().join(format!("region{round}"));
        let mut gate = Gate::closed(&dir.path().join(format!("gate{round}")));
        let ops = format!("gate:{},create:64:5000,register", gate.path.display());
        let kids: Vec<_> = (0..N)
            .map(|_| {
                let mut c = worker();
                c.arg("script").arg(&path).arg(&ops);
                spawn(c)
            })
            .collect();
        gate.open();
        let mut pids = HashSet::new();
        for k in kids {
            pids.insert(k.id());
            let out = k.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {:?}", out);
        }
        // A second initialization would have wiped earlier claims.
        let r = Region::open(&path).unwrap();
        let snap = r.snapshot();
        assert_eq!(snap.slots.len(), N, "round {round}");
        assert!(pids.contains(&snap.header.creator_pid), "round {round}");
        assert_eq!(snap.header.slot_count, 64);
        assert_eq!(r.limits(0).mem, 5000);
        assert_eq!(r.reclaim_dead(), N);
    }
}

/// PID reuse: a slot whose recorded start time differs from that of the
/// live process now holding its PID belongs to an earlier, dead process.
#[test]
fn a_reused_pid_does_not_keep_a_dead_slot_alive() {
    use std::io::BufRead;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (r, _) = Region::open_or_create(&path, &CreateOptions::default()).unwrap();
    let mut hold = Gate::closed(&dir.path().join("hold"));
    let mut c = worker();
    c.arg("script")
        .arg(&path)
        .arg(format!("open,register,gate:{}", hold.path.display()));
    let mut k = spawn(c);
    let mut out = BufReader::new(k.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let slot: u64 = line.trim().strip_prefix("slot=").unwrap().parse().unwrap();
    // Alive and genuine: kept.
    assert_eq!(r.reclaim_dead(), 0);
    // Rewrite the owner word as if an earlier process with the same PID
    // (another start time) had claimed it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let off = vgpu_region::layout::HEADER_SIZE as u64 + 8 * slot;
    let mut w = [0u8; 8];
    f.read_exact_at(&mut w, off).unwrap();
    let word = u64::from_ne_bytes(w);
    let (state, owner) = vgpu_region::core::decode(word);
    assert_eq!(owner.pid, k.id());
    let forged = vgpu_region::core::encode(
        state,
        vgpu_region::core::Owner {
            start34: owner.start34 ^ 1,
            ..owner
        },
    );
    f.write_all_at(&forged.to_ne_bytes(), off).unwrap();
    assert_eq!(
        r.reclaim_dead(),
        1,
        "a slot of a reused PID must be reclaimed"
    );
    assert_eq!(r.live_slots(), 0);
    hold.open();
    assert!(k.wait().unwrap().success());
}
