//! Test-only fail points: with the `failpoints` feature, the process stops
//! (SIGSTOP) or dies (SIGKILL) itself at a named step chosen by
//! `VGPU_REGION_FAILPOINT=<step>:<stop|die>[:<nth hit>]`, or yields the CPU
//! at every hit (`<step>:yield`, to widen race windows); several plans are
//! separated by commas. Without the feature this is an empty type and
//! every step compiles to nothing.

/// Every named step, for tests and docs.
pub const STEPS: &[&str] = &[
    "create.mid_init",
    "register.before_claim",
    "reserve.before_add",
    "register.after_claim",
    "reserve.after_add",
    "reserve.before_kind",
    "release.before_total",
    "reclaim.after_mark",
    "reclaim.mid_clear",
    "reclaim.before_free",
    "unregister.after_mark",
    "copy.after_extent",
];

/// The environment variable naming the step.
pub const ENV: &str = "VGPU_REGION_FAILPOINT";

#[cfg(feature = "failpoints")]
mod imp {
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Action {
        Die,
        Stop,
        Yield,
    }

    #[derive(Debug)]
    struct Step {
        name: String,
        action: Action,
        nth: u32,
        hits: AtomicU32,
    }

    /// A parsed plan.
    #[derive(Debug, Default)]
    pub struct Plan {
        steps: Vec<Step>,
    }

    impl Plan {
        /// Reads the environment (malformed entries are ignored).
        pub fn from_env() -> Self {
            let v = std::env::var(super::ENV).unwrap_or_default();
            let steps = v
                .split(',')
                .filter_map(|e| {
                    let mut it = e.split(':');
                    let name = it.next()?.to_owned();
                    let action = match it.next()? {
                        "die" => Action::Die,
                        "stop" => Action::Stop,
                        "yield" => Action::Yield,
                        _ => return None,
                    };
                    let nth = it.next().and_then(|n| n.parse().ok()).unwrap_or(1);
                    Some(Step {
                        name,
                        action,
                        nth,
                        hits: AtomicU32::new(0),
                    })
                })
                .collect();
            Plan { steps }
        }

        /// Acts if `name` is a planned step.
        #[inline]
        pub fn hit(&self, name: &str) {
            for s in &self.steps {
                if s.name != name {
                    continue;
                }
                if s.action == Action::Yield {
                    std::thread::yield_now();
                    continue;
                }
                if s.hits.fetch_add(1, Ordering::SeqCst) + 1 != s.nth {
                    continue;
                }
                let sig = if s.action == Action::Die {
                    rustix::process::Signal::KILL
                } else {
                    rustix::process::Signal::STOP
                };
                let _ = rustix::process::kill_process(rustix::process::getpid(), sig);
            }
        }
    }
}

#[cfg(not(feature = "failpoints"))]
mod imp {
    /// Nothing planned in a normal build.
    #[derive(Debug, Default)]
    pub struct Plan;

    impl Plan {
        /// Nothing to read.
        pub fn from_env() -> Self {
            Plan
        }

        /// Nothing to do.
        #[inline(always)]
        pub fn hit(&self, _name: &str) {}
    }
}

pub use imp::Plan;
