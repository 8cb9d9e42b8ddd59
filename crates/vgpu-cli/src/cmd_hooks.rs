//! `vgpu hooks`: the interposer's hook coverage table, read from a built
//! `libvgpu.so` (dlopened, never linked: the library exports `dlsym`).
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct Args {
    /// The library to read (default: the built libvgpu.so next to `vgpu`).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Print the raw tab-separated table.
    #[arg(long)]
    tsv: bool,
}

/// Reads the table the library exports (`vgpu_hook_table`).
pub fn table(lib: &std::path::Path) -> anyhow::Result<String> {
    let c =
        CString::new(lib.as_os_str().as_encoded_bytes()).context("library path contains NUL")?;
    // SAFETY: NUL-terminated path; RTLD_LOCAL keeps its exports (dlsym
    // included) out of this process's global scope; it has no constructors.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        bail!("cannot load {}: {msg}", lib.display());
    }
    // SAFETY: valid handle and NUL-terminated name.
    let f = unsafe { libc::dlsym(h, c"vgpu_hook_table".as_ptr()) };
    if f.is_null() {
        bail!(
            "{} does not export vgpu_hook_table (not a libvgpu.so?)",
            lib.display()
        );
    }
    // SAFETY: the symbol is `extern "C" fn() -> *const c_char`.
    let f: extern "C" fn() -> *const c_char = unsafe { std::mem::transmute(f) };
    let p = f();
    if p.is_null() {
        bail!("{} returned no hook table", lib.display());
    }
    // SAFETY: a NUL-terminated string in the library's static memory
    // (the library stays loaded: never dlclosed).
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let lib = match args.lib {
        Some(l) => l,
        None => vgpu_sim::locate_artifact("libvgpu.so").context(
            "libvgpu.so not found (build it: cargo build -p vgpu-preload, or pass --lib)",
        )?,
    };
    let t = table(&lib)?;
    if args.tsv {
        out(&t);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<&str>> = t
        .lines()
        .map(|l| l.split('\t').collect())
        .filter(|r: &Vec<&str>| r.len() == 7)
        .collect();
    let head = [
        "export",
        "request",
        "cudaVersion",
        "ptds",
        "lib",
        "family",
        "policy",
    ];
    let mut w = [0usize; 6];
    for (i, h) in head.iter().take(6).enumerate() {
        w[i] = rows
            .iter()
            .map(|r| r[i].len())
            .chain([h.len()])
            .max()
            .unwrap_or(0);
    }
    let line = |r: &[&str]| {
        let mut s = String::new();
        for i in 0..6 {
            s.push_str(&format!("{:<1$}  ", r[i], w[i]));
        }
        s.push_str(r[6]);
        s
    };
    let mut text = format!("{}\n", line(&head));
    for r in &rows {
        let mut r = r.clone();
        if r[3] == "1" {
            r[3] = "yes";
        } else {
            r[3] = "";
        }
        if r[2] == "0" {
            r[2] = "-";
        }
        text.push_str(&line(&r));
        text.push('\n');
    }
    text.push_str(&format!(
        "\n{} hooks in {}; any other name resolves to the driver untouched.\n",
        rows.len(),
        lib.display()
    ));
    out(&text);
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a closed pipe (`vgpu hooks | head`) is not an error.
fn out(s: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(s.as_bytes());
}
