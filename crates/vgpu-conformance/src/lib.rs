//! Test support for the C conformance clients in `conformance/`: find
//! NVIDIA's headers, compile a client with gcc against them (linked
//! `-lcuda -lnvidia-ml` as any CUDA program is), run it on a private
//! simulated machine and read its `PASS`/`FAIL` lines.
//!
//! The clients are the contract; this crate only drives them. Artifacts
//! (`libvgpu_sim_cuda.so`, `libvgpu_sim_nvml.so`) must be built first
//! (`cargo build --workspace`); the error says so when they are not.
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run {what}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed ({status}):\n{stderr}")]
    Failed {
        what: String,
        status: String,
        stderr: String,
    },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot link the simulated driver libraries")]
    Sim(#[source] vgpu_sim::SimError),
}

/// An error and its sources, one line (for test failure messages).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    vgpu_errors::chain(e)
}

/// The repository root (this crate lives in `crates/vgpu-conformance`).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().nth(2).unwrap_or(here).to_path_buf()
}

/// `conformance/` in the repository.
pub fn conformance_dir() -> PathBuf {
    repo_root().join("conformance")
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<Output, Error> {
    let out = cmd.output().map_err(|source| Error::Spawn {
        what: what.to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out)
}

/// NVIDIA's include directory: `$VGPU_NVIDIA_INCLUDE`, else what
/// `scripts/fetch-nvidia-headers` prints (it downloads the pinned wheels
/// once, then works offline).
pub fn nvidia_include() -> Result<PathBuf, Error> {
    if let Some(d) = std::env::var_os("VGPU_NVIDIA_INCLUDE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let script = repo_root().join("scripts/fetch-nvidia-headers");
    let out = run_checked(&mut Command::new(&script), "scripts/fetch-nvidia-headers")?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(dir))
}

/// The cudart request list: `$VGPU_CUDART_REQUESTS`, else the copy in
/// `conformance/data/`.
pub fn cudart_requests() -> PathBuf {
    match std::env::var_os("VGPU_CUDART_REQUESTS").filter(|d| !d.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => conformance_dir().join("data/cudart-12.9-getprocaddress-requests.txt"),
    }
}

/// The expected map generated from the headers by `gen-procaddress-map`.
pub fn procaddress_map() -> PathBuf {
    conformance_dir().join("data/cudart-12.9-procaddress-expected.txt")
}

/// Compile `conformance/<name>.c` (or `.cc`, with g++) into `out_dir/<name>` with gcc against
/// NVIDIA's headers, linked `-lcuda -lnvidia-ml` against dev links to the
/// built simulated-driver libraries. The binary records the
/// SONAMEs (`libcuda.so.1`, `libnvidia-ml.so.1`), so at run time it takes
/// whichever driver `LD_LIBRARY_PATH` or the system offers.
pub fn build(name: &str, out_dir: &Path) -> Result<PathBuf, Error> {
    build_with(name, out_dir, true)
}

/// [`build`], optionally without the driver libraries (for programs that
/// only read the headers, such as `layout`).
pub fn build_with(name: &str, out_dir: &Path, link_driver: bool) -> Result<PathBuf, Error> {
    let inc = nvidia_include()?;
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;
    // Dev links in a private directory: tests (threads or nextest
    // processes) build side by side and must not replace each other's.
    let links = tempfile::Builder::new()
        .prefix(".links-")
        .tempdir_in(out_dir)
        .map_err(io(out_dir))?;

    // C, or C++ where the client needs it (`<name>.cc`: thread_local
    // destructors).
    let cxx = conformance_dir().join(format!("{name}.cc"));
    let (src, compiler, std) = if cxx.exists() {
        (
            cxx,
            std::env::var_os("CXX").unwrap_or_else(|| "g++".into()),
            "-std=gnu++17",
        )
    } else {
        (
            conformance_dir().join(format!("{name}.c")),
            std::env::var_os("CC").unwrap_or_else(|| "gcc".into()),
            "-std=gnu11",
        )
    };
    let exe = out_dir.join(name);
    // Tests build in parallel: compile to a private name, then rename.
    let tmp = links.path().join(name);
    let mut cmd = Command::new(compiler);
    cmd.args([std, "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(&inc)
        .arg("-o")
        .arg(&tmp)
        .arg(&src);
    if link_driver {
        let lib = vgpu_sim::link_libs(links.path()).map_err(Error::Sim)?;
        cmd.arg("-L")
            .arg(&lib)
            // Every entry is a weak reference (check.h), which an
            // --as-needed linker does not count: keep the libraries.
            .args(["-Wl,--no-as-needed", "-lcuda", "-lnvidia-ml", "-ldl"]);
    }
    run_checked(&mut cmd, &format!("gcc {}", src.display()))?;
    std::fs::rename(&tmp, &exe).map_err(io(&exe))?;
    Ok(exe)
}

/// What one conformance program reported.
pub struct Report {
    pub program: String,
    pub success: bool,
    pub passed: usize,
    pub failed: usize,
    pub stdout: String,
    pub stderr: String,
}

impl Report {
    pub fn from_output(program: &str, out: &Output) -> Report {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let count = |p: &str| stdout.lines().filter(|l| l.starts_with(p)).count();
        Report {
            program: program.to_string(),
            success: out.status.success(),
            passed: count("PASS "),
            failed: count("FAIL "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout,
        }
    }

    /// The `FAIL` lines.
    pub fn failures(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("FAIL "))
            .collect()
    }

    /// Everything passed: exit 0, at least one PASS, no FAIL, and the
    /// summary line present (a crash half-way leaves no summary).
    pub fn ok(&self) -> bool {
        // One summary line per process that reported (a program may run a
        // second process of itself); together they count every PASS.
        let summaries: Vec<(usize, usize)> = self
            .stdout
            .lines()
            .filter_map(|l| {
                let (_, tail) = l.rsplit_once(": ")?;
                let (p, f) = tail.split_once(" passed, ")?;
                Some((p.parse().ok()?, f.strip_suffix(" failed")?.parse().ok()?))
            })
            .collect();
        let (p, f) = summaries
            .iter()
            .fold((0, 0), |(a, b), (p, f)| (a + p, b + f));
        self.success
            && self.failed == 0
            && self.passed > 0
            && !summaries.is_empty()
            && p == self.passed
            && f == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} passed, {} failed, exit ok: {}",
            self.program, self.passed, self.failed, self.success
        )?;
        for l in self.failures() {
            writeln!(f, "  {l}")?;
        }
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

/// How long one conformance program may run before it counts as hung (the
/// slowest, `nvml_view util`, needs a few seconds).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Run a built program with `env` added and collect its report; a program
/// still running after [`RUN_TIMEOUT`] is killed and reported as failed.
pub fn run(exe: &Path, args: &[&str], env: &[(String, String)]) -> Result<Report, Error> {
    run_for(exe, args, env, RUN_TIMEOUT)
}

/// [`run`] with an explicit time limit.
pub fn run_for(
    exe: &Path,
    args: &[&str],
    env: &[(String, String)],
    limit: Duration,
) -> Result<Report, Error> {
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let spawn_err = |source| Error::Spawn {
        what: exe.display().to_string(),
        source,
    };
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    // Drain both pipes on threads so a chatty program never blocks on a
    // full pipe while we wait for it.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err_t = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(spawn_err)? {
            break st;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().map_err(spawn_err)?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A grandchild (a worker the program forked) may still hold the pipes:
    // do not wait for it after a timeout.
    let (stdout, mut stderr) = if timed_out {
        (Vec::new(), Vec::new())
    } else {
        (
            out_t.join().unwrap_or_default(),
            err_t.join().unwrap_or_default(),
        )
    };
    if timed_out {
        stderr.extend_from_slice(format!("killed after {limit:?} (hung?)\n").as_bytes());
    }
    let out = Output {
        status,
        stdout,
        stderr,
    };
    Ok(Report::from_output(&name, &out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn out(code: i32, stdout: &str) -> Output {
        Output {
            status: ExitStatus::from_raw(code << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        }
    }

    #[test]
    fn report_needs_summary_and_no_failures() {
        let good = Report::from_output("p", &out(0, "PASS a\nPASS b\np: 2 passed, 0 failed\n"));
        assert!(good.ok());
        assert_eq!((good.passed, good.failed), (2, 0));
        let failed =
            Report::from_output("p", &out(1, "PASS a\nFAIL b: x\np: 1 passed, 1 failed\n"));
        assert!(!failed.ok());
        assert_eq!(failed.failures(), vec!["FAIL b: x"]);
        // A crash after some PASS lines: no summary, not ok even with exit 0.
        let crashed = Report::from_output("p", &out(0, "PASS a\n"));
        assert!(!crashed.ok());
        let nothing = Report::from_output("p", &out(0, "p: 0 passed, 0 failed\n"));
        assert!(
            !nothing.ok(),
            "a program that checked nothing is not a pass"
        );
    }

    #[test]
    fn a_hung_program_is_killed_and_fails() {
        let r = run_for(
            Path::new("/bin/sh"),
            &[
                "-c",
                "echo 'PASS x'; echo 'sh: 1 passed, 0 failed'; exec sleep 30",
            ],
            &[],
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(!r.ok() && !r.success, "{r}");
        assert!(r.stderr.contains("killed after"), "{r}");
    }

    #[test]
    fn output_is_collected() {
        let r = run(
            Path::new("/bin/sh"),
            &[
                "-c",
                "echo 'PASS a'; echo oops >&2; echo 'sh: 1 passed, 0 failed'",
            ],
            &[("X".into(), "1".into())],
        )
        .unwrap();
        assert!(r.ok(), "{r}");
        assert_eq!(r.stderr, "oops\n");
    }
}
