//! `vgpu scheduler` as a process: HAMi's Deployment flags accepted, the
//! API server found through KUBECONFIG, the extender answering once it has
//! read the cluster, SIGTERM a clean stop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use vgpu_hami::{keys, register, NodeDevice};
use vgpu_kube_fixture::ApiFixture;

fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[test]
fn runs_with_hamis_flags_and_stops_on_sigterm() {
    let fx = ApiFixture::start();
    let dev = NodeDevice {
        id: "GPU-1".into(),
        count: 10,
        devmem: 16384,
        devcore: 100,
        device_type: "NVIDIA-Tesla T4".into(),
        mode: "hami-core".into(),
        health: true,
        ..Default::default()
    };
    let node: Node = serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-1", "annotations": {keys::NODE_REGISTER: register::encode(&[dev])}}}))
    .unwrap();
    fx.create(&node).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fx.write_kubeconfig(&kubeconfig).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args([
            "scheduler",
            "--http_bind=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--scheduler-name=hami-scheduler",
            "--node-scheduler-policy=binpack",
            "--gpu-scheduler-policy=spread",
            "--force-overwrite-default-scheduler=true",
            "--leader-elect=false",
            "--legacy-metrics=true",
            "--handshake-period=0s",
            "--debug",
            "-v=4",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines
            .next()
            .expect("stderr ended before the address line")
            .unwrap();
        if let Some(rest) = line.split("extender and webhook on http://").nth(1) {
            break rest.trim().parse().unwrap();
        }
    };
    // Keep draining stderr so the child never blocks on it.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let deadline = Instant::now() + Duration::from_secs(60);
    while request(addr, "GET", "/readyz", "").0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pod = r#"{"metadata":{"name":"p","namespace":"ml","uid":"u"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"1k"}}}]}}"#;
    let (code, body) = request(
        addr,
        "POST",
        "/filter",
        &format!(r#"{{"Pod":{pod},"Nodes":null,"NodeNames":["gpu-1","cpu-1"]}}"#),
    );
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-1"]));
    assert_eq!(
        v["FailedAndUnresolvableNodes"]["cpu-1"],
        "no GPUs: the node is not known to the vgpu scheduler"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let rest = drain.join().unwrap();
    assert!(rest.iter().any(|l| l.contains("stopping")), "{rest:?}");
}
