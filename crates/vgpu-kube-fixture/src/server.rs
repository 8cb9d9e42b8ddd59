//! HTTP/1.1 front of the emulator: parses Kubernetes API paths
//! (`/api/v1/...`, `/apis/<group>/<version>/...`), query parameters and
//! patch content types, calls the [`Store`](crate::store::Store), and
//! writes objects, lists, `metav1.Status` errors and watch streams (one JSON
//! event per line) the way the API server does. Owns no state of its own.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{
    selected, ApiError, Change, ChangeKind, FieldValidation, PatchType, RequestRecord, Store,
    WriteOpts,
};

pub(crate) type Body = BoxBody<Bytes, Infallible>;
pub(crate) type Shared = Arc<Mutex<Store>>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn error_response(e: &ApiError) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(full(e.status_json().to_string()))
        .unwrap_or_else(|_| Response::new(full("")))
}

/// What a path names.
struct Target {
    def: &'static ResourceDef,
    /// Namespace from the path (`None` = cluster-scoped or all namespaces).
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            ))
        }
    };
    let (ns, plural, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => {
            (Some(ns.to_string()), *plural, tail.first(), tail.get(1))
        }
        [plural, tail @ ..] if !plural.is_empty() => (None, *plural, tail.first(), tail.get(1)),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("no resource at {path}"),
            ))
        }
    };
    let extra = match rest {
        ["namespaces", _, _, tail @ ..] if ns.is_some() => tail.len() > 2,
        [_, tail @ ..] => tail.len() > 2,
        _ => false,
    };
    let def = resources::find(group, version, plural).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    })?;
    if extra || (ns.is_some() && !def.namespaced) {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("no resource at {path}"),
        ));
    }
    Ok(Target {
        def,
        ns,
        name: name.map(|s| s.to_string()),
        sub: sub.map(|s| s.to_string()),
    })
}

struct Query {
    labels: LabelSelector,
    fields: FieldSelector,
    watch: bool,
    resource_version: Option<u64>,
    timeout: Option<Duration>,
    validation: FieldValidation,
}

fn parse_query(q: &str, def: &ResourceDef) -> Result<Query, ApiError> {
    let mut out = Query {
        labels: LabelSelector::default(),
        fields: FieldSelector::default(),
        watch: false,
        resource_version: None,
        timeout: None,
        validation: FieldValidation::Strict,
    };
    for (k, v) in form_urlencoded::parse(q.as_bytes()) {
        match k.as_ref() {
            "labelSelector" => {
                out.labels = LabelSelector::parse(&v).map_err(|e| ApiError::bad_request(e.0))?
            }
            "fieldSelector" => {
                out.fields =
                    FieldSelector::parse(&v, def.fields).map_err(|e| ApiError::bad_request(e.0))?
            }
            "watch" => out.watch = v == "true" || v == "1",
            "resourceVersion" if !v.is_empty() => {
                out.resource_version = Some(v.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resourceVersion {v:?}"))
                })?);
            }
            "timeoutSeconds" => {
                let s: u64 = v
                    .parse()
                    .map_err(|_| ApiError::bad_request("invalid timeoutSeconds"))?;
                out.timeout = Some(Duration::from_secs(s));
            }
            "fieldValidation" => {
                out.validation = match v.as_ref() {
                    "Strict" | "" => FieldValidation::Strict,
                    "Warn" => FieldValidation::Warn,
                    "Ignore" => FieldValidation::Ignore,
                    o => {
                        return Err(ApiError::bad_request(format!(
                            "fieldValidation {o:?} is not Strict, Warn or Ignore"
                        )))
                    }
                }
            }
            "dryRun" => {
                return Err(ApiError::bad_request(
                    "vgpu-kube-fixture does not implement dryRun",
                ))
            }
            "sendInitialEvents" if v == "true" => {
                return Err(ApiError::bad_request(
                    "vgpu-kube-fixture does not implement sendInitialEvents (streaming lists)",
                ))
            }
            // Accepted and ignored: the emulator always serves the latest
            // state, whole, and never sends bookmarks.
            "limit"
            | "continue"
            | "allowWatchBookmarks"
            | "resourceVersionMatch"
            | "fieldManager"
            | "force"
            | "pretty"
            | "propagationPolicy"
            | "gracePeriodSeconds"
            | "sendInitialEvents" => {}
            _ => {}
        }
    }
    Ok(out)
}

fn patch_type(content_type: &str) -> Result<PatchType, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    match ct {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "vgpu-kube-fixture does not implement strategic merge patch; send application/merge-patch+json or application/json-patch+json",
        )),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "vgpu-kube-fixture does not implement server-side apply",
        )),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json"),
        )),
    }
}

fn list_json(def: &ResourceDef, items: Vec<Value>, rv: u64) -> Value {
    json!({
        "kind": def.list_kind,
        "apiVersion": def.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding the request body as JSON: {e}")))
}

/// One request against the store; a watch returns a streaming body.
fn handle(
    state: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    ct: &str,
    body: &[u8],
) -> Result<(u16, Body), ApiError> {
    let seg = path.trim_matches('/');
    if matches!(seg, "healthz" | "readyz" | "livez") {
        return Ok((200, full("ok")));
    }
    if seg == "version" {
        let v = json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-vgpu-kube-fixture", "platform": "linux/amd64"});
        return Ok((200, full(v.to_string())));
    }
    let t = parse_path(path)?;
    let q = parse_query(query, t.def)?;
    let def = t.def;
    let ns = t.ns.clone().unwrap_or_default();
    if def.namespaced && t.ns.is_none() && !(t.name.is_none() && *method == Method::GET) {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!(
                "{} are namespaced: use /namespaces/<ns>/{}",
                def.plural, def.plural
            ),
        ));
    }
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    st.warnings.clear();
    // Warnings are added as headers by `serve`.
    let ok = |code: u16, v: Value, _: &Store| (code, full(v.to_string()));
    match (&t.name, &t.sub, method) {
        (None, None, &Method::GET) if q.watch => {
            let from = q.resource_version.filter(|rv| *rv != 0);
            let ns_filter = t.ns.clone();
            let (rx, past) = match from {
                Some(rv) => st.subscribe_after(rv),
                None => {
                    // No version: current objects as ADDED, then changes.
                    let (rx, _) = st.subscribe_after(st.resource_version());
                    let now: Vec<Arc<Change>> = st
                        .list(def, ns_filter.as_deref(), &q.labels, &q.fields)
                        .into_iter()
                        .map(|o| {
                            Arc::new(Change {
                                rv: 0,
                                resource: def.key(),
                                namespace: String::new(),
                                kind: ChangeKind::Added,
                                object: o,
                                old: None,
                            })
                        })
                        .collect();
                    (rx, Some(now))
                }
            };
            drop(st);
            Ok((200, watch_body(def, ns_filter, q, rx, past)))
        }
        (None, None, &Method::GET) => {
            let items = st.list(def, t.ns.as_deref(), &q.labels, &q.fields);
            let rv = st.resource_version();
            Ok(ok(200, list_json(def, items, rv), &st))
        }
        (None, None, &Method::POST) => {
            let v = st.create(def, &ns, parse_body(body)?, q.validation)?;
            Ok(ok(201, v, &st))
        }
        (Some(name), None, &Method::GET) => Ok(ok(200, st.get(def, &ns, name)?, &st)),
        (Some(name), None, &Method::PUT) => {
            let v = st.replace(
                def,
                &ns,
                name,
                parse_body(body)?,
                WriteOpts::main(q.validation),
            )?;
            Ok(ok(200, v, &st))
        }
        (Some(name), None, &Method::PATCH) => {
            let v = st.patch(
                def,
                &ns,
                name,
                patch_type(ct)?,
                body,
                WriteOpts::main(q.validation),
            )?;
            Ok(ok(200, v, &st))
        }
        (Some(name), None, &Method::DELETE) => {
            let opts = if body.is_empty() {
                None
            } else {
                Some(parse_body(body)?)
            };
            let v = st.delete(def, &ns, name, opts.as_ref())?;
            Ok(ok(200, v, &st))
        }
        (Some(name), Some(sub), m) if sub == "status" && def.has_status => match *m {
            Method::GET => Ok(ok(200, st.get(def, &ns, name)?, &st)),
            Method::PUT => {
                let v = st.replace(
                    def,
                    &ns,
                    name,
                    parse_body(body)?,
                    WriteOpts::status(q.validation),
                )?;
                Ok(ok(200, v, &st))
            }
            Method::PATCH => {
                let v = st.patch(
                    def,
                    &ns,
                    name,
                    patch_type(ct)?,
                    body,
                    WriteOpts::status(q.validation),
                )?;
                Ok(ok(200, v, &st))
            }
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{m} is not allowed on {}/status", def.plural),
            )),
        },
        (Some(name), Some(sub), &Method::POST) if sub == "binding" && def.kind == "Pod" => {
            let v = st.bind(def, &ns, name, &parse_body(body)?)?;
            Ok(ok(201, v, &st))
        }
        (_, Some(sub), _) => Err(ApiError::new(
            404,
            "NotFound",
            format!("{}/{sub} is not served by vgpu-kube-fixture", def.plural),
        )),
        (_, _, m) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not allowed on {path}"),
        )),
    }
}

/// The watch stream: `past` (or a 410 when compacted), then live changes
/// of this resource/namespace that pass the selectors, until the timeout
/// or the client goes away. An object that starts or stops matching the
/// selectors arrives as ADDED/DELETED, as the watch cache sends it.
fn watch_body(
    def: &'static ResourceDef,
    ns: Option<String>,
    q: Query,
    mut rx: broadcast::Receiver<Arc<Change>>,
    past: Option<Vec<Arc<Change>>>,
) -> Body {
    let (tx, out) = mpsc::channel::<Bytes>(256);
    let key = def.key();
    tokio::spawn(async move {
        let line = |kind: &str, obj: &Value| {
            Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})))
        };
        let render = |c: &Change| -> Option<Bytes> {
            if c.resource != key || ns.as_deref().is_some_and(|n| n != c.namespace) {
                return None;
            }
            let now = selected(&c.object, &q.labels, &q.fields);
            let before = c
                .old
                .as_ref()
                .is_some_and(|o| selected(o, &q.labels, &q.fields));
            match c.kind {
                ChangeKind::Added if now => Some(line("ADDED", &c.object)),
                ChangeKind::Deleted if before || now => Some(line("DELETED", &c.object)),
                ChangeKind::Modified if now && before => Some(line("MODIFIED", &c.object)),
                ChangeKind::Modified if now => Some(line("ADDED", &c.object)),
                ChangeKind::Modified if before => Some(line("DELETED", &c.object)),
                _ => None,
            }
        };
        let gone = || {
            let e = ApiError::new(410, "Expired", "too old resource version");
            line("ERROR", &e.status_json())
        };
        let mut last = 0u64;
        match past {
            None => {
                let _ = tx.send(gone()).await;
                return;
            }
            Some(past) => {
                for c in past {
                    last = last.max(c.rv);
                    if let Some(b) = render(&c) {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + q.timeout.unwrap_or(Duration::from_secs(1800));
        loop {
            let c = tokio::select! {
                c = rx.recv() => c,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            };
            match c {
                Ok(c) if c.rv <= last => {}
                Ok(c) => {
                    last = c.rv;
                    if let Some(b) = render(&c) {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx.send(gone()).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    let s = stream::unfold(out, |mut out| async move {
        out.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), out))
    });
    StreamBody::new(s).boxed()
}

/// The hyper service function.
pub(crate) async fn serve(
    state: Shared,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let ct = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let fault = state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_fault(method.as_str(), &path);
    let (code, resp) = match fault {
        Some(code) => {
            let e = ApiError::new(code, "InternalError", format!("injected fault ({code})"));
            (code, error_response(&e))
        }
        None => match handle(&state, &method, &path, &query, &ct, &body) {
            Ok((code, b)) => {
                let r = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
                    .header("content-type", "application/json")
                    .body(b)
                    .unwrap_or_else(|_| Response::new(full("")));
                (code, r)
            }
            Err(e) => (e.code, error_response(&e)),
        },
    };
    let mut resp = resp;
    let warnings = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.requests.push(RequestRecord {
            method: method.to_string(),
            path,
            query,
            content_type: ct,
            status: code,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        std::mem::take(&mut st.warnings)
    };
    for w in warnings {
        if let Ok(v) = format!("299 - \"{w}\"").parse() {
            resp.headers_mut().append("warning", v);
        }
    }
    Ok(resp)
}
