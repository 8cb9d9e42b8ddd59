//! Starting the whole scheduler: the watches, the handshake writer, the
//! extender/webhook listener and the metrics listener. Dropping the
//! returned [`Running`] stops everything it started.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::scheduler::Scheduler;
use crate::server::{self, Listener, ServerError, TlsFiles};
use crate::watch;

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Extender and webhook address (HAMi: `--http_bind`).
    pub listen: SocketAddr,
    /// Metrics address (HAMi: `--metrics-bind-address`, `:9395`).
    pub metrics: Option<SocketAddr>,
    pub tls: Option<TlsFiles>,
    /// Only nodes with these labels (`k=v,...`), as HAMi's `--node-label-selector`.
    pub node_label_selector: Option<String>,
    /// How often the handshake writer looks for GPU nodes to ask (HAMi: 15 s).
    pub handshake_period: Option<Duration>,
}

/// A running scheduler.
pub struct Running {
    pub scheduler: Arc<Scheduler>,
    pub listen: SocketAddr,
    pub metrics: Option<SocketAddr>,
    _listeners: Vec<Listener>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub async fn start(s: Arc<Scheduler>, opts: RunOptions) -> Result<Running, ServerError> {
    let tls = opts.tls.as_ref().map(server::tls_acceptor).transpose()?;
    let api = server::serve(s.clone(), opts.listen, tls).await?;
    let mut listeners = Vec::new();
    let listen = api.addr;
    listeners.push(api);
    let metrics = match opts.metrics {
        Some(addr) => {
            let m = server::serve_metrics(s.clone(), addr).await?;
            let a = m.addr;
            listeners.push(m);
            Some(a)
        }
        None => None,
    };
    let mut tasks = vec![
        tokio::spawn(watch::watch_nodes(
            s.clone(),
            opts.node_label_selector.clone(),
        )),
        tokio::spawn(watch::watch_pods(s.clone())),
    ];
    if let Some(period) = opts.handshake_period {
        tasks.push(tokio::spawn(watch::write_handshakes(s.clone(), period)));
    }
    Ok(Running {
        scheduler: s,
        listen,
        metrics,
        _listeners: listeners,
        tasks,
    })
}
