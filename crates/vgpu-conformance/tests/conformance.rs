//! The C conformance clients, compiled against NVIDIA's own headers, run
//! on a private simulated machine each.
use std::path::{Path, PathBuf};

use vgpu_conformance::{build, cudart_requests, error_chain, procaddress_map, run, Report};
use vgpu_sim::{SimConfig, SimHandle, SimOptions};

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance")
}

fn sim(opts: SimOptions) -> SimHandle {
    SimHandle::start(opts).unwrap_or_else(|e| panic!("start sim: {}", error_chain(&e)))
}

fn program(name: &str) -> PathBuf {
    build(name, &out_dir()).unwrap_or_else(|e| panic!("build {name}: {}", error_chain(&e)))
}

/// The default profile's shape, for the programs' optional expectations.
fn expectations(cfg: &SimConfig) -> Vec<(String, String)> {
    vec![
        ("CONF_EXPECT_DEVICES".into(), cfg.devices.to_string()),
        (
            "CONF_EXPECT_TOTAL_MEM".into(),
            cfg.device.memory_bytes.to_string(),
        ),
        ("CONF_EXPECT_SM_COUNT".into(), cfg.device.sms.to_string()),
    ]
}

fn assert_ok(r: &Report) {
    assert!(r.ok(), "{r}");
}

#[test]
fn cuda_api_on_one_device() {
    let opts = SimOptions::default();
    let mut env = expectations(&opts.config);
    let h = sim(opts);
    env.extend(h.env());
    assert_ok(&run(&program("cuda_api"), &[], &env).unwrap());
}

#[test]
fn cuda_api_on_two_devices() {
    let opts = SimOptions::default().devices(2);
    let mut env = expectations(&opts.config);
    let h = sim(opts);
    env.extend(h.env());
    assert_ok(&run(&program("cuda_api"), &[], &env).unwrap());
}

#[test]
fn nvml_api_on_two_devices() {
    let opts = SimOptions::default().devices(2);
    let mut env = expectations(&opts.config);
    let h = sim(opts);
    env.extend(h.env());
    assert_ok(&run(&program("nvml_api"), &[], &env).unwrap());
}

#[test]
fn device_memory_holds_bytes_and_ipc_shares_them_across_processes() {
    let h = sim(SimOptions::default());
    let r = run(&program("cuda_data"), &[], &h.env()).unwrap();
    // The importer (a second process) reports too.
    assert!(r.stdout.contains("cuda_data ipc-child: "), "{r}");
    assert_ok(&r);
}

#[test]
fn queries_jit_linking_and_graph_memory_on_two_devices() {
    let h = sim(SimOptions::default().devices(2));
    let r = run(&program("cuda_query"), &[], &h.env()).unwrap();
    assert!(r.stdout.contains("PASS device 0 reaches device 1"), "{r}");
    // Graph memory as the driver keeps it: reserved after a free until a
    // trim; a captured stream-ordered allocation is a node, backed at launch.
    assert!(r.stdout.contains("PASS cuDeviceGraphMemTrim gives"), "{r}");
    assert!(r.stdout.contains("PASS its launch backs"), "{r}");
    // CUDA 12's library management: a CUkernel launches where a
    // CUfunction goes, and the unloaded library's handles are errors.
    assert!(r.stdout.contains("PASS a library's kernel ran"), "{r}");
    assert!(
        r.stdout
            .contains("PASS cuKernelGetFunction -> CUDA_ERROR_INVALID_HANDLE"),
        "{r}"
    );
    assert_ok(&r);
}

#[test]
fn driver_calls_from_thread_local_destructors_and_atexit_return_cleanly() {
    let h = sim(SimOptions::default());
    let r = run(&program("teardown"), &[], &h.env()).unwrap();
    assert!(
        r.stdout.contains("teardown atexit: 3 passed, 0 failed"),
        "{r}"
    );
    assert!(!r.stderr.contains("panic"), "{r}");
    assert_ok(&r);
}

#[test]
fn get_proc_address_for_every_cudart_request() {
    let h = sim(SimOptions::default());
    let req = cudart_requests();
    let map = procaddress_map();
    let r = run(
        &program("procaddress"),
        &[req.to_str().unwrap(), map.to_str().unwrap()],
        &h.env(),
    )
    .unwrap();
    let lines = std::fs::read_to_string(&req).unwrap();
    let requests = lines
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    // One check per request plus cuInit and the driver lookup: every line
    // was looked at.
    assert_eq!(r.passed + r.failed, requests + 2, "{r}");
    assert_ok(&r);
}

#[test]
fn nvml_lists_host_pids_and_forgets_killed_workers() {
    let h = sim(SimOptions::default());
    let r = run(&program("nvml_view"), &["demo"], &h.env()).unwrap();
    assert_ok(&r);
}

#[test]
fn kernel_model_utilization_one_and_two_processes() {
    let h = sim(SimOptions::default());
    let r = run(&program("nvml_view"), &["util", "2000"], &h.env()).unwrap();
    assert_ok(&r);
}

#[test]
fn expected_map_is_generated_from_the_headers() {
    let inc = vgpu_conformance::nvidia_include().unwrap();
    let out =
        std::process::Command::new(vgpu_conformance::conformance_dir().join("gen-procaddress-map"))
            .arg("--check")
            .arg(&inc)
            .arg(cudart_requests())
            .arg(procaddress_map())
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_wrong_expectation_is_reported_as_a_failure() {
    // The harness must see a failing check: tell cuda_api to expect an SM
    // count the sim does not have.
    let opts = SimOptions::default();
    let h = sim(opts);
    let mut env = h.env();
    env.push(("CONF_EXPECT_SM_COUNT".into(), "7".into()));
    let r = run(&program("cuda_api"), &[], &env).unwrap();
    assert!(!r.ok() && !r.success, "{r}");
    // (Other failures, if the sim has any, are the other tests' business.)
    assert!(
        r.failures().iter().any(|f| f.contains("SM count 132 == 7")),
        "{r}"
    );
}

#[test]
fn a_stale_expected_map_is_refused_by_name() {
    let h = sim(SimOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let map = std::fs::read_to_string(procaddress_map()).unwrap();
    let stale = dir.path().join("stale.txt");
    std::fs::write(
        &stale,
        map.replacen("cuMemAlloc|3020|0|", "cuMemAlloc|3000|0|", 1),
    )
    .unwrap();
    let r = run(
        &program("procaddress"),
        &[cudart_requests().to_str().unwrap(), stale.to_str().unwrap()],
        &h.env(),
    )
    .unwrap();
    assert!(!r.ok(), "{r}");
    let f = r.failures();
    assert_eq!(f.len(), 1, "{r}");
    assert!(
        f[0].contains("cuMemAlloc|3020|0: expected map is stale"),
        "{r}"
    );
}
