//! A sequence lock over three words: one writer publishes them together,
//! readers on hot paths take a consistent copy or learn that none is to
//! be had right now, and never wait (they fall back to a slower source).
//!
//! The orders follow the usual seqlock over atomics: the writer makes the
//! count odd, a release fence, the words, then the count even with
//! release; a reader loads the count with acquire, the words, an acquire
//! fence, then the count again. Equal and even counts mean the words all
//! came from one write (model-checked in `tests/loom.rs`).

use crate::sync::{fence, AtomicU64, Ordering};

/// Three words written together. Writers must not race each other (the
/// caller serializes them); readers may race anything.
#[derive(Debug)]
pub struct Seq3 {
    /// Even and not 0: the words hold a write; odd: one is under way.
    seq: AtomicU64,
    words: [AtomicU64; 3],
}

impl Seq3 {
    /// Nothing published yet: every read is `None`.
    #[cfg(not(loom))]
    pub const fn new() -> Seq3 {
        Seq3 {
            seq: AtomicU64::new(0),
            words: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Nothing published yet (loom's atomics are not `const`).
    #[cfg(loom)]
    pub fn new() -> Seq3 {
        Seq3 {
            seq: AtomicU64::new(0),
            words: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Publishes `w`. One writer at a time.
    pub fn write(&self, w: [u64; 3]) {
        let s = self.seq.load(Ordering::Relaxed);
        // Odd from the writer's first store on (a withdrawn count is odd
        // already); the count only grows, so no reader sees it come back.
        let odd = s | 1;
        self.seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (cell, v) in self.words.iter().zip(w) {
            cell.store(v, Ordering::Relaxed);
        }
        self.seq.store(odd.wrapping_add(1), Ordering::Release);
    }

    /// Withdraws what was published: reads are `None` until the next write.
    pub fn withdraw(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s | 1, Ordering::Release);
    }

    /// The words of one write, or `None` while none is published or a
    /// write is under way (one attempt: the caller has a slower way).
    #[inline]
    pub fn read(&self) -> Option<[u64; 3]> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 || s1 == 0 {
            return None;
        }
        let w = [
            self.words[0].load(Ordering::Relaxed),
            self.words[1].load(Ordering::Relaxed),
            self.words[2].load(Ordering::Relaxed),
        ];
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(w)
    }
}

#[cfg(not(loom))]
impl Default for Seq3 {
    fn default() -> Seq3 {
        Seq3::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_read_whole_and_a_withdrawal_hides_it_until_the_next() {
        let s = Seq3::new();
        assert_eq!(s.read(), None, "nothing published yet");
        s.write([1, 2, 3]);
        assert_eq!(s.read(), Some([1, 2, 3]));
        s.write([4, 5, 6]);
        assert_eq!(s.read(), Some([4, 5, 6]));
        s.withdraw();
        assert_eq!(s.read(), None);
        s.withdraw();
        assert_eq!(s.read(), None, "a second withdrawal keeps it hidden");
        s.write([7, 8, 9]);
        assert_eq!(s.read(), Some([7, 8, 9]));
    }

    #[test]
    fn racing_readers_never_see_words_of_two_writes() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        let s = std::sync::Arc::new(Seq3::new());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let seen = std::sync::Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (s, stop, seen) = (s.clone(), stop.clone(), seen.clone());
                std::thread::spawn(move || {
                    while !stop.load(Relaxed) {
                        if let Some([a, b, c]) = s.read() {
                            assert!(a == b && b == c, "torn read {a} {b} {c}");
                            seen.fetch_add(1, Relaxed);
                        }
                    }
                })
            })
            .collect();
        // Writes go on until the readers have read a while beside them (a
        // loaded machine may start them late), for at most 20 s.
        let t0 = std::time::Instant::now();
        let mut i = 0u64;
        while seen.load(Relaxed) < 100_000 && t0.elapsed() < std::time::Duration::from_secs(20) {
            i += 1;
            s.write([i, i, i]);
        }
        stop.store(true, Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        assert!(
            seen.load(Relaxed) >= 100_000,
            "the readers read {} times",
            seen.load(Relaxed)
        );
        assert!(i > 0);
    }
}
