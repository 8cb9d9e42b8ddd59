//! Clocks. Timelines use CLOCK_MONOTONIC nanoseconds, comparable across
//! processes on one host.
use rustix::time::{clock_gettime, ClockId};

pub fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

pub fn realtime_ns() -> u64 {
    let t = clock_gettime(ClockId::Realtime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Sleep until the monotonic clock reaches `deadline_ns`.
pub fn sleep_until(deadline_ns: u64) {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(deadline_ns - now));
    }
}

/// Below this a cost is spun, not slept: a sleep overshoots by the
/// timer slack (~50 us), which would turn a 1 us nested retain into 50.
const SPIN_BELOW_NS: u64 = 200_000;

/// Spend `ns` (a cost-model delay); zero returns at once.
pub fn spend(ns: u64) {
    if ns == 0 {
        return;
    }
    let deadline = now_ns() + ns;
    if ns < SPIN_BELOW_NS {
        while now_ns() < deadline {
            std::hint::spin_loop();
        }
    } else {
        sleep_until(deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_waits_at_least_the_cost() {
        for ns in [0, 1_000, 300_000] {
            let t = now_ns();
            spend(ns);
            assert!(now_ns() - t >= ns);
        }
    }
}
