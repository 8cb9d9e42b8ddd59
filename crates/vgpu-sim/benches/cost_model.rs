//! Prints what the simulated driver's cost model comes to (no assertions):
//! cold primary-context retains of 8 concurrent processes under
//! `a100-burst`, serialized and not; the NVML snapshot; and the per-call
//! cost of the simulated driver itself under `zero`.
//!
//! `cargo bench -p vgpu-sim --bench cost_model`
use std::process::Command;
use std::time::Instant;

use vgpu_sim::{SimHandle, SimOptions};

const PROBE: &str = env!("CARGO_BIN_EXE_vgpu-sim-probe");

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn burst(name: &str, opts: SimOptions, n: usize) {
    let sim = SimHandle::start(opts).expect("sim");
    let t = Instant::now();
    let kids: Vec<_> = (0..n)
        .map(|_| {
            Command::new(PROBE)
                .args(["init", "retain", "0", "release", "0"])
                .envs(sim.env())
                .spawn()
                .expect("probe")
        })
        .collect();
    let failed = kids
        .into_iter()
        .map(|mut k| k.wait().map(|s| s.success()).unwrap_or(false))
        .filter(|ok| !ok)
        .count();
    let wall = t.elapsed();
    let mut r = sim.state().expect("state").retains();
    r.sort_by_key(|x| x.2);
    let mut d: Vec<u64> = r.iter().map(|x| x.3 - x.2).collect();
    d.sort_unstable();
    let span = r.last().map(|l| l.3).unwrap_or(0) - r.first().map(|f| f.2).unwrap_or(0);
    let overlaps = r.windows(2).filter(|w| w[0].3 > w[1].2).count();
    println!(
        "{name}: {n} processes, {failed} failed: cold retain min {:.2} / median {:.2} / max {:.2} ms; \
         first start -> last end {:.1} ms; {overlaps} overlapping neighbours; wall {:.1} ms",
        ms(d[0]),
        ms(d[d.len() / 2]),
        ms(d[d.len() - 1]),
        ms(span),
        wall.as_secs_f64() * 1e3
    );
}

fn nested(name: &str, opts: SimOptions) {
    let sim = SimHandle::start(opts).expect("sim");
    let out = Command::new(PROBE)
        .args(["init", "retain", "0", "nested", "0", "1000"])
        .envs(sim.env())
        .output()
        .expect("probe");
    let text = String::from_utf8_lossy(&out.stdout);
    let ns = text
        .lines()
        .find_map(|l| l.strip_prefix("nested_ns "))
        .unwrap_or("?");
    println!("{name}: nested primary retain (+ cuCtxSetCurrent), mean of 1000: {ns} ns");
}

fn snapshot(name: &str, opts: SimOptions) {
    let sim = SimHandle::start(opts).expect("sim");
    let out = Command::new(PROBE)
        .args(["nvml-procs", "0", "nvml-procs", "0", "nvml-procs", "0"])
        .envs(sim.env())
        .output()
        .expect("probe");
    let us: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("snapshot_us ").map(str::to_string))
        .collect();
    println!(
        "{name}: NVML compute-process snapshot (us, 3 runs): {}",
        us.join(" ")
    );
}

mod ffi {
    //! In-process calls into the simulated libcuda (per-call cost).
    use std::time::Instant;

    use libloading::Library;
    use vgpu_cuda_abi::*;

    pub fn per_call(lib_path: &std::path::Path) {
        // SAFETY: the simulated driver has no constructors.
        let lib = unsafe { Library::new(lib_path) }.expect("dlopen");
        /// The driver function `name`, typed as the workspace's one list
        /// (`vgpu_cuda_abi::sig`) types it.
        macro_rules! sym {
            ($name:ident) => {
                // SAFETY: `sig::$name` is the C type of the symbol of that
                // name (the list is checked against cuda.h).
                unsafe { lib.get::<sig::$name>(stringify!($name).as_bytes()) }
                    .expect(stringify!($name))
            };
        }
        let (init, retain, set) = (
            sym!(cuInit),
            sym!(cuDevicePrimaryCtxRetain),
            sym!(cuCtxSetCurrent),
        );
        let (alloc, free) = (sym!(cuMemAlloc_v2), sym!(cuMemFree_v2));
        let mut c = CUcontext::NULL;
        // SAFETY: plain calls with local out-pointers.
        unsafe {
            assert!(init(0).is_success());
            assert!(retain(&mut c, 0).is_success());
            assert!(set(c).is_success());
        }
        let n = 100_000;
        let t = Instant::now();
        for _ in 0..n {
            let mut p = 0;
            // SAFETY: local out-pointer; frees what it allocated.
            unsafe {
                let _ = alloc(&mut p, 1 << 20);
                let _ = free(p);
            }
        }
        println!(
            "zero: simulated cuMemAlloc_v2 + cuMemFree_v2: {:.0} ns per pair ({n} pairs, in-process)",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        let (load, getf, launch) = (
            sym!(cuModuleLoadData),
            sym!(cuModuleGetFunction),
            sym!(cuLaunchKernel),
        );
        let mut m = CUmodule::NULL;
        let mut f = CUfunction::NULL;
        // SAFETY: NUL-terminated image and name; local out-pointers.
        unsafe {
            assert!(
                load(&mut m, c"vgpu-sim-kernel name=k block_ns=0".as_ptr().cast()).is_success()
            );
            assert!(getf(&mut f, m, c"k".as_ptr()).is_success());
        }
        let t = Instant::now();
        for _ in 0..n {
            let null = std::ptr::null_mut();
            // SAFETY: a resolved function, no parameters.
            let _ = unsafe { launch(f, 1, 1, 1, 1, 1, 1, 0, CUstream::NULL, null, null) };
        }
        println!(
            "zero: simulated cuLaunchKernel (zero-time kernel): {:.0} ns per launch ({n} launches)",
            t.elapsed().as_nanos() as f64 / n as f64
        );
    }
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    burst(
        "a100-burst, serialized",
        SimOptions::profile("a100-burst").unwrap(),
        8,
    );
    let unser = "profile = \"a100-burst\"\n[cost]\nserialize_context_creation = false\n";
    burst(
        "a100-burst, not serialized",
        SimOptions::from_toml(unser).unwrap(),
        8,
    );
    burst("zero", SimOptions::default(), 8);
    nested("a100-burst", SimOptions::profile("a100-burst").unwrap());
    nested("zero", SimOptions::default());
    snapshot("a100-burst", SimOptions::profile("a100-burst").unwrap());
    snapshot("zero", SimOptions::default());
    let sim = SimHandle::start(SimOptions::default()).expect("sim");
    for (k, v) in sim.env() {
        std::env::set_var(k, v);
    }
    ffi::per_call(&vgpu_sim::locate_artifact("libvgpu_sim_cuda.so").expect("cdylib"));
}
