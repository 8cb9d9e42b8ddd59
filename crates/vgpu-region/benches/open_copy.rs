//! What reading a region through a private copy costs a reader (the node
//! agent's scan, `vgpu inspect`): `Region::open_copy` + `snapshot()` side by
//! side with `Region::open_read_only` + `snapshot()` (a mapping of the file,
//! which a tenant's `ftruncate` can SIGBUS), on a default region (1024
//! slots, ~2 MiB sparse) with 8 claimed slots, then with every slot claimed
//! (its largest copy). Median and p90 of VGPU_BENCH_REPS opens (default
//! 200), interleaved. Prints numbers; asserts nothing about time.
//!
//! `cargo bench -p vgpu-region --bench open_copy`
use std::path::Path;
use std::time::Instant;

use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region};

fn region(path: &Path, live: u32) -> Region {
    let (r, _) = Region::open_or_create(
        path,
        &CreateOptions {
            slots: 0,
            devices: vec![DeviceConfig {
                uuid: "GPU-bench".into(),
                mem_limit: 0,
                sm_limit: 0,
            }],
        },
    )
    .unwrap();
    for i in 0..live {
        let s = r.register().unwrap();
        r.reserve(s, 0, MemKind::Data, (u64::from(i) + 1) << 20)
            .unwrap();
    }
    r
}

fn pct(v: &mut [u64], p: usize) -> f64 {
    v.sort_unstable();
    v[(v.len() - 1) * p / 100] as f64 / 1000.0
}

fn main() {
    let reps: usize = std::env::var("VGPU_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    println!("| live slots | reader | median µs | p90 µs | bytes copied |");
    println!("| --- | --- | --- | --- | --- |");
    for live in [8, 1024] {
        let p = dir.path().join(format!("region-{live}"));
        let _r = region(&p, live);
        let mut copy = Vec::with_capacity(reps);
        let mut map = Vec::with_capacity(reps);
        let mut copied = 0;
        for _ in 0..reps {
            let t = Instant::now();
            let r = Region::open_copy(&p).unwrap();
            let s = r.snapshot();
            copy.push(t.elapsed().as_nanos() as u64);
            assert_eq!(s.slots.len(), live as usize);
            copied = r.copied_bytes().unwrap();
            let t = Instant::now();
            let s = Region::open_read_only(&p).unwrap().snapshot();
            map.push(t.elapsed().as_nanos() as u64);
            assert_eq!(s.slots.len(), live as usize);
        }
        println!(
            "| {live} | open_copy + snapshot | {:.1} | {:.1} | {copied} |",
            pct(&mut copy, 50),
            pct(&mut copy, 90)
        );
        println!(
            "| {live} | open_read_only + snapshot | {:.1} | {:.1} | – |",
            pct(&mut map, 50),
            pct(&mut map, 90)
        );
    }
}
