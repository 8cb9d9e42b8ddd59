//! The limiter's wiring over the fake drivers, a `FakeClock` and a real
//! region file (or none): no GPU, no extra process, no sleeping. Each test
//! owns its `Limiter`, `Captures` and limits source (the process-wide
//! statics stay untouched) and drives it the way the hooks do: the real
//! call is a closure over the fake, whose GPU time follows the clock.
#![allow(clippy::unwrap_used)]
use std::path::Path;

use vgpu_cuda_abi::{CUgraphExec, CUresult, CUstream};

use super::clock::{Clock, FakeClock};
use super::{job, Captures, Launch, Limiter};
use crate::attach::{self, Proc};
use crate::config::Config;
use crate::driver::fake::{FakeCuda, FakeNvml};
use crate::driver::CudaDriver;
use crate::limits_source::LimitsSource;

const MS: u64 = 1_000_000;
const SUCCESS: CUresult = CUresult::CUDA_SUCCESS;
const S: CUstream = CUstream(0x5151 as *mut std::ffi::c_void);

fn leak<T>(t: T) -> &'static T {
    Box::leak(Box::new(t))
}

/// The bucket of device `i`'s cumulative charged time, with what its pacer
/// charged at the gate and publishes at the next measurements read.
fn charged_on(lim: &Limiter, i: usize) -> u64 {
    let d = &lim.devs[i];
    d.bucket
        .raw()
        .charged_ns
        .load(std::sync::atomic::Ordering::Relaxed)
        + d.pacer.unpublished_charge_ns()
}

struct Fx {
    dir: tempfile::TempDir,
    clock: &'static FakeClock,
    cuda: &'static FakeCuda,
    nvml: &'static FakeNvml,
    lim: Limiter,
    caps: Captures,
}

/// The process's configuration in a fresh directory: `vars`, the region
/// at `<dir>/r.cache`, no operator file; `file` (if any) as the limits
/// file `LIBVGPU_LIMITS_FILE` names.
fn config(dir: &Path, vars: &[(&str, &str)], file: Option<&str>) -> Config {
    let cache = dir.join("r.cache");
    let mut all = vec![(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
        cache.display().to_string(),
    )];
    all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    if let Some(text) = file {
        let f = dir.join("limits");
        std::fs::write(&f, text).unwrap();
        all.push((
            vgpu_region::limits::PATH_ENV.to_string(),
            f.display().to_string(),
        ));
    }
    let mut c = Config::from_vars(all);
    c.limits_default = dir.join("no-etc-vgpu").join("limits");
    c
}

/// A process attached over the fake (`devices` GPUs) and its limiter.
fn fixture(devices: usize, vars: &[(&str, &str)], file: Option<&str>) -> Fx {
    fixture_with(devices, vars, file, |_, _| {})
}

fn fixture_with(
    devices: usize,
    vars: &[(&str, &str)],
    file: Option<&str>,
    before: impl FnOnce(&Path, &FakeCuda),
) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let clock = leak(FakeClock::new(1_000 * MS));
    let cuda = leak(FakeCuda::new(devices, 80 << 30).with_clock(clock));
    before(dir.path(), cuda);
    let uuids: Vec<String> = (0..devices as u32)
        .map(|i| crate::driver::ordinal_uuid(cuda, i).unwrap())
        .collect();
    let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
    let nvml = leak(FakeNvml::new(&refs, 80 << 30));
    let src = leak(LimitsSource::new());
    let p: &'static Proc =
        leak(attach::build_with(config(dir.path(), vars, file), src, true, cuda).unwrap());
    let lim = Limiter::new(p, cuda, nvml, clock);
    Fx {
        dir,
        clock,
        cuda,
        nvml,
        lim,
        caps: Captures::new(),
    }
}

impl Fx {
    /// A kernel of `ns` GPU time on `stream`, through the limiter.
    fn kernel(&self, stream: CUstream, ns: u64) -> CUresult {
        self.lim
            .launch(&self.caps, Launch::Kernel, stream, false, || {
                self.cuda.kernel(stream, ns)
            })
    }

    fn graph(&self, exec: CUgraphExec) -> CUresult {
        self.lim
            .launch(&self.caps, Launch::Graph(exec), S, false, || {
                self.cuda.graph_launch(exec, S)
            })
    }

    /// GPU time the bucket of device 0 was charged and measured (what the
    /// shared counter will show once the pacer publishes what it batched).
    fn charged(&self) -> u64 {
        charged_on(&self.lim, 0)
    }

    fn measured(&self) -> u64 {
        self.lim.devs[0]
            .bucket
            .raw()
            .measured_ns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn share(&self) -> u32 {
        self.lim.devs[0].pacer.target().share_ppm
    }
}

#[test]
fn a_burst_closes_on_a_synchronize_and_is_charged_its_measured_time() {
    let fx = fixture(1, &[("CUDA_DEVICE_SM_LIMIT", "50")], None);
    job::refresh_now(&fx.lim);
    assert_eq!(fx.share(), 500_000);
    assert!(
        !fx.lim.devs[0].local,
        "the container's bucket in the region"
    );
    // The first launch is a probe, measured alone: 2 ms of GPU time.
    assert_eq!(fx.kernel(S, 2 * MS), SUCCESS);
    fx.lim.after_sync();
    assert_eq!(fx.measured(), 0, "its end marker has not happened yet");
    fx.clock.advance(2 * MS);
    fx.lim.after_sync();
    assert_eq!(fx.measured(), 2 * MS);
    // Three launches of 3 ms: one open burst on the stream.
    for _ in 0..3 {
        assert_eq!(fx.kernel(S, 3 * MS), SUCCESS);
    }
    fx.clock.advance(9 * MS);
    fx.lim.after_sync();
    assert_eq!(fx.measured(), 2 * MS, "an open burst is not measured");
    // The application synchronizes: the burst closes before, and is
    // measured after.
    fx.lim.before_sync();
    fx.lim.after_sync();
    assert_eq!(fx.measured(), 11 * MS);
    // Charged estimates were settled to exactly the measured time.
    assert_eq!(fx.charged(), 11 * MS);
    let est = fx.lim.devs[0].pacer.kernel_estimate_ns();
    assert!(est > 2 * MS && est <= 3 * MS, "the estimate learns: {est}");
    let (m, _, _, _) = fx.lim.devs[0].slot.counters(fx.lim.devs[0].idx);
    assert_eq!(m, 11 * MS, "the slot's own counter too");
}

#[test]
fn captured_launches_are_neither_paced_nor_charged_and_capture_errors_count_right() {
    let fx = fixture(1, &[("CUDA_DEVICE_SM_LIMIT", "30")], None);
    job::refresh_now(&fx.lim);
    let caps = &fx.caps;
    fx.cuda.state().capturing.insert(S.0 as u64);
    // A begin that failed starts no capture: the driver is not asked.
    caps.begun(CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(caps.count(), 0);
    caps.begun(SUCCESS);
    assert_eq!(caps.count(), 1);
    let t0 = fx.clock.now_ns();
    for _ in 0..50 {
        assert_eq!(fx.kernel(S, 10 * MS), SUCCESS);
    }
    assert_eq!(
        fx.clock.now_ns(),
        t0,
        "500 ms of captured work did not wait"
    );
    assert_eq!(fx.charged(), 0);
    assert_eq!(
        fx.lim.devs[0]
            .markers
            .recorded
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(fx.cuda.count("cuStreamIsCapturing"), 50);
    // Another stream during the capture is paced and charged.
    let other = CUstream(0x6161 as *mut std::ffi::c_void);
    assert_eq!(fx.kernel(other, MS), SUCCESS);
    assert!(fx.charged() > 0);
    let charged = fx.charged();
    // An end on an invalid stream ends nothing; any other end does, once.
    caps.ended(CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(caps.count(), 1);
    caps.ended(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(caps.count(), 0);
    caps.ended(SUCCESS);
    assert_eq!(caps.count(), 0, "never below zero");
    // No capture in progress: the driver is not asked, the launch is charged.
    let asked = fx.cuda.count("cuStreamIsCapturing");
    fx.clock.advance(MS);
    fx.lim.after_sync();
    assert_eq!(fx.kernel(S, MS), SUCCESS);
    assert_eq!(fx.cuda.count("cuStreamIsCapturing"), asked);
    assert!(fx.charged() > charged);
}

#[test]
fn a_graph_launch_is_charged_its_own_executables_measured_cost() {
    let fx = fixture(1, &[("CUDA_DEVICE_SM_LIMIT", "50")], None);
    job::refresh_now(&fx.lim);
    let (big, small) = (
        CUgraphExec(0x9001 as *mut std::ffi::c_void),
        CUgraphExec(0x9002 as *mut std::ffi::c_void),
    );
    {
        let mut st = fx.cuda.state();
        st.exec_cost.insert(big.0 as usize, 4 * MS);
        st.exec_cost.insert(small.0 as usize, MS);
    }
    // Each is measured alone at its first launch.
    for (g, ns) in [(big, 4 * MS), (small, MS)] {
        let m = fx.measured();
        assert_eq!(fx.graph(g), SUCCESS);
        fx.clock.advance(ns);
        fx.lim.after_sync();
        assert_eq!(fx.measured() - m, ns);
    }
    // Then each launch is charged what its executable measured.
    for (g, ns) in [(big, 4 * MS), (small, MS), (big, 4 * MS)] {
        let c = fx.charged();
        assert_eq!(fx.graph(g), SUCCESS);
        assert_eq!(fx.charged() - c, ns, "charged by the executable's cost");
        fx.clock.advance(ns);
        fx.lim.after_sync();
    }
    assert_eq!(fx.measured(), 14 * MS);
}

#[test]
fn the_limits_are_reread_when_the_regions_limits_generation_bumps() {
    let fx = fixture(1, &[], Some("vgpu-limits 1\ndevice * sm=30\n"));
    job::refresh_now(&fx.lim);
    assert_eq!(fx.share(), 300_000);
    std::fs::write(
        fx.dir.path().join("limits"),
        "vgpu-limits 1\ndevice * sm=70\n",
    )
    .unwrap();
    job::refresh_now(&fx.lim);
    assert_eq!(fx.share(), 300_000, "no generation bump: not re-read");
    let led = fx.lim.p.ledger.as_ref().unwrap();
    led.region().bump_limits_generation().unwrap();
    job::refresh_now(&fx.lim);
    assert_eq!(fx.share(), 700_000);
    let shown = fx.lim.devs[0]
        .bucket
        .raw()
        .share_ppm
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(shown, 700_000, "published to the region");
}

/// Launches `n` kernels of `ns` and returns the (fake) time they took.
fn run(fx: &Fx, n: u32, ns: u64) -> u64 {
    let t0 = fx.clock.now_ns();
    for _ in 0..n {
        assert_eq!(fx.kernel(S, ns), SUCCESS);
    }
    fx.lim.before_sync();
    fx.clock.set(
        fx.clock
            .now_ns()
            .max(fx.cuda.state().stream_busy[&(S.0 as u64)]),
    );
    fx.lim.after_sync();
    fx.clock.now_ns() - t0
}

fn garbage_region(dir: &Path, _: &FakeCuda) {
    std::fs::write(dir.join("r.cache"), b"not a region").unwrap();
}

#[test]
fn a_limit_without_a_usable_region_paces_on_a_private_bucket_and_says_so() {
    let fx = fixture_with(1, &[("CUDA_DEVICE_SM_LIMIT", "30")], None, garbage_region);
    let led = fx.lim.p.ledger.as_ref().unwrap();
    assert!(led.private_cause.is_some(), "a private ledger");
    assert!(fx.lim.devs[0].local);
    let ((), lines) = crate::log::captured(|| job::refresh_now(&fx.lim));
    assert_eq!(fx.share(), 300_000);
    assert!(
        lines.iter().any(|l| l.contains("private bucket")),
        "{lines:?}"
    );
    let ((), again) = crate::log::captured(|| job::refresh_now(&fx.lim));
    assert!(
        !again.iter().any(|l| l.contains("private bucket")),
        "said once"
    );
    // Still paced: 200 ms of GPU work at 30 % takes far longer than 200 ms.
    let took = run(&fx, 40, 5 * MS);
    assert!(took >= 400 * MS, "took {} ms", took / MS);

    // The same with no ledger at all (the devices cannot be listed for
    // one: cuInit fails).
    let fx = fixture_with(1, &[("CUDA_DEVICE_SM_LIMIT", "30")], None, |d, cuda| {
        garbage_region(d, cuda);
        cuda.fail_next("cuInit", CUresult::CUDA_ERROR_NO_DEVICE);
    });
    assert!(fx.lim.p.ledger.is_none());
    assert!(fx.lim.devs[0].local);
    job::refresh_now(&fx.lim);
    assert_eq!(fx.share(), 300_000);
    let took = run(&fx, 40, 5 * MS);
    assert!(took >= 400 * MS, "took {} ms", took / MS);
}

#[test]
fn without_a_limit_nothing_waits_or_is_charged() {
    let fx = fixture(1, &[], None);
    job::refresh_now(&fx.lim);
    assert!(!fx.lim.any_paced());
    assert_eq!(run(&fx, 40, 5 * MS), 200 * MS, "only the GPU's own time");
    assert_eq!(fx.charged(), 0);
}

#[test]
fn a_launch_goes_to_the_current_contexts_device() {
    let fx = fixture(
        2,
        &[
            ("CUDA_DEVICE_SM_LIMIT_0", "50"),
            ("CUDA_DEVICE_SM_LIMIT_1", "20"),
        ],
        None,
    );
    job::refresh_now(&fx.lim);
    assert_eq!(fx.lim.devs[0].pacer.target().share_ppm, 500_000);
    assert_eq!(fx.lim.devs[1].pacer.target().share_ppm, 200_000);
    fx.cuda.set_current(1);
    assert_eq!(fx.kernel(S, MS), SUCCESS);
    let charged = |i: usize| charged_on(&fx.lim, i);
    assert_eq!(charged(0), 0);
    assert!(charged(1) > 0);
    // A device the limiter does not have passes unpaced.
    fx.cuda.set_current(7);
    let c1 = charged(1);
    assert_eq!(fx.kernel(S, MS), SUCCESS);
    assert_eq!((charged(0), charged(1)), (0, c1));
}

#[test]
fn the_sampler_corrects_the_markers_by_the_limiters_own_nvml() {
    let fx = fixture(1, &[("CUDA_DEVICE_SM_LIMIT", "50")], None);
    job::refresh_now(&fx.lim);
    let led = fx.lim.p.ledger.as_ref().unwrap();
    led.region().slot(led.slot()).set_host_pid(4242);
    // NVML says this process used 30 % of the device; its markers saw 10 ms
    // of every 100 ms window: they read a third of the truth.
    fx.nvml.samples.lock().unwrap()[0] = vec![vgpu_cuda_abi::nvmlProcessUtilizationSample_t {
        pid: 4242,
        smUtil: 30,
        ..Default::default()
    }];
    fx.nvml.gpu_util.lock().unwrap()[0] = 40;
    let d = &fx.lim.devs[0];
    for _ in 0..4 {
        d.slot.add_measured(d.idx, 10 * MS);
        fx.clock.advance(100 * MS);
        job::sample_now(&fx.lim, 100 * MS);
    }
    assert_eq!(fx.nvml.count("nvmlInit_v2"), 1, "NVML initialised once");
    assert!(fx.nvml.count("nvmlDeviceGetProcessUtilization") >= 3);
    let raw = d.bucket.raw();
    let get = |a: &std::sync::atomic::AtomicU32| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(&raw.util_ppm), 300_000, "NVML's own figure");
    assert_eq!(d.bucket.correction_ppm(), 3_000_000);
    assert_eq!(
        raw.util_at_ns.load(std::sync::atomic::Ordering::Relaxed),
        fx.clock.now_ns()
    );
}
