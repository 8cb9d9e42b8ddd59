//! The Helm chart (`deploy/helm/vgpu`) without Helm: its templates, except
//! the Helm-only ones (`HELM_ONLY`: names computed as HAMi's chart computes
//! them, generated certificates; the e2e tests render the whole chart with
//! the real helm and apply it to a real API server), use a small subset of
//! Go templates: `{{ .Values.x }}`, `index .Values "a" "b"`,
//! `.Release.Name`, `.Release.Namespace`, `.Capabilities.KubeVersion.Version`,
//! the pipes `quote`, `default X`, `nindent N`, the functions `toYaml`,
//! `regexReplaceAll`, `not`, `eq`, and `if`/`else`/`end` and `range`
//! (over a list, or `$k, $v :=` over a map). This test renders them
//! (refusing anything else) with Go's trim and truth rules, decodes every
//! object into its k8s-openapi type with unknown fields refused, and
//! requires exactly the objects `vgpu node manifests` prints for the same
//! values — the defaults, a changed set, and a HAMi v2.10 values file
//! (e2e/testdata/hami-v2.10-values.yaml) merged over the defaults as Helm
//! merges it. The agent's arguments in the DaemonSet are accepted by
//! `vgpu node`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::{json, Value};
use vgpu_kube_fixture::normalize_strict;
use vgpu_node::manifests::{
    merge_values, KubeSchedulerConfiguration, Values, DEFAULT_KUBE_VERSION,
};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/vgpu")
}

fn hami_values_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/testdata/hami-v2.10-values.yaml")
}

/// What a template sees besides `.Values`.
struct Env<'a> {
    release: &'a str,
    namespace: &'a str,
    kube_version: &'a str,
}

fn lookup<'a>(v: &'a Value, path: &[&str]) -> Result<&'a Value, String> {
    let mut cur = v;
    for part in path {
        cur = cur
            .get(part)
            .ok_or_else(|| format!("no value {}", path.join(".")))?;
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

/// Go templates' truth: false, 0, nil and empty things are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Words of an action, a quoted Go string kept whole (and unescaped).
fn words(action: &str) -> Result<Vec<(String, bool)>, String> {
    let mut out = Vec::new();
    let mut chars = action.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('\\') => s.push('\\'),
                        Some('"') => s.push('"'),
                        Some('n') => s.push('\n'),
                        other => return Err(format!("escape {other:?} in {action:?}")),
                    },
                    Some(c) => s.push(c),
                    None => return Err(format!("unclosed string in {action:?}")),
                }
            }
            out.push((s, true));
        } else {
            let mut s = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                s.push(c);
                chars.next();
            }
            out.push((s, false));
        }
    }
    Ok(out)
}

struct Scope<'a> {
    values: &'a Value,
    env: &'a Env<'a>,
    dot: Option<Value>,
    vars: BTreeMap<String, Value>,
}

impl Scope<'_> {
    fn operand(&self, w: &(String, bool)) -> Result<Value, String> {
        let (s, quoted) = w;
        if *quoted {
            return Ok(Value::String(s.clone()));
        }
        match s.as_str() {
            ".Release.Name" => Ok(json!(self.env.release)),
            ".Release.Namespace" => Ok(json!(self.env.namespace)),
            ".Capabilities.KubeVersion.Version" => Ok(json!(self.env.kube_version)),
            "." => self.dot.clone().ok_or_else(|| "`.` outside range".into()),
            v if v.starts_with('$') => self
                .vars
                .get(v)
                .cloned()
                .ok_or_else(|| format!("unknown variable {v}")),
            p => match p.strip_prefix(".Values.") {
                Some(path) => lookup(self.values, &path.split('.').collect::<Vec<_>>()).cloned(),
                None => Err(format!("unsupported operand {p:?}")),
            },
        }
    }

    /// One command of a pipeline; `input` is the previous command's value.
    fn command(&self, ws: &[(String, bool)], input: Option<Value>) -> Result<Value, String> {
        let name = ws.first().map(|w| (w.0.as_str(), w.1));
        let one = |i: usize| -> Result<Value, String> {
            self.operand(ws.get(i).ok_or("missing argument")?)
        };
        let arity = |n: usize| -> Result<(), String> {
            if ws.len() + usize::from(input.is_some()) == n + 1 {
                Ok(())
            } else {
                Err(format!("wrong arguments in {ws:?}"))
            }
        };
        let last = |i: usize| -> Result<Value, String> {
            match &input {
                Some(v) => Ok(v.clone()),
                None => one(i),
            }
        };
        match name {
            Some(("quote", false)) => {
                arity(1)?;
                Ok(Value::String(
                    serde_json::to_string(&scalar(&last(1)?)?).unwrap(),
                ))
            }
            Some(("default", false)) => {
                arity(2)?;
                let fallback = one(1)?;
                let given = last(2)?;
                Ok(if truthy(&given) { given } else { fallback })
            }
            Some(("nindent", false)) => {
                arity(2)?;
                let width: usize = ws[1].0.parse().map_err(|_| format!("bad nindent {ws:?}"))?;
                let text = last(2)?;
                let text = text.as_str().ok_or("nindent of a non-string")?;
                let pad = " ".repeat(width);
                Ok(Value::String(
                    text.lines().map(|l| format!("\n{pad}{l}")).collect(),
                ))
            }
            Some(("toYaml", false)) => {
                arity(1)?;
                let v = last(1)?;
                Ok(Value::String(
                    serde_saphyr::to_string(&v).map_err(|e| e.to_string())?,
                ))
            }
            Some(("not", false)) => {
                arity(1)?;
                Ok(Value::Bool(!truthy(&last(1)?)))
            }
            // Go's `or`/`and`: the first truthy (falsy) argument, else the last.
            Some((op @ ("or" | "and"), false)) if input.is_none() && ws.len() >= 3 => {
                let want = op == "or";
                let mut v = Value::Null;
                for i in 1..ws.len() {
                    v = one(i)?;
                    if truthy(&v) == want {
                        break;
                    }
                }
                Ok(v)
            }
            Some(("eq", false)) => {
                arity(2)?;
                Ok(Value::Bool(one(1)? == last(2)?))
            }
            Some(("index", false)) if input.is_none() && ws.len() >= 3 => {
                if ws[1] != (".Values".to_string(), false) || !ws[2..].iter().all(|w| w.1) {
                    return Err(format!("index only as index .Values \"a\" ...: {ws:?}"));
                }
                let path: Vec<&str> = ws[2..].iter().map(|w| w.0.as_str()).collect();
                lookup(self.values, &path).cloned()
            }
            Some(("regexReplaceAll", false)) => {
                arity(3)?;
                let re = one(1)?;
                let re =
                    regex::Regex::new(re.as_str().ok_or("regex")?).map_err(|e| e.to_string())?;
                let src = scalar(&one(2)?)?;
                let repl = scalar(&last(3)?)?;
                Ok(Value::String(
                    re.replace_all(&src, repl.as_str()).into_owned(),
                ))
            }
            Some(_) if ws.len() == 1 && input.is_none() => self.operand(&ws[0]),
            _ => Err(format!("{ws:?} is outside the subset the chart may use")),
        }
    }

    fn pipeline(&self, action: &str) -> Result<Value, String> {
        let ws = words(action)?;
        let mut value = None;
        for cmd in ws.split(|w| w == &("|".to_string(), false)) {
            if cmd.is_empty() {
                return Err(format!("empty command in {action:?}"));
            }
            value = Some(self.command(cmd, value)?);
        }
        value.ok_or_else(|| "empty action".into())
    }
}

enum Node {
    Text(String),
    Print(String),
    If(String, Vec<Node>, Vec<Node>),
    Range(Option<(String, String)>, String, Vec<Node>),
}

enum Tok {
    Text(String),
    Act(String),
}

/// Splits a template into text and actions, applying `{{-` and `-}}`.
fn lex(tpl: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut rest = tpl;
    let mut trim_next = false;
    while let Some(i) = rest.find("{{") {
        let mut text = &rest[..i];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[i + 2..];
        let end = after.find("}}").ok_or("unclosed {{")?;
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix("- ") {
            action = a;
            text = text.trim_end();
        }
        trim_next = action.ends_with(" -");
        if trim_next {
            action = &action[..action.len() - 2];
        }
        let action = action.trim();
        if action.starts_with("/*") {
            return Err("comments are outside the subset".into());
        }
        toks.push(Tok::Text(text.to_owned()));
        toks.push(Tok::Act(action.to_owned()));
        rest = &after[end + 2..];
    }
    toks.push(Tok::Text(
        if trim_next { rest.trim_start() } else { rest }.to_owned(),
    ));
    Ok(toks)
}

/// Nodes up to `else` or `end` (returned), or to the end of the tokens.
fn parse(toks: &[Tok], pos: &mut usize) -> Result<(Vec<Node>, Option<&'static str>), String> {
    let mut nodes = Vec::new();
    while *pos < toks.len() {
        let t = &toks[*pos];
        *pos += 1;
        match t {
            Tok::Text(s) => nodes.push(Node::Text(s.clone())),
            Tok::Act(a) if a == "end" => return Ok((nodes, Some("end"))),
            Tok::Act(a) if a == "else" => return Ok((nodes, Some("else"))),
            Tok::Act(a) => {
                if let Some(cond) = a.strip_prefix("if ") {
                    let (then, stop) = parse(toks, pos)?;
                    let otherwise = match stop {
                        Some("else") => match parse(toks, pos)? {
                            (n, Some("end")) => n,
                            _ => return Err(format!("if {cond}: no end after else")),
                        },
                        Some("end") => Vec::new(),
                        _ => return Err(format!("if {cond}: no end")),
                    };
                    nodes.push(Node::If(cond.to_owned(), then, otherwise));
                } else if let Some(spec) = a.strip_prefix("range ") {
                    let (vars, operand) = match spec.split_once(":=") {
                        Some((vars, op)) => {
                            let (k, v) = vars
                                .split_once(',')
                                .ok_or_else(|| format!("range {spec}: want $k, $v :="))?;
                            (Some((k.trim().to_owned(), v.trim().to_owned())), op.trim())
                        }
                        None => (None, spec.trim()),
                    };
                    let (body, stop) = parse(toks, pos)?;
                    if stop != Some("end") {
                        return Err(format!("range {spec}: no end"));
                    }
                    nodes.push(Node::Range(vars, operand.to_owned(), body));
                } else if a.starts_with("with ")
                    || a.starts_with("define ")
                    || a.starts_with("template ")
                    || a.starts_with("include ")
                    || a.starts_with("block ")
                    || a.contains(":=")
                    || a.contains(" = ")
                {
                    return Err(format!("{a:?} is outside the subset the chart may use"));
                } else {
                    nodes.push(Node::Print(a.clone()));
                }
            }
        }
    }
    Ok((nodes, None))
}

fn exec(nodes: &[Node], scope: &mut Scope, out: &mut String) -> Result<(), String> {
    for n in nodes {
        match n {
            Node::Text(s) => out.push_str(s),
            Node::Print(a) => {
                let v = scope.pipeline(a)?;
                out.push_str(&scalar(&v).map_err(|e| format!("{a:?}: {e}"))?);
            }
            Node::If(cond, then, otherwise) => {
                let branch = if truthy(&scope.pipeline(cond)?) {
                    then
                } else {
                    otherwise
                };
                exec(branch, scope, out)?;
            }
            Node::Range(vars, operand, body) => {
                let over = scope.pipeline(operand)?;
                let saved = (scope.dot.clone(), scope.vars.clone());
                match (&over, vars) {
                    (Value::Array(items), None) => {
                        for item in items {
                            scope.dot = Some(item.clone());
                            exec(body, scope, out)?;
                        }
                    }
                    (Value::Object(map), Some((k, v))) => {
                        // Go ranges over a map in key order.
                        let sorted: BTreeMap<&String, &Value> = map.iter().collect();
                        for (key, value) in sorted {
                            scope.vars.insert(k.clone(), json!(key));
                            scope.vars.insert(v.clone(), value.clone());
                            scope.dot = Some(value.clone());
                            exec(body, scope, out)?;
                        }
                    }
                    (Value::Null, _) => {}
                    _ => return Err(format!("range {operand}: over {over}")),
                }
                (scope.dot, scope.vars) = saved;
            }
        }
    }
    Ok(())
}

fn render(tpl: &str, values: &Value, env: &Env) -> Result<String, String> {
    let toks = lex(tpl)?;
    let mut pos = 0;
    let (nodes, stop) = parse(&toks, &mut pos)?;
    if let Some(s) = stop {
        return Err(format!("{s} without if or range"));
    }
    let mut scope = Scope {
        values,
        env,
        dot: None,
        vars: BTreeMap::new(),
    };
    let mut out = String::new();
    exec(&nodes, &mut scope, &mut out)?;
    Ok(out)
}

/// An object as its type keeps it (unknown fields refused); the scheduler
/// config inside its ConfigMap decoded as component config, the device
/// config as YAML.
fn normalize(v: &Value) -> Value {
    let kind = v["kind"].as_str().unwrap_or("");
    let mut n = match kind {
        "ServiceAccount" => normalize_strict::<ServiceAccount>(v),
        "ClusterRole" => normalize_strict::<ClusterRole>(v),
        "ClusterRoleBinding" => normalize_strict::<ClusterRoleBinding>(v),
        "Role" => normalize_strict::<Role>(v),
        "RoleBinding" => normalize_strict::<RoleBinding>(v),
        "DaemonSet" => normalize_strict::<DaemonSet>(v),
        "Deployment" => normalize_strict::<Deployment>(v),
        "Service" => normalize_strict::<Service>(v),
        "ConfigMap" => normalize_strict::<ConfigMap>(v),
        "RuntimeClass" => normalize_strict::<RuntimeClass>(v),
        "DeviceClass" => normalize_strict::<k8s_openapi::api::resource::v1::DeviceClass>(v),
        k => Err(format!("unexpected kind {k:?}")),
    }
    .unwrap_or_else(|e| panic!("{kind} {}: {e}", v["metadata"]["name"]));
    if kind == "ConfigMap" {
        if let Some(text) = n["data"]["config.yaml"].as_str().map(str::to_owned) {
            let cfg: KubeSchedulerConfiguration = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("scheduler config: {e}\n{text}"));
            n["data"]["config.yaml"] = serde_json::to_value(cfg).unwrap();
        }
        if let Some(text) = n["data"]["device-config.yaml"].as_str().map(str::to_owned) {
            let cfg: Value = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("device config: {e}\n{text}"));
            n["data"]["device-config.yaml"] = cfg;
        }
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

/// The templates the subset renderer leaves to Helm (and to e2e/).
const HELM_ONLY: &[&str] = &["_hami.tpl", "hami-services.yaml", "webhook.yaml"];

const RELEASE: (&str, &str) = ("vgpu", "gpu-system");

fn env() -> Env<'static> {
    Env {
        release: RELEASE.0,
        namespace: RELEASE.1,
        kube_version: DEFAULT_KUBE_VERSION,
    }
}

fn rendered_chart(values: &Value) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // Anything new must stay in the subset.
    files.retain(|f| {
        f.file_name()
            .is_some_and(|n| !HELM_ONLY.iter().any(|h| n == *h))
    });
    let mut docs = Vec::new();
    for f in files {
        let tpl = std::fs::read_to_string(&f).unwrap();
        let text = render(&tpl, values, &env()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let d: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", f.display()));
        docs.extend(d.into_iter().filter(|v| !v.is_null()));
    }
    docs
}

fn vgpu_manifests(values_file: Option<&Path>) -> Vec<Value> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    c.args([
        "node",
        "manifests",
        "--json",
        "--release",
        RELEASE.0,
        "--namespace",
        RELEASE.1,
        "--kube-version",
        DEFAULT_KUBE_VERSION,
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

/// The chart with `values` (what Helm would hand its templates) and
/// `vgpu node manifests` with `values_file` agree object by object.
fn same_objects(values: &Value, values_file: Option<&Path>) -> BTreeMap<(String, String), Value> {
    let chart = keyed(&rendered_chart(values));
    let cli = keyed(&vgpu_manifests(values_file));
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
    // The agent and the scheduler accept their own arguments.
    if let Some(ds) = chart.get(&("DaemonSet".to_string(), "vgpu-vgpu-node".to_string())) {
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
    }
    let dep = &chart[&("Deployment".to_string(), "vgpu-vgpu-scheduler".to_string())];
    let args = container(dep, "vgpu-scheduler")["args"].clone();
    let args: Vec<String> = serde_json::from_value(args).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vgpu scheduler refuses the chart's arguments {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    chart
}

/// Values as Helm hands them to templates: the chart's values.yaml with a
/// user's file merged over it.
fn helm_values(user: Option<&Path>) -> Value {
    let mut v: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    if let Some(f) = user {
        let u: Value = serde_saphyr::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        merge_values(&mut v, u);
    }
    v
}

fn container<'a>(o: &'a Value, name: &str) -> &'a Value {
    o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
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
    same_objects(&helm_values(None), None);
}

#[test]
fn chart_renders_the_objects_vgpu_prints_with_changed_values() {
    let mut v = Values::default();
    v.device_plugin.device_split_count = 4;
    v.device_plugin.device_memory_scaling = 1.5;
    v.device_plugin.device_core_scaling = 2.0;
    v.device_plugin.disablecorelimit = "true".into();
    v.device_plugin.lib_path = "/opt/vgpu".into();
    v.device_plugin.plugin_path = "/var/lib/k0s/kubelet/device-plugins".into();
    v.device_plugin.enforce = "kill".into();
    v.device_plugin.priority_hold = "none".into();
    v.device_plugin.enable_numa_topology = true;
    v.device_plugin.device_list_strategy = "volume-mounts,cdi-cri".into();
    v.device_plugin.nvidia_node_selector = BTreeMap::from([
        ("nvidia.com/gpu.present".into(), "true".into()),
        ("pool".into(), "a".into()),
    ]);
    v.device_plugin.tolerations =
        vec![json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})];
    v.device_plugin.resources = json!({"limits": {"memory": "512Mi"}, "requests": {"cpu": "100m"}});
    v.device_plugin.runtime_class_name = "nvidia".into();
    v.device_plugin.create_runtime_class = true;
    v.device_plugin.host_network = true;
    v.device_plugin.extra_args = vec!["-v=4".into(), "--watchdog-interval=2s".into()];
    v.device_plugin.extra_envs = json!([{"name": "RUST_BACKTRACE", "value": "1"}]);
    v.device_plugin.pod_annotations = BTreeMap::from([("a/b".into(), "c".into())]);
    v.device_plugin.image.pull_secrets = vec!["node-pull".into()];
    v.device_plugin.gpu_operator_toolkit_ready.enabled = true;
    v.global.gpu_hook_path = "/var/lib/vgpu-hook".into();
    v.global.image_registry = "mirror.example.com".into();
    v.global.image_pull_secrets = vec!["shared-pull".into()];
    v.global.labels = BTreeMap::from([("team".into(), "gpu".into())]);
    v.global.annotations = BTreeMap::from([("owner".into(), "ops".into())]);
    v.namespace_override = "gpu-ops".into();
    v.scheduler_name = "vgpu-scheduler".into();
    v.legacy_metrics = true;
    v.scheduler.replicas = 2;
    v.scheduler.node_name = "control-1".into();
    v.scheduler.node_label_selector =
        BTreeMap::from([("gpu".into(), "on".into()), ("zone".into(), "b".into())]);
    v.scheduler.node_selector = BTreeMap::from([("role".into(), "infra".into())]);
    v.scheduler.tolerations =
        vec![json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"})];
    v.scheduler.overwrite_env = json!(true);
    v.scheduler.metrics_bind_address = "127.0.0.1:9500".into();
    v.scheduler.service.monitor_target_port = 9500;
    v.scheduler.service.http_target_port = 8443;
    v.scheduler.force_overwrite_default_scheduler = false;
    v.scheduler.liveness_probe = false;
    v.scheduler.kube_scheduler.image.tag = "v1.36.0".into();
    v.scheduler.kube_scheduler.image.pull_secrets = vec!["ks-pull".into()];
    v.scheduler.kube_scheduler.resources = json!({"requests": {"cpu": "50m"}});
    v.scheduler.kube_scheduler.extra_new_args = vec!["-v=4".into()];
    v.scheduler.extender.extra_args = vec!["--debug".into(), "-v=4".into()];
    v.scheduler.extender.resources = json!({"limits": {"cpu": "1"}});
    v.scheduler.pod_annotations = BTreeMap::from([("x".into(), "y".into())]);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    std::fs::write(&f, serde_saphyr::to_string(&v).unwrap()).unwrap();
    // Helm merges the file over values.yaml (maps key by key): so does the CLI.
    let objs = same_objects(&helm_values(Some(&f)), Some(&f));
    assert!(objs.contains_key(&("RuntimeClass".to_string(), "nvidia".to_string())));

    // Without leader election HAMi's chart runs one replica; without the
    // agent, no agent objects; without kube-scheduler, no config for it.
    v.scheduler.leader_elect = false;
    v.device_plugin.enabled = false;
    v.scheduler.kube_scheduler.enabled = false;
    v.device_config.content = "nvidia:\n  resourceCountName: example.com/vgpu\n".into();
    std::fs::write(&f, serde_saphyr::to_string(&v).unwrap()).unwrap();
    let objs = same_objects(&helm_values(Some(&f)), Some(&f));
    assert!(!objs
        .keys()
        .any(|(k, _)| k == "DaemonSet" || k == "RuntimeClass"));
    let dep = &objs[&("Deployment".to_string(), "vgpu-vgpu-scheduler".to_string())];
    assert_eq!(dep["spec"]["replicas"], 1);
    assert!(!objs.contains_key(&("ConfigMap".to_string(), "vgpu-vgpu-scheduler".to_string())));
}

/// A HAMi v2.10 user's values file (HAMi's keys, every one of them):
/// the chart and `vgpu node manifests` read it alike, and the values vgpu
/// supports carry HAMi's meaning into the objects.
#[test]
fn chart_renders_the_objects_vgpu_prints_with_hami_v2_10_values() {
    let file = hami_values_file();
    let objs = same_objects(&helm_values(Some(&file)), Some(&file));
    let user: Value = serde_saphyr::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let ns = user["namespaceOverride"].as_str().unwrap();
    let ds = &objs[&("DaemonSet".to_string(), "vgpu-vgpu-node".to_string())];
    assert_eq!(ds["metadata"]["namespace"], ns);
    let spec = &ds["spec"]["template"]["spec"];
    let dp = &user["devicePlugin"];
    assert_eq!(spec["tolerations"], dp["tolerations"]);
    // Maps merge over the defaults (gpu: "on", HAMi's too).
    for (k, v) in dp["nvidiaNodeSelector"].as_object().unwrap() {
        assert_eq!(&spec["nodeSelector"][k], v);
    }
    assert_eq!(spec["runtimeClassName"], dp["runtimeClassName"]);
    assert_eq!(spec["hostNetwork"], dp["hostNetwork"]);
    let agent = container(ds, "vgpu-node");
    assert_eq!(agent["resources"], dp["resources"]);
    let args: Vec<String> = serde_json::from_value(agent["args"].clone()).unwrap();
    let want = format!(
        "--device-list-strategy={}",
        dp["deviceListStrategy"].as_str().unwrap()
    );
    assert!(args.contains(&want), "{args:?}");
    let want = format!("--device-plugin-dir={}", dp["pluginPath"].as_str().unwrap());
    assert!(args.contains(&want), "{args:?}");
    let dep = &objs[&("Deployment".to_string(), "vgpu-vgpu-scheduler".to_string())];
    let s = &user["scheduler"];
    assert_eq!(dep["spec"]["replicas"], s["replicas"]);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["tolerations"], s["tolerations"]);
    assert_eq!(pod["nodeSelector"], s["nodeSelector"]);
    assert_eq!(pod["nodeName"], s["nodeName"]);
    let ext = container(dep, "vgpu-scheduler");
    assert_eq!(ext["resources"], s["extender"]["resources"]);
    let args: Vec<String> = serde_json::from_value(ext["args"].clone()).unwrap();
    let want = format!(
        "--metrics-bind-address={}",
        s["metricsBindAddress"].as_str().unwrap()
    );
    assert!(args.contains(&want), "{args:?}");
    for (k, v) in s["nodeLabelSelector"].as_object().unwrap() {
        let want = format!("--node-label-selector={k}={}", v.as_str().unwrap());
        assert!(args.contains(&want), "{args:?}");
    }
    let ks = container(dep, "kube-scheduler");
    let img = &s["kubeScheduler"]["image"];
    assert_eq!(
        ks["image"],
        format!(
            "{}/{}:{}",
            user["global"]["imageRegistry"].as_str().unwrap(),
            img["repository"].as_str().unwrap(),
            img["tag"].as_str().unwrap()
        )
    );
    assert_eq!(ks["resources"], s["kubeScheduler"]["resources"]);
    let cm = &objs[&("ConfigMap".to_string(), "vgpu-vgpu-scheduler".to_string())];
    let cfg: KubeSchedulerConfiguration =
        serde_json::from_value(cm["data"]["config.yaml"].clone()).unwrap();
    assert_eq!(
        Value::Bool(cfg.leader_election.leader_elect),
        s["leaderElect"]
    );
    assert_eq!(cfg.leader_election.resource_namespace, ns);
}

#[test]
fn chart_renders_the_objects_vgpu_prints_in_dra_modes() {
    let dir = tempfile::tempdir().unwrap();
    for (dp, ext, mode) in [(false, "", "dra"), (true, "example.com/gpu", "both")] {
        let f = dir.path().join(format!("{mode}.yaml"));
        std::fs::write(
            &f,
            format!("devicePlugin: {{enabled: {dp}}}\ndra: {{enabled: true, driverName: gpu.example.com, extendedResourceName: \"{ext}\"}}\n"),
        )
        .unwrap();
        let objs = same_objects(&helm_values(Some(&f)), Some(&f));
        let ds = &objs[&("DaemonSet".to_string(), "vgpu-vgpu-node".to_string())];
        let args = &container(ds, "vgpu-node")["args"];
        let args: Vec<&str> = args
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.contains(&format!("--mode={mode}").as_str()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--dra-driver-name=gpu.example.com"),
            "{args:?}"
        );
        let mounts: Vec<&str> = container(ds, "vgpu-node")["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        for p in [
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins/gpu.example.com",
            "/var/run/cdi",
        ] {
            assert!(mounts.contains(&p), "{p} in {mounts:?}");
        }
        let dc = &objs[&("DeviceClass".to_string(), "gpu.example.com".to_string())];
        assert_eq!(
            dc["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == 'gpu.example.com' && device.allowMultipleAllocations"
        );
        assert_eq!(
            dc["spec"].get("extendedResourceName").is_some(),
            !ext.is_empty()
        );
        let role = &objs[&("ClusterRole".to_string(), "vgpu-vgpu-node".to_string())];
        let rules = role["rules"].to_string();
        assert!(
            rules.contains("resourceslices") && rules.contains("resourceclaims"),
            "{rules}"
        );
    }
    // The defaults: no DRA at all.
    let objs = same_objects(&helm_values(None), None);
    assert!(!objs.keys().any(|(k, _)| k == "DeviceClass"));
    let ds = &objs[&("DaemonSet".to_string(), "vgpu-vgpu-node".to_string())];
    assert!(container(ds, "vgpu-node")["args"]
        .to_string()
        .contains("--mode=device-plugin"));
}

#[test]
fn values_files_refuse_unknown_keys_but_take_hamis() {
    // A misspelt key is refused; HAMi's keys vgpu ignores are not.
    let err = Values::from_yaml("devicePlugin:\n  deviceSplitCnt: 3\n").unwrap_err();
    assert!(err.contains("deviceSplitCnt"), "{err}");
    let v = Values::from_yaml(
        "devicePlugin:\n  migStrategy: mixed\n  image:\n    repository: projecthami/hami\n    pullSecrets: [a]\n",
    )
    .unwrap();
    assert_eq!(v.device_plugin.image.pull_secrets, vec!["a".to_string()]);
    // Helm's merge: maps merge, a null brings the default back.
    let v = Values::from_yaml(
        "devicePlugin:\n  nvidiaNodeSelector:\n    pool: a\n  tolerations: null\n",
    )
    .unwrap();
    assert_eq!(v.device_plugin.nvidia_node_selector.len(), 2);
    assert_eq!(
        v.device_plugin.tolerations,
        Values::default().device_plugin.tolerations
    );
}

#[test]
fn the_helm_only_templates_exist() {
    // A renamed Helm-only template would silently drop out of both tests.
    let t = |n: &str| std::fs::read_to_string(chart().join("templates").join(n)).unwrap();
    assert!(t("webhook.yaml").contains("kind: MutatingWebhookConfiguration"));
    assert!(t("hami-services.yaml").contains("kind: ServiceMonitor"));
    assert!(t("_hami.tpl").contains("define \"vgpu.hami.fullname\""));
}

#[test]
fn the_renderer_refuses_what_the_chart_may_not_use() {
    let v = helm_values(None);
    for bad in [
        "{{ include \"x\" . }}",
        "{{ .Values.nope }}",
        "{{ .Chart.Name }}",
        "{{ with .Values.global }}x{{ end }}",
        "{{ if .Values.legacyMetrics }}x",
        "{{ $x := 1 }}",
        "{{ .Values.devicePlugin | toJson }}",
        "{{ .Values.devicePlugin }}",
    ] {
        assert!(render(bad, &v, &env()).is_err(), "{bad}");
    }
    // Go's trim markers and truth.
    let ok = render(
        "a  {{- if .Values.devicePlugin.tolerations }} b {{ else }} c {{ end -}}  d\n{{- range $k, $x := .Values.devicePlugin.nvidiaNodeSelector }}\n{{ $k }}={{ $x }}{{ end }}",
        &v,
        &env(),
    )
    .unwrap();
    assert_eq!(ok, "a b d\ngpu=on");
    // And the strict decoding catches a misspelt field.
    let typo = serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"hostPid": true, "containers": []}}}});
    assert!(normalize_strict::<DaemonSet>(&typo)
        .unwrap_err()
        .contains("spec.template.spec.hostPid"));
}

#[test]
fn the_kube_scheduler_image_follows_the_cluster_version() {
    // HAMi's rule: an empty tag is the cluster's vMAJOR.MINOR.PATCH.
    let v = helm_values(None);
    let tpl = std::fs::read_to_string(chart().join("templates/scheduler-deployment.yaml")).unwrap();
    for (cluster, tag) in [
        ("v1.31.1+k3s1", "v1.31.1"),
        ("v1.30.8-eks-2d5f260", "v1.30.8"),
        ("v1.37.2", "v1.37.2"),
    ] {
        let e = Env {
            kube_version: cluster,
            ..env()
        };
        let text = render(&tpl, &v, &e).unwrap();
        assert!(
            text.contains(&format!("image: \"registry.k8s.io/kube-scheduler:{tag}\"")),
            "{cluster}: {text}"
        );
        assert_eq!(vgpu_node::manifests::stripped_kube_version(cluster), tag);
    }
}

#[test]
fn the_scheduler_serves_https_beyond_localhost() {
    // A kube-scheduler in another pod and the API server (the webhook)
    // must reach the extender: it listens on every interface with TLS from
    // the mounted secret, and the kube-scheduler beside it speaks HTTPS.
    let objs = keyed(&rendered_chart(&helm_values(None)));
    let dep = &objs[&("Deployment".to_string(), "vgpu-vgpu-scheduler".to_string())];
    let ctr = container(dep, "vgpu-scheduler");
    let args: Vec<String> = serde_json::from_value(ctr["args"].clone()).unwrap();
    for a in [
        "--http_bind=0.0.0.0:443",
        "--cert_file=/tls/tls.crt",
        "--key_file=/tls/tls.key",
        "--device-config-file=/device-config.yaml",
    ] {
        assert!(args.contains(&a.to_string()), "{args:?}");
    }
    assert_eq!(ctr["volumeMounts"][0]["mountPath"], "/tls");
    let spec = &dep["spec"]["template"]["spec"];
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
