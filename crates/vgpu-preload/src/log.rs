//! Logging by raw `write(2)` to stderr, prefixed `[vgpu]`, and the one
//! error-chain formatter of the library.
//!
//! No allocation on the write path, no locks, no global subscriber: the
//! library lives inside arbitrary host processes. The level comes from
//! `LIBCUDA_LOG_LEVEL` (0 quiet, 1 errors, 2 warnings (default), 3 info,
//! 4 debug), read once through `config`.
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};

pub const ERROR: u8 = 1;
pub const WARN: u8 = 2;
pub const INFO: u8 = 3;
pub const DEBUG: u8 = 4;
const DEFAULT: u8 = crate::config::DEFAULT_LOG_LEVEL;
const UNREAD: u8 = u8::MAX;

static LEVEL: AtomicU8 = AtomicU8::new(UNREAD);

/// The active level (reads the environment the first time).
pub fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNREAD {
        return l;
    }
    let (lvl, bad) = crate::config::log_level_from_env();
    LEVEL.store(lvl, Ordering::Relaxed);
    if let Some(v) = bad {
        emit(
            WARN,
            format_args!("LIBCUDA_LOG_LEVEL={v:?} is not a level 0..4; using {DEFAULT} (warnings)"),
        );
    }
    lvl
}

pub fn enabled(l: u8) -> bool {
    l <= level()
}

/// A fixed stack buffer; overlong messages are cut, never allocated.
struct Buf {
    b: [u8; 1024],
    n: usize,
}

impl fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.b.len() - 1 - self.n; // keep one byte for '\n'
        let take = s.len().min(room);
        self.b[self.n..self.n + take].copy_from_slice(&s.as_bytes()[..take]);
        self.n += take;
        Ok(())
    }
}

/// Writes one line `[vgpu] <pid> <LEVEL> msg\n` with a single `write(2)`.
pub fn emit(l: u8, args: fmt::Arguments<'_>) {
    if l > LEVEL.load(Ordering::Relaxed) && l > level() {
        return;
    }
    let mut buf = Buf { b: [0; 1024], n: 0 };
    let tag = match l {
        ERROR => "error",
        WARN => "warn",
        INFO => "info",
        _ => "debug",
    };
    let _ = write!(buf, "[vgpu] {} {tag}: ", std::process::id());
    let _ = buf.write_fmt(args);
    buf.b[buf.n] = b'\n';
    buf.n += 1;
    #[cfg(test)]
    CAPTURED.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            v.push(String::from_utf8_lossy(&buf.b[..buf.n]).into_owned());
        }
    });
    crate::sys::write_stderr(&buf.b[..buf.n]);
}

#[cfg(test)]
thread_local! {
    static CAPTURED: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Tests: runs `f` and returns its value with the lines this thread
/// logged meanwhile (they still go to stderr).
#[cfg(test)]
pub fn captured<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let r = f();
    let lines = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, lines)
}

/// `e`, then each of its sources, joined by `: ` (one line for the log).
pub fn chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}

#[macro_export]
macro_rules! log_at {
    ($lvl:expr, $($t:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::emit($lvl, format_args!($($t)*))
        }
    };
}
#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log_at!($crate::log::ERROR, $($t)*) }; }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log_at!($crate::log::WARN, $($t)*) }; }
#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log_at!($crate::log::INFO, $($t)*) }; }
#[macro_export]
macro_rules! debug { ($($t:tt)*) => { $crate::log_at!($crate::log::DEBUG, $($t)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_cuts_instead_of_overflowing() {
        let mut b = Buf { b: [0; 1024], n: 0 };
        let long = "x".repeat(5000);
        let _ = b.write_str(&long);
        assert_eq!(b.n, 1023);
    }
}
