//! The HTTP(S) endpoints: `POST /filter`, `/prioritize`, `/bind` (the
//! extender verbs, matched on the last path segment so any `urlPrefix`
//! works), `POST /webhook` (AdmissionReview), `GET /healthz`, `/readyz`
//! (503 until nodes and assigned pods have been read once); TLS when a
//! certificate is given. Metrics are served on their own listener.
//!
//! Owns request decoding and answer encoding only; a malformed body gets
//! an answer in the verb's own shape with `Error` set (kube-scheduler
//! shows it), never a dropped connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::AdmissionReview;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_rustls::rustls;

use crate::bind;
use crate::decide;
use crate::extender::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
};
use crate::metrics::OutcomeLabels;
use crate::scheduler::{local_now, Scheduler};
use crate::webhook;

/// Largest request body: a non-cache-capable filter carries whole Nodes.
const MAX_BODY: usize = 64 << 20;
/// How long a filter waits for the first read of the cluster.
const SYNC_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    ReadTls {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS material in {path}: {reason}")]
    Tls { path: PathBuf, reason: String },
}

/// Certificate chain and key, PEM.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn tls_acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |path: &PathBuf, reason: String| ServerError::Tls {
        path: path.clone(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| bad(&files.cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&files.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(&files.cert, "no certificate".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad(&files.key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&files.cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad(&files.cert, e.to_string()))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn text_response(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

fn to_json<T: serde::Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(b) => json_response(StatusCode::OK, b),
        Err(e) => text_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, String> {
    Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| format!("reading the request body: {e}"))
}

async fn wait_synced(s: &Scheduler) -> bool {
    let deadline = Instant::now() + SYNC_WAIT;
    while !s.ready() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

const NOT_SYNCED: &str = "the vgpu scheduler has not finished reading nodes and pods yet";

/// Routes one request.
pub async fn handle(s: Arc<Scheduler>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let verb = path.rsplit('/').next().unwrap_or("").to_owned();
    match (req.method().clone(), verb.as_str()) {
        (Method::GET, "healthz") => text_response(StatusCode::OK, "ok"),
        (Method::GET, "readyz") if s.ready() => text_response(StatusCode::OK, "ok"),
        (Method::GET, "readyz") => text_response(StatusCode::SERVICE_UNAVAILABLE, NOT_SYNCED),
        (Method::POST, "filter") => {
            let started = Instant::now();
            let result = match read_body(req).await.and_then(|b| {
                serde_json::from_slice::<ExtenderArgs>(&b)
                    .map_err(|e| format!("decoding ExtenderArgs: {e}"))
            }) {
                Err(e) => ExtenderFilterResult::error(e),
                Ok(_) if !wait_synced(&s).await => ExtenderFilterResult::error(NOT_SYNCED),
                Ok(args) => decide::filter(&s.read(), &args, &s.cfg, local_now()),
            };
            s.metrics
                .timings
                .filter
                .observe(started.elapsed().as_secs_f64());
            to_json(&result)
        }
        (Method::POST, "prioritize") => {
            let started = Instant::now();
            let result = match read_body(req).await.and_then(|b| {
                serde_json::from_slice::<ExtenderArgs>(&b)
                    .map_err(|e| format!("decoding ExtenderArgs: {e}"))
            }) {
                // kube-scheduler's HostPriorityList has no error field: a
                // non-200 answer makes it report the failure.
                Err(e) => return text_response(StatusCode::BAD_REQUEST, &e),
                Ok(args) => decide::prioritize(&s.read(), &args, &s.cfg, local_now()),
            };
            s.metrics
                .timings
                .prioritize
                .observe(started.elapsed().as_secs_f64());
            to_json(&result)
        }
        (Method::POST, "bind") => {
            let started = Instant::now();
            let (error, outcome) = match read_body(req).await.and_then(|b| {
                serde_json::from_slice::<ExtenderBindingArgs>(&b)
                    .map_err(|e| format!("decoding ExtenderBindingArgs: {e}"))
            }) {
                Err(e) => (e, "bad_request"),
                Ok(args) => match bind::bind(&s, &args).await {
                    Ok(()) => {
                        tracing::info!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, "bound");
                        (String::new(), "bound")
                    }
                    Err(e) => {
                        tracing::warn!(
                            "bind {}/{} to {}: {e}",
                            args.pod_namespace,
                            args.pod_name,
                            args.node
                        );
                        (e.to_string(), e.outcome())
                    }
                },
            };
            s.metrics
                .timings
                .bind
                .observe(started.elapsed().as_secs_f64());
            s.metrics
                .timings
                .binds
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.into(),
                })
                .inc();
            to_json(&ExtenderBindingResult { error })
        }
        (Method::POST, "webhook") => {
            let started = Instant::now();
            let response = match read_body(req).await.and_then(|b| {
                serde_json::from_slice::<AdmissionReview<Pod>>(&b)
                    .map_err(|e| format!("decoding AdmissionReview: {e}"))
            }) {
                Err(e) => text_response(StatusCode::BAD_REQUEST, &e),
                Ok(review) => to_json(&webhook::review(&s.cfg, review)),
            };
            s.metrics
                .timings
                .webhook
                .observe(started.elapsed().as_secs_f64());
            response
        }
        _ => text_response(StatusCode::NOT_FOUND, "not found"),
    }
}

/// A bound listener serving the routes until the task is dropped.
pub struct Listener {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_connection<I>(
    io: I,
    service: impl hyper::service::Service<
            Request<Incoming>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
            Future = impl Send,
        > + Send
        + 'static,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = conn.await {
        tracing::debug!("connection: {e}");
    }
}

/// Serves the extender/webhook routes on `addr` (port 0: any free port).
pub async fn serve(
    s: Arc<Scheduler>,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<Listener, ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let s = s.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(handle(s, req).await) }
                });
                match tls {
                    None => serve_connection(stream, service).await,
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(tls_stream) => serve_connection(tls_stream, service).await,
                        Err(e) => tracing::debug!("TLS handshake: {e}"),
                    },
                }
            });
        }
    });
    Ok(Listener { addr: local, task })
}

/// Serves `GET /metrics` on `addr`.
pub async fn serve_metrics(s: Arc<Scheduler>, addr: SocketAddr) -> Result<Listener, ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let s = s.clone();
                    async move {
                        Ok::<_, Infallible>(if req.uri().path() == "/metrics" {
                            let mut r = text_response(StatusCode::OK, &s.metrics.render());
                            r.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static(
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                ),
                            );
                            r
                        } else {
                            text_response(StatusCode::NOT_FOUND, "not found")
                        })
                    }
                });
                serve_connection(stream, service).await;
            });
        }
    });
    Ok(Listener { addr: local, task })
}
