//! Helpers shared by the integration tests: golden-frame manifest, private
//! socket directories, a broker on a thread, scripted fake servers.
#![allow(dead_code)]
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vgpu_identity::server::{Broker, BrokerConfig, Metrics, ShutdownHandle};

/// What a golden frame must decode to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Decodes; the value is the command name or the pid.
    Ok(String),
    /// A response with this non-OK status.
    Status(u16),
    /// Refused with this `FrameError::kind()`.
    Error(String),
}

#[derive(Debug, Clone)]
pub struct Golden {
    pub file: String,
    pub is_request: bool,
    pub expect: Expect,
    pub bytes: Vec<u8>,
}

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden")
}

/// Parses `manifest.txt`; panics (failing the test) on a bad line.
pub fn golden() -> Vec<Golden> {
    let dir = golden_dir();
    let text = std::fs::read_to_string(dir.join("manifest.txt")).unwrap();
    let mut out = vec![];
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 4, "bad manifest line {line:?}");
        let is_request = match f[1] {
            "request" => true,
            "response" => false,
            other => panic!("bad frame type {other:?}"),
        };
        let expect = match f[2] {
            "ok" => Expect::Ok(f[3].to_owned()),
            "status" => Expect::Status(f[3].parse().unwrap()),
            "error" => Expect::Error(f[3].to_owned()),
            other => panic!("bad expectation {other:?}"),
        };
        let bytes = std::fs::read(dir.join(f[0])).unwrap();
        out.push(Golden {
            file: f[0].to_owned(),
            is_request,
            expect,
            bytes,
        });
    }
    assert!(out.len() >= 13, "manifest lists too few frames");
    out
}

pub fn golden_file(name: &str) -> Vec<u8> {
    std::fs::read(golden_dir().join(name)).unwrap()
}

/// A private root-owned 0700 directory for sockets.
pub fn sock_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vgpu-id-")
        .tempdir()
        .unwrap()
}

pub struct RunningBroker {
    pub path: PathBuf,
    pub metrics: Arc<Metrics>,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

impl RunningBroker {
    pub fn start(cfg: BrokerConfig) -> RunningBroker {
        let broker = Broker::bind(cfg).unwrap();
        let path = broker.socket_path().to_owned();
        let metrics = broker.metrics();
        let handle = broker.shutdown_handle();
        let thread = std::thread::spawn(move || broker.serve().unwrap());
        RunningBroker {
            path,
            metrics,
            handle,
            thread: Some(thread),
        }
    }

    pub fn at(dir: &Path) -> RunningBroker {
        RunningBroker::start(BrokerConfig {
            socket: dir.join("hostpid.sock"),
            ..BrokerConfig::default()
        })
    }

    /// Stops the broker and waits for `serve` to return.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for RunningBroker {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// A server at `path` that runs `script` on its first connection.
pub fn fake_server(
    path: &Path,
    script: impl FnOnce(UnixStream) + Send + 'static,
) -> (UnixListener, JoinHandle<()>) {
    let l = UnixListener::bind(path).unwrap();
    let l2 = l.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l2.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        script(s);
    });
    (l, t)
}

/// Reads the 8-byte request a client sends.
pub fn read_request(s: &mut UnixStream) -> [u8; 8] {
    use std::io::Read;
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    b
}

/// Sends a raw frame over a fresh connection and returns everything the
/// server answers until it closes.
pub fn raw_exchange(path: &Path, frame: &[u8], shutdown_write: bool) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(frame).unwrap();
    if shutdown_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut out = vec![];
    s.read_to_end(&mut out).unwrap();
    out
}

/// Waits (up to 10 s) until `f` holds: the server counts an answer after
/// writing it, so a client can see the answer before the count moves.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never true: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
