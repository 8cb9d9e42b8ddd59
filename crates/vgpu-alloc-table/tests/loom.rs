//! Loom model checks of the table's protocol (the same code the interposer
//! runs, through the `sync` facade). Run:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p vgpu-alloc-table --release --test loom`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use vgpu_alloc_table::AllocTable;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// The slot a key's window starts at in a table of `cap` slots (the
/// table's hash, restated so a test can pick colliding keys).
fn start(key: u64, cap: u64) -> u64 {
    let m = u128::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    ((m as u64) ^ ((m >> 64) as u64)) & (cap - 1)
}

/// `n` distinct keys whose windows all start at the same slot of a `cap`
/// table, so each probes past the slots of the ones before it.
fn colliding(n: usize, cap: u64) -> Vec<u64> {
    let s = start(1 << 21, cap);
    (1u64..)
        .map(|i| i << 21)
        .filter(|&k| start(k, cap) == s)
        .take(n)
        .collect()
}

#[test]
fn two_inserters_and_a_remover() {
    builder().check(|| {
        let k = colliding(3, 4);
        let t = Arc::new(AllocTable::new(4));
        assert!(t.insert(k[0], 10));
        let ins: Vec<_> = [(k[1], 11), (k[2], 12)]
            .into_iter()
            .map(|(key, v)| {
                let t = t.clone();
                thread::spawn(move || t.insert(key, v))
            })
            .collect();
        let rm = {
            let t = t.clone();
            let key = k[0];
            thread::spawn(move || t.remove(key))
        };
        for h in ins {
            assert!(h.join().unwrap(), "4 slots hold 3 keys");
        }
        assert_eq!(rm.join().unwrap(), Some(10));
        // Both inserts landed whole, whichever slot each claimed.
        assert_eq!(t.remove(k[1]), Some(11));
        assert_eq!(t.remove(k[2]), Some(12));
        assert!(t.is_empty());
    });
}

#[test]
fn two_removers_of_one_key() {
    builder().check(|| {
        let t = Arc::new(AllocTable::new(2));
        assert!(t.insert(1 << 21, 7));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                thread::spawn(move || t.remove(1 << 21))
            })
            .collect();
        let got: Vec<Option<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        // Exactly one gets it.
        assert_eq!(
            got.iter().flatten().copied().collect::<Vec<_>>(),
            vec![7],
            "{got:?}"
        );
        assert!(t.is_empty());
    });
}

#[test]
fn a_sweep_racing_a_remove() {
    builder().check(|| {
        let k = colliding(2, 2);
        let t = Arc::new(AllocTable::new(2));
        assert!(t.insert(k[0], 5));
        assert!(t.insert(k[1], 6));
        let rm = {
            let t = t.clone();
            let key = k[1];
            thread::spawn(move || t.remove(key))
        };
        let swept = t.take_matching(|_, _| true);
        let removed = rm.join().unwrap();
        // k[0] only the sweep can take; k[1] exactly one of the two.
        assert!(swept.contains(&(k[0], 5)), "{swept:?}");
        let k1 = swept.iter().filter(|e| e.0 == k[1]).count() + usize::from(removed.is_some());
        assert_eq!(k1, 1, "swept {swept:?}, removed {removed:?}");
        assert!(t.is_empty());
    });
}

#[test]
fn insert_reuses_a_tombstone_while_another_remove_probes() {
    builder().check(|| {
        // a, b, c share a start slot: b lies behind a's slot.
        let k = colliding(3, 2);
        let t = Arc::new(AllocTable::new(2));
        assert!(t.insert(k[0], 1));
        assert!(t.insert(k[1], 2));
        assert_eq!(t.remove(k[0]), Some(1));
        let ins = {
            let t = t.clone();
            let key = k[2];
            thread::spawn(move || t.insert(key, 3))
        };
        let rm = {
            let t = t.clone();
            let key = k[1];
            thread::spawn(move || t.remove(key))
        };
        assert!(ins.join().unwrap(), "the tombstone is free");
        // The remover found b whether it saw the tombstone or c there.
        assert_eq!(rm.join().unwrap(), Some(2));
        assert_eq!(t.remove(k[2]), Some(3));
        assert!(t.is_empty());
    });
}

#[test]
fn a_double_free_racing_a_reuse_of_its_slot() {
    builder().check(|| {
        let k = colliding(2, 2);
        let t = Arc::new(AllocTable::new(2));
        assert!(t.insert(k[0], 1));
        let rms: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                let key = k[0];
                thread::spawn(move || t.remove(key))
            })
            .collect();
        let ins = {
            let t = t.clone();
            let key = k[1];
            thread::spawn(move || t.insert(key, 2))
        };
        let got: Vec<Option<u64>> = rms.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(ins.join().unwrap());
        // The freed value went to exactly one remover, and neither kept the
        // new entry that may have reused its slot.
        assert_eq!(
            got.iter().flatten().copied().collect::<Vec<_>>(),
            vec![1],
            "{got:?}"
        );
        assert_eq!(t.remove(k[1]), Some(2));
        assert!(t.is_empty());
    });
}
