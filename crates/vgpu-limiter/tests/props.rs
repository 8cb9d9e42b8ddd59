//! Invariants of the law for arbitrary inputs: the credit never leaves
//! its bounds (so debt is bounded and nothing overflows), the gate never
//! panics and always answers forward in time, a paced tenant never runs
//! above its share by more than the bank and one launch, whatever its
//! kernels and SM count.
use proptest::prelude::*;
use vgpu_limiter::law::{bounds, gate, rate_ppm, wait_for, Decision, Params};
use vgpu_limiter::model::*;
use vgpu_limiter::{estimate::Estimates, Kind, Target, PPM};
use vgpu_region::pacing::{Bounds, LocalBucket};
use vgpu_region::LimiterState;

#[derive(Clone, Debug)]
enum Op {
    Refill { dt: u64, rate: u32 },
    Take(u64),
    Adjust(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..10_000_000_000, any::<u32>()).prop_map(|(dt, rate)| Op::Refill { dt, rate }),
        any::<u64>().prop_map(Op::Take),
        any::<i64>().prop_map(Op::Adjust),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn credit_stays_within_its_bounds(
        cap in 0i64..i64::MAX, floor in i64::MIN..=0i64,
        ops in proptest::collection::vec(op(), 1..64),
        start in 1u64..1u64 << 62,
    ) {
        let l = LocalBucket::new();
        let b = l.bucket();
        let bd = Bounds::new(cap, floor);
        let mut now = start;
        for o in ops {
            match o {
                Op::Refill { dt, rate } => {
                    now = now.saturating_add(dt);
                    b.refill(now, rate, bd);
                }
                Op::Take(ns) => { b.take(ns, bd); }
                Op::Adjust(d) => { b.adjust(d, bd); }
            }
            let c = b.credit();
            prop_assert!(c >= floor && c <= cap, "credit {} outside [{}, {}]", c, floor, cap);
        }
    }

    #[test]
    fn the_gate_always_answers_forward_in_time(
        share in 1u32..=PPM, est in any::<u64>(), now in 1u64..u64::MAX / 4,
        credit_moves in proptest::collection::vec(any::<i64>(), 0..8),
        correction in any::<u32>(),
    ) {
        let p = Params::default();
        let l = LocalBucket::new();
        let b = l.bucket();
        b.set_correction_ppm(correction);
        for d in credit_moves {
            b.adjust(d, bounds(share, &p));
        }
        match gate(&b, now, share, est, &p) {
            Decision::Go { charge_ns } => prop_assert_eq!(charge_ns, est),
            Decision::Wait { until_ns } => {
                prop_assert!(until_ns > now);
                prop_assert!(until_ns - now <= p.period_ns);
            }
        }
        let bd = bounds(share, &p);
        prop_assert!(b.credit() >= bd.floor_ns && b.credit() <= bd.cap_ns);
        prop_assert!(rate_ppm(share, correction) <= vgpu_limiter::law::MAX_RATE_PPM);
        let w = wait_for(i64::MIN, share, &p);
        prop_assert!(w >= p.min_wait_ns && w <= p.period_ns);
    }

    #[test]
    fn estimates_and_targets_never_overflow(
        samples in proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..32),
        code in any::<u32>(), share in any::<u32>(),
    ) {
        let mut e = Estimates::default();
        for (n, ns, g) in samples {
            let kind = if g % 3 == 0 { Kind::Graph(g) } else { Kind::Kernel };
            e.add(kind, n, ns);
            if n > 0 {
                prop_assert!(e.get(kind).is_some());
            }
        }
        let t = Target::unpack(((code as u64) << 32) | share as u64);
        prop_assert!(t.share_ppm <= PPM);
        if let Some(st) = LimiterState::from_code(code) {
            prop_assert_eq!(t.state, st);
            prop_assert_eq!(Target::unpack(t.pack()), t);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Arbitrary kernels (1 µs to 20 ms), SM counts and workloads, alone
    /// on the model for 1.5 s: the debt never passes its floor, the bank
    /// never its cap, and from 0.5 s on the tenant never runs above its
    /// share by more than its bank and one kernel.
    #[test]
    fn a_paced_tenant_never_runs_above_its_share(
        sms in 1u32..256, pct in 1u32..100, kernel_ns in 1_000u64..20_000_000,
        wl in 0u8..3, blocks in 1u64..4096,
    ) {
        let k = KernelSpec { blocks, block_ns: (kernel_ns / blocks.div_ceil(sms as u64)).max(1) };
        let mut t = TenantSpec::flat_out(0, k);
        t.workload = match wl {
            0 => Workload::Async,
            1 => Workload::Sync { host_ns: 5_000 },
            _ => Workload::Graph { nodes: 4 },
        };
        let mut s = Scenario::new(sms, vec![ContainerSpec::limited(pct)], vec![t]);
        s.duration_ns = 1_500_000_000;
        let o = run(&s);
        let p = Params::default();
        let bd = bounds(pct * 10_000, &p);
        prop_assert!(o.min_credit[0] >= bd.floor_ns, "debt {} past floor {}", o.min_credit[0], bd.floor_ns);
        prop_assert!(o.max_credit[0] <= bd.cap_ns);
        let span = 1_000_000_000u64;
        let got = o.container_share(0, 500_000_000, 500_000_000 + span);
        let kernels = if wl == 2 { 4 } else { 1 };
        let slack = (bd.cap_ns as f64 + (kernels * k.duration(sms)) as f64 * 2.0) / span as f64;
        prop_assert!(
            got <= pct as f64 / 100.0 + slack + 0.01,
            "share {:.4} above {}% + slack {:.4}", got, pct, slack
        );
    }
}
