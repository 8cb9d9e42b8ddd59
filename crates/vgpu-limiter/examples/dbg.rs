use vgpu_limiter::model::*;
fn main() {
    let sms = 132;
    let k = KernelSpec::lasting(40_000, sms);
    let mut s = Scenario::new(
        sms,
        vec![ContainerSpec::limited(30)],
        vec![TenantSpec::flat_out(0, k)],
    );
    s.sample_every_ns = 1_000_000_000_000; // no correction
    s.duration_ns = 2_000_000_000;
    let o = run(&s);
    println!(
        "launches {:?} credit {:?}..{:?}",
        o.launches, o.min_credit, o.max_credit
    );
    let w = o.windows(0, 0, s.duration_ns, 100_000_000);
    println!(
        "{}",
        w.iter()
            .map(|x| format!("{:.1}", x * 100.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "first intervals {:?}",
        &o.intervals[..o.intervals.len().min(10)]
    );
    println!(
        "n {} later {:?}",
        o.intervals.len(),
        &o.intervals[60..80.min(o.intervals.len())]
    );
}
