//! Modules and the kernels they offer, and the sim's own image text.
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
        let mut g = self.lock();
        let mut fids = Vec::new();
        for k in kernels {
            let f = g.id(T_FUNC);
            g.funcs.insert(f, k);
            fids.push(f);
        }
        let m = g.id(T_MODULE);
        g.modules.insert(m, fids);
        Ok(m)
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

    /// Per-block time of `f` given its first parameter (if the kernel
    /// takes its time from there).
    pub fn block_ns(&self, f: u64, param_ns: Option<u64>) -> R<u64> {
        let g = self.lock();
        let k = g.funcs.get(&f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(k.block_ns.or(param_ns).unwrap_or(0))
    }

    pub fn takes_time_param(&self, f: u64) -> bool {
        self.lock()
            .funcs
            .get(&f)
            .is_some_and(|k| k.block_ns.is_none())
    }
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

