//! Helpers shared by the multi-process tests.
#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const WORKER: &str = env!("CARGO_BIN_EXE_vgpu-region-worker");

pub fn worker() -> Command {
    let mut c = Command::new(WORKER);
    c.env_remove(vgpu_region::failpoint::ENV);
    c
}

/// A file whose exclusive flock holds workers that wait for a shared one.
pub struct Gate {
    file: Option<File>,
    pub path: std::path::PathBuf,
}

impl Gate {
    pub fn closed(path: &Path) -> Gate {
        let f = File::create(path).unwrap();
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
        Gate {
            file: Some(f),
            path: path.to_owned(),
        }
    }

    pub fn open(&mut self) {
        self.file.take();
    }
}

/// Spawns with piped stdout.
pub fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped()).stderr(Stdio::inherit());
    c.spawn().expect("spawn worker")
}

pub fn read_line(r: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    s.trim().to_owned()
}

/// State letter of /proc/<pid>/stat ('T' when stopped).
pub fn proc_state(pid: u32) -> Option<u8> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    vgpu_region::ident::parse_stat(&t).map(|s| s.state)
}

/// Waits until the child is stopped (SIGSTOP at its fail point) or gone.
pub fn wait_stopped(c: &mut Child) -> bool {
    // Generous: a loaded CI machine may take long to schedule the worker.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return false;
        }
        if proc_state(c.id()) == Some(b'T') {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_micros(250));
    }
    panic!("worker {} neither stopped nor exited", c.id());
}

pub fn sigkill(c: &Child) {
    let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

/// Whether this test process is root (the permission tests need to make a
/// user and switch to it).
/// A test that cannot run here says why; under CI (`CI=true`, as root) a
/// skip is a failure, so a privileged test can never pass by not running.
pub fn skip(reason: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "cannot run under CI: {reason}"
    );
    eprintln!("SKIP: {reason}");
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A real non-root user made for the tests (`useradd`, once per machine;
/// concurrent test binaries may race for /etc/passwd's lock, so retry):
/// (uid, gid).
pub fn tenant_user() -> (u32, u32) {
    const NAME: &str = "vgpu-tenant";
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, NAME]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    for _ in 0..50 {
        if let (Some(u), Some(g)) = (id("-u"), id("-g")) {
            return (u, g);
        }
        let _ = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/usr/sbin/nologin", NAME])
            .output();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("cannot create the test user {NAME} (useradd)");
}

/// `program` run as the tenant user (through `setpriv`), without fail
/// points in its environment.
pub fn as_tenant(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let (u, g) = tenant_user();
    let mut c = Command::new("setpriv");
    c.args([
        format!("--reuid={u}"),
        format!("--regid={g}"),
        "--clear-groups".into(),
        "--".into(),
    ])
    .arg(program)
    .env_remove(vgpu_region::failpoint::ENV);
    c
}

/// A fresh directory under /tmp that the tenant can enter (mode 0755,
/// root's), removed on drop.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("vgpu-region-test")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs `f` on another thread; fails the test if it has not returned in
/// `secs` (an open that blocks on a FIFO would otherwise hang the run).
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("the call blocked (an open of a FIFO without O_NONBLOCK?)")
}

/// mkfifo(3), mode 0666.
pub fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
}
