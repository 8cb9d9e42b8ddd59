//! Process-level mechanics every layer above relies on: the generation
//! counter, the library's ONE `pthread_atfork` child handler and ONE
//! `atexit` handler (modules register callbacks with them), the ONE
//! per-thread re-entrancy guard, the ONE shape of lazily built per-process
//! state ([`PerImage`]), and the one thread the library may own, which runs
//! the modules' periodic tasks ([`Periodic`]).
//!
//! The per-process *state* built on these (configuration, region, charge
//! tables) is [`crate::attach`]'s; this module knows nothing of CUDA.
//!
//! Must never: do work before the first hook calls in (nothing here runs
//! in a constructor), start the owned thread before something needs it, or
//! do anything but store atomics in the fork-child handler.
use std::cell::Cell;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
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

// ------------------------------------------------- per-image state cells

/// One piece of per-process state: built at most once per process image
/// (per fork generation) by the first caller that needs it, published with
/// one release store and leaked (never freed: other threads may hold the
/// `&'static T` it hands out). The one shape of the library's lazily built
/// state (attachment, limiter, NVML views, identity).
///
/// Reading is one acquire load and one compare with the generation: no
/// allocation, no lock. Building:
/// - a concurrent builder of the same image waits (yields) for the one
///   building, then gets its value;
/// - a builder re-entered on its own thread (the build calls a hook that
///   needs the same state) gets `None` and takes its pass-through path;
/// - a build that returns `None` publishes nothing (the next caller tries
///   again);
/// - in a forked child the parent's value is stale (older generation) and
///   the child builds its own; a parent thread that was building at the
///   fork is gone, so its claim is stale too. A cell made with
///   [`PerImage::inherited`] keeps the parent's value instead (state that
///   stays true in the child: a read-only mapping, NVML's device order).
pub struct PerImage<T: 'static> {
    value: AtomicPtr<Built<T>>,
    /// generation + 1 of the image whose thread is building (0: none).
    building: AtomicU32,
    /// That thread's token ([`thread_token`]).
    builder: AtomicUsize,
    inherit: bool,
}

struct Built<T> {
    gen: u32,
    value: T,
}

thread_local! {
    /// Its address tells this thread apart from the other live ones.
    static TOKEN: u8 = const { 0 };
}

fn thread_token() -> usize {
    TOKEN.with(|t| t as *const u8 as usize)
}

/// How often a waiting builder yields before it sleeps between looks.
const BUILD_YIELDS: u32 = 64;

impl<T: Send + Sync + 'static> PerImage<T> {
    /// A cell rebuilt in every forked child.
    pub const fn new() -> PerImage<T> {
        PerImage {
            value: AtomicPtr::new(std::ptr::null_mut()),
            building: AtomicU32::new(0),
            builder: AtomicUsize::new(0),
            inherit: false,
        }
    }

    /// A cell whose value a forked child keeps (built once per process
    /// tree unless it was not built before the fork).
    pub const fn inherited() -> PerImage<T> {
        PerImage {
            inherit: true,
            ..PerImage::new()
        }
    }

    /// The value if built for this image (never builds).
    #[inline]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.value.load(Ordering::Acquire);
        // SAFETY: `value` only ever holds null or a pointer from `Box::leak`
        // (`get_or_build`), never freed, so it is valid for 'static; the
        // acquire load pairs with the release store that published it.
        let b: &'static Built<T> = unsafe { p.as_ref() }?;
        (self.inherit || b.gen == generation()).then_some(&b.value)
    }

    /// The value, built by `build` first if this image has none (see the
    /// type's rules for concurrent, re-entered and failed builds).
    pub fn get_or_build(&self, build: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        // The generation must move in a forked child, or a claim of a
        // parent thread that is gone there would look current forever.
        install();
        let me = thread_token();
        let mut looks = 0u32;
        loop {
            if let Some(v) = self.get() {
                return Some(v);
            }
            // Read again each round: a fork may have made this thread the
            // only one of a new image.
            let gen = generation();
            let mine = gen.wrapping_add(1);
            let cur = self.building.load(Ordering::Acquire);
            if cur == mine {
                if self.builder.load(Ordering::Acquire) == me {
                    return None; // re-entered by our own build
                }
                // Another thread of this image builds: wait for it.
                looks += 1;
                if looks < BUILD_YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                continue;
            }
            // Idle, or claimed by a thread of an older image (gone with the
            // fork): claim it for this one.
            if self
                .building
                .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.builder.store(me, Ordering::Release);
            // Released on every way out, a panic in `build` included.
            let _claim = Claim { cell: self, mine };
            // Another thread may have published between our look and the
            // claim.
            if let Some(v) = self.get() {
                return Some(v);
            }
            let value = build()?;
            let b: &'static Built<T> = Box::leak(Box::new(Built { gen, value }));
            // A fork in the middle makes this value the parent's: the
            // caller may use it, the child's image does not publish it.
            if generation() == gen {
                self.value
                    .store(b as *const Built<T> as *mut Built<T>, Ordering::Release);
            }
            return Some(&b.value);
        }
    }

    /// Unpublishes and returns this image's value (at exit: later callers
    /// see none, and build none unless they ask). The value stays valid.
    pub fn take(&self) -> Option<&'static T> {
        let v = self.get()?;
        let p = self.value.swap(std::ptr::null_mut(), Ordering::AcqRel);
        (!p.is_null()).then_some(v)
    }
}

impl<T: Send + Sync + 'static> Default for PerImage<T> {
    fn default() -> Self {
        Self::new()
    }
}

struct Claim<'a, T: 'static> {
    cell: &'a PerImage<T>,
    mine: u32,
}

impl<T: 'static> Drop for Claim<'_, T> {
    fn drop(&mut self) {
        self.cell.builder.store(0, Ordering::Release);
        let _ =
            self.cell
                .building
                .compare_exchange(self.mine, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

// ------------------------------------------------------- the owned thread

/// When a periodic task wants to run again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// After this long (a [`wake_owned_thread`] does not make it run sooner).
    After(Duration),
    /// Not again in this image until it is scheduled again.
    Stop,
}

/// One periodic task of the owned thread.
pub trait Task: Sync {
    /// Does one round at `now_ns` (CLOCK_MONOTONIC); says when the next is.
    fn run(&self, now_ns: u64) -> Next;
    /// Called on the thread when it stops (exit) while the task is still
    /// scheduled in this image.
    fn stopped(&self) {}
    /// For the log.
    fn name(&self) -> &'static str;
}

/// A task and its schedule in the owned thread: declared as a `static` by
/// the module that owns the task, scheduled at first need with
/// [`schedule`], again in a forked child (its registration is the
/// parent's there), stopped at exit.
pub struct Periodic {
    task: &'static dyn Task,
    /// generation + 1 of the image it is scheduled in (0: none).
    active: AtomicU32,
    /// CLOCK_MONOTONIC ns it is due at (0: at once).
    due: AtomicU64,
}

impl Periodic {
    pub const fn new(task: &'static dyn Task) -> Periodic {
        Periodic {
            task,
            active: AtomicU32::new(0),
            due: AtomicU64::new(0),
        }
    }

    fn active_in(&self, mine: u32) -> bool {
        self.active.load(Ordering::Acquire) == mine
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ThreadError {
    #[error("more than {MAX_TASKS} periodic tasks")]
    TooManyTasks,
    #[error("cannot start the owned thread: {0}")]
    Spawn(String),
    #[error("the process is exiting")]
    Exiting,
}

const MAX_TASKS: usize = 8;
/// Every task ever scheduled (null: free). A task keeps its entry across
/// forks; [`Periodic::active`] says whether it runs in this image.
static TASKS: [AtomicPtr<Periodic>; MAX_TASKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_TASKS];
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
/// The longest sleep with nothing due (a registration wakes it anyway).
const IDLE: Duration = Duration::from_secs(1);

thread_local! {
    static IS_OWNED: Cell<bool> = const { Cell::new(false) };
}

fn list_add(list: &[AtomicPtr<Periodic>], p: &'static Periodic) -> bool {
    let want = p as *const Periodic as *mut Periodic;
    for s in list {
        match s.compare_exchange(
            std::ptr::null_mut(),
            want,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return true,
            Err(cur) if cur == want => return true,
            Err(_) => {}
        }
    }
    false
}

fn list_get(s: &AtomicPtr<Periodic>) -> Option<&'static Periodic> {
    let p = s.load(Ordering::Acquire);
    // SAFETY: list entries are only ever null or made from a
    // `&'static Periodic` by `list_add`, so a non-null one is valid forever.
    unsafe { p.as_ref() }
}

/// Schedules `p` in the owned thread of this process image, due at once,
/// and starts the thread if it is not running (lazily, on first need,
/// never from a constructor). Cheap when `p` is scheduled already (two
/// loads).
pub fn schedule(p: &'static Periodic) -> Result<(), ThreadError> {
    let mine = generation().wrapping_add(1);
    if !p.active_in(mine) {
        if EXITING.load(Ordering::Acquire) {
            return Err(ThreadError::Exiting);
        }
        if !list_add(&TASKS, p) {
            return Err(ThreadError::TooManyTasks);
        }
        p.due.store(0, Ordering::Release);
        p.active.store(mine, Ordering::Release);
        wake_owned_thread();
    }
    if RUNNING.load(Ordering::Acquire) == mine {
        return Ok(());
    }
    start_owned_thread(mine)
}

/// Whether `p` is scheduled in this process image.
pub fn scheduled(p: &Periodic) -> bool {
    p.active_in(generation().wrapping_add(1))
}

fn start_owned_thread(mine: u32) -> Result<(), ThreadError> {
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
            .spawn(move || owned_loop(mine));
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

/// Whether the owned thread runs in this process image.
pub fn owned_thread_running() -> bool {
    RUNNING.load(Ordering::Acquire) == generation().wrapping_add(1)
}

/// Cuts the owned thread's current sleep short.
pub fn wake_owned_thread() {
    WAKE.fetch_add(1, Ordering::AcqRel);
    sys::futex_wake(&WAKE, i32::MAX);
}

/// One round of the scheduler: runs every task of `list` scheduled in
/// image `mine` and due at `now`, and returns the earliest time one is
/// due next (`None`: none scheduled). A task that asks to stop, or
/// panics, is unscheduled; the others go on.
fn run_due(list: &[AtomicPtr<Periodic>], mine: u32, now: u64) -> Option<u64> {
    let mut next: Option<u64> = None;
    for s in list {
        let Some(p) = list_get(s) else { continue };
        if !p.active_in(mine) {
            continue;
        }
        let mut due = p.due.load(Ordering::Acquire);
        if due <= now {
            // Marks the round as running: a schedule() meanwhile stores 0.
            p.due.store(u64::MAX, Ordering::Release);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.task.run(now)));
            due = match r {
                Ok(Next::After(d)) => {
                    let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    now.saturating_add(d.max(1)).min(u64::MAX - 1)
                }
                // Unless scheduled again during the run.
                Ok(Next::Stop) if p.due.load(Ordering::Acquire) == u64::MAX => {
                    let _ = p
                        .active
                        .compare_exchange(mine, 0, Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
                Ok(Next::Stop) => 0,
                Err(_) => {
                    crate::error!(
                        "internal error (panic) in the owned thread's task {}; it stops",
                        p.task.name()
                    );
                    p.active.store(0, Ordering::Release);
                    continue;
                }
            };
            if p.due
                .compare_exchange(u64::MAX, due, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                due = 0; // scheduled again during the run: at once
            }
        }
        next = Some(next.map_or(due, |n| n.min(due)));
    }
    next
}

fn owned_loop(mine: u32) {
    IS_OWNED.with(|c| c.set(true));
    crate::debug!("owned thread started");
    loop {
        if EXITING.load(Ordering::Acquire) || RUNNING.load(Ordering::Acquire) != mine {
            break;
        }
        let seen = WAKE.load(Ordering::Acquire);
        let now = vgpu_region::monotonic_ns();
        let next = run_due(&TASKS, mine, now);
        if EXITING.load(Ordering::Acquire) {
            break;
        }
        let sleep = match next {
            Some(t) => Duration::from_nanos(t.saturating_sub(vgpu_region::monotonic_ns())),
            None => IDLE,
        };
        if !sleep.is_zero() {
            sys::futex_wait(&WAKE, seen, Some(sleep.min(IDLE)));
        }
    }
    for s in &TASKS {
        if let Some(p) = list_get(s).filter(|p| p.active_in(mine)) {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.task.stopped()));
        }
    }
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

/// Fork child: the thread did not survive the fork (its tasks are the
/// parent's registrations: older generation). Atomics only.
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

    // ------------------------------------------------------------ PerImage

    #[test]
    fn one_build_for_many_threads() {
        static CELL: PerImage<u64> = PerImage::new();
        static BUILDS: AtomicU32 = AtomicU32::new(0);
        let barrier = std::sync::Barrier::new(16);
        let got: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let v = CELL.get_or_build(|| {
                            BUILDS.fetch_add(1, Ordering::SeqCst);
                            // Long enough for the others to find it building.
                            std::thread::sleep(Duration::from_millis(20));
                            Some(42)
                        });
                        v.map(|r| r as *const u64 as usize)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        assert_eq!(BUILDS.load(Ordering::SeqCst), 1, "built once");
        assert!(got.iter().all(|&p| p == got[0]), "one value: {got:?}");
        assert_eq!(CELL.get(), Some(&42));
    }

    #[test]
    fn a_reentered_build_gets_none_and_a_failed_one_publishes_nothing() {
        let cell: &'static PerImage<u32> = Box::leak(Box::new(PerImage::new()));
        let mut inner = Some(0);
        let v = cell.get_or_build(|| {
            inner = Some(cell.get_or_build(|| Some(2)).map_or(0, |v| *v));
            Some(1)
        });
        assert_eq!(v, Some(&1));
        assert_eq!(inner, Some(0), "the re-entered build got None");
        let other: PerImage<u32> = PerImage::new();
        assert_eq!(other.get_or_build(|| None), None);
        assert_eq!(other.get(), None, "nothing published");
        assert_eq!(other.get_or_build(|| Some(7)), Some(&7), "tried again");
        assert_eq!(other.take(), Some(&7));
        assert_eq!(other.get(), None, "taken");
    }

    #[test]
    fn an_older_generations_value_and_claim_are_stale() {
        let old = generation().wrapping_sub(1);
        let leaked = |v: u32| Box::into_raw(Box::new(Built { gen: old, value: v }));
        // A value built by the parent image: rebuilt, unless inherited.
        let cell: PerImage<u32> = PerImage::new();
        cell.value.store(leaked(1), Ordering::Release);
        assert_eq!(cell.get(), None);
        assert_eq!(cell.get_or_build(|| Some(2)), Some(&2));
        let kept: PerImage<u32> = PerImage::inherited();
        kept.value.store(leaked(1), Ordering::Release);
        assert_eq!(kept.get_or_build(|| Some(2)), Some(&1));
        // A parent thread that was building at the fork is gone: its claim
        // does not hold the child up.
        let claimed: PerImage<u32> = PerImage::new();
        claimed
            .building
            .store(old.wrapping_add(1), Ordering::Release);
        claimed.builder.store(1, Ordering::Release);
        assert_eq!(claimed.get_or_build(|| Some(3)), Some(&3));
        assert_eq!(
            claimed.building.load(Ordering::Acquire),
            0,
            "claim released"
        );
    }

    #[test]
    fn a_forked_child_builds_its_own_and_keeps_inherited_ones() {
        static FRESH: PerImage<u32> = PerImage::new();
        static KEPT: PerImage<u32> = PerImage::inherited();
        let parent = *FRESH.get_or_build(|| Some(sys::getpid() as u32)).unwrap();
        assert_eq!(KEPT.get_or_build(|| Some(10)), Some(&10));
        // SAFETY: the child only reads atomics, allocates (glibc's malloc
        // is fork-safe) and leaves with `_exit`, never returning into the
        // test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let me = sys::getpid() as u32;
            let ok = FRESH.get().is_none()
                && FRESH.get_or_build(|| Some(me)) == Some(&me)
                && KEPT.get_or_build(|| Some(11)) == Some(&10)
                && generation() != 0;
            // SAFETY: ends the child at once (no atexit, no unwinding).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waits for the child forked above; `st` is a live out-param.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st}");
        assert_eq!(FRESH.get(), Some(&parent), "the parent's stays");
    }

    // ----------------------------------------------------------- scheduler

    struct Counting {
        runs: AtomicU32,
        every: Duration,
        stop_after: u32,
        last_now: AtomicU64,
    }

    impl Task for Counting {
        fn run(&self, now: u64) -> Next {
            self.last_now.store(now, Ordering::SeqCst);
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= self.stop_after {
                Next::Stop
            } else {
                Next::After(self.every)
            }
        }
        fn name(&self) -> &'static str {
            "counting"
        }
    }

    fn counting(every_ms: u64, stop_after: u32) -> &'static Periodic {
        let t: &'static Counting = Box::leak(Box::new(Counting {
            runs: AtomicU32::new(0),
            every: Duration::from_millis(every_ms),
            stop_after,
            last_now: AtomicU64::new(0),
        }));
        Box::leak(Box::new(Periodic::new(t)))
    }

    fn runs(p: &Periodic) -> u32 {
        // The tests' tasks are all `Counting`.
        let t = p.task as *const dyn Task as *const Counting;
        // SAFETY: every Periodic built by `counting` wraps a leaked Counting.
        unsafe { &*t }.runs.load(Ordering::SeqCst)
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn tasks_run_when_due_each_on_its_own_period() {
        let list: [AtomicPtr<Periodic>; 4] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 4];
        let mine = 7;
        let fast = counting(10, u32::MAX);
        let slow = counting(100, u32::MAX);
        let other_image = counting(1, u32::MAX);
        for p in [fast, slow, other_image] {
            assert!(list_add(&list, p));
        }
        assert!(list_add(&list, fast), "already listed");
        fast.active.store(mine, Ordering::SeqCst);
        slow.active.store(mine, Ordering::SeqCst);
        other_image.active.store(mine - 1, Ordering::SeqCst);
        // Both due at once; the next round is the fast one's.
        assert_eq!(run_due(&list, mine, 1000 * MS), Some(1010 * MS));
        assert_eq!((runs(fast), runs(slow)), (1, 1));
        // Not due yet: nothing runs.
        assert_eq!(run_due(&list, mine, 1005 * MS), Some(1010 * MS));
        assert_eq!((runs(fast), runs(slow)), (1, 1));
        // A second of rounds every ms: 10 ms and 100 ms periods.
        for t in 1010..2000 {
            run_due(&list, mine, t * MS);
        }
        assert_eq!((runs(fast), runs(slow)), (100, 10));
        assert_eq!(runs(other_image), 0, "the parent image's task never runs");
    }

    #[test]
    fn a_task_that_stops_leaves_the_others_and_can_be_scheduled_again() {
        let list: [AtomicPtr<Periodic>; 4] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 4];
        let mine = 3;
        let once = counting(10, 1);
        let keeps = counting(50, u32::MAX);
        for p in [once, keeps] {
            assert!(list_add(&list, p));
            p.active.store(mine, Ordering::SeqCst);
        }
        assert_eq!(run_due(&list, mine, 100 * MS), Some(150 * MS));
        assert!(!once.active_in(mine), "it asked to stop");
        for t in 101..=400 {
            run_due(&list, mine, t * MS);
        }
        assert_eq!((runs(once), runs(keeps)), (1, 7));
        // Scheduled again (as `schedule` does): due at once.
        once.due.store(0, Ordering::SeqCst);
        once.active.store(mine, Ordering::SeqCst);
        run_due(&list, mine, 401 * MS);
        assert_eq!(runs(once), 2);
        // Nothing scheduled: no due time.
        keeps.active.store(0, Ordering::SeqCst);
        assert_eq!(run_due(&list, mine, 402 * MS), None);
    }

    #[test]
    fn a_panicking_task_is_unscheduled_and_the_list_is_bounded() {
        struct Panics;
        impl Task for Panics {
            fn run(&self, _: u64) -> Next {
                panic!("test task")
            }
            fn name(&self) -> &'static str {
                "panics"
            }
        }
        static P: Periodic = Periodic::new(&Panics);
        let list: [AtomicPtr<Periodic>; 2] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 2];
        let ok = counting(5, u32::MAX);
        assert!(list_add(&list, &P) && list_add(&list, ok));
        assert!(!list_add(&list, counting(5, 1)), "full");
        P.active.store(1, Ordering::SeqCst);
        ok.active.store(1, Ordering::SeqCst);
        assert_eq!(run_due(&list, 1, 10 * MS), Some(15 * MS));
        assert!(!P.active_in(1));
        assert_eq!(runs(ok), 1);
    }

    #[test]
    fn the_owned_thread_runs_scheduled_tasks() {
        static T: std::sync::LazyLock<&'static Periodic> =
            std::sync::LazyLock::new(|| counting(5, 3));
        let p: &'static Periodic = *T;
        schedule(p).unwrap();
        assert!(scheduled(p) || runs(p) >= 3);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while runs(p) < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(runs(p), 3, "ran until it asked to stop");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(runs(p), 3, "not after");
        assert!(!scheduled(p));
        assert!(owned_thread_running());
    }
}
