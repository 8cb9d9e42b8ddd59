//! `vgpu-sim-probe`: a tiny client of the simulated driver for tests. It
//! loads `libcuda.so.1` / `libnvidia-ml.so.1` with dlopen (found through
//! `LD_LIBRARY_PATH`, as `SimHandle::env()` sets it) and runs its arguments
//! as a script of steps, printing one line per observation:
//!
//! ```text
//! init                      cuInit(0)
//! retain D | release D      primary context of device D (retain makes it current)
//! ctx D                     cuCtxCreate_v2 on device D
//! alloc MIB                 cuMemAlloc_v2 (prints `alloc ok` / `alloc err CODE`)
//! alloc-bytes N|max         cuMemAlloc_v2 of N bytes (`max`: SIZE_MAX); same output
//! ipc-export MIB            allocate and export: `ipc <handle bytes 8..32 as hex>`
//! alloc-async MIB           cuMemAllocAsync on the legacy stream (same output)
//! launch BLOCK_US GRID MS   back-to-back launches for MS ms, then synchronize
//! pid                       print `pid <getpid()>` (the pid in this namespace)
//! ready                     print `ready`
//! wait                      block until a line (or EOF) arrives on stdin
//! sleep MS
//! nvml-procs D              print `proc <pid> <bytes>` per compute process
//! nvml-util D               print `util <gpu%>` and `putil <pid> <sm%>` lines
//! nested D N                time N nested primary retains (+ releases): `nested_ns <avg>`
//! bogus                     call entries with made-up handles: `bogus <entry> <code>`
//! devices                   `cuda.count N`, `cuda.<i>.uuid GPU-…` per CUDA ordinal
//! nvml-devices              `nvml.count N`, `nvml.<i>.uuid GPU-…` per NVML index
//! pool-create D             cuMemPoolCreate on device D; it becomes "the pool"
//! pool-create-max D MIB     the same with CUmemPoolProps::maxSize
//! pool-create-host          cuMemPoolCreate on host NUMA node 0
//! pool-current D            cuDeviceGetMemPool(D) becomes "the pool"
//! pool-threshold MIB|max    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD of the pool
//! pool-alloc MIB            cuMemAllocFromPoolAsync (legacy stream); `alloc ok|err CODE`
//! free-async                cuMemFreeAsync of the newest pool allocation
//! sync                      cuCtxSynchronize
//! pool-trim MIB             cuMemPoolTrimTo(pool, MIB)
//! pool-attr                 `pool reserved R used U reserved_high RH used_high UH` (bytes)
//! pool-destroy              cuMemPoolDestroy: `pool-destroy CODE`
//! mem-info                  cuMemGetInfo_v2: `mem free F total T`
//! ```
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod ffi {
    //! The dlopen'd C entry points.
    use std::ffi::{c_char, c_int, c_uint, c_void};

    use libloading::{Library, Symbol};
    use vgpu_cuda_abi::*;

    /// The driver function `name` of `lib` (a [`Cuda`] or [`Nvml`]), typed
    /// as the workspace's one list (`vgpu_cuda_abi::sig`) types it.
    macro_rules! sym {
        ($lib:expr, $name:ident) => {
            $lib.sym::<sig::$name>(stringify!($name).as_bytes())
        };
    }

    pub struct Cuda {
        lib: Library,
    }

    pub struct Nvml {
        lib: Library,
    }

    pub type Res<T> = Result<T, String>;

    fn check(r: CUresult, what: &str) -> Res<()> {
        if r.is_success() {
            Ok(())
        } else {
            Err(format!("{what}: {r:?}"))
        }
    }

    impl Cuda {
        pub fn load() -> Res<Cuda> {
            // SAFETY: loading the simulated driver runs no constructors that
            // depend on our state (it has none).
            let lib = unsafe { Library::new("libcuda.so.1") }
                .map_err(|e| format!("dlopen libcuda.so.1: {e}"))?;
            Ok(Cuda { lib })
        }

        fn sym<T>(&self, name: &[u8]) -> Res<Symbol<'_, T>> {
            // SAFETY: every caller is `sym!`, which asks for `sig::<name>`,
            // the list's C type of that cuda.h entry.
            unsafe { self.lib.get::<T>(name) }.map_err(|e| format!("dlsym: {e}"))
        }

        pub fn init(&self) -> Res<()> {
            let f = sym!(self, cuInit)?;
            // SAFETY: cuInit(unsigned int) per cuda.h.
            check(unsafe { f(0) }, "cuInit")
        }

        pub fn retain(&self, dev: c_int) -> Res<CUcontext> {
            let f = sym!(self, cuDevicePrimaryCtxRetain)?;
            let set = sym!(self, cuCtxSetCurrent)?;
            let mut c = CUcontext::NULL;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { f(&mut c, dev) }, "cuDevicePrimaryCtxRetain")?;
            // SAFETY: a context the driver just gave us.
            check(unsafe { set(c) }, "cuCtxSetCurrent")?;
            Ok(c)
        }

        pub fn release(&self, dev: c_int) -> Res<()> {
            let f = sym!(self, cuDevicePrimaryCtxRelease_v2)?;
            // SAFETY: signature per cuda.h.
            check(unsafe { f(dev) }, "cuDevicePrimaryCtxRelease_v2")
        }

        pub fn ctx_create(&self, dev: c_int) -> Res<()> {
            let f = sym!(self, cuCtxCreate_v2)?;
            let mut c = CUcontext::NULL;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { f(&mut c, 0, dev) }, "cuCtxCreate_v2")
        }

        pub fn alloc(&self, bytes: usize) -> Res<CUresult> {
            let f = sym!(self, cuMemAlloc_v2)?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            Ok(unsafe { f(&mut p, bytes) })
        }

        /// cuMemAlloc_v2 + cuIpcGetMemHandle: the handle's 64 bytes.
        pub fn ipc_export(&self, bytes: usize) -> Res<[u8; 64]> {
            let alloc = sym!(self, cuMemAlloc_v2)?;
            let get = sym!(self, cuIpcGetMemHandle)?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { alloc(&mut p, bytes) }, "cuMemAlloc_v2")?;
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { get(&mut h, p) }, "cuIpcGetMemHandle")?;
            Ok(h.reserved)
        }

        pub fn alloc_async(&self, bytes: usize) -> Res<CUresult> {
            let f = sym!(self, cuMemAllocAsync)?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; the legacy stream; per cuda.h.
            Ok(unsafe { f(&mut p, bytes, CUstream::NULL) })
        }

        /// Launch back-to-back for `ms`; returns the launch count.
        pub fn launch_for(&self, block_us: u64, grid: u32, ms: u64) -> Res<u64> {
            let load = sym!(self, cuModuleLoadData)?;
            let getf = sym!(self, cuModuleGetFunction)?;
            let launch = sym!(self, cuLaunchKernel)?;
            let sync = sym!(self, cuCtxSynchronize)?;
            let image = format!("vgpu-sim-kernel name=busy block_us={block_us}\0");
            let mut m = CUmodule::NULL;
            // SAFETY: NUL-terminated text image; out-pointer to a local.
            let r = unsafe { load(&mut m, image.as_ptr().cast()) };
            check(r, "cuModuleLoadData")?;
            let mut f = CUfunction::NULL;
            // SAFETY: a module we loaded; NUL-terminated name; local out-pointer.
            let r = unsafe { getf(&mut f, m, c"busy".as_ptr()) };
            check(r, "cuModuleGetFunction")?;
            let start = std::time::Instant::now();
            let mut n = 0;
            while start.elapsed().as_millis() < u128::from(ms) {
                let null = std::ptr::null_mut();
                // SAFETY: a function we resolved; no kernel parameters.
                let r = unsafe { launch(f, grid, 1, 1, 1, 1, 1, 0, CUstream::NULL, null, null) };
                check(r, "cuLaunchKernel")?;
                n += 1;
            }
            // SAFETY: no arguments.
            check(unsafe { sync() }, "cuCtxSynchronize")?;
            Ok(n)
        }
    }

    /// A CUDA UUID in NVML's text form (`GPU-8-4-4-4-12` hex digits).
    pub fn uuid_text(b: &[u8; 16]) -> String {
        let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            h[..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..].concat()
        )
    }

    impl Cuda {
        /// `cuDeviceGetCount` and each ordinal's `cuDeviceGetUuid_v2`.
        pub fn devices(&self) -> Res<Vec<[u8; 16]>> {
            let count = sym!(self, cuDeviceGetCount)?;
            let get = sym!(self, cuDeviceGet)?;
            let uuid = sym!(self, cuDeviceGetUuid_v2)?;
            let mut n: c_int = 0;
            // SAFETY: local out-pointer; signature per cuda.h.
            check(unsafe { count(&mut n) }, "cuDeviceGetCount")?;
            let mut out = Vec::new();
            for i in 0..n {
                let mut d: CUdevice = 0;
                // SAFETY: local out-pointer; signature per cuda.h.
                check(unsafe { get(&mut d, i) }, "cuDeviceGet")?;
                let mut u = CUuuid { bytes: [0; 16] };
                // SAFETY: local out-pointer; signature per cuda.h.
                check(unsafe { uuid(&mut u, d) }, "cuDeviceGetUuid_v2")?;
                out.push(u.bytes.map(|b| b as u8));
            }
            Ok(out)
        }

        pub fn pool_create(&self, dev: c_int) -> Res<CUmemoryPool> {
            self.pool_create_at(CU_MEM_LOCATION_TYPE_DEVICE, dev, 0)
        }

        pub fn pool_create_at(&self, loc: c_uint, id: c_int, max: usize) -> Res<CUmemoryPool> {
            let f = sym!(self, cuMemPoolCreate)?;
            let props = CUmemPoolProps {
                allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
                handleTypes: 0,
                location: CUmemLocation { type_: loc, id },
                win32SecurityAttributes: std::ptr::null_mut(),
                maxSize: max,
                usage: 0,
                reserved: [0; 54],
            };
            let mut pool = CUmemoryPool::NULL;
            // SAFETY: local in/out structs; signature per cuda.h.
            check(unsafe { f(&mut pool, &props) }, "cuMemPoolCreate")?;
            Ok(pool)
        }

        pub fn pool_current(&self, dev: c_int) -> Res<CUmemoryPool> {
            let f = sym!(self, cuDeviceGetMemPool)?;
            let mut pool = CUmemoryPool::NULL;
            // SAFETY: local out-pointer; signature per cuda.h.
            check(unsafe { f(&mut pool, dev) }, "cuDeviceGetMemPool")?;
            Ok(pool)
        }

        pub fn pool_set_u64(&self, pool: CUmemoryPool, attr: c_uint, v: u64) -> Res<()> {
            let f = sym!(self, cuMemPoolSetAttribute)?;
            let mut v = v;
            // SAFETY: a u64 attribute (cuuint64_t per cuda.h) through a local.
            let r = unsafe { f(pool, attr, (&raw mut v).cast()) };
            check(r, "cuMemPoolSetAttribute")
        }

        pub fn pool_get_u64(&self, pool: CUmemoryPool, attr: c_uint) -> Res<u64> {
            let f = sym!(self, cuMemPoolGetAttribute)?;
            let mut v: u64 = 0;
            // SAFETY: a u64 attribute (cuuint64_t per cuda.h) into a local.
            let r = unsafe { f(pool, attr, (&raw mut v).cast()) };
            check(r, "cuMemPoolGetAttribute")?;
            Ok(v)
        }

        pub fn pool_alloc(&self, pool: CUmemoryPool, bytes: usize) -> Res<(CUresult, CUdeviceptr)> {
            let f = sym!(self, cuMemAllocFromPoolAsync)?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: local out-pointer; the legacy stream; per cuda.h.
            let r = unsafe { f(&mut p, bytes, pool, CUstream::NULL) };
            Ok((r, p))
        }

        pub fn free_async(&self, p: CUdeviceptr) -> Res<()> {
            let f = sym!(self, cuMemFreeAsync)?;
            // SAFETY: a pointer this process allocated; the legacy stream.
            check(unsafe { f(p, CUstream::NULL) }, "cuMemFreeAsync")
        }

        pub fn sync(&self) -> Res<()> {
            let f = sym!(self, cuCtxSynchronize)?;
            // SAFETY: no arguments.
            check(unsafe { f() }, "cuCtxSynchronize")
        }

        pub fn pool_trim(&self, pool: CUmemoryPool, keep: usize) -> Res<()> {
            let f = sym!(self, cuMemPoolTrimTo)?;
            // SAFETY: a pool handle from the driver; signature per cuda.h.
            check(unsafe { f(pool, keep) }, "cuMemPoolTrimTo")
        }

        pub fn pool_destroy(&self, pool: CUmemoryPool) -> Res<CUresult> {
            let f = sym!(self, cuMemPoolDestroy)?;
            // SAFETY: a pool handle from the driver; signature per cuda.h.
            Ok(unsafe { f(pool) })
        }

        pub fn mem_info(&self) -> Res<(usize, usize)> {
            let f = sym!(self, cuMemGetInfo_v2)?;
            let (mut fr, mut t) = (0, 0);
            // SAFETY: local out-pointers; signature per cuda.h.
            check(unsafe { f(&mut fr, &mut t) }, "cuMemGetInfo_v2")?;
            Ok((fr, t))
        }

        /// Every handle-taking entry called once with a handle the driver
        /// never gave: (entry, CUresult).
        pub fn bogus(&self) -> Res<Vec<(&'static str, u32)>> {
            const JUNK: *mut c_void = 0xdead_beef_usize as *mut c_void;
            macro_rules! call {
                ($name:ident($($arg:expr),*)) => {{
                    let f = sym!(self, $name)?;
                    // SAFETY: the entry's own C type; a driver must refuse
                    // a handle it never gave (checked by the caller).
                    (stringify!($name), unsafe { f($($arg),*) }.0)
                }};
            }
            Ok(vec![
                call!(cuCtxSetCurrent(CUcontext(JUNK))),
                call!(cuCtxDestroy_v2(CUcontext(JUNK))),
                call!(cuMemFree_v2(0x1234)),
                call!(cuMemRelease(12345)),
                call!(cuStreamSynchronize(CUstream(JUNK))),
                call!(cuStreamDestroy_v2(CUstream(JUNK))),
                call!(cuEventRecord(CUevent(JUNK), CUstream::NULL)),
                call!(cuEventDestroy_v2(CUevent(JUNK))),
                call!(cuModuleUnload(CUmodule(JUNK))),
                call!(cuArrayDestroy(CUarray(JUNK))),
                call!(cuMipmappedArrayDestroy(CUmipmappedArray(JUNK))),
                call!(cuGraphLaunch(CUgraphExec(JUNK), CUstream::NULL)),
                call!(cuGraphExecDestroy(CUgraphExec(JUNK))),
                call!(cuGraphDestroy(CUgraph(JUNK))),
            ])
        }
    }

    impl Nvml {
        /// `nvmlDeviceGetName` on a made-up handle.
        pub fn bogus_name(&self) -> Res<u32> {
            let f = sym!(self, nvmlDeviceGetName)?;
            let mut buf = [0 as c_char; 96];
            // SAFETY: `buf` holds 96 bytes; the handle is deliberately bogus
            // and must be rejected, not dereferenced.
            let r = unsafe {
                f(
                    nvmlDevice_t(0xdead_beef as *mut c_void),
                    buf.as_mut_ptr(),
                    96,
                )
            };
            Ok(r.0)
        }
    }

    fn nv(r: nvmlReturn_t, what: &str) -> Res<()> {
        if r.is_success() {
            Ok(())
        } else {
            Err(format!("{what}: {r:?}"))
        }
    }

    impl Nvml {
        pub fn load() -> Res<Nvml> {
            // SAFETY: as for libcuda: no constructors that matter.
            let lib = unsafe { Library::new("libnvidia-ml.so.1") }
                .map_err(|e| format!("dlopen libnvidia-ml.so.1: {e}"))?;
            let n = Nvml { lib };
            let init = sym!(n, nvmlInit_v2)?;
            // SAFETY: nvmlInit_v2(void) per nvml.h.
            nv(unsafe { init() }, "nvmlInit_v2")?;
            Ok(n)
        }

        fn sym<T>(&self, name: &[u8]) -> Res<Symbol<'_, T>> {
            // SAFETY: every caller is `sym!`, which asks for `sig::<name>`,
            // the list's C type of that nvml.h entry.
            unsafe { self.lib.get::<T>(name) }.map_err(|e| format!("dlsym: {e}"))
        }

        fn device(&self, i: u32) -> Res<nvmlDevice_t> {
            let f = sym!(self, nvmlDeviceGetHandleByIndex_v2)?;
            let mut h = nvmlDevice_t(std::ptr::null_mut());
            // SAFETY: local out-pointer; signature per nvml.h.
            nv(unsafe { f(i, &mut h) }, "nvmlDeviceGetHandleByIndex_v2")?;
            Ok(h)
        }

        pub fn procs(&self, dev: u32) -> Res<Vec<(u32, u64)>> {
            let h = self.device(dev)?;
            let f = sym!(self, nvmlDeviceGetComputeRunningProcesses_v3)?;
            let mut buf = vec![nvmlProcessInfo_t::default(); 256];
            let mut n = buf.len() as c_uint;
            // SAFETY: `buf` holds `n` elements; signature per nvml.h.
            let r = unsafe { f(h, &mut n, buf.as_mut_ptr()) };
            nv(r, "nvmlDeviceGetComputeRunningProcesses_v3")?;
            Ok(buf[..n as usize]
                .iter()
                .map(|p| (p.pid, p.usedGpuMemory))
                .collect())
        }

        /// `nvmlDeviceGetCount_v2` and each index's `nvmlDeviceGetUUID`.
        pub fn devices(&self) -> Res<Vec<String>> {
            let count = sym!(self, nvmlDeviceGetCount_v2)?;
            let uuid = sym!(self, nvmlDeviceGetUUID)?;
            let mut n: c_uint = 0;
            // SAFETY: local out-pointer; signature per nvml.h.
            nv(unsafe { count(&mut n) }, "nvmlDeviceGetCount_v2")?;
            let mut out = Vec::new();
            for i in 0..n {
                let h = self.device(i)?;
                let mut buf = [0 as c_char; 96];
                // SAFETY: `buf` holds 96 bytes; signature per nvml.h.
                let r = unsafe { uuid(h, buf.as_mut_ptr(), 96) };
                nv(r, "nvmlDeviceGetUUID")?;
                // SAFETY: NVML wrote a NUL-terminated string into `buf`
                // (zeroed, so a terminator exists either way).
                let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
                out.push(s.to_string_lossy().into_owned());
            }
            Ok(out)
        }

        pub fn util(&self, dev: u32) -> Res<(u32, Vec<(u32, u32)>)> {
            let h = self.device(dev)?;
            let f = sym!(self, nvmlDeviceGetUtilizationRates)?;
            let mut u = nvmlUtilization_t::default();
            // SAFETY: local out-pointer; signature per nvml.h.
            nv(unsafe { f(h, &mut u) }, "nvmlDeviceGetUtilizationRates")?;
            let p = sym!(self, nvmlDeviceGetProcessUtilization)?;
            let mut buf = vec![nvmlProcessUtilizationSample_t::default(); 256];
            let mut n = buf.len() as c_uint;
            // SAFETY: `buf` holds `n` elements; signature per nvml.h.
            let r = unsafe { p(h, buf.as_mut_ptr(), &mut n, 0) };
            if r == nvmlReturn_t::NVML_ERROR_NOT_FOUND {
                n = 0;
            } else {
                nv(r, "nvmlDeviceGetProcessUtilization")?;
            }
            Ok((
                u.gpu,
                buf[..n as usize]
                    .iter()
                    .map(|s| (s.pid, s.smUtil))
                    .collect(),
            ))
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            eprintln!("vgpu-sim-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn num<T: std::str::FromStr>(a: Option<String>, what: &str) -> Result<T, String> {
    a.as_deref()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{what}: expected a number"))
}

fn run() -> Result<(), String> {
    let mut cuda = None;
    let mut nvml = None;
    let mut pool: Option<vgpu_cuda_abi::CUmemoryPool> = None;
    let mut ptrs: Vec<vgpu_cuda_abi::CUdeviceptr> = Vec::new();
    let mut args = std::env::args().skip(1);
    let out = std::io::stdout();
    while let Some(step) = args.next() {
        let cu = |c: &mut Option<ffi::Cuda>| -> Result<(), String> {
            if c.is_none() {
                *c = Some(ffi::Cuda::load()?);
            }
            Ok(())
        };
        match step.as_str() {
            "init" => {
                cu(&mut cuda)?;
                cuda.as_ref().expect("loaded").init()?;
            }
            "retain" => {
                let d = num(args.next(), "retain D")?;
                cuda.as_ref().ok_or("init first")?.retain(d)?;
            }
            "release" => {
                let d = num(args.next(), "release D")?;
                cuda.as_ref().ok_or("init first")?.release(d)?;
            }
            "ctx" => {
                let d = num(args.next(), "ctx D")?;
                cuda.as_ref().ok_or("init first")?.ctx_create(d)?;
            }
            "alloc" => {
                let mib: usize = num(args.next(), "alloc MIB")?;
                let r = cuda.as_ref().ok_or("init first")?.alloc(mib << 20)?;
                if r.is_success() {
                    println!("alloc ok");
                } else {
                    println!("alloc err {}", r.0);
                }
            }
            "alloc-bytes" => {
                let n = match args.next().as_deref() {
                    Some("max") => usize::MAX,
                    other => num(other.map(str::to_string), "alloc-bytes N|max")?,
                };
                let r = cuda.as_ref().ok_or("init first")?.alloc(n)?;
                if r.is_success() {
                    println!("alloc ok");
                } else {
                    println!("alloc err {}", r.0);
                }
            }
            "ipc-export" => {
                let mib: usize = num(args.next(), "ipc-export MIB")?;
                let h = cuda.as_ref().ok_or("init first")?.ipc_export(mib << 20)?;
                let hex: String = h[8..32].iter().map(|b| format!("{b:02x}")).collect();
                println!("ipc {hex}");
            }
            "alloc-async" => {
                let mib: usize = num(args.next(), "alloc-async MIB")?;
                let r = cuda.as_ref().ok_or("init first")?.alloc_async(mib << 20)?;
                if r.is_success() {
                    println!("alloc ok");
                } else {
                    println!("alloc err {}", r.0);
                }
            }
            "launch" => {
                let us = num(args.next(), "launch BLOCK_US")?;
                let grid = num(args.next(), "launch GRID")?;
                let ms = num(args.next(), "launch MS")?;
                let n = cuda
                    .as_ref()
                    .ok_or("init first")?
                    .launch_for(us, grid, ms)?;
                println!("launched {n}");
            }
            "pid" => println!("pid {}", std::process::id()),
            "ready" => println!("ready"),
            "wait" => {
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            }
            "sleep" => std::thread::sleep(Duration::from_millis(num(args.next(), "sleep MS")?)),
            "nvml-procs" => {
                if nvml.is_none() {
                    nvml = Some(ffi::Nvml::load()?);
                }
                let d = num(args.next(), "nvml-procs D")?;
                let t = Instant::now();
                for (pid, mem) in nvml.as_ref().expect("loaded").procs(d)? {
                    println!("proc {pid} {mem}");
                }
                println!("snapshot_us {}", t.elapsed().as_micros());
            }
            "nvml-util" => {
                if nvml.is_none() {
                    nvml = Some(ffi::Nvml::load()?);
                }
                let d = num(args.next(), "nvml-util D")?;
                let (gpu, per) = nvml.as_ref().expect("loaded").util(d)?;
                println!("util {gpu}");
                for (pid, sm) in per {
                    println!("putil {pid} {sm}");
                }
            }
            "nested" => {
                let d = num(args.next(), "nested D")?;
                let n: u32 = num(args.next(), "nested N")?;
                let c = cuda.as_ref().ok_or("init first")?;
                let t = Instant::now();
                for _ in 0..n {
                    c.retain(d)?;
                }
                let ns = t.elapsed().as_nanos() / u128::from(n.max(1));
                for _ in 0..n {
                    c.release(d)?;
                }
                println!("nested_ns {ns}");
            }
            "bogus" => {
                let c = cuda.as_ref().ok_or("init first")?;
                for (name, r) in c.bogus()? {
                    println!("bogus {name} {r}");
                }
                if nvml.is_none() {
                    nvml = Some(ffi::Nvml::load()?);
                }
                println!(
                    "bogus nvmlDeviceGetName {}",
                    nvml.as_ref().expect("loaded").bogus_name()?
                );
            }
            "devices" => {
                let d = cuda.as_ref().ok_or("init first")?.devices()?;
                println!("cuda.count {}", d.len());
                for (i, u) in d.iter().enumerate() {
                    println!("cuda.{i}.uuid {}", ffi::uuid_text(u));
                }
            }
            "nvml-devices" => {
                if nvml.is_none() {
                    nvml = Some(ffi::Nvml::load()?);
                }
                let d = nvml.as_ref().expect("loaded").devices()?;
                println!("nvml.count {}", d.len());
                for (i, u) in d.iter().enumerate() {
                    println!("nvml.{i}.uuid {u}");
                }
            }
            "pool-create" => {
                let d = num(args.next(), "pool-create D")?;
                pool = Some(cuda.as_ref().ok_or("init first")?.pool_create(d)?);
            }
            "pool-create-max" => {
                let d = num(args.next(), "pool-create-max D")?;
                let mib: usize = num(args.next(), "pool-create-max MIB")?;
                pool = Some(cuda.as_ref().ok_or("init first")?.pool_create_at(
                    vgpu_cuda_abi::CU_MEM_LOCATION_TYPE_DEVICE,
                    d,
                    mib << 20,
                )?);
            }
            "pool-create-host" => {
                pool = Some(cuda.as_ref().ok_or("init first")?.pool_create_at(
                    vgpu_cuda_abi::CU_MEM_LOCATION_TYPE_HOST_NUMA,
                    0,
                    0,
                )?);
            }
            "pool-current" => {
                let d = num(args.next(), "pool-current D")?;
                pool = Some(cuda.as_ref().ok_or("init first")?.pool_current(d)?);
            }
            "pool-threshold" => {
                let v = match args.next().as_deref() {
                    Some("max") => u64::MAX,
                    other => num::<u64>(other.map(str::to_string), "pool-threshold MIB")? << 20,
                };
                let p = pool.ok_or("no pool yet")?;
                cuda.as_ref().ok_or("init first")?.pool_set_u64(
                    p,
                    vgpu_cuda_abi::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    v,
                )?;
            }
            "pool-alloc" => {
                let mib: usize = num(args.next(), "pool-alloc MIB")?;
                let p = pool.ok_or("no pool yet")?;
                let (r, ptr) = cuda
                    .as_ref()
                    .ok_or("init first")?
                    .pool_alloc(p, mib << 20)?;
                if r.is_success() {
                    ptrs.push(ptr);
                    println!("alloc ok");
                } else {
                    println!("alloc err {}", r.0);
                }
            }
            "free-async" => {
                let p = ptrs.pop().ok_or("free-async: nothing allocated")?;
                cuda.as_ref().ok_or("init first")?.free_async(p)?;
            }
            "sync" => cuda.as_ref().ok_or("init first")?.sync()?,
            "pool-trim" => {
                let mib: usize = num(args.next(), "pool-trim MIB")?;
                let p = pool.ok_or("no pool yet")?;
                cuda.as_ref().ok_or("init first")?.pool_trim(p, mib << 20)?;
            }
            "pool-attr" => {
                let p = pool.ok_or("no pool yet")?;
                let c = cuda.as_ref().ok_or("init first")?;
                println!(
                    "pool reserved {} used {} reserved_high {} used_high {}",
                    c.pool_get_u64(p, vgpu_cuda_abi::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
                    c.pool_get_u64(p, vgpu_cuda_abi::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
                    c.pool_get_u64(p, vgpu_cuda_abi::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
                    c.pool_get_u64(p, vgpu_cuda_abi::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
                );
            }
            "pool-destroy" => {
                let p = pool.ok_or("no pool yet")?;
                let r = cuda.as_ref().ok_or("init first")?.pool_destroy(p)?;
                println!("pool-destroy {}", r.0);
            }
            "mem-info" => {
                let (f, t) = cuda.as_ref().ok_or("init first")?.mem_info()?;
                println!("mem free {f} total {t}");
            }
            other => return Err(format!("unknown step `{other}`")),
        }
        let _ = out.lock().flush();
    }
    Ok(())
}
