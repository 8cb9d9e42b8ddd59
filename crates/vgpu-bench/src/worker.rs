//! The burst worker (`vgpu-bench-worker`): a fresh process image that
//! resolves `cuInit` the way an application does, signals ready, waits for
//! the broadcast release, times `cuInit(0)` (and optionally a first context /
//! allocation), writes its result slot, then holds until the harness has
//! snapshotted the shared region.
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use crate::slots::{self, ResultTable};

/// Worker exit codes (the harness maps them to failure reasons).
pub const EXIT_OK: i32 = 0;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_CUINIT_FAILED: i32 = 3;
pub const EXIT_THEN_FAILED: i32 = 4;
pub const EXIT_NO_DRIVER: i32 = 5;
pub const EXIT_PROTOCOL: i32 = 6;

/// What to call after `cuInit` (`--then`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Then {
    None,
    /// `cuDeviceGet(0)` + `cuCtxCreate_v2`.
    Ctx,
    /// As `Ctx`, then `cuMemAlloc_v2(1 MiB)`.
    Alloc,
}

impl Then {
    pub fn as_str(self) -> &'static str {
        match self {
            Then::None => "none",
            Then::Ctx => "ctx",
            Then::Alloc => "alloc",
        }
    }
}

impl std::str::FromStr for Then {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Then::None),
            "ctx" => Ok(Then::Ctx),
            "alloc" => Ok(Then::Alloc),
            _ => Err(format!(
                "unknown --then value {s:?} (expected none, ctx or alloc)"
            )),
        }
    }
}

/// How the worker finds `cuInit` (`--resolve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolve {
    /// `dlopen(RTLD_GLOBAL)` then `dlsym(RTLD_DEFAULT)`: what a program linked
    /// with `-lcuda` gets (a preloaded library's symbol wins).
    Default,
    /// `dlsym(handle)`: what libcudart does; only an interposer that hooks
    /// `dlsym` sees this call.
    Handle,
}

impl Resolve {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolve::Default => "default",
            Resolve::Handle => "handle",
        }
    }
}

impl std::str::FromStr for Resolve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Resolve::Default),
            "handle" => Ok(Resolve::Handle),
            _ => Err(format!(
                "unknown --resolve value {s:?} (expected default or handle)"
            )),
        }
    }
}

/// Parsed worker arguments.
#[derive(Debug, PartialEq, Eq)]
pub struct WorkerArgs {
    pub table_fd: RawFd,
    pub ready_w: RawFd,
    pub release_r: RawFd,
    pub done_w: RawFd,
    pub hold_r: RawFd,
    pub index: usize,
    pub then: Then,
    pub resolve: Resolve,
    /// Test hook: abort right after the release (a worker that crashes).
    pub abort: bool,
}

impl WorkerArgs {
    /// The argument vector the harness passes.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--fds".to_string(),
            format!(
                "{},{},{},{},{}",
                self.table_fd, self.ready_w, self.release_r, self.done_w, self.hold_r
            ),
            "--index".to_string(),
            self.index.to_string(),
            "--then".to_string(),
            self.then.as_str().to_string(),
            "--resolve".to_string(),
            self.resolve.as_str().to_string(),
        ];
        if self.abort {
            v.push("--abort-after-release".to_string());
        }
        v
    }

    pub fn parse(args: &[String]) -> Result<WorkerArgs, String> {
        let mut fds: Option<Vec<RawFd>> = None;
        let mut index = None;
        let mut then = Then::None;
        let mut resolve = Resolve::Default;
        let mut abort = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--fds" => {
                    let v = val()?;
                    let parsed: Result<Vec<RawFd>, _> = v.split(',').map(str::parse).collect();
                    match parsed {
                        Ok(p) if p.len() == 5 && p.iter().all(|&f| f >= 0) => fds = Some(p),
                        _ => {
                            return Err(format!(
                                "--fds wants 5 comma-separated fd numbers, got {v:?}"
                            ))
                        }
                    }
                }
                "--index" => {
                    let v = val()?;
                    index = Some(
                        v.parse()
                            .map_err(|_| format!("--index: not a number: {v:?}"))?,
                    );
                }
                "--then" => then = val()?.parse()?,
                "--resolve" => resolve = val()?.parse()?,
                "--abort-after-release" => abort = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        let fds = fds.ok_or("missing --fds")?;
        Ok(WorkerArgs {
            table_fd: fds[0],
            ready_w: fds[1],
            release_r: fds[2],
            done_w: fds[3],
            hold_r: fds[4],
            index: index.ok_or("missing --index")?,
            then,
            resolve,
            abort,
        })
    }
}

fn take_fd(fd: RawFd) -> Result<OwnedFd, String> {
    // The harness hands each fd to exactly one worker process and this
    // function is called once per number (checked by `distinct`).
    if rustix::io::fcntl_getfd(
        // SAFETY: only used for the validity probe below, never closed here.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .is_err()
    {
        return Err(format!(
            "fd {fd} is not open (run me through `vgpu bench init`)"
        ));
    }
    // SAFETY: fd is open (checked above), was handed to this process for its
    // exclusive use by the harness, and is wrapped exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Worker entry point; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let a = match WorkerArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vgpu-bench-worker: {e}");
            eprintln!("usage: vgpu-bench-worker --fds TABLE,READY,RELEASE,DONE,HOLD --index I [--then none|ctx|alloc] [--resolve default|handle]");
            return EXIT_USAGE;
        }
    };
    let mut seen = [a.table_fd, a.ready_w, a.release_r, a.done_w, a.hold_r];
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        eprintln!("vgpu-bench-worker: --fds must be 5 distinct descriptors");
        return EXIT_USAGE;
    }
    match run_inner(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vgpu-bench-worker[{}]: {e}", a.index);
            EXIT_PROTOCOL
        }
    }
}

fn run_inner(a: &WorkerArgs) -> Result<i32, String> {
    let table = ResultTable::open(take_fd(a.table_fd)?).map_err(|e| e.to_string())?;
    let slot = table.slot(a.index).map_err(|e| e.to_string())?;
    let mut ready = std::fs::File::from(take_fd(a.ready_w)?);
    let mut release = std::fs::File::from(take_fd(a.release_r)?);
    let mut done = std::fs::File::from(take_fd(a.done_w)?);
    let mut hold = std::fs::File::from(take_fd(a.hold_r)?);
    slot.pid.store(std::process::id(), Ordering::Relaxed);

    let t0 = slots::monotonic_ns();
    let api = match ffi::Api::load(a.resolve, a.then) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("vgpu-bench-worker[{}]: {e}", a.index);
            return Ok(EXIT_NO_DRIVER);
        }
    };
    slot.resolve_ns
        .store(slots::monotonic_ns() - t0, Ordering::Relaxed);

    slot.cpu_ready_ns
        .store(slots::process_cpu_ns(), Ordering::Relaxed);
    slot.t_ready.store(slots::monotonic_ns(), Ordering::Relaxed);
    slot.state.store(slots::STATE_READY, Ordering::Release);
    ready
        .write_all(b"r")
        .map_err(|e| format!("ready pipe: {e}"))?;
    drop(ready);

    // The broadcast: the harness closes the write end; every worker sees EOF.
    let mut b = [0u8; 1];
    loop {
        match release.read(&mut b) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("release pipe: {e}")),
        }
    }
    slot.t_released
        .store(slots::monotonic_ns(), Ordering::Relaxed);
    slot.state.store(slots::STATE_RELEASED, Ordering::Release);
    drop(release);
    if a.abort {
        std::process::abort();
    }

    slot.cpu_entry_ns
        .store(slots::process_cpu_ns(), Ordering::Relaxed);
    slot.t_entry.store(slots::monotonic_ns(), Ordering::Relaxed);
    slot.state.store(slots::STATE_ENTERED, Ordering::Release);
    let r = api.cu_init();
    slot.t_init_return
        .store(slots::monotonic_ns(), Ordering::Relaxed);
    let mut then_r = 0;
    if r == 0 {
        then_r = api.then();
    }
    slot.t_return
        .store(slots::monotonic_ns(), Ordering::Relaxed);
    slot.cpu_return_ns
        .store(slots::process_cpu_ns(), Ordering::Relaxed);
    slot.init_result.store(r, Ordering::Relaxed);
    slot.then_result.store(then_r, Ordering::Relaxed);
    slot.state.store(slots::STATE_DONE, Ordering::Release);

    done.write_all(b"d")
        .map_err(|e| format!("done pipe: {e}"))?;
    drop(done);
    // Hold (slot still registered in the region) until the harness snapshots.
    let _ = hold.read(&mut b);
    Ok(if r != 0 {
        EXIT_CUINIT_FAILED
    } else if then_r != 0 {
        EXIT_THEN_FAILED
    } else {
        EXIT_OK
    })
}

mod ffi {
    //! dlopen/dlsym of the CUDA driver and the calls through its pointers.
    use std::ffi::{c_uint, c_void};

    use vgpu_cuda_abi::{sig, CUcontext, CUdevice};

    use super::{Resolve, Then};

    type CuInit = sig::cuInit;
    type CuDeviceGet = sig::cuDeviceGet;
    type CuCtxCreate = sig::cuCtxCreate_v2;
    type CuMemAlloc = sig::cuMemAlloc_v2;

    pub struct Api {
        init: CuInit,
        device_get: Option<CuDeviceGet>,
        ctx_create: Option<CuCtxCreate>,
        mem_alloc: Option<CuMemAlloc>,
        then: Then,
    }

    use crate::dl::sym;

    impl Api {
        pub fn load(resolve: Resolve, then: Then) -> Result<Api, String> {
            // RTLD_GLOBAL like an application linked with -lcuda.
            let h = crate::dl::open_global(c"libcuda.so.1")?;
            let scope = match resolve {
                Resolve::Default => None,
                Resolve::Handle => Some(h),
            };
            let init = sym(scope, c"cuInit")?;
            let (mut device_get, mut ctx_create, mut mem_alloc) = (None, None, None);
            if then != Then::None {
                device_get = Some(
                    // SAFETY: the driver exports these names with exactly
                    // these C signatures (cuda.h, CUDA 12.x ABI).
                    unsafe {
                        std::mem::transmute::<*mut c_void, CuDeviceGet>(sym(scope, c"cuDeviceGet")?)
                    },
                );
                // SAFETY: as above.
                ctx_create = Some(unsafe {
                    std::mem::transmute::<*mut c_void, CuCtxCreate>(sym(scope, c"cuCtxCreate_v2")?)
                });
                if then == Then::Alloc {
                    // SAFETY: as above.
                    mem_alloc = Some(unsafe {
                        std::mem::transmute::<*mut c_void, CuMemAlloc>(sym(
                            scope,
                            c"cuMemAlloc_v2",
                        )?)
                    });
                }
            }
            Ok(Api {
                // SAFETY: `cuInit` has the C signature CUresult(unsigned int).
                init: unsafe { std::mem::transmute::<*mut c_void, CuInit>(init) },
                device_get,
                ctx_create,
                mem_alloc,
                then,
            })
        }

        pub fn cu_init(&self) -> c_uint {
            // SAFETY: a driver entry point with the declared signature; flags 0.
            unsafe { (self.init)(0) }.0
        }

        /// The `--then` calls; the first non-zero CUresult, or 0.
        pub fn then(&self) -> c_uint {
            if self.then == Then::None {
                return 0;
            }
            let (Some(dg), Some(cc)) = (self.device_get, self.ctx_create) else {
                return 0;
            };
            let mut dev: CUdevice = 0;
            // SAFETY: valid out-pointer; ordinal 0.
            let r = unsafe { dg(&mut dev, 0) }.0;
            if r != 0 {
                return r;
            }
            let mut ctx = CUcontext::NULL;
            // SAFETY: valid out-pointer, flags 0, a device the driver returned.
            let r = unsafe { cc(&mut ctx, 0, dev) }.0;
            if r != 0 {
                return r;
            }
            if let Some(ma) = self.mem_alloc {
                let mut p: u64 = 0;
                // SAFETY: valid out-pointer; the context just created is current.
                return unsafe { ma(&mut p, 1 << 20) }.0;
            }
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip_and_reject_junk() {
        let a = WorkerArgs {
            table_fd: 3,
            ready_w: 4,
            release_r: 5,
            done_w: 6,
            hold_r: 7,
            index: 12,
            then: Then::Alloc,
            resolve: Resolve::Handle,
            abort: true,
        };
        assert_eq!(WorkerArgs::parse(&a.to_args()).unwrap(), a);
        let bad =
            |v: &[&str]| WorkerArgs::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(bad(&["--fds", "1,2,3", "--index", "0"])
            .unwrap_err()
            .contains("5 comma-separated"));
        assert!(bad(&["--fds", "1,2,3,4,5"])
            .unwrap_err()
            .contains("--index"));
        assert!(bad(&["--fds", "1,2,3,4,5", "--index", "0", "--then", "x"])
            .unwrap_err()
            .contains("--then"));
        assert!(bad(&["--bogus"]).unwrap_err().contains("--bogus"));
    }
}
