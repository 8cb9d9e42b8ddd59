//! `vgpu-demo-tenant`: a small GPU application for the demo, the tests and
//! the wrapper benchmark. It uses the driver the way real programs do:
//! `dlopen("libcuda.so.1")` / `dlopen("libnvidia-ml.so.1")` and calls
//! through whatever `dlsym` gives it, so under `LD_PRELOAD=libvgpu.so` it
//! goes through the interposer and without it straight to the driver.
//!
//! Modes:
//! - `run` (default): init, fill device memory in chunks up to `--target`
//!   (or until refused), report both memory views, optionally hold until
//!   stdin closes, free everything.
//! - `bench`: median ns per call of cuMemAlloc_v2+cuMemFree_v2,
//!   cuLaunchKernel and cuMemGetInfo_v2; under an interposer also of the
//!   driver's own entry points (`bench.direct.*`), timed in alternating
//!   batches in the same process.
//!
//! Output: `key=value` lines, one per fact, easy to parse and to read.
use std::ffi::{c_uint, c_void, CStr, CString};
use std::io::Read;
use std::process::ExitCode;
use std::time::Instant;

use vgpu_cuda_abi::{
    nvmlDevice_t, nvmlMemory_t, sig, CUcontext, CUdevice, CUfunction, CUmodule, CUresult, CUstream,
};

type Ptr = *mut c_void;

/// `println!` that ignores a closed stdout (the reader may be gone).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

struct Lib(Ptr);

impl Lib {
    fn open(name: &CStr) -> Result<Lib, String> {
        // SAFETY: NUL-terminated name, valid flags.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            // SAFETY: dlerror returns null or a NUL-terminated string.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                "unknown error".into()
            } else {
                // SAFETY: non-null, NUL-terminated.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(format!("dlopen {}: {msg}", name.to_string_lossy()));
        }
        Ok(Lib(h))
    }

    /// The symbol as the loader gives it, typed by the caller (through
    /// [`sym!`], which names the list's type of that symbol).
    fn sym<F: Copy>(&self, name: &str) -> Result<F, String> {
        let c = CString::new(name).map_err(|_| format!("bad symbol {name:?}"))?;
        // SAFETY: valid handle and NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{name} not found"));
        }
        // SAFETY: `sym!` asks for `sig::<name>`, the C type of the symbol
        // (the list is checked against NVIDIA's headers).
        Ok(unsafe { std::mem::transmute_copy::<Ptr, F>(&p) })
    }
}

impl Lib {
    /// `name` as the library itself defines it, past any preloaded
    /// interposer, whose `dlsym` answers a driver name with its hook.
    fn own<F: Copy>(&self, name: &str) -> Result<F, String> {
        // SAFETY: a handle dlopen returned, never closed.
        let p = unsafe { vgpu_cuda_abi::elf::own_symbol(self.0, name) }?;
        // SAFETY: `own!` asks for `sig::<name>`, the C type of the symbol.
        Ok(unsafe { std::mem::transmute_copy::<Ptr, F>(&p) })
    }
}

/// The driver's own function `name` (past any interposer), typed as
/// [`sym!`] types it.
macro_rules! own {
    ($lib:expr, $name:ident) => {
        $lib.own::<sig::$name>(stringify!($name))
    };
}

/// The driver function `name` of `lib`, typed as the workspace's one list
/// (`vgpu_cuda_abi::sig`) types it.
macro_rules! sym {
    ($lib:expr, $name:ident) => {
        $lib.sym::<sig::$name>(stringify!($name))
    };
}

struct Cuda {
    init: sig::cuInit,
    device_get: sig::cuDeviceGet,
    retain: sig::cuDevicePrimaryCtxRetain,
    release: sig::cuDevicePrimaryCtxRelease_v2,
    set_current: sig::cuCtxSetCurrent,
    alloc: sig::cuMemAlloc_v2,
    free: sig::cuMemFree_v2,
    info: sig::cuMemGetInfo_v2,
    total: sig::cuDeviceTotalMem_v2,
}

impl Cuda {
    fn load(l: &Lib) -> Result<Cuda, String> {
        Ok(Cuda {
            init: sym!(l, cuInit)?,
            device_get: sym!(l, cuDeviceGet)?,
            retain: sym!(l, cuDevicePrimaryCtxRetain)?,
            release: sym!(l, cuDevicePrimaryCtxRelease_v2)?,
            set_current: sym!(l, cuCtxSetCurrent)?,
            alloc: sym!(l, cuMemAlloc_v2)?,
            free: sym!(l, cuMemFree_v2)?,
            info: sym!(l, cuMemGetInfo_v2)?,
            total: sym!(l, cuDeviceTotalMem_v2)?,
        })
    }
}

fn check(what: &str, r: CUresult) -> Result<(), String> {
    if r.is_success() {
        Ok(())
    } else {
        Err(format!("{what} failed: CUresult {}", r.0))
    }
}

struct Opts {
    mode: String,
    name: String,
    device: i32,
    chunk: u64,
    target: u64,
    hold: bool,
    iters: u32,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = t[..digits].parse().map_err(|_| format!("bad size {s:?}"))?;
    let shift = match t[digits..].trim() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(format!("bad size suffix in {s:?}")),
    };
    Ok(n << shift)
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        mode: "run".into(),
        name: "tenant".into(),
        device: 0,
        chunk: 256 << 20,
        target: u64::MAX,
        hold: false,
        iters: 20000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "run" | "bench" => o.mode = a.clone(),
            "--name" => o.name = val()?,
            "--device" => o.device = val()?.parse().map_err(|_| "bad --device".to_string())?,
            "--chunk" => o.chunk = parse_size(&val()?)?,
            "--target" => o.target = parse_size(&val()?)?,
            "--iters" => o.iters = val()?.parse().map_err(|_| "bad --iters".to_string())?,
            "--hold" => o.hold = true,
            "-h" | "--help" => {
                println!("usage: vgpu-demo-tenant [run|bench] [--name N] [--device D] [--chunk SIZE] [--target SIZE] [--hold] [--iters N]");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(o)
}

fn nvml_view(device: i32) -> Result<(u32, u64, u64, u64), String> {
    let l = Lib::open(c"libnvidia-ml.so.1")?;
    let init = sym!(l, nvmlInit_v2)?;
    let count = sym!(l, nvmlDeviceGetCount_v2)?;
    let by_index = sym!(l, nvmlDeviceGetHandleByIndex_v2)?;
    let mem = sym!(l, nvmlDeviceGetMemoryInfo)?;
    let shutdown = sym!(l, nvmlShutdown)?;
    // SAFETY: NVML's documented calls with valid out-pointers.
    unsafe {
        if init().0 != 0 {
            return Err("nvmlInit_v2 failed".into());
        }
        let mut n: c_uint = 0;
        count(&mut n);
        let mut h = nvmlDevice_t(std::ptr::null_mut());
        let r = by_index(device as c_uint, &mut h).0;
        if r != 0 {
            shutdown();
            return Err(format!(
                "nvmlDeviceGetHandleByIndex_v2({device}) failed: {r}"
            ));
        }
        let mut m = nvmlMemory_t::default();
        let r = mem(h, &mut m).0;
        shutdown();
        if r != 0 {
            return Err(format!("nvmlDeviceGetMemoryInfo failed: {r}"));
        }
        Ok((n, m.total, m.free, m.used))
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let l = Lib::open(c"libcuda.so.1")?;
    let cu = Cuda::load(&l)?;
    let p = |k: &str, v: &dyn std::fmt::Display| say!("{}.{k}={v}", o.name);
    let mut dev: CUdevice = 0;
    let mut ctx = CUcontext::NULL;
    // SAFETY: the driver's documented calls with valid out-pointers.
    unsafe {
        check("cuInit", (cu.init)(0))?;
        check("cuDeviceGet", (cu.device_get)(&mut dev, o.device))?;
        check("cuDevicePrimaryCtxRetain", (cu.retain)(&mut ctx, dev))?;
        check("cuCtxSetCurrent", (cu.set_current)(ctx))?;
    }
    let (mut free, mut total, mut dtotal) = (0usize, 0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe {
        check("cuMemGetInfo_v2", (cu.info)(&mut free, &mut total))?;
        check("cuDeviceTotalMem_v2", (cu.total)(&mut dtotal, dev))?;
    }
    p("pid", &std::process::id());
    p("device_total", &dtotal);
    p("before.free", &free);
    p("before.total", &total);
    let mut ptrs = Vec::new();
    let mut held: u64 = 0;
    let mut refused = None;
    while held < o.target {
        let n = o.chunk.min(o.target - held);
        let mut d: u64 = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { (cu.alloc)(&mut d, n as usize) };
        if !r.is_success() {
            refused = Some((n, r.0));
            break;
        }
        ptrs.push(d);
        held += n;
    }
    p("allocated", &held);
    p("allocations", &ptrs.len());
    match refused {
        Some((n, r)) => {
            p("refused.bytes", &n);
            p("refused.code", &r);
        }
        None => p("refused.bytes", &0),
    }
    // SAFETY: valid out-pointers.
    unsafe { check("cuMemGetInfo_v2", (cu.info)(&mut free, &mut total))? };
    p("after.free", &free);
    p("after.total", &total);
    match nvml_view(o.device) {
        Ok((n, t, f, u)) => {
            p("nvml.count", &n);
            p("nvml.total", &t);
            p("nvml.free", &f);
            p("nvml.used", &u);
        }
        Err(e) => p("nvml.error", &e),
    }
    if o.hold {
        say!("{}.holding=1", o.name);
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    }
    for d in ptrs {
        // SAFETY: a pointer this process allocated.
        unsafe { (cu.free)(d) };
    }
    // SAFETY: releases the retain above.
    unsafe { (cu.release)(dev) };
    p("done", &1);
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Which entry points batch `b` times, in order: the program's only, or
/// (under an interposer) both, the order alternating between batches.
fn batch_order(interposed: bool, b: u32) -> &'static [bool] {
    match (interposed, b % 2) {
        (false, _) => &[false],
        (true, 0) => &[false, true],
        (true, _) => &[true, false],
    }
}

fn bench(o: &Opts) -> Result<(), String> {
    let l = Lib::open(c"libcuda.so.1")?;
    let cu = Cuda::load(&l)?;
    let load = sym!(l, cuModuleLoadData)?;
    let getf = sym!(l, cuModuleGetFunction)?;
    let launch = sym!(l, cuLaunchKernel)?;
    let sync = sym!(l, cuCtxSynchronize)?;
    let mut dev: CUdevice = 0;
    let mut ctx = CUcontext::NULL;
    let mut module = CUmodule::NULL;
    let mut func = CUfunction::NULL;
    let image = c"vgpu-sim-module v1\nkernel spin\n";
    // SAFETY: the driver's documented calls with valid out-pointers.
    unsafe {
        check("cuInit", (cu.init)(0))?;
        check("cuDeviceGet", (cu.device_get)(&mut dev, o.device))?;
        check("cuDevicePrimaryCtxRetain", (cu.retain)(&mut ctx, dev))?;
        check("cuCtxSetCurrent", (cu.set_current)(ctx))?;
        check("cuModuleLoadData", load(&mut module, image.as_ptr().cast()))?;
        check(
            "cuModuleGetFunction",
            getf(&mut func, module, c"spin".as_ptr()),
        )?;
    }
    // The driver's own entry points: under an interposer each call is
    // also timed past it, in batches alternating with the interposed ones
    // (order alternating), so what the interposer adds is read within this
    // process and the same stretch of time.
    let own_alloc = own!(l, cuMemAlloc_v2)?;
    let interposed = own_alloc as usize != cu.alloc as usize;
    let (own_free, own_launch, own_info) = (
        own!(l, cuMemFree_v2)?,
        own!(l, cuLaunchKernel)?,
        own!(l, cuMemGetInfo_v2)?,
    );
    let batches = 15;
    let per = (o.iters / batches).max(1);
    // Median ns per call of `call(false)` (the entry points a program
    // gets) and, under an interposer, of `call(true)` (the driver's own).
    let time = |call: &mut dyn FnMut(bool)| -> (f64, Option<f64>) {
        let (mut via, mut own) = (Vec::new(), Vec::new());
        for b in 0..batches {
            for &direct in batch_order(interposed, b) {
                let t = Instant::now();
                for _ in 0..per {
                    call(direct);
                }
                let ns = t.elapsed().as_nanos() as f64 / per as f64;
                if direct {
                    own.push(ns)
                } else {
                    via.push(ns)
                }
            }
        }
        (median(via), (!own.is_empty()).then(|| median(own)))
    };
    let alloc_free = time(&mut |direct| {
        let (alloc, free) = if direct {
            (own_alloc, own_free)
        } else {
            (cu.alloc, cu.free)
        };
        let mut d = 0u64;
        // SAFETY: valid out-pointer; frees what it allocated.
        unsafe {
            alloc(&mut d, 1 << 20);
            free(d);
        }
    });
    // Launches are timed in batches well below the driver's queue depth and
    // the queue is drained between batches (untimed), so the figure is the
    // launch call itself, not waiting for a full pushbuffer.
    let mut block_ns: u64 = 0;
    let batch = 128;
    let (mut via, mut own) = (Vec::new(), Vec::new());
    for b in 0..(o.iters / batch).max(15) {
        for &direct in batch_order(interposed, b) {
            let f = if direct { own_launch } else { launch };
            let t = Instant::now();
            for _ in 0..batch {
                let mut args = [(&mut block_ns as *mut u64).cast::<c_void>()];
                // SAFETY: a valid function handle and argument array.
                unsafe {
                    f(
                        func,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        CUstream::NULL,
                        args.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
            }
            let ns = t.elapsed().as_nanos() as f64 / f64::from(batch);
            if direct {
                own.push(ns)
            } else {
                via.push(ns)
            }
            // SAFETY: waits for this context's queued work.
            unsafe { sync() };
        }
    }
    let launch_ns = (median(via), (!own.is_empty()).then(|| median(own)));
    // The same entry with a null function: the driver refuses at once, so
    // the driver's share is tiny and the wrapper's stands out.
    let launch_null_ns = time(&mut |direct| {
        let f = if direct { own_launch } else { launch };
        // SAFETY: a null function handle is refused by the driver.
        unsafe {
            f(
                CUfunction::NULL,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                CUstream::NULL,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    });
    let info_ns = time(&mut |direct| {
        let info = if direct { own_info } else { cu.info };
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        unsafe { info(&mut f, &mut t) };
    });
    for (key, (via, own)) in [
        ("alloc_free_ns", alloc_free),
        ("launch_ns", launch_ns),
        ("launch_null_ns", launch_null_ns),
        ("mem_get_info_ns", info_ns),
    ] {
        say!("bench.{key}={via:.1}");
        if let Some(own) = own {
            say!("bench.direct.{key}={own:.1}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let r = parse_args().and_then(|o| {
        if o.mode == "bench" {
            bench(&o)
        } else {
            run(&o)
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-demo-tenant: {e}");
            ExitCode::from(1)
        }
    }
}
