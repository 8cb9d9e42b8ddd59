//! Measuring the GPU time a process's launches take, with markers (stream
//! events) around bursts of launches: a start marker before a burst's first
//! launch, an end marker after its last, and the elapsed time between them
//! once both have happened. One marker pair per burst (bursts close after
//! `marker_period` or at a synchronize), so the cost per launch is a few
//! counter updates; the events cost is per burst.
//!
//! Owns the bookkeeping only: recording, querying and recycling events is
//! the driver's (`Markers`, implemented by the interposer over its
//! `CudaDriver`, and by the model in tests). Fixed-size arrays, no
//! allocation, no panics.
//!
//! What can go wrong and what it does: an event the driver refuses leaves
//! its launches unmeasured (their estimate stands); a burst whose stream
//! probably drained before it was closed (no launch and no synchronize for
//! a while) is dropped rather than measured across the idle gap; overlapping
//! bursts on concurrent streams over-count (charge more, never less).

use crate::estimate::Kind;
use crate::law::Params;

/// Open bursts (one per stream in use).
pub const OPEN: usize = 4;
/// Closed bursts waiting for their markers.
pub const PENDING: usize = 16;
/// A pending burst is overdue after 4× the GPU time still unmeasured plus
/// this.
const OVERDUE_MIN_NS: u64 = 5_000_000;

/// Where a pair of markers stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elapsed {
    /// Both happened: GPU-ns from the first to the second.
    Ready(u64),
    /// Not yet.
    Pending,
    /// The driver cannot say (an error): the burst goes unmeasured.
    Failed,
}

/// The driver side of markers.
pub trait Markers {
    /// A recorded event.
    type Mark: Copy;
    /// Records a marker on `stream` (after the work queued on it so far).
    fn record(&self, stream: u64) -> Option<Self::Mark>;
    /// Time between two recorded markers.
    fn elapsed(&self, start: Self::Mark, end: Self::Mark) -> Elapsed;
    /// Gives a marker back (for reuse).
    fn release(&self, m: Self::Mark);
}

#[derive(Clone, Copy, Debug)]
struct Open<M> {
    /// Tells this burst from a later one on the same stream.
    id: u64,
    stream: u64,
    start: M,
    kind: Kind,
    opened_ns: u64,
    last_ns: u64,
    launches: u32,
    charged_ns: u64,
    close_now: bool,
}

impl<M> Open<M> {
    /// Counts one launch into the burst; whether the burst must close now
    /// (old enough, full, a graph: measured alone, a probe: at once).
    fn count(&mut self, now_ns: u64, charged_ns: u64, estimated: bool, p: &Params) -> bool {
        self.launches += 1;
        self.charged_ns = self.charged_ns.saturating_add(charged_ns);
        self.last_ns = now_ns;
        self.launches >= p.max_burst_launches
            || now_ns.saturating_sub(self.opened_ns) >= p.marker_period_ns
            || matches!(self.kind, Kind::Graph(_))
            || !estimated
    }
}

#[derive(Clone, Copy, Debug)]
struct Closed<M> {
    start: M,
    end: M,
    kind: Kind,
    closed_ns: u64,
    launches: u32,
    charged_ns: u64,
}

/// A burst whose markers were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    /// What was launched.
    pub kind: Kind,
    /// How many launches.
    pub launches: u32,
    /// What they were charged.
    pub charged_ns: u64,
    /// What the markers say they took (`None`: unusable).
    pub measured_ns: Option<u64>,
}

/// Counters for display and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterStats {
    /// Markers the driver refused to record or read.
    pub failures: u64,
    /// Bursts dropped because their stream likely went idle before closing.
    pub dropped: u64,
    /// Bursts measured.
    pub measured: u64,
}

/// One process's bursts on one device.
#[derive(Debug)]
pub struct Meter<M: Copy> {
    open: [Option<Open<M>>; OPEN],
    /// The next burst's id.
    next_id: u64,
    pending: [Option<Closed<M>>; PENDING],
    head: usize,
    len: usize,
    stats: MeterStats,
}

impl<M: Copy> Default for Meter<M> {
    fn default() -> Self {
        Meter {
            open: [None; OPEN],
            next_id: 0,
            pending: [None; PENDING],
            head: 0,
            len: 0,
            stats: MeterStats::default(),
        }
    }
}

impl<M: Copy> Meter<M> {
    /// Counters so far.
    pub fn stats(&self) -> MeterStats {
        self.stats
    }

    /// Closed bursts not yet read.
    pub fn pending(&self) -> usize {
        self.len
    }

    /// GPU-ns charged to bursts not yet read (closed and open).
    pub fn unmeasured_ns(&self) -> u64 {
        let closed: u64 = (0..self.len)
            .filter_map(|i| self.pending[(self.head + i) % PENDING])
            .map(|c| c.charged_ns)
            .sum();
        closed
            + self
                .open
                .iter()
                .flatten()
                .map(|o| o.charged_ns)
                .sum::<u64>()
    }

    /// Must the next launch wait for a measurement? When the pending queue
    /// is full; while probing (no estimate yet: one launch measured before
    /// the next); and when the oldest pending burst is overdue, i.e. the
    /// device has taken far longer than its estimate (an underestimate:
    /// launches wait for the truth rather than pile up on a wrong guess).
    pub fn blocked(&self, now_ns: u64, estimated: bool) -> bool {
        if self.len == PENDING {
            return true;
        }
        if !estimated && (self.len > 0 || self.open.iter().flatten().any(|o| o.launches > 0)) {
            return true;
        }
        match self.pending[self.head % PENDING].filter(|_| self.len > 0) {
            Some(c) => {
                // The budget is never below 5 ms: a younger burst is not
                // overdue, and the sum over the bursts (every launch while
                // one waits to be read) is skipped.
                let age = now_ns.saturating_sub(c.closed_ns);
                age > OVERDUE_MIN_NS
                    && age > 4u64.saturating_mul(self.unmeasured_ns()) + OVERDUE_MIN_NS
            }
            None => false,
        }
    }

    /// Before a launch of `kind` on `stream`: makes sure a burst is open
    /// for it (closing one of another kind, and dropping one whose stream
    /// probably drained) and returns its index. `None` when the launch goes
    /// unmeasured (the driver refused a marker, or every burst is full).
    fn before_launch<K: Markers<Mark = M>>(
        &mut self,
        k: &K,
        now_ns: u64,
        stream: u64,
        kind: Kind,
        p: &Params,
    ) -> Option<usize> {
        if let Some(i) = self.find(stream) {
            let o = self.open[i]?;
            if o.kind != kind || o.close_now {
                self.close(k, i, now_ns);
            } else if o.launches > 0 && self.drained(&o, now_ns, p) {
                self.drop_open(k, i);
            } else {
                return Some(i);
            }
        }
        let i = match self.open.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                // Every slot in use: close the least recently used.
                let mut lru = 0;
                for (i, o) in self.open.iter().enumerate() {
                    if let (Some(a), Some(b)) = (o, self.open[lru]) {
                        if a.last_ns < b.last_ns {
                            lru = i;
                        }
                    }
                }
                self.close(k, lru, now_ns);
                if self.open[lru].is_some() {
                    // Could not close (pending full): this launch goes
                    // unmeasured.
                    return None;
                }
                lru
            }
        };
        let Some(start) = k.record(stream) else {
            self.stats.failures += 1;
            return None;
        };
        self.next_id = self.next_id.wrapping_add(1);
        self.open[i] = Some(Open {
            id: self.next_id,
            stream,
            start,
            kind,
            opened_ns: now_ns,
            last_ns: now_ns,
            launches: 0,
            charged_ns: 0,
            close_now: false,
        });
        Some(i)
    }

    /// At the gate, before the launch call: opens its burst if needed, then counts
    /// the launch into its stream's burst as if it went through, so a
    /// launch that does go through needs nothing after its call unless its
    /// burst must close then (old enough, full, a graph measured alone, a
    /// probe measured at once). Returns the burst's id and whether it must
    /// close after the call; `None` when the launch goes unmeasured. Then [`settle`](Self::settle) a launch that failed
    /// or must close its burst.
    #[allow(clippy::too_many_arguments)]
    pub fn count_at_gate<K: Markers<Mark = M>>(
        &mut self,
        k: &K,
        now_ns: u64,
        stream: u64,
        kind: Kind,
        charged_ns: u64,
        estimated: bool,
        p: &Params,
    ) -> Option<(u64, bool)> {
        let i = self.before_launch(k, now_ns, stream, kind, p)?;
        let o = self.open[i].as_mut()?;
        let close = o.count(now_ns, charged_ns, estimated, p);
        Some((o.id, close))
    }

    /// After the call of a launch [`count_at_gate`](Self::count_at_gate)
    /// counted into burst `id`: one that failed is taken back out (a
    /// burst left empty is dropped); one
    /// whose burst must close closes it now (its end marker after the
    /// launch). Nothing when that burst was closed meanwhile.
    pub fn settle<K: Markers<Mark = M>>(
        &mut self,
        k: &K,
        now_ns: u64,
        stream: u64,
        id: u64,
        charged_ns: u64,
        ok: bool,
    ) {
        let Some(i) = self
            .find(stream)
            .filter(|&i| self.open[i].is_some_and(|o| o.id == id))
        else {
            return;
        };
        let Some(o) = self.open[i].as_mut() else {
            return;
        };
        if !ok {
            o.launches = o.launches.saturating_sub(1);
            o.charged_ns = o.charged_ns.saturating_sub(charged_ns);
            if o.launches == 0 {
                let start = o.start;
                self.open[i] = None;
                k.release(start);
            }
            return;
        }
        self.close(k, i, now_ns);
        if let Some(o) = self.open[i].as_mut() {
            // Pending is full: close at the next chance.
            o.close_now = true;
        }
    }

    /// Before a synchronize (stream, context, event; a blocking copy):
    /// closes every open burst that holds launches, so a
    /// launch-then-synchronize loop is measured launch by launch and no
    /// burst spans the host's time between them.
    pub fn close_all<K: Markers<Mark = M>>(&mut self, k: &K, now_ns: u64) {
        for i in 0..OPEN {
            if self.open[i].is_some_and(|o| o.launches > 0) {
                self.close(k, i, now_ns);
            }
        }
    }

    /// As [`close_all`](Self::close_all), but a burst whose stream
    /// probably drained since its last launch (the launching thread was
    /// away: a loaded CPU) is dropped, not measured: its end marker,
    /// recorded now on an idle stream, would count the idle gap as the
    /// container's time and charge it for time the device sat idle.
    pub fn close_or_drop_all<K: Markers<Mark = M>>(&mut self, k: &K, now_ns: u64, p: &Params) {
        for i in 0..OPEN {
            let Some(o) = self.open[i] else { continue };
            if o.launches == 0 {
                continue;
            }
            if self.drained(&o, now_ns, p) {
                self.drop_open(k, i);
            } else {
                self.close(k, i, now_ns);
            }
        }
    }

    /// The oldest closed burst, once its markers have happened.
    pub fn poll<K: Markers<Mark = M>>(&mut self, k: &K) -> Option<Measured> {
        if self.len == 0 {
            return None;
        }
        let c = self.pending[self.head]?;
        let measured = match k.elapsed(c.start, c.end) {
            Elapsed::Pending => return None,
            Elapsed::Ready(ns) => {
                self.stats.measured += 1;
                Some(ns)
            }
            Elapsed::Failed => {
                self.stats.failures += 1;
                None
            }
        };
        k.release(c.start);
        k.release(c.end);
        self.pending[self.head] = None;
        self.head = (self.head + 1) % PENDING;
        self.len -= 1;
        Some(Measured {
            kind: c.kind,
            launches: c.launches,
            charged_ns: c.charged_ns,
            measured_ns: measured,
        })
    }

    /// Drops every marker (a fork child, an exit, a lost context): nothing
    /// pending is read.
    pub fn clear<K: Markers<Mark = M>>(&mut self, k: &K) {
        for i in 0..OPEN {
            if let Some(o) = self.open[i].take() {
                k.release(o.start);
            }
        }
        while self.len > 0 {
            if let Some(c) = self.pending[self.head].take() {
                k.release(c.start);
                k.release(c.end);
            }
            self.head = (self.head + 1) % PENDING;
            self.len -= 1;
        }
    }

    fn find(&self, stream: u64) -> Option<usize> {
        self.open
            .iter()
            .position(|o| o.is_some_and(|o| o.stream == stream))
    }

    /// The stream has probably run dry since the burst's last launch: its
    /// work (as charged) would have finished long ago. Closing it now would
    /// measure the idle gap too.
    fn drained(&self, o: &Open<M>, now_ns: u64, p: &Params) -> bool {
        let due = o
            .opened_ns
            .saturating_add(o.charged_ns.saturating_mul(2))
            .saturating_add(p.marker_period_ns);
        now_ns > due && now_ns.saturating_sub(o.last_ns) > p.marker_period_ns / 4
    }

    fn drop_open<K: Markers<Mark = M>>(&mut self, k: &K, i: usize) {
        if let Some(o) = self.open[i].take() {
            k.release(o.start);
            self.stats.dropped += 1;
        }
    }

    fn close<K: Markers<Mark = M>>(&mut self, k: &K, i: usize, _now_ns: u64) {
        let Some(o) = self.open[i] else { return };
        if o.launches == 0 {
            self.open[i] = None;
            k.release(o.start);
            return;
        }
        if self.len == PENDING {
            return;
        }
        self.open[i] = None;
        let Some(end) = k.record(o.stream) else {
            self.stats.failures += 1;
            k.release(o.start);
            return;
        };
        let at = (self.head + self.len) % PENDING;
        self.pending[at] = Some(Closed {
            start: o.start,
            end,
            kind: o.kind,
            closed_ns: _now_ns,
            launches: o.launches,
            charged_ns: o.charged_ns,
        });
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Markers whose times the test sets; records which were released.
    #[derive(Default)]
    struct Fake {
        next: RefCell<u32>,
        times: RefCell<Vec<Option<u64>>>,
        released: RefCell<Vec<u32>>,
        refuse: RefCell<bool>,
    }

    impl Markers for Fake {
        type Mark = u32;
        fn record(&self, _stream: u64) -> Option<u32> {
            if *self.refuse.borrow() {
                return None;
            }
            let mut n = self.next.borrow_mut();
            *n += 1;
            self.times.borrow_mut().push(None);
            Some(*n - 1)
        }
        fn elapsed(&self, a: u32, b: u32) -> Elapsed {
            let t = self.times.borrow();
            match (t[a as usize], t[b as usize]) {
                (Some(x), Some(y)) => Elapsed::Ready(y - x),
                _ => Elapsed::Pending,
            }
        }
        fn release(&self, m: u32) {
            self.released.borrow_mut().push(m);
        }
    }

    impl Fake {
        fn happen(&self, m: u32, at: u64) {
            self.times.borrow_mut()[m as usize] = Some(at);
        }
    }

    /// A launch as the pacer meters it: counted at the gate, settled after
    /// its call (at the gate's time) when it failed or must close its
    /// burst. Whether it was metered.
    #[allow(clippy::too_many_arguments)]
    fn gate(
        m: &mut Meter<u32>,
        k: &Fake,
        now: u64,
        stream: u64,
        kind: Kind,
        charged_ns: u64,
        ok: bool,
        estimated: bool,
        p: &Params,
    ) -> bool {
        match m.count_at_gate(k, now, stream, kind, charged_ns, estimated, p) {
            Some((id, close)) => {
                if close || !ok {
                    m.settle(k, now, stream, id, charged_ns, ok);
                }
                true
            }
            None => false,
        }
    }

    #[test]
    fn bursts_close_by_age_and_sync_and_read_in_order() {
        let p = Params::default();
        let k = Fake::default();
        let mut m = Meter::default();
        assert!(gate(&mut m, &k, 0, 7, Kind::Kernel, 50_000, true, true, &p));
        assert!(gate(
            &mut m,
            &k,
            2_000,
            7,
            Kind::Kernel,
            50_000,
            true,
            true,
            &p
        ));
        assert_eq!(m.pending(), 0);
        // Age: the marker period passed.
        assert!(gate(
            &mut m,
            &k,
            2_000_000,
            7,
            Kind::Kernel,
            50_000,
            true,
            true,
            &p
        ));
        assert_eq!(m.pending(), 1);
        // A synchronize closes whatever holds launches.
        assert!(gate(
            &mut m,
            &k,
            2_100_000,
            7,
            Kind::Kernel,
            50_000,
            true,
            true,
            &p
        ));
        m.close_all(&k, 2_100_002);
        assert_eq!(m.pending(), 2);
        assert!(m.poll(&k).is_none(), "markers not happened yet");
        k.happen(0, 10);
        k.happen(1, 160_010);
        let r = m.poll(&k).unwrap();
        assert_eq!(
            r,
            Measured {
                kind: Kind::Kernel,
                launches: 3,
                charged_ns: 150_000,
                measured_ns: Some(160_000)
            }
        );
        assert_eq!(k.released.borrow().as_slice(), &[0, 1]);
        k.happen(2, 200_000);
        k.happen(3, 240_000);
        assert_eq!(m.poll(&k).unwrap().measured_ns, Some(40_000));
        assert!(m.poll(&k).is_none());
        assert_eq!(m.stats().measured, 2);
    }

    #[test]
    fn probing_blocks_until_measured_and_graphs_go_alone() {
        let p = Params::default();
        let k = Fake::default();
        let mut m = Meter::default();
        assert!(!m.blocked(0, false));
        gate(
            &mut m,
            &k,
            0,
            1,
            Kind::Kernel,
            p.initial_estimate_ns,
            true,
            false,
            &p,
        );
        assert_eq!(m.pending(), 1, "a probe is closed at once");
        assert!(m.blocked(2, false));
        k.happen(0, 0);
        k.happen(1, 9_000_000);
        assert!(m.poll(&k).is_some());
        assert!(!m.blocked(3, false));
        // A graph: its own burst, closed right after.
        gate(&mut m, &k, 10, 1, Kind::Kernel, 5, true, true, &p);
        let (id, close) = m
            .count_at_gate(&k, 12, 1, Kind::Graph(9), 5, true, &p)
            .unwrap();
        assert_eq!(m.pending(), 1, "the kernel burst closed first");
        assert!(close, "a graph's burst closes right after its call");
        m.settle(&k, 12, 1, id, 5, true);
        assert_eq!(m.pending(), 2);
    }

    #[test]
    fn overdue_and_full_block_refusals_go_unmeasured() {
        let p = Params::default();
        let k = Fake::default();
        let mut m = Meter::default();
        gate(&mut m, &k, 0, 1, Kind::Kernel, 100_000, true, true, &p);
        m.close_all(&k, 0);
        // Charged 100 µs: overdue after 4 × 100 µs + 5 ms.
        assert!(!m.blocked(5_000_000, true));
        assert!(m.blocked(5_400_001, true));
        // Fill the pending queue.
        for i in 1..PENDING as u64 {
            gate(&mut m, &k, i, 1, Kind::Kernel, 1, true, true, &p);
            m.close_all(&k, i);
        }
        assert_eq!(m.pending(), PENDING);
        assert!(m.blocked(100, true));
        // The driver refuses markers: launches are not metered.
        let mut m2: Meter<u32> = Meter::default();
        *k.refuse.borrow_mut() = true;
        assert!(m2.before_launch(&k, 0, 1, Kind::Kernel, &p).is_none());
        assert_eq!(m2.stats().failures, 1);
    }

    #[test]
    fn a_burst_closed_after_the_thread_was_away_is_dropped_not_measured() {
        let p = Params::default();
        let k = Fake::default();
        let mut m = Meter::default();
        let launch = |m: &mut Meter<u32>, at: u64| {
            gate(m, &k, at, 1, Kind::Kernel, 50_000, true, true, &p);
        };
        // Closed at once (the gate said wait right after a launch): measured.
        launch(&mut m, 0);
        m.close_or_drop_all(&k, 20_000, &p);
        assert_eq!((m.pending(), m.stats().dropped), (1, 0));
        // Closed 50 ms after its last launch (the thread was descheduled):
        // its end marker would count the idle gap; dropped.
        launch(&mut m, 1_000_000);
        m.close_or_drop_all(&k, 51_000_000, &p);
        assert_eq!((m.pending(), m.stats().dropped), (1, 1));
        // close_all (a synchronize) still measures.
        launch(&mut m, 60_000_000);
        m.close_all(&k, 110_000_000);
        assert_eq!(m.pending(), 2);
    }

    #[test]
    fn a_burst_whose_stream_went_idle_is_dropped_not_measured() {
        let p = Params::default();
        let k = Fake::default();
        let mut m = Meter::default();
        gate(&mut m, &k, 0, 1, Kind::Kernel, 50_000, true, true, &p);
        // 100 ms later, no synchronize in between: the stream drained long
        // ago; measuring now would count 100 ms of idle time.
        let (id, _) = m
            .count_at_gate(&k, 100_000_000, 1, Kind::Kernel, 50_000, true, &p)
            .unwrap();
        assert_eq!(m.stats().dropped, 1);
        assert_eq!(m.pending(), 0);
        assert_eq!(k.released.borrow().as_slice(), &[0]);
        // A failed launch leaves nothing behind.
        m.settle(&k, 100_000_001, 1, id, 50_000, false);
        assert_eq!(m.pending(), 0);
        m.clear(&k);
        assert_eq!(k.released.borrow().len(), 2);
    }
}
