//! `vgpu node` as the kubelet and HAMi's scheduler see it: the device
//! plugin against a kubelet emulator built from the vendored proto
//! (registration, ListAndWatch, Allocate, kubelet restart), the node
//! annotations in HAMi's formats, and Allocate for one- and multi-device,
//! multi-container pods (env and mounts exactly) and every refusal.
use crate::node_common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use futures_util::StreamExt;
use node_common::*;
use vgpu_hami::register;
use vgpu_node::proto::v1beta1 as api;

fn ids(uuid: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{uuid}-{i}")).collect()
}

fn expected_mounts(
    env: &Env,
    uid: &str,
    ctr: &str,
    preload: bool,
    uuids: &[&str],
) -> Vec<(String, String, bool)> {
    let h = env.hook.display().to_string();
    let key = format!("{uid}_{ctr}");
    let mut m = vec![
        (
            format!("{h}/vgpu/libvgpu.so"),
            libvgpu().display().to_string(),
            true,
        ),
        (
            format!("{h}/vgpu/libvgpu_core.so"),
            libvgpu()
                .with_file_name("libvgpu_core.so")
                .display()
                .to_string(),
            true,
        ),
        (
            format!("{h}/vgpu"),
            format!("{h}/vgpu/containers/{key}"),
            false,
        ),
        (
            "/tmp/vgpu".to_string(),
            format!("{h}/vgpu/containers/{key}"),
            false,
        ),
        (
            "/etc/vgpu".to_string(),
            format!("{h}/vgpu/limits/{key}"),
            true,
        ),
        (
            "/tmp/vgpulock".to_string(),
            env.lock.display().to_string(),
            false,
        ),
    ];
    if preload {
        m.push((
            "/etc/ld.so.preload".to_string(),
            format!("{h}/vgpu/ld.so.preload"),
            true,
        ));
    }
    let bdir = env.broker_sock.parent().unwrap().display().to_string();
    m.push((bdir.clone(), bdir, true));
    // The lending boards (docs/limiter.md): read-only, the container's own
    // entry on each of its GPUs writable.
    m.push((
        "/etc/vgpu-boards".to_string(),
        format!("{h}/vgpu/boards"),
        true,
    ));
    for u in uuids {
        m.push((
            format!("/etc/vgpu-boards/{u}/{key}"),
            format!("{h}/vgpu/boards/{u}/{key}"),
            false,
        ));
    }
    m
}

fn expected_env(env: &Env, devices: &[(&str, u32, u32)]) -> BTreeMap<String, String> {
    let mut e = BTreeMap::new();
    let mut uuids: Vec<&str> = vec![];
    for (u, _, _) in devices {
        if !uuids.contains(u) {
            uuids.push(u);
        }
    }
    e.insert("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(","));
    for (i, (_, mib, _)) in devices.iter().enumerate() {
        e.insert(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"), format!("{mib}m"));
    }
    e.insert("CUDA_DEVICE_SM_LIMIT".into(), devices[0].2.to_string());
    e.insert(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
        format!("{}/vgpu/region.cache", env.hook.display()),
    );
    e.insert("LIBCUDA_LOG_LEVEL".into(), "2".into());
    e.insert(
        "LIBVGPU_HOSTPID_BROKER".into(),
        env.broker_sock.display().to_string(),
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_list_and_watch_allocate_and_kubelet_restart() {
    let env = Env::new(2);
    let mut kubelet = Kubelet::start(&env.dp_dir).await;
    let agent = env.agent(&[]);

    // Registration as the kubelet expects it.
    let regs = kubelet.wait_registrations(1, Duration::from_secs(20)).await;
    let r = &regs[0];
    assert_eq!(
        (
            r.version.as_str(),
            r.endpoint.as_str(),
            r.resource_name.as_str()
        ),
        ("v1beta1", "vgpu.sock", "nvidia.com/gpu")
    );
    assert!(r.options.unwrap().get_preferred_allocation_available);

    let mut plugin = kubelet.plugin("vgpu.sock").await;
    let opts = plugin
        .get_device_plugin_options(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
    let mut stream = plugin
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut got: Vec<(String, String)> = first
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect();
    got.sort();
    let mut want: Vec<(String, String)> = (0..2)
        .flat_map(|d| ids(&uuid(d), 10))
        .map(|i| (i, "Healthy".to_string()))
        .collect();
    want.sort();
    assert_eq!(
        got, want,
        "each GPU as deviceSplitCount=10 devices <UUID>-<i>"
    );

    // The node annotation in HAMi's JSON: index 0 and numa 0 omitted.
    let reg = wait_for(Duration::from_secs(20), "node registration", || {
        env.node_annotation(vgpu_hami::keys::NODE_REGISTER)
    });
    let devs = register::decode(&reg).unwrap();
    assert_eq!(devs.len(), 2);
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(
            (d.id.as_str(), d.index, d.count, d.devmem, d.devcore),
            (uuid(i).as_str(), i as u64, 10, 81920, 100)
        );
        assert!(
            d.health && d.mode == "hami-core" && d.device_type.starts_with("NVIDIA"),
            "{d:?}"
        );
    }
    assert!(
        !reg.contains("\"index\":0") && !reg.contains("\"numa\""),
        "omitempty: {reg}"
    );
    assert_eq!(
        register::encode(&devs),
        reg,
        "vgpu writes what Go would write"
    );

    // The handshake is the scheduler's: the agent leaves a `Requesting_`
    // alone (HAMi v2.10's plugin never answers it; an answer makes every
    // scheduler cycle ask again), and writes nothing to the node while
    // nothing changed, over more than one registration period.
    let req = format!(
        "Requesting_{}",
        jiff::Zoned::now().datetime().strftime("%Y-%m-%d %H:%M:%S")
    );
    env.fx
        .merge_patch::<k8s_openapi::api::core::v1::Node>(
            "",
            NODE,
            &serde_json::json!({"metadata": {"annotations": {"hami.io/node-handshake": req}}}),
        )
        .unwrap();
    env.fx.clear_requests();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        env.node_annotation("hami.io/node-handshake").as_deref(),
        Some(req.as_str()),
        "the agent must not answer the handshake"
    );
    let node_writes: Vec<String> = env
        .fx
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET" && r.path.contains("/nodes/"))
        .map(|r| format!("{} {} {}", r.method, r.path, r.body))
        .collect();
    assert!(
        node_writes.is_empty(),
        "node written with nothing changed: {node_writes:?}"
    );

    // Allocate round trip for a one-device pod.
    let u0 = uuid(0);
    let p = env.gpu_pod("one", &[("main", false)], &format!("{u0},NVIDIA,1024,30:;"));
    let uid = p.metadata.uid.clone().unwrap();
    let resp = plugin
        .allocate(request(&[format!("{u0}-3")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 1);
    let c = &resp.container_responses[0];
    assert_eq!(envs(c), expected_env(&env, &[(&u0, 1024, 30)]));
    assert_eq!(mounts(c), expected_mounts(&env, &uid, "main", true, &[&u0]));
    assert_eq!(
        env.annotation("one", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    assert_eq!(
        env.annotation("one", "hami.io/vgpu-devices-to-allocate")
            .as_deref(),
        Some(";")
    );
    let key = format!("{uid}_main");
    let limits =
        std::fs::read_to_string(env.hook.join(format!("vgpu/limits/{key}/limits"))).unwrap();
    assert_eq!(
        limits,
        format!(
            "vgpu-limits 1\ndevice {u0} memory={} sm=30\nboard /etc/vgpu-boards {key}\n",
            1024 * MIB
        )
    );
    // Its entry on the GPU's board exists (a file mount target), empty.
    let entry = env.hook.join(format!("vgpu/boards/{u0}/{key}"));
    assert_eq!(std::fs::metadata(&entry).unwrap().len(), 0);
    let region_dir = env.hook.join(format!("vgpu/containers/{key}"));
    assert_eq!(
        std::fs::metadata(&region_dir).unwrap().permissions().mode() & 0o7777,
        0o1777
    );
    assert_eq!(
        std::fs::metadata(env.hook.join(format!("vgpu/limits/{key}/limits")))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    assert_eq!(
        std::fs::read_to_string(env.hook.join("vgpu/ld.so.preload")).unwrap(),
        format!("{}/vgpu/libvgpu.so\n", env.hook.display())
    );

    // PreStartContainer and GetPreferredAllocation (the next pod's GPUs).
    plugin
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec![],
        })
        .await
        .unwrap();
    let u1 = uuid(1);
    env.gpu_pod("pref", &[("main", false)], &format!("{u1},NVIDIA,100,0:;"));
    let pref = plugin
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: [ids(&u0, 3), ids(&u1, 3)].concat(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        vec![format!("{u1}-0")]
    );

    // Kubelet restart: the plugin serves its socket again and re-registers.
    kubelet.restart().await;
    let regs = kubelet.wait_registrations(2, Duration::from_secs(20)).await;
    assert_eq!(regs.len(), 2, "{}", agent.log());
    assert_eq!(regs[1].endpoint, "vgpu.sock");
    let mut plugin = kubelet.plugin("vgpu.sock").await;
    let mut stream = plugin
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let again = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(again.devices.len(), 20);
    // Ready again once the agent has the kubelet's answer to its new
    // registration, which can land a moment after the kubelet recorded it
    // (seen: 503 with `plugin_registered: false` right after the stream).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (code, body) = loop {
        let (code, body) = http_get(&agent.url, "/readyz");
        if code == 200 || std::time::Instant::now() > deadline {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_device_multi_container_pods_get_exact_env_and_mounts() {
    let env = Env::new(2);
    let kubelet = Kubelet::start(&env.dp_dir).await;
    let _agent = env.agent(&[]);
    kubelet.wait_registrations(1, Duration::from_secs(20)).await;
    let mut plugin = kubelet.plugin("vgpu.sock").await;
    let (u0, u1) = (uuid(0), uuid(1));

    // init (no GPU), train (2 GPUs), sidecar (none, CUDA_DISABLE_CONTROL
    // would not matter), eval (1 GPU): init containers first.
    let devices = format!(";{u0},NVIDIA,2048,50:{u1},NVIDIA,4096,50:;;{u1},NVIDIA,512,0:;");
    let p = env.gpu_pod(
        "multi",
        &[
            ("setup", true),
            ("train", false),
            ("sidecar", false),
            ("eval", false),
        ],
        &devices,
    );
    let uid = p.metadata.uid.clone().unwrap();
    // The node lock held by this pod, as HAMi's scheduler leaves it.
    let lock = vgpu_hami::NodeLock::new(jiff::Timestamp::now(), "default", "multi").to_string();
    env.fx
        .merge_patch::<k8s_openapi::api::core::v1::Node>(
            "",
            NODE,
            &serde_json::json!({"metadata": {"annotations": {"hami.io/mutex.lock": lock}}}),
        )
        .unwrap();

    let r1 = plugin
        .allocate(request(&[format!("{u0}-1"), format!("{u1}-4")]))
        .await
        .unwrap()
        .into_inner();
    let c = &r1.container_responses[0];
    assert_eq!(
        envs(c),
        expected_env(&env, &[(&u0, 2048, 50), (&u1, 4096, 50)])
    );
    assert_eq!(
        mounts(c),
        expected_mounts(&env, &uid, "train", true, &[&u0, &u1])
    );
    let lim =
        std::fs::read_to_string(env.hook.join(format!("vgpu/limits/{uid}_train/limits"))).unwrap();
    assert_eq!(
        lim,
        format!(
            "vgpu-limits 1\ndevice {u0} memory={} sm=50\ndevice {u1} memory={} sm=50\nboard /etc/vgpu-boards {uid}_train\n",
            2048 * MIB,
            4096 * MIB
        )
    );
    // Half served: the phase stays allocating and the lock stays.
    assert_eq!(
        env.annotation("multi", "hami.io/bind-phase").as_deref(),
        Some("allocating")
    );
    assert_eq!(
        env.annotation("multi", "hami.io/vgpu-devices-to-allocate"),
        Some(format!(";;;{u1},NVIDIA,512,0:;"))
    );
    assert!(env.node_annotation("hami.io/mutex.lock").is_some());

    let r2 = plugin
        .allocate(request(&[format!("{u1}-7")]))
        .await
        .unwrap()
        .into_inner();
    let c = &r2.container_responses[0];
    assert_eq!(envs(c), expected_env(&env, &[(&u1, 512, 0)]));
    assert_eq!(mounts(c), expected_mounts(&env, &uid, "eval", true, &[&u1]));
    let lim =
        std::fs::read_to_string(env.hook.join(format!("vgpu/limits/{uid}_eval/limits"))).unwrap();
    assert_eq!(
        lim,
        format!(
            "vgpu-limits 1\ndevice {u1} memory={}\nboard /etc/vgpu-boards {uid}_eval\n",
            512 * MIB
        )
    );
    assert_eq!(
        env.annotation("multi", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    assert_eq!(
        env.node_annotation("hami.io/mutex.lock"),
        None,
        "lock released after the last container"
    );

    // Two containers in one request; CUDA_DISABLE_CONTROL=true drops the preload mount.
    let mut p = env.gpu_pod(
        "pair",
        &[("a", false), ("b", false)],
        &format!("{u0},NVIDIA,100,10:;{u1},NVIDIA,200,20:;"),
    );
    let uid = p.metadata.uid.clone().unwrap();
    let _ = &mut p;
    let req = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec![format!("{u0}-0")],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec![format!("{u1}-0")],
            },
        ],
    };
    let r = plugin.allocate(req).await.unwrap().into_inner();
    assert_eq!(r.container_responses.len(), 2);
    assert_eq!(
        envs(&r.container_responses[0]),
        expected_env(&env, &[(&u0, 100, 10)])
    );
    assert_eq!(
        envs(&r.container_responses[1]),
        expected_env(&env, &[(&u1, 200, 20)])
    );
    assert_eq!(
        mounts(&r.container_responses[1]),
        expected_mounts(&env, &uid, "b", true, &[&u1])
    );
    assert_eq!(
        env.annotation("pair", "hami.io/bind-phase").as_deref(),
        Some("success")
    );

    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nocontrol", "namespace": "default", "annotations": {
            "hami.io/vgpu-node": NODE, "hami.io/bind-time": "1", "hami.io/bind-phase": "allocating",
            "hami.io/vgpu-devices-to-allocate": format!("{u0},NVIDIA,64,0:;")}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}]}
    }))
    .unwrap();
    let p = env.fx.create(&p).unwrap();
    let r = plugin
        .allocate(request(&[format!("{u0}-9")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        mounts(&r.container_responses[0]),
        expected_mounts(&env, p.metadata.uid.as_deref().unwrap(), "c", false, &[&u0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_and_mismatched_assignments_are_refused_with_failed() {
    let env = Env::new(1);
    let kubelet = Kubelet::start(&env.dp_dir).await;
    let _agent = env.agent(&[]);
    kubelet.wait_registrations(1, Duration::from_secs(20)).await;
    let mut plugin = kubelet.plugin("vgpu.sock").await;
    let u0 = uuid(0);

    // No pod at all.
    let e = plugin
        .allocate(request(&[format!("{u0}-0")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("no pod on node node-1 is waiting"),
        "{}",
        e.message()
    );

    let cases: [(&str, String, Vec<String>, tonic::Code, &str); 4] = [
        (
            "malformed",
            format!("{u0},NVIDIA,lots,0:;"),
            vec![format!("{u0}-0")],
            tonic::Code::InvalidArgument,
            "malformed hami.io/vgpu-devices-to-allocate",
        ),
        (
            "count",
            format!("{u0},NVIDIA,10,0:{u0},NVIDIA,10,0:;"),
            vec![format!("{u0}-0")],
            tonic::Code::InvalidArgument,
            "device number not matched",
        ),
        (
            "foreign",
            "GPU-00000000-1111-4222-8333-444444444444,NVIDIA,10,0:;".to_string(),
            vec![format!("{u0}-0")],
            tonic::Code::InvalidArgument,
            "is not on node node-1",
        ),
        (
            "unknownid",
            format!("{u0},NVIDIA,10,0:;"),
            vec!["GPU-nope-0".to_string()],
            tonic::Code::InvalidArgument,
            "unknown device GPU-nope-0",
        ),
    ];
    for (name, devices, req_ids, code, msg) in cases {
        let p = env.gpu_pod(name, &[("main", false)], &devices);
        let lock = vgpu_hami::NodeLock::new(jiff::Timestamp::now(), "default", name).to_string();
        env.fx
            .merge_patch::<k8s_openapi::api::core::v1::Node>(
                "",
                NODE,
                &serde_json::json!({"metadata": {"annotations": {"hami.io/mutex.lock": lock}}}),
            )
            .unwrap();
        let e = plugin.allocate(request(&req_ids)).await.unwrap_err();
        assert_eq!(e.code(), code, "{name}: {}", e.message());
        assert!(e.message().contains(msg), "{name}: {}", e.message());
        assert_eq!(
            env.annotation(name, "hami.io/bind-phase").as_deref(),
            Some("failed"),
            "{name}"
        );
        assert_eq!(
            env.node_annotation("hami.io/mutex.lock"),
            None,
            "{name}: lock released"
        );
        let uid = p.metadata.uid.unwrap();
        assert!(
            !env.hook
                .join(format!("vgpu/limits/{uid}_main/limits"))
                .exists(),
            "{name}: nothing half-made"
        );
        // The assignment is left as it was (nothing consumed).
        assert_eq!(
            env.annotation(name, "hami.io/vgpu-devices-to-allocate"),
            Some(devices.clone()),
            "{name}"
        );
        // Done with it: a failed pod is no longer pending for the next case.
    }

    // Bound and allocating but no assignment at all.
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bare", "namespace": "default", "annotations": {
            "hami.io/vgpu-node": NODE, "hami.io/bind-time": "1", "hami.io/bind-phase": "allocating"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}
    }))
    .unwrap();
    env.fx.create(&p).unwrap();
    let e = plugin
        .allocate(request(&[format!("{u0}-0")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("has no hami.io/vgpu-devices-to-allocate annotation"),
        "{}",
        e.message()
    );
    assert_eq!(
        env.annotation("bare", "hami.io/bind-phase").as_deref(),
        Some("failed")
    );
}
