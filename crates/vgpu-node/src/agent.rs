//! `vgpu node`: every part of the agent on one tokio runtime — device
//! health, the device plugin, node registration, the pod cache, the monitor
//! (`/metrics`, `/healthz`, `/readyz`), the watchdog, slot reclaim, cache
//! GC and the priority arbiter — plus the broker on its own thread. SIGTERM/SIGINT stop them all:
//! the plugin socket and the broker socket are removed.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::sync::watch;

use crate::broker::BrokerHost;
use crate::config::NodeConfig;
use crate::gc::{self, CacheGc, LiveProcesses};
use crate::kube_api::KubeApi;
use crate::layout;
use crate::monitor::{Monitor, PodCache, WatchdogStats};
use crate::nvml::{self, Gpus};
use crate::observe::{DraShares, PodIndex};
use crate::plugin::{self, DeviceSet, PluginCore, PluginStats};
use crate::register;
use crate::watchdog::Watchdog;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Kubernetes configuration.
    #[error("{0}")]
    Kube(String),
    /// NVML.
    #[error("NVML: {0}")]
    Nvml(#[from] nvml::NvmlError),
    /// Host files.
    #[error("{0}")]
    Host(String),
    /// The monitor's listener.
    #[error("monitor on {addr}: {source}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The plugin.
    #[error(transparent)]
    Plugin(#[from] plugin::PluginError),
}

/// What the driver shows now, as the kubelet and the registration see it.
pub fn device_set(gpus: &dyn Gpus) -> DeviceSet {
    let list = gpus.devices().unwrap_or_default();
    let healthy = list.iter().map(|g| nvml::healthy(gpus, g.index)).collect();
    DeviceSet::from_driver(&list, healthy)
}

/// Writes `<hook>/vgpu/ld.so.preload` naming the library's container path.
pub fn write_preload_list(cfg: &NodeConfig) -> Result<(), AgentError> {
    let l = &cfg.layout;
    layout::ensure_dir_all(&l.vgpu_dir(), 0o755).map_err(|e| AgentError::Host(e.to_string()))?;
    let text = format!("{}\n", l.container_lib().display());
    if std::fs::read(l.ld_so_preload()).ok().as_deref() != Some(text.as_bytes()) {
        layout::write_atomic(&l.ld_so_preload(), text.as_bytes(), 0o644).map_err(|e| {
            AgentError::Host(format!("writing {}: {e}", l.ld_so_preload().display()))
        })?;
    }
    if !cfg.lib_path.is_file() {
        tracing::warn!(lib = %cfg.lib_path.display(), "libvgpu.so is not at the library path; containers will fail to start until it is installed");
    }
    let core = layout::core_beside(&cfg.lib_path);
    if !core.is_file() {
        tracing::warn!(core = %core.display(), "libvgpu_core.so is not beside libvgpu.so; every CUDA call in the containers will fail until it is installed");
    }
    Ok(())
}

struct Http {
    monitor: Arc<Monitor>,
    plugin: Arc<PluginStats>,
    broker: Option<Arc<BrokerHost>>,
    pods: Arc<PodCache>,
}

impl Http {
    async fn handle(
        self: Arc<Self>,
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let reply = |code: u16, ct: &str, body: String| {
            Response::builder()
                .status(code)
                .header("content-type", ct)
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
        };
        let registered = self
            .plugin
            .registered
            .load(std::sync::atomic::Ordering::SeqCst);
        let broker_ready = self.broker.as_ref().map(|b| b.ready());
        let status = serde_json::json!({
            "plugin_registered": registered,
            "registrations": self.plugin.registrations.load(std::sync::atomic::Ordering::SeqCst),
            "broker_ready": broker_ready,
            "pods_refreshed_seconds_ago": self.pods.refreshed().map(|t| t.elapsed().as_secs()),
        });
        Ok(match req.uri().path() {
            "/metrics" => {
                let m = self.monitor.clone();
                let text = tokio::task::spawn_blocking(move || m.scrape())
                    .await
                    .unwrap_or_default();
                reply(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                )
            }
            "/healthz" => reply(200, "application/json", status.to_string()),
            "/readyz" => {
                let ok = registered && broker_ready != Some(false);
                reply(
                    if ok { 200 } else { 503 },
                    "application/json",
                    status.to_string(),
                )
            }
            _ => reply(404, "text/plain", "not found\n".into()),
        })
    }
}

async fn serve_http(
    listener: tokio::net::TcpListener,
    http: Arc<Http>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = shutdown.changed() => return,
        };
        let Ok((sock, _)) = conn else { continue };
        let h = http.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| h.clone().handle(req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                .await;
        });
    }
}

async fn every(period: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(period) => true,
        _ = shutdown.changed() => false,
    }
}

/// How old a container's utilization sample may be and still count: the
/// sampler publishes every 100 ms; a second (or two of the arbiter's
/// periods, if longer) without one means no process is publishing.
pub fn priority_stale(interval: Duration) -> Duration {
    (interval * 2).max(Duration::from_secs(1))
}

/// What the agent hands a service it runs beside its own (the DRA driver,
/// which lives in a crate above this one).
pub struct AgentContext {
    /// The settings.
    pub cfg: Arc<NodeConfig>,
    /// The API client.
    pub client: kube::Client,
    /// NVML.
    pub gpus: Arc<dyn Gpus>,
    /// Turns true at shutdown.
    pub shutdown: watch::Receiver<bool>,
    /// The DRA shares' users, for the monitor and the watchdog.
    pub dra_shares: Arc<DraShares>,
    /// `registered` feeds `/readyz` (in DRA mode: the kubelet accepted the
    /// DRA plugin).
    pub stats: Arc<PluginStats>,
}

/// A service started with the agent; an error stops the agent.
pub type Extra = Box<
    dyn FnOnce(
            AgentContext,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send,
>;

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(cfg: NodeConfig) -> Result<(), AgentError> {
    run_with(cfg, None).await
}

/// Runs the agent, with `extra` beside it, until SIGTERM/SIGINT. In
/// `Mode::Dra` neither the device plugin nor HAMi's node registration runs.
pub async fn run_with(cfg: NodeConfig, extra: Option<Extra>) -> Result<(), AgentError> {
    let cfg = Arc::new(cfg);
    let client = crate::kube_api::client(cfg.kubeconfig.as_deref())
        .await
        .map_err(AgentError::Kube)?;
    let dra_shares = Arc::new(DraShares::default());
    let kube = KubeApi::new(client.clone(), cfg.node_name.clone());
    let gpus: Arc<dyn Gpus> = Arc::new(nvml::Nvml::open(cfg.nvml_library.as_deref())?);
    write_preload_list(&cfg)?;
    layout::ensure_dir_all(&cfg.layout.containers_dir(), 0o755)
        .map_err(|e| AgentError::Host(e.to_string()))?;
    layout::ensure_dir_all(&cfg.layout.limits_root(), 0o755)
        .map_err(|e| AgentError::Host(e.to_string()))?;
    let broker = cfg.broker_socket.clone().map(BrokerHost::start);
    let (shutdown_tx, shutdown) = watch::channel(false);

    // Devices and health.
    let (dev_tx, dev_rx) = watch::channel(device_set(gpus.as_ref()));
    {
        let gpus = gpus.clone();
        let mut sd = shutdown.clone();
        let period = cfg.health_interval;
        tokio::spawn(async move {
            while every(period, &mut sd).await {
                let g = gpus.clone();
                if let Ok(now) = tokio::task::spawn_blocking(move || device_set(g.as_ref())).await {
                    dev_tx.send_if_modified(|cur| {
                        if *cur != now {
                            tracing::info!(gpus = now.gpus.len(), healthy = ?now.healthy, "devices changed");
                            *cur = now;
                            true
                        } else {
                            false
                        }
                    });
                }
            }
        });
    }

    // Pods bound to this node.
    let pods = Arc::new(PodCache::default());
    {
        let (pods, kube, mut sd, period, shares) = (
            pods.clone(),
            kube.clone(),
            shutdown.clone(),
            cfg.pod_refresh,
            dra_shares.clone(),
        );
        tokio::spawn(async move {
            loop {
                match kube.pods_on_node().await {
                    Ok(list) => pods.set(PodIndex::new(&list).with_dra_shares(&shares.get())),
                    Err(e) => tracing::warn!("pod cache: {e}"),
                }
                if !every(period, &mut sd).await {
                    return;
                }
            }
        });
    }

    // The device plugin.
    let stats = Arc::new(PluginStats::default());
    let mut plugin_task = if cfg.mode.device_plugin() {
        let core = PluginCore::new(cfg.clone(), kube.clone(), dev_rx.clone(), stats.clone());
        tokio::spawn(plugin::serve(core, shutdown.clone()))
    } else {
        // No device plugin: a task that ends only at shutdown.
        let mut sd = shutdown.clone();
        tokio::spawn(async move {
            let _ = sd.wait_for(|s| *s).await;
            Ok(())
        })
    };

    // Node registration (HAMi's, for the device plugin's scheduler).
    if cfg.mode.device_plugin() {
        let (kube, cfg, mut sd, mut devs) =
            (kube.clone(), cfg.clone(), shutdown.clone(), dev_rx.clone());
        tokio::spawn(async move {
            loop {
                let set = devs.borrow_and_update().clone();
                let list = register::node_devices(&cfg, &set);
                match register::register_once(&kube, &list).await {
                    Ok(o) if o.registered => {
                        tracing::info!(gpus = list.len(), "node registration written")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("node registration: {e}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(cfg.register_interval) => {}
                    _ = devs.changed() => {}
                    _ = sd.changed() => return,
                }
            }
        });
    }

    // Monitor.
    let wd_stats = Arc::new(WatchdogStats::default());
    let monitor = Arc::new(Monitor::new(
        cfg.clone(),
        gpus.clone(),
        pods.clone(),
        wd_stats.clone(),
        broker.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(cfg.metrics_addr)
        .await
        .map_err(|source| AgentError::Listen {
            addr: cfg.metrics_addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| AgentError::Listen {
        addr: cfg.metrics_addr,
        source,
    })?;
    eprintln!("vgpu node: monitor on http://{bound}");
    let http = Arc::new(Http {
        monitor,
        plugin: stats.clone(),
        broker: broker.clone(),
        pods: pods.clone(),
    });
    tokio::spawn(serve_http(listener, http, shutdown.clone()));

    // Watchdog.
    let wd = Watchdog::new(cfg.clone(), gpus.clone(), pods.clone(), wd_stats);
    tokio::spawn(wd.run(Some(kube.clone()), shutdown.clone()));

    // Slot reclaim and cache GC.
    {
        let (kube, cfg, mut sd) = (kube.clone(), cfg.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut cache_gc = CacheGc::default();
            loop {
                let listed = kube.pods_on_node().await;
                let cfg2 = cfg.clone();
                let res = tokio::task::spawn_blocking(move || {
                    let live = LiveProcesses::scan(std::path::Path::new("/proc"));
                    let freed = gc::reclaim_slots(&cfg2.layout, &live);
                    let rep = match listed {
                        Ok(pods) => {
                            let uids: HashSet<String> =
                                pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
                            Some(cache_gc.pass(
                                &cfg2.layout,
                                &uids,
                                &live,
                                cfg2.gc_grace,
                                Instant::now(),
                            ))
                        }
                        Err(e) => {
                            tracing::warn!("cache GC skipped (no pod list): {e}");
                            None
                        }
                    };
                    (cache_gc, freed, rep)
                })
                .await;
                match res {
                    Ok((g, _, _)) => cache_gc = g,
                    Err(_) => return,
                }
                if !every(cfg.gc_interval, &mut sd).await {
                    return;
                }
            }
        });
    }

    // The priority arbiter.
    if let Some(rule) = cfg.priority_rule() {
        let (cfg, mut sd) = (cfg.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut arb = crate::priority::Arbiter::new(rule);
            // A sample older than this means no process is publishing: idle.
            let stale = priority_stale(cfg.priority_interval);
            loop {
                let layout = cfg.layout.clone();
                let res = tokio::task::spawn_blocking(move || {
                    arb.pass(&layout, Instant::now(), vgpu_region::monotonic_ns(), stale);
                    arb
                })
                .await;
                match res {
                    Ok(a) => arb = a,
                    Err(_) => return,
                }
                if !every(cfg.priority_interval, &mut sd).await {
                    return;
                }
            }
        });
    }

    // The extra service (the DRA driver).
    let mut extra_task = match extra {
        Some(f) => tokio::spawn(f(AgentContext {
            cfg: cfg.clone(),
            client,
            gpus: gpus.clone(),
            shutdown: shutdown.clone(),
            dra_shares,
            stats: stats.clone(),
        })),
        None => {
            let mut sd = shutdown.clone();
            tokio::spawn(async move {
                let _ = sd.wait_for(|s| *s).await;
                Ok(())
            })
        }
    };

    // Wait for a termination signal.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| AgentError::Host(format!("SIGTERM handler: {e}")))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        r = &mut plugin_task => {
            let _ = shutdown_tx.send(true);
            if let Some(b) = &broker {
                let b = b.clone();
                tokio::task::spawn_blocking(move || b.shutdown()).await.ok();
            }
            return match r {
                Ok(Err(e)) => Err(e.into()),
                _ => Err(AgentError::Host("the device plugin stopped".into())),
            };
        }
        r = &mut extra_task => {
            let _ = shutdown_tx.send(true);
            if let Some(b) = &broker {
                let b = b.clone();
                tokio::task::spawn_blocking(move || b.shutdown()).await.ok();
            }
            return Err(AgentError::Host(match r {
                Ok(Err(e)) => e,
                _ => "the DRA driver stopped".into(),
            }));
        }
    }
    tracing::info!("vgpu node: stopping");
    let _ = shutdown_tx.send(true);
    // The plugin removes its socket on the way out.
    let _ = tokio::time::timeout(Duration::from_secs(5), plugin_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), extra_task).await;
    if let Some(b) = broker {
        tokio::task::spawn_blocking(move || b.shutdown()).await.ok();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::{GpuInfo, StaticGpus};

    fn gpu(used: u64) -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: "GPU-4617e643-f070-4b90-b715-30c57f977a9a".into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total: 80 << 30,
            memory_used: used,
            bus_id: String::new(),
        }
    }

    #[test]
    fn memory_in_use_is_not_a_device_change() {
        let g = StaticGpus::default();
        g.devices.lock().unwrap().push(gpu(0));
        let idle = device_set(&g);
        g.devices.lock().unwrap()[0].memory_used = 3 << 30;
        assert_eq!(device_set(&g), idle, "a busy GPU is the same device");

        // Real changes are changes.
        g.devices.lock().unwrap()[0].memory_total = 40 << 30;
        assert_ne!(device_set(&g), idle, "memory total");
        g.devices.lock().unwrap()[0] = gpu(0);
        g.failing.lock().unwrap().insert(0);
        assert_ne!(device_set(&g), idle, "health");
        g.failing.lock().unwrap().clear();
        g.devices.lock().unwrap().push(GpuInfo {
            index: 1,
            uuid: "GPU-9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f".into(),
            ..gpu(0)
        });
        assert_ne!(device_set(&g), idle, "a GPU added");
    }
}
