//! The SM bench tenant's driver calls: `dlopen("libcuda.so.1")` and the
//! entry points it launches through, resolved with `dlsym(RTLD_DEFAULT)`
//! as a program linked with `-lcuda` gets them (so a preloaded libvgpu.so's
//! exports win). The only unsafe code of the SM bench. Also NVML's
//! per-process utilization for the real-GPU truth.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use vgpu_cuda_abi::{
    nvmlDevice_t, nvmlProcessUtilizationSample_t, nvmlReturn_t, sig, CUDA_KERNEL_NODE_PARAMS_v2,
    CUcontext, CUdevice, CUfunction, CUgraph, CUgraphExec, CUgraphNode, CUmodule, CUresult,
    CUstream,
};

fn open(lib: &CStr) -> Result<crate::dl::Lib, String> {
    crate::dl::open_global(lib)
}

fn sym(name: &CStr) -> Result<*mut c_void, String> {
    crate::dl::sym(None, name)
}

macro_rules! table {
    ($name:ident { $($field:ident: $sym:ident),* $(,)? }) => {
        /// Driver entry points, typed as the workspace's one list
        /// (`vgpu_cuda_abi::sig`, checked against cuda.h/nvml.h) types them.
        pub struct $name {
            $($field: sig::$sym,)*
        }
        impl $name {
            fn resolve() -> Result<$name, String> {
                Ok($name {
                    $($field: {
                        let name = concat!(stringify!($sym), "\0");
                        let p = sym(CStr::from_bytes_with_nul(name.as_bytes()).map_err(|e| e.to_string())?)?;
                        // SAFETY: `sig::$sym` is the C type of the symbol
                        // of that name.
                        unsafe { std::mem::transmute::<*mut c_void, sig::$sym>(p) }
                    },)*
                })
            }
        }
    };
}

table!(Core {
    init: cuInit,
    device_get: cuDeviceGet,
    device_name: cuDeviceGetName,
    attribute: cuDeviceGetAttribute,
    ctx_create: cuCtxCreate_v2,
    ctx_sync: cuCtxSynchronize,
    module_load: cuModuleLoadData,
    module_function: cuModuleGetFunction,
    stream_sync: cuStreamSynchronize,
    graph_create: cuGraphCreate,
    graph_add_kernel: cuGraphAddKernelNode_v2,
    graph_instantiate: cuGraphInstantiateWithFlags,
    graph_launch: cuGraphLaunch,
    launch: cuLaunchKernel,
    coop: cuLaunchCooperativeKernel,
});

/// The CUDA calls a tenant makes.
pub struct Cuda {
    core: Core,
    func: CUfunction,
    /// The device's SM count.
    pub sms: u32,
    /// The device is vgpu-sim's.
    pub simulated: bool,
    /// The spin kernel's parameter (GPU-ns per block), read by the launches.
    param: Box<u64>,
    graph: Option<CUgraphExec>,
    /// The driver's own `cuLaunchKernel`, when a preloaded interposer's
    /// wins the default scope (the overhead row times both in one process).
    direct: Option<sig::cuLaunchKernel>,
}

/// vgpu-sim's module: per-block time from the kernel's first parameter.
const SIM_MODULE: &CStr = c"vgpu-sim-module v1\nkernel spin\n";

/// A real GPU's: every block spins on %globaltimer for its parameter's ns.
const PTX_MODULE: &CStr = c".version 7.0
.target sm_52
.address_size 64
.visible .entry spin(.param .u64 ns)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
";

fn check(what: &str, r: CUresult) -> Result<(), String> {
    if r.is_success() {
        Ok(())
    } else {
        Err(format!("{what} returned CUresult {}", r.0))
    }
}

fn nvml_check(what: &str, r: nvmlReturn_t) -> Result<(), String> {
    check(what, CUresult(r.0))
}

impl Cuda {
    /// Loads the driver, creates a context on device 0 and loads the spin
    /// kernel (vgpu-sim's text module on the simulator, PTX elsewhere).
    pub fn open() -> Result<Cuda, String> {
        let lib = open(c"libcuda.so.1")?;
        let core = Core::resolve()?;
        let own = crate::dl::own_sym(lib, "cuLaunchKernel")?;
        let direct = (own != core.launch as *mut c_void).then(|| {
            // SAFETY: the driver's symbol of that name, whose C type
            // `sig::cuLaunchKernel` is.
            unsafe { std::mem::transmute::<*mut c_void, sig::cuLaunchKernel>(own) }
        });
        // SAFETY: flags 0.
        check("cuInit", unsafe { (core.init)(0) })?;
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointer, ordinal 0.
        check("cuDeviceGet", unsafe { (core.device_get)(&mut dev, 0) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: a 256-byte buffer and its length.
        check("cuDeviceGetName", unsafe {
            (core.device_name)(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        // SAFETY: the driver NUL-terminated it within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut sms: c_int = 0;
        // SAFETY: valid out-pointer; 16 = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
        check("cuDeviceGetAttribute(SM count)", unsafe {
            (core.attribute)(&mut sms, 16, dev)
        })?;
        let mut ctx = CUcontext::NULL;
        // SAFETY: valid out-pointer, flags 0, a device the driver returned.
        check("cuCtxCreate_v2", unsafe {
            (core.ctx_create)(&mut ctx, 0, dev)
        })?;
        let simulated = name.contains("(simulated)");
        let image = if simulated { SIM_MODULE } else { PTX_MODULE };
        let mut module = CUmodule::NULL;
        // SAFETY: a NUL-terminated image the driver reads during the call.
        check("cuModuleLoadData", unsafe {
            (core.module_load)(&mut module, image.as_ptr().cast())
        })?;
        let mut func = CUfunction::NULL;
        // SAFETY: valid out-pointer, the module just loaded, a NUL-terminated name.
        check("cuModuleGetFunction", unsafe {
            (core.module_function)(&mut func, module, c"spin".as_ptr())
        })?;
        Ok(Cuda {
            core,
            func,
            sms: sms.max(1) as u32,
            simulated,
            param: Box::new(0),
            graph: None,
            direct,
        })
    }

    /// Sets the per-block time the next launches pass.
    pub fn set_block_ns(&mut self, ns: u64) {
        *self.param = ns;
    }

    fn params(&mut self) -> [*mut c_void; 1] {
        [(&mut *self.param as *mut u64).cast()]
    }

    /// Whether the driver's own `cuLaunchKernel` differs from the one a
    /// program linked with `-lcuda` calls (an interposer is preloaded).
    pub fn interposed(&self) -> bool {
        self.direct.is_some()
    }

    /// `cuLaunchKernel` of `blocks` × 128 threads on the legacy stream.
    pub fn launch(&mut self, blocks: u32) -> c_uint {
        let f = self.core.launch;
        self.launch_with(f, blocks)
    }

    /// The same launch through the driver's own entry point, past any
    /// interposer (the plain launch when there is none).
    pub fn launch_direct(&mut self, blocks: u32) -> c_uint {
        let f = self.direct.unwrap_or(self.core.launch);
        self.launch_with(f, blocks)
    }

    fn launch_with(&mut self, f: sig::cuLaunchKernel, blocks: u32) -> c_uint {
        let mut p = self.params();
        // SAFETY: a function of the loaded module, valid dimensions, and a
        // parameter array whose one entry points at a live u64.
        unsafe {
            f(
                self.func,
                blocks,
                1,
                1,
                128,
                1,
                1,
                0,
                CUstream::NULL,
                p.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .0
    }

    /// `cuLaunchCooperativeKernel`, same shape.
    pub fn launch_cooperative(&mut self, blocks: u32) -> c_uint {
        let mut p = self.params();
        // SAFETY: as in `launch`.
        unsafe {
            (self.core.coop)(
                self.func,
                blocks,
                1,
                1,
                128,
                1,
                1,
                0,
                CUstream::NULL,
                p.as_mut_ptr(),
            )
        }
        .0
    }

    /// Builds (once) a graph of `nodes` spin kernels of `blocks` blocks in
    /// a chain, with the current per-block time baked in.
    pub fn build_graph(&mut self, nodes: u32, blocks: u32) -> Result<(), String> {
        let mut g = CUgraph::NULL;
        // SAFETY: valid out-pointer, flags 0.
        check("cuGraphCreate", unsafe {
            (self.core.graph_create)(&mut g, 0)
        })?;
        let mut prev: Option<CUgraphNode> = None;
        for _ in 0..nodes {
            let mut p = self.params();
            let np = CUDA_KERNEL_NODE_PARAMS_v2 {
                func: self.func,
                gridDimX: blocks,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 128,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: p.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: vgpu_cuda_abi::CUkernel::NULL,
                ctx: CUcontext::NULL,
            };
            let mut node = CUgraphNode::NULL;
            let deps: Vec<CUgraphNode> = prev.into_iter().collect();
            // SAFETY: valid out-pointer, the graph just created, `deps`
            // (0 or 1 node of it) and node parameters read during the call.
            check("cuGraphAddKernelNode_v2", unsafe {
                (self.core.graph_add_kernel)(&mut node, g, deps.as_ptr(), deps.len(), &np)
            })?;
            prev = Some(node);
        }
        let mut exec = CUgraphExec::NULL;
        // SAFETY: valid out-pointer, a complete graph, flags 0.
        check("cuGraphInstantiateWithFlags", unsafe {
            (self.core.graph_instantiate)(&mut exec, g, 0)
        })?;
        self.graph = Some(exec);
        Ok(())
    }

    /// `cuGraphLaunch` of the built graph on the legacy stream.
    pub fn graph_launch(&mut self) -> c_uint {
        match self.graph {
            // SAFETY: an instantiated graph and the legacy stream.
            Some(e) => unsafe { (self.core.graph_launch)(e, CUstream::NULL) }.0,
            None => 1, // CUDA_ERROR_INVALID_VALUE: no graph
        }
    }

    /// `cuStreamSynchronize` of the legacy stream.
    pub fn stream_sync(&self) -> c_uint {
        // SAFETY: the legacy stream of the current context.
        unsafe { (self.core.stream_sync)(CUstream::NULL) }.0
    }

    /// `cuCtxSynchronize`.
    pub fn ctx_sync(&self) -> c_uint {
        // SAFETY: no arguments; a context is current.
        unsafe { (self.core.ctx_sync)() }.0
    }
}

table!(NvmlCalls {
    init: nvmlInit_v2,
    handle: nvmlDeviceGetHandleByIndex_v2,
    samples: nvmlDeviceGetProcessUtilization,
});

/// NVML's per-process samples of device 0 (the real-GPU truth).
pub struct Nvml {
    calls: NvmlCalls,
    dev: nvmlDevice_t,
}

impl Nvml {
    /// Loads NVML and takes device 0.
    pub fn open() -> Result<Nvml, String> {
        open(c"libnvidia-ml.so.1")?;
        let calls = NvmlCalls::resolve()?;
        // SAFETY: no arguments.
        nvml_check("nvmlInit_v2", unsafe { (calls.init)() })?;
        let mut dev = nvmlDevice_t(std::ptr::null_mut());
        // SAFETY: valid out-pointer, index 0.
        nvml_check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (calls.handle)(0, &mut dev)
        })?;
        Ok(Nvml { calls, dev })
    }

    /// Samples newer than `since_us` (wall-clock µs): (pid, smUtil %, µs).
    pub fn samples(&self, since_us: u64) -> Vec<(u32, u32, u64)> {
        let mut n: c_uint = 0;
        // SAFETY: a NULL buffer asks for the count (NVML_ERROR_INSUFFICIENT_SIZE).
        unsafe {
            (self.calls.samples)(self.dev, std::ptr::null_mut(), &mut n, since_us);
        }
        if n == 0 {
            return Vec::new();
        }
        let mut buf = vec![nvmlProcessUtilizationSample_t::default(); n as usize + 8];
        let mut len = buf.len() as c_uint;
        // SAFETY: a buffer of `len` samples and its length.
        let r = unsafe { (self.calls.samples)(self.dev, buf.as_mut_ptr(), &mut len, since_us) };
        if r.0 != 0 {
            return Vec::new();
        }
        buf.truncate((len as usize).min(buf.len()));
        buf.into_iter()
            .map(|s| (s.pid, s.smUtil, s.timeStamp))
            .collect()
    }
}
