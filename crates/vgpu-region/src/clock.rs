//! Clocks shared by every process on the machine.
//!
//! libc's `clock_gettime` (the vDSO glibc has already set up for the
//! process) rather than rustix's: rustix's own vDSO lookup costs a
//! `prctl(PR_GET_AUXV)` and an ELF walk on first use, inside `cuInit`.

fn read(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; every clock id used is
    // supported by every Linux kernel, so the call cannot fail.
    unsafe { libc::clock_gettime(id, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns: the clock of every phase timestamp, comparable
/// across processes of one boot.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC_COARSE in ns: the same clock at the kernel tick's
/// resolution (1-4 ms), read without the TSC (a few ns instead of tens),
/// for rate limits of tens of ms on hot paths.
pub fn coarse_monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// CLOCK_REALTIME in ns since the Unix epoch (creation time, for humans).
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}
