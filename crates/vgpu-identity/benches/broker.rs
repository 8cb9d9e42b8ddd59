//! Broker benchmark (prints only; nothing is asserted).
//!
//! `cargo bench -p vgpu-identity --bench broker [-- --quick]`
//!
//! The broker runs in its own process (this binary re-executed with
//! `--serve PATH`), like the node agent would; clients are threads here.
//! Measures query latency with 1 client and with 300 concurrent clients
//! (sustained loop and synchronized bursts), and how fast a missing socket
//! falls through. Failures are counted beside every percentile.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use vgpu_identity::query_broker;
use vgpu_identity::server::{Broker, BrokerConfig};

const DEADLINE: Duration = Duration::from_millis(500);

struct Run {
    hist: Histogram<u64>,
    failures: u64,
    first_failure: Option<String>,
    wall: Duration,
}

impl Run {
    fn new() -> Run {
        Run {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
            failures: 0,
            first_failure: None,
            wall: Duration::ZERO,
        }
    }

    fn merge(&mut self, o: Run) {
        self.hist.add(&o.hist).unwrap();
        self.failures += o.failures;
        if self.first_failure.is_none() {
            self.first_failure = o.first_failure;
        }
    }

    fn line(&self, name: &str) -> String {
        let us = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        let n = self.hist.len();
        let rate = if self.wall.is_zero() {
            0.0
        } else {
            n as f64 / self.wall.as_secs_f64()
        };
        format!(
            "| {name} | {n} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |{}",
            self.failures,
            us(0.5),
            us(0.99),
            us(0.999),
            self.hist.max() as f64 / 1000.0,
            rate,
            self.first_failure
                .as_ref()
                .map(|f| format!(" first failure: {f}"))
                .unwrap_or_default()
        )
    }
}

fn query_once(path: &Path, me: u32, run: &mut Run) {
    let t = Instant::now();
    let r = query_broker(path, DEADLINE);
    let ns = t.elapsed().as_nanos() as u64;
    match r {
        Ok(pid) if pid == me => run.hist.record(ns.max(1)).unwrap(),
        other => {
            run.failures += 1;
            if run.first_failure.is_none() {
                run.first_failure = Some(format!("{other:?}"));
            }
        }
    }
}

fn single(path: &Path, n: usize) -> Run {
    let me = std::process::id();
    let mut run = Run::new();
    for _ in 0..n / 10 {
        let _ = query_broker(path, DEADLINE); // warm up
    }
    let t = Instant::now();
    for _ in 0..n {
        query_once(path, me, &mut run);
    }
    run.wall = t.elapsed();
    run
}

/// `clients` threads; each waits at a barrier before each of `rounds`
/// queries (`burst`) or loops `rounds` queries freely.
fn concurrent(path: &Path, clients: usize, rounds: usize, burst: bool) -> Run {
    let me = std::process::id();
    let barrier = Arc::new(Barrier::new(clients));
    let t = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let path = path.to_owned();
            let barrier = barrier.clone();
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut run = Run::new();
                    barrier.wait();
                    for _ in 0..rounds {
                        if burst {
                            barrier.wait();
                        }
                        query_once(&path, me, &mut run);
                    }
                    run
                })
                .unwrap()
        })
        .collect();
    let mut all = Run::new();
    for h in handles {
        all.merge(h.join().unwrap());
    }
    all.wall = t.elapsed();
    all
}

/// Baseline: the same exchange with plain blocking std calls and no
/// endpoint checks, to separate the client's own cost from the round trip.
fn baseline(path: &Path, n: usize) -> Run {
    use std::io::{Read, Write};
    let me = std::process::id();
    let req = vgpu_identity::codec::encode_request(vgpu_identity::codec::Request::GET_PID);
    let mut run = Run::new();
    let t = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = (|| -> std::io::Result<u32> {
            let mut s = std::os::unix::net::UnixStream::connect(path)?;
            s.write_all(&req)?;
            let mut b = [0u8; 12];
            s.read_exact(&mut b)?;
            Ok(u32::from_be_bytes([b[8], b[9], b[10], b[11]]))
        })();
        let ns = t.elapsed().as_nanos() as u64;
        match r {
            Ok(pid) if pid == me => run.hist.record(ns.max(1)).unwrap(),
            other => {
                run.failures += 1;
                run.first_failure
                    .get_or_insert_with(|| format!("{other:?}"));
            }
        }
    }
    run.wall = t.elapsed();
    run
}

fn missing(dir: &Path, n: usize) -> Run {
    let path = dir.join("absent.sock");
    let mut run = Run::new();
    let t = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = query_broker(&path, DEADLINE);
        let ns = t.elapsed().as_nanos() as u64;
        match r {
            Err(vgpu_identity::BrokerError::Missing) => run.hist.record(ns.max(1)).unwrap(),
            other => {
                run.failures += 1;
                run.first_failure
                    .get_or_insert_with(|| format!("{other:?}"));
            }
        }
    }
    run.wall = t.elapsed();
    run
}

fn serve(path: PathBuf) {
    let b = Broker::bind(BrokerConfig {
        socket: path,
        ..BrokerConfig::default()
    })
    .unwrap();
    let m = b.metrics();
    let h = b.shutdown_handle();
    std::thread::spawn(move || {
        // Stop when the parent closes our stdin.
        let mut s = String::new();
        while std::io::stdin()
            .read_line(&mut s)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
        h.shutdown();
    });
    b.serve().unwrap();
    let s = m.snapshot();
    println!(
        "server: accepted {} ok {} rejected_load {} timeouts {} bad_frames {} io_errors {}",
        s.accepted, s.ok, s.rejected_load, s.timeouts, s.bad_frames, s.io_errors
    );
}

fn cpu_line() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(PathBuf::from(&args[i + 1]));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };

    let dir = tempfile::Builder::new()
        .prefix("vgpu-broker-bench-")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("hostpid.sock");
    // `--server-nice N`: run the broker at nice N (a node agent may run at a
    // higher priority than the workloads it serves).
    let nice = args
        .iter()
        .position(|a| a == "--server-nice")
        .map(|i| args[i + 1].clone());
    let mut server = match &nice {
        Some(n) => {
            let mut c = Command::new("nice");
            c.args(["-n", n]).arg(std::env::current_exe().unwrap());
            c
        }
        None => Command::new(std::env::current_exe().unwrap()),
    };
    let mut server = server
        .arg("--serve")
        .arg(&sock)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    println!(
        "broker benchmark: date {} | nproc {} | cpu {}",
        String::from_utf8_lossy(
            &Command::new("date")
                .arg("-u")
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default()
        )
        .trim(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu_line()
    );
    println!(
        "latency in µs, per query (checks + connect + request + answer), client threads vs a broker process{}",
        nice.as_ref().map(|n| format!(" at nice {n}")).unwrap_or_default()
    );
    println!();
    println!("| case | queries | failures | p50 | p99 | p99.9 | max | queries/s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "{}",
        single(&sock, 20_000 / scale).line("1 client, sequential")
    );
    println!(
        "{}",
        baseline(&sock, 20_000 / scale).line("1 client, baseline: std calls, no checks")
    );
    println!(
        "{}",
        concurrent(&sock, 300, 100 / scale, false).line("300 clients, sustained loop")
    );
    println!(
        "{}",
        concurrent(&sock, 300, 50 / scale, true).line("300 clients, synchronized bursts")
    );
    println!(
        "{}",
        missing(dir.path(), 100_000 / scale).line("missing socket (fall-through)")
    );
    println!();

    drop(server.stdin.take());
    server.wait().unwrap();
}
