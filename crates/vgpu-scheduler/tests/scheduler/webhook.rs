//! The admission webhook on AdmissionReview v1 bodies as the API server
//! sends them: the JSON patch it answers with, applied to the pod, gives
//! HAMi's mutations; refusals carry a reason; ignored pods pass untouched.

use json_patch::Patch;
use serde_json::{json, Value};
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::webhook::review;

fn admission(pod: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "train-0",
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Runs the webhook; returns (allowed, message, pod after the patch).
fn run(cfg: &SchedulerConfig, pod: Value) -> (bool, String, Value) {
    let body = admission(pod.clone());
    let answer = review(cfg, serde_json::from_value(body).unwrap());
    let answer = serde_json::to_value(&answer).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let resp = &answer["response"];
    assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    let allowed = resp["allowed"].as_bool().unwrap();
    let message = resp["status"]["message"].as_str().unwrap_or("").to_owned();
    let mut out = pod;
    if let Some(p) = resp.get("patch").filter(|p| !p.is_null()) {
        assert_eq!(resp["patchType"], "JSONPatch");
        // Go's []byte: a base64 string, as the API documents it.
        let bytes: Vec<u8> = match p {
            Value::String(s) => base64_decode(s),
            other => panic!("patch must be a base64 string, is {other}"),
        };
        let patch: Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut out, &patch).unwrap();
    }
    (allowed, message, out)
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    assert_eq!(s.len() % 4, 0, "padded standard base64: {s}");
    for c in s.trim_end_matches('=').bytes() {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn gpu_pod(containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {"containers": containers}
    })
}

fn env(ctr: &Value, name: &str) -> Option<String> {
    ctr["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap().to_owned())
}

#[test]
fn hamis_mutations() {
    let cfg = SchedulerConfig {
        gpu_core_policy: "force".into(),
        ..SchedulerConfig::default()
    };
    let pod = gpu_pod(json!([
        {"name": "mem-only", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": "3000", "nvidia.com/priority": "0"}}},
        {"name": "whole", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "web", "image": "x", "env": [{"name": "KEEP", "value": "1"}]}
    ]));
    let (allowed, _, out) = run(&cfg, pod);
    assert!(allowed);
    let spec = &out["spec"];
    assert_eq!(spec["schedulerName"], "hami-scheduler");
    let c = &spec["containers"];
    // Memory alone implies one GPU; priority becomes CUDA_TASK_PRIORITY.
    assert_eq!(c[0]["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(env(&c[0], "CUDA_TASK_PRIORITY").as_deref(), Some("0"));
    assert_eq!(
        env(&c[0], "GPU_CORE_UTILIZATION_POLICY").as_deref(),
        Some("force")
    );
    assert_eq!(c[0]["resources"]["limits"].get("nvidia.com/gpucores"), None);
    // A whole card without a core request is exclusive.
    assert_eq!(c[1]["resources"]["limits"]["nvidia.com/gpucores"], "100");
    // A container without GPUs is left alone.
    assert_eq!(c[2]["env"], json!([{"name": "KEEP", "value": "1"}]));
    assert_eq!(c[2].get("resources"), None);
}

#[test]
fn refusals_carry_reasons() {
    let cfg = SchedulerConfig::default();
    let privileged = gpu_pod(json!([
        {"name": "main", "image": "x", "securityContext": {"privileged": true}, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]));
    let (allowed, message, _) = run(&cfg, privileged);
    assert!(!allowed);
    assert_eq!(message, "container \"main\" is privileged: a privileged container sees every GPU, so a GPU pod may not have one");
    let cases = [
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "120"}),
            "container \"main\": nvidia.com/gpucores is 120, must be at most 100",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-3"}),
            "container \"main\": nvidia.com/gpumem is -3, must not be negative",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}),
            "container \"main\": nvidia.com/gpumem-percentage is 150, must be at most 100",
        ),
    ];
    for (limits, want) in cases {
        let (allowed, message, _) = run(
            &cfg,
            gpu_pod(json!([{"name": "main", "image": "x", "resources": {"limits": limits}}])),
        );
        assert!(!allowed);
        assert_eq!(message, want);
    }
    let mut bound = gpu_pod(
        json!([{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    );
    bound["spec"]["nodeName"] = json!("gpu-1");
    let (allowed, message, _) = run(&cfg, bound);
    assert!(!allowed);
    assert!(message.contains("spec.nodeName"), "{message}");
    let (allowed, message, _) = run(&cfg, gpu_pod(json!([])));
    assert!(!allowed);
    assert_eq!(message, "pod has no containers");
    // A privileged container without GPUs in a pod without GPUs is fine.
    let (allowed, _, _) = run(
        &cfg,
        gpu_pod(json!([{"name": "main", "image": "x", "securityContext": {"privileged": true}}])),
    );
    assert!(allowed);
}

#[test]
fn ignored_and_foreign_pods_pass_untouched() {
    let cfg = SchedulerConfig::default();
    let mut ignored = gpu_pod(
        json!([{"name": "main", "image": "x", "securityContext": {"privileged": true},
        "resources": {"limits": {"nvidia.com/gpumem": "1"}}}]),
    );
    ignored["metadata"]["labels"] = json!({"hami.io/webhook": "ignore"});
    let (allowed, _, out) = run(&cfg, ignored.clone());
    assert!(allowed);
    assert_eq!(out, ignored, "no patch for an ignored pod");
    let mut foreign = gpu_pod(
        json!([{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    );
    foreign["spec"]["schedulerName"] = json!("volcano");
    let (allowed, _, out) = run(&cfg, foreign.clone());
    assert!(allowed);
    assert_eq!(out, foreign);
    // default-scheduler is taken over unless told not to.
    let mut default = foreign.clone();
    default["spec"]["schedulerName"] = json!("default-scheduler");
    let (_, _, out) = run(&cfg, default.clone());
    assert_eq!(out["spec"]["schedulerName"], "hami-scheduler");
    let keep = SchedulerConfig {
        force_overwrite_default_scheduler: false,
        ..SchedulerConfig::default()
    };
    let (_, _, out) = run(&keep, default.clone());
    assert_eq!(out["spec"]["schedulerName"], "default-scheduler");
    // A pod without GPUs is not moved to our scheduler.
    let web = gpu_pod(json!([{"name": "web", "image": "x"}]));
    let (allowed, _, out) = run(&cfg, web.clone());
    assert!(allowed);
    assert_eq!(out, web);
}

#[test]
fn init_containers_and_defaults() {
    let cfg = SchedulerConfig {
        runtime_class_name: "nvidia".into(),
        overwrite_env: true,
        ..SchedulerConfig::default()
    };
    let mut pod = gpu_pod(json!([{"name": "main", "image": "x"}]));
    pod["spec"]["initContainers"] = json!([{"name": "prep", "image": "x", "resources": {"limits": {"nvidia.com/gpucores": "20"}}}]);
    let (allowed, _, out) = run(&cfg, pod);
    assert!(allowed);
    assert_eq!(
        out["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
    assert_eq!(out["spec"]["runtimeClassName"], "nvidia");
    assert_eq!(
        env(&out["spec"]["containers"][0], "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("none")
    );
}

#[test]
fn a_v1beta1_review_is_answered_in_v1beta1() {
    // HAMi's chart registers the webhook with admissionReviewVersions: [v1beta1].
    let mut body = admission(gpu_pod(
        json!([{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    ));
    body["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let answer = serde_json::to_value(review(
        &SchedulerConfig::default(),
        serde_json::from_value(body).unwrap(),
    ))
    .unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
}

#[test]
fn the_patch_is_a_base64_string() {
    let body = admission(gpu_pod(
        json!([{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": "1024"}}}]),
    ));
    let answer = review(
        &SchedulerConfig::default(),
        serde_json::from_value(body).unwrap(),
    );
    let patch = &answer["response"]["patch"];
    let s = patch.as_str().unwrap_or_else(|| panic!("patch is {patch}"));
    let ops: Value = serde_json::from_slice(&base64_decode(s)).unwrap();
    assert!(ops.as_array().is_some_and(|a| !a.is_empty()), "{ops}");
}

#[test]
fn a_pod_the_api_server_defaulted_is_taken_over() {
    // The API server defaults every field before mutating webhooks run:
    // schedulerName is `default-scheduler`, never empty, by the time we see
    // the pod. HAMi's rule: default-scheduler is ours to overwrite (with
    // --force-overwrite-default-scheduler, on by default) for a GPU pod.
    let mut pod = gpu_pod(json!([{
        "name": "main", "image": "x", "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}}
    }]));
    let spec = pod["spec"].as_object_mut().unwrap();
    spec.insert("schedulerName".into(), json!("default-scheduler"));
    spec.insert("restartPolicy".into(), json!("Always"));
    spec.insert("dnsPolicy".into(), json!("ClusterFirst"));
    spec.insert("enableServiceLinks".into(), json!(true));
    spec.insert("priority".into(), json!(0));
    spec.insert("terminationGracePeriodSeconds".into(), json!(30));
    let (allowed, _, out) = run(&SchedulerConfig::default(), pod.clone());
    assert!(allowed);
    assert_eq!(out["spec"]["schedulerName"], "hami-scheduler");
    // The other defaults are left as they were.
    assert_eq!(out["spec"]["restartPolicy"], "Always");
    assert_eq!(out["spec"]["dnsPolicy"], "ClusterFirst");
    // A defaulted pod without GPUs stays with the default scheduler.
    let mut web = pod.clone();
    web["spec"]["containers"][0]["resources"] = json!({});
    let (allowed, _, out) = run(&SchedulerConfig::default(), web.clone());
    assert!(allowed);
    assert_eq!(out, web);
}
