//! The one place atomics come from, so the loom model checks
//! (`RUSTFLAGS="--cfg loom"`) run the very protocol the interposer uses.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
