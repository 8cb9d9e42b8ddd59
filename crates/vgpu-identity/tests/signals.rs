//! `SIGTERM` stops a broker cleanly and removes its socket — the way
//! `vgpu broker` runs it: termination signals blocked before any thread
//! exists, one waited for synchronously.
//!
//! No libtest harness (`harness = false`): libtest starts threads before a
//! test runs, and a process-directed signal would reach one of them with the
//! default action. The child is this binary re-executed with `--child`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_identity::query_broker;
use vgpu_identity::server::{sys, Broker, BrokerConfig};

fn child(sock: PathBuf) {
    sys::block_termination_signals().unwrap();
    let b = Broker::bind(BrokerConfig {
        socket: sock,
        ..BrokerConfig::default()
    })
    .unwrap();
    let h = b.shutdown_handle();
    let sig = Arc::new(AtomicI32::new(0));
    let sig2 = sig.clone();
    std::thread::spawn(move || {
        let s = sys::wait_termination().unwrap();
        sig2.store(s, Ordering::SeqCst);
        h.shutdown();
    });
    b.serve().unwrap();
    drop(b);
    println!("RESULT signal={}", sig.load(Ordering::SeqCst));
}

fn sigterm_stops_the_broker_and_removes_the_socket() {
    let dir = tempfile::Builder::new()
        .prefix("vgpu-id-sig-")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("run/hostpid.sock");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "broker never bound");
        assert!(c.try_wait().unwrap().is_none(), "broker died");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        query_broker(&sock, Duration::from_millis(500)).unwrap(),
        std::process::id()
    );
    let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("RESULT signal={}", libc::SIGTERM));
    assert!(c.wait().unwrap().success());
    assert!(!sock.exists(), "socket removed on SIGTERM");
    assert!(sock.parent().unwrap().exists(), "directory kept");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(PathBuf::from(&args[2]));
        return;
    }
    // `cargo test -- --list` and filters: there is one test; run it unless
    // a filter excludes it.
    if args.iter().any(|a| a == "--list") {
        println!("sigterm_stops_the_broker_and_removes_the_socket: test");
        return;
    }
    let name = "sigterm_stops_the_broker_and_removes_the_socket";
    if let Some(filter) = args.iter().skip(1).find(|a| !a.starts_with('-')) {
        if !name.contains(filter.as_str()) {
            println!("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out");
            return;
        }
    }
    sigterm_stops_the_broker_and_removes_the_socket();
    println!("test {name} ... ok");
    // libtest's summary line, which the project's test script counts.
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
