//! The device scheduler: a daemon thread that runs the kernels processes
//! queue in their records, the way a GPU time-slices contexts. Per device,
//! one kernel runs at a time; when another process has work waiting, the
//! running one is preempted after `timeslice_ns` and the next process in
//! round-robin order gets the device. A process's own kernels run in launch
//! order. Time is real (CLOCK_MONOTONIC) but back-dated: a kernel starts
//! when the device became free (or when it was launched, if later), not
//! when this thread got around to it, so a late wake-up leaves no gap.
//! Every interval run is appended to the device's kernel timeline, which
//! NVML's utilization reads.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::clock::now_ns;
use crate::machine::futex_wait;
use crate::state::{State, PROC_LIVE, QUEUE_LEN};

#[derive(Clone, Copy, Debug)]
struct Run {
    rec: usize,
    generation: u64,
    seq: u64,
    pid: u32,
    /// When this kernel (segment) started.
    slice_start: u64,
    /// When this process got the device: its time slice runs from here,
    /// across its consecutive kernels.
    owner_since: u64,
    remaining: u64,
}

/// A queued kernel at the head of a process's queue.
#[derive(Clone, Copy, Debug)]
struct Head {
    rec: usize,
    generation: u64,
    seq: u64,
    pid: u32,
    duration: u64,
    launch: u64,
}

struct Scheduler {
    state: State,
    runs: Vec<Option<Run>>,
    free_at: Vec<u64>,
    cursor: Vec<usize>,
    /// Time left of preempted kernels: (record, generation, seq).
    left: HashMap<(usize, u64, u64), u64>,
}

impl Scheduler {
    fn head(&self, rec: usize) -> Option<Head> {
        let r = self.state.proc_rec(rec);
        if r.state.load(Ordering::Acquire) != PROC_LIVE {
            return None;
        }
        let done = r.q_done.load(Ordering::Acquire);
        if r.q_tail.load(Ordering::Acquire) <= done {
            return None;
        }
        let seq = done + 1;
        let e = &r.queue[(done % QUEUE_LEN as u64) as usize];
        if e.seq.load(Ordering::Acquire) != seq {
            return None;
        }
        Some(Head {
            rec,
            generation: r.generation.load(Ordering::Acquire),
            seq,
            pid: r.host_pid.load(Ordering::Acquire),
            duration: e.duration_ns.load(Ordering::Relaxed),
            launch: e.launch_ns.load(Ordering::Relaxed),
        })
    }

    fn device_of(&self, h: &Head) -> usize {
        let r = self.state.proc_rec(h.rec);
        r.queue[((h.seq - 1) % QUEUE_LEN as u64) as usize]
            .device
            .load(Ordering::Relaxed) as usize
    }

    /// Next process (round-robin after `cursor`) with work for `dev`,
    /// other than `except`, and not running on another device.
    fn pick(&self, dev: usize, except: Option<usize>) -> Option<Head> {
        let n = (self.state.header().proc_hwm.load(Ordering::SeqCst) as usize)
            .min(crate::state::MAX_PROCS);
        if n == 0 {
            return None;
        }
        let start = self.cursor[dev].wrapping_add(1);
        (0..n)
            .map(|k| (start + k) % n)
            .filter(|rec| Some(*rec) != except)
            .filter(|rec| {
                !self
                    .runs
                    .iter()
                    .enumerate()
                    .any(|(d, r)| d != dev && r.is_some_and(|r| r.rec == *rec))
            })
            .filter_map(|rec| self.head(rec))
            .find(|h| self.device_of(h) == dev)
    }

    fn valid(&self, run: &Run) -> bool {
        let r = self.state.proc_rec(run.rec);
        r.state.load(Ordering::Acquire) == PROC_LIVE
            && r.generation.load(Ordering::Acquire) == run.generation
    }

    fn complete(&self, dev: usize, run: &Run, end: u64) {
        if end > run.slice_start {
            self.state.record_kernel(dev, run.pid, run.slice_start, end);
        }
        let r = self.state.proc_rec(run.rec);
        let e = &r.queue[((run.seq - 1) % QUEUE_LEN as u64) as usize];
        if e.seq.load(Ordering::Acquire) == run.seq {
            e.done_ns.store(end, Ordering::Release);
        }
        r.q_done.store(run.seq, Ordering::Release);
        r.q_futex.fetch_add(1, Ordering::AcqRel);
        let _ = rustix::thread::futex::wake(
            &r.q_futex,
            rustix::thread::futex::Flags::empty(),
            u32::MAX,
        );
    }

    /// Advance every device to `now`; returns when something next happens.
    fn step(&mut self, now: u64) -> u64 {
        let ts = self.state.header().timeslice_ns.max(1_000);
        let mut next = now + 100_000_000;
        for dev in 0..self.runs.len() {
            // Transitions until the device is waiting on the future (a
            // bounded batch; after a very late wake-up the rest is caught
            // up at once on the next pass).
            for round in 0..1024 {
                if round == 1023 {
                    next = now;
                    break;
                }
                if let Some(run) = self.runs[dev] {
                    if !self.valid(&run) {
                        // Its process died: the device is free from now.
                        self.runs[dev] = None;
                        self.free_at[dev] = self.free_at[dev].max(now.min(run.slice_start));
                        continue;
                    }
                    let end = run.slice_start + run.remaining;
                    let slice_end = run.owner_since + ts;
                    // Preemption first: after a late wake-up the kernel may
                    // look finished although its slice ended before.
                    if slice_end <= now && slice_end < end {
                        if let Some(other) = self.pick(dev, Some(run.rec)) {
                            let cut = slice_end.max(other.launch).min(now);
                            if cut < end {
                                if cut > run.slice_start {
                                    self.state.record_kernel(dev, run.pid, run.slice_start, cut);
                                }
                                self.left.insert(
                                    (run.rec, run.generation, run.seq),
                                    run.remaining - (cut - run.slice_start),
                                );
                                self.runs[dev] = None;
                                self.free_at[dev] = cut;
                                self.cursor[dev] = run.rec;
                                continue;
                            }
                        }
                    }
                    if end <= now {
                        self.complete(dev, &run, end);
                        self.runs[dev] = None;
                        self.free_at[dev] = end;
                        // The rest of its slice: its next kernel, if any.
                        if end < slice_end {
                            if let Some(h) = self.head(run.rec).filter(|h| self.device_of(h) == dev)
                            {
                                let remaining = self
                                    .left
                                    .remove(&(h.rec, h.generation, h.seq))
                                    .unwrap_or(h.duration);
                                self.runs[dev] = Some(Run {
                                    seq: h.seq,
                                    slice_start: end.max(h.launch),
                                    owner_since: if h.launch > end {
                                        h.launch
                                    } else {
                                        run.owner_since
                                    },
                                    remaining,
                                    ..run
                                });
                            }
                        }
                        continue;
                    }
                    next = next
                        .min(end)
                        .min(if slice_end > now { slice_end } else { now + ts });
                    break;
                }
                let Some(h) = self.pick(dev, None) else { break };
                let remaining = self
                    .left
                    .remove(&(h.rec, h.generation, h.seq))
                    .unwrap_or(h.duration);
                self.cursor[dev] = h.rec;
                let start = self.free_at[dev].max(h.launch);
                self.runs[dev] = Some(Run {
                    rec: h.rec,
                    generation: h.generation,
                    seq: h.seq,
                    pid: h.pid,
                    slice_start: start,
                    owner_since: start,
                    remaining,
                });
            }
        }
        if self.left.len() > 4096 {
            let st = &self.state;
            self.left.retain(|(rec, generation, _), _| {
                let r = st.proc_rec(*rec);
                r.state.load(Ordering::Acquire) == PROC_LIVE
                    && r.generation.load(Ordering::Acquire) == *generation
            });
        }
        next
    }
}

/// Run the scheduler for the state file at `path` until `stop` is set
/// (then ring the doorbell to wake it).
pub fn run(path: PathBuf, stop: Arc<AtomicBool>) {
    // Two mappings of one file: the loop reads the doorbell while `step`
    // borrows the scheduler mutably.
    let (Ok(state), Ok(bell_state)) = (State::open(&path), State::open(&path)) else {
        return;
    };
    let n = state.device_count();
    let mut s = Scheduler {
        state,
        runs: vec![None; n],
        free_at: vec![0; n],
        // Wraps to record 0 for the first pick.
        cursor: vec![usize::MAX; n],
        left: HashMap::new(),
    };
    let mut last_busy = 0u64;
    while !stop.load(Ordering::Acquire) {
        let h = bell_state.header();
        let bell = h.doorbell.load(Ordering::SeqCst);
        // Asleep from before the scan: a launch after it will ring (see
        // `Machine::launch`).
        h.sched_sleeping.store(1, Ordering::SeqCst);
        let now = now_ns();
        let mut next = s.step(now);
        if s.runs.iter().any(Option::is_some) {
            last_busy = now;
        } else if now.saturating_sub(last_busy) < 200_000_000 {
            // Launches ring at most every 200 us: look again soon while
            // work is about, so the timeline lags NVML by at most ~2 ms.
            next = next.min(now + 2_000_000);
        }
        let now2 = now_ns();
        if next > now2 {
            futex_wait(&h.doorbell, bell, next - now2);
        }
        h.sched_sleeping.store(0, Ordering::SeqCst);
    }
}

/// Wake the scheduler (after setting its stop flag, or for tests).
pub fn ring(state: &State) {
    let h = state.header();
    h.doorbell.fetch_add(1, Ordering::AcqRel);
    let _ =
        rustix::thread::futex::wake(&h.doorbell, rustix::thread::futex::Flags::empty(), u32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;

    /// Claim record `i` for `pid` the way the daemon does.
    fn claim(st: &State, i: usize, pid: u32) {
        let r = st.proc_rec(i);
        r.q_tail.store(0, Ordering::SeqCst);
        r.q_done.store(0, Ordering::SeqCst);
        r.generation.fetch_add(1, Ordering::SeqCst);
        r.host_pid.store(pid, Ordering::SeqCst);
        st.header()
            .proc_hwm
            .fetch_max(i as u32 + 1, Ordering::SeqCst);
        r.state.store(PROC_LIVE, Ordering::SeqCst);
    }

    fn enqueue(st: &State, i: usize, duration: u64, launch: u64) {
        let r = st.proc_rec(i);
        let tail = r.q_tail.load(Ordering::SeqCst);
        let e = &r.queue[(tail % QUEUE_LEN as u64) as usize];
        e.duration_ns.store(duration, Ordering::SeqCst);
        e.launch_ns.store(launch, Ordering::SeqCst);
        e.device.store(0, Ordering::SeqCst);
        e.seq.store(tail + 1, Ordering::SeqCst);
        r.q_tail.store(tail + 1, Ordering::SeqCst);
    }

    #[test]
    fn two_queues_are_time_sliced_without_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let mut cfg = SimConfig::default();
        cfg.kernel.timeslice_ns = 1_000_000;
        let st = State::create(&path, &cfg, 1).unwrap();
        claim(&st, 0, 100);
        claim(&st, 1, 200);
        let t0 = now_ns();
        // Process 100: one 20 ms kernel; process 200: four 5 ms kernels.
        enqueue(&st, 0, 20_000_000, t0);
        for _ in 0..4 {
            enqueue(&st, 1, 5_000_000, t0);
        }
        // The scheduler starts late: the first 30 ms must be back-dated,
        // slice by slice, exactly as if it had been awake.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let stop = Arc::new(AtomicBool::new(false));
        let th = {
            let (p, s) = (path.clone(), stop.clone());
            std::thread::spawn(move || run(p, s))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while st.proc_rec(0).q_done.load(Ordering::SeqCst) < 1
            || st.proc_rec(1).q_done.load(Ordering::SeqCst) < 4
        {
            assert!(std::time::Instant::now() < deadline, "scheduler stalled");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, Ordering::SeqCst);
        ring(&st);
        th.join().unwrap();

        let mut k = st.kernels(0, 0, u64::MAX);
        k.sort_by_key(|x| x.1);
        // The model's own timeline: back-to-back from the launch, each
        // process exactly its work, slices alternating.
        assert_eq!(k.first().unwrap().1, t0);
        for w in k.windows(2) {
            assert_eq!(w[0].2, w[1].1, "gap or overlap: {k:?}");
            assert_ne!(w[0].0, w[1].0, "same process twice in a row: {k:?}");
        }
        let total = |pid| {
            k.iter()
                .filter(|x| x.0 == pid)
                .map(|x| x.2 - x.1)
                .sum::<u64>()
        };
        assert_eq!(total(100), 20_000_000);
        assert_eq!(total(200), 20_000_000);
        // While both waited, nobody held the device past its slice (a
        // process keeps it across consecutive kernels within one slice).
        let both_until = k.iter().filter(|x| x.0 == 200).map(|x| x.2).max().unwrap();
        assert!(
            k.iter()
                .filter(|x| x.2 < both_until)
                .all(|x| x.2 - x.1 <= 1_000_000),
            "{k:?}"
        );
        // Completion times are published per launch.
        let done = st.proc_rec(0).queue[0].done_ns.load(Ordering::SeqCst);
        assert_eq!(
            done,
            k.iter().filter(|x| x.0 == 100).map(|x| x.2).max().unwrap()
        );
    }
}
