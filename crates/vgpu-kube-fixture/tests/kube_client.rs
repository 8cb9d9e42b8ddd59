//! The emulator driven by a real `kube::Client`: every API behaviour the
//! node agent and the scheduler rely on, including the failures.
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Binding, Event, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Error};
use serde_json::json;
use vgpu_kube_fixture::ApiFixture;

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .unwrap()
}

fn code(e: Error) -> u16 {
    match e {
        Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn create_get_list_with_selectors() {
    let fx = ApiFixture::start();
    let pods: Api<Pod> = Api::namespaced(fx.client(), "ns1");
    let p = pods
        .create(&PostParams::default(), &pod("a", json!({"app": "web"})))
        .await
        .unwrap();
    assert_eq!(p.metadata.namespace.as_deref(), Some("ns1"));
    assert!(p.metadata.uid.is_some() && p.metadata.resource_version.is_some());
    // Defaulted as the API server does before admission.
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
        Some("default-scheduler")
    );
    // The pod strategy resets status on create.
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    pods.create(&PostParams::default(), &pod("b", json!({"app": "db"})))
        .await
        .unwrap();
    let other: Api<Pod> = Api::namespaced(fx.client(), "ns2");
    let mut c = pod("c", json!({"app": "web"}));
    c.spec.as_mut().unwrap().node_name = Some("node-1".into());
    other.create(&PostParams::default(), &c).await.unwrap();

    assert_eq!(
        code(
            pods.create(&PostParams::default(), &pod("a", json!({})))
                .await
                .unwrap_err()
        ),
        409
    );
    assert_eq!(
        pods.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );
    assert_eq!(code(pods.get("zz").await.unwrap_err()), 404);

    let all: Api<Pod> = Api::all(fx.client());
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap()),
        ["a", "b", "c"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().labels("app in (db),!tier"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("spec.nodeName=node-1"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName="))
                .await
                .unwrap()
        ),
        ["a", "b"]
    );
    assert_eq!(
        code(
            all.list(&ListParams::default().fields("spec.bogus=1"))
                .await
                .unwrap_err()
        ),
        400
    );
}

#[tokio::test]
async fn unknown_fields_and_wrong_types_are_refused() {
    let fx = ApiFixture::start();
    let client = fx.client();
    let req = |body: serde_json::Value| {
        http::Request::post("/api/v1/namespaces/default/pods")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap()
    };
    let typo = json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"},
        "spec":{"containers":[{"name":"c","resources":{"limit":{"nvidia.com/gpu":"1"}}}]}});
    let e = client.request::<Pod>(req(typo)).await.unwrap_err();
    let Error::Api(s) = e else { panic!() };
    assert_eq!(s.code, 400);
    assert!(
        s.message
            .contains("unknown field \"spec.containers[0].resources.limit\""),
        "{}",
        s.message
    );
    let wrong = json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"},"spec":{"containers":{"name":"c"}}});
    assert_eq!(
        code(client.request::<Pod>(req(wrong)).await.unwrap_err()),
        400
    );
    let other_kind = json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"x"}});
    assert_eq!(
        code(client.request::<Pod>(req(other_kind)).await.unwrap_err()),
        400
    );
    // Nothing was stored by the refusals.
    assert!(fx.list::<Pod>().is_empty());
    // An unknown field in a patch result is refused too.
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("y", json!({})))
        .await
        .unwrap();
    let bad = Patch::Merge(json!({"metadata": {"annotationz": {"a": "b"}}}));
    assert_eq!(
        code(
            pods.patch("y", &PatchParams::default(), &bad)
                .await
                .unwrap_err()
        ),
        400
    );
}

#[tokio::test]
async fn patches_and_resource_version_conflicts() {
    let fx = ApiFixture::start();
    let nodes: Api<Node> = Api::all(fx.client());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    let n = nodes.create(&PostParams::default(), &n).await.unwrap();
    let rv = n.metadata.resource_version.clone().unwrap();

    // Merge patch guarded by the current version (HAMi's node lock).
    let lock =
        json!({"metadata": {"annotations": {"hami.io/mutex.lock": "x"}, "resourceVersion": rv}});
    let n2 = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&lock))
        .await
        .unwrap();
    assert_ne!(n2.metadata.resource_version.as_deref(), Some(rv.as_str()));
    // The same patch again carries a stale version: conflict, nothing changes.
    let again =
        json!({"metadata": {"annotations": {"hami.io/mutex.lock": "y"}, "resourceVersion": rv}});
    assert_eq!(
        code(
            nodes
                .patch("n1", &PatchParams::default(), &Patch::Merge(&again))
                .await
                .unwrap_err()
        ),
        409
    );
    let cur = nodes.get("n1").await.unwrap();
    assert_eq!(
        cur.metadata.annotations.as_ref().unwrap()["hami.io/mutex.lock"],
        "x"
    );
    // Unguarded merge patch: null deletes a key.
    let release = json!({"metadata": {"annotations": {"hami.io/mutex.lock": null}}});
    let n3 = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert!(n3.metadata.annotations.unwrap_or_default().is_empty());

    // JSON patch, with a failing test op.
    // (kube's Patch::Json needs its jsonpatch feature; send the request as is.)
    let client = fx.client();
    let json_patch = |ops: serde_json::Value| {
        http::Request::patch("/api/v1/nodes/n1")
            .header("content-type", "application/json-patch+json")
            .body(serde_json::to_vec(&ops).unwrap())
            .unwrap()
    };
    let n4: Node = client
        .request(json_patch(
            json!([{"op": "add", "path": "/metadata/labels", "value": {"gpu": "on"}}]),
        ))
        .await
        .unwrap();
    assert_eq!(n4.metadata.labels.unwrap()["gpu"], "on");
    let failing = json!([
        {"op": "test", "path": "/metadata/labels/gpu", "value": "off"},
        {"op": "remove", "path": "/metadata/labels/gpu"}
    ]);
    assert_eq!(
        code(
            client
                .request::<Node>(json_patch(failing))
                .await
                .unwrap_err()
        ),
        422
    );
    assert_eq!(
        nodes.get("n1").await.unwrap().metadata.labels.unwrap()["gpu"],
        "on"
    );

    // Replace: stale version 409, missing version 422, current version ok.
    let mut stale = n2.clone();
    stale.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    assert_eq!(
        code(
            nodes
                .replace("n1", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    stale.metadata.resource_version = None;
    assert_eq!(
        code(
            nodes
                .replace("n1", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        422
    );
    let mut fresh = nodes.get("n1").await.unwrap();
    fresh.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    nodes
        .replace("n1", &PostParams::default(), &fresh)
        .await
        .unwrap();

    // Strategic merge and apply are refused clearly.
    let e = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err();
    let Error::Api(s) = e else { panic!() };
    assert_eq!(s.code, 415);
    assert!(s.message.contains("strategic merge"), "{}", s.message);
}

#[tokio::test]
async fn status_subresource_binding_and_immutable_spec() {
    let fx = ApiFixture::start();
    let pods: Api<Pod> = Api::namespaced(fx.client(), "default");
    pods.create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap();
    // A main-resource patch cannot change status...
    let s = Patch::Merge(json!({"status": {"phase": "Running"}}));
    let p = pods.patch("p", &PatchParams::default(), &s).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    // ...the status subresource can.
    let p = pods
        .patch_status("p", &PatchParams::default(), &s)
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));
    // spec.nodeName only through binding.
    let nn = Patch::Merge(json!({"spec": {"nodeName": "n1"}}));
    assert_eq!(
        code(
            pods.patch("p", &PatchParams::default(), &nn)
                .await
                .unwrap_err()
        ),
        422
    );
    let b = Binding {
        metadata: ObjectMeta {
            name: Some("p".into()),
            annotations: Some(
                [("hami.io/bind-phase".to_string(), "allocating".to_string())].into(),
            ),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..ObjectReference::default()
        },
    };
    let st: kube::core::Status = pods
        .create_subresource("binding", "p", &PostParams::default(), &b)
        .await
        .unwrap();
    assert_eq!(st.code, 201);
    let p = pods.get("p").await.unwrap();
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(
        p.metadata.annotations.unwrap()["hami.io/bind-phase"],
        "allocating"
    );
    let conds = p.status.unwrap().conditions.unwrap();
    assert!(conds
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True"));
    let e = pods
        .create_subresource::<_, kube::core::Status>("binding", "p", &PostParams::default(), &b)
        .await
        .unwrap_err();
    assert_eq!(code(e), 409);
    // Image changes are allowed.
    let img =
        Patch::Merge(json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}));
    pods.patch("p", &PatchParams::default(), &img)
        .await
        .unwrap();
}

#[tokio::test]
async fn delete_with_preconditions() {
    let fx = ApiFixture::start();
    let pods: Api<Pod> = Api::namespaced(fx.client(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("d", json!({})))
        .await
        .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(code(pods.delete("d", &wrong).await.unwrap_err()), 409);
    let right = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("d", &right).await.unwrap();
    assert_eq!(code(pods.get("d").await.unwrap_err()), 404);
    assert_eq!(
        code(
            pods.delete("d", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        404
    );
}

async fn next_event(
    s: &mut (impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
) -> (String, String) {
    let e = tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap();
    match e {
        WatchEvent::Added(p) => ("ADDED".into(), p.metadata.name.unwrap()),
        WatchEvent::Modified(p) => ("MODIFIED".into(), p.metadata.name.unwrap()),
        WatchEvent::Deleted(p) => ("DELETED".into(), p.metadata.name.unwrap()),
        WatchEvent::Bookmark(_) => ("BOOKMARK".into(), String::new()),
        WatchEvent::Error(e) => ("ERROR".into(), e.code.to_string()),
    }
}

#[tokio::test]
async fn watch_from_a_version_with_selectors() {
    let fx = ApiFixture::start();
    let client = fx.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("old", json!({"gpu": "yes"})))
        .await
        .unwrap();
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let all: Api<Pod> = Api::all(client);
    let mut w = all
        .watch(&WatchParams::default().labels("gpu=yes").timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod("a", json!({"gpu": "yes"})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", json!({"gpu": "no"})))
        .await
        .unwrap();
    let relabel = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"gpu": v}}}));
    pods.patch("b", &PatchParams::default(), &relabel("yes"))
        .await
        .unwrap();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"k": "v"}}})),
    )
    .await
    .unwrap();
    pods.patch("a", &PatchParams::default(), &relabel("no"))
        .await
        .unwrap();
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    let want = [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("DELETED", "b"),
    ];
    for (t, n) in want {
        assert_eq!(next_event(&mut w).await, (t.to_string(), n.to_string()));
    }
    // Without a version: current objects first.
    let mut w0 = all
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        next_event(&mut w0).await,
        ("ADDED".to_string(), "a".to_string())
    );
    assert_eq!(
        next_event(&mut w0).await,
        ("ADDED".to_string(), "old".to_string())
    );
    // After compaction an old version is gone.
    fx.compact();
    let mut wg = all
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        next_event(&mut wg).await,
        ("ERROR".to_string(), "410".to_string())
    );
}

#[tokio::test]
async fn events_field_selectors_faults_and_request_log() {
    let fx = ApiFixture::start();
    let events: Api<Event> = Api::namespaced(fx.client(), "default");
    let ev: Event = serde_json::from_value(json!({
        "metadata": {"generateName": "gpu-"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "w1"},
        "reason": "VgpuOverLimit", "type": "Warning", "message": "killed"
    }))
    .unwrap();
    let created = events.create(&PostParams::default(), &ev).await.unwrap();
    assert!(created.metadata.name.unwrap().starts_with("gpu-"));
    let mut other = ev.clone();
    other.involved_object.name = Some("w2".into());
    events.create(&PostParams::default(), &other).await.unwrap();
    let l = events
        .list(&ListParams::default().fields("involvedObject.name=w1,reason=VgpuOverLimit"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);

    // (kube's client retries 429/503/504 on its own: use 500.)
    fx.fail_next(Some("GET"), "/events", 500, 1);
    assert_eq!(
        code(events.list(&ListParams::default()).await.unwrap_err()),
        500
    );
    assert_eq!(
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let log = fx.requests();
    assert!(log.iter().any(|r| r.method == "POST"
        && r.path == "/api/v1/namespaces/default/events"
        && r.status == 201));
    assert_eq!(log.iter().filter(|r| r.status == 500).count(), 1);
}

#[tokio::test]
async fn direct_store_access_matches_the_api() {
    let fx = ApiFixture::start();
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "10"}}}),
    )
    .unwrap();
    fx.create(&node).unwrap();
    let nodes: Api<Node> = Api::all(fx.client());
    let got = nodes.get("n").await.unwrap();
    assert_eq!(
        got.status.unwrap().allocatable.unwrap()["nvidia.com/gpu"].0,
        "10"
    );
    fx.create(&pod("q", json!({}))).unwrap();
    fx.set_status::<Pod>("default", "q", json!({"phase": "Running"}))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(fx.client(), "default");
    assert_eq!(
        pods.get("q")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
    let lst: Vec<Pod> = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(lst.len(), 1);
    assert!(fx.delete::<Pod>("default", "q"));
    assert!(fx.get::<Pod>("default", "q").is_none());
    let _ = pods
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await;
}
