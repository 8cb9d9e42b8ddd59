//! Which container a host process belongs to, from `/proc/<pid>/cgroup`:
//! the pod UID (`pod<uid>` or `kubepods-…-pod<uid_with_underscores>.slice`)
//! and the container ID (the 64-hex last component: `cri-containerd-<id>.scope`,
//! `docker-<id>.scope`, `crio-<id>.scope` under the systemd driver, `<id>`
//! under cgroupfs). Every line (v1 hierarchies and the v2 `0::` line) is
//! tried; the first that names a container wins. Parsing only.

/// What a cgroup path says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CgroupIdentity {
    /// Pod UID with dashes, when the path names one.
    pub pod_uid: Option<String>,
    /// Container ID (64 lowercase hex).
    pub container_id: String,
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn container_id_of(component: &str) -> Option<String> {
    let c = component.strip_suffix(".scope").unwrap_or(component);
    let id = c.rsplit(['-', ':']).next().unwrap_or(c);
    is_hex64(id).then(|| id.to_ascii_lowercase())
}

fn pod_uid_of(component: &str) -> Option<String> {
    let c = component.strip_suffix(".slice").unwrap_or(component);
    let at = c.rfind("pod")?;
    let uid = c[at + 3..].replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    ok.then(|| uid.to_ascii_lowercase())
}

/// Parses one cgroup path (`/kubepods.slice/.../cri-containerd-<id>.scope`).
pub fn parse_path(path: &str) -> Option<CgroupIdentity> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let last = parts.last()?;
    let container_id = container_id_of(last)?;
    let pod_uid = parts[..parts.len() - 1]
        .iter()
        .rev()
        .find_map(|p| pod_uid_of(p));
    Some(CgroupIdentity {
        pod_uid,
        container_id,
    })
}

/// Parses the whole `/proc/<pid>/cgroup` text.
pub fn parse_proc_cgroup(text: &str) -> Option<CgroupIdentity> {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(parse_path)
}

/// Reads and parses `<proc>/<pid>/cgroup`.
pub fn of_pid(proc_root: &std::path::Path, pid: u32) -> Option<CgroupIdentity> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    parse_proc_cgroup(&text)
}

/// The ID part of a `containerStatuses[].containerID` (`containerd://<id>`).
pub fn status_container_id(s: &str) -> Option<String> {
    let id = s.rsplit("://").next()?;
    is_hex64(id).then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4a9f0b6c3d2e1f00aabbccddeeff00112233445566778899aabbccddeeff0011";
    const UID: &str = "7d3c2b1a-0f9e-4d8c-b7a6-958473625140";

    #[test]
    fn drivers_and_runtimes() {
        let u = UID.replace('-', "_");
        for p in [
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"),
            format!("/kubepods.slice/kubepods-pod{u}.slice/docker-{ID}.scope"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-{ID}.scope"),
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            format!("/kubepods/pod{UID}/{ID}"),
        ] {
            let got = parse_path(&p).unwrap_or_else(|| panic!("{p}"));
            assert_eq!(got.container_id, ID, "{p}");
            assert_eq!(got.pod_uid.as_deref(), Some(UID), "{p}");
        }
        assert_eq!(parse_path("/user.slice/session-1.scope"), None);
        assert_eq!(parse_path("/"), None);
        let whole = format!("12:pids:/\n4:memory:/system.slice\n0::/kubepods/pod{UID}/{ID}\n");
        assert_eq!(parse_proc_cgroup(&whole).unwrap().container_id, ID);
        assert_eq!(
            status_container_id(&format!("containerd://{ID}")).as_deref(),
            Some(ID)
        );
        assert_eq!(status_container_id("containerd://short"), None);
    }
}
