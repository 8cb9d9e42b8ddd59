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
