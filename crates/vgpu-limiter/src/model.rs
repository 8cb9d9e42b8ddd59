//! A deterministic model of a shared GPU, for testing the law under a
//! simulated clock (no sleeps, no threads): one device that time-slices
//! processes the way vgpu-sim's scheduler does (one kernel at a time, a
//! process keeps the device for its consecutive kernels until its slice is
//! used and another has work waiting, long kernels preempted at the slice's
//! end), per-process launch queues, markers with either vgpu-sim's timing
//! (an event on an idle stream happens when recorded) or a real GPU's (it
//! happens when its context next holds the device), NVML-like per-process
//! busy time, and tenants that launch flat out, synchronize after every
//! launch, or launch graphs, each through a real `Pacer` on its
//! container's bucket.
//!
//! Test support only (feature `model`): it allocates freely.

use std::cell::RefCell;
use std::collections::VecDeque;

use vgpu_region::layout::RawSlotPacing;
use vgpu_region::pacing::{zeroed_slot_pacing, LocalBucket, SlotPacing};

use crate::estimate::Kind;
use crate::law::Params;
use crate::meter::{Elapsed, Markers};
use crate::pacer::{Admit, Cells, Pacer};
use crate::policy::{target, Measurement, Settings};
use crate::sampler::{Corrector, Window};

/// When a marker (event) happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerTiming {
    /// As vgpu-sim: when the work before it completes, at once on an idle
    /// stream (so a start marker does not wait for a neighbour's slice).
    Sim,
    /// As a real GPU: it is executed in its context's channel, so it waits
    /// for its context to hold the device.
    Hardware,
}

/// The device.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSpec {
    /// SM count (kernel length = waves × per-block time).
    pub sms: u32,
    /// A context's time slice while others wait.
    pub timeslice_ns: u64,
    /// Marker timing.
    pub markers: MarkerTiming,
}

/// A kernel: `blocks` blocks of `block_ns` each, in waves of `sms`.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// Grid size (blocks).
    pub blocks: u64,
    /// Time of one wave, ns.
    pub block_ns: u64,
}

impl KernelSpec {
    /// Its length on `sms` SMs.
    pub fn duration(&self, sms: u32) -> u64 {
        self.blocks.div_ceil(sms.max(1) as u64) * self.block_ns
    }

    /// A kernel of about `ns` on `sms` SMs with a fixed grid of 1024 blocks
    /// (waves of `sms`), as a benchmark builds one.
    pub fn lasting(ns: u64, sms: u32) -> KernelSpec {
        let waves = 1024u64.div_ceil(sms.max(1) as u64);
        KernelSpec {
            blocks: 1024,
            block_ns: (ns / waves).max(1),
        }
    }
}

/// How a tenant launches.
#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// Flat out, never synchronizing (a full queue blocks it).
    Async,
    /// One launch, synchronize, `host_ns` on the CPU, again.
    Sync {
        /// CPU time between a synchronize and the next launch.
        host_ns: u64,
    },
    /// Graphs of `nodes` kernels, flat out.
    Graph {
        /// Kernels per graph.
        nodes: u32,
    },
}

/// One process.
#[derive(Clone, Copy, Debug)]
pub struct TenantSpec {
    /// Its container (index into `Scenario::containers`).
    pub container: usize,
    /// How it launches.
    pub workload: Workload,
    /// What it launches.
    pub kernel: KernelSpec,
    /// CPU time per launch call.
    pub launch_ns: u64,
    /// Most unfinished launches before a launch blocks.
    pub queue_depth: usize,
    /// When it starts.
    pub start_ns: u64,
    /// When it stops launching (`u64::MAX`: never).
    pub stop_ns: u64,
}

impl TenantSpec {
    /// A flat-out launcher of `kernel` in `container`.
    pub fn flat_out(container: usize, kernel: KernelSpec) -> TenantSpec {
        TenantSpec {
            container,
            workload: Workload::Async,
            kernel,
            launch_ns: 2_000,
            queue_depth: 1024,
            start_ns: 0,
            stop_ns: u64::MAX,
        }
    }
}

/// One container: its settings over time, and whether its processes'
/// host PIDs are known (NVML truth available to the sampler).
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// `(from, settings)`, in time order; the first applies from 0.
    pub settings: Vec<(u64, Settings)>,
    /// Host PIDs known.
    pub identity: bool,
}

impl ContainerSpec {
    /// Limited to `pct` % from the start, identity known.
    pub fn limited(pct: u32) -> ContainerSpec {
        ContainerSpec {
            settings: vec![(
                0,
                Settings {
                    sm_limit: Some(pct),
                    ..Settings::default()
                },
            )],
            identity: true,
        }
    }

    /// No limit.
    pub fn unlimited() -> ContainerSpec {
        ContainerSpec {
            settings: vec![(0, Settings::default())],
            identity: true,
        }
    }
}

/// A run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The device.
    pub device: DeviceSpec,
    /// Containers.
    pub containers: Vec<ContainerSpec>,
    /// Processes.
    pub tenants: Vec<TenantSpec>,
    /// Simulated time to run.
    pub duration_ns: u64,
    /// The law's tunables.
    pub params: Params,
    /// How often each container's sampler runs.
    pub sample_every_ns: u64,
    /// Extra latency of every wake-up after a wait (the OS), ns.
    pub wake_ns: u64,
    /// Latency from a queue running dry to the synchronize returning, ns.
    pub sync_ns: u64,
}

impl Scenario {
    /// A device of `sms` SMs, 1 ms slices, vgpu-sim marker timing.
    pub fn new(sms: u32, containers: Vec<ContainerSpec>, tenants: Vec<TenantSpec>) -> Scenario {
        Scenario {
            device: DeviceSpec {
                sms,
                timeslice_ns: 1_000_000,
                markers: MarkerTiming::Sim,
            },
            containers,
            tenants,
            duration_ns: 3_000_000_000,
            params: Params::default(),
            sample_every_ns: 100_000_000,
            wake_ns: 10_000,
            sync_ns: 5_000,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Device timeline: (tenant, start, end), in time order.
    pub intervals: Vec<(usize, u64, u64)>,
    /// Launch calls per tenant.
    pub launches: Vec<u64>,
    /// Lowest credit each container's bucket showed (GPU-ns).
    pub min_credit: Vec<i64>,
    /// Highest credit each container's bucket showed.
    pub max_credit: Vec<i64>,
    /// Each container's correction after its last sample, ppm.
    pub correction_ppm: Vec<u32>,
    /// Each container's published utilization samples: (time, ppm).
    pub util: Vec<Vec<(u64, u32)>>,
    /// Container of each tenant.
    pub container_of: Vec<usize>,
}

impl Outcome {
    /// Share of `[from, to)` in which any of `tenants` ran, 0..1.
    pub fn share(&self, tenants: &[usize], from: u64, to: u64) -> f64 {
        let busy: u64 = self
            .intervals
            .iter()
            .filter(|(t, _, _)| tenants.contains(t))
            .map(|(_, s, e)| (*e).min(to).saturating_sub((*s).max(from)))
            .sum();
        busy as f64 / (to - from) as f64
    }

    /// Share of a container's tenants.
    pub fn container_share(&self, c: usize, from: u64, to: u64) -> f64 {
        let ts: Vec<usize> = (0..self.container_of.len())
            .filter(|t| self.container_of[*t] == c)
            .collect();
        self.share(&ts, from, to)
    }

    /// Per-window shares of a container (windows of `w` from `from`).
    pub fn windows(&self, c: usize, from: u64, to: u64, w: u64) -> Vec<f64> {
        let mut out = Vec::new();
        let mut t = from;
        while t + w <= to {
            out.push(self.container_share(c, t, t + w));
            t += w;
        }
        out
    }
}

#[derive(Clone, Copy, Debug)]
enum Item {
    Kernel { remaining: u64 },
    Marker { id: usize },
}

#[derive(Clone, Copy, Debug)]
struct Run {
    tenant: usize,
    owner_since: u64,
}

struct Device {
    spec: DeviceSpec,
    now: u64,
    queues: Vec<VecDeque<Item>>,
    running: Option<Run>,
    cursor: usize,
    intervals: Vec<(usize, u64, u64)>,
    busy: Vec<u64>,
    marks: Vec<Option<u64>>,
    enqueued: Vec<u64>,
    done: Vec<u64>,
    waiting: Vec<(usize, u64, usize)>,
}

impl Device {
    fn new(spec: DeviceSpec, tenants: usize) -> Device {
        Device {
            spec,
            now: 0,
            queues: vec![VecDeque::new(); tenants],
            running: None,
            cursor: usize::MAX,
            intervals: Vec::new(),
            busy: vec![0; tenants],
            marks: Vec::new(),
            enqueued: vec![0; tenants],
            done: vec![0; tenants],
            waiting: Vec::new(),
        }
    }

    fn kernels_pending(&self, t: usize) -> u64 {
        self.enqueued[t] - self.done[t]
    }

    fn launch(&mut self, t: usize, ns: u64) {
        self.queues[t].push_back(Item::Kernel { remaining: ns });
        self.enqueued[t] += 1;
    }

    fn mark(&mut self, t: usize) -> usize {
        let id = self.marks.len();
        match self.spec.markers {
            MarkerTiming::Sim => {
                if self.kernels_pending(t) == 0 {
                    self.marks.push(Some(self.now));
                } else {
                    self.marks.push(None);
                    self.waiting.push((t, self.enqueued[t], id));
                }
            }
            MarkerTiming::Hardware => {
                self.marks.push(None);
                self.queues[t].push_back(Item::Marker { id });
            }
        }
        id
    }

    fn pick(&self) -> Option<usize> {
        let n = self.queues.len();
        let start = self.cursor.wrapping_add(1);
        (0..n)
            .map(|k| (start.wrapping_add(k)) % n)
            .find(|t| !self.queues[*t].is_empty())
    }

    fn others_waiting(&self, t: usize) -> bool {
        self.queues
            .iter()
            .enumerate()
            .any(|(i, q)| i != t && !q.is_empty())
    }

    fn record(&mut self, t: usize, s: u64, e: u64) {
        if e <= s {
            return;
        }
        self.busy[t] += e - s;
        if let Some(last) = self.intervals.last_mut() {
            if last.0 == t && last.2 == s {
                last.2 = e;
                return;
            }
        }
        self.intervals.push((t, s, e));
    }

    /// When the device's state next changes by itself.
    fn next_event(&self) -> u64 {
        let Some(r) = self.running else {
            return if self.queues.iter().any(|q| !q.is_empty()) {
                self.now
            } else {
                u64::MAX
            };
        };
        let others = self.others_waiting(r.tenant);
        let slice_end = r.owner_since + self.spec.timeslice_ns;
        match self.queues[r.tenant].front() {
            None | Some(Item::Marker { .. }) => self.now,
            Some(Item::Kernel { remaining }) => {
                if others && self.now >= slice_end {
                    self.now
                } else {
                    let end = self.now + remaining;
                    if others {
                        end.min(slice_end)
                    } else {
                        end
                    }
                }
            }
        }
    }

    /// Runs the device up to `to`; pushes each tenant whose kernel
    /// completed.
    fn advance(&mut self, to: u64, completed: &mut Vec<usize>) {
        loop {
            let Some(r) = self.running else {
                match self.pick() {
                    Some(t) => {
                        self.running = Some(Run {
                            tenant: t,
                            owner_since: self.now,
                        });
                        self.cursor = t;
                        continue;
                    }
                    None => {
                        self.now = self.now.max(to);
                        return;
                    }
                }
            };
            let t = r.tenant;
            let others = self.others_waiting(t);
            let slice_end = r.owner_since + self.spec.timeslice_ns;
            let now = self.now;
            match self.queues[t].front_mut() {
                None => self.running = None,
                Some(Item::Marker { id }) => {
                    let id = *id;
                    self.marks[id] = Some(now);
                    self.queues[t].pop_front();
                }
                Some(Item::Kernel { remaining }) => {
                    if others && now >= slice_end {
                        self.running = None;
                        continue;
                    }
                    let end = now + *remaining;
                    let preempt = if others { slice_end } else { u64::MAX };
                    let stop = end.min(preempt).min(to.max(now));
                    if stop == now {
                        return;
                    }
                    *remaining -= stop - now;
                    let finished = *remaining == 0;
                    self.record(t, now, stop);
                    self.now = stop;
                    if finished {
                        self.queues[t].pop_front();
                        self.done[t] += 1;
                        let done = self.done[t];
                        let at = self.now;
                        let marks = &mut self.marks;
                        self.waiting.retain(|(wt, seq, id)| {
                            if *wt == t && *seq <= done {
                                marks[*id] = Some(at);
                                false
                            } else {
                                true
                            }
                        });
                        completed.push(t);
                    }
                }
            }
        }
    }
}

/// The model's markers for one tenant.
struct Mk<'a> {
    dev: &'a RefCell<Device>,
    tenant: usize,
}

impl Markers for Mk<'_> {
    type Mark = usize;
    fn record(&self, _stream: u64) -> Option<usize> {
        Some(self.dev.borrow_mut().mark(self.tenant))
    }
    fn elapsed(&self, a: usize, b: usize) -> Elapsed {
        let d = self.dev.borrow();
        match (d.marks[a], d.marks[b]) {
            (Some(x), Some(y)) => Elapsed::Ready(y.saturating_sub(x)),
            _ => Elapsed::Pending,
        }
    }
    fn release(&self, _m: usize) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ready(u64),
    WaitSpace,
    WaitDrain,
    Done,
}

struct Tenant {
    spec: TenantSpec,
    pacer: Pacer<usize>,
    slot: Box<RawSlotPacing>,
    state: State,
    wait_since: Option<u64>,
    launches: u64,
}

/// Runs a scenario to its end.
pub fn run(s: &Scenario) -> Outcome {
    let n = s.tenants.len();
    let dev = RefCell::new(Device::new(s.device, n));
    let buckets: Vec<LocalBucket> = s.containers.iter().map(|_| LocalBucket::new()).collect();
    let mut tenants: Vec<Tenant> = s
        .tenants
        .iter()
        .map(|t| Tenant {
            spec: *t,
            pacer: Pacer::new(s.params),
            slot: Box::new(zeroed_slot_pacing()),
            state: State::Ready(t.start_ns),
            wait_since: None,
            launches: 0,
        })
        .collect();
    let mut out = Outcome {
        launches: vec![0; n],
        min_credit: vec![0; s.containers.len()],
        max_credit: vec![0; s.containers.len()],
        correction_ppm: vec![0; s.containers.len()],
        util: vec![Vec::new(); s.containers.len()],
        container_of: s.tenants.iter().map(|t| t.container).collect(),
        ..Outcome::default()
    };
    // Settings changes, applied half a control period late (the owned
    // thread notices a change within a period).
    let mut changes: Vec<(u64, usize, Settings)> = s
        .containers
        .iter()
        .enumerate()
        .flat_map(|(c, spec)| {
            spec.settings.iter().map(move |(at, st)| {
                let late = if *at == 0 { 0 } else { s.params.period_ns / 2 };
                (at + late, c, *st)
            })
        })
        .collect();
    changes.sort_by_key(|x| x.0);
    let mut next_change = 0;
    let mut correctors: Vec<Corrector> = vec![Corrector::default(); s.containers.len()];
    let mut last_busy: Vec<u64> = vec![0; n];
    let mut last_measured: Vec<u64> = vec![0; n];
    let mut last_dev_busy = 0u64;
    let mut next_sample = s.sample_every_ns;
    let mut completed = Vec::new();

    loop {
        let t_tenant = tenants
            .iter()
            .filter_map(|t| match t.state {
                State::Ready(at) => Some(at),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        let t_change = changes.get(next_change).map_or(u64::MAX, |c| c.0);
        let t_dev = dev.borrow().next_event();
        let t = t_tenant
            .min(t_change)
            .min(t_dev)
            .min(next_sample)
            .min(s.duration_ns);
        completed.clear();
        dev.borrow_mut().advance(t, &mut completed);
        for &ti in &completed {
            let tn = &mut tenants[ti];
            match tn.state {
                State::WaitSpace => tn.state = State::Ready(t),
                State::WaitDrain if dev.borrow().kernels_pending(ti) == 0 => {
                    let host = match tn.spec.workload {
                        Workload::Sync { host_ns } => host_ns,
                        _ => 0,
                    };
                    let c = tn.spec.container;
                    let k = Mk {
                        dev: &dev,
                        tenant: ti,
                    };
                    let cells = Cells {
                        bucket: buckets[c].bucket(),
                        slot: SlotPacing::new(Some(&tn.slot), 1),
                        dev: 0,
                    };
                    tn.pacer.poll(&k, &cells);
                    tn.state = State::Ready(t + s.sync_ns + host);
                }
                _ => {}
            }
        }
        if t >= s.duration_ns {
            break;
        }
        while let Some(&(at, c, st)) = changes.get(next_change) {
            if at > t {
                break;
            }
            next_change += 1;
            let m = Measurement {
                markers: true,
                identity: s.containers[c].identity,
            };
            let tg = target(&st, m);
            for tn in tenants.iter().filter(|x| x.spec.container == c) {
                tn.pacer.set_target(tg);
                SlotPacing::new(Some(&tn.slot), 1).set_state(tg.state.code(), 0, t);
            }
        }
        if t >= next_sample {
            let d = dev.borrow();
            let dev_busy: u64 = d.busy.iter().sum();
            for (c, spec) in s.containers.iter().enumerate() {
                let mut truth = 0;
                let mut markers = 0;
                for (ti, tn) in tenants
                    .iter()
                    .enumerate()
                    .filter(|x| x.1.spec.container == c)
                {
                    truth += d.busy[ti] - last_busy[ti];
                    let m = SlotPacing::new(Some(&tn.slot), 1).counters(0).0;
                    markers += m - last_measured[ti];
                }
                let share = tenants
                    .iter()
                    .find(|x| x.spec.container == c)
                    .map_or(0, |x| x.pacer.target().share_ppm);
                let w = Window {
                    share_ppm: share,
                    window_ns: s.sample_every_ns,
                    truth_ns: spec.identity.then_some(truth),
                    markers_known_ns: if spec.identity { markers } else { 0 },
                    markers_all_ns: markers,
                    device_busy_ns: Some(dev_busy - last_dev_busy),
                };
                let p = correctors[c].step(&w);
                let b = buckets[c].bucket();
                b.set_correction_ppm(p.correction_ppm);
                b.set_rate_cap_ppm(p.rate_cap_ppm);
                b.set_utilization(p.util_ppm, p.source.code(), t, s.sample_every_ns);
                out.util[c].push((t, p.util_ppm));
            }
            for (ti, tn) in tenants.iter().enumerate() {
                last_busy[ti] = d.busy[ti];
                last_measured[ti] = SlotPacing::new(Some(&tn.slot), 1).counters(0).0;
            }
            last_dev_busy = dev_busy;
            next_sample += s.sample_every_ns;
        }
        for (ti, tn) in tenants.iter_mut().enumerate() {
            let State::Ready(at) = tn.state else {
                continue;
            };
            if at > t {
                continue;
            }
            step(s, &dev, &buckets, tn, ti, t);
        }
        for (c, b) in buckets.iter().enumerate() {
            let cr = b.bucket().credit();
            out.min_credit[c] = out.min_credit[c].min(cr);
            out.max_credit[c] = out.max_credit[c].max(cr);
        }
    }
    out.intervals = dev.into_inner().intervals;
    out.launches = tenants.iter().map(|t| t.launches).collect();
    out.correction_ppm = correctors.iter().map(|c| c.correction_ppm()).collect();
    out
}

/// One tenant action at `now`.
fn step(
    s: &Scenario,
    dev: &RefCell<Device>,
    buckets: &[LocalBucket],
    tn: &mut Tenant,
    ti: usize,
    now: u64,
) {
    if now >= tn.spec.stop_ns {
        tn.state = State::Done;
        return;
    }
    if dev.borrow().queues[ti].len() >= tn.spec.queue_depth {
        tn.state = State::WaitSpace;
        return;
    }
    let c = tn.spec.container;
    let cells = Cells {
        bucket: buckets[c].bucket(),
        slot: SlotPacing::new(Some(&tn.slot), 1),
        dev: 0,
    };
    let k = Mk { dev, tenant: ti };
    let (kind, kernels) = match tn.spec.workload {
        Workload::Graph { nodes } => (Kind::Graph(1), nodes.max(1)),
        _ => (Kind::Kernel, 1),
    };
    let admit = tn.pacer.admit(&k, &cells, now, 0, kind);
    let ticket = match admit {
        Admit::Pass => None,
        Admit::Go(t) => Some(t),
        Admit::Wait { until_ns } | Admit::Suspended { until_ns } => {
            tn.wait_since.get_or_insert(now);
            tn.state = State::Ready(until_ns.max(now + 1) + s.wake_ns);
            return;
        }
    };
    let ns = tn.spec.kernel.duration(s.device.sms);
    for _ in 0..kernels {
        dev.borrow_mut().launch(ti, ns);
    }
    tn.launches += 1;
    let waited = tn.wait_since.take().map_or(0, |w| now - w);
    if let Some(t) = ticket {
        tn.pacer.launched(&k, &cells, t, true, waited, now);
    }
    match tn.spec.workload {
        Workload::Sync { .. } => {
            tn.pacer.before_sync(&k, now);
            tn.state = State::WaitDrain;
        }
        _ => tn.state = State::Ready(now + tn.spec.launch_ns),
    }
}

/// Accuracy figures of one container over a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Accuracy {
    /// Share per window, percent.
    pub windows: Vec<f64>,
    /// Mean absolute error (points) of the windows from `from` on.
    pub mae_points: f64,
    /// Worst absolute error (points) of those windows.
    pub worst_points: f64,
    /// Start of the first window from which every window is within the
    /// band (`None`: never settled).
    pub settled_ns: Option<u64>,
}

impl Outcome {
    /// Accuracy of container `c` against `target_pct`, windows of `w`,
    /// error counted from `from`, settling judged with a `band` (points).
    pub fn accuracy(
        &self,
        c: usize,
        target_pct: f64,
        from: u64,
        to: u64,
        w: u64,
        band: f64,
    ) -> Accuracy {
        let windows: Vec<f64> = self
            .windows(c, 0, to, w)
            .into_iter()
            .map(|x| x * 100.0)
            .collect();
        let first = (from / w) as usize;
        let errs: Vec<f64> = windows
            .iter()
            .skip(first)
            .map(|x| (x - target_pct).abs())
            .collect();
        let mae = if errs.is_empty() {
            f64::NAN
        } else {
            errs.iter().sum::<f64>() / errs.len() as f64
        };
        let worst = errs.iter().cloned().fold(0.0, f64::max);
        let mut settled = None;
        for i in (0..windows.len()).rev() {
            if (windows[i] - target_pct).abs() <= band {
                settled = Some(i as u64 * w);
            } else {
                break;
            }
        }
        Accuracy {
            windows,
            mae_points: mae,
            worst_points: worst,
            settled_ns: settled,
        }
    }
}
