use vgpu_limiter::model::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sms: u32 = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(132);
    let kns: u64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(40_000);
    let pcts: Vec<u32> = args
        .get(3)
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or(vec![30]);
    let mode = args.get(4).cloned().unwrap_or("async".into());
    let ident = args.get(5).map(|s| s != "noid").unwrap_or(true);
    let k = KernelSpec::lasting(kns, sms);
    let containers: Vec<ContainerSpec> = pcts
        .iter()
        .map(|p| {
            let mut c = if *p >= 100 {
                ContainerSpec::unlimited()
            } else {
                ContainerSpec::limited(*p)
            };
            c.identity = ident;
            c
        })
        .collect();
    let tenants = (0..pcts.len())
        .map(|c| {
            let mut t = TenantSpec::flat_out(c, k);
            if mode == "sync" {
                t.workload = Workload::Sync { host_ns: 10_000 };
            }
            if mode == "graph" {
                t.workload = Workload::Graph { nodes: 8 };
            }
            t
        })
        .collect();
    let mut s = Scenario::new(sms, containers, tenants);
    if args.get(6).map(|s| s == "hw").unwrap_or(false) {
        s.device.markers = MarkerTiming::Hardware;
    }
    if let Ok(v) = std::env::var("BATCH") {
        s.params.batch_ns = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("MP") {
        s.params.marker_period_ns = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("SLICE") {
        s.device.timeslice_ns = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("SAMPLE") {
        s.sample_every_ns = v.parse().unwrap();
    }
    let t0 = std::time::Instant::now();
    let o = run(&s);
    println!(
        "run took {:?}; launches {:?}; corr {:?}; credit min {:?} max {:?}",
        t0.elapsed(),
        o.launches,
        o.correction_ppm,
        o.min_credit,
        o.max_credit
    );
    for c in 0..pcts.len() {
        let w = o.windows(c, 0, s.duration_ns, 250_000_000);
        println!(
            "c{c} target {} : {}",
            pcts[c],
            w.iter()
                .map(|x| format!("{:.1}", x * 100.0))
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!(
            "   util {:?}",
            o.util[c].iter().map(|x| x.1 / 10000).collect::<Vec<_>>()
        );
    }
}
