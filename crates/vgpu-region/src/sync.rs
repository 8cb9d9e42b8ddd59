//! The one place atomics come from, so the loom model checks
//! (`RUSTFLAGS="--cfg loom"`) run the very algorithms the shared file uses.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Give other racers a chance to run (admission back-off).
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// A hint inside short spin loops.
#[cfg(not(loom))]
pub(crate) fn spin_loop() {
    std::hint::spin_loop();
}

/// A few bits of noise that break the symmetry between racers that backed
/// off together (no global state: the clock is the only source).
#[cfg(not(loom))]
pub(crate) fn jitter() -> u32 {
    let t = crate::clock::monotonic_ns();
    // Mix the fast-moving low bits; callers take a small modulus.
    ((t ^ (t >> 7) ^ (t >> 17)) & 0xffff_ffff) as u32
}
