//! Clocks shared by every process on the machine.

/// CLOCK_MONOTONIC in ns: the clock of every phase timestamp, comparable
/// across processes of one boot.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// CLOCK_REALTIME in ns since the Unix epoch (creation time, for humans).
pub fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}
