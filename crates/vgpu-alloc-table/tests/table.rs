//! The table against a model (proptest), and under real threads.
#![cfg(not(loom))]

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use vgpu_alloc_table::AllocTable;

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u64),
    Remove(u64),
    /// Take every entry whose value is ≡ r (mod 3).
    Take(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct keys (1..=24) over a 16-slot table: windows fill, keys
    // come back after removal, tombstones get reused.
    prop_oneof![
        4 => (1u64..=24, 1u64..1000).prop_map(|(k, v)| Op::Insert(k << 21, v)),
        3 => (1u64..=24).prop_map(|k| Op::Remove(k << 21)),
        1 => (0u64..3).prop_map(Op::Take),
    ]
}

proptest! {
    /// The caller's view (table + a fallback map for what the table
    /// refused) always agrees with a plain map.
    #[test]
    fn agrees_with_a_map(ops in proptest::collection::vec(op(), 1..200)) {
        let t = AllocTable::new(16);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut fallback: HashMap<u64, u64> = HashMap::new();
        for op in ops {
            match op {
                // The caller never inserts a key it holds.
                Op::Insert(k, _) if model.contains_key(&k) => {}
                Op::Insert(k, v) => {
                    model.insert(k, v);
                    if !t.insert(k, v) {
                        fallback.insert(k, v);
                    }
                }
                Op::Remove(k) => {
                    let got = t.remove(k).or_else(|| fallback.remove(&k));
                    prop_assert_eq!(got, model.remove(&k));
                }
                Op::Take(r) => {
                    let mut got = t.take_matching(|_, v| v % 3 == r);
                    let fb: Vec<u64> = fallback.keys().copied().filter(|k| fallback[k] % 3 == r).collect();
                    got.extend(fb.into_iter().map(|k| (k, fallback.remove(&k).unwrap_or(0))));
                    got.sort_unstable();
                    let mut want: Vec<(u64, u64)> = model.iter().filter(|(_, v)| *v % 3 == r).map(|(k, v)| (*k, *v)).collect();
                    want.sort_unstable();
                    for (k, _) in &want {
                        model.remove(k);
                    }
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(t.len() + fallback.len(), model.len());
        }
    }
}

/// Four threads, disjoint keys, many insert/remove rounds: nothing lost,
/// nothing taken twice, the table empty at the end.
#[test]
fn disjoint_threads_keep_every_value() {
    let t = Arc::new(AllocTable::new(4096));
    let hs: Vec<_> = (0..4u64)
        .map(|th| {
            let t = t.clone();
            std::thread::spawn(move || {
                let (mut put, mut took, mut refused) = (0u64, 0u64, 0u64);
                for round in 0..2000u64 {
                    // 64 live pointers per thread, 2 MiB apart.
                    let keys: Vec<u64> = (0..64)
                        .map(|i| ((th * 64 + i + 1) << 21) | 0x7f00_0000_0000)
                        .collect();
                    for (i, &k) in keys.iter().enumerate() {
                        let v = round * 64 + i as u64 + 1;
                        if t.insert(k, v) {
                            put += v;
                        } else {
                            refused += 1;
                        }
                    }
                    for &k in &keys {
                        took += t.remove(k).unwrap_or(0);
                    }
                }
                (put, took, refused)
            })
        })
        .collect();
    let mut refused = 0;
    for h in hs {
        let (put, took, r) = h.join().expect("worker");
        assert_eq!(put, took);
        refused += r;
    }
    assert!(t.is_empty(), "{} entries left", t.len());
    // 256 live keys in 4096 slots: a window never fills.
    assert_eq!(refused, 0);
}

/// Two threads remove the same keys (a double free racing): each value
/// is taken exactly once.
#[test]
fn racing_removers_take_each_value_once() {
    for _ in 0..50 {
        let t = Arc::new(AllocTable::new(1024));
        let keys: Vec<u64> = (1..=256u64).map(|i| i << 21).collect();
        for &k in &keys {
            assert!(t.insert(k, k >> 21));
        }
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (t, keys) = (t.clone(), keys.clone());
                std::thread::spawn(move || {
                    keys.iter()
                        .filter_map(|&k| t.remove(k))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = hs
            .into_iter()
            .flat_map(|h| h.join().expect("remover"))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (1..=256).collect::<Vec<u64>>());
        assert!(t.is_empty());
    }
}

/// A sweep racing removers of the same entries: each taken exactly once.
#[test]
fn a_sweep_and_removers_take_each_value_once() {
    for _ in 0..50 {
        let t = Arc::new(AllocTable::new(1024));
        for i in 1..=256u64 {
            assert!(t.insert(i << 21, i));
        }
        let remover = {
            let t = t.clone();
            std::thread::spawn(move || {
                (1..=256u64)
                    .rev()
                    .filter_map(|i| t.remove(i << 21))
                    .collect::<Vec<u64>>()
            })
        };
        let mut all: Vec<u64> = t
            .take_matching(|_, _| true)
            .into_iter()
            .map(|(k, v)| {
                assert_eq!(k >> 21, v, "a sweep reports the key with its value");
                v
            })
            .collect();
        all.extend(remover.join().expect("remover"));
        all.sort_unstable();
        assert_eq!(all, (1..=256).collect::<Vec<u64>>());
    }
}
