//! The worker itself (absent from loom builds, which lack `Region`).
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use vgpu_region::{CreateOptions, DeviceConfig, MemKind, Region, SlotId};

mod barrier {
    //! A barrier and tallies in a small shared file (test coordination only).
    use std::sync::atomic::AtomicU32;

    /// Cells: 0 arrived, 1 generation, 2 over-limit count, 3.. wins per round.
    pub struct Shared {
        map: memmap2::MmapRaw,
        cells: usize,
    }

    impl Shared {
        pub fn open(path: &std::path::Path) -> std::io::Result<Shared> {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            let len = f.metadata()?.len() as usize;
            let map = memmap2::MmapOptions::new().len(len).map_raw(&f)?;
            Ok(Shared {
                map,
                cells: len / 4,
            })
        }

        pub fn cell(&self, i: usize) -> &AtomicU32 {
            assert!(i < self.cells, "barrier cell {i} out of range");
            // SAFETY: the mapping is page-aligned, holds `cells` u32s
            // (checked above), lives as long as `self`, and every process
            // touches it only through atomics.
            unsafe { &*(self.map.as_mut_ptr() as *const AtomicU32).add(i) }
        }
    }
}

fn fail(msg: String) -> ExitCode {
    eprintln!("vgpu-region-worker: {msg}");
    ExitCode::from(2)
}

fn flock_shared(path: &str) -> Result<File, String> {
    let f = File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)
        .map_err(|e| format!("flock {path}: {e}"))?;
    Ok(f)
}

/// fork(2) from this single-threaded worker.
fn forked() -> i32 {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: the script worker has one thread, so the child may run
    // arbitrary code (no lock can be held by a thread that did not fork).
    unsafe { libc::fork() }
}

/// Waits for a child; its exit code, or 128 + signal.
fn wait_child(pid: i32) -> i32 {
    let mut st = 0;
    // SAFETY: `st` is a valid out-pointer for the call's duration.
    let r = unsafe { libc::waitpid(pid, &mut st, 0) };
    if r != pid {
        return -1;
    }
    if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        128 + libc::WTERMSIG(st)
    }
}

/// A region error with its classified cause, e.g. `... [not-regular-file]`.
fn why(e: vgpu_region::RegionError) -> String {
    format!("{e} [{}]", e.unusable().name())
}

fn reg<'a>(r: &'a Option<Region>, op: &str) -> Result<&'a Region, String> {
    r.as_ref().ok_or(format!("op {op:?} before open"))
}

fn script(region: &str, ops: &str) -> Result<(), String> {
    let path = Path::new(region);
    let mut r: Option<Region> = None;
    let mut slot: Option<SlotId> = None;
    for op in ops.split(',') {
        let name = op.split(':').next().unwrap_or("");
        let arg = |i: usize| -> Result<u64, String> {
            op.split(':')
                .nth(i)
                .and_then(|v| v.parse().ok())
                .ok_or(format!("op {op:?}: argument {i} missing"))
        };
        match name {
            "create" | "private" => {
                let opts = CreateOptions {
                    slots: arg(1)? as u32,
                    devices: vec![DeviceConfig {
                        uuid: "GPU-worker".into(),
                        mem_limit: arg(2)?,
                        sm_limit: 0,
                    }],
                };
                r = Some(if name == "create" {
                    Region::open_or_create(path, &opts).map_err(why)?.0
                } else {
                    Region::private(&opts).map_err(why)?
                });
            }
            "gate" => {
                // Wait for the parent to release everyone at once.
                let g = op.split_once(':').map(|x| x.1).ok_or("gate:<path>")?;
                drop(flock_shared(g)?);
            }
            "open" => r = Some(Region::open(path).map_err(why)?),
            "register" => {
                let s = reg(&r, op)?.register().map_err(why)?;
                println!("slot={}", s.0);
                slot = Some(s);
            }
            "reserve" => {
                let s = slot.ok_or("reserve before register")?;
                match reg(&r, op)?.reserve(s, 0, MemKind::Data, arg(1)?) {
                    Ok(()) => {}
                    Err(e) => println!("refused {e}"),
                }
            }
            "release" => {
                let s = slot.ok_or("release before register")?;
                reg(&r, op)?.release(s, 0, MemKind::Data, arg(1)?);
            }
            "reclaim" => println!("reclaimed={}", reg(&r, op)?.reclaim_dead()),
            "unregister" => reg(&r, op)?.unregister(slot.ok_or("unregister before register")?),
            "fork" => {
                // The child registers as itself on the inherited mapping.
                let parent_slot = slot.ok_or("fork before register")?;
                match forked() {
                    0 => {
                        let r = reg(&r, op)?;
                        let s = r.register().map_err(|e| format!("child: {e}"))?;
                        let me = std::process::id();
                        let owner = r
                            .snapshot()
                            .slots
                            .iter()
                            .find(|x| x.index == s.0)
                            .map(|x| x.pid);
                        println!("child pid={me} slot={} owner={owner:?}", s.0);
                        let ok = s != parent_slot && owner == Some(me);
                        std::process::exit(if ok { 0 } else { 3 });
                    }
                    pid if pid > 0 => {
                        let st = wait_child(pid);
                        println!("child exit={st}");
                    }
                    _ => return Err("fork failed".into()),
                }
            }
            "forkreserve" => {
                // The child registers and reserves on the inherited mapping
                // (exit 0 admitted, 4 refused): shows whether a fork child
                // shares its parent's budget.
                let bytes = arg(1)?;
                match forked() {
                    0 => {
                        let r = reg(&r, op)?;
                        let s = r.register().map_err(why)?;
                        let code = match r.reserve(s, 0, MemKind::Data, bytes) {
                            Ok(()) => 0,
                            Err(_) => 4,
                        };
                        std::process::exit(code);
                    }
                    pid if pid > 0 => println!("child exit={}", wait_child(pid)),
                    _ => return Err("fork failed".into()),
                }
            }
            "die" => {
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
            other => return Err(format!("unknown op {other:?}")),
        }
    }
    println!("ok");
    Ok(())
}

/// `limits-write PATH TEXT`: parses TEXT and writes it atomically to PATH
/// (the test runs it under a chosen umask).
fn limits_write(path: &str, text: &str) -> Result<(), String> {
    let l = vgpu_region::limits::Limits::parse(text).map_err(|e| format!("{e}"))?;
    vgpu_region::limits::write_limits_file_atomic(Path::new(path), &l)
        .map_err(|e| format!("{e}"))?;
    println!("ok");
    Ok(())
}

/// `probe PATH`: every way of opening, one line each:
/// `<how>: ok` or `<how>: <cause> <message>`.
fn probe(path: &str) {
    let p = Path::new(path);
    let show = |how: &str, r: Result<Region, vgpu_region::RegionError>| match r {
        Ok(_) => println!("{how}: ok"),
        Err(e) => println!("{how}: {} {e}", e.unusable().name()),
    };
    show("open", Region::open(p));
    show(
        "open_or_create",
        Region::open_or_create(p, &CreateOptions::default()).map(|x| x.0),
    );
    show("open_read_only", Region::open_read_only(p));
    show("open_copy", Region::open_copy(p));
}

/// Opens REGION with `read_only` (a mapping of the file) or `copy`
/// (`Region::open_copy`).
fn open_how(path: &Path, how: &str) -> Result<Region, String> {
    match how {
        "read_only" => Region::open_read_only(path).map_err(why),
        "copy" => Region::open_copy(path).map_err(why),
        other => Err(format!("open how {other:?}: read_only|copy")),
    }
}

/// `truncate-read REGION HOW`: opens REGION (HOW: `read_only`|`copy`),
/// snapshots it, truncates the file to 0 as its tenant could, and snapshots
/// again: a reader of a mapping of the file dies here (SIGBUS), a reader of
/// a copy prints `survived slots=N same=true`.
fn truncate_read(region: &str, how: &str) -> Result<(), String> {
    let path = Path::new(region);
    let r = open_how(path, how)?;
    let before = r.snapshot();
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {region}: {e}"))?;
    f.set_len(0)
        .map_err(|e| format!("truncate {region}: {e}"))?;
    let after = r.snapshot();
    let same = format!("{before:?}") == format!("{after:?}");
    println!("survived slots={} same={same}", after.slots.len());
    Ok(())
}

/// `truncate-loop REGION`: what a hostile tenant does to its own region,
/// until killed: cuts the file (to 0, then to half its length, in turn)
/// and grows it back, rewriting the pages it cut in ascending order (so at
/// every instant the file holds its original bytes up to its current
/// length), then lets it be for 0–1 ms. Prints `ready` after the first
/// round.
fn truncate_loop(region: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(region)
        .map_err(|e| format!("open {region}: {e}"))?;
    let orig = std::fs::read(region).map_err(|e| format!("read {region}: {e}"))?;
    let len = orig.len() as u64;
    let half = (len / 2) / 4096 * 4096;
    for round in 0u64.. {
        let cut = if round % 2 == 0 { 0 } else { half };
        f.set_len(cut).map_err(|e| format!("truncate: {e}"))?;
        for (i, page) in orig.chunks(4096).enumerate() {
            let at = i as u64 * 4096;
            if at >= cut && page.iter().any(|&b| b != 0) {
                f.write_all_at(page, at)
                    .map_err(|e| format!("write: {e}"))?;
            }
        }
        f.set_len(len).map_err(|e| format!("grow: {e}"))?;
        if round == 0 {
            println!("ready");
            let _ = std::io::stdout().flush();
        }
        let until = Instant::now() + Duration::from_micros(vgpu_region::monotonic_ns() % 1000);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// `hammer REGION HOW N`: N times, opens REGION (HOW as in
/// `truncate-read`) and snapshots it; prints `ok=… err=…`, then the last
/// refusal (`last: <message> [<cause>]`) or the last snapshot's slots
/// (`slots=… used=…`).
fn hammer(region: &str, how: &str, n: &str) -> Result<(), String> {
    let n: u64 = n.parse().map_err(|_| format!("bad count {n:?}"))?;
    let (mut ok, mut err) = (0u64, 0u64);
    let mut last = String::new();
    for _ in 0..n {
        match open_how(Path::new(region), how) {
            Ok(r) => {
                let s = std::hint::black_box(r.snapshot());
                let used: u64 = s.devices.iter().map(|d| d.used).sum();
                last = format!("slots={} used={used}", s.slots.len());
                ok += 1;
            }
            Err(e) => {
                last = format!("last: {e}");
                err += 1;
            }
        }
    }
    println!("ok={ok} err={err}");
    println!("{last}");
    Ok(())
}

fn burst(region: &str, gate: &str, hold: &str, mode: &str) -> Result<(), String> {
    let r = Region::open(Path::new(region)).map_err(|e| format!("{e}"))?;
    let lock_path = format!("{region}.lock");
    let lock_file = if mode == "flock" {
        Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock_path)
                .map_err(|e| format!("open {lock_path}: {e}"))?,
        )
    } else {
        None
    };
    use std::io::Write;
    println!("ready");
    let _ = std::io::stdout().flush();
    let g = flock_shared(gate)?;
    let start = vgpu_region::monotonic_ns();
    let slot = match &lock_file {
        // The baseline HAMi-core uses: every registration queues on one
        // lock (a semaphore there, a flock here) around the same claim.
        Some(f) => {
            rustix::fs::flock(f, rustix::fs::FlockOperation::LockExclusive)
                .map_err(|e| format!("flock: {e}"))?;
            let s = r.register();
            let _ = rustix::fs::flock(f, rustix::fs::FlockOperation::Unlock);
            s
        }
        None => r.register(),
    }
    .map_err(|e| format!("{e}"))?;
    let end = vgpu_region::monotonic_ns();
    drop(g);
    if r.device_count() > 0 {
        r.reserve(slot, 0, MemKind::Data, 4096)
            .map_err(|e| format!("{e}"))?;
    }
    println!(
        "pid={} slot={} start_ns={start} end_ns={end}",
        std::process::id(),
        slot.0
    );
    let _ = std::io::stdout().flush();
    let _h = flock_shared(hold)?;
    Ok(())
}

fn wait_barrier(sh: &barrier::Shared, parties: u32) -> Result<(), String> {
    let gen = sh.cell(1).load(SeqCst);
    if sh.cell(0).fetch_add(1, SeqCst) + 1 == parties {
        sh.cell(0).store(0, SeqCst);
        sh.cell(1).fetch_add(1, SeqCst);
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0u32;
    while sh.cell(1).load(SeqCst) == gen {
        n += 1;
        if n.is_multiple_of(64) && Instant::now() > deadline {
            return Err("barrier timed out".into());
        }
        std::thread::yield_now();
    }
    Ok(())
}

fn race(args: &[String]) -> Result<(), String> {
    let [region, barrier, threads, rounds, chunk, parties] = args else {
        return Err("race REGION BARRIER THREADS ROUNDS CHUNK PARTIES".into());
    };
    let num = |s: &String| s.parse::<u64>().map_err(|_| format!("bad number {s:?}"));
    let (threads, rounds, chunk, parties) = (
        num(threads)?,
        num(rounds)? as usize,
        num(chunk)?,
        num(parties)? as u32,
    );
    let r = Region::open(Path::new(region)).map_err(|e| format!("{e}"))?;
    let sh = barrier::Shared::open(Path::new(barrier)).map_err(|e| format!("{e}"))?;
    let slot = r.register().map_err(|e| format!("{e}"))?;
    let limit = r.limits(0).mem;
    // What the test holds: nobody reserves before the first barrier.
    let base = r.device_used(0);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| -> Result<(), String> {
                    for round in 0..rounds {
                        wait_barrier(&sh, parties)?;
                        let won = r.reserve(slot, 0, MemKind::Data, chunk).is_ok();
                        if won {
                            let before = sh.cell(3 + round).fetch_add(1, SeqCst);
                            // Admitted bytes as the winners count them: the
                            // region's own counters also hold the attempts
                            // still being decided.
                            let admitted = base + (u64::from(before) + 1) * chunk;
                            if admitted > limit {
                                sh.cell(2).fetch_add(1, SeqCst);
                            }
                        }
                        wait_barrier(&sh, parties)?;
                        if won {
                            r.release(slot, 0, MemKind::Data, chunk);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
    })?;
    r.unregister(slot);
    println!("ok");
    Ok(())
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("script") if args.len() == 3 => script(&args[1], &args[2]),
        Some("burst") if args.len() == 5 => burst(&args[1], &args[2], &args[3], &args[4]),
        Some("race") => race(&args[1..]),
        Some("limits-write") if args.len() == 3 => limits_write(&args[1], &args[2]),
        Some("truncate-read") if args.len() == 3 => truncate_read(&args[1], &args[2]),
        Some("truncate-loop") if args.len() == 2 => truncate_loop(&args[1]),
        Some("hammer") if args.len() == 4 => hammer(&args[1], &args[2], &args[3]),
        Some("probe") if args.len() == 2 => {
            probe(&args[1]);
            Ok(())
        }
        _ => Err(format!(
            "usage: script|burst|race|probe|limits-write|truncate-read|truncate-loop|hammer …, got {args:?}"
        )),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
