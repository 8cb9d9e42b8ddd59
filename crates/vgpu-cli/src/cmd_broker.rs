//! `vgpu broker`: the host-PID broker server (see docs/identity.md).
//!
//! Runs in the host PID namespace and answers each caller with its own host
//! PID, as the kernel reports it through `SO_PEERCRED`. SIGTERM, SIGINT or
//! SIGHUP stop it cleanly: in-flight connections finish, the socket is
//! removed and the counters are printed to stderr.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use vgpu_identity::server::{self, Broker, BrokerConfig, MetricsServer};

#[derive(clap::Args)]
pub struct Args {
    /// Socket path; its directory is created root-owned 0755 if missing.
    #[arg(long, default_value = server::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Handler threads: connections waiting for their request at once;
    /// beyond this, callers get a BUSY answer (1-4096).
    #[arg(long, default_value_t = 256)]
    max_concurrent: usize,
    /// Per-connection deadline in milliseconds, accept to answer (1-60000).
    #[arg(long, default_value_t = 500)]
    deadline_ms: u64,
    /// Serve Prometheus metrics over HTTP at ADDR/metrics (e.g. 127.0.0.1:9402).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Instead of serving: ask the broker at --socket for this process's
    /// host PID (with the client's checks) and print it. For diagnosis
    /// inside a container.
    #[arg(long, conflicts_with_all = ["max_concurrent", "deadline_ms", "metrics"])]
    query: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.query {
        let pid = vgpu_identity::query_broker(&args.socket, vgpu_identity::client::MAX_DEADLINE)
            .with_context(|| format!("querying the broker at {}", args.socket.display()))?;
        println!("{pid}");
        return Ok(ExitCode::SUCCESS);
    }
    // Before any thread exists, so every thread inherits the mask and the
    // signals reach only the waiter below.
    server::sys::block_termination_signals().context("blocking termination signals")?;
    let broker = Broker::bind(BrokerConfig {
        socket: args.socket.clone(),
        max_concurrent: args.max_concurrent,
        deadline: Duration::from_millis(args.deadline_ms),
        ..BrokerConfig::default()
    })
    .with_context(|| format!("starting the broker on {}", args.socket.display()))?;
    let metrics = broker.metrics();
    let _http = match args.metrics {
        Some(addr) => {
            let m = MetricsServer::start(addr, metrics.clone())
                .with_context(|| format!("serving metrics on {addr}"))?;
            eprintln!("vgpu broker: metrics on http://{}/metrics", m.local_addr());
            Some(m)
        }
        None => None,
    };
    let handle = broker.shutdown_handle();
    std::thread::Builder::new()
        .name("broker-signals".into())
        .spawn(move || {
            if let Ok(sig) = server::sys::wait_termination() {
                eprintln!("vgpu broker: signal {sig}, shutting down");
            }
            handle.shutdown();
        })
        .context("starting the signal waiter")?;
    eprintln!(
        "vgpu broker: serving {} (max {} concurrent, deadline {} ms)",
        args.socket.display(),
        args.max_concurrent,
        args.deadline_ms
    );
    broker.serve().context("serving")?;
    drop(broker);
    let s = metrics.snapshot();
    eprintln!(
        "vgpu broker: stopped; accepted {} ok {} bad_frames {} peercred_failures {} timeouts {} rejected_load {} io_errors {}",
        s.accepted, s.ok, s.bad_frames, s.peercred_failures, s.timeouts, s.rejected_load, s.io_errors
    );
    Ok(ExitCode::SUCCESS)
}
