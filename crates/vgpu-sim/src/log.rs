//! Logging for the simulated driver libraries: raw `write(2)` to stderr,
//! prefixed `[vgpu-sim]`, gated by `LIBCUDA_LOG_LEVEL` (0 quiet … 4 debug,
//! default 2 = warnings). No allocation-free promise: these libraries are
//! test doubles, but they never take a lock to log.
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};

pub const ERROR: u32 = 1;
pub const WARN: u32 = 2;
pub const INFO: u32 = 3;
pub const DEBUG: u32 = 4;

static LEVEL: AtomicU32 = AtomicU32::new(u32::MAX);

fn level() -> u32 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != u32::MAX {
        return l;
    }
    let l = std::env::var("LIBCUDA_LOG_LEVEL")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map(|v| v.min(DEBUG))
        .unwrap_or(WARN);
    LEVEL.store(l, Ordering::Relaxed);
    l
}

pub fn enabled(lvl: u32) -> bool {
    lvl <= level()
}

/// Write one line to fd 2 if `lvl` is enabled.
pub fn log(lvl: u32, msg: &str) {
    if !enabled(lvl) {
        return;
    }
    let line = format!("[vgpu-sim] {msg}\n");
    let mut buf = line.as_bytes();
    while !buf.is_empty() {
        match rustix::io::write(std::io::stderr().as_fd(), buf) {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
    }
}
