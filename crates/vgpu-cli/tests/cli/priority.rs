//! The node agent's priority arbiter with real processes: on a private
//! simulated GPU, the real `vgpu node` (fast test periods) and two pods'
//! container directories laid out as its Allocate leaves them (region
//! under `containers/`, limits file under `limits/`), one `priority 0` and
//! one `priority 1`, neither with an SM limit, each running a flat-out
//! launcher under libvgpu.so. While the high-priority one is busy the low
//! one is held (and `/metrics` says so); after it stops the hold is
//! removed.

use crate::node_common;

use std::time::{Duration, Instant};

use node_common::*;
use vgpu_node::layout::Layout;
use vgpu_region::limits::{self, Device, DeviceLine, Limits};

const HOLD: u32 = 10;

/// Percent of `[from, to)` (CLOCK_MONOTONIC ns) device 0 spent on `pid`'s
/// kernels, from the simulator's own timeline.
fn share(env: &Env, pid: u32, from: u64, to: u64) -> f64 {
    let st = env.sim.state().expect("sim state");
    let busy: u64 = st
        .kernels(0, from, to)
        .iter()
        .filter(|(p, _, _)| *p == pid)
        .map(|&(_, s, e)| e.min(to).saturating_sub(s.max(from)))
        .sum();
    busy as f64 * 100.0 / (to - from) as f64
}

/// The container directory `key` with a limits file of `priority`; the
/// environment its processes get (host paths: no mount namespace here).
fn container(layout: &Layout, key: &str, priority: i32) -> Vec<(String, String)> {
    std::fs::create_dir_all(layout.region_dir(key)).unwrap();
    std::fs::create_dir_all(layout.limits_dir(key)).unwrap();
    let l = Limits {
        devices: vec![DeviceLine {
            device: Device::Uuid(uuid(0)),
            memory: Some(1 << 30),
            sm: None,
        }],
        priority: Some(priority),
        ..Limits::default()
    };
    limits::write_limits_file_atomic(&layout.limits_file(key), &l).unwrap();
    let region = layout.region_dir(key).join(vgpu_node::layout::REGION_FILE);
    vec![
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            region.display().to_string(),
        ),
        (
            limits::PATH_ENV.into(),
            layout.limits_file(key).display().to_string(),
        ),
        ("NVIDIA_VISIBLE_DEVICES".into(), uuid(0)),
    ]
}

fn hold_of(layout: &Layout, key: &str) -> Option<u32> {
    limits::read_limits_file(&layout.limits_file(key))
        .expect("limits file")
        .hold
}

fn launcher(env: &Env, cenv: &[(String, String)]) -> Worker {
    let mut w = Worker::start(
        env,
        true,
        cenv,
        None,
        &[
            "init", "ctx", "0", "ready", "launch", "200", "264", "60000", "ready", "wait",
        ],
    );
    w.expect("ready");
    w
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// `vgpu_container_priority_held` of pod `pod`'s container `main`.
fn held_metric(agent: &Agent, pod: &str) -> Option<f64> {
    value(
        &agent.scrape(),
        "vgpu_container_priority_held",
        &[
            ("namespace", "default"),
            ("pod", pod),
            ("container", "main"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_high_priority_container_holds_a_low_one_until_it_stops() {
    let env = Env::new(1);
    let kubelet = Kubelet::start(&env.dp_dir).await;
    let agent = env.agent(&[
        "--priority-interval",
        "200ms",
        "--priority-grace",
        "1s",
        "--priority-hold",
        &HOLD.to_string(),
    ]);
    kubelet.wait_registrations(1, Duration::from_secs(20)).await;
    // The processes and the waits below block: off the runtime's threads.
    tokio::task::spawn_blocking(move || held_then_released(&env, &agent))
        .await
        .unwrap();
}

fn held_then_released(env: &Env, agent: &Agent) {
    let layout = Layout::new(&env.hook);
    let dev = format!("{},NVIDIA,1024,0:;", uuid(0));
    let key = |pod: &str| {
        let uid = env.gpu_pod(pod, &[("main", false)], &dev).metadata.uid;
        vgpu_node::layout::container_key(&uid.unwrap(), "main")
    };
    let (hi, lo) = (key("high"), key("low"));
    let hi_env = container(&layout, &hi, 0);
    let lo_env = container(&layout, &lo, 1);

    // The low-priority container alone: not held, it has the device.
    let low = launcher(env, &lo_env);
    sleep_ms(1500);
    let t = vgpu_region::monotonic_ns();
    let alone = share(env, low.pid(), t - 1_000_000_000, t);
    assert_eq!(hold_of(&layout, &lo), None, "held with nobody else busy");
    assert!(alone >= 50.0, "alone the low one got only {alone:.1} %");
    wait_for(Duration::from_secs(10), "the pods in the monitor", || {
        (held_metric(agent, "low") == Some(0.0)).then_some(())
    });

    // The high-priority one starts: the low one is held.
    let high = launcher(env, &hi_env);
    let started = Instant::now();
    wait_for(Duration::from_secs(10), "the hold to be written", || {
        (hold_of(&layout, &lo) == Some(HOLD)).then_some(())
    });
    let took = started.elapsed();
    assert_eq!(hold_of(&layout, &hi), None, "the high one is never held");
    assert_eq!(held_metric(agent, "low"), Some(1.0));
    assert_eq!(held_metric(agent, "high"), Some(0.0));
    // Every process sees it within a control period; measure after that.
    sleep_ms(1000);
    let from = vgpu_region::monotonic_ns();
    sleep_ms(3000);
    let to = vgpu_region::monotonic_ns();
    let (l, h) = (
        share(env, low.pid(), from, to),
        share(env, high.pid(), from, to),
    );
    assert!(
        l <= f64::from(HOLD) + 15.0,
        "held low priority at {l:.1} % (hold {HOLD} %; high at {h:.1} %; hold written {took:?} after the high one started)"
    );
    assert!(
        h >= 40.0,
        "the high one only got {h:.1} % beside a held low one"
    );
    let snap = vgpu_region::Region::open_read_only(&layout.region_dir(&lo).join("region.cache"))
        .unwrap()
        .snapshot();
    let states: Vec<&str> = snap
        .slots
        .iter()
        .map(|s| s.limiter.state.as_str())
        .collect();
    assert!(states.contains(&"Held"), "low's limiter states {states:?}");
    assert_eq!(
        hold_of(&layout, &lo),
        Some(HOLD),
        "the hold stays while busy"
    );

    // The high one stops: the hold goes within staleness + grace + a cycle.
    drop(high);
    let stopped = Instant::now();
    wait_for(Duration::from_secs(8), "the hold to be removed", || {
        hold_of(&layout, &lo).is_none().then_some(())
    });
    let gone = stopped.elapsed();
    assert!(
        gone >= Duration::from_millis(900),
        "hold removed {gone:?} after the high one stopped: sooner than the grace"
    );
    // Nothing but the hold changed, in either file.
    let f = limits::read_limits_file(&layout.limits_file(&lo)).unwrap();
    assert_eq!(f.priority, Some(1));
    assert_eq!(f.for_device(&uuid(0)).memory, Some(1 << 30));
    assert_eq!(f.for_device(&uuid(0)).sm, None);
    // And the low one has the device back.
    sleep_ms(1500);
    let t = vgpu_region::monotonic_ns();
    let after = share(env, low.pid(), t - 1_000_000_000, t);
    assert_eq!(held_metric(agent, "low"), Some(0.0));
    eprintln!(
        "priority: low alone {alone:.1} %; held {l:.1} % beside high {h:.1} % (hold written \
         {took:?} after high started); hold removed {gone:?} after high stopped; low after {after:.1} %"
    );
    assert!(after >= 50.0, "released, the low one got only {after:.1} %");
    drop(low);
}
