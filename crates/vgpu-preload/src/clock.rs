//! Time for the limiter and `cuInit`'s phase stamps, injected:
//! [`MonotonicClock`] for the phase stamps and [`TSC`] for the limiter in
//! the library, [`FakeClock`] in tests (firecracker's token bucket is the
//! model), so pacing logic is tested without sleeping.
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonic clock in nanoseconds, and the waits a paced launch makes.
pub trait Clock: Sync {
    fn now_ns(&self) -> u64;
    /// Blocks the calling thread for `ns` (a paced launch's wait).
    fn sleep_ns(&self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
    /// The owned thread's round: a clock that keeps state re-anchors it.
    /// Returns why the clock stopped using its fast source, once.
    fn tick(&self) -> Option<&'static str> {
        None
    }
}

/// The limiter's clock: CLOCK_MONOTONIC read from the TSC between the
/// owned thread's anchors, where the kernel's clock is the TSC too
/// (`vgpu_region::TscClock`: half the cost of a vDSO read on the paced
/// launch path; the kernel's clock whenever it cannot be kept right).
pub static TSC: vgpu_region::TscClock = vgpu_region::TscClock::new();

impl Clock for vgpu_region::TscClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        vgpu_region::TscClock::now_ns(self)
    }
    fn tick(&self) -> Option<&'static str> {
        match self.anchor() {
            vgpu_region::clock::Anchored::Off(why) => Some(why),
            _ => None,
        }
    }
}

/// The library's clock.
pub static MONOTONIC: MonotonicClock = MonotonicClock;

/// CLOCK_MONOTONIC, the clock the region's phase stamps use (comparable
/// across the processes of a machine).
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        vgpu_region::monotonic_ns()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct FakeClock(AtomicU64);

impl FakeClock {
    pub fn new(start_ns: u64) -> FakeClock {
        FakeClock(AtomicU64::new(start_ns))
    }

    pub fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::AcqRel);
    }

    pub fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Release);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    /// A wait moves the clock (nothing sleeps).
    fn sleep_ns(&self, ns: u64) {
        self.advance(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back_and_fake_moves_only_when_told() {
        let c = MonotonicClock;
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(a > 0 && b >= a);
        let f = FakeClock::new(10);
        assert_eq!(f.now_ns(), 10);
        f.advance(5);
        assert_eq!(f.now_ns(), 15);
        f.set(1_000);
        assert_eq!(f.now_ns(), 1_000);
        let dynamic: &dyn Clock = &f;
        assert_eq!(dynamic.now_ns(), 1_000);
        dynamic.sleep_ns(250);
        assert_eq!(f.now_ns(), 1_250, "a fake wait moves the fake clock");
    }
}
