//! What a launch will cost before it runs: the mean measured GPU time per
//! kernel launch of this process, and per CUDA graph (a graph's launch is
//! charged its own measured cost, whatever its nodes). Plain values; the
//! pacer keeps them behind its own synchronization.

/// Graph executables remembered (least recently measured goes first).
pub const GRAPH_SLOTS: usize = 8;

/// An exponentially weighted mean (weight 1/4 for a new sample).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mean {
    /// The mean, ns (0 = no sample yet).
    pub ns: u64,
    /// Samples folded in (saturating).
    pub samples: u32,
}

impl Mean {
    /// Folds in one sample of `ns` per launch. The first sample is taken
    /// as is; later ones move the mean a quarter of the way.
    pub fn add(&mut self, ns: u64) {
        self.ns = if self.samples == 0 {
            ns
        } else {
            let (m, x) = (self.ns as i128, ns as i128);
            (m + (x - m) / 4).max(0) as u64
        };
        self.samples = self.samples.saturating_add(1);
    }
}

/// What a launch is, for charging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A kernel (`cuLaunchKernel`, `Ex`, cooperative forms).
    Kernel,
    /// A graph launch (`cuGraphLaunch`), keyed by its executable handle.
    Graph(u64),
}

/// Per-launch estimates of one process on one device.
#[derive(Clone, Copy, Debug, Default)]
pub struct Estimates {
    kernel: Mean,
    graphs: [(u64, Mean, u64); GRAPH_SLOTS],
    tick: u64,
}

impl Estimates {
    /// The estimate for a launch of `kind`, or `None` before any sample
    /// (the caller probes: one launch, measured, before the next).
    #[inline]
    pub fn get(&self, kind: Kind) -> Option<u64> {
        match kind {
            Kind::Kernel => (self.kernel.samples > 0).then_some(self.kernel.ns),
            Kind::Graph(g) => self
                .graphs
                .iter()
                .find(|(k, m, _)| *k == g && m.samples > 0)
                .map(|(_, m, _)| m.ns),
        }
    }

    /// Folds in a measurement: `measured_ns` over `launches` of `kind`.
    pub fn add(&mut self, kind: Kind, launches: u32, measured_ns: u64) {
        if launches == 0 {
            return;
        }
        let per = measured_ns / launches as u64;
        self.tick += 1;
        match kind {
            Kind::Kernel => self.kernel.add(per),
            Kind::Graph(g) => {
                let tick = self.tick;
                let i = self
                    .graphs
                    .iter()
                    .position(|(k, m, _)| *k == g && m.samples > 0)
                    .unwrap_or_else(|| {
                        // The least recently measured slot.
                        let mut best = 0;
                        for (i, e) in self.graphs.iter().enumerate() {
                            if e.2 < self.graphs[best].2 {
                                best = i;
                            }
                        }
                        self.graphs[best] = (g, Mean::default(), 0);
                        best
                    });
                self.graphs[i].1.add(per);
                self.graphs[i].2 = tick;
            }
        }
    }

    /// The kernel mean (for display).
    pub fn kernel_ns(&self) -> u64 {
        self.kernel.ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_and_graph_slots() {
        let mut e = Estimates::default();
        assert_eq!(e.get(Kind::Kernel), None);
        e.add(Kind::Kernel, 4, 400);
        assert_eq!(e.get(Kind::Kernel), Some(100));
        e.add(Kind::Kernel, 1, 500);
        assert_eq!(e.get(Kind::Kernel), Some(200));
        e.add(Kind::Kernel, 0, 1 << 40);
        assert_eq!(e.get(Kind::Kernel), Some(200));
        for g in 1..=GRAPH_SLOTS as u64 {
            e.add(Kind::Graph(g), 1, g * 1000);
        }
        assert_eq!(e.get(Kind::Graph(3)), Some(3000));
        // A ninth graph evicts the least recently measured (graph 1).
        e.add(Kind::Graph(2), 1, 2000);
        e.add(Kind::Graph(99), 1, 7);
        assert_eq!(e.get(Kind::Graph(1)), None);
        assert_eq!(e.get(Kind::Graph(2)), Some(2000));
        assert_eq!(e.get(Kind::Graph(99)), Some(7));
        let mut m = Mean::default();
        m.add(u64::MAX);
        m.add(0);
        assert!(m.ns > 0);
    }
}
