//! `vgpu sim env` as a user runs it: bounded config reads, and flags,
//! environment and an already running machine agreeing.
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const VGPU: &str = env!("CARGO_BIN_EXE_vgpu");

fn vgpu(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(VGPU);
    c.arg("sim").args(args).arg("--dir").arg(dir);
    for k in ["VGPU_SIM_PROFILE", "VGPU_SIM_CONFIG", "VGPU_SIM_DEVICES"] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c.output().expect("run vgpu")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A machine directory whose daemon is stopped when the test ends.
struct Machine(tempfile::TempDir);

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = vgpu(self.0.path(), &["stop"], &[]);
    }
}

fn machine() -> Machine {
    Machine(tempfile::tempdir().unwrap())
}

/// Runs `f` on a thread and fails if it takes longer than `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("vgpu sim env hung")
}

#[test]
fn config_from_a_device_or_a_fifo_is_refused_at_once() {
    let m = machine();
    let dir = m.0.path().to_path_buf();
    let d = dir.clone();
    let t0 = Instant::now();
    let o = within(20, move || {
        vgpu(&d, &["env", "--config", "/dev/urandom"], &[])
    });
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a regular file (a character device)"),
        "{}",
        stderr(&o)
    );
    let fifo = dir.join("config.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (d, f) = (dir.clone(), fifo.clone());
    let o = within(20, move || {
        vgpu(&d, &["env", "--config", f.to_str().unwrap()], &[])
    });
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("(a FIFO)"), "{}", stderr(&o));
    // The environment's config is read the same way.
    let (d, f) = (dir.clone(), fifo.clone());
    let o = within(20, move || {
        vgpu(&d, &["env"], &[("VGPU_SIM_CONFIG", f.to_str().unwrap())])
    });
    assert!(stderr(&o).contains("(a FIFO)"), "{}", stderr(&o));
    let big = dir.join("big.toml");
    std::fs::write(&big, "#".repeat(70_000)).unwrap();
    let o = vgpu(&dir, &["env", "--config", big.to_str().unwrap()], &[]);
    assert!(
        stderr(&o).contains("larger than 65536 bytes"),
        "{}",
        stderr(&o)
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    // Nothing was started by any of them.
    assert!(!dir.join("sock").exists());
}

#[test]
fn a_running_machine_is_reused_when_it_is_what_flags_or_environment_ask_for() {
    let m = machine();
    let dir = m.0.path();
    let o = vgpu(
        dir,
        &["env", "--profile", "a100-burst", "--devices", "2"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The same again, by flag or by environment: reused.
    for (args, env) in [
        (vec!["env", "--profile", "a100-burst"], vec![]),
        (vec!["env"], vec![("VGPU_SIM_PROFILE", "a100-burst")]),
        (vec!["env", "--devices", "2"], vec![]),
        (vec!["env"], vec![("VGPU_SIM_DEVICES", "2")]),
        (vec!["env"], vec![]),
    ] {
        let o = vgpu(dir, &args, &env);
        assert!(o.status.success(), "{args:?} {env:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("reusing the daemon"), "{}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("export VGPU_SIM_DIR="));
    }
    // Something else: refused, naming the field, the value and who asked.
    let o = vgpu(dir, &["env"], &[("VGPU_SIM_PROFILE", "zero")]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("cost.primary_retain_cold_us: running 31000, asked 0 (VGPU_SIM_PROFILE zero)"),
        "{e}"
    );
    let o = vgpu(
        dir,
        &["env", "--devices", "3"],
        &[("VGPU_SIM_DEVICES", "2")],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("devices: running 2, asked 3 (--devices 3)"),
        "{}",
        stderr(&o)
    );
    // A config file asks for the whole machine.
    let cfg = dir.join("asked.toml");
    std::fs::write(
        &cfg,
        "profile = \"a100-burst\"\ndevices = 2\n[device]\nsms = 108\n",
    )
    .unwrap();
    let o = vgpu(dir, &["env", "--config", cfg.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("device.sms: running 132, asked 108"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&cfg, "profile = \"a100-burst\"\ndevices = 2\n").unwrap();
    let o = vgpu(dir, &["env", "--config", cfg.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
}
