//! The host-PID broker hosted by the agent (vgpu-identity's server, see
//! docs/identity.md): bound on the host PID namespace's view of the socket
//! in its protected directory (root-owned, 0755; the server refuses a
//! directory anyone else can write), served on its own thread, rebound
//! after a failure with backoff, and on agent restart (a leftover socket of
//! ours that nobody answers is replaced by `Broker::bind`). Shutdown stops
//! accepting, finishes in-flight connections and removes the socket.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use vgpu_identity::server::{Broker, BrokerConfig, Metrics, ShutdownHandle};

/// The running broker.
pub struct BrokerHost {
    socket: PathBuf,
    ready: AtomicBool,
    stopping: AtomicBool,
    current: Mutex<Option<(ShutdownHandle, Arc<Metrics>)>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl BrokerHost {
    /// Starts serving `socket` on a thread; returns at once (see [`BrokerHost::ready`]).
    pub fn start(socket: PathBuf) -> Arc<BrokerHost> {
        let host = Arc::new(BrokerHost {
            socket,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            current: Mutex::new(None),
            thread: Mutex::new(None),
        });
        let h = host.clone();
        let t = std::thread::Builder::new()
            .name("vgpu-broker".into())
            .spawn(move || h.serve_loop())
            .ok();
        *host.thread.lock().unwrap_or_else(|e| e.into_inner()) = t;
        host
    }

    fn serve_loop(&self) {
        let mut backoff = Duration::from_millis(200);
        while !self.stopping.load(Ordering::SeqCst) {
            let cfg = BrokerConfig {
                socket: self.socket.clone(),
                ..BrokerConfig::default()
            };
            match Broker::bind(cfg) {
                Ok(b) => {
                    *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((b.shutdown_handle(), b.metrics()));
                    // A shutdown that raced the bind.
                    if self.stopping.load(Ordering::SeqCst) {
                        b.shutdown();
                    }
                    self.ready.store(true, Ordering::SeqCst);
                    tracing::info!(socket = %self.socket.display(), "host-PID broker serving");
                    backoff = Duration::from_millis(200);
                    let r = b.serve();
                    self.ready.store(false, Ordering::SeqCst);
                    drop(b);
                    if let Err(e) = r {
                        tracing::warn!("host-PID broker stopped: {e}; rebinding");
                    }
                }
                Err(e) => {
                    tracing::warn!(socket = %self.socket.display(), "host-PID broker cannot bind: {e}; retrying in {backoff:?}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Serving now.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The socket path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The current server's counters.
    pub fn metrics(&self) -> Option<Arc<Metrics>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, m)| m.clone())
    }

    /// Stops and waits: the socket is removed.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some((h, _)) = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.shutdown();
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}
