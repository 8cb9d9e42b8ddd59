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

/// Sleep `ns` (a cost-model delay); zero returns at once.
pub fn spend(ns: u64) {
    if ns > 0 {
        sleep_until(now_ns() + ns);
    }
}
