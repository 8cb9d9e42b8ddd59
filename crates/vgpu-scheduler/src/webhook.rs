//! The mutating admission webhook (`POST /webhook`, AdmissionReview v1):
//! what HAMi's webhook does to a pod that asks for GPUs, plus refusing
//! malformed requests at the door.
//!
//! For every container (init containers too): a memory or core request
//! without a count gets `nvidia.com/gpu: <defaultGPUNum>`; a whole card
//! without a core request gets `nvidia.com/gpucores: 100`;
//! `nvidia.com/priority` becomes `CUDA_TASK_PRIORITY`; a configured core
//! policy becomes `GPU_CORE_UTILIZATION_POLICY`. A GPU pod gets our
//! `schedulerName` (and the configured runtime class). Refused with a
//! reason: a privileged container in a GPU pod, a GPU pod already bound
//! to a node, a malformed request, a pod without containers. Left alone:
//! pods labelled `hami.io/webhook: ignore`, pods another scheduler owns.
//! Pure: the review in, the review out.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use vgpu_hami::keys;

use crate::config::SchedulerConfig;
use crate::request::{container_request, resource_value, Memory};

/// kube-scheduler's default profile name.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What the webhook decides for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admitted as it is.
    Unchanged(&'static str),
    /// Admitted with these changes.
    Mutated(Box<Pod>),
    /// Refused, with the reason the user sees.
    Denied(String),
}

/// Applies the rules to a pod.
pub fn decide(cfg: &SchedulerConfig, pod: &Pod) -> Decision {
    let labels = pod.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get(keys::WEBHOOK_LABEL))
        .map(String::as_str)
        == Some("ignore")
    {
        return Decision::Unchanged("labelled hami.io/webhook: ignore");
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Decision::Denied("pod has no spec".into());
    };
    if spec.containers.is_empty() {
        return Decision::Denied("pod has no containers".into());
    }
    if let Some(name) = spec.scheduler_name.as_deref().filter(|n| !n.is_empty()) {
        let ours = !cfg.scheduler_name.is_empty() && name == cfg.scheduler_name;
        let takeable = name == DEFAULT_SCHEDULER && cfg.force_overwrite_default_scheduler;
        if !ours && !takeable {
            return Decision::Unchanged("pod already has a different scheduler");
        }
    }
    let mut out = pod.clone();
    let mut gpu_pod = false;
    let mut privileged: Option<String> = None;
    let out_spec = out.spec.get_or_insert_with(Default::default);
    let containers = out_spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(out_spec.containers.iter_mut());
    for ctr in containers {
        match mutate_container(cfg, ctr) {
            Ok(has_gpu) => gpu_pod |= has_gpu,
            Err(reason) => return Decision::Denied(reason),
        }
        let is_privileged = ctr
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        if is_privileged && privileged.is_none() {
            privileged = Some(ctr.name.clone());
        }
    }
    if gpu_pod {
        if let Some(name) = privileged {
            return Decision::Denied(format!(
                "container {name:?} is privileged: a privileged container sees every GPU, \
                 so a GPU pod may not have one"
            ));
        }
        if out_spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
            return Decision::Denied(
                "pod has spec.nodeName set: a GPU pod must be placed by the vgpu scheduler".into(),
            );
        }
        if !cfg.scheduler_name.is_empty() {
            out_spec.scheduler_name = Some(cfg.scheduler_name.clone());
        }
        if !cfg.runtime_class_name.is_empty() && out_spec.runtime_class_name.is_none() {
            out_spec.runtime_class_name = Some(cfg.runtime_class_name.clone());
        }
    }
    if &out == pod {
        Decision::Unchanged(if gpu_pod {
            "nothing to change"
        } else {
            "no GPU requested"
        })
    } else {
        Decision::Mutated(Box::new(out))
    }
}

fn set_env(ctr: &mut Container, name: &str, value: String) {
    let env = ctr.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != name);
    env.push(EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    });
}

/// Mutates one container; `Ok(true)` when it asks for a GPU.
fn mutate_container(cfg: &SchedulerConfig, ctr: &mut Container) -> Result<bool, String> {
    let names = &cfg.resources;
    let has = |ctr: &Container, name: &str| resource_value(ctr, name).is_some();
    let asks_share =
        has(ctr, &names.memory) || has(ctr, &names.memory_percentage) || has(ctr, &names.cores);
    if !has(ctr, &names.count) && asks_share && cfg.default_gpu_num > 0 {
        set_limit(ctr, &names.count, cfg.default_gpu_num.to_string());
    }
    let request = container_request(ctr, cfg).map_err(|e| e.to_string())?;
    if let Some(priority) = resource_value(ctr, &names.priority) {
        let p =
            priority.map_err(|e| format!("container {:?}: {}: {e}", ctr.name, names.priority))?;
        set_env(ctr, keys::ENV_TASK_PRIORITY, p.to_string());
    }
    let Some(gpu) = request else {
        if cfg.overwrite_env {
            set_env(ctr, "NVIDIA_VISIBLE_DEVICES", "none".into());
        }
        return Ok(false);
    };
    // The whole card with no core request is an exclusive card: write it
    // down so the node agent and HAMi's scheduler read the same thing.
    if !has(ctr, &names.cores) && gpu.memory == Memory::Percent(100) && gpu.cores == 100 {
        set_limit(ctr, &names.cores, "100".into());
    }
    if !cfg.gpu_core_policy.is_empty() && cfg.gpu_core_policy != "default" {
        set_env(ctr, keys::ENV_CORE_POLICY, cfg.gpu_core_policy.clone());
    }
    Ok(true)
}

fn set_limit(ctr: &mut Container, name: &str, value: String) {
    let res = ctr.resources.get_or_insert_with(Default::default);
    res.limits
        .get_or_insert_with(Default::default)
        .insert(name.to_owned(), Quantity(value));
}

/// The JSON patch (RFC 6902) turning `from` into `to`.
pub fn patch(from: &Pod, to: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
    Ok(json_patch::diff(
        &serde_json::to_value(from)?,
        &serde_json::to_value(to)?,
    ))
}

/// The answer to one AdmissionReview as it goes on the wire. The API
/// documents `response.patch` as Go's `[]byte`, a base64 string;
/// kube-core's `Vec<u8>` field serializes as an array of numbers
/// (kube-rs issue 1781), which the API server happens to accept but no
/// other client need, so the field is rewritten as base64 here.
pub fn review(cfg: &SchedulerConfig, review: AdmissionReview<Pod>) -> serde_json::Value {
    let answer = review_typed(cfg, review);
    let mut v = match serde_json::to_value(&answer) {
        Ok(v) => v,
        // Plain strings, bools and a byte vector: cannot fail; the refusal
        // keeps the API server from applying anything if it ever did.
        Err(e) => serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "", "allowed": false,
                         "status": {"message": format!("vgpu webhook: encoding the answer: {e}")}},
        }),
    };
    if let Some(patch) = answer.response.as_ref().and_then(|r| r.patch.as_ref()) {
        if let Some(resp) = v.get_mut("response").and_then(|r| r.as_object_mut()) {
            resp.insert(
                "patch".to_owned(),
                serde_json::Value::String(BASE64.encode(patch)),
            );
        }
    }
    v
}

/// The answer in kube-core's types (its `patch` is raw bytes).
pub fn review_typed(
    cfg: &SchedulerConfig,
    review: AdmissionReview<Pod>,
) -> AdmissionReview<DynamicObject> {
    let req: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(_) => {
            return AdmissionResponse::invalid("AdmissionReview carries no request").into_review()
        }
    };
    let base = AdmissionResponse::from(&req);
    let Some(pod) = req.object.as_ref() else {
        return base
            .deny("admission request carries no Pod object")
            .into_review();
    };
    match decide(cfg, pod) {
        Decision::Unchanged(_) => base.into_review(),
        Decision::Denied(reason) => base.deny(reason).into_review(),
        Decision::Mutated(new) => match patch(pod, &new).map(|p| base.clone().with_patch(p)) {
            Ok(Ok(resp)) => resp.into_review(),
            Ok(Err(e)) => base
                .deny(format!("vgpu webhook: encoding the patch: {e}"))
                .into_review(),
            Err(e) => base
                .deny(format!("vgpu webhook: encoding the pod: {e}"))
                .into_review(),
        },
    }
}
