//! libvgpu.so on the simulated driver, driven by real processes: the C
//! client compiled against NVIDIA's headers and the dlopen-based tenant.
use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use common::*;

#[test]
fn every_policy_hook_through_every_route_hits_the_ledger() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let limit = 512 * MIB;
    let env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("LIBVGPU_CONTEXT_MEMORY", "8m"),
        ],
    );
    let out = run(&c_program("limits"), &["routes", &limit.to_string()], &env);
    assert_passed(&out);
}

#[test]
fn allocate_to_the_limit_one_byte_more_free_and_again() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "256m"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let out = run(
        &c_program("limits"),
        &["fill", &(256 * MIB).to_string()],
        &env,
    );
    assert_passed(&out);
    // The process exited: its slot and charges are gone.
    let r = vgpu_region::Region::open(&cache).unwrap();
    assert_eq!(r.device_used(0), 0);
    assert_eq!(r.live_slots(), 0);
}

#[test]
fn without_the_interposer_the_same_program_is_not_limited() {
    // The control for the test above: the limit comes from libvgpu.so.
    let s = sim(1);
    let mut env = s.env();
    env.push(("CUDA_DEVICE_MEMORY_LIMIT".into(), "256m".into()));
    let out = run(
        &c_program("limits"),
        &["fill", &(256 * MIB).to_string()],
        &env,
    );
    // It ran to its end (a crash or a kill would fail this too, so the
    // exit status alone proves nothing) and the byte past the limit was
    // granted: no limit without the interposer.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(" failed\n"), "no summary line: {stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("FAIL cuMemAlloc")
            && l.contains("returned CUDA_SUCCESS")
            && l.contains("expected CUDA_ERROR_OUT_OF_MEMORY")),
        "{stdout}"
    );
}

#[test]
fn two_processes_sharing_one_budget_never_exceed_it() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let limit = GIB;
    let chunk = 32 * MIB;
    region_at(&cache, &[limit]);
    let env = env(&s, Some(&cache), &[("LIBVGPU_CONTEXT_MEMORY", "0")]);
    for round in 0..3 {
        let mut kids: Vec<_> = (0..2)
            .map(|_| {
                command(&c_program("limits"), &["grab", &chunk.to_string()], &env)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Release both at once: they race for the last chunks.
        for k in &mut kids {
            k.stdin.as_mut().unwrap().write_all(b"g").unwrap();
        }
        let mut total = 0;
        let mut readers = Vec::new();
        for k in &mut kids {
            let mut lines = BufReader::new(k.stdout.take().unwrap()).lines();
            let got = lines
                .by_ref()
                .map_while(Result::ok)
                .find_map(|l| {
                    l.strip_prefix("grabbed=")
                        .map(|v| v.parse::<u64>().unwrap())
                })
                .expect("grabbed line");
            total += got;
            readers.push(lines);
        }
        let r = vgpu_region::Region::open(&cache).unwrap();
        assert!(total <= limit, "round {round}: {total} > {limit}");
        assert_eq!(
            total, limit,
            "round {round}: the budget is chunk-aligned, so both together fill it exactly"
        );
        assert_eq!(r.device_used(0), limit, "round {round}: the ledger agrees");
        assert_eq!(r.live_slots(), 2);
        for mut k in kids {
            drop(k.stdin.take());
            assert!(k.wait().unwrap().success());
        }
        assert_eq!(
            r.device_used(0),
            0,
            "round {round}: normal exit released both slots"
        );
    }
}

#[test]
fn sigkilled_holder_is_reclaimed() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let r = region_at(&cache, &[256 * MIB]);
    let env = env(&s, Some(&cache), &[("LIBVGPU_CONTEXT_MEMORY", "0")]);
    let mut k = command(
        &c_program("limits"),
        &["grab", &(64 * MIB).to_string()],
        &env,
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    k.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    let line = BufReader::new(k.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("grabbed="))
        .unwrap();
    assert_eq!(line, format!("grabbed={}", 256 * MIB));
    assert_eq!(r.device_used(0), 256 * MIB);
    k.kill().unwrap();
    k.wait().unwrap();
    r.reclaim_dead();
    assert_eq!(r.device_used(0), 0);
    // The budget is whole again for the next process.
    let out = run(
        &c_program("limits"),
        &["fill", &(256 * MIB).to_string()],
        &env,
    );
    assert_passed(&out);
}

#[test]
fn fork_after_init_child_registers_as_itself() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let r = region_at(&cache, &[GIB]);
    let env = env(&s, Some(&cache), &[("LIBVGPU_CONTEXT_MEMORY", "0")]);
    let chunk = 64 * MIB;
    let mut k = command(&c_program("limits"), &["fork", &chunk.to_string()], &env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(k.stdout.take().unwrap()).lines();
    let mut f = std::collections::BTreeMap::new();
    for l in lines.by_ref().map_while(Result::ok) {
        if let Some((a, b)) = l.split_once('=') {
            f.insert(a.to_string(), b.to_string());
        }
        if l.starts_with("child_waiting=") {
            break;
        }
    }
    let parent: u32 = f["parent_pid"].parse().unwrap();
    let child: u32 = f["child_pid"].parse().unwrap();
    let snap = r.snapshot();
    let live: Vec<_> = snap.slots.iter().filter(|s| s.state == "live").collect();
    let ps = live
        .iter()
        .find(|s| s.pid == parent)
        .expect("parent's slot");
    let cs = live
        .iter()
        .find(|s| s.pid == child)
        .expect("the child registered its own slot");
    assert_ne!(ps.index, cs.index);
    assert_eq!(
        ps.devices[0].usage.data,
        2 * chunk,
        "parent's charge stays the parent's"
    );
    assert_eq!(
        cs.devices[0].usage.data, 0,
        "the child starts with its own, empty accounting"
    );
    drop(k.stdin.take());
    let rest: String = lines.map_while(Result::ok).collect::<Vec<_>>().join("\n");
    let st = k.wait().unwrap();
    assert!(st.success(), "{rest}");
    assert!(
        rest.contains("after the child exits the parent's charge is its own"),
        "{rest}"
    );
    // The parent exited normally: its slot was released at exit. The child
    // left with _exit (no atexit, like a crash): reclaim takes its slot.
    let snap = r.snapshot();
    assert!(
        !snap
            .slots
            .iter()
            .any(|s| s.state == "live" && s.pid == parent),
        "parent's slot released at exit"
    );
    r.reclaim_dead();
    assert_eq!(r.live_slots(), 0);
}

#[test]
fn threads_of_one_process_share_the_budget_exactly() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "24m"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    // One thread alone holds ~36 MiB on average (about 8 of its 16 slots,
    // 1-8 MiB each), so refusals are certain even when the scheduler runs
    // the threads one after another.
    let out = run(
        &c_program("limits"),
        &["threads", &(24 * MIB).to_string()],
        &env,
    );
    assert_passed(&out);
}

#[test]
fn an_unusable_region_file_fails_closed_and_the_process_runs() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    std::fs::write(&cache, vec![0x5au8; 8192]).unwrap();
    // The limit is still enforced (on a private ledger): fill passes only
    // if exactly 1 GiB is admitted.
    let out = run(
        &c_program("limits"),
        &["fill", &GIB.to_string()],
        &env(
            &s,
            Some(&cache),
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ],
        ),
    );
    assert_passed(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("FAILING CLOSED"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains(&cache.display().to_string()) && lines[0].contains(" error:"),
        "one loud line naming the file: {stderr}"
    );
    assert!(!stderr.contains("NOT enforced"), "{stderr}");
    // The file is left as it was (nothing is lost or overwritten).
    assert_eq!(std::fs::read(&cache).unwrap(), vec![0x5au8; 8192]);
}

#[test]
fn non_cuda_programs_are_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let mut e = vec![
        ("LD_PRELOAD".to_string(), libvgpu().display().to_string()),
        ("CUDA_DEVICE_MEMORY_LIMIT".to_string(), "1g".to_string()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
            cache.display().to_string(),
        ),
        ("LIBCUDA_LOG_LEVEL".to_string(), "4".to_string()),
    ];
    let out = run(
        std::path::Path::new("sh"),
        &["-c", "echo hello; ls / >/dev/null"],
        &e,
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "not a word from the library"
    );
    assert!(
        !cache.exists(),
        "no region for a process that never used CUDA"
    );
    // Python resolves many symbols through dlsym at start-up.
    e.retain(|(k, _)| k != "LIBCUDA_LOG_LEVEL");
    let out = run(
        std::path::Path::new("python3"),
        &["-c", "import ctypes, json; print(json.dumps([1]))"],
        &e,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[1]\n");
}

#[test]
fn allocations_are_charged_to_the_current_contexts_device() {
    let s = sim(2);
    // Also with the ordinals swapped: the driver's pools are physical
    // devices, the ledger's are CUDA ordinals.
    for visible in [None, Some("1,0")] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("r.cache");
        let mut extra = vec![
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ];
        extra.extend(visible.map(|v| ("CUDA_VISIBLE_DEVICES", v)));
        let env = env(&s, Some(&cache), &extra);
        let out = run(
            &c_program("limits"),
            &["twodev", &(64 * MIB).to_string()],
            &env,
        );
        assert_passed(&out);
    }
}

#[test]
fn pool_memory_released_at_synchronize_leaves_the_shared_budget_there_and_then() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let r = region_at(&cache, &[256 * MIB]);
    let env = env(&s, Some(&cache), &[("LIBVGPU_CONTEXT_MEMORY", "0")]);
    for how in ["stream", "stream_ptsz", "ctx", "event"] {
        let mut a = command(
            &c_program("limits"),
            &["poolsync", &(128 * MIB).to_string(), how],
            &env,
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(a.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        for l in lines.by_ref().map_while(Result::ok) {
            let done = l == "synced=1";
            seen.push(l);
            if done {
                break;
            }
        }
        assert_eq!(
            seen.last().map(String::as_str),
            Some("synced=1"),
            "{how}: {seen:#?}"
        );
        // The holder is alive and synchronized: its pool's memory is back,
        // in the ledger too, without it asking for a view.
        assert_eq!(
            r.device_used(0),
            0,
            "{how}: charge left after the synchronize"
        );
        let v = facts(&run(&c_program("limits"), &["view"], &env));
        assert_eq!(
            num(&v, "cuda.0.info_free"),
            256 * MIB,
            "{how}: a neighbour sees the whole budget"
        );
        drop(a.stdin.take());
        seen.extend(lines.map_while(Result::ok));
        assert!(a.wait().unwrap().success(), "{how}: {seen:#?}");
        let passed = seen.iter().filter(|l| l.starts_with("PASS")).count();
        assert!(
            passed > 0
                && seen
                    .iter()
                    .any(|l| *l == format!("limits: {passed} passed, 0 failed")),
            "{how}: {seen:#?}"
        );
    }
}

#[test]
fn two_processes_growing_own_pools_never_exceed_the_shared_budget() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let limit = 256 * MIB;
    // 3 MiB: each allocation takes 4 MiB of pool (the sim rounds to 2 MiB),
    // more than reserved − used promises, so admission settles after the
    // driver's answer, racing the other process.
    let chunk = 3 * MIB;
    let r = region_at(&cache, &[limit]);
    let env = env(&s, Some(&cache), &[("LIBVGPU_CONTEXT_MEMORY", "0")]);
    let sim_state = s.state().unwrap();
    for round in 0..3 {
        let mut kids: Vec<_> = (0..2)
            .map(|_| {
                command(
                    &c_program("limits"),
                    &["grab", &chunk.to_string(), "pool"],
                    &env,
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        for k in &mut kids {
            k.stdin.as_mut().unwrap().write_all(b"g").unwrap();
        }
        let (mut grabbed, mut reserved) = (0, 0);
        let mut readers = Vec::new();
        for k in &mut kids {
            let mut lines = BufReader::new(k.stdout.take().unwrap()).lines();
            for l in lines.by_ref().map_while(Result::ok) {
                if let Some(v) = l.strip_prefix("reserved=") {
                    reserved += v.parse::<u64>().unwrap();
                }
                if let Some(v) = l.strip_prefix("grabbed=") {
                    grabbed += v.parse::<u64>().unwrap();
                    break;
                }
            }
            readers.push(lines);
        }
        let used = r.device_used(0);
        assert!(used <= limit, "round {round}: ledger {used} > {limit}");
        assert!(
            reserved <= limit,
            "round {round}: pools hold {reserved} > {limit}"
        );
        assert_eq!(
            sim_state.used_bytes(0),
            reserved,
            "round {round}: the driver holds what the pools report"
        );
        assert_eq!(
            used, reserved,
            "round {round}: the ledger is the pools' memory"
        );
        // Each 3 MiB takes 4 MiB: together they fill the budget but for at
        // most one allocation's worth per process.
        assert!(
            reserved > limit - 2 * 4 * MIB && grabbed == reserved / 4 * 3,
            "round {round}: grabbed {grabbed}, reserved {reserved}"
        );
        for mut k in kids {
            drop(k.stdin.take());
            assert!(k.wait().unwrap().success());
        }
        assert_eq!(r.device_used(0), 0, "round {round}: exits released both");
    }
}
