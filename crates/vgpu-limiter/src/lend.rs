//! Lending: guaranteed shares that are work-conserving (docs/limiter.md,
//! "Guarantees and ceilings"). Each container of a GPU has a *guarantee*
//! (the floor it gets whenever it wants it) and a *ceiling* (what it may
//! reach while others leave time unused). Every control period each
//! container publishes on the GPU's board what it wants, reads every
//! other container's entry, and computes the same allocation from them:
//!
//! 1. each member is first given `min(want, guarantee)`: a busy member its
//!    whole guarantee, an idle one only what it uses;
//! 2. what is left of the device (`spare`) goes to the members that want
//!    more, in proportion to their guarantees, each up to
//!    `min(want, ceiling)` (water-filling: what a capped member cannot take
//!    goes round again);
//! 3. what the guaranteed members cannot take goes to the best-effort
//!    members (no guarantee), equally, each up to its want and ceiling.
//!
//! A member then paces at `max(its allocation, its guarantee)` within its
//! ceiling: its own floor never depends on what the board says, so a
//! lender that becomes busy again has its guarantee at once (its bucket
//! refills at the guarantee from its next launch), and the borrowers give
//! the time back at their next period, when they read its `want`.
//!
//! Pure arithmetic on ppm: no I/O, no allocation (the caller's slices).

use crate::policy::PPM;

/// Least a best-effort member paces at, ppm: it makes progress and
/// answers (as a priority hold of 0 does), at a cost within the bands.
pub const BEST_EFFORT_FLOOR_PPM: u32 = 10_000;

/// Headroom added to an idle member's measured use when it says what it
/// wants: a member using a little more than it did last period is not
/// starved while it ramps up (it becomes `hungry` at its next wait).
pub const WANT_HEADROOM_PPM: u32 = 20_000;

/// One member of a GPU's board as the law sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its floor, ppm (0: best effort).
    pub guarantee_ppm: u32,
    /// Most it may reach, ppm (≥ guarantee).
    pub ceiling_ppm: u32,
    /// What it asks for now, ppm.
    pub want_ppm: u32,
}

impl Member {
    fn cap(&self) -> u32 {
        self.want_ppm
            .min(self.ceiling_ppm.max(self.guarantee_ppm))
            .min(PPM)
    }
}

/// What a member asks for: all it may have (its ceiling) when it waited at
/// the gate in the last period (it had work its rate held back), else what
/// it used plus a little headroom.
pub fn want(hungry: bool, used_ppm: u32, ceiling_ppm: u32) -> u32 {
    if hungry {
        ceiling_ppm.min(PPM)
    } else {
        used_ppm
            .saturating_add(WANT_HEADROOM_PPM)
            .min(ceiling_ppm)
            .min(PPM)
    }
}

/// The allocation of every member into `out` (same length as `members`;
/// a shorter `out` gets the first members only). The sum never exceeds
/// the device (`PPM`) when the guarantees fit in it (the scheduler's
/// admission rule); guarantees over 100 % are scaled down to fit.
pub fn allocate(members: &[Member], out: &mut [u32]) {
    let n = members.len().min(out.len());
    let members = &members[..n];
    let out = &mut out[..n];
    let total_g: u64 = members.iter().map(|m| m.guarantee_ppm as u64).sum();
    // Over-guaranteed (a board the scheduler did not admit): each floor is
    // scaled so they still fit.
    let scale = |g: u32| -> u32 {
        if total_g > PPM as u64 {
            (g as u64 * PPM as u64 / total_g) as u32
        } else {
            g
        }
    };
    let mut used: u64 = 0;
    for (o, m) in out.iter_mut().zip(members) {
        *o = m.cap().min(scale(m.guarantee_ppm));
        used += *o as u64;
    }
    let mut spare = (PPM as u64).saturating_sub(used);
    // Water-fill by guarantee weight; at most n rounds (each caps one).
    for _ in 0..n {
        if spare == 0 {
            break;
        }
        let weight: u64 = members
            .iter()
            .zip(out.iter())
            .filter(|(m, o)| m.guarantee_ppm > 0 && **o < m.cap())
            .map(|(m, _)| m.guarantee_ppm as u64)
            .sum();
        if weight == 0 {
            break;
        }
        let mut given = 0u64;
        for (o, m) in out.iter_mut().zip(members) {
            if m.guarantee_ppm == 0 || *o >= m.cap() {
                continue;
            }
            let part = spare * m.guarantee_ppm as u64 / weight;
            let take = part.min((m.cap() - *o) as u64);
            *o += take as u32;
            given += take;
        }
        if given == 0 {
            break;
        }
        spare -= given;
    }
    // Best effort: what the guaranteed members cannot take, equally.
    for _ in 0..n {
        if spare == 0 {
            break;
        }
        let k = members
            .iter()
            .zip(out.iter())
            .filter(|(m, o)| m.guarantee_ppm == 0 && **o < m.cap())
            .count() as u64;
        if k == 0 || spare < k {
            break;
        }
        let mut given = 0u64;
        for (o, m) in out.iter_mut().zip(members) {
            if m.guarantee_ppm != 0 || *o >= m.cap() {
                continue;
            }
            let take = (spare / k).min((m.cap() - *o) as u64);
            *o += take as u32;
            given += take;
        }
        if given == 0 {
            break;
        }
        spare -= given;
    }
}

/// The share member `me` paces at under `alloc` (from [`allocate`]): its
/// allocation, never below its guarantee (its own floor does not depend
/// on the board), never above its ceiling; a best-effort member at least
/// [`BEST_EFFORT_FLOOR_PPM`].
pub fn pace_at(me: &Member, alloc_ppm: u32) -> u32 {
    let ceiling = me.ceiling_ppm.max(me.guarantee_ppm).min(PPM);
    let floor = if me.guarantee_ppm == 0 {
        BEST_EFFORT_FLOOR_PPM
    } else {
        me.guarantee_ppm
    };
    alloc_ppm.max(floor).min(ceiling).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u32 = PPM / 100;

    fn m(g: u32, c: u32, w: u32) -> Member {
        Member {
            guarantee_ppm: g * P,
            ceiling_ppm: c * P,
            want_ppm: w * P,
        }
    }

    fn alloc(ms: &[Member]) -> Vec<u32> {
        let mut out = vec![0; ms.len()];
        allocate(ms, &mut out);
        out.iter().map(|x| (x + P / 2) / P).collect()
    }

    #[test]
    fn busy_members_split_the_spare_by_guarantee() {
        // 30/30, both busy, ceilings 100: 50/50.
        assert_eq!(alloc(&[m(30, 100, 100), m(30, 100, 100)]), vec![50, 50]);
        // B idle (uses 0, wants its headroom): A takes the rest.
        assert_eq!(alloc(&[m(30, 100, 100), m(30, 100, 2)]), vec![98, 2]);
        // 20/30/50 all busy: exactly the guarantees.
        assert_eq!(
            alloc(&[m(20, 100, 100), m(30, 100, 100), m(50, 100, 100)]),
            vec![20, 30, 50]
        );
        // The 20 idles: its time goes 30:50 to the others.
        let a = alloc(&[m(20, 100, 0), m(30, 100, 100), m(50, 100, 100)]);
        assert_eq!(a, vec![0, 38, 63]);
        // A ceiling holds: 30 with ceiling 60 alone.
        assert_eq!(alloc(&[m(30, 60, 60)]), vec![60]);
        // What a capped member cannot take goes round to the others.
        assert_eq!(alloc(&[m(30, 40, 100), m(10, 100, 100)]), vec![40, 60]);
    }

    #[test]
    fn best_effort_gets_only_what_is_left() {
        // A guaranteed 70 (ceiling 70) beside a best-effort member.
        assert_eq!(alloc(&[m(70, 70, 100), m(0, 100, 100)]), vec![70, 30]);
        // A guaranteed 70 with ceiling 100 leaves nothing.
        assert_eq!(alloc(&[m(70, 100, 100), m(0, 100, 100)]), vec![100, 0]);
        // It paces at its floor then, never at what others are guaranteed.
        let be = m(0, 100, 100);
        assert_eq!(pace_at(&be, 0), BEST_EFFORT_FLOOR_PPM);
        // Two best-effort members alone: half each.
        assert_eq!(alloc(&[m(0, 100, 100), m(0, 100, 100)]), vec![50, 50]);
    }

    #[test]
    fn the_floor_never_depends_on_the_board() {
        let me = m(30, 100, 100);
        // A board that gives it nothing (someone lied): still 30.
        assert_eq!(pace_at(&me, 0), 30 * P);
        assert_eq!(pace_at(&me, 70 * P), 70 * P);
        assert_eq!(pace_at(&me, PPM), PPM);
        // Ceiling below guarantee reads as the guarantee.
        assert_eq!(pace_at(&m(30, 10, 100), PPM), 30 * P);
        // Over-guaranteed boards are scaled to fit the device.
        let a = alloc(&[m(80, 100, 100), m(80, 100, 100)]);
        assert_eq!(a, vec![50, 50]);
    }

    #[test]
    fn the_sum_never_exceeds_the_device() {
        // A small exhaustive sweep over guarantees, ceilings and wants.
        let vals = [0, 10, 20, 30, 50, 70, 100];
        let mut n = 0;
        for &g1 in &vals {
            for &g2 in &vals {
                for &g3 in &[0, 20] {
                    if g1 + g2 + g3 > 100 {
                        continue;
                    }
                    for &w1 in &vals {
                        for &w2 in &vals {
                            for &c in &[30, 60, 100] {
                                let ms =
                                    [m(g1, c.max(g1), w1), m(g2, 100, w2), m(g3, c.max(g3), 100)];
                                let mut out = [0u32; 3];
                                allocate(&ms, &mut out);
                                let sum: u64 = out.iter().map(|&x| x as u64).sum();
                                assert!(sum <= PPM as u64, "{ms:?} → {out:?}");
                                for (o, mm) in out.iter().zip(&ms) {
                                    assert!(*o <= mm.cap(), "{ms:?} → {out:?}");
                                    // A busy guaranteed member gets its floor.
                                    if mm.want_ppm >= mm.guarantee_ppm {
                                        assert!(*o >= mm.guarantee_ppm, "{ms:?} → {out:?}");
                                    }
                                }
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(n > 500);
    }

    /// Several containers on one device, every 10 ms period: each reads
    /// the board, paces at its share; the device time-slices evenly among
    /// those with work beyond what others leave (a fluid model); each then
    /// publishes whether it waited and what it used.
    struct Fleet {
        members: Vec<Member>,
        busy: Vec<bool>,
        rate: Vec<u32>,
        used: Vec<u32>,
        alive: Vec<bool>,
    }

    impl Fleet {
        fn new(gc: &[(u32, u32)]) -> Fleet {
            let n = gc.len();
            Fleet {
                members: gc.iter().map(|&(g, c)| m(g, c, c)).collect(),
                busy: vec![true; n],
                rate: gc.iter().map(|&(g, _)| (g * P).max(1)).collect(),
                used: vec![0; n],
                alive: vec![true; n],
            }
        }

        /// One period: the device, then each member's view.
        fn step(&mut self) {
            let n = self.members.len();
            // Device: each busy member can use up to its rate; if they sum
            // over the device, time-slicing splits evenly (water-filled).
            let mut demand: Vec<u64> = (0..n)
                .map(|i| {
                    if self.busy[i] && self.alive[i] {
                        self.rate[i] as u64
                    } else {
                        0
                    }
                })
                .collect();
            let mut left = PPM as u64;
            let mut got = vec![0u64; n];
            for _ in 0..n {
                let k = demand.iter().filter(|&&d| d > 0).count() as u64;
                if k == 0 || left == 0 {
                    break;
                }
                let each = left / k;
                for (d, g) in demand.iter_mut().zip(got.iter_mut()) {
                    if *d > 0 {
                        let t = (*d).min(each);
                        *g += t;
                        *d -= t;
                        left -= t;
                    }
                }
            }
            for (i, g) in got.iter().enumerate() {
                self.used[i] = *g as u32;
                let hungry = self.busy[i] && self.alive[i];
                if self.alive[i] {
                    self.members[i].want_ppm =
                        want(hungry, self.used[i], self.members[i].ceiling_ppm);
                }
            }
            let board: Vec<Member> = (0..n)
                .filter(|&i| self.alive[i])
                .map(|i| self.members[i])
                .collect();
            let idx: Vec<usize> = (0..n).filter(|&i| self.alive[i]).collect();
            let mut out = vec![0; board.len()];
            allocate(&board, &mut out);
            for (k, &i) in idx.iter().enumerate() {
                self.rate[i] = pace_at(&self.members[i], out[k]);
            }
        }

        fn pct(&self, i: usize) -> f64 {
            self.used[i] as f64 / P as f64
        }

        fn total(&self) -> f64 {
            self.used.iter().map(|&u| u as f64).sum::<f64>() / P as f64
        }
    }

    #[test]
    fn a_lender_idles_and_comes_back() {
        let mut f = Fleet::new(&[(30, 100), (30, 100)]);
        for _ in 0..20 {
            f.step();
        }
        assert!((f.pct(0) - 50.0).abs() < 2.0 && (f.pct(1) - 50.0).abs() < 2.0);
        f.busy[1] = false;
        // Within 1 s (100 periods), A ≥ 90; in fact within a few periods.
        let mut when = None;
        for p in 0..100 {
            f.step();
            if when.is_none() && f.pct(0) >= 90.0 {
                when = Some(p);
            }
        }
        assert!(when.is_some_and(|p| p <= 5), "A reached 90 at {when:?}");
        assert!(f.total() >= 95.0);
        // B resumes: its guarantee back in the very first period.
        f.busy[1] = true;
        f.step();
        assert!(f.pct(1) >= 30.0, "B got {}", f.pct(1));
        assert!(f.pct(0) >= 30.0);
        for _ in 0..3 {
            f.step();
        }
        assert!((f.pct(0) - 50.0).abs() < 2.0 && (f.pct(1) - 50.0).abs() < 2.0);
        assert!(f.total() >= 95.0);
    }

    #[test]
    fn three_members_and_a_dead_borrower() {
        let mut f = Fleet::new(&[(20, 100), (30, 100), (50, 100)]);
        for _ in 0..10 {
            f.step();
        }
        for (i, g) in [20.0, 30.0, 50.0].iter().enumerate() {
            assert!((f.pct(i) - g).abs() < 2.0, "{i}: {}", f.pct(i));
        }
        f.busy[0] = false;
        for _ in 0..10 {
            f.step();
        }
        // 20 split 30:50 → 37.5 / 62.5 (less the idle one's headroom).
        assert!((f.pct(1) - 37.5).abs() < 3.0, "{}", f.pct(1));
        assert!((f.pct(2) - 62.5).abs() < 3.0, "{}", f.pct(2));
        // The 50 dies while borrowing; the lender wakes: at its guarantee
        // at once, and the survivors share the device.
        f.alive[2] = false;
        f.busy[0] = true;
        f.step();
        assert!(f.pct(0) >= 20.0);
        for _ in 0..5 {
            f.step();
        }
        assert!(f.total() >= 95.0, "{}", f.total());
        assert!((f.pct(0) - 40.0).abs() < 2.0, "{}", f.pct(0));
    }
}
