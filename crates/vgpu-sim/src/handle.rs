//! `SimHandle`: a private simulated machine for one test (own temp dir, own
//! daemon thread, stopped on drop), and artifact lookup.
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::config::{ConfigError, SimConfig};
use crate::daemon::{Daemon, DaemonError};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad sim options")]
    Config(#[from] ConfigError),
    #[error("cannot start the sim daemon")]
    Daemon(#[from] DaemonError),
    #[error("cannot create the sim's temporary directory")]
    TempDir(#[source] std::io::Error),
    #[error("artifact {name} not found (looked in: {searched}); build it with `cargo build --workspace`")]
    ArtifactNotFound { name: String, searched: String },
    #[error("cannot link {link} -> {target}")]
    Link {
        link: PathBuf,
        target: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot spawn the sim daemon thread")]
    Spawn(#[source] std::io::Error),
}

/// What `SimHandle::start` builds.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub config: SimConfig,
    /// Create `<dir>/lib` links to the built simulated-driver libraries
    /// (fails if they are not built).
    pub link_libs: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            config: SimConfig::default(),
            link_libs: true,
        }
    }
}

impl SimOptions {
    /// A named cost profile (`zero`, `a100-burst`).
    pub fn profile(name: &str) -> Result<SimOptions, ConfigError> {
        Ok(SimOptions {
            config: SimConfig::with_profile(name)?,
            ..SimOptions::default()
        })
    }

    /// A `config.toml` text (see docs/sim.md).
    pub fn from_toml(text: &str) -> Result<SimOptions, ConfigError> {
        Ok(SimOptions {
            config: SimConfig::parse_toml(text, "SimOptions", None)?,
            ..SimOptions::default()
        })
    }

    pub fn devices(mut self, n: u32) -> SimOptions {
        self.config.devices = n;
        self
    }
}

/// A running private simulated machine.
pub struct SimHandle {
    dir: tempfile::TempDir,
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
}

impl SimHandle {
    pub fn start(opts: SimOptions) -> Result<SimHandle, SimError> {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-sim-")
            .tempdir()
            .map_err(SimError::TempDir)?;
        if opts.link_libs {
            link_libs(dir.path())?;
        }
        let daemon = Daemon::bind(dir.path(), &opts.config)?;
        let (stop, stop_fd) = crate::daemon::stop_pair().map_err(SimError::Spawn)?;
        let thread = std::thread::Builder::new()
            .name("vgpu-simd".into())
            .spawn(move || daemon.serve(Some(stop_fd)))
            .map_err(SimError::Spawn)?;
        Ok(SimHandle {
            dir,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The machine's directory (`VGPU_SIM_DIR`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Environment for processes that should use this machine.
    pub fn env(&self) -> Vec<(String, String)> {
        let lib = self.dir.path().join("lib");
        let ld = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
            _ => lib.display().to_string(),
        };
        vec![
            ("VGPU_SIM_DIR".into(), self.dir.path().display().to_string()),
            ("LD_LIBRARY_PATH".into(), ld),
        ]
    }

    /// The machine's state, mapped (for assertions on what the sim recorded).
    pub fn state(&self) -> Result<crate::state::State, crate::state::StateError> {
        crate::state::State::open(&crate::daemon::state_path(self.dir.path()))
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(mut s) = self.stop.take() {
            let _ = s.write_all(b"x");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Find a built artifact: `$VGPU_ARTIFACT_DIR`, then the current
/// executable's directory and its parent (test binaries live in `deps/`).
pub fn locate_artifact(name: &str) -> Result<PathBuf, SimError> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("VGPU_ARTIFACT_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if let Some(p) = d.parent() {
                dirs.push(p.to_path_buf());
            }
        }
    }
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(SimError::ArtifactNotFound {
        name: name.to_string(),
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The cdylib names and the links `<dir>/lib` gets for each.
pub const LIB_LINKS: &[(&str, &[&str])] = &[
    ("libvgpu_sim_cuda.so", &["libcuda.so.1", "libcuda.so"]),
    (
        "libvgpu_sim_nvml.so",
        &["libnvidia-ml.so.1", "libnvidia-ml.so"],
    ),
];

/// Create `<dir>/lib/{libcuda.so.1,libcuda.so,libnvidia-ml.so.1,libnvidia-ml.so}`.
///
/// The built libraries are hard-linked (copied across filesystems) into
/// `<dir>/lib` and the driver names are symlinks to those: a rebuild in
/// `target/` then never changes a library under a running machine's
/// processes, which would otherwise load a half-written file.
pub fn link_libs(dir: &Path) -> Result<PathBuf, SimError> {
    let lib = dir.join("lib");
    let link_err = |link: &Path, target: &Path, source| SimError::Link {
        link: link.to_path_buf(),
        target: target.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(&lib).map_err(|e| link_err(&lib, &lib, e))?;
    for (artifact, links) in LIB_LINKS {
        let target = locate_artifact(artifact)?;
        let local = lib.join(artifact);
        // A fresh name each time: processes still using the old file keep it.
        let tmp = lib.join(format!(".{artifact}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        if std::fs::hard_link(&target, &tmp).is_err() {
            std::fs::copy(&target, &tmp).map_err(|e| link_err(&tmp, &target, e))?;
        }
        std::fs::rename(&tmp, &local).map_err(|e| link_err(&local, &tmp, e))?;
        // rename(2) of two links to one file does nothing: drop the spare.
        let _ = std::fs::remove_file(&tmp);
        for l in *links {
            let link = lib.join(l);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(artifact, &link).map_err(|e| link_err(&link, &local, e))?;
        }
    }
    Ok(lib)
}
