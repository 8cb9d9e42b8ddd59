//! The kubelet's DRA plugin API (v1, and v1beta1 which differs only by the
//! package name and the v1-only `share_id`, so one implementation serves
//! both) and its plugin-registration API, generated from the protos vendored
//! in `proto/` (kubelet v0.37.2; see `proto/README.md`).

/// `k8s.io.kubelet.pkg.apis.dra.v1`: messages, `DRAPlugin` server and client.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod dra_v1 {
    include!("proto/dra_v1.rs");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod dra_v1beta1 {
    include!("proto/dra_v1beta1.rs");
}

/// `pluginregistration`: `Registration` server and client.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pluginregistration {
    include!("proto/pluginregistration.rs");
}

/// The plugin type the kubelet's plugin watcher hands to its DRA handler.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The versions advertised in `GetInfo` (labels, not gRPC service names).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
