//! Loom model checks of claim, reclaim and admission over a small
//! in-memory region (the same code the mapped file runs, through the
//! `sync` facade). Run:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p vgpu-region --release --test loom`
#![cfg(loom)]

use loom::sync::Arc;
use vgpu_region::model::*;

/// Liveness as the model decides it: PIDs ≥ 90 are dead.
struct ModelEnv;
impl Env for ModelEnv {
    fn is_dead(&self, o: Owner) -> bool {
        o.pid >= 90
    }
}

fn owner(pid: u32) -> Owner {
    Owner {
        ns_index: 0,
        pid,
        start34: 1000 + pid as u64,
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// Set-up before the model's threads start: the owner word of `slot`.
fn own(v: &View<'_>, slot: usize, word: u64) {
    v.owners[slot].store(word, loom::sync::atomic::Ordering::SeqCst);
}

/// Set-up: slots below `n` count in admission sums.
fn high_water(v: &View<'_>, n: u32) {
    v.header
        .slot_high_water
        .store(n, loom::sync::atomic::Ordering::SeqCst);
}

#[test]
fn claims_are_exclusive() {
    builder().check(|| {
        let m = Arc::new(Mem::new(2));
        let hs: Vec<_> = (1..=3)
            .map(|pid| {
                let m = m.clone();
                loom::thread::spawn(move || claim(&m.view(), owner(pid), &ModelEnv))
            })
            .collect();
        let got: Vec<Option<usize>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let won: Vec<usize> = got.iter().flatten().copied().collect();
        // Two slots, three claimers: exactly two win, on different slots.
        assert_eq!(won.len(), 2, "{got:?}");
        assert_ne!(won[0], won[1]);
        for (pid, g) in (1..=3).zip(&got) {
            if let Some(i) = g {
                let (st, o) = decode(m.owners[*i].load(std::sync::atomic::Ordering::SeqCst));
                assert_eq!((st, o), (ST_LIVE, owner(pid)));
            }
        }
    });
}

#[test]
fn reclaim_races_with_claim_and_another_reclaimer() {
    builder().check(|| {
        let m = Arc::new(Mem::new(2));
        {
            // Slot 0: a dead process holding 7 bytes.
            let v = m.view();
            own(&v, 0, encode(ST_LIVE, owner(95)));
            high_water(&v, 1);
            v.total(0, 0).store(7, loom::sync::atomic::Ordering::SeqCst);
        }
        let r1 = {
            let m = m.clone();
            loom::thread::spawn(move || reclaim_dead(&m.view(), owner(1), &ModelEnv))
        };
        let r2 = {
            let m = m.clone();
            loom::thread::spawn(move || reclaim_dead(&m.view(), owner(2), &ModelEnv))
        };
        let c = {
            let m = m.clone();
            loom::thread::spawn(move || {
                let v = m.view();
                let i = claim(&v, owner(3), &ModelEnv)?;
                reserve(&v, i, 0, MemKind::Data, 5, 0, &ModelEnv).unwrap();
                Some(i)
            })
        };
        let freed = r1.join().unwrap() + r2.join().unwrap();
        let mine = c.join().unwrap().expect("a slot is free or freed");
        // The dead slot is freed exactly once; the claimer's bytes survive
        // and the dead process's are gone.
        assert_eq!(freed, 1);
        assert_eq!(device_total(&m.view(), 0), 5);
        let (st, o) = decode(m.owners[mine].load(loom::sync::atomic::Ordering::SeqCst));
        assert_eq!((st, o), (ST_LIVE, owner(3)));
    });
}

#[test]
fn dead_reclaimer_is_taken_over() {
    builder().check(|| {
        let m = Arc::new(Mem::new(1));
        {
            let v = m.view();
            // A reclaimer (pid 96) died half way through clearing slot 0.
            own(&v, 0, encode(ST_RECLAIMING, owner(96)));
            v.total(0, 0).store(9, loom::sync::atomic::Ordering::SeqCst);
            high_water(&v, 1);
        }
        let hs: Vec<_> = (1..=2)
            .map(|pid| {
                let m = m.clone();
                loom::thread::spawn(move || reclaim_dead(&m.view(), owner(pid), &ModelEnv))
            })
            .collect();
        let freed: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(freed, 1);
        assert_eq!(
            m.owners[0].load(loom::sync::atomic::Ordering::SeqCst),
            ST_FREE
        );
        assert_eq!(device_total(&m.view(), 0), 0);
    });
}

#[test]
fn admission_never_overcommits() {
    builder().check(|| {
        let m = Arc::new(Mem::new(3));
        {
            let v = m.view();
            for (i, pid) in [1, 2, 3].into_iter().enumerate() {
                own(&v, i, encode(ST_LIVE, owner(pid)));
            }
            high_water(&v, 3);
            // Slot 2 already holds 4 of the 10 allowed.
            reserve(&v, 2, 0, MemKind::Context, 4, 10, &ModelEnv).unwrap();
        }
        let hs: Vec<_> = (0..2)
            .map(|i| {
                let m = m.clone();
                loom::thread::spawn(move || {
                    reserve(&m.view(), i, 0, MemKind::Data, 4, 10, &ModelEnv).is_ok()
                })
            })
            .collect();
        let wins: Vec<bool> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        // 4 + 4 + 4 > 10: never both.
        assert!(!(wins[0] && wins[1]), "both admitted");
        let admitted = 4 + 4 * wins.iter().filter(|w| **w).count() as u64;
        assert_eq!(device_total(&m.view(), 0), admitted);
    });
}

#[test]
fn release_races_admission_without_underflow() {
    builder().check(|| {
        let m = Arc::new(Mem::new(2));
        {
            let v = m.view();
            own(&v, 0, encode(ST_LIVE, owner(1)));
            own(&v, 1, encode(ST_LIVE, owner(2)));
            high_water(&v, 2);
            reserve(&v, 0, 0, MemKind::Data, 6, 10, &ModelEnv).unwrap();
        }
        let a = {
            let m = m.clone();
            loom::thread::spawn(move || {
                let v = m.view();
                // Two threads of one slot: one over-releases (clamped).
                release(&v, 0, 0, MemKind::Data, 9, &ModelEnv)
            })
        };
        let b = {
            let m = m.clone();
            loom::thread::spawn(move || {
                reserve(&m.view(), 0, 0, MemKind::Data, 3, 10, &ModelEnv).is_ok()
            })
        };
        let rel = a.join().unwrap();
        let won = b.join().unwrap();
        assert_eq!(rel.clamped, rel.released < 9);
        let v = m.view();
        let d = &v.slots[0].devices[0];
        let ld = |a: &loom::sync::atomic::AtomicU64| a.load(loom::sync::atomic::Ordering::SeqCst);
        let total = ld(v.total(0, 0));
        let data = data_of(total, ld(&d.context), ld(&d.module));
        // Whatever the order, nothing wrapped and the data is the total.
        assert!(data <= 9 && total <= 9, "data {data} total {total}");
        assert_eq!(total, data);
        assert_eq!(data + rel.released, 6 + if won { 3 } else { 0 });
    });
}

/// Data has no counter of its own (it is the total less context and
/// module): a free of data racing a context reservation of the same slot
/// takes exactly its bytes, and the kinds still add up to the total.
#[test]
fn a_data_free_racing_a_context_reservation_keeps_the_kinds_exact() {
    builder().check(|| {
        let m = Arc::new(Mem::new(1));
        {
            let v = m.view();
            own(&v, 0, encode(ST_LIVE, owner(1)));
            high_water(&v, 1);
            reserve(&v, 0, 0, MemKind::Context, 4, 20, &ModelEnv).unwrap();
            reserve(&v, 0, 0, MemKind::Data, 6, 20, &ModelEnv).unwrap();
        }
        let a = {
            let m = m.clone();
            loom::thread::spawn(move || release(&m.view(), 0, 0, MemKind::Data, 5, &ModelEnv))
        };
        let b = {
            let m = m.clone();
            loom::thread::spawn(move || {
                reserve(&m.view(), 0, 0, MemKind::Context, 3, 20, &ModelEnv).is_ok()
            })
        };
        let rel = a.join().unwrap();
        assert!(b.join().unwrap());
        assert_eq!((rel.released, rel.clamped), (5, false));
        let v = m.view();
        let d = &v.slots[0].devices[0];
        let ld = |a: &loom::sync::atomic::AtomicU64| a.load(loom::sync::atomic::Ordering::SeqCst);
        let (total, context) = (ld(v.total(0, 0)), ld(&d.context));
        assert_eq!((total, context), (8, 7));
        assert_eq!(data_of(total, context, ld(&d.module)), 1);
    });
}

#[test]
fn admission_sees_a_slot_claimed_concurrently() {
    // The sum covers slots below the high-water mark: a claimer raises it
    // before its first reservation, so a racer never misses its bytes.
    builder().check(|| {
        let m = Arc::new(Mem::new(2));
        {
            let v = m.view();
            own(&v, 0, encode(ST_LIVE, owner(1)));
            high_water(&v, 1);
        }
        let a = {
            let m = m.clone();
            loom::thread::spawn(move || {
                let v = m.view();
                let i = claim(&v, owner(2), &ModelEnv).unwrap();
                assert_eq!(i, 1);
                reserve(&v, i, 0, MemKind::Data, 6, 10, &ModelEnv).is_ok()
            })
        };
        let b = {
            let m = m.clone();
            loom::thread::spawn(move || {
                reserve(&m.view(), 0, 0, MemKind::Data, 6, 10, &ModelEnv).is_ok()
            })
        };
        let (wa, wb) = (a.join().unwrap(), b.join().unwrap());
        assert!(!(wa && wb), "both admitted");
    });
}

/// The TSC clock's anchor (`seqlock::Seq3`): a reader racing two writes
/// and a withdrawal takes the words of one write or nothing, never a mix,
/// and never an older write after a newer one. (Both sides run on spawned
/// threads: loom does not preempt the model's main thread here.)
#[test]
fn a_seqlock_reader_sees_one_whole_write_or_none() {
    use vgpu_region::seqlock::Seq3;
    builder().check(|| {
        let s = Arc::new(Seq3::new());
        let w = {
            let s = s.clone();
            loom::thread::spawn(move || {
                s.write([1, 1, 1]);
                s.write([2, 2, 2]);
                s.withdraw();
            })
        };
        let r = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let mut last = 0;
                for _ in 0..2 {
                    if let Some([a, b, c]) = s.read() {
                        assert!(a == b && b == c, "torn: {a} {b} {c}");
                        assert!(a >= last, "went back from {last} to {a}");
                        last = a;
                    }
                }
            })
        };
        w.join().unwrap();
        r.join().unwrap();
        assert_eq!(s.read(), None, "withdrawn at the end");
    });
}
