//! The control law on the deterministic device model, under a simulated
//! clock (no sleeps): every row the issue names, with the targets of the
//! benchmark (±5 points after settling, settled within 1 s) asserted
//! exactly, since nothing here depends on the machine's load.
use vgpu_limiter::model::*;
use vgpu_limiter::{Policy, Priority, Settings};

const S: u64 = 1_000_000_000;
const SHORT_NS: u64 = 40_000;
const LONG_NS: u64 = 12_000_000;

fn solo(sms: u32, pct: u32, kernel_ns: u64, workload: Workload) -> Scenario {
    let mut t = TenantSpec::flat_out(0, KernelSpec::lasting(kernel_ns, sms));
    t.workload = workload;
    let mut s = Scenario::new(sms, vec![ContainerSpec::limited(pct)], vec![t]);
    s.duration_ns = 4 * S;
    s
}

/// Window for judging: a quarter second for short kernels, a second for
/// long ones (a 12 ms kernel is 5 points of a quarter second at 30 %).
fn window(kernel_ns: u64) -> u64 {
    if kernel_ns >= 10_000_000 {
        S
    } else {
        S / 4
    }
}

#[track_caller]
fn check(o: &Outcome, c: usize, pct: u32, dur: u64, w: u64, what: &str) -> Accuracy {
    let a = o.accuracy(c, pct as f64, S, dur, w, 5.0);
    assert!(
        a.mae_points <= 5.0 && a.worst_points <= 5.0,
        "{what}: container {c} target {pct}%: windows {:?} (mae {:.2}, worst {:.2})",
        a.windows,
        a.mae_points,
        a.worst_points
    );
    assert!(
        a.settled_ns.is_some_and(|t| t <= S),
        "{what}: container {c} target {pct}%: settled at {:?}, windows {:?}",
        a.settled_ns,
        a.windows
    );
    a
}

#[test]
fn one_tenant_holds_every_target_on_every_sm_count() {
    let mut worst: f64 = 0.0;
    for sms in [20, 108, 132, 188] {
        for pct in [10, 30, 50, 70] {
            for kernel in [SHORT_NS, LONG_NS] {
                for (wname, wl) in [
                    ("async", Workload::Async),
                    ("sync", Workload::Sync { host_ns: 10_000 }),
                ] {
                    let s = solo(sms, pct, kernel, wl);
                    let o = run(&s);
                    let what = format!("{sms} SMs, {kernel} ns kernels, {wname}");
                    let a = check(&o, 0, pct, s.duration_ns, window(kernel), &what);
                    worst = worst.max(a.worst_points);
                }
            }
        }
    }
    eprintln!("worst window error over 64 rows: {worst:.2} points");
}

#[test]
fn the_law_does_not_depend_on_the_sm_count() {
    // Same work per kernel in time, grids in waves of 20..188 SMs: the
    // shares agree within half a point (nothing is counted in blocks).
    let shares: Vec<f64> = [20, 108, 132, 188]
        .into_iter()
        .map(|sms| {
            let s = solo(sms, 50, SHORT_NS, Workload::Async);
            run(&s).container_share(0, S, s.duration_ns) * 100.0
        })
        .collect();
    for x in &shares {
        assert!((x - 50.0).abs() < 1.0, "{shares:?}");
    }
    let spread = shares.iter().cloned().fold(f64::MIN, f64::max)
        - shares.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread < 0.5, "{shares:?}");
}

fn tenants(pcts: &[u32], kernel_ns: u64, sms: u32, wl: Workload) -> Scenario {
    let containers = pcts
        .iter()
        .map(|p| {
            if *p >= 100 {
                ContainerSpec::unlimited()
            } else {
                ContainerSpec::limited(*p)
            }
        })
        .collect();
    let ts = (0..pcts.len())
        .map(|c| {
            let mut t = TenantSpec::flat_out(c, KernelSpec::lasting(kernel_ns, sms));
            t.workload = wl;
            t
        })
        .collect();
    let mut s = Scenario::new(sms, containers, ts);
    s.duration_ns = 4 * S;
    s
}

#[test]
fn two_and_three_tenants_each_hold_their_share() {
    for kernel in [SHORT_NS, LONG_NS] {
        for (wname, wl) in [
            ("async", Workload::Async),
            // A tight loop (2 µs on the CPU per iteration): it can still
            // use 80 % of the device alone, above every target here.
            ("sync", Workload::Sync { host_ns: 2_000 }),
            ("graph", Workload::Graph { nodes: 8 }),
        ] {
            for pcts in [&[30, 70][..], &[10, 90], &[20, 30, 50]] {
                if kernel == LONG_NS && wname == "graph" {
                    continue; // 8 × 12 ms graphs: covered by the short row
                }
                let s = tenants(pcts, kernel, 132, wl);
                let o = run(&s);
                let what = format!("{pcts:?}, {kernel} ns kernels, {wname}");
                let mut expected = Vec::new();
                for (c, p) in pcts.iter().enumerate() {
                    // What it gets with its own limit lifted (the others
                    // paced as before): a loop that cannot use its share
                    // is not held below it by the limiter.
                    let mut free = s.clone();
                    free.containers[c] = ContainerSpec::unlimited();
                    let reachable = run(&free).container_share(c, S, s.duration_ns) * 100.0;
                    let expect = (*p as f64).min(reachable);
                    expected.push(expect);
                    // Per-second windows, as the benchmark reports.
                    let a = o.accuracy(c, expect, S, s.duration_ns, S, 5.0);
                    assert!(
                        a.worst_points <= 5.0 && a.settled_ns.is_some_and(|t| t <= S),
                        "{what}: container {c} target {p}% (reachable {reachable:.1}): {:?}",
                        a.windows
                    );
                }
                if pcts.len() == 2 {
                    // The achieved ratio within 10 % of the asked one (of
                    // what each can reach: a synchronizing loop that cannot
                    // use 90 % alone does not get it beside another).
                    let a = o.container_share(0, S, s.duration_ns);
                    let b = o.container_share(1, S, s.duration_ns);
                    let asked = expected[0] / expected[1];
                    let got = a / b;
                    assert!(
                        (got / asked - 1.0).abs() <= 0.10,
                        "{what}: ratio {got:.4} vs asked {asked:.4}"
                    );
                }
            }
        }
    }
}

#[test]
fn an_unlimited_neighbour_gets_the_rest_and_an_idle_limited_one_wastes_nothing() {
    let s = tenants(&[30, 100], SHORT_NS, 132, Workload::Async);
    let o = run(&s);
    check(&o, 0, 30, s.duration_ns, S / 2, "30 % beside unlimited");
    let rest = o.container_share(1, S, s.duration_ns) * 100.0;
    assert!(rest > 68.0, "the unlimited neighbour got {rest:.1} %");
    // Work-conserving for others: the limited tenant stops at 2 s; from
    // then on the unlimited one has the whole device.
    let mut s = tenants(&[30, 100], SHORT_NS, 132, Workload::Async);
    s.tenants[0].stop_ns = 2 * S;
    let o = run(&s);
    let after = o.container_share(1, 2 * S + S / 10, s.duration_ns) * 100.0;
    assert!(
        after > 99.0,
        "unlimited after the limited one went idle: {after:.1} %"
    );
    // A lone unlimited tenant is not paced at all.
    let s = tenants(&[100], SHORT_NS, 132, Workload::Async);
    assert!(run(&s).container_share(0, 0, s.duration_ns) > 0.999);
}

#[test]
fn a_live_limit_change_takes_effect_within_a_control_period() {
    for (from, to) in [(30, 70), (70, 10)] {
        let mut s = solo(132, from, SHORT_NS, Workload::Async);
        s.duration_ns = 5 * S;
        s.containers[0].settings.push((
            2 * S,
            Settings {
                sm_limit: Some(to),
                ..Settings::default()
            },
        ));
        let o = run(&s);
        let before = o.container_share(0, S, 2 * S) * 100.0;
        assert!(
            (before - from as f64).abs() < 2.0,
            "{from}→{to}: before {before:.1}"
        );
        // The change lands 5 ms late (half a period, as the owned thread
        // sees it); 100 ms after it the new share holds.
        let after = o.container_share(0, 2 * S + S / 10, 5 * S) * 100.0;
        assert!(
            (after - to as f64).abs() < 2.0,
            "{from}→{to}: after {after:.1}"
        );
        let w = o.accuracy(0, to as f64, 2 * S + S / 4, 5 * S, S / 4, 5.0);
        assert!(w.worst_points <= 5.0, "{from}→{to}: {:?}", w.windows);
    }
    // Removing the limit (`--sm none`) unpaces at once.
    let mut s = solo(132, 30, SHORT_NS, Workload::Async);
    s.containers[0].settings.push((2 * S, Settings::default()));
    let o = run(&s);
    assert!(o.container_share(0, 2 * S + S / 10, s.duration_ns) > 0.999);
}

#[test]
fn policies_disable_force_and_default() {
    let with = |policy| {
        let mut s = solo(132, 30, SHORT_NS, Workload::Async);
        s.containers[0].settings[0].1.policy = policy;
        let o = run(&s);
        o.container_share(0, S, s.duration_ns) * 100.0
    };
    let d = with(Policy::Default);
    let f = with(Policy::Force);
    let off = with(Policy::Disable);
    assert!(
        (d - 30.0).abs() < 1.0,
        "default paces a lone tenant: {d:.1}"
    );
    assert!((f - 30.0).abs() < 1.0, "force paces a lone tenant: {f:.1}");
    assert!(off > 99.9, "disable does not pace: {off:.1}");
}

#[test]
fn suspend_stops_new_launches_until_resume() {
    let mut s = solo(132, 50, SHORT_NS, Workload::Async);
    let base = s.containers[0].settings[0].1;
    s.containers[0].settings.push((
        S,
        Settings {
            suspended: true,
            ..base
        },
    ));
    s.containers[0].settings.push((2 * S, base));
    let o = run(&s);
    // Within 5 ms of the request the queue ran dry and nothing ran until
    // the resume (queued work finishes; no new launch starts).
    let during = o.container_share(0, S + S / 20, 2 * S) * 100.0;
    assert!(during < 0.01, "ran {during:.3} % while suspended");
    let after = o.container_share(0, 2 * S + S / 10, s.duration_ns) * 100.0;
    assert!((after - 50.0).abs() < 2.0, "after resume {after:.1}");
    let before = o.container_share(0, S / 2, S) * 100.0;
    assert!((before - 50.0).abs() < 2.0, "before suspend {before:.1}");
}

#[test]
fn a_busy_high_priority_container_holds_a_low_priority_one() {
    // Low priority, limit 60 %, beside a busy high-priority container; the
    // node side holds it to 20 % from 1 s to 3 s.
    let mut s = tenants(&[60, 100], SHORT_NS, 132, Workload::Async);
    s.duration_ns = 4 * S;
    let low = Settings {
        sm_limit: Some(60),
        priority: Priority(1),
        ..Settings::default()
    };
    s.containers[0].settings = vec![
        (0, low),
        (
            S,
            Settings {
                hold: Some(20),
                ..low
            },
        ),
        (3 * S, low),
    ];
    s.containers[1].settings[0].1.priority = Priority(0);
    let o = run(&s);
    let held = o.container_share(0, S + S / 4, 3 * S) * 100.0;
    assert!((15.0..=25.0).contains(&held), "held at {held:.1} %");
    let high = o.container_share(1, S + S / 4, 3 * S) * 100.0;
    assert!(high >= 78.0, "the high-priority one got {high:.1} %");
    // Released: its 60 % limit, of which the device's time-slicing beside
    // a flat-out neighbour gives it half.
    let free = o.container_share(0, 3 * S + S / 4, 4 * S) * 100.0;
    assert!((free - 50.0).abs() < 3.0, "released: {free:.1} %");
    // The same hold on a high-priority container does nothing.
    let mut s2 = s.clone();
    for st in s2.containers[0].settings.iter_mut() {
        st.1.priority = Priority(0);
    }
    let o2 = run(&s2);
    let not_held = o2.container_share(0, S + S / 4, 3 * S) * 100.0;
    assert!(
        (not_held - 50.0).abs() < 3.0,
        "high priority held: {not_held:.1}"
    );
}

/// Host PID unknown: no NVML truth. Alone, the markers are the truth and
/// the share holds as tightly. With busy neighbours the markers also count
/// the neighbours' time inside our spans: the container is charged more
/// than it used, so it may fall below its share, never above (fail
/// closed). With a real GPU's marker timing (an event waits for its
/// context to hold the device) and bursts shorter than a time slice, short
/// kernels are measured exactly again.
#[test]
fn without_identity_the_share_holds_alone_and_fails_closed_with_neighbours() {
    for pct in [10, 30, 50, 70] {
        let mut s = solo(132, pct, SHORT_NS, Workload::Async);
        s.containers[0].identity = false;
        let o = run(&s);
        check(&o, 0, pct, s.duration_ns, S / 4, "no identity, alone");
    }
    let mut worst: f64 = 1.0;
    for pcts in [
        &[30, 70][..],
        &[10, 90],
        &[20, 30, 50],
        &[30, 100],
        &[50, 100],
    ] {
        for timing in [MarkerTiming::Sim, MarkerTiming::Hardware] {
            for kernel in [SHORT_NS, LONG_NS] {
                let mut s = tenants(pcts, kernel, 132, Workload::Async);
                s.device.markers = timing;
                for c in s.containers.iter_mut() {
                    c.identity = false;
                }
                let o = run(&s);
                for (c, p) in pcts.iter().enumerate().filter(|(_, p)| **p < 100) {
                    let got = o.container_share(c, S, s.duration_ns) * 100.0;
                    // Beside an unlimited neighbour the device's own
                    // time-slicing gives a flat-out tenant half at most.
                    let reachable = if pcts.contains(&100) {
                        (*p as f64).min(50.0)
                    } else {
                        *p as f64
                    };
                    let what =
                        format!("{pcts:?} {timing:?} {kernel} ns: container {c} at {got:.1}");
                    assert!(got <= *p as f64 + 5.0, "above its limit: {what}");
                    assert!(got >= 0.45 * reachable, "starved: {what}");
                    worst = worst.min(got / reachable);
                    if timing == MarkerTiming::Hardware && kernel == SHORT_NS && *p <= 30 {
                        assert!((got - *p as f64).abs() <= 5.0, "{what}");
                    }
                }
            }
        }
    }
    eprintln!("no identity, worst share / reachable share: {worst:.2}");
}
