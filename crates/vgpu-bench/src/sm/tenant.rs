//! One SM-bench tenant (`vgpu-bench-sm-tenant`): a fresh process that
//! opens the driver (through libvgpu.so when the harness preloads it),
//! waits for the common start time, launches its way for the run's length,
//! and prints one JSON line of what it did. A failed call ends it with a
//! non-zero status and the call named, so the harness counts it.

use std::time::Duration;

use super::ffi::Cuda;

/// How a tenant launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `cuLaunchKernel` flat out (a full queue blocks the call).
    Async,
    /// `cuLaunchKernel` then `cuStreamSynchronize`, again and again.
    Sync,
    /// `cuGraphLaunch` of a chain of kernels, flat out.
    Graph,
    /// `cuLaunchCooperativeKernel` flat out.
    Coop,
    /// Zero-length kernels in batches, each launch call timed (the
    /// per-launch overhead, not a share).
    Overhead,
}

impl Mode {
    /// Its name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Async => "async",
            Mode::Sync => "sync",
            Mode::Graph => "graph",
            Mode::Coop => "coop",
            Mode::Overhead => "overhead",
        }
    }

    /// From the command line.
    pub fn parse(s: &str) -> Option<Mode> {
        [
            Mode::Async,
            Mode::Sync,
            Mode::Graph,
            Mode::Coop,
            Mode::Overhead,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

/// What a tenant was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantArgs {
    /// How to launch.
    pub mode: Mode,
    /// Length of one kernel (a graph: of each node), GPU-ns.
    pub kernel_ns: u64,
    /// CLOCK_MONOTONIC ns to start at.
    pub start_at_ns: u64,
    /// How long to launch.
    pub run_ns: u64,
    /// Kernels per graph.
    pub nodes: u32,
    /// Idle (no launch) from this many ns after the start… (0 with
    /// `idle_until_ns` 0: never idle).
    pub idle_from_ns: u64,
    /// …until this many ns after the start.
    pub idle_until_ns: u64,
}

impl TenantArgs {
    /// The argument vector.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--mode".into(),
            self.mode.as_str().into(),
            "--kernel-ns".into(),
            self.kernel_ns.to_string(),
            "--start-at".into(),
            self.start_at_ns.to_string(),
            "--run-ns".into(),
            self.run_ns.to_string(),
            "--nodes".into(),
            self.nodes.to_string(),
            "--idle-from-ns".into(),
            self.idle_from_ns.to_string(),
            "--idle-until-ns".into(),
            self.idle_until_ns.to_string(),
        ]
    }

    /// Parses `to_args`' form.
    pub fn parse(args: &[String]) -> Result<TenantArgs, String> {
        let mut a = TenantArgs {
            mode: Mode::Async,
            kernel_ns: 40_000,
            start_at_ns: 0,
            run_ns: 1_000_000_000,
            nodes: 8,
            idle_from_ns: 0,
            idle_until_ns: 0,
        };
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{k}: not a number: {v:?}"))
            };
            match k.as_str() {
                "--mode" => {
                    a.mode = Mode::parse(v).ok_or_else(|| format!("--mode: unknown {v:?}"))?
                }
                "--kernel-ns" => a.kernel_ns = num(v)?,
                "--start-at" => a.start_at_ns = num(v)?,
                "--run-ns" => a.run_ns = num(v)?,
                "--nodes" => a.nodes = num(v)?.clamp(1, 1024) as u32,
                "--idle-from-ns" => a.idle_from_ns = num(v)?,
                "--idle-until-ns" => a.idle_until_ns = num(v)?,
                _ => return Err(format!("unknown argument {k}")),
            }
        }
        Ok(a)
    }
}

/// What a tenant reports (one JSON line on stdout).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TenantReport {
    /// Its PID (the host PID: the harness runs it in its own namespace).
    pub pid: u32,
    /// The device's SM count.
    pub sms: u32,
    /// The device is vgpu-sim's.
    pub simulated: bool,
    /// Launch calls that succeeded (a graph launch counts once).
    pub launches: u64,
    /// Blocks per launch.
    pub blocks: u32,
    /// Per-block time passed, GPU-ns.
    pub block_ns: u64,
    /// Median time inside one launch call, ns (overhead mode; else 0).
    pub launch_ns_p50: f64,
    /// Mean time inside one launch call, ns.
    pub launch_ns_mean: f64,
    /// Launch calls timed.
    pub timed: u64,
    /// Median time inside the driver's own `cuLaunchKernel`, past the
    /// interposer, in the same process (overhead mode under an interposer;
    /// else none).
    #[serde(default)]
    pub direct_ns_p50: Option<f64>,
}

fn now_ns() -> u64 {
    crate::slots::monotonic_ns()
}

fn fail(what: &str, r: u32) -> Result<(), String> {
    Err(format!("{what} failed with CUresult {r}"))
}

/// The tenant's body; `Err` names the call that failed.
pub fn run(a: &TenantArgs) -> Result<TenantReport, String> {
    let mut cu = Cuda::open()?;
    // A fixed grid of 1024 blocks runs in ceil(1024 / SMs) waves on the
    // simulator; a real GPU holds SM-count blocks of 128 threads in one
    // wave. Cooperative grids must fit at once: one block per SM.
    let blocks = if cu.simulated && a.mode != Mode::Coop {
        1024
    } else {
        cu.sms
    };
    let waves = if cu.simulated {
        (blocks as u64).div_ceil(cu.sms as u64)
    } else {
        1
    };
    let block_ns = if a.mode == Mode::Overhead {
        0
    } else {
        (a.kernel_ns / waves).max(1)
    };
    cu.set_block_ns(block_ns);
    if a.mode == Mode::Graph {
        cu.build_graph(a.nodes, blocks)?;
    }
    let mut rep = TenantReport {
        pid: std::process::id(),
        sms: cu.sms,
        simulated: cu.simulated,
        blocks,
        block_ns,
        ..TenantReport::default()
    };
    let now = now_ns();
    if a.start_at_ns > now {
        std::thread::sleep(Duration::from_nanos(a.start_at_ns - now));
    }
    let t0 = a.start_at_ns.max(now);
    let end = t0 + a.run_ns;
    let idle = (t0 + a.idle_from_ns, t0 + a.idle_until_ns);
    let mut times: Vec<u64> = Vec::new();
    let mut direct_times: Vec<u64> = Vec::new();
    while now_ns() < end {
        let n = now_ns();
        if n >= idle.0 && n < idle.1 {
            // An idle spell: nothing launched, what was queued drains.
            std::thread::sleep(Duration::from_nanos((idle.1 - n).min(1_000_000)));
            continue;
        }
        match a.mode {
            Mode::Async => {
                let r = cu.launch(blocks);
                if r != 0 {
                    fail("cuLaunchKernel", r)?;
                }
            }
            Mode::Sync => {
                let r = cu.launch(blocks);
                if r != 0 {
                    fail("cuLaunchKernel", r)?;
                }
                let r = cu.stream_sync();
                if r != 0 {
                    fail("cuStreamSynchronize", r)?;
                }
            }
            Mode::Graph => {
                let r = cu.graph_launch();
                if r != 0 {
                    fail("cuGraphLaunch", r)?;
                }
            }
            Mode::Coop => {
                let r = cu.launch_cooperative(blocks);
                if r != 0 {
                    fail("cuLaunchCooperativeKernel", r)?;
                }
            }
            Mode::Overhead => {
                // Batches well below the queue depth, so no call blocks on
                // a full queue: what is timed is the call itself. Under an
                // interposer, batches through the driver's own entry point
                // alternate with them (in alternating order), so what the
                // interposer adds is also read within one process and one
                // stretch of time.
                let order: &[bool] = match (cu.interposed(), rep.launches % 512 == 256) {
                    (false, _) => &[false],
                    (true, false) => &[false, true],
                    (true, true) => &[true, false],
                };
                for &direct in order {
                    for _ in 0..256 {
                        let t0 = now_ns();
                        let r = if direct {
                            cu.launch_direct(1)
                        } else {
                            cu.launch(1)
                        };
                        let t1 = now_ns();
                        if r != 0 {
                            fail("cuLaunchKernel", r)?;
                        }
                        if direct {
                            direct_times.push(t1 - t0);
                        } else {
                            times.push(t1 - t0);
                            rep.launches += 1;
                        }
                    }
                    let r = cu.ctx_sync();
                    if r != 0 {
                        fail("cuCtxSynchronize", r)?;
                    }
                }
                continue;
            }
        }
        rep.launches += 1;
    }
    if a.mode != Mode::Overhead {
        let r = cu.ctx_sync();
        if r != 0 {
            fail("cuCtxSynchronize", r)?;
        }
    }
    if !times.is_empty() {
        rep.timed = times.len() as u64;
        rep.launch_ns_mean = times.iter().sum::<u64>() as f64 / times.len() as f64;
        times.sort_unstable();
        rep.launch_ns_p50 = times[times.len() / 2] as f64;
    }
    if !direct_times.is_empty() {
        direct_times.sort_unstable();
        rep.direct_ns_p50 = Some(direct_times[direct_times.len() / 2] as f64);
    }
    Ok(rep)
}

/// `vgpu-bench-sm-tenant`'s main: exit 0 with the report on stdout, 2 for
/// bad arguments, 3 when a driver call failed (named on stderr).
pub fn main(args: &[String]) -> i32 {
    let a = match TenantArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vgpu-bench-sm-tenant: {e}");
            return 2;
        }
    };
    match run(&a) {
        Ok(rep) => match serde_json::to_string(&rep) {
            Ok(line) => {
                println!("{line}");
                0
            }
            Err(e) => {
                eprintln!("vgpu-bench-sm-tenant: {e}");
                3
            }
        },
        Err(e) => {
            eprintln!("vgpu-bench-sm-tenant[{}]: {e}", std::process::id());
            3
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip_and_junk_is_refused() {
        let a = TenantArgs {
            mode: Mode::Graph,
            kernel_ns: 12_000_000,
            start_at_ns: 5,
            run_ns: 7,
            nodes: 3,
            idle_from_ns: 11,
            idle_until_ns: 13,
        };
        assert_eq!(TenantArgs::parse(&a.to_args()).unwrap(), a);
        let bad =
            |v: &[&str]| TenantArgs::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(bad(&["--mode", "fast"]).unwrap_err().contains("--mode"));
        assert!(bad(&["--kernel-ns", "x"])
            .unwrap_err()
            .contains("not a number"));
        assert!(bad(&["--bogus", "1"]).unwrap_err().contains("--bogus"));
        assert!(bad(&["--mode"]).unwrap_err().contains("needs a value"));
    }
}
