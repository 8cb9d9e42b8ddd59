//! Broker metrics: Prometheus counters with finite labels and a duration
//! histogram, plus a tiny HTTP `/metrics` responder.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::codec::FRAME_ERROR_KINDS;

/// Label of `vgpu_broker_bad_frames_total`: one of
/// [`crate::codec::FRAME_ERROR_KINDS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrameKindLabel {
    /// The frame error kind.
    pub kind: &'static str,
}

/// Every counter the broker keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Connections accepted.
    pub accepted: Counter,
    /// Requests answered with a PID.
    pub ok: Counter,
    /// Bad request frames, by kind.
    pub bad_frames: Family<FrameKindLabel, Counter>,
    /// Connections whose peer credentials were unusable.
    pub peercred_failures: Counter,
    /// Connections that hit the per-connection deadline.
    pub timeouts: Counter,
    /// Connections refused with BUSY because handlers were at the bound.
    pub rejected_load: Counter,
    /// Connections that failed with an I/O error (peer reset, ...).
    pub io_errors: Counter,
    /// Accept-to-answer time of handled connections, seconds.
    pub duration: Histogram,
}

/// Plain numbers read from [`Metrics`], for tests and shutdown summaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    /// See [`Metrics::accepted`].
    pub accepted: u64,
    /// See [`Metrics::ok`].
    pub ok: u64,
    /// Sum over kinds of [`Metrics::bad_frames`].
    pub bad_frames: u64,
    /// See [`Metrics::peercred_failures`].
    pub peercred_failures: u64,
    /// See [`Metrics::timeouts`].
    pub timeouts: u64,
    /// See [`Metrics::rejected_load`].
    pub rejected_load: u64,
    /// See [`Metrics::io_errors`].
    pub io_errors: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric under `vgpu_broker_*`; every
    /// frame-kind label is pre-created so the series exist at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            accepted: Counter::default(),
            ok: Counter::default(),
            bad_frames: Family::default(),
            peercred_failures: Counter::default(),
            timeouts: Counter::default(),
            rejected_load: Counter::default(),
            io_errors: Counter::default(),
            // 10 µs .. ~1.3 s.
            duration: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
        };
        for kind in FRAME_ERROR_KINDS {
            drop(m.bad_frames.get_or_create(&FrameKindLabel { kind }));
        }
        let r = &mut registry;
        r.register(
            "vgpu_broker_accepted",
            "Connections accepted",
            m.accepted.clone(),
        );
        r.register(
            "vgpu_broker_ok",
            "Requests answered with the caller's host PID",
            m.ok.clone(),
        );
        r.register(
            "vgpu_broker_bad_frames",
            "Malformed requests by kind",
            m.bad_frames.clone(),
        );
        r.register(
            "vgpu_broker_peercred_failures",
            "Connections without usable SO_PEERCRED credentials",
            m.peercred_failures.clone(),
        );
        r.register(
            "vgpu_broker_timeouts",
            "Connections past the per-connection deadline",
            m.timeouts.clone(),
        );
        r.register(
            "vgpu_broker_rejected_load",
            "Connections refused with BUSY at the concurrency bound",
            m.rejected_load.clone(),
        );
        r.register(
            "vgpu_broker_io_errors",
            "Connections that failed with an I/O error",
            m.io_errors.clone(),
        );
        r.register(
            "vgpu_broker_request_duration_seconds",
            "Accept-to-answer time of handled connections",
            m.duration.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts a bad frame of `kind` (one of the finite kinds).
    pub fn bad_frame(&self, kind: &'static str) {
        self.bad_frames
            .get_or_create(&FrameKindLabel { kind })
            .inc();
    }

    /// Count of bad frames of one kind.
    pub fn bad_frames_of(&self, kind: &'static str) -> u64 {
        self.bad_frames
            .get(&FrameKindLabel { kind })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            accepted: self.accepted.get(),
            ok: self.ok.get(),
            bad_frames: FRAME_ERROR_KINDS
                .iter()
                .map(|k| self.bad_frames_of(k))
                .sum(),
            peercred_failures: self.peercred_failures.get(),
            timeouts: self.timeouts.get(),
            rejected_load: self.rejected_load.get(),
            io_errors: self.io_errors.get(),
        }
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A minimal HTTP server answering `GET /metrics` (anything else: 404), one
/// connection at a time, on its own thread.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and starts serving `metrics`.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("broker-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(s) = conn {
                        // A broken scrape must not stop the server.
                        let _ = answer(s, &metrics);
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut s: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&chunk[..n]);
    }
    let line = req.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let (status, ctype, body) =
        if line.starts_with(b"GET /metrics ") || line.starts_with(b"GET /metrics?") {
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        } else {
            (
                "404 Not Found",
                "text/plain",
                "not found; try /metrics\n".to_owned(),
            )
        };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}
