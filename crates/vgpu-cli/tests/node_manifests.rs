//! The Helm chart (`deploy/helm/vgpu`) without Helm: its templates use only
//! `{{ .Values.x }}`, `{{ .Release.Name }}`, `{{ .Release.Namespace }}`,
//! `| quote` and `toYaml … | nindent N` (except `webhook.yaml`, Helm-only:
//! conditionals and generated certificates; the e2e tests render the whole
//! chart with the real helm and apply it to a real API server); this test
//! renders them (refusing anything else), decodes every object into its k8s-openapi type with
//! unknown fields refused, and requires exactly the objects `vgpu node
//! manifests` prints for the same values — the defaults and a changed set.
//! The agent's arguments in the DaemonSet are accepted by `vgpu node`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;
use vgpu_kube_fixture::normalize_strict;
use vgpu_node::manifests::{KubeSchedulerConfiguration, Values};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/vgpu")
}

fn lookup<'a>(v: &'a Value, path: &str) -> Result<&'a Value, String> {
    let mut cur = v;
    for part in path.split('.') {
        cur = cur.get(part).ok_or_else(|| format!("no value {path}"))?;
    }
    Ok(cur)
}

fn scalar(v: &Value) -> Result<String, String> {
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && n.as_i64().is_some() || n.is_u64() => n.to_string(),
            Some(f) if f.fract() == 0.0 => format!("{}", f as i64),
            Some(f) => format!("{f}"),
            None => n.to_string(),
        },
        other => return Err(format!("{other} is not a scalar")),
    })
}

/// The template subset this chart may use.
fn eval(action: &str, values: &Value, release: (&str, &str)) -> Result<String, String> {
    let parts: Vec<&str> = action.split('|').map(str::trim).collect();
    let operand = |s: &str| -> Result<&Value, String> {
        s.strip_prefix(".Values.")
            .map(|p| lookup(values, p))
            .ok_or_else(|| format!("unsupported operand {s:?}"))?
    };
    match parts.as_slice() {
        [".Release.Name"] => Ok(release.0.to_owned()),
        [".Release.Namespace"] => Ok(release.1.to_owned()),
        [x] => scalar(operand(x)?),
        [x, "quote"] => Ok(serde_json::to_string(&scalar(operand(x)?)?).unwrap()),
        [x, n] if x.starts_with("toYaml ") && n.starts_with("nindent ") => {
            let v = operand(x.trim_start_matches("toYaml ").trim())?;
            let width: usize = n["nindent ".len()..]
                .trim()
                .parse()
                .map_err(|_| format!("bad nindent in {action:?}"))?;
            let yaml = serde_saphyr::to_string(v).map_err(|e| e.to_string())?;
            let pad = " ".repeat(width);
            Ok(yaml.lines().map(|l| format!("\n{pad}{l}")).collect())
        }
        _ => Err(format!(
            "template action {action:?} is outside the subset the chart may use"
        )),
    }
}

fn render(tpl: &str, values: &Value, release: (&str, &str)) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = tpl;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after.find("}}").ok_or("unclosed {{")?;
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix('-') {
            action = a;
            let trimmed = out.trim_end().len();
            out.truncate(trimmed);
        }
        let trim_right = action.ends_with('-');
        if trim_right {
            action = &action[..action.len() - 1];
        }
        out.push_str(&eval(action.trim(), values, release)?);
        rest = &after[end + 2..];
        if trim_right {
            rest = rest.trim_start();
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// An object as its type keeps it (unknown fields refused); the scheduler
/// config inside the ConfigMap decoded as component config.
fn normalize(v: &Value) -> Value {
    let kind = v["kind"].as_str().unwrap_or("");
    let mut n = match kind {
        "ServiceAccount" => normalize_strict::<ServiceAccount>(v),
        "ClusterRole" => normalize_strict::<ClusterRole>(v),
        "ClusterRoleBinding" => normalize_strict::<ClusterRoleBinding>(v),
        "DaemonSet" => normalize_strict::<DaemonSet>(v),
        "Deployment" => normalize_strict::<Deployment>(v),
        "Service" => normalize_strict::<Service>(v),
        "ConfigMap" => normalize_strict::<ConfigMap>(v),
        k => Err(format!("unexpected kind {k:?}")),
    }
    .unwrap_or_else(|e| panic!("{kind} {}: {e}", v["metadata"]["name"]));
    if kind == "ConfigMap" {
        let text = n["data"]["config.yaml"]
            .as_str()
            .expect("config.yaml")
            .to_owned();
        let cfg: KubeSchedulerConfiguration = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("scheduler config: {e}\n{text}"));
        n["data"]["config.yaml"] = serde_json::to_value(cfg).unwrap();
    }
    n
}

fn keyed(objs: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut m = BTreeMap::new();
    for o in objs {
        let n = normalize(o);
        let k = (
            n["kind"].as_str().unwrap().to_owned(),
            n["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        assert!(m.insert(k.clone(), n).is_none(), "{k:?} twice");
    }
    m
}

/// The template the subset renderer leaves to Helm (and to e2e/).
const HELM_ONLY: &str = "webhook.yaml";

fn rendered_chart(values: &Value, release: (&str, &str)) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // The one Helm-only template; anything else new must stay in the subset.
    files.retain(|f| f.file_name().is_some_and(|n| n != HELM_ONLY));
    let mut docs = Vec::new();
    for f in files {
        let tpl = std::fs::read_to_string(&f).unwrap();
        let text = render(&tpl, values, release).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut d: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", f.display()));
        docs.append(&mut d);
    }
    docs
}

fn vgpu_manifests(values_file: Option<&Path>, release: (&str, &str)) -> Vec<Value> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    c.args([
        "node",
        "manifests",
        "--json",
        "--release",
        release.0,
        "--namespace",
        release.1,
    ]);
    if let Some(f) = values_file {
        c.arg("--values").arg(f);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn same_objects(values: &Values, values_file: Option<&Path>) {
    let release = ("vgpu", "gpu-system");
    let v = serde_json::to_value(values).unwrap();
    let chart = keyed(&rendered_chart(&v, release));
    let cli = keyed(&vgpu_manifests(values_file, release));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        cli.keys().collect::<Vec<_>>()
    );
    for (k, o) in &chart {
        assert_eq!(
            o, &cli[k],
            "{k:?} differs between the chart and `vgpu node manifests`"
        );
    }
    // The agent accepts its own arguments.
    let ds = &chart[&("DaemonSet".to_string(), "vgpu-vgpu-node".to_string())];
    let args: Vec<String> =
        serde_json::from_value(ds["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap();
    assert_eq!(args[0], "node");
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(&args)
        .args(["--node-name", "n", "--check"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vgpu refuses the chart's arguments {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        ds["spec"]["template"]["spec"]["hostPID"],
        values.device_plugin.host_pid
    );
}

#[test]
fn values_yaml_is_the_defaults() {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let v: Values = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(v, Values::default());
    let chart_yaml = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    assert!(chart_yaml.contains(&format!("version: {}", env!("CARGO_PKG_VERSION"))));
}

#[test]
fn chart_renders_the_objects_vgpu_prints_with_default_values() {
    same_objects(&Values::default(), None);
}

#[test]
fn chart_renders_the_objects_vgpu_prints_with_changed_values() {
    let mut v = Values::default();
    v.device_plugin.device_split_count = 4;
    v.device_plugin.device_memory_scaling = 1.5;
    v.device_plugin.device_core_scaling = 2.0;
    v.device_plugin.disablecorelimit = "true".into();
    v.device_plugin.lib_path = "/opt/vgpu".into();
    v.device_plugin.enforce = "kill".into();
    v.device_plugin.priority_hold = "none".into();
    v.device_plugin.enable_numa_topology = true;
    v.device_plugin.device_list_strategy = "volume-mounts,cdi-cri".into();
    v.device_plugin.nvidia_node_selector = BTreeMap::from([
        ("nvidia.com/gpu.present".into(), "true".into()),
        ("pool".into(), "a".into()),
    ]);
    v.global.gpu_hook_path = "/var/lib/vgpu-hook".into();
    v.scheduler_name = "vgpu-scheduler".into();
    v.legacy_metrics = true;
    v.scheduler.replicas = 2;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    std::fs::write(&f, serde_saphyr::to_string(&v).unwrap()).unwrap();
    same_objects(&v, Some(&f));
}

#[test]
fn the_helm_only_template_exists_and_is_the_only_one() {
    // A renamed webhook template would silently drop out of both tests.
    let t = std::fs::read_to_string(chart().join("templates").join(HELM_ONLY)).unwrap();
    assert!(t.contains("kind: MutatingWebhookConfiguration"));
}

#[test]
fn the_renderer_refuses_what_the_chart_may_not_use() {
    let v = serde_json::to_value(Values::default()).unwrap();
    for bad in [
        "{{ if .Values.legacyMetrics }}",
        "{{ include \"x\" . }}",
        "{{ .Values.nope }}",
        "{{ .Chart.Name }}",
    ] {
        assert!(render(bad, &v, ("a", "b")).is_err(), "{bad}");
    }
    // And the strict decoding catches a misspelt field.
    let typo = serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"hostPid": true, "containers": []}}}});
    assert!(normalize_strict::<DaemonSet>(&typo)
        .unwrap_err()
        .contains("spec.template.spec.hostPid"));
}

#[test]
fn the_scheduler_serves_https_beyond_localhost() {
    // A kube-scheduler in another pod and the API server (the webhook)
    // must reach the extender: it listens on every interface with TLS from
    // the mounted secret, and the kube-scheduler beside it speaks HTTPS.
    let v = serde_json::to_value(Values::default()).unwrap();
    let objs = keyed(&rendered_chart(&v, ("vgpu", "gpu-system")));
    let dep = &objs[&("Deployment".to_string(), "vgpu-vgpu-scheduler".to_string())];
    let spec = &dep["spec"]["template"]["spec"];
    let ctr = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "vgpu-scheduler")
        .unwrap();
    let args: Vec<String> = serde_json::from_value(ctr["args"].clone()).unwrap();
    assert!(
        args.contains(&"--http_bind=0.0.0.0:443".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--cert_file=/tls/tls.crt".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--key_file=/tls/tls.key".to_string()),
        "{args:?}"
    );
    assert_eq!(ctr["volumeMounts"][0]["mountPath"], "/tls");
    let tls = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    assert_eq!(tls["secret"]["secretName"], "vgpu-vgpu-scheduler-tls");
    let cm = &objs[&("ConfigMap".to_string(), "vgpu-vgpu-scheduler".to_string())];
    // keyed() has decoded the component config already.
    let cfg: KubeSchedulerConfiguration =
        serde_json::from_value(cm["data"]["config.yaml"].clone()).unwrap();
    let ext = &cfg.extenders[0];
    assert_eq!(ext.url_prefix, "https://127.0.0.1:443");
    assert!(ext.enable_https && ext.tls_config.insecure);
}
