//! Fork and the library's process mechanics, with real processes: a fork
//! while another thread is inside an NVML hook, and the one owned thread
//! (started lazily, restarted in a forked child, stopped at exit).
use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_fork_while_another_thread_is_inside_an_nvml_hook_leaves_the_child_working() {
    let s = sim(2);
    // The thread stays 1.5 s inside nvmlDeviceGetCount_v2 (the library's
    // own NVML query while it builds the CUDA_VISIBLE_DEVICES map); the fork
    // comes 300 ms in.
    let env = env(
        &s,
        None,
        &[
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("LIBVGPU_FAILPOINT_NVML_STALL_MS", "1500"),
        ],
    );
    let start = Instant::now();
    let out = run(&c_program("fork_nvml"), &["300"], &env);
    let f = facts(&out);
    let why = format!(
        "{f:?}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{why}");
    assert!(
        !f.contains_key("child_hung"),
        "the child's first NVML call hung: {why}"
    );
    assert_eq!(f.get("child_exit").map(String::as_str), Some("0"), "{why}");
    assert_eq!(f.get("child_rc").map(String::as_str), Some("0"), "{why}");
    // The child's own view is the mapped one (one visible device of two).
    assert_eq!(num(&f, "child_count"), 1, "{why}");
    // The parent's thread finished too, with the same view.
    assert_eq!(f.get("thread_rc").map(String::as_str), Some("0"), "{why}");
    assert_eq!(num(&f, "thread_count"), 1, "{why}");
    // The child did its own (stalled) query, it did not wait for the
    // parent's thread forever: well under the parent's 20 s bound.
    assert!(num(&f, "child_ms") < 15_000, "{why}");
    assert!(start.elapsed() < Duration::from_secs(20), "{why}");
}

/// `<event> <pid>` lines the owned thread's test job wrote.
fn heartbeat(path: &std::path::Path) -> BTreeMap<u32, Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut by_pid: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for l in text.lines() {
        if let Some((what, pid)) = l.split_once(' ') {
            if let Ok(pid) = pid.trim().parse() {
                by_pid.entry(pid).or_default().push(what.to_string());
            }
        }
    }
    by_pid
}

/// The owned thread of a process, seen from /proc.
fn owned_threads(pid: u32) -> usize {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "vgpu-owned")
        })
        .count()
}

#[test]
fn the_owned_thread_starts_on_first_need_restarts_in_a_forked_child_and_stops_at_exit() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let beats = dir.path().join("beats");
    let cache = dir.path().join("r.cache");
    let env = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_FAILPOINT_OWNED_THREAD", beats.to_str().unwrap()),
            // The parent only calls cuInit: attach there (by default the
            // first call that needs the region attaches).
            ("LIBVGPU_ATTACH", "eager"),
        ],
    );
    // A process that loads the library but never calls CUDA: no thread.
    let out = run(std::path::Path::new("/bin/sh"), &["-c", "true"], &env);
    assert!(out.status.success());
    assert!(heartbeat(&beats).is_empty(), "nothing needed the thread");

    // cuInit (attach: the test job asks for the thread), then fork; the
    // child's first CUDA call attaches again and restarts the thread there.
    let child = command(&c_program("fork_hold"), &["600"], &env)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let parent = child.id();
    // While both hold: each has exactly one owned thread of its own.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = (0, 0);
    let mut kid = None;
    while Instant::now() < deadline {
        let h = heartbeat(&beats);
        kid = h.keys().copied().find(|&p| p != parent);
        if let Some(k) = kid {
            seen = (owned_threads(parent), owned_threads(k));
            if seen == (1, 1) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        seen,
        (1, 1),
        "parent {parent} and child {kid:?} each run one owned thread"
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let kid = kid.unwrap();
    let h = heartbeat(&beats);
    for pid in [parent, kid] {
        let ev = &h[&pid];
        assert_eq!(
            ev.first().map(String::as_str),
            Some("started"),
            "{pid}: {ev:?}"
        );
        assert!(ev.iter().any(|e| e == "tick"), "{pid}: {ev:?}");
        // Stopped cleanly at exit: the job's last word, once.
        assert_eq!(
            ev.last().map(String::as_str),
            Some("stopped"),
            "{pid}: {ev:?}"
        );
        assert_eq!(
            ev.iter().filter(|e| *e == "stopped").count(),
            1,
            "{pid}: {ev:?}"
        );
        assert_eq!(
            ev.iter().filter(|e| *e == "started").count(),
            1,
            "{pid}: {ev:?}"
        );
    }
}
