//! The priority arbiter: decides when a low-priority container is held.
//! The interposer honours a `hold <percent>` directive in a container's
//! limits file (a low-priority container paces at min(limit, hold)), but a
//! container sees only its own region; the agent sees every one. Each cycle
//! it reads, for every container directory under its containers directory
//! whose limits file (the one it wrote at Allocate) names a priority, the
//! utilization the limiter's sampler published per device, and:
//!
//! - a device is *contended* while a high-priority container (`priority 0`)
//!   was busy on it (utilization ≥ the threshold in its latest fresh
//!   sample) within the last `grace`;
//! - a low-priority container (`priority` ≥ 1) with any contended device
//!   gets `hold H` (a hold already at or below H is kept);
//! - one with none loses the hold the agent wrote (or a hold of exactly H,
//!   so a hold left by a previous agent is removed too); any other hold is
//!   the operator's and is left alone.
//!
//! A container whose file has no `priority` takes no part. Only the `hold`
//! line is changed (file rewritten atomically), then the region's limits
//! generation is bumped so every process re-reads the file within a
//! control period. [`Arbiter::decide`] is pure; [`Arbiter::pass`] does the
//! I/O.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::layout::Layout;
use crate::observe;

/// The rule's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The hold written, percent.
    pub hold: u32,
    /// Utilization at or above which a high-priority container is busy, ppm.
    pub busy_ppm: u32,
    /// How long a device stays contended after its high-priority container
    /// was last seen busy (hysteresis).
    pub grace: Duration,
}

/// One device of a container as the arbiter sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUse {
    /// GPU UUID.
    pub uuid: String,
    /// Utilization, ppm, from a fresh sample (`None`: none recent — no
    /// process is publishing, which counts as idle).
    pub util_ppm: Option<u32>,
}

/// One container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// `<podUID>_<ctr>`.
    pub key: String,
    /// The limits file's priority (`None`: takes no part).
    pub priority: Option<i32>,
    /// The limits file's hold.
    pub hold: Option<u32>,
    /// Its devices.
    pub devices: Vec<DeviceUse>,
}

/// What to change in one container's limits file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Write `hold <to>`.
    Hold {
        /// Container.
        key: String,
        /// The hold before.
        from: Option<u32>,
        /// The hold written.
        to: u32,
        /// A contended device that caused it.
        device: String,
    },
    /// Remove the hold.
    Release {
        /// Container.
        key: String,
        /// The hold removed.
        from: u32,
    },
}

impl Change {
    /// The container.
    pub fn key(&self) -> &str {
        match self {
            Change::Hold { key, .. } | Change::Release { key, .. } => key,
        }
    }

    /// The hold the file should carry after it.
    pub fn new_hold(&self) -> Option<u32> {
        match self {
            Change::Hold { to, .. } => Some(*to),
            Change::Release { .. } => None,
        }
    }
}

/// Why a change could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PriorityError {
    /// The limits file could not be read or written.
    #[error("limits file of {key}: {source}")]
    Limits {
        /// Container.
        key: String,
        /// Why.
        #[source]
        source: vgpu_region::limits::LimitsError,
    },
    /// The region could not be opened to bump its generation.
    #[error("region of {key}: {source}")]
    Region {
        /// Container.
        key: String,
        /// Why.
        #[source]
        source: vgpu_region::RegionError,
    },
}

/// The arbiter's state across cycles.
#[derive(Debug)]
pub struct Arbiter {
    rule: Rule,
    /// GPU UUID (upper case) → when a high-priority container was last busy on it.
    busy_at: HashMap<String, Instant>,
    /// Container → the hold this agent wrote.
    owned: HashMap<String, u32>,
}

fn norm(uuid: &str) -> String {
    uuid.to_ascii_uppercase()
}

impl Arbiter {
    /// An arbiter with no history.
    pub fn new(rule: Rule) -> Arbiter {
        Arbiter {
            rule,
            busy_at: HashMap::new(),
            owned: HashMap::new(),
        }
    }

    /// The rule.
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// The changes `views` call for at `now`. Pure apart from the state it
    /// keeps (when each device was last contended, which holds are ours).
    pub fn decide(&mut self, now: Instant, views: &[View]) -> Vec<Change> {
        for v in views.iter().filter(|v| v.priority == Some(0)) {
            for d in &v.devices {
                if d.util_ppm.is_some_and(|u| u >= self.rule.busy_ppm) {
                    self.busy_at.insert(norm(&d.uuid), now);
                }
            }
        }
        let grace = self.rule.grace;
        self.busy_at
            .retain(|_, t| now.saturating_duration_since(*t) <= grace);
        let present: HashSet<&str> = views.iter().map(|v| v.key.as_str()).collect();
        self.owned.retain(|k, _| present.contains(k.as_str()));
        let h = self.rule.hold;
        let mut out = Vec::new();
        for v in views.iter().filter(|v| v.priority.is_some_and(|p| p >= 1)) {
            let contended = v
                .devices
                .iter()
                .find(|d| self.busy_at.contains_key(&norm(&d.uuid)));
            // A hold the file no longer carries as we wrote it is not ours.
            if self.owned.get(&v.key).is_some_and(|o| v.hold != Some(*o)) {
                self.owned.remove(&v.key);
            }
            match (contended, v.hold) {
                // Already at or below the hold: kept (the lower one wins).
                (Some(_), Some(x)) if x <= h => {}
                (Some(d), from) => out.push(Change::Hold {
                    key: v.key.clone(),
                    from,
                    to: h,
                    device: d.uuid.clone(),
                }),
                (None, Some(x)) if self.owned.get(&v.key) == Some(&x) || x == h => {
                    out.push(Change::Release {
                        key: v.key.clone(),
                        from: x,
                    })
                }
                (None, _) => {}
            }
        }
        out
    }

    /// Records that `c` was applied.
    pub fn applied(&mut self, c: &Change) {
        match c {
            Change::Hold { key, to, .. } => {
                self.owned.insert(key.clone(), *to);
            }
            Change::Release { key, .. } => {
                self.owned.remove(key);
            }
        }
    }

    /// One cycle over the containers under `layout`: read, decide, apply.
    /// `mono_ns` is CLOCK_MONOTONIC now (the clock the sampler stamps
    /// with); a sample older than `stale` counts as none. Returns the
    /// changes applied; failures are logged and retried next cycle.
    pub fn pass(
        &mut self,
        layout: &Layout,
        now: Instant,
        mono_ns: u64,
        stale: Duration,
    ) -> Vec<Change> {
        let views = views(layout, mono_ns, stale);
        let mut done = Vec::new();
        for c in self.decide(now, &views) {
            match apply(layout, &c) {
                Ok(()) => {
                    match &c {
                        Change::Hold {
                            key,
                            from,
                            to,
                            device,
                        } => tracing::info!(
                            container = %key,
                            from = ?from,
                            hold = to,
                            device = %device,
                            "priority: a high-priority container is busy on the device; low-priority container held"
                        ),
                        Change::Release { key, from } => tracing::info!(
                            container = %key,
                            from,
                            "priority: no busy high-priority container on its devices for the grace; hold removed"
                        ),
                    }
                    self.applied(&c);
                    done.push(c);
                }
                Err(e) => tracing::warn!("priority: {e}"),
            }
        }
        done
    }
}

/// The arbiter's view of every container directory under `layout` that has
/// a readable limits file.
pub fn views(layout: &Layout, mono_ns: u64, stale: Duration) -> Vec<View> {
    let stale_ns = u64::try_from(stale.as_nanos()).unwrap_or(u64::MAX);
    observe::scan_regions(layout)
        .into_iter()
        .filter_map(|r| {
            let l = r.limits?;
            let mut devices: Vec<DeviceUse> = Vec::new();
            if let Some(Ok(s)) = &r.snapshot {
                for d in &s.devices {
                    let p = &d.pacing;
                    let fresh =
                        p.util_at_ns != 0 && mono_ns.saturating_sub(p.util_at_ns) <= stale_ns;
                    devices.push(DeviceUse {
                        uuid: d.uuid.clone(),
                        util_ppm: fresh.then_some(p.util_ppm),
                    });
                }
            }
            // Devices the file names but no process has mapped yet: a low
            // container's first process then starts held.
            for line in &l.devices {
                if let vgpu_region::limits::Device::Uuid(u) = &line.device {
                    if !devices.iter().any(|d| d.uuid.eq_ignore_ascii_case(u)) {
                        devices.push(DeviceUse {
                            uuid: u.clone(),
                            util_ppm: None,
                        });
                    }
                }
            }
            Some(View {
                key: r.key,
                priority: l.priority,
                hold: l.hold,
                devices,
            })
        })
        .collect()
}

/// Rewrites the container's limits file with only the hold changed, then
/// bumps its region's limits generation (when it has a region).
pub fn apply(layout: &Layout, c: &Change) -> Result<(), PriorityError> {
    let key = c.key();
    let file = layout.limits_file(key);
    let err = |source| PriorityError::Limits {
        key: key.to_owned(),
        source,
    };
    // Re-read: the file may have changed since the scan.
    let mut l = vgpu_region::limits::read_limits_file(&file).map_err(err)?;
    l.hold = c.new_hold();
    vgpu_region::limits::write_limits_file_atomic(&file, &l).map_err(err)?;
    if let Some(region) = observe::region_file(&layout.region_dir(key)) {
        // Never through a mapping: the tenant may truncate its region.
        vgpu_region::Region::bump_limits_generation_in_file(&region).map_err(|source| {
            PriorityError::Region {
                key: key.to_owned(),
                source,
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u32 = 10;

    fn rule() -> Rule {
        Rule {
            hold: H,
            busy_ppm: 50_000,
            grace: Duration::from_secs(2),
        }
    }

    fn ctr(key: &str, prio: Option<i32>, hold: Option<u32>, devs: &[(&str, Option<u32>)]) -> View {
        View {
            key: key.into(),
            priority: prio,
            hold,
            devices: devs
                .iter()
                .map(|(u, p)| DeviceUse {
                    uuid: (*u).into(),
                    util_ppm: p.map(|pct| pct * 10_000),
                })
                .collect(),
        }
    }

    /// (key, new hold) of each change.
    fn summary(cs: &[Change]) -> Vec<(String, Option<u32>)> {
        let mut v: Vec<_> = cs
            .iter()
            .map(|c| (c.key().to_owned(), c.new_hold()))
            .collect();
        v.sort();
        v
    }

    /// Decides and applies the changes to `views` in place (a file the
    /// arbiter wrote reads back as written).
    fn step(a: &mut Arbiter, now: Instant, views: &mut [View]) -> Vec<(String, Option<u32>)> {
        let cs = a.decide(now, views);
        for c in &cs {
            a.applied(c);
            for v in views.iter_mut().filter(|v| v.key == c.key()) {
                v.hold = c.new_hold();
            }
        }
        summary(&cs)
    }

    fn s(k: &str, h: Option<u32>) -> (String, Option<u32>) {
        (k.to_owned(), h)
    }

    /// (case, views, expected changes from a fresh arbiter).
    type Case = (&'static str, Vec<View>, Vec<(String, Option<u32>)>);

    #[test]
    fn one_cycle_table() {
        let cases: Vec<Case> = vec![
            (
                "busy high holds the low on its device",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(60))]),
                    ctr("lo", Some(1), None, &[("GPU-a", Some(40))]),
                ],
                vec![s("lo", Some(H))],
            ),
            (
                "idle high (below the threshold) holds nobody",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(4))]),
                    ctr("lo", Some(1), None, &[("GPU-a", Some(90))]),
                ],
                vec![],
            ),
            (
                "exactly the threshold is busy",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(5))]),
                    ctr("lo", Some(1), None, &[("GPU-a", None)]),
                ],
                vec![s("lo", Some(H))],
            ),
            (
                "no fresh sample is idle",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", None)]),
                    ctr("lo", Some(1), None, &[("GPU-a", Some(90))]),
                ],
                vec![],
            ),
            (
                "busy on another device holds nobody",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-b", Some(100))]),
                    ctr("lo", Some(1), None, &[("GPU-a", Some(90))]),
                ],
                vec![],
            ),
            (
                "UUIDs compare without case",
                vec![
                    ctr("hi", Some(0), None, &[("gpu-a", Some(100))]),
                    ctr("lo", Some(1), None, &[("GPU-A", None)]),
                ],
                vec![s("lo", Some(H))],
            ),
            (
                "multi-device: one contended device is enough",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-b", Some(100))]),
                    ctr("lo", Some(1), None, &[("GPU-a", Some(0)), ("GPU-b", None)]),
                    ctr("lo2", Some(2), None, &[("GPU-a", Some(0))]),
                ],
                vec![s("lo", Some(H))],
            ),
            (
                "several high and low: every low on a contended device",
                vec![
                    ctr("hi1", Some(0), None, &[("GPU-a", Some(1))]),
                    ctr("hi2", Some(0), None, &[("GPU-a", Some(30))]),
                    ctr("hi3", Some(0), None, &[("GPU-c", Some(0))]),
                    ctr("lo1", Some(1), None, &[("GPU-a", None)]),
                    ctr("lo2", Some(1), None, &[("GPU-a", Some(50))]),
                    ctr("lo3", Some(1), None, &[("GPU-c", Some(50))]),
                ],
                vec![s("lo1", Some(H)), s("lo2", Some(H))],
            ),
            (
                "a busy low or unprioritized container holds nobody",
                vec![
                    ctr("lo", Some(1), None, &[("GPU-a", Some(100))]),
                    ctr("np", None, None, &[("GPU-a", Some(100))]),
                    ctr("lo2", Some(1), None, &[("GPU-a", None)]),
                ],
                vec![],
            ),
            (
                "no priority in the file: never held",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(100))]),
                    ctr("np", None, None, &[("GPU-a", Some(50))]),
                ],
                vec![],
            ),
            (
                "a high-priority container is never held",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(100))]),
                    ctr("hi2", Some(0), None, &[("GPU-a", Some(100))]),
                ],
                vec![],
            ),
            (
                "a hold already below H keeps the lower one",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(100))]),
                    ctr("lo", Some(1), Some(3), &[("GPU-a", None)]),
                    ctr("lo2", Some(1), Some(H), &[("GPU-a", None)]),
                ],
                vec![],
            ),
            (
                "a hold above H is lowered to H",
                vec![
                    ctr("hi", Some(0), None, &[("GPU-a", Some(100))]),
                    ctr("lo", Some(1), Some(50), &[("GPU-a", None)]),
                ],
                vec![s("lo", Some(H))],
            ),
            (
                "uncontended: a hold of H (a previous agent's) is removed, others kept",
                vec![
                    ctr("lo", Some(1), Some(H), &[("GPU-a", None)]),
                    ctr("lo2", Some(1), Some(30), &[("GPU-a", None)]),
                    ctr("np", None, Some(H), &[("GPU-a", None)]),
                ],
                vec![s("lo", None)],
            ),
        ];
        for (name, views, want) in cases {
            let mut a = Arbiter::new(rule());
            let got = summary(&a.decide(Instant::now(), &views));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn hysteresis_with_an_injected_clock() {
        let mut a = Arbiter::new(rule());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut v = vec![
            ctr("hi", Some(0), None, &[("GPU-a", Some(80))]),
            ctr("lo", Some(1), None, &[("GPU-a", Some(20))]),
        ];
        assert_eq!(step(&mut a, at(0), &mut v), vec![s("lo", Some(H))]);
        // Held: nothing more to write while the high one stays busy.
        assert_eq!(step(&mut a, at(500), &mut v), vec![]);
        // The high one goes idle: kept through the grace...
        v[0].devices[0].util_ppm = Some(0);
        assert_eq!(step(&mut a, at(1000), &mut v), vec![]);
        assert_eq!(step(&mut a, at(2500), &mut v), vec![]);
        // ...a blip of busy restarts the grace...
        v[0].devices[0].util_ppm = Some(100_000);
        assert_eq!(step(&mut a, at(2600), &mut v), vec![]);
        v[0].devices[0].util_ppm = None;
        assert_eq!(step(&mut a, at(4500), &mut v), vec![]);
        // ...and after it, the hold is removed.
        assert_eq!(step(&mut a, at(4601), &mut v), vec![s("lo", None)]);
        assert_eq!(v[1].hold, None);
        assert_eq!(step(&mut a, at(5000), &mut v), vec![]);
        // Busy again: held again.
        v[0].devices[0].util_ppm = Some(100_000);
        assert_eq!(step(&mut a, at(6000), &mut v), vec![s("lo", Some(H))]);
    }

    #[test]
    fn holds_the_operator_set_are_left_alone() {
        let mut a = Arbiter::new(Rule { hold: 20, ..rule() });
        let t0 = Instant::now();
        let mut v = vec![
            ctr("hi", Some(0), None, &[("GPU-a", Some(80))]),
            ctr("lo", Some(1), None, &[("GPU-a", None)]),
        ];
        assert_eq!(step(&mut a, t0, &mut v), vec![s("lo", Some(20))]);
        // The operator lowers it by hand while held: the lower one stays,
        // and it is not ours to remove afterwards.
        v[1].hold = Some(7);
        assert_eq!(step(&mut a, t0 + Duration::from_secs(1), &mut v), vec![]);
        v[0].devices[0].util_ppm = Some(0);
        assert_eq!(step(&mut a, t0 + Duration::from_secs(10), &mut v), vec![]);
        assert_eq!(v[1].hold, Some(7));
        // A container gone is forgotten.
        assert_eq!(a.decide(t0 + Duration::from_secs(11), &v[..1]), vec![]);
        assert!(a.owned.is_empty());
    }

    #[test]
    fn pass_writes_only_the_hold_and_bumps_the_generation() {
        use vgpu_region::limits::{self, Limits};
        let t = tempfile::tempdir().unwrap();
        let layout = Layout::new(t.path());
        let mk = |key: &str, text: &str| {
            std::fs::create_dir_all(layout.region_dir(key)).unwrap();
            std::fs::create_dir_all(layout.limits_dir(key)).unwrap();
            std::fs::write(layout.limits_file(key), text).unwrap();
        };
        mk(
            "podh_main",
            "vgpu-limits 1\ndevice GPU-a memory=1024\npriority 0\n",
        );
        mk(
            "podl_main",
            "vgpu-limits 1\ndevice GPU-a memory=2048 sm=5\npolicy force\npriority 1\n",
        );
        // A region for the low one, to see the generation move.
        let (r, _) = vgpu_region::Region::open_or_create(
            &layout
                .region_dir("podl_main")
                .join(crate::layout::REGION_FILE),
            &vgpu_region::CreateOptions {
                slots: 2,
                devices: vec![vgpu_region::DeviceConfig {
                    uuid: "GPU-a".into(),
                    mem_limit: 2048,
                    sm_limit: 5,
                }],
            },
        )
        .unwrap();
        let g0 = r.limits_generation();
        let before = limits::read_limits_file(&layout.limits_file("podl_main")).unwrap();
        let vs = views(&layout, vgpu_region::monotonic_ns(), Duration::from_secs(1));
        assert_eq!(vs.len(), 2);
        assert_eq!(vs[1].priority, Some(1));
        // The decision on a busy high one (no sampler runs in this test).
        let mut a = Arbiter::new(rule());
        let mut vs2 = vs.clone();
        vs2[0].devices[0].util_ppm = Some(1_000_000);
        let cs = a.decide(Instant::now(), &vs2);
        assert_eq!(summary(&cs), vec![s("podl_main", Some(H))]);
        apply(&layout, &cs[0]).unwrap();
        let after = limits::read_limits_file(&layout.limits_file("podl_main")).unwrap();
        assert_eq!(
            after,
            Limits {
                hold: Some(H),
                ..before.clone()
            }
        );
        assert!(r.limits_generation() > g0);
        // The header's display copy is untouched (the hold is not in it).
        assert_eq!(r.limits(0).sm, 5);
        a.applied(&cs[0]);
        // No sampler publishes: idle; after the grace the real pass removes it.
        let later = Instant::now() + Duration::from_secs(5);
        let done = a.pass(
            &layout,
            later,
            vgpu_region::monotonic_ns(),
            Duration::from_secs(1),
        );
        assert_eq!(summary(&done), vec![s("podl_main", None)]);
        let back = limits::read_limits_file(&layout.limits_file("podl_main")).unwrap();
        assert_eq!(back, before);
        // The high one's file was never touched.
        assert_eq!(
            std::fs::read_to_string(layout.limits_file("podh_main")).unwrap(),
            "vgpu-limits 1\ndevice GPU-a memory=1024\npriority 0\n"
        );
    }
}
