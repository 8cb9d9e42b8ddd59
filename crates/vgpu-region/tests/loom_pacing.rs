//! Loom model checks of the SM limiter's shared protocol (`pacing`): the
//! container bucket's refill credits every instant exactly once and its
//! credit never leaves its bounds, and the sampler lease has one holder.
//! Run:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p vgpu-region --release --test loom_pacing`
#![cfg(loom)]

use loom::sync::Arc;
use vgpu_region::model::*;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

const WIDE: Bounds = Bounds {
    cap_ns: 1 << 40,
    floor_ns: -(1 << 40),
};

#[test]
fn refills_credit_each_instant_once() {
    builder().check(|| {
        let m = Arc::new(Mem::new(1));
        // Started at t = 100 with no credit.
        let b = Bucket::new(&m.pacing[0]);
        b.refill(100, 1_000_000, Bounds::new(0, 0));
        assert_eq!(b.credit(), 0);
        let hs: Vec<_> = [150u64, 230, 230]
            .into_iter()
            .map(|now| {
                let m = m.clone();
                // 100 % of the device: one GPU-ns per ns.
                loom::thread::spawn(move || Bucket::new(&m.pacing[0]).refill(now, 1_000_000, WIDE))
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        // Whatever the order, [100, 230) was credited once.
        assert_eq!(Bucket::new(&m.pacing[0]).credit(), 130);
    });
}

#[test]
fn credit_stays_in_bounds_and_sums_exactly() {
    builder().check(|| {
        let m = Arc::new(Mem::new(1));
        let small = Bounds::new(100, -50);
        let b = Bucket::new(&m.pacing[0]);
        b.refill(1, 1_000_000, small); // a full burst: 100
        let t1 = {
            let m = m.clone();
            loom::thread::spawn(move || Bucket::new(&m.pacing[0]).take(70, small))
        };
        let t2 = {
            let m = m.clone();
            loom::thread::spawn(move || Bucket::new(&m.pacing[0]).take(60, small))
        };
        let a = {
            let m = m.clone();
            loom::thread::spawn(move || Bucket::new(&m.pacing[0]).adjust(20, small))
        };
        let before1 = t1.join().unwrap();
        let before2 = t2.join().unwrap();
        a.join().unwrap();
        let c = b.credit();
        assert!((-50..=100).contains(&c), "credit {c} out of bounds");
        // The takes are serialized: one of them saw the other's result.
        assert_ne!(before1, before2);
        // No clamp can fire here unless the adjust landed first (100+20 →
        // capped at 100): 100 - 130 + 20 = -10, or 100 - 130 = -30.
        assert!(c == -10 || c == -30, "credit {c}");
    });
}

#[test]
fn one_sampler_holds_the_lease() {
    builder().check(|| {
        let m = Arc::new(Mem::new(1));
        // Held by slot 7 until t = 100 ms, which is past.
        assert!(try_lease(&m.pacing[0], 7, 0, 100));
        let hs: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|me| {
                let m = m.clone();
                loom::thread::spawn(move || try_lease(&m.pacing[0], me, 200, 50))
            })
            .collect();
        let won: Vec<bool> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
        let winner = if won[0] { 1 } else { 2 };
        let w = m.pacing[0]
            .sampler_lease
            .load(loom::sync::atomic::Ordering::SeqCst);
        assert_eq!(lease_holder(w), Some((winner, 250)));
        // The old holder cannot renew an expired lease someone else took.
        assert!(!try_lease(&m.pacing[0], 7, 210, 100));
    });
}
