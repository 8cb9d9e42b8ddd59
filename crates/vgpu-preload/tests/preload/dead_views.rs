//! A SIGKILLed process's bytes must vanish from every other process's
//! memory view (cuMemGetInfo, NVML), even before anything reclaims its slot:
//! no phantom "used" bytes.
use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::*;

const MIB: u64 = 1 << 20;

fn used(f: &std::collections::BTreeMap<String, String>, who: &str) -> u64 {
    num(f, &format!("{who}.before.total")) - num(f, &format!("{who}.before.free"))
}

#[test]
fn a_killed_process_leaves_no_phantom_bytes_in_views() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("LIBVGPU_CONTEXT_MEMORY", "64m"),
        ],
    );
    // A holds 300 MiB (plus its context estimate) until it is killed.
    let mut a = command(
        &tenant(),
        &[
            "run", "--name", "a", "--target", "300m", "--chunk", "100m", "--hold",
        ],
        &e,
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(a.stdout.take().unwrap()).lines();
    let mut a_facts = std::collections::BTreeMap::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if let Some((k, v)) = l.split_once('=') {
            a_facts.insert(k.to_string(), v.to_string());
        }
        if l == "a.holding=1" {
            break;
        }
    }
    assert_eq!(num(&a_facts, "a.allocated"), 300 * MIB, "{a_facts:?}");
    let a_bytes = 300 * MIB + 64 * MIB;

    // While A lives, a newcomer sees A's bytes beside its own context.
    let b = facts(&run(
        &tenant(),
        &["run", "--name", "b", "--target", "0"],
        &e,
    ));
    assert_eq!(used(&b, "b"), a_bytes + 64 * MIB, "{b:?}");
    assert_eq!(num(&b, "b.nvml.used"), a_bytes + 64 * MIB, "{b:?}");

    // SIGKILL: A cannot release anything; its slot stays claimed.
    a.kill().unwrap(); // SIGKILL on Unix
    let st = a.wait().unwrap();
    assert!(!st.success());
    let region = vgpu_region::Region::open_read_only(&cache).unwrap();
    assert_eq!(
        region.device_used(0),
        a_bytes,
        "A's slot is not reclaimed yet"
    );

    // An NVML-only process (read-only mapping, cannot reclaim) skips it.
    let d = run(&c_program("limits"), &["nvml"], &e);
    let d = facts(&d);
    assert_eq!(num(&d, "nvml.0.used"), 0, "{d:?}");
    assert_eq!(
        region.device_used(0),
        a_bytes,
        "a read-only view wrote nothing"
    );

    // A CUDA process reclaims the dead slot before its view: it sees only
    // its own context, in cuMemGetInfo and in NVML alike.
    let c = facts(&run(
        &tenant(),
        &["run", "--name", "c", "--target", "0"],
        &e,
    ));
    assert_eq!(used(&c, "c"), 64 * MIB, "{c:?}");
    assert_eq!(num(&c, "c.nvml.used"), 64 * MIB, "{c:?}");
    assert_eq!(num(&c, "c.after.total") - num(&c, "c.after.free"), 64 * MIB);
    // C exited normally: nothing is left, A's slot included.
    assert_eq!(region.device_used(0), 0);
    assert_eq!(region.live_slots(), 0);
}
