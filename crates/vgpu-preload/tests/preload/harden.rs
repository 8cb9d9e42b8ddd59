//! The budget holds on every path, the view shows only the container, and
//! failure closes: real processes under libvgpu.so on the simulated
//! driver, driven step by step through `tests/c/harden.c`.
use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use common::*;

/// A running `harden` client: one command in, one answer line out.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn start(env: &[(String, String)]) -> Client {
        let mut child = command(&c_program("harden"), &[], env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Client {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends `cmd`, returns its answer's `key=value` fields.
    fn ask(&mut self, cmd: &str) -> std::collections::BTreeMap<String, String> {
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(cmd.split_whitespace().next().unwrap()),
            "{cmd}: unexpected answer {line:?}"
        );
        line.split_whitespace()
            .filter_map(|t| t.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Sends `cmd` without waiting for its answer (read it with `recv`).
    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
    }

    /// The next answer line's fields.
    fn recv(&mut self) -> std::collections::BTreeMap<String, String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.split_whitespace()
            .filter_map(|t| t.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The CUresult of `cmd`.
    fn rc(&mut self, cmd: &str) -> u64 {
        num(&self.ask(cmd), "rc")
    }

    /// cuMemGetInfo_v2: (free, total).
    fn info(&mut self) -> (u64, u64) {
        let f = self.ask("info");
        assert_eq!(num(&f, "rc"), 0, "{f:?}");
        (num(&f, "free"), num(&f, "total"))
    }

    /// Ends the process; its stderr.
    fn quit(mut self) -> String {
        let _ = writeln!(self.stdin, "quit");
        let out = self.child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

const OK: u64 = 0;
const OOM: u64 = 2;

fn write_limits(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A region for the sim's devices, a limits file beside it, and the env of
/// a process that names both.
fn setup(dir: &Path, region_limits: &[u64]) -> (PathBuf, PathBuf) {
    let cache = dir.join("r.cache");
    region_at(&cache, region_limits);
    (cache, dir.join("limits"))
}

#[test]
fn the_limits_file_wins_over_env_and_region_and_changes_apply_live() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    // The region's display copy says 2 GiB, the environment 1 GiB; the
    // operator's file says 256 MiB: the file wins.
    let (cache, file) = setup(dir.path(), &[2 * GIB]);
    write_limits(&file, "vgpu-limits 1\ndevice * memory=268435456\n");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    assert_eq!(c.info().1, 256 * MIB);
    assert_eq!(c.rc(&format!("alloc {}", 256 * MIB)), OK);
    assert_eq!(c.rc("alloc 1"), OOM);
    // A monitor of the same container (NVML only, no context).
    let mut monitor = Client::start(&e);
    assert_eq!(num(&monitor.ask("nvmlprocs"), "total"), 256 * MIB);
    // A tenant writing the mapped header changes nothing that is enforced.
    let r = vgpu_region::Region::open(&cache).unwrap();
    r.set_limits(0, vgpu_region::Limits { mem: 0, sm: 0 });
    assert_eq!(c.rc("alloc 1"), OOM, "the header is not a limit source");
    assert_eq!(c.info().1, 256 * MIB);
    // The operator raises the limit: the file changes, the generation moves.
    write_limits(&file, "vgpu-limits 1\ndevice * memory=536870912\n");
    r.bump_limits_generation().unwrap();
    assert_eq!(c.rc(&format!("alloc {}", 256 * MIB)), OK, "raised live");
    assert_eq!(c.rc("alloc 1"), OOM);
    assert_eq!(c.info().1, 512 * MIB);
    assert_eq!(
        num(&monitor.ask("nvmlprocs"), "total"),
        512 * MIB,
        "the monitor follows too"
    );
    monitor.quit();
    // A corrupted file fails closed on the last good limits, loudly.
    write_limits(&file, "vgpu-limits 1\ndevice * memory=lots\n");
    r.bump_limits_generation().unwrap();
    assert_eq!(c.rc("alloc 1"), OOM, "still 512 MiB, never unlimited");
    assert_eq!(c.info().1, 512 * MIB);
    let stderr = c.quit();
    assert!(
        stderr.contains("failing closed") && stderr.contains("last limits"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" warn:") && l.contains("the limits file wins")),
        "a mismatch between the region and the file is a warning: {stderr}"
    );
}

#[test]
fn an_unusable_limits_file_admits_nothing_without_another_limit() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let file = dir.path().join("limits");
    write_limits(&file, "vgpu-limits 7\n");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    assert_eq!(c.rc("alloc 1"), OOM);
    assert_eq!(c.info(), (0, 0), "the view is the zero budget enforced");
    let stderr = c.quit();
    assert!(stderr.contains("zero budget"), "{stderr}");
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

/// Runs `limits fill 256m` under a 256 MiB environment limit against the
/// region at `cache` (through `sh -c` in a private mount namespace when
/// `prelude` is given) and checks it failed closed for `cause`: exactly
/// the limit admitted, the view agreeing (fill measures through
/// cuMemGetInfo), one loud line naming the cause.
fn assert_fails_closed(cause: &str, cache: &Path, prelude: Option<&str>) {
    let s = sim(1);
    let e = env(
        &s,
        Some(cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "256m"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let prog = c_program("limits");
    let lim = (256 * MIB).to_string();
    let out = match prelude {
        None => run(&prog, &["fill", &lim], &e),
        Some(p) => {
            let script = format!("{p} && exec '{}' fill {lim}", prog.display());
            command(
                Path::new("unshare"),
                &["--mount", "--propagation", "private", "sh", "-c", &script],
                &e,
            )
            .output()
            .unwrap()
        }
    };
    assert_passed(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let loud: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("FAILING CLOSED"))
        .collect();
    assert_eq!(loud.len(), 1, "{cause}: one line\n{stderr}");
    assert!(
        loud[0].contains(&format!("region unusable ({cause})")) && loud[0].contains(" error:"),
        "{cause}: {stderr}"
    );
    assert!(!stderr.contains("NOT enforced"), "{cause}: {stderr}");
}

#[test]
fn every_unusable_region_fails_closed_on_a_private_ledger() {
    let dir = tempfile::tempdir().unwrap();
    // A leftover HAMi-core 1.2 cache at the same path (a real migration case).
    let hami = dir.path().join("hami.cache");
    let mut b = vec![0u8; 1 << 20];
    b[..4].copy_from_slice(&19_920_718i32.to_ne_bytes());
    put_u32(&mut b, 4, 1);
    put_u32(&mut b, 8, 2);
    std::fs::write(&hami, &b).unwrap();
    assert_fails_closed("hami-region", &hami, None);
    assert_eq!(std::fs::read(&hami).unwrap(), b, "left as it was");
    // Ours, but corrupt (slot count zeroed).
    let good = dir.path().join("good.cache");
    region_at(&good, &[GIB]);
    let mut bytes = std::fs::read(&good).unwrap();
    put_u32(&mut bytes, 28, 0);
    let corrupt = dir.path().join("corrupt.cache");
    std::fs::write(&corrupt, &bytes).unwrap();
    assert_fails_closed("corrupt", &corrupt, None);
    // Every slot held by a live process (this one).
    let full = dir.path().join("full.cache");
    let opts = vgpu_region::CreateOptions {
        slots: 2,
        devices: vec![vgpu_region::DeviceConfig {
            uuid: vgpu_sim::Machine::device_uuid_string(0),
            mem_limit: 256 * MIB,
            sm_limit: 0,
        }],
    };
    let (r, _) = vgpu_region::Region::open_or_create(&full, &opts).unwrap();
    r.register().unwrap();
    r.register().unwrap();
    assert_fails_closed("full", &full, None);
    // The PID-namespace table full of other namespaces.
    let ns = dir.path().join("ns.cache");
    region_at(&ns, &[256 * MIB]);
    let mut bytes = std::fs::read(&ns).unwrap();
    for i in 0..64u64 {
        let off = 136 + 8 * i as usize;
        bytes[off..off + 8].copy_from_slice(&(0xdead_0000 + i).to_ne_bytes());
    }
    std::fs::write(&ns, &bytes).unwrap();
    assert_fails_closed("namespace-table-full", &ns, None);
    // Not writable by the process (a read-only mount of its directory).
    let ro = tempfile::tempdir().unwrap();
    let rcache = ro.path().join("r.cache");
    region_at(&rcache, &[GIB]);
    let d = ro.path().display();
    assert_fails_closed(
        "permission",
        &rcache,
        Some(&format!(
            "mount --bind '{d}' '{d}' && mount -o remount,ro,bind '{d}'"
        )),
    );
}

#[test]
fn a_first_process_without_a_limit_no_longer_decides_for_later_ones() {
    // The first process's limit was malformed: the region records none.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let mut first = Client::start(&e);
    assert_eq!(first.rc("init"), OK);
    assert_eq!(vgpu_region::Region::open(&cache).unwrap().limits(0).mem, 0);
    // A later, correctly configured process keeps its own limit, and says
    // at warning level that the region disagrees.
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "128m"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let mut later = Client::start(&e);
    assert_eq!(later.rc("init"), OK);
    assert_eq!(later.info().1, 128 * MIB);
    assert_eq!(later.rc(&format!("alloc {}", 128 * MIB)), OK);
    assert_eq!(later.rc("alloc 1"), OOM);
    let stderr = later.quit();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" warn:") && l.contains("records a memory limit of none")),
        "{stderr}"
    );
    first.quit();
}

#[test]
fn legacy_v1_entry_points_are_charged_and_show_the_view_on_every_route() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let ctx = 64 * MIB;
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "64m"),
        ],
    );
    for route in ["direct", "dlsym", "proc"] {
        let mut c = Client::start(&e);
        assert_eq!(c.rc("init"), OK, "{route}");
        let base = ctx; // the primary context
        assert_eq!(c.info(), (GIB - base, GIB), "{route}");
        // cuMemAlloc (v1): charged, and the budget holds.
        assert_eq!(
            c.rc(&format!("v1alloc {route} {}", 512 * MIB)),
            OK,
            "{route}"
        );
        assert_eq!(c.info().0, GIB - base - 512 * MIB, "{route}: charged");
        assert_eq!(
            c.rc(&format!("v1alloc {route} {}", 512 * MIB)),
            OOM,
            "{route}: over the budget"
        );
        // The v1 views show the same budget.
        let i = c.ask(&format!("v1info {route}"));
        assert_eq!(num(&i, "rc"), OK, "{route} {i:?}");
        assert_eq!(num(&i, "total"), GIB, "{route} {i:?}");
        assert_eq!(num(&i, "free"), GIB - base - 512 * MIB, "{route} {i:?}");
        let t = c.ask(&format!("v1total {route}"));
        assert_eq!(num(&t, "total"), GIB, "{route} {t:?}");
        // cuMemFree (v1) gives it back.
        assert_eq!(c.rc(&format!("v1free {route}")), OK, "{route}");
        assert_eq!(c.info().0, GIB - base, "{route}: released");
        // cuMemAllocPitch (v1): pitch x height.
        let p = c.ask(&format!("v1pitch {route} 1000 1024"));
        assert_eq!(num(&p, "rc"), OK, "{route} {p:?}");
        let pitched = num(&p, "pitch") * 1024;
        assert_eq!(c.info().0, GIB - base - pitched, "{route}: pitch charged");
        assert_eq!(c.rc(&format!("v1free {route}")), OK);
        // cuArrayCreate / cuArray3DCreate (v1): float texels.
        assert_eq!(c.rc(&format!("v1array {route} 4096 4096")), OK, "{route}");
        assert_eq!(c.info().0, GIB - base - 64 * MIB, "{route}: 2D array");
        assert_eq!(c.rc(&format!("v1array3d {route} 1024 1024 32")), OK);
        assert_eq!(c.info().0, GIB - base - 64 * MIB - 128 * MIB, "{route}: 3D");
        assert_eq!(c.rc("arrfree"), OK);
        assert_eq!(c.rc("arrfree"), OK);
        assert_eq!(c.info().0, GIB - base, "{route}: arrays released");
        // cuCtxCreate (v1): the context estimate, back at destroy.
        assert_eq!(c.rc(&format!("v1ctx {route}")), OK, "{route}");
        assert_eq!(c.info().0, GIB - base - ctx, "{route}: context charged");
        assert_eq!(c.rc("ctxfree"), OK);
        assert_eq!(c.info().0, GIB - base, "{route}: context released");
        c.quit();
    }
}

#[test]
fn sizes_no_counter_can_hold_are_refused_and_nothing_wraps() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let file = dir.path().join("limits");
    // No limit anywhere (yet): an unlimited region, and a limits file
    // named but not written.
    let e = env(
        &s,
        Some(&cache),
        &[
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    assert_eq!(c.rc(&format!("alloc {GIB}")), OK);
    let r = vgpu_region::Region::open(&cache).unwrap();
    assert_eq!(r.device_used(0), GIB);
    for huge in [u64::MAX, u64::MAX - GIB + 1, (1 << 56) + 1] {
        assert_eq!(c.rc(&format!("alloc {huge}")), OOM, "{huge}");
        assert_eq!(r.device_used(0), GIB, "{huge}: the counters did not wrap");
    }
    // A pitched allocation whose width x height cannot be represented.
    let p = c.ask(&format!("v1pitch direct {} {}", u32::MAX, u32::MAX));
    assert_ne!(num(&p, "rc"), OK, "{p:?}");
    assert_eq!(r.device_used(0), GIB);
    // The operator sets 1.5 GiB live: what is held counts in full.
    write_limits(&file, "vgpu-limits 1\ndevice * memory=1610612736\n");
    r.bump_limits_generation().unwrap();
    assert_eq!(
        c.rc(&format!("alloc {GIB}")),
        OOM,
        "1 GiB held + 1 GiB > 1.5 GiB"
    );
    assert_eq!(c.rc(&format!("alloc {}", GIB / 2)), OK);
    assert_eq!(r.device_used(0), GIB + GIB / 2);
    c.quit();
}

#[test]
fn a_vmm_handle_released_while_mapped_stays_charged_until_unmapped() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    let base = s.state().unwrap().used_bytes(0);
    assert_eq!(c.rc(&format!("vmm {}", 256 * MIB)), OK);
    assert_eq!(c.rc("vmmrelease"), OK);
    // The driver still holds it (mapped), and so does the ledger.
    assert_eq!(s.state().unwrap().used_bytes(0) - base, 256 * MIB);
    assert_eq!(c.info().0, 256 * MIB, "charged while mapped");
    assert_eq!(c.rc(&format!("vmm {}", 384 * MIB)), OOM, "the budget holds");
    assert_eq!(c.rc("vmmunmap"), OK);
    assert_eq!(s.state().unwrap().used_bytes(0), base);
    assert_eq!(c.info().0, 512 * MIB, "released with the last mapping");
    assert_eq!(c.rc(&format!("vmm {}", 384 * MIB)), OK);
    c.quit();
}

#[test]
fn budgets_are_per_physical_device_whatever_order_a_process_sees() {
    let s = sim(2);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let u = |i| vgpu_sim::Machine::device_uuid_string(i);
    let file = dir.path().join("limits");
    write_limits(
        &file,
        &format!(
            "vgpu-limits 1\ndevice {} memory=1073741824\ndevice {} memory=536870912\n",
            u(0),
            u(1)
        ),
    );
    let e = |visible: &str| {
        env(
            &s,
            Some(&cache),
            &[
                ("CUDA_VISIBLE_DEVICES", visible),
                ("LIBVGPU_CONTEXT_MEMORY", "0"),
                ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
            ],
        )
    };
    // The first process sees the GPUs swapped (and creates the region in
    // its own order).
    let mut a = Client::start(&e("1,0"));
    assert_eq!(a.rc("init"), OK);
    // Its ordinal 0 is physical GPU 1 (512 MiB), ordinal 1 is GPU 0 (1 GiB).
    assert_eq!(a.info().1, 512 * MIB);
    assert_eq!(a.rc(&format!("alloc {}", 256 * MIB)), OK);
    assert_eq!(a.rc("ctx 1"), OK);
    assert_eq!(a.info().1, GIB);
    assert_eq!(a.rc(&format!("alloc {GIB}")), OK, "GPU 0's whole budget");
    assert_eq!(a.rc("alloc 1"), OOM);
    let r = vgpu_region::Region::open(&cache).unwrap();
    let (i0, i1) = (
        r.device_index(&u(0)).unwrap(),
        r.device_index(&u(1)).unwrap(),
    );
    assert_eq!(r.device_used(i0), GIB, "GPU 0 holds its budget, not more");
    assert_eq!(r.device_used(i1), 256 * MIB);
    // A process that sees only GPU 1: not refused because GPU 0 is full.
    let mut b = Client::start(&e("1"));
    assert_eq!(b.rc("init"), OK);
    assert_eq!(b.info(), (256 * MIB, 512 * MIB));
    assert_eq!(b.rc(&format!("alloc {}", 256 * MIB)), OK);
    assert_eq!(b.rc("alloc 1"), OOM);
    assert_eq!(r.device_used(i1), 512 * MIB);
    assert_eq!(r.device_used(i0), GIB);
    // The physical devices agree.
    let st = s.state().unwrap();
    assert!(st.used_bytes(0) >= GIB && st.used_bytes(1) >= 512 * MIB);
    // An NVML-only process (a monitor) seeing them swapped: each index
    // shows its physical device's budget and usage.
    let out = run(&c_program("limits"), &["nvml"], &e("1,0"));
    let f = facts(&out);
    assert_eq!(num(&f, "nvml.0.total"), 512 * MIB, "{f:?}");
    assert_eq!(num(&f, "nvml.0.used"), 512 * MIB, "{f:?}");
    assert_eq!(num(&f, "nvml.1.total"), GIB, "{f:?}");
    assert_eq!(num(&f, "nvml.1.used"), GIB, "{f:?}");
    b.quit();
    a.quit();
}

#[test]
fn charges_land_on_the_physical_device_by_uuid_with_env_limits() {
    let s = sim(2);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let r = region_at(&cache, &[GIB, GIB]);
    let mut a = Client::start(&env(
        &s,
        Some(&cache),
        &[
            ("CUDA_VISIBLE_DEVICES", "1,0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    ));
    assert_eq!(a.rc("init"), OK);
    // Ordinal 0 is physical GPU 1.
    assert_eq!(a.rc(&format!("alloc {}", 768 * MIB)), OK);
    assert_eq!((r.device_used(0), r.device_used(1)), (0, 768 * MIB));
    assert_eq!(a.rc(&format!("alloc {}", 512 * MIB)), OOM, "GPU 1's budget");
    assert_eq!(a.rc("ctx 1"), OK);
    assert_eq!(a.rc(&format!("alloc {GIB}")), OK, "GPU 0 is untouched");
    assert_eq!((r.device_used(0), r.device_used(1)), (GIB, 768 * MIB));
    a.quit();
}

#[test]
fn a_context_teardown_releases_what_the_driver_freed_with_it() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    let base = s.state().unwrap().used_bytes(0);
    let r = vgpu_region::Region::open(&cache).unwrap();
    // Allocations in the primary context, and one in a created context.
    assert_eq!(c.rc(&format!("alloc {}", 256 * MIB)), OK);
    assert_eq!(c.rc("v1array direct 4096 4096"), OK);
    assert_eq!(c.rc("v1ctx direct"), OK);
    assert_eq!(c.rc(&format!("ctxalloc {}", 128 * MIB)), OK);
    assert_eq!(r.device_used(0), (256 + 64 + 128) * MIB);
    // The primary context's reset frees its allocations and arrays: their
    // charges go; the created context's stays.
    assert_eq!(c.rc("reset 0"), OK);
    assert_eq!(s.state().unwrap().used_bytes(0) - base, 128 * MIB);
    assert_eq!(
        r.device_used(0),
        128 * MIB,
        "what the reset freed is released"
    );
    // Destroying the created context frees (and releases) the rest.
    assert_eq!(c.rc("ctxfree"), OK);
    assert_eq!(r.device_used(0), 0);
    assert_eq!(s.state().unwrap().used_bytes(0), base);
    // The whole budget is there again.
    assert_eq!(c.rc("ctx 0"), OK);
    assert_eq!(c.rc(&format!("alloc {GIB}")), OK);
    c.quit();
}

/// One process, one slot, always: 32 threads make their first CUDA call at
/// once, in a fresh process each round (both when the region exists and
/// when the race also creates it; attaching inside cuInit or, by default,
/// at the first view).
#[test]
fn thirty_two_threads_racing_the_first_call_claim_one_slot() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    for round in 0..300 {
        let cache = dir.path().join(format!("r{}.cache", round % 2));
        if round % 2 == 0 {
            // Even rounds: the racing threads also create the region.
            let _ = std::fs::remove_file(&cache);
        }
        let attach = if (round / 2) % 2 == 1 {
            "eager"
        } else {
            "lazy"
        };
        let e = env(
            &s,
            Some(&cache),
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("LIBVGPU_CONTEXT_MEMORY", "0"),
                ("LIBVGPU_ATTACH", attach),
            ],
        );
        let mut c = Client::start(&e);
        assert_eq!(c.ask("race 32").len(), 0);
        let pid = c.child.id();
        let r = vgpu_region::Region::open(&cache).unwrap();
        let mine = r.snapshot().slots.iter().filter(|sl| sl.pid == pid).count();
        if mine != 1 {
            let err = c.quit();
            panic!("round {round} ({attach}): {mine} slots\n{err}");
        }
        assert_eq!(c.rc("init"), OK);
        assert_eq!(c.rc(&format!("alloc {GIB}")), OK, "round {round}");
        assert_eq!(r.device_used(0), GIB, "round {round}: charged once");
        assert_eq!(c.rc("free"), OK);
        assert_eq!(r.device_used(0), 0, "round {round}");
        c.quit();
        assert_eq!(r.live_slots(), 0, "round {round}: released at exit");
    }
}

#[test]
fn nvml_shows_the_containers_processes_and_activity_not_the_neighbours() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    // Two containers on one GPU, each with its own region.
    let (ra, rb) = (dir.path().join("a.cache"), dir.path().join("b.cache"));
    let e = |cache: &Path| {
        env(
            &s,
            Some(cache),
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("LIBVGPU_CONTEXT_MEMORY", "256m"),
            ],
        )
    };
    // The neighbour: 3 GiB and busy.
    let mut a = Client::start(&e(&ra));
    assert_eq!(a.rc("init"), OK);
    assert_eq!(a.rc(&format!("alloc {}", 3 * GIB)), OK);
    // Ours: 768 MiB plus its context.
    let mut b = Client::start(&e(&rb));
    assert_eq!(b.rc("init"), OK);
    assert_eq!(b.rc(&format!("alloc {}", 768 * MIB)), OK);
    a.send("burn 1500");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let f = b.ask("nvmlprocs");
    let burned = a.recv();
    assert_eq!(num(&burned, "rc"), OK, "{burned:?}");
    assert!(num(&burned, "launches") > 50, "{burned:?}");
    assert_eq!(num(&f, "rc"), OK, "{f:?}");
    assert_eq!(num(&f, "count"), 1, "only our process: {f:?}");
    assert_eq!(num(&f, "pid0"), u64::from(b.child.id()), "{f:?}");
    // The list agrees with the memory info (context charge included).
    assert_eq!(num(&f, "mem0"), GIB, "{f:?}");
    assert_eq!(num(&f, "sum"), num(&f, "used"), "{f:?}");
    // The neighbour's activity is not ours.
    assert_eq!(num(&f, "util_rc"), OK, "{f:?}");
    assert_eq!(num(&f, "gpu"), 0, "an idle container: {f:?}");
    // The busy container sees its own processes and activity.
    a.send("burn 1500");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let mut a2 = Client::start(&e(&ra));
    let g = a2.ask("nvmlprocs");
    assert_eq!(num(&a.recv(), "rc"), OK);
    assert_eq!(num(&g, "count"), 1, "{g:?}");
    assert_eq!(num(&g, "pid0"), u64::from(a.child.id()), "{g:?}");
    assert_eq!(num(&g, "mem0"), 3 * GIB + 256 * MIB, "{g:?}");
    assert!(num(&g, "gpu") > 0, "{g:?}");
    a2.quit();
    b.quit();
    a.quit();
}

/// The property on the simulated driver, with real processes: random
/// sequences across the families and both ABIs (every v1 route), and after
/// every call the ledger equals what the driver holds for the process.
#[test]
fn the_ledger_equals_what_the_simulated_driver_holds() {
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=4u64 {
        let cache = dir.path().join(format!("r{seed}.cache"));
        let e = env(
            &s,
            Some(&cache),
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ],
        );
        let mut c = Client::start(&e);
        assert_eq!(c.rc("init"), OK);
        let r = vgpu_region::Region::open(&cache).unwrap();
        let base = s.state().unwrap().used_bytes(0);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let routes = ["direct", "dlsym", "proc"];
        for step in 0..80 {
            let route = routes[next(3) as usize];
            let mib = (1 + next(96)) * MIB;
            let cmd = match next(12) {
                0 | 1 => format!("alloc {mib}"),
                2 => "free".to_string(),
                3 | 4 => format!("v1alloc {route} {mib}"),
                5 => format!("v1free {route}"),
                6 => format!("v1pitch {route} {} {}", 1000 + next(4000), 1 + next(8000)),
                7 => format!("v1array {route} {} {}", 1 + next(4096), 1 + next(4096)),
                8 => format!(
                    "v1array3d {route} {} {} {}",
                    1 + next(512),
                    1 + next(512),
                    1 + next(16)
                ),
                9 => "arrfree".to_string(),
                10 => format!("vmm {}", (1 + next(48)) * 2 * MIB),
                _ => if next(2) == 0 {
                    "vmmrelease"
                } else {
                    "vmmunmap"
                }
                .to_string(),
            };
            c.ask(&cmd);
            let held = s.state().unwrap().used_bytes(0) - base;
            assert_eq!(
                r.device_used(0),
                held,
                "seed {seed} step {step}: {cmd}: the ledger and the driver disagree"
            );
            assert!(
                r.device_used(0) <= GIB,
                "seed {seed} step {step}: over the budget"
            );
        }
        c.quit();
        assert_eq!(r.device_used(0), 0, "seed {seed}: released at exit");
    }
}

// ------------------------------------------------- a hostile tenant (issue 18)

/// Writes `bytes` at `off` into the region file, as a tenant writing the
/// mapped file does (every process of the container may).
fn tamper(cache: &Path, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(cache).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Allocates `chunk` until refused (at most `max` times); the count granted.
fn fill(c: &mut Client, chunk: u64, max: u32) -> u32 {
    let mut n = 0;
    while n < max && c.rc(&format!("alloc {chunk}")) == OK {
        n += 1;
    }
    n
}

#[test]
fn a_rewritten_region_header_widens_no_limit() {
    // Before: device_count = 0 (4 bytes) made every device "not described",
    // hence unlimited: 8 of 8 x 4 GiB granted under 1 GiB and the view the
    // whole physical GPU. A rewritten UUID did the same.
    let limit = GIB;
    for (what, off, bytes) in [
        ("device_count = 0", 32u64, 0u32.to_ne_bytes().to_vec()),
        ("device UUID rewritten", 0, b"GPU-not-this-one\0".to_vec()),
    ] {
        let s = sim(1);
        let dir = tempfile::tempdir().unwrap();
        let (cache, file) = setup(dir.path(), &[limit]);
        write_limits(&file, "vgpu-limits 1\ndevice * memory=1073741824\n");
        let off = if off == 0 {
            // The first device record's UUID.
            std::mem::offset_of!(vgpu_region::layout::RawHeader, devices) as u64
        } else {
            off
        };
        tamper(&cache, off, &bytes);
        let e = env(
            &s,
            Some(&cache),
            &[
                ("LIBVGPU_CONTEXT_MEMORY", "0"),
                ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
            ],
        );
        let mut c = Client::start(&e);
        assert_eq!(c.rc("init"), OK);
        assert_eq!(
            c.info().1,
            limit,
            "{what}: the view is the configured limit"
        );
        assert_eq!(fill(&mut c, 4 * GIB, 8), 0, "{what}: 4 GiB under 1 GiB");
        assert_eq!(fill(&mut c, 256 * MIB, 8), 4, "{what}: exactly the limit");
        let stderr = c.quit();
        assert!(stderr.contains("FAILING CLOSED"), "{what}: {stderr}");
    }
}

#[test]
fn a_narrower_first_process_leaves_no_device_unlimited() {
    // Before: the first process ran with CUDA_VISIBLE_DEVICES=0, so the
    // region it created describes GPU 0 only; a later process on GPU 1 ran
    // unlimited there (3 GiB under 1 GiB), with or without a limits file.
    for with_file in [false, true] {
        let s = sim(2);
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("r.cache");
        let file = dir.path().join("limits");
        let mut extra = vec![
            ("LIBVGPU_CONTEXT_MEMORY", "0".to_string()),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g".to_string()),
        ];
        if with_file {
            write_limits(&file, "vgpu-limits 1\ndevice * memory=1073741824\n");
            extra.push(("LIBVGPU_LIMITS_FILE", file.display().to_string()));
        }
        let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut first_env = extra.clone();
        first_env.push(("CUDA_VISIBLE_DEVICES", "0"));
        let mut first = Client::start(&env(&s, Some(&cache), &first_env));
        assert_eq!(first.rc("init"), OK);
        let mut c = Client::start(&env(&s, Some(&cache), &extra));
        assert_eq!(c.rc("init"), OK);
        assert_eq!(c.rc("ctx 1"), OK);
        assert_eq!(c.info().1, GIB, "file={with_file}: GPU 1's view");
        assert_eq!(fill(&mut c, 512 * MIB, 6), 2, "file={with_file}: GPU 1");
        // GPU 0 is still the shared budget.
        assert_eq!(c.rc("ctx 0"), OK);
        assert_eq!(first.rc(&format!("alloc {}", 768 * MIB)), OK);
        assert_eq!(c.rc(&format!("alloc {}", 512 * MIB)), OOM);
        c.quit();
        first.quit();
    }
}

#[test]
fn an_unusable_operators_file_is_never_replaced_by_the_tenants_environment() {
    // Before: with the operator's file unusable the tenant's own
    // CUDA_DEVICE_MEMORY_LIMIT applied (`1t`: effectively unlimited), and
    // an existing /etc/vgpu with no file in it ran unlimited.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("r.cache");
    let etc = dir.path().join("etc-vgpu");
    std::fs::create_dir(&etc).unwrap();
    let default = etc.join("limits");
    let own = dir.path().join("own-limits");
    write_limits(&own, "vgpu-limits 1\ndevice * memory=1099511627776\n");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1t"),
            ("LIBVGPU_LIMITS_FILE", own.to_str().unwrap()),
            (
                "LIBVGPU_FAILPOINT_LIMITS_DEFAULT",
                default.to_str().unwrap(),
            ),
        ],
    );
    for (what, content) in [("missing", None), ("unusable", Some("vgpu-limits 9\n"))] {
        if let Some(t) = content {
            write_limits(&default, t);
        }
        let mut c = Client::start(&e);
        assert_eq!(c.rc("init"), OK);
        assert_eq!(c.rc("alloc 1"), OOM, "{what}: a zero budget");
        assert_eq!(c.info(), (0, 0), "{what}");
        let stderr = c.quit();
        assert!(stderr.contains("zero budget"), "{what}: {stderr}");
    }
    // The operator writes a good file: it applies, the env only lowers it.
    write_limits(&default, "vgpu-limits 1\ndevice * memory=1073741824\n");
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    assert_eq!(c.info().1, GIB);
    c.quit();
}

#[test]
fn a_tenant_zeroing_its_slot_counters_is_admitted_against_what_it_holds() {
    // Before: the tenant held 1 GiB (its whole budget), zeroed its slot's
    // counters in the mapped file, and was granted 512 MiB more (1.5 GiB
    // under 1 GiB).
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let (cache, file) = setup(dir.path(), &[GIB]);
    write_limits(&file, "vgpu-limits 1\ndevice * memory=1073741824\n");
    let e = env(
        &s,
        Some(&cache),
        &[
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
            ("LIBVGPU_LIMITS_FILE", file.to_str().unwrap()),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    assert_eq!(c.rc(&format!("alloc {GIB}")), OK);
    let slots = 64; // region_at's
    let off = vgpu_region::layout::totals_offset(slots);
    let len = vgpu_region::layout::totals_len(slots) as usize;
    tamper(&cache, off, &vec![0u8; len]);
    assert_eq!(
        c.rc(&format!("alloc {}", 512 * MIB)),
        OOM,
        "1.5 GiB under 1 GiB"
    );
    assert_eq!(c.rc("free"), OK);
    assert_eq!(
        c.rc(&format!("alloc {GIB}")),
        OK,
        "and the budget is whole again"
    );
    let stderr = c.quit();
    assert!(stderr.contains("written down"), "{stderr}");
}

#[test]
fn no_lookup_function_reaches_past_the_hooks() {
    // Before: dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34") handed out
    // glibc's own dlsym, and through it cuMemAlloc_v2 unhooked: 8 of 8 x
    // 256 MiB granted under 1 GiB. After: 4 on every route.
    let s = sim(1);
    let e = env(
        &s,
        None,
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut e = e;
    e.push((
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
        dir.path().join("r.cache").display().to_string(),
    ));
    let out = run(&c_program("dlvsym"), &[], &e);
    let f = facts(&out);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        f.get("dlsym_is_ours").map(String::as_str),
        Some("1"),
        "{f:?}"
    );
    for route in [
        "dlvsym_default_2_34",
        "dlvsym_default_base",
        "dlvsym_libc",
        "dlsym_libc",
        "dlvsym_libc_dlvsym",
        "direct",
    ] {
        assert_eq!(num(&f, route), 4, "{route}: {f:?}");
    }
    // A driver name by version: routed when the driver's symbols are
    // unversioned (glibc then answers any version), absent otherwise.
    let by_version = f.get("dlvsym_driver_name").map(String::as_str);
    assert!(matches!(by_version, Some("4" | "missing")), "{f:?}");
}

// ---------------------------------------------- graph memory (issue 18 §2)

/// A process of a container with a 1 GiB budget and no context estimate;
/// (client, region, the sim's device 0 use before it allocated anything).
fn graph_client(s: &SimHandle, cache: &Path) -> (Client, vgpu_region::Region, u64) {
    let e = env(
        s,
        Some(cache),
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("LIBVGPU_CONTEXT_MEMORY", "0"),
        ],
    );
    let mut c = Client::start(&e);
    assert_eq!(c.rc("init"), OK);
    let r = vgpu_region::Region::open(cache).unwrap();
    let base = s.state().unwrap().used_bytes(0);
    (c, r, base)
}

/// What the simulated driver holds for the process on device 0.
fn held(s: &SimHandle, base: u64) -> u64 {
    s.state().unwrap().used_bytes(0) - base
}

/// The ledger equals what the driver holds, and both are within the budget.
#[track_caller]
fn assert_truth(s: &SimHandle, r: &vgpu_region::Region, base: u64, what: &str) {
    let h = held(s, base);
    assert_eq!(
        r.device_used(0),
        h,
        "{what}: the ledger and the driver disagree"
    );
    assert!(
        h <= GIB,
        "{what}: the device holds {h} B under a 1 GiB budget"
    );
}

#[test]
fn six_graph_alloc_nodes_past_the_budget_are_refused_at_launch() {
    // Before: cuGraphAddMemAllocNode was not seen; six 512 MiB alloc nodes
    // launched under a 1 GiB budget put 3 GiB on the device, the ledger
    // showed none of it and cuMemGetInfo the whole budget free. After: the
    // launch is refused before the driver runs it; nothing is on the device.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut c, r, base) = graph_client(&s, &dir.path().join("r.cache"));
    assert_eq!(c.rc(&format!("graph 6 {}", 512 * MIB)), OK);
    assert_eq!(c.rc("ginst 0"), OK);
    let f = c.ask("glaunch");
    assert_eq!(num(&f, "rc"), OOM, "{f:?}");
    assert_eq!(held(&s, base), 0, "the refused launch backed nothing");
    assert_truth(&s, &r, base, "refused launch");
    assert_eq!(c.info(), (GIB, GIB));
    // Uploading backs the same memory: refused the same way.
    assert_eq!(c.rc("gupload"), OOM);
    assert_truth(&s, &r, base, "refused upload");
    // Two of them fit, and are charged as the driver backs them.
    assert_eq!(c.rc("gexecdestroy"), OK);
    assert_eq!(c.rc(&format!("graph 2 {}", 512 * MIB)), OK);
    assert_eq!(c.rc("ginst 0"), OK);
    assert_eq!(c.rc("glaunch"), OK);
    assert_eq!(held(&s, base), GIB);
    assert_truth(&s, &r, base, "two nodes launched");
    assert_eq!(c.info().0, 0, "cuMemGetInfo: nothing free");
    assert_eq!(c.rc("alloc 1"), OOM, "the budget is full");
    assert!(c.quit().contains("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(r.device_used(0), 0, "released at exit");
}

#[test]
fn graph_memory_is_charged_as_the_driver_backs_it_and_trim_returns_it() {
    // Before: a graph's 384 MiB were on the device and in no ledger. After:
    // the ledger follows the graph allocator's reserved memory: charged at
    // the launch, kept after the allocation is freed (the driver keeps it
    // for the next graph), reused by a relaunch, returned by a trim.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut c, r, base) = graph_client(&s, &dir.path().join("r.cache"));
    assert_eq!(c.rc(&format!("graph 1 {}", 384 * MIB)), OK);
    assert_eq!(c.rc("ginst 0"), OK);
    assert_truth(&s, &r, base, "instantiated");
    assert_eq!(c.rc("glaunch"), OK);
    assert_eq!(held(&s, base), 384 * MIB);
    assert_truth(&s, &r, base, "launched");
    assert_eq!(c.info().0, GIB - 384 * MIB);
    assert_eq!(c.rc(&format!("alloc {}", GIB - 384 * MIB + 1)), OOM);
    // Launched again before its allocation is freed: the driver refuses.
    assert_eq!(c.rc("glaunch"), 1, "CUDA_ERROR_INVALID_VALUE");
    assert_truth(&s, &r, base, "relaunch refused by the driver");
    // Freed outside the graph: the graph allocator keeps the memory.
    assert_eq!(c.rc("gfree"), OK);
    let g = c.ask("gmem");
    assert_eq!((num(&g, "used"), num(&g, "reserved")), (0, 384 * MIB));
    assert_truth(&s, &r, base, "freed, still reserved");
    // The relaunch reuses it; freed in stream order this time.
    assert_eq!(c.rc("glaunch"), OK);
    assert_truth(&s, &r, base, "relaunched");
    assert_eq!(held(&s, base), 384 * MIB, "reused, not grown");
    assert_eq!(c.rc("gfreeasync"), OK);
    assert_truth(&s, &r, base, "freed in stream order");
    // Destroying the executable leaves the memory with the allocator; the
    // trim returns it, and the whole budget is there again.
    assert_eq!(c.rc("gexecdestroy"), OK);
    assert_eq!(r.device_used(0), 384 * MIB);
    assert_truth(&s, &r, base, "executable destroyed");
    assert_eq!(c.rc("gtrim"), OK);
    assert_eq!(r.device_used(0), 0, "the trim returned the charge");
    assert_truth(&s, &r, base, "trimmed");
    // A graph that frees its own allocation, relaunched with
    // AUTO_FREE_ON_LAUNCH: one backing, however many launches.
    assert_eq!(c.rc(&format!("graph 2 {} free", 256 * MIB)), OK);
    assert_eq!(c.rc("ginst 1"), OK);
    for i in 0..3 {
        assert_eq!(c.rc("glaunch"), OK, "launch {i}");
        assert_truth(&s, &r, base, "in-graph free");
        assert_eq!(held(&s, base), 512 * MIB);
    }
    assert_eq!(c.rc(&format!("graph 1 {}", 512 * MIB)), OK);
    assert_eq!(c.rc("ginst 1"), OK);
    for i in 0..3 {
        assert_eq!(c.rc("glaunch"), OK, "auto-free launch {i}");
        assert_truth(&s, &r, base, "auto-free relaunch");
    }
    assert_eq!(c.rc(&format!("alloc {GIB}")), OOM);
    assert_eq!(c.rc("gfree"), OK);
    assert_eq!(c.rc("gtrim"), OK);
    assert_truth(&s, &r, base, "all trimmed");
    assert_eq!(r.device_used(0), 0);
    assert_eq!(c.rc(&format!("alloc {GIB}")), OK, "the whole budget again");
    c.quit();
}

#[test]
fn a_captured_stream_ordered_allocation_is_graph_memory() {
    // Before: cuMemAllocAsync captured into a graph (cuStreamBeginCaptureToGraph
    // was not hooked) was charged to the pool, settled back to nothing, and
    // the graph's launch then put 640 MiB on the device uncharged. After:
    // nothing is charged while capturing; the launch is admitted and charged
    // like any graph memory.
    let s = sim(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut c, r, base) = graph_client(&s, &dir.path().join("r.cache"));
    let f = c.ask(&format!("gcapture {} free", 640 * MIB));
    assert_eq!((num(&f, "rc"), num(&f, "alloc_rc")), (OK, OK), "{f:?}");
    assert_truth(&s, &r, base, "captured");
    assert_eq!(r.device_used(0), 0, "a captured allocation is not charged");
    assert_eq!(c.rc("ginst 0"), OK);
    assert_eq!(c.rc("glaunch"), OK);
    assert_eq!(held(&s, base), 640 * MIB);
    assert_truth(&s, &r, base, "captured graph launched");
    assert_eq!(c.rc(&format!("alloc {}", 384 * MIB + 1)), OOM);
    // Another captured graph of the same size: its first launch may not
    // count on the first one's memory (on a real GPU that graph may still
    // be running), so the unused graph memory is trimmed to make room.
    let f = c.ask(&format!("gcapture {} free", 640 * MIB));
    assert_eq!(num(&f, "rc"), OK, "{f:?}");
    assert_eq!(c.rc("ginst 0"), OK);
    assert_eq!(c.rc("glaunch"), OK);
    assert_truth(&s, &r, base, "second captured graph");
    // Past the budget: the capture is fine, the launch is refused.
    let f = c.ask(&format!("gcapture {} new", 1536 * MIB));
    assert_eq!((num(&f, "rc"), num(&f, "alloc_rc")), (OK, OK), "{f:?}");
    assert_eq!(c.rc("ginst 0"), OK);
    assert_eq!(c.rc("glaunch"), OOM);
    assert_truth(&s, &r, base, "refused captured graph");
    assert_eq!(c.rc("gtrim"), OK);
    assert_eq!(r.device_used(0), 0);
    assert_truth(&s, &r, base, "trimmed");
    c.quit();
}
