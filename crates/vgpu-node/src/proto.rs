//! The kubelet device-plugin API v1beta1, generated from the vendored
//! `proto/v1beta1/api.proto` (Kubernetes 1.34; see `proto/README.md`).

/// Messages, `DevicePlugin`/`Registration` servers and clients.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod v1beta1 {
    include!("proto/v1beta1.rs");
}

/// `pluginapi.Version`: the API version a plugin registers with.
pub const VERSION: &str = "v1beta1";
/// `pluginapi.Healthy`.
pub const HEALTHY: &str = "Healthy";
/// `pluginapi.Unhealthy`.
pub const UNHEALTHY: &str = "Unhealthy";
/// The kubelet's directory for device-plugin sockets.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket in that directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// FNV-1a 64 of `data` (the generated file records the proto's).
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}
