//! Processes × threads race for the last bytes of a small limit.
use crate::common;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use common::*;
use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region};

#[test]
fn racing_for_the_last_bytes_never_overcommits_and_never_starves() {
    const PROCS: u32 = 4;
    const THREADS: u32 = 3;
    const ROUNDS: usize = 2000;
    const CHUNK: u64 = 1 << 20;
    const BASE: u64 = 64 << 20;
    // Room for 1.5 chunks above what the test itself holds: exactly one of
    // the 12 racers may win each round, and one must.
    let limit = BASE + CHUNK + CHUNK / 2;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (r, _) = Region::open_or_create(
        &path,
        &CreateOptions {
            slots: 64,
            devices: vec![DeviceConfig {
                uuid: "GPU-race".into(),
                mem_limit: limit,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    let me = r.register().unwrap();
    r.reserve(me, 0, MemKind::Data, BASE).unwrap();
    let bar = dir.path().join("barrier");
    std::fs::write(&bar, vec![0u8; 4 * (3 + ROUNDS)]).unwrap();
    let parties = PROCS * THREADS;
    let kids: Vec<_> = (0..PROCS)
        .map(|p| {
            let mut c = worker();
            if p % 2 == 0 {
                // Yield inside the admission window so racers interleave
                // there even on 2 cores.
                c.env(
                    vgpu_region::failpoint::ENV,
                    "reserve.before_add:yield,reserve.after_add:yield",
                );
            }
            c.arg("race").arg(&path).arg(&bar).args([
                THREADS.to_string(),
                ROUNDS.to_string(),
                CHUNK.to_string(),
                parties.to_string(),
            ]);
            spawn(c)
        })
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success(), "race worker failed: {:?}", out.status);
    }
    let cells = std::fs::read(&bar).unwrap();
    let cell = |i: usize| {
        let b = &cells[4 * i..4 * i + 4];
        AtomicU32::new(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).load(SeqCst)
    };
    assert_eq!(cell(2), 0, "a winner saw admitted bytes over the limit");
    let wins: Vec<u32> = (0..ROUNDS).map(|i| cell(3 + i)).collect();
    for (round, w) in wins.iter().enumerate() {
        assert!(*w >= 1, "round {round}: nobody was admitted ({wins:?})");
        assert!(*w <= 1, "round {round}: {w} admitted, room for 1");
    }
    assert_eq!(r.device_used(0), BASE);
    assert_eq!(r.live_slots(), 1);
}
