//! Test-only fail points: with the `failpoints` feature, the process stops
//! (SIGSTOP) or dies (SIGKILL) itself at a named step chosen by
//! `VGPU_REGION_FAILPOINT=<step>:<stop|die>[:<nth hit>]`. Without the
//! feature this is an empty type and every step compiles to nothing.

/// Every named step, for tests and docs.
pub const STEPS: &[&str] = &[
    "create.mid_init",
    "register.before_claim",
    "register.after_claim",
    "reserve.after_add",
    "reserve.before_kind",
    "release.after_kind",
    "reclaim.after_mark",
    "reclaim.mid_clear",
    "reclaim.before_free",
    "unregister.after_mark",
];

/// The environment variable naming the step.
pub const ENV: &str = "VGPU_REGION_FAILPOINT";

#[cfg(feature = "failpoints")]
mod imp {
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A parsed plan.
    #[derive(Debug, Default)]
    pub struct Plan {
        step: Option<(String, bool, u32)>,
        hits: AtomicU32,
    }

    impl Plan {
        /// Reads the environment.
        pub fn from_env() -> Self {
            let step = std::env::var(super::ENV).ok().and_then(|v| {
                let mut it = v.split(':');
                let name = it.next()?.to_owned();
                let die = match it.next()? {
                    "die" => true,
                    "stop" => false,
                    _ => return None,
                };
                let nth = it.next().and_then(|n| n.parse().ok()).unwrap_or(1);
                Some((name, die, nth))
            });
            Plan {
                step,
                hits: AtomicU32::new(0),
            }
        }

        /// Acts if `name` is the planned step.
        pub fn hit(&self, name: &str) {
            let Some((step, die, nth)) = &self.step else {
                return;
            };
            if step != name || self.hits.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
                return;
            }
            let sig = if *die {
                rustix::process::Signal::KILL
            } else {
                rustix::process::Signal::STOP
            };
            let _ = rustix::process::kill_process(rustix::process::getpid(), sig);
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
