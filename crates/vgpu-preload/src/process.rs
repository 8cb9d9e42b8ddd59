//! Process-level mechanics every layer above relies on: the generation
//! counter, the library's ONE `pthread_atfork` child handler and ONE
//! `atexit` handler (modules register callbacks with them), the ONE
//! per-thread re-entrancy guard, and the one thread the library may own.
//!
//! The per-process *state* built on these (configuration, region, charge
//! tables) is [`crate::attach`]'s; this module knows nothing of CUDA.
//!
//! Must never: do work before the first hook calls in (nothing here runs
//! in a constructor), start the owned thread before something needs it, or
//! do anything but store atomics in the fork-child handler.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::sys;

// ------------------------------------------------------------ generation

/// Bumped in every forked child: state tagged with an older generation
/// belongs to the parent.
static GEN: AtomicU32 = AtomicU32::new(0);

/// This process image's generation (0 until the first fork).
#[inline]
pub fn generation() -> u32 {
    GEN.load(Ordering::Acquire)
}

// -------------------------------------------------- fork and exit handlers

const MAX_CALLBACKS: usize = 8;
/// Fork-child callbacks (fn pointers as usize; 0: free). Called from the
/// atfork child handler: they must only store atomics.
static CHILD: [AtomicUsize; MAX_CALLBACKS] = [const { AtomicUsize::new(0) }; MAX_CALLBACKS];
/// Exit callbacks, run in reverse order of registration.
static EXIT: [AtomicUsize; MAX_CALLBACKS] = [const { AtomicUsize::new(0) }; MAX_CALLBACKS];
/// 0 not installed, 1 installing, 2 installed.
static INSTALLED: AtomicU8 = AtomicU8::new(0);

fn add(list: &[AtomicUsize; MAX_CALLBACKS], f: fn()) {
    let v = f as usize;
    for s in list {
        match s.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(cur) if cur == v => return,
            Err(_) => {}
        }
    }
    crate::error!("internal: more than {MAX_CALLBACKS} process callbacks; one is not registered");
}

fn call(v: usize) {
    if v != 0 {
        // SAFETY: every non-zero entry was stored from a `fn()` by `add`.
        let f = unsafe { std::mem::transmute::<usize, fn()>(v) };
        f();
    }
}

/// Registers `f` to run in every forked child, right after the fork, from
/// the one atfork handler. `f` must only store atomics (the child may be
/// the single thread left of a multithreaded parent).
pub fn on_fork_child(f: fn()) {
    add(&CHILD, f);
    install();
}

/// Registers `f` to run at normal process exit, from the one atexit
/// handler, after the owned thread has stopped.
pub fn on_exit(f: fn()) {
    add(&EXIT, f);
    install();
}

/// Installs the two handlers, once per process (they survive `fork`).
pub fn install() {
    if INSTALLED.load(Ordering::Acquire) == 2
        || INSTALLED
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    if !sys::at_exit(exit_handler) {
        crate::warn!("atexit failed; this process's slot is left to reclaim at exit");
    }
    if !sys::at_fork_child(fork_child_handler) {
        crate::warn!("pthread_atfork failed; a forked child would share its parent's state");
    }
    INSTALLED.store(2, Ordering::Release);
}

unsafe extern "C" fn fork_child_handler() {
    // Atomics only.
    GEN.fetch_add(1, Ordering::AcqRel);
    thread_forked();
    for s in &CHILD {
        call(s.load(Ordering::Acquire));
    }
}

extern "C" fn exit_handler() {
    // Runs from C (exit(3)): a panic must not unwind out of it.
    let _ = std::panic::catch_unwind(|| {
        stop_owned_thread(EXIT_WAIT);
        for s in EXIT.iter().rev() {
            call(s.load(Ordering::Acquire));
        }
    });
}

// ------------------------------------------------------ re-entrancy guard

/// What a thread can be in the middle of when a hook is re-entered on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Section {
    /// Loading a driver library (its constructors may call our hooks).
    LoadingDriver = 1,
    /// Routing a `dlsym` answer (std and the loader call `dlsym` too).
    Dlsym = 2,
    /// Building the per-process state.
    Attaching = 4,
}

thread_local! {
    /// The sections this thread is inside (one bit per [`Section`]): the
    /// one execution context of the library, per thread.
    static INSIDE: Cell<u8> = const { Cell::new(0) };
}

/// Whether this thread is inside `s`.
#[inline]
pub fn inside(s: Section) -> bool {
    INSIDE.with(|c| c.get() & s as u8 != 0)
}

/// Being inside a [`Section`]; leaving it (drop) restores the context.
#[must_use]
pub struct Inside(Section);

impl Inside {
    /// Enters `s`, or `None` when this thread is already inside it (the
    /// caller then takes its pass-through path instead of recursing).
    pub fn enter(s: Section) -> Option<Inside> {
        INSIDE.with(|c| {
            let v = c.get();
            if v & s as u8 != 0 {
                return None;
            }
            c.set(v | s as u8);
            Some(Inside(s))
        })
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(c.get() & !(self.0 as u8)));
    }
}

// ------------------------------------------------------- the owned thread

/// What the owned thread runs. One job per process; the thread calls
/// [`Job::tick`] until the process exits (or forks: the child's thread is
/// gone and restarts at its next [`start_owned_thread`]).
pub trait Job: Sync {
    /// Does one round of work; returns how long to sleep before the next
    /// (a [`wake_owned_thread`] cuts the sleep short).
    fn tick(&self) -> Duration;
    /// Called on the thread when it stops (exit, or after a panic in `tick`).
    fn stopped(&self) {}
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ThreadError {
    #[error("the owned thread already runs another job")]
    OtherJob,
    #[error("cannot start the owned thread: {0}")]
    Spawn(String),
    #[error("the process is exiting")]
    Exiting,
}

static JOB: OnceLock<&'static dyn Job> = OnceLock::new();
/// generation + 1 of the running thread (0: none in this image).
static RUNNING: AtomicU32 = AtomicU32::new(0);
static STARTING: AtomicBool = AtomicBool::new(false);
static EXITING: AtomicBool = AtomicBool::new(false);
/// Futex word the thread sleeps on; bumped to wake it.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// Futex word: generation + 1 of the last thread that finished.
static DONE: AtomicU32 = AtomicU32::new(0);
/// How long exit waits for the thread to finish its round.
const EXIT_WAIT: Duration = Duration::from_millis(500);

thread_local! {
    static IS_OWNED: Cell<bool> = const { Cell::new(false) };
}

/// Starts the owned thread running `job` if it is not running in this
/// process image: lazily, on first need, never from a constructor. Returns
/// at once (the thread does its first tick on its own).
pub fn start_owned_thread(job: &'static dyn Job) -> Result<(), ThreadError> {
    let mine = generation().wrapping_add(1);
    if RUNNING.load(Ordering::Acquire) == mine {
        return same_job(job);
    }
    let set = *JOB.get_or_init(|| job);
    if !std::ptr::addr_eq(set, job) {
        return Err(ThreadError::OtherJob);
    }
    if EXITING.load(Ordering::Acquire) {
        return Err(ThreadError::Exiting);
    }
    if STARTING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Ok(()); // another thread is starting it right now
    }
    let r = if RUNNING.load(Ordering::Acquire) == mine {
        Ok(())
    } else {
        RUNNING.store(mine, Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("vgpu-owned".into())
            .spawn(move || owned_loop(set, mine));
        match spawned {
            Ok(_detached) => Ok(()),
            Err(e) => {
                RUNNING.store(0, Ordering::Release);
                Err(ThreadError::Spawn(e.to_string()))
            }
        }
    };
    STARTING.store(false, Ordering::Release);
    install();
    r
}

fn same_job(job: &'static dyn Job) -> Result<(), ThreadError> {
    match JOB.get() {
        Some(j) if std::ptr::addr_eq(*j, job) => Ok(()),
        _ => Err(ThreadError::OtherJob),
    }
}

/// Whether the owned thread runs in this process image.
pub fn owned_thread_running() -> bool {
    RUNNING.load(Ordering::Acquire) == generation().wrapping_add(1)
}

/// Cuts the owned thread's current sleep short.
pub fn wake_owned_thread() {
    WAKE.fetch_add(1, Ordering::AcqRel);
    sys::futex_wake(&WAKE, i32::MAX);
}

fn owned_loop(job: &'static dyn Job, mine: u32) {
    IS_OWNED.with(|c| c.set(true));
    crate::debug!("owned thread started");
    loop {
        if EXITING.load(Ordering::Acquire) || RUNNING.load(Ordering::Acquire) != mine {
            break;
        }
        let seen = WAKE.load(Ordering::Acquire);
        let sleep = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.tick())) {
            Ok(d) => d,
            Err(_) => {
                crate::error!("internal error (panic) in the owned thread's job; the thread stops");
                break;
            }
        };
        if EXITING.load(Ordering::Acquire) {
            break;
        }
        sys::futex_wait(&WAKE, seen, Some(sleep));
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.stopped()));
    crate::debug!("owned thread stopped");
    let _ = RUNNING.compare_exchange(mine, 0, Ordering::AcqRel, Ordering::Acquire);
    DONE.store(mine, Ordering::Release);
    sys::futex_wake(&DONE, i32::MAX);
}

/// Stops the owned thread and waits up to `wait` for it to finish its
/// round (from the exit handler; a thread stuck in a driver call is left
/// behind rather than holding up the exit).
fn stop_owned_thread(wait: Duration) {
    EXITING.store(true, Ordering::Release);
    let mine = generation().wrapping_add(1);
    if RUNNING.load(Ordering::Acquire) != mine || IS_OWNED.with(Cell::get) {
        return;
    }
    wake_owned_thread();
    let deadline = std::time::Instant::now() + wait;
    loop {
        let done = DONE.load(Ordering::Acquire);
        if done == mine {
            return;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            crate::debug!("owned thread did not stop within {wait:?}; exiting without it");
            return;
        }
        sys::futex_wait(&DONE, done, Some(deadline - now));
    }
}

/// Fork child: the thread did not survive the fork. Atomics only.
fn thread_forked() {
    RUNNING.store(0, Ordering::Release);
    STARTING.store(false, Ordering::Release);
    EXITING.store(false, Ordering::Release);
    DONE.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_nests_per_section_and_restores() {
        assert!(!inside(Section::Dlsym));
        {
            let _a = Inside::enter(Section::Dlsym).expect("not inside yet");
            assert!(inside(Section::Dlsym));
            assert!(Inside::enter(Section::Dlsym).is_none(), "re-entry refused");
            let _b = Inside::enter(Section::Attaching).expect("another section");
            assert!(inside(Section::Attaching) && inside(Section::Dlsym));
        }
        assert!(!inside(Section::Dlsym) && !inside(Section::Attaching));
        // Per thread: another thread is not inside this one's section.
        let _a = Inside::enter(Section::LoadingDriver).unwrap();
        std::thread::spawn(|| assert!(!inside(Section::LoadingDriver)))
            .join()
            .unwrap();
    }

    #[test]
    fn callbacks_register_once() {
        static N: AtomicU32 = AtomicU32::new(0);
        fn bump() {
            N.fetch_add(1, Ordering::Relaxed);
        }
        add(&CHILD, bump);
        add(&CHILD, bump);
        let n = CHILD
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) == (bump as fn()) as usize)
            .count();
        assert_eq!(n, 1);
        for s in &CHILD {
            if s.load(Ordering::Relaxed) == (bump as fn()) as usize {
                call(s.load(Ordering::Relaxed));
            }
        }
        assert_eq!(N.load(Ordering::Relaxed), 1);
    }
}
