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
            // SAFETY: each caller names a cuda.h entry and gives its exact
            // C signature as `T`.
            unsafe { self.lib.get::<T>(name) }.map_err(|e| format!("dlsym: {e}"))
        }

        pub fn init(&self) -> Res<()> {
            let f = self.sym::<unsafe extern "C" fn(c_uint) -> CUresult>(b"cuInit")?;
            // SAFETY: cuInit(unsigned int) per cuda.h.
            check(unsafe { f(0) }, "cuInit")
        }

        pub fn retain(&self, dev: c_int) -> Res<CUcontext> {
            let f = self.sym::<unsafe extern "C" fn(*mut CUcontext, c_int) -> CUresult>(
                b"cuDevicePrimaryCtxRetain",
            )?;
            let set =
                self.sym::<unsafe extern "C" fn(CUcontext) -> CUresult>(b"cuCtxSetCurrent")?;
            let mut c = CUcontext::NULL;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { f(&mut c, dev) }, "cuDevicePrimaryCtxRetain")?;
            // SAFETY: a context the driver just gave us.
            check(unsafe { set(c) }, "cuCtxSetCurrent")?;
            Ok(c)
        }

        pub fn release(&self, dev: c_int) -> Res<()> {
            let f = self
                .sym::<unsafe extern "C" fn(c_int) -> CUresult>(b"cuDevicePrimaryCtxRelease_v2")?;
            // SAFETY: signature per cuda.h.
            check(unsafe { f(dev) }, "cuDevicePrimaryCtxRelease_v2")
        }

        pub fn ctx_create(&self, dev: c_int) -> Res<()> {
            let f = self.sym::<unsafe extern "C" fn(*mut CUcontext, c_uint, c_int) -> CUresult>(
                b"cuCtxCreate_v2",
            )?;
            let mut c = CUcontext::NULL;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { f(&mut c, 0, dev) }, "cuCtxCreate_v2")
        }

        pub fn alloc(&self, bytes: usize) -> Res<CUresult> {
            let f = self.sym::<unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult>(
                b"cuMemAlloc_v2",
            )?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            Ok(unsafe { f(&mut p, bytes) })
        }

        /// cuMemAlloc_v2 + cuIpcGetMemHandle: the handle's 64 bytes.
        pub fn ipc_export(&self, bytes: usize) -> Res<[u8; 64]> {
            let alloc = self.sym::<unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult>(
                b"cuMemAlloc_v2",
            )?;
            let get = self
                .sym::<unsafe extern "C" fn(*mut CUipcMemHandle, CUdeviceptr) -> CUresult>(
                    b"cuIpcGetMemHandle",
                )?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { alloc(&mut p, bytes) }, "cuMemAlloc_v2")?;
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: out-pointer to a local; signature per cuda.h.
            check(unsafe { get(&mut h, p) }, "cuIpcGetMemHandle")?;
            Ok(h.reserved)
        }

        pub fn alloc_async(&self, bytes: usize) -> Res<CUresult> {
            type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
            let f = self.sym::<F>(b"cuMemAllocAsync")?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; the legacy stream; per cuda.h.
            Ok(unsafe { f(&mut p, bytes, CUstream::NULL) })
        }

        /// Launch back-to-back for `ms`; returns the launch count.
        pub fn launch_for(&self, block_us: u64, grid: u32, ms: u64) -> Res<u64> {
            let load = self.sym::<unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult>(
                b"cuModuleLoadData",
            )?;
            let getf = self.sym::<unsafe extern "C" fn(
                *mut CUfunction,
                CUmodule,
                *const c_char,
            ) -> CUresult>(b"cuModuleGetFunction")?;
            type Launch = unsafe extern "C" fn(
                CUfunction,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                CUstream,
                *mut *mut c_void,
                *mut *mut c_void,
            ) -> CUresult;
            let launch = self.sym::<Launch>(b"cuLaunchKernel")?;
            let sync = self.sym::<unsafe extern "C" fn() -> CUresult>(b"cuCtxSynchronize")?;
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
            let count =
                self.sym::<unsafe extern "C" fn(*mut c_int) -> CUresult>(b"cuDeviceGetCount")?;
            let get =
                self.sym::<unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult>(b"cuDeviceGet")?;
            let uuid = self.sym::<unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult>(
                b"cuDeviceGetUuid_v2",
            )?;
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
            type F = unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemPoolProps) -> CUresult;
            let f = self.sym::<F>(b"cuMemPoolCreate")?;
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
            type F = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
            let f = self.sym::<F>(b"cuDeviceGetMemPool")?;
            let mut pool = CUmemoryPool::NULL;
            // SAFETY: local out-pointer; signature per cuda.h.
            check(unsafe { f(&mut pool, dev) }, "cuDeviceGetMemPool")?;
            Ok(pool)
        }

        pub fn pool_set_u64(&self, pool: CUmemoryPool, attr: c_uint, v: u64) -> Res<()> {
            type F = unsafe extern "C" fn(CUmemoryPool, c_uint, *mut c_void) -> CUresult;
            let f = self.sym::<F>(b"cuMemPoolSetAttribute")?;
            let mut v = v;
            // SAFETY: a u64 attribute (cuuint64_t per cuda.h) through a local.
            let r = unsafe { f(pool, attr, (&raw mut v).cast()) };
            check(r, "cuMemPoolSetAttribute")
        }

        pub fn pool_get_u64(&self, pool: CUmemoryPool, attr: c_uint) -> Res<u64> {
            type F = unsafe extern "C" fn(CUmemoryPool, c_uint, *mut c_void) -> CUresult;
            let f = self.sym::<F>(b"cuMemPoolGetAttribute")?;
            let mut v: u64 = 0;
            // SAFETY: a u64 attribute (cuuint64_t per cuda.h) into a local.
            let r = unsafe { f(pool, attr, (&raw mut v).cast()) };
            check(r, "cuMemPoolGetAttribute")?;
            Ok(v)
        }

        pub fn pool_alloc(&self, pool: CUmemoryPool, bytes: usize) -> Res<(CUresult, CUdeviceptr)> {
            type F =
                unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
            let f = self.sym::<F>(b"cuMemAllocFromPoolAsync")?;
            let mut p: CUdeviceptr = 0;
            // SAFETY: local out-pointer; the legacy stream; per cuda.h.
            let r = unsafe { f(&mut p, bytes, pool, CUstream::NULL) };
            Ok((r, p))
        }

        pub fn free_async(&self, p: CUdeviceptr) -> Res<()> {
            type F = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
            let f = self.sym::<F>(b"cuMemFreeAsync")?;
            // SAFETY: a pointer this process allocated; the legacy stream.
            check(unsafe { f(p, CUstream::NULL) }, "cuMemFreeAsync")
        }

        pub fn sync(&self) -> Res<()> {
            let f = self.sym::<unsafe extern "C" fn() -> CUresult>(b"cuCtxSynchronize")?;
            // SAFETY: no arguments.
            check(unsafe { f() }, "cuCtxSynchronize")
        }

        pub fn pool_trim(&self, pool: CUmemoryPool, keep: usize) -> Res<()> {
            let f = self
                .sym::<unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult>(b"cuMemPoolTrimTo")?;
            // SAFETY: a pool handle from the driver; signature per cuda.h.
            check(unsafe { f(pool, keep) }, "cuMemPoolTrimTo")
        }

        pub fn pool_destroy(&self, pool: CUmemoryPool) -> Res<CUresult> {
            let f =
                self.sym::<unsafe extern "C" fn(CUmemoryPool) -> CUresult>(b"cuMemPoolDestroy")?;
            // SAFETY: a pool handle from the driver; signature per cuda.h.
            Ok(unsafe { f(pool) })
        }

        pub fn mem_info(&self) -> Res<(usize, usize)> {
            let f = self.sym::<unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult>(
                b"cuMemGetInfo_v2",
            )?;
            let (mut fr, mut t) = (0, 0);
            // SAFETY: local out-pointers; signature per cuda.h.
            check(unsafe { f(&mut fr, &mut t) }, "cuMemGetInfo_v2")?;
            Ok((fr, t))
        }

        /// Call a one- or two-argument entry whose arguments are all
        /// handles or device pointers (pointer-sized) with `args`.
        pub fn raw(&self, name: &str, args: &[usize]) -> Res<u32> {
            let sym = format!("{name}\0");
            let r = match args {
                [a] => {
                    let f = self.sym::<unsafe extern "C" fn(usize) -> CUresult>(sym.as_bytes())?;
                    // SAFETY: the named entry takes one pointer-sized
                    // handle (or CUdeviceptr / u64 handle): same ABI.
                    unsafe { f(*a) }
                }
                [a, b] => {
                    let f =
                        self.sym::<unsafe extern "C" fn(usize, usize) -> CUresult>(sym.as_bytes())?;
                    // SAFETY: as above, two pointer-sized handles.
                    unsafe { f(*a, *b) }
                }
                _ => return Err("raw: 1 or 2 arguments".into()),
            };
            Ok(r.0)
        }
    }

    impl Nvml {
        /// `nvmlDeviceGetName` on a made-up handle.
        pub fn bogus_name(&self) -> Res<u32> {
            type F = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
            let f = self.sym::<F>(b"nvmlDeviceGetName")?;
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
            let init = n.sym::<unsafe extern "C" fn() -> nvmlReturn_t>(b"nvmlInit_v2")?;
            // SAFETY: nvmlInit_v2(void) per nvml.h.
            nv(unsafe { init() }, "nvmlInit_v2")?;
            Ok(n)
        }

        fn sym<T>(&self, name: &[u8]) -> Res<Symbol<'_, T>> {
            // SAFETY: each caller names an nvml.h entry with its exact C
            // signature as `T`.
            unsafe { self.lib.get::<T>(name) }.map_err(|e| format!("dlsym: {e}"))
        }

        fn device(&self, i: u32) -> Res<nvmlDevice_t> {
            let f = self.sym::<unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t>(
                b"nvmlDeviceGetHandleByIndex_v2",
            )?;
            let mut h = nvmlDevice_t(std::ptr::null_mut());
            // SAFETY: local out-pointer; signature per nvml.h.
            nv(unsafe { f(i, &mut h) }, "nvmlDeviceGetHandleByIndex_v2")?;
            Ok(h)
        }

        pub fn procs(&self, dev: u32) -> Res<Vec<(u32, u64)>> {
            let h = self.device(dev)?;
            type F = unsafe extern "C" fn(
                nvmlDevice_t,
                *mut c_uint,
                *mut nvmlProcessInfo_t,
            ) -> nvmlReturn_t;
            let f = self.sym::<F>(b"nvmlDeviceGetComputeRunningProcesses_v3")?;
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
            let count = self.sym::<unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t>(
                b"nvmlDeviceGetCount_v2",
            )?;
            type U = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
            let uuid = self.sym::<U>(b"nvmlDeviceGetUUID")?;
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
            let f = self
                .sym::<unsafe extern "C" fn(nvmlDevice_t, *mut nvmlUtilization_t) -> nvmlReturn_t>(
                    b"nvmlDeviceGetUtilizationRates",
                )?;
            let mut u = nvmlUtilization_t::default();
            // SAFETY: local out-pointer; signature per nvml.h.
            nv(unsafe { f(h, &mut u) }, "nvmlDeviceGetUtilizationRates")?;
            type P = unsafe extern "C" fn(
                nvmlDevice_t,
                *mut nvmlProcessUtilizationSample_t,
                *mut c_uint,
                u64,
            ) -> nvmlReturn_t;
            let p = self.sym::<P>(b"nvmlDeviceGetProcessUtilization")?;
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
                const JUNK: usize = 0xdead_beef;
                for (name, args) in [
                    ("cuCtxSetCurrent", vec![JUNK]),
                    ("cuCtxDestroy_v2", vec![JUNK]),
                    ("cuMemFree_v2", vec![0x1234]),
                    ("cuMemRelease", vec![12345]),
                    ("cuStreamSynchronize", vec![JUNK]),
                    ("cuStreamDestroy_v2", vec![JUNK]),
                    ("cuEventRecord", vec![JUNK, 0]),
                    ("cuEventDestroy_v2", vec![JUNK]),
                    ("cuModuleUnload", vec![JUNK]),
                    ("cuArrayDestroy", vec![JUNK]),
                    ("cuMipmappedArrayDestroy", vec![JUNK]),
                    ("cuGraphLaunch", vec![JUNK, 0]),
                    ("cuGraphExecDestroy", vec![JUNK]),
                    ("cuGraphDestroy", vec![JUNK]),
                ] {
                    println!("bogus {name} {}", c.raw(name, &args)?);
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
