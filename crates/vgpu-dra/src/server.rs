//! The kubelet-facing gRPC services on Unix sockets: the DRA service
//! (v1, and the same implementation under v1beta1, whose messages are v1's
//! without `share_id`) on `<plugin dir>/dra.sock`, then the registration
//! service on `<registry dir>/<driver>-reg.sock`, which the kubelet's plugin
//! watcher finds (at its start too, so a restarted kubelet re-registers the
//! driver unaided). Both accept the kubelet's socket-path `:authority`
//! through [`crate::authority`].

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prost::Message;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};
use vgpu_node::plugin::PluginStats;

use crate::authority::LocalAuthority;
use crate::driver::{ClaimRef, Driver};
use crate::proto::dra_v1::{self as v1, dra_plugin_server::DraPlugin};
use crate::proto::dra_v1beta1::{self as v1beta1, dra_plugin_server::DraPlugin as DraPluginBeta};
use crate::proto::pluginregistration::{
    registration_server::{Registration, RegistrationServer},
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::proto::{PLUGIN_TYPE, SUPPORTED_VERSIONS};

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A filesystem step.
    #[error("{op} {path}: {source}")]
    Io {
        /// Step.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Something other than a socket is where ours goes.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
}

/// The DRA service.
#[derive(Clone)]
pub struct DraService(pub Arc<Driver>);

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims: Vec<ClaimRef> = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                uid: c.uid,
                name: c.name,
            })
            .collect();
        let res = self.0.prepare(&claims).await;
        let claims = res
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devs) => v1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| v1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let uids: Vec<String> = req.into_inner().claims.into_iter().map(|c| c.uid).collect();
        let res = self.0.unprepare(&uids).await;
        let claims = res
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1::NodeUnprepareResourceResponse {
                        error: r.err().unwrap_or_default(),
                    },
                )
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

/// Re-reads a message as another version's (the two are wire-compatible).
fn convert<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("converting between DRA API versions: {e}")))
}

#[tonic::async_trait]
impl DraPluginBeta for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let r: v1::NodePrepareResourcesRequest = convert(req.get_ref())?;
        let resp = DraPlugin::node_prepare_resources(self, Request::new(r)).await?;
        Ok(Response::new(convert(resp.get_ref())?))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let r: v1::NodeUnprepareResourcesRequest = convert(req.get_ref())?;
        let resp = DraPlugin::node_unprepare_resources(self, Request::new(r)).await?;
        Ok(Response::new(convert(resp.get_ref())?))
    }
}

/// The registration service.
pub struct RegistrationService {
    /// Driver name.
    pub driver: String,
    /// Absolute path of `dra.sock`.
    pub endpoint: String,
    /// `registered` is set by the kubelet's answer.
    pub stats: Arc<PluginStats>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.driver, "the kubelet registered the DRA plugin");
            self.stats.registered.store(true, Ordering::SeqCst);
            self.stats.registrations.fetch_add(1, Ordering::SeqCst);
        } else {
            tracing::error!(driver = %self.driver, error = %s.error, "THE KUBELET REFUSED THE DRA PLUGIN's registration: pods asking for this driver's devices will not start");
            self.stats.registered.store(false, Ordering::SeqCst);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Removes a stale socket at `path` (a non-socket is refused).
pub fn remove_stale_socket(path: &Path) -> Result<(), ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| ServeError::Io {
                op: "remove",
                path: path.into(),
                source,
            })
        }
        Ok(_) => Err(ServeError::NotASocket(path.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ServeError::Io {
            op: "lstat",
            path: path.into(),
            source,
        }),
    }
}

/// The connections on `listener`, each with its client's `:authority`
/// made acceptable to h2.
fn incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<LocalAuthority<tokio::net::UnixStream>>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|c| c.map(LocalAuthority::new))
}

fn bind(path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::Io {
            op: "mkdir",
            path: dir.into(),
            source,
        })?;
    }
    remove_stale_socket(path)?;
    tokio::net::UnixListener::bind(path).map_err(|source| ServeError::Io {
        op: "bind",
        path: path.into(),
        source,
    })
}

/// Serves both sockets until `shutdown` turns true, then removes them.
/// `ready` runs once both are bound.
pub async fn serve(
    driver: Arc<Driver>,
    stats: Arc<PluginStats>,
    mut shutdown: watch::Receiver<bool>,
    ready: impl FnOnce(&Path),
) -> Result<(), ServeError> {
    let dra_sock = driver.cfg.dra_socket();
    let reg_sock = driver.cfg.registration_socket();
    let endpoint = std::path::absolute(&dra_sock)
        .unwrap_or_else(|_| dra_sock.clone())
        .display()
        .to_string();
    let dra_listener = bind(&dra_sock)?;
    let svc = DraService(driver.clone());
    let mut sd = shutdown.clone();
    let dra = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(svc.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(svc))
            .serve_with_incoming_shutdown(incoming(dra_listener), async move {
                let _ = sd.wait_for(|s| *s).await;
            }),
    );
    // Registration last: the kubelet connects to dra.sock as soon as it
    // sees this socket.
    let reg_listener = bind(&reg_sock)?;
    let mut sd = shutdown.clone();
    let reg = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(RegistrationService {
                driver: driver.cfg.driver.clone(),
                endpoint,
                stats,
            }))
            .serve_with_incoming_shutdown(incoming(reg_listener), async move {
                let _ = sd.wait_for(|s| *s).await;
            }),
    );
    ready(&dra_sock);
    let _ = shutdown.wait_for(|s| *s).await;
    let _ = reg.await;
    let _ = dra.await;
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    Ok(())
}
