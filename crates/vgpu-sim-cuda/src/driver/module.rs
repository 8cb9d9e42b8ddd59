//! Modules and the kernels they offer, libraries (CUDA 12's
//! context-independent modules) and their kernels, and the sim's own
//! image text.
use super::*;

impl Driver {
    // ---- modules and launches ----

    pub fn module_load(&self, image: &str) -> R<u64> {
        self.ctx()?;
        let kernels = parse_image(image).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
        let open = kernels.iter().any(|k| k.name == "*");
        let m = self.module_of(kernels.into_iter().filter(|k| k.name != "*").collect())?;
        if open {
            self.lock().open_modules.insert(m);
        }
        Ok(m)
    }

    /// A module offering `kernels`.
    pub fn module_of(&self, kernels: Vec<Kernel>) -> R<u64> {
        Ok(Self::module_locked(&mut self.lock(), kernels))
    }

    fn module_locked(g: &mut Inner, kernels: Vec<Kernel>) -> u64 {
        let mut fids = Vec::new();
        for k in kernels {
            let f = g.id(T_FUNC);
            g.funcs.insert(f, k);
            fids.push(f);
        }
        let m = g.id(T_MODULE);
        g.modules.insert(m, fids);
        m
    }

    pub fn module_unload(&self, m: u64) -> R {
        let mut g = self.lock();
        let fids = g
            .modules
            .remove(&m)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for f in fids {
            g.funcs.remove(&f);
        }
        Ok(())
    }

    pub fn module_function(&self, m: u64, name: &str) -> R<u64> {
        let g = self.lock();
        let fids = g
            .modules
            .get(&m)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(f) = fids
            .iter()
            .copied()
            .find(|f| g.funcs.get(f).is_some_and(|k| k.name == name))
        {
            return Ok(f);
        }
        if !g.open_modules.contains(&m) {
            return Err(CUresult::CUDA_ERROR_NOT_FOUND);
        }
        // An open module (contents unreadable): every kernel it is asked
        // for takes the image per-block time.
        drop(g);
        let block = self.m.header().image_block_ns;
        let mut g = self.lock();
        let f = g.id(T_FUNC);
        g.funcs.insert(
            f,
            Kernel {
                name: name.to_string(),
                block_ns: Some(block),
            },
        );
        if let Some(v) = g.modules.get_mut(&m) {
            v.push(f);
        }
        Ok(f)
    }

    /// Per-block time of `f` (a function, or a library's kernel launched
    /// in its place) given its first parameter (if the kernel takes its
    /// time from there).
    pub fn block_ns(&self, f: u64, param_ns: Option<u64>) -> R<u64> {
        let g = self.lock();
        let k = Self::kernel_def(&g, f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(k.block_ns.or(param_ns).unwrap_or(0))
    }

    pub fn takes_time_param(&self, f: u64) -> bool {
        Self::kernel_def(&self.lock(), f).is_some_and(|k| k.block_ns.is_none())
    }

    /// What a function or a library's kernel runs.
    fn kernel_def(g: &Inner, f: u64) -> Option<&Kernel> {
        match handle_kind(f) {
            Some(T_KERNEL) => g.lib_kernels.get(&f).map(|k| &k.def),
            _ => g.funcs.get(&f),
        }
    }

    // ---- libraries (CUDA 12 library management) ----

    /// `cuLibraryLoad*`: a library of `kernels` (`open`: any name
    /// resolves). Context-independent, as in the driver: it is loaded into
    /// a context (a module there) when first used in it.
    pub fn library_load(&self, kernels: Vec<Kernel>, open: bool) -> R<u64> {
        let mut g = self.lock();
        let lib = g.id(T_LIBRARY);
        let mut ids = Vec::with_capacity(kernels.len());
        for def in kernels {
            let k = g.id(T_KERNEL);
            g.lib_kernels.insert(k, LibKernel { lib, def });
            ids.push(k);
        }
        g.libraries.insert(
            lib,
            Library {
                kernels: ids,
                open,
                modules: HashMap::new(),
            },
        );
        Ok(lib)
    }

    /// `cuLibraryUnload`: the library, its kernels and its modules in
    /// every context go; their handles are invalid from then on.
    pub fn library_unload(&self, lib: u64) -> R {
        let mut g = self.lock();
        let l = g
            .libraries
            .remove(&lib)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for k in &l.kernels {
            g.lib_kernels.remove(k);
        }
        for m in l.modules.values() {
            if let Some(fids) = g.modules.remove(m) {
                for f in fids {
                    g.funcs.remove(&f);
                }
            }
            g.open_modules.remove(m);
        }
        Ok(())
    }

    /// `cuLibraryGetKernel`: `CUDA_ERROR_NOT_FOUND` for a name the image
    /// does not define (an open library defines every name).
    pub fn library_kernel(&self, lib: u64, name: &str) -> R<u64> {
        let block = self.m.header().image_block_ns;
        let mut g = self.lock();
        let l = g
            .libraries
            .get(&lib)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let open = l.open;
        if let Some(k) = l
            .kernels
            .iter()
            .copied()
            .find(|k| g.lib_kernels.get(k).is_some_and(|k| k.def.name == name))
        {
            return Ok(k);
        }
        if !open {
            return Err(CUresult::CUDA_ERROR_NOT_FOUND);
        }
        let k = g.id(T_KERNEL);
        let def = Kernel {
            name: name.to_string(),
            block_ns: Some(block),
        };
        g.lib_kernels.insert(k, LibKernel { lib, def });
        if let Some(l) = g.libraries.get_mut(&lib) {
            l.kernels.push(k);
        }
        Ok(k)
    }

    /// The kernels of a library (`cuLibraryEnumerateKernels`), in image order.
    pub fn library_kernels(&self, lib: u64) -> R<Vec<u64>> {
        self.lock()
            .libraries
            .get(&lib)
            .map(|l| l.kernels.clone())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuLibraryGetModule`: the library's module in the current context,
    /// loading it there if this is its first use.
    pub fn library_module(&self, lib: u64) -> R<u64> {
        let (ctx, _) = self.ctx()?;
        let mut g = self.lock();
        Self::library_module_locked(&mut g, lib, ctx)
    }

    fn library_module_locked(g: &mut Inner, lib: u64, ctx: u64) -> R<u64> {
        let l = g
            .libraries
            .get(&lib)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(m) = l.modules.get(&ctx) {
            return Ok(*m);
        }
        let open = l.open;
        let defs: Vec<Kernel> = l
            .kernels
            .iter()
            .filter_map(|k| g.lib_kernels.get(k).map(|k| k.def.clone()))
            .collect();
        let m = Self::module_locked(g, defs);
        if open {
            g.open_modules.insert(m);
        }
        if let Some(l) = g.libraries.get_mut(&lib) {
            l.modules.insert(ctx, m);
        }
        Ok(m)
    }

    /// `cuKernelGetFunction`: the kernel's function in the current context.
    pub fn kernel_function(&self, k: u64) -> R<u64> {
        let (ctx, _) = self.ctx()?;
        self.kernel_function_in(k, ctx)
    }

    /// The kernel's function in `ctx`, loading its library there first if
    /// need be; the same kernel (name, per-block time) as the library's.
    pub fn kernel_function_in(&self, k: u64, ctx: u64) -> R<u64> {
        let mut g = self.lock();
        let LibKernel { lib, def } = g
            .lib_kernels
            .get(&k)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let m = Self::library_module_locked(&mut g, lib, ctx)?;
        let fids = g.modules.get(&m).cloned().unwrap_or_default();
        if let Some(f) = fids
            .iter()
            .copied()
            .find(|f| g.funcs.get(f).is_some_and(|x| x.name == def.name))
        {
            return Ok(f);
        }
        // A kernel an open library resolved after it was loaded here.
        let f = g.id(T_FUNC);
        g.funcs.insert(f, def);
        if let Some(v) = g.modules.get_mut(&m) {
            v.push(f);
        }
        Ok(f)
    }

    /// A library's kernel: its library and definition.
    pub fn lib_kernel(&self, k: u64) -> R<LibKernel> {
        self.lock()
            .lib_kernels
            .get(&k)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuKernelGetAttribute` on device ordinal `dev` (attributes are
    /// per device for a context-independent kernel).
    pub fn kernel_attribute(&self, k: u64, attr: u32, dev: i32) -> R<i32> {
        self.lib_kernel(k)?;
        let d = self.device(dev)?;
        self.default_func_attribute(d, attr)
    }

    /// `cuLibraryGetGlobal`: no image the sim reads declares `__device__`
    /// globals (its text names kernels only; PTX and cubin globals are not
    /// parsed), so every name of a live library is `CUDA_ERROR_NOT_FOUND`.
    pub fn library_global(&self, lib: u64, _name: &str) -> R<(u64, u64)> {
        if !self.lock().libraries.contains_key(&lib) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    }
}

/// A loaded library (`CUlibrary`).
#[derive(Clone, Debug)]
pub struct Library {
    /// Its kernels' handles, in image order (an open library adds each
    /// name it is asked for).
    pub kernels: Vec<u64>,
    /// Any kernel name resolves (image contents unreadable).
    pub open: bool,
    /// Context -> the module this library was loaded as there.
    pub modules: HashMap<u64, u64>,
}

/// A library's kernel (`CUkernel`).
#[derive(Clone, Debug)]
pub struct LibKernel {
    pub lib: u64,
    pub def: Kernel,
}

/// Parse a simulated module image (see docs/sim.md):
///
/// ```text
/// vgpu-sim-module v1
/// kernel spin                # per-block ns from the first kernel parameter (u64)
/// kernel busy block_us=500   # fixed per-block time
/// ```
///
/// or the one-line form `vgpu-sim-kernel name=busy block_us=500`.
pub fn parse_image(text: &str) -> Option<Vec<Kernel>> {
    let mut lines = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty());
    let first = lines.next()?;
    let mut out = Vec::new();
    if first == "vgpu-sim-module v1" {
        for l in lines {
            let mut w = l.split_whitespace();
            if w.next()? != "kernel" {
                return None;
            }
            let name = w.next()?.to_string();
            let block_ns = time_kv(w)?;
            out.push(Kernel { name, block_ns });
        }
    } else if let Some(rest) = first.strip_prefix("vgpu-sim-kernel ") {
        for l in std::iter::once(rest)
            .chain(lines.map(|l| l.strip_prefix("vgpu-sim-kernel ").unwrap_or("\u{0}")))
        {
            let mut name = None;
            let mut rest_kv = Vec::new();
            for kv in l.split_whitespace() {
                match kv.strip_prefix("name=") {
                    Some(n) if !n.is_empty() => name = Some(n.to_string()),
                    _ => rest_kv.push(kv),
                }
            }
            out.push(Kernel {
                name: name?,
                block_ns: time_kv(rest_kv.into_iter())?,
            });
        }
    } else {
        return None;
    }
    (!out.is_empty()).then_some(out)
}

/// `block_us=N` / `block_ns=N` (at most one); `Some(None)` when absent.
fn time_kv<'a>(kvs: impl Iterator<Item = &'a str>) -> Option<Option<u64>> {
    let mut t = None;
    for kv in kvs {
        let (k, v) = kv.split_once('=')?;
        let n: f64 = v
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
        let ns = match k {
            "block_us" => n * 1e3,
            "block_ns" => n,
            "block_ms" => n * 1e6,
            _ => return None,
        };
        if t.is_some() {
            return None;
        }
        t = Some(ns.round() as u64);
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_cuda_abi::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    use vgpu_sim::{SimHandle, SimOptions};

    /// A driver of this process on a private machine (no global state but
    /// the calling thread's context stack).
    fn driver(sim: &SimHandle) -> Driver {
        let m = Machine::connect_dir(sim.dir(), true).unwrap();
        let n = m.device_count();
        Driver {
            visible: (0..n).collect(),
            inner: Mutex::new(Inner {
                primaries: (0..n).map(|_| Primary::default()).collect(),
                ..Inner::default()
            }),
            primary_lock: (0..n).map(|_| Mutex::new(())).collect(),
            m,
        }
    }

    fn last_seq(d: &Driver, ctx: u64) -> u64 {
        d.lock().ctxs[&ctx].last_seq
    }

    #[test]
    fn libraries_are_context_independent_and_their_kernels_launch_as_functions() {
        let opts = SimOptions {
            link_libs: false,
            ..SimOptions::profile("zero").unwrap()
        };
        let sim = SimHandle::start(opts).unwrap();
        let d = driver(&sim);
        let defs = parse_image("vgpu-sim-module v1\nkernel spin\nkernel busy block_us=500\n");
        // Loaded with no context current: a library belongs to none.
        let lib = d.library_load(defs.unwrap(), false).unwrap();
        assert_eq!(handle_kind(lib), Some(T_LIBRARY));
        let spin = d.library_kernel(lib, "spin").unwrap();
        let busy = d.library_kernel(lib, "busy").unwrap();
        assert_eq!(handle_kind(busy), Some(T_KERNEL));
        assert_eq!(
            d.library_kernel(lib, "spin"),
            Ok(spin),
            "one handle per name"
        );
        assert_eq!(d.library_kernels(lib), Ok(vec![spin, busy]));
        assert_eq!(
            d.library_kernel(lib, "nope"),
            Err(CUresult::CUDA_ERROR_NOT_FOUND)
        );
        assert_eq!(
            d.library_kernel(busy, "spin"),
            Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
            "a kernel is not a library"
        );
        assert_eq!(
            d.kernel_function(busy),
            Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        );
        assert_eq!(
            d.kernel_attribute(busy, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0),
            Ok(1024)
        );
        assert_eq!(
            d.kernel_attribute(busy, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 9),
            Err(CUresult::CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(
            d.library_global(lib, "g"),
            Err(CUresult::CUDA_ERROR_NOT_FOUND)
        );

        // In a context: loaded there (a module) at the first use.
        let c1 = d.ctx_create(0, 0).unwrap();
        let f1 = d.kernel_function(busy).unwrap();
        assert_eq!(handle_kind(f1), Some(T_FUNC));
        assert_eq!(d.kernel_function(busy), Ok(f1));
        assert_eq!(d.func_name(f1).as_deref(), Ok("busy"));
        let m1 = d.library_module(lib).unwrap();
        assert_eq!(d.module_function(m1, "busy"), Ok(f1));
        assert_eq!(d.block_ns(f1, None), Ok(500_000));
        assert_eq!(d.block_ns(busy, None), Ok(500_000), "the same kernel");
        assert_eq!(d.block_ns(spin, Some(7)), Ok(7));
        assert!(d.takes_time_param(spin) && !d.takes_time_param(busy));

        // A launch through the kernel handle runs (a launch is queued).
        let node = |func| KernelNode {
            func,
            grid: [2, 1, 1],
            block: [32, 1, 1],
            param_ns: None,
        };
        d.launch(&node(busy), 0, false, false).unwrap();
        let after_kernel = last_seq(&d, c1);
        assert!(after_kernel > 0, "the kernel launch was queued");
        d.launch(&node(f1), 0, false, false).unwrap();
        assert!(last_seq(&d, c1) > after_kernel);

        // Another context gets its own function, loaded by the launch.
        let c2 = d.ctx_create(0, 0).unwrap();
        d.launch(&node(spin), 0, false, false).unwrap();
        assert!(last_seq(&d, c2) > 0);
        let m2 = d.lock().libraries[&lib].modules[&c2];
        assert_ne!(m1, m2);
        let f2 = d.kernel_function(busy).unwrap();
        assert_ne!(f1, f2);
        assert_eq!(d.module_function(m2, "busy"), Ok(f2));
        // A graph's kernel node may hold the kernel handle too.
        let graph = d.graph_create(0).unwrap();
        d.graph_add_kernel(graph, &[], node(busy)).unwrap();
        let exec = d.graph_instantiate(graph, 0).unwrap();
        let before = last_seq(&d, c2);
        d.graph_launch(exec, 0, false).unwrap();
        assert!(last_seq(&d, c2) > before, "the graph's kernel was queued");
        d.graph_exec_destroy(exec).unwrap();
        d.graph_destroy(graph).unwrap();

        // Unloading invalidates every handle it made, in every context.
        d.library_unload(lib).unwrap();
        for (what, r) in [
            ("kernel", d.kernel_function(busy).map(|_| ())),
            ("function", d.func_name(f1).map(|_| ())),
            ("other context's function", d.func_name(f2).map(|_| ())),
            ("module", d.module_function(m1, "busy").map(|_| ())),
            ("launch", d.launch(&node(busy), 0, false, false)),
            (
                "launch of its function",
                d.launch(&node(f2), 0, false, false),
            ),
            ("library", d.library_kernel(lib, "busy").map(|_| ())),
            ("second unload", d.library_unload(lib)),
        ] {
            assert_eq!(r, Err(CUresult::CUDA_ERROR_INVALID_HANDLE), "{what}");
        }

        // An open library (`kernel *`) defines every name it is asked for,
        // also after it was loaded into a context.
        let open = parse_image("vgpu-sim-module v1\nkernel *\n").unwrap();
        let lib = d
            .library_load(open.into_iter().filter(|k| k.name != "*").collect(), true)
            .unwrap();
        assert_eq!(d.library_kernels(lib), Ok(vec![]));
        d.library_module(lib).unwrap();
        let any = d.library_kernel(lib, "anything").unwrap();
        let f = d.kernel_function(any).unwrap();
        assert_eq!(d.func_name(f).as_deref(), Ok("anything"));
        assert_eq!(d.block_ns(any, None), Ok(d.m.header().image_block_ns));
        d.library_unload(lib).unwrap();
        d.ctx_destroy(c2).unwrap();
        d.ctx_destroy(c1).unwrap();
    }

    #[test]
    fn images() {
        let k = parse_image("vgpu-sim-module v1\nkernel spin\nkernel busy block_us=500\n").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "spin");
        assert_eq!(k[0].block_ns, None);
        assert_eq!(k[1].block_ns, Some(500_000));
        let k = parse_image("vgpu-sim-kernel name=busy block_us=2.5").unwrap();
        assert_eq!((k[0].name.as_str(), k[0].block_ns), ("busy", Some(2500)));
        assert!(parse_image("definitely not a module").is_none());
        assert!(parse_image("vgpu-sim-module v1\n").is_none());
        assert!(parse_image("vgpu-sim-module v1\nkernel x block_us=-1\n").is_none());
        assert!(parse_image("vgpu-sim-module v1\nkernel x speed=3\n").is_none());
        assert!(parse_image("vgpu-sim-kernel block_us=3").is_none());
    }
}
