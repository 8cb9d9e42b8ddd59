//! `vgpu inspect [cache] [--json] [--limits FILE]`: a shared region's
//! header, limits and live slots with their usage, identity and phase
//! timestamps, and the limits file that applies to it (docs/limits.md) with
//! whether the region's display copy agrees. Reads only (a private copy of
//! the file, `Region::open_copy`: no reclaim, no writes, and a tenant
//! truncating the file meanwhile cannot SIGBUS it; nothing at the paths is
//! followed or blocked on); a file that is not a usable region is
//! explained.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vgpu_region::limits::{self, LimitsError};
use vgpu_region::{DisplayMismatch, Region, SlotSnapshot, Snapshot};

/// Where a process that lost its environment finds its region (the
/// interposer's default).
pub const DEFAULT_CACHE: &str = "/tmp/vgpu/region.cache";

#[derive(clap::Args)]
pub struct Args {
    /// The region file (default: $CUDA_DEVICE_MEMORY_SHARED_CACHE, else
    /// /tmp/vgpu/region.cache).
    pub cache: Option<PathBuf>,
    /// Print the snapshot as JSON.
    #[arg(long)]
    pub json: bool,
    /// The limits file (default: found from the region's path, see
    /// docs/limits.md).
    #[arg(long)]
    pub limits: Option<PathBuf>,
}

use vgpu_errors::chain;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cache = args.cache.unwrap_or_else(|| {
        std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
    });
    let r = match Region::open_copy(&cache) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vgpu inspect: {} [{}]", chain(&e), e.unusable().name());
            return Ok(ExitCode::from(1));
        }
    };
    let snap = r.snapshot();
    let file = args
        .limits
        .unwrap_or_else(|| limits::path_for_region(&cache));
    let lim = limits::read_limits_file(&file);
    if args.json {
        let mut v = serde_json::to_value(&snap)?;
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("limits_file".into(), limits_json(&file, &lim, &r));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_with(&snap, &owner_status));
        print!("{}", render_limits(&file, &lim, &r));
    }
    Ok(ExitCode::SUCCESS)
}

fn limits_json(
    file: &Path,
    lim: &Result<limits::Limits, LimitsError>,
    r: &Region,
) -> serde_json::Value {
    let path = file.display().to_string();
    match lim {
        Ok(l) => serde_json::json!({
            "path": path,
            "status": "ok",
            "limits": l,
            "devices": (0..r.device_count()).map(|d| {
                let uuid = r.device_uuid(d);
                serde_json::json!({ "index": d, "uuid": uuid, "applies": l.for_device(&uuid) })
            }).collect::<Vec<_>>(),
            "region_disagrees": r.display_mismatches(l),
        }),
        Err(e) if e.is_not_found() => serde_json::json!({ "path": path, "status": "missing" }),
        Err(e) => serde_json::json!({ "path": path, "status": "unusable", "error": chain(e) }),
    }
}

fn limit_text(l: limits::DeviceLimit) -> String {
    format!(
        "memory limit {}  SM limit {}",
        l.memory.map_or_else(|| "none".into(), bytes),
        l.sm.map_or_else(|| "none".into(), |s| format!("{s}%"))
    )
}

/// The limits-file part of the report: what applies to each device and
/// whether the region's display copy agrees.
pub fn render_limits(file: &Path, lim: &Result<limits::Limits, LimitsError>, r: &Region) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let l = match lim {
        Ok(l) => l,
        Err(e) if e.is_not_found() => {
            let _ = writeln!(
                o,
                "limits file {}: none (no operator file: the environment and the region's values apply)",
                file.display()
            );
            return o;
        }
        Err(e) => {
            let _ = writeln!(
                o,
                "limits file {}: UNUSABLE: {} (a process that finds it admits nothing rather than run unlimited)",
                file.display(),
                chain(e)
            );
            return o;
        }
    };
    // The region does not record which file its processes read: this is
    // the file the layout names for it, not proof that anyone reads it.
    let _ = writeln!(
        o,
        "limits file {} (the operator's file for this region by its path; it applies to a \
         process that reads it, as LIBVGPU_LIMITS_FILE or a mount at /etc/vgpu/limits: the \
         region does not record which file its processes read):",
        file.display()
    );
    let mism: Vec<DisplayMismatch> = r.display_mismatches(l);
    for d in 0..r.device_count() {
        let uuid = r.device_uuid(d);
        let mine: Vec<&DisplayMismatch> = mism.iter().filter(|m| m.device == d).collect();
        let agree = if mine.is_empty() {
            "region copy agrees".to_string()
        } else {
            let what: Vec<String> = mine
                .iter()
                .map(|m| {
                    format!(
                        "{} {} in the header",
                        m.field,
                        if m.region == 0 {
                            "none".to_string()
                        } else {
                            m.region.to_string()
                        }
                    )
                })
                .collect();
            format!(
                "region copy DISAGREES: {}; a process reading the file enforces the file",
                what.join(", ")
            )
        };
        let ceiling = l
            .ceiling_for(&uuid)
            .map_or_else(String::new, |c| format!("  SM ceiling {c}%"));
        let _ = writeln!(
            o,
            "  [{d}] {}  {}{ceiling}  ({agree})",
            if uuid.is_empty() { "-" } else { &uuid },
            limit_text(l.for_device(&uuid))
        );
        if let (Some(b), false) = (&l.board, uuid.is_empty()) {
            o.push_str(&board_text(b, &uuid));
        }
    }
    let _ = writeln!(
        o,
        "  policy {}, priority {}, suspended {}{}",
        l.policy.map_or("-", |p| p.name()),
        l.priority.map_or_else(|| "-".into(), |p| p.to_string()),
        if l.is_suspended() { "yes" } else { "no" },
        l.hold
            .map_or_else(String::new, |h| format!(", priority hold {h}%"))
    );
    o
}

/// The GPU's lending board: every container's guarantee, ceiling, want,
/// use and current share (docs/limiter.md, "Guarantees and ceilings").
fn board_text(b: &limits::BoardRef, uuid: &str) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let dir = vgpu_region::board::gpu_dir(&b.dir, uuid);
    let mut entries = Vec::new();
    let pct = |ppm: u32| format!("{:.1}%", ppm as f64 / 10_000.0);
    match vgpu_region::board::read(&dir, vgpu_region::monotonic_ns(), &mut entries) {
        Err(e) => {
            let _ = writeln!(o, "      board {}: unreadable: {e}", dir.display());
        }
        Ok(()) => {
            let _ = writeln!(
                o,
                "      board {} (this container: {}), {} live entr{}:",
                dir.display(),
                b.name,
                entries.len(),
                if entries.len() == 1 { "y" } else { "ies" }
            );
            for (name, e) in &entries {
                let _ = writeln!(
                    o,
                    "        {name}{}  guarantee {}  ceiling {}  wants {}  used {}  share now {}  pid {}",
                    if *name == b.name { " (this)" } else { "" },
                    pct(e.guarantee_ppm),
                    pct(e.ceiling_ppm),
                    pct(e.want_ppm),
                    pct(e.used_ppm),
                    pct(e.pace_ppm),
                    e.pid
                );
            }
        }
    }
    o
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {} ({n})", UNITS[u])
    }
}

/// A slot's identity failure code with its stable name (`-` for none).
fn failure(code: u32) -> String {
    match u16::try_from(code) {
        Ok(0) => "-".into(),
        Ok(c) => vgpu_identity::FailureCode(c).to_string(),
        Err(_) => format!("UNKNOWN ({code})"),
    }
}

/// For a device with an SM limit: how many live slots still lack their
/// host PID (the limit stays configured; the limiter needs the join).
fn identity_note(s: &Snapshot) -> String {
    let count = |st: &str| s.slots.iter().filter(|sl| sl.identity.state == st).count();
    let (failed, pending) = (count("Failed"), count("Pending"));
    match (failed, pending) {
        (0, 0) => String::new(),
        _ => {
            format!(" (host PID identity: {failed} slot(s) failed, {pending} pending; limit kept)")
        }
    }
}

fn limit(mem: u64) -> String {
    if mem == 0 {
        "none".into()
    } else {
        bytes(mem)
    }
}

/// Whether a slot's owner still runs, as far as this process can tell
/// (only owners of our own PID namespace can be judged).
fn owner_status(sl: &SlotSnapshot) -> &'static str {
    let me = vgpu_region::ident::current();
    if sl.pid_ns == 0 || sl.pid_ns != me.pidns_inode || !me.procfs_ok {
        return "owner in another PID namespace";
    }
    let start34 = sl.start_time & vgpu_region::core::START_MASK;
    if vgpu_region::ident::is_dead(&me, sl.pid, start34) {
        "owner gone, not yet reclaimed"
    } else {
        "owner running"
    }
}

/// The human-readable report, with a note per slot (whether its owner
/// still runs).
pub fn render_with(s: &Snapshot, note: &dyn Fn(&SlotSnapshot) -> &'static str) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let h = &s.header;
    let _ = writeln!(o, "region {}", s.path);
    let _ = writeln!(
        o,
        "  layout v{} ({}-endian), hash {:#018x}, header {} B, slot {} B, device {} B",
        h.version, h.endianness, h.layout_hash, h.header_size, h.slot_size, h.device_size
    );
    let _ = writeln!(
        o,
        "  {} slots ({} claimed, high water {}), {} devices, file {} B, created by pid {}",
        h.slot_count,
        s.slots.len(),
        s.slot_high_water,
        h.device_count,
        h.file_len,
        h.creator_pid
    );
    let _ = writeln!(o, "devices:");
    let id_note = identity_note(s);
    for d in &s.devices {
        let sm = if d.limits.sm == 0 {
            "none".to_string()
        } else {
            format!("{}%{id_note}", d.limits.sm)
        };
        let _ = writeln!(
            o,
            "  [{}] {}  memory limit {}  SM limit {}  used {}  (context {}, module {}, data {})",
            d.index,
            if d.uuid.is_empty() { "-" } else { &d.uuid },
            limit(d.limits.mem),
            sm,
            bytes(d.used),
            d.context,
            d.module,
            d.data
        );
    }
    let _ = writeln!(o, "slots:");
    if s.slots.is_empty() {
        let _ = writeln!(o, "  (none)");
    }
    for sl in &s.slots {
        let host = if sl.host_pid == 0 {
            "?".to_string()
        } else {
            sl.host_pid.to_string()
        };
        let n = note(sl);
        let _ = writeln!(
            o,
            "  #{} {}{} pid {} host pid {} start {} pidns {}  identity {} {} (attempts {}, failure {}, {} us)  run {}",
            sl.index,
            sl.state,
            if n.is_empty() { String::new() } else { format!(" ({n})") },
            sl.pid,
            host,
            sl.start_time,
            sl.pid_ns,
            sl.identity.tier,
            sl.identity.state,
            sl.identity.attempts,
            failure(sl.identity.failure),
            sl.identity.duration_ns / 1000,
            sl.run_status
        );
        for d in &sl.devices {
            let u = &d.usage;
            if u.total == 0 && d.monitor_mem == 0 && d.monitor_sm_util == 0 {
                continue;
            }
            let _ = writeln!(
                o,
                "      dev {}: total {}  context {}  module {}  data {}  monitor mem {}  sm util {}%",
                d.index, u.total, u.context, u.module, u.data, d.monitor_mem, d.monitor_sm_util
            );
        }
        if let Some((_, t0)) = sl.phases.iter().min_by_key(|(_, t)| *t) {
            let list: Vec<String> = sl
                .phases
                .iter()
                .map(|(n, t)| format!("{n} +{}us", (t - t0) / 1000))
                .collect();
            let _ = writeln!(o, "      phases (from {t0} ns): {}", list.join(", "));
        }
        if !sl.fallbacks.is_empty() {
            let list: Vec<String> = sl
                .fallbacks
                .iter()
                .map(|(n, c)| format!("{n}={c}"))
                .collect();
            let _ = writeln!(o, "      fallbacks: {}", list.join(", "));
        }
    }
    o.push_str(&limiter_block(s));
    o
}

/// The SM limiter's block (issue 11): per device the container bucket and
/// its utilization (always filled, limited or not), per slot the limiter
/// state and its counters. Kept apart from the rest of the report.
fn limiter_block(s: &Snapshot) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "limiter:");
    let ppm = |v: u32| format!("{:.1}%", v as f64 / 10_000.0);
    for d in &s.devices {
        let p = &d.pacing;
        let util = if p.util_at_ns == 0 {
            "not measured yet".to_string()
        } else {
            format!(
                "{} over {} ms ({})",
                ppm(p.util_ppm),
                p.util_window_ns / 1_000_000,
                p.util_source
            )
        };
        let sampler = p.sampler.map_or("none".to_string(), |(slot, until)| {
            format!("slot #{slot} until {until} ms")
        });
        let _ = writeln!(
            o,
            "  [{}] {}  share {}  credit {} us  correction {}  utilization {}  sampler {}  waits {}",
            d.index,
            p.mode,
            if p.share_ppm == 0 { "-".into() } else { ppm(p.share_ppm) },
            p.credit_ns / 1000,
            if p.correction_ppm == 0 { "-".into() } else { format!("{:.3}", p.correction_ppm as f64 / 1e6) },
            util,
            sampler,
            p.waits
        );
    }
    for sl in &s.slots {
        let l = &sl.limiter;
        let reason = if l.reason == "None" {
            String::new()
        } else {
            format!(" ({})", l.reason)
        };
        let devs: Vec<String> = l
            .devices
            .iter()
            .filter(|d| d.launches > 0 || d.measured_ns > 0)
            .map(|d| {
                format!(
                    "dev {}: {} launches, measured {} us, waited {} us, estimate {} ns",
                    d.index,
                    d.launches,
                    d.measured_ns / 1000,
                    d.waited_ns / 1000,
                    d.estimate_ns
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "  #{} {}{}{}",
            sl.index,
            l.state,
            reason,
            if devs.is_empty() {
                String::new()
            } else {
                format!("  {}", devs.join("; "))
            }
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private directory removed on drop (the CLI crate has no tempfile).
    struct TempDir(PathBuf);
    impl TempDir {
        fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "vgpu-cli-test-{}-{}",
                std::process::id(),
                vgpu_region::monotonic_ns()
            ));
            std::fs::create_dir(&p).unwrap();
            TempDir(p)
        }
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    use vgpu_region::*;

    #[test]
    fn shows_what_a_live_process_wrote() {
        let dir = TempDir::new();
        let p = dir.path().join("cache");
        let (r, _) = Region::open_or_create(
            &p,
            &CreateOptions {
                slots: 8,
                devices: vec![DeviceConfig {
                    uuid: "GPU-inspect-0".into(),
                    mem_limit: 4096 << 20,
                    sm_limit: 40,
                }],
            },
        )
        .unwrap();
        let s = r.register().unwrap();
        r.reserve(s, 0, MemKind::Data, 3 << 20).unwrap();
        r.reserve(s, 0, MemKind::Context, 1 << 20).unwrap();
        let slot = r.slot(s);
        slot.set_host_pid(424242);
        slot.set_identity(
            IdentityTier::Broker,
            IdentityState::Resolved,
            2,
            0,
            1_500_000,
        );
        // A second process whose every tier failed: visible, limit kept.
        let s2 = r.register().unwrap();
        r.slot(s2).set_identity(
            IdentityTier::HostProcfs,
            IdentityState::Failed,
            4,
            201,
            9000,
        );
        slot.set_phase(Phase::WrapperEnter, 1_000_000);
        slot.set_phase(Phase::WrapperExit, 3_000_000);
        slot.bump_fallback(Fallback::BadSetting);
        // A second mapping, as `vgpu inspect` would open it.
        let snap = Region::open_read_only(&p).unwrap().snapshot();
        let out = render_with(&snap, &owner_status);
        let pid = std::process::id().to_string();
        for want in [
            "GPU-inspect-0",
            "memory limit 4.0 GiB",
            "SM limit 40%",
            "used 4.0 MiB",
            &format!("live (owner running) pid {pid} host pid 424242"),
            "identity Broker Resolved (attempts 2, failure -, 1500 us)",
            "identity HostProcfs Failed (attempts 4, failure PROCFS_READ (201), 9 us)",
            "SM limit 40% (host PID identity: 1 slot(s) failed, 0 pending; limit kept)",
            "data 3145728",
            "context 1048576",
            "WrapperEnter +0us",
            "WrapperExit +2000us",
            "BadSetting=1",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        let json: serde_json::Value = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["slots"][0]["host_pid"], 424242);
        assert_eq!(json["slots"][0]["devices"][0]["usage"]["data"], 3 << 20);
        assert_eq!(json["devices"][0]["limits"]["mem"], 4096u64 << 20);
    }

    #[test]
    fn shows_the_limiter_state_and_utilization() {
        let dir = TempDir::new();
        let p = dir.path().join("cache");
        let (r, _) = Region::open_or_create(
            &p,
            &CreateOptions {
                slots: 4,
                devices: vec![DeviceConfig {
                    uuid: "GPU-limiter-0".into(),
                    mem_limit: 0,
                    sm_limit: 30,
                }],
            },
        )
        .unwrap();
        let s = r.register().unwrap();
        let b = r.bucket(0).unwrap();
        b.publish(300_000, LimiterState::DegradedIdentity.code());
        b.set_utilization(291_000, UtilSource::Markers.code(), 5, 100_000_000);
        r.slot_pacing(s).set_state(
            LimiterState::DegradedIdentity.code(),
            DegradedReason::IdentityFailed.code(),
            7,
        );
        r.slot_pacing(s).add_launches(0, 12, 3000);
        let snap = Region::open_read_only(&p).unwrap().snapshot();
        let out = render_with(&snap, &owner_status);
        for want in [
            "limiter:",
            "[0] DegradedIdentity  share 30.0%",
            "utilization 29.1% over 100 ms (Markers)",
            &format!(
                "#{} DegradedIdentity (IdentityFailed)  dev 0: 12 launches",
                s.0
            ),
            "waited 3 us",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }

    #[test]
    fn refused_file_is_explained_not_touched() {
        let dir = TempDir::new();
        let p = dir.path().join("cache");
        std::fs::write(&p, b"definitely not a region").unwrap();
        let code = run(Args {
            cache: Some(p.clone()),
            json: false,
            limits: None,
        })
        .unwrap();
        assert_eq!(code, ExitCode::from(1));
        assert_eq!(std::fs::read(&p).unwrap(), b"definitely not a region");
    }

    fn inspect_region(dir: &Path) -> (PathBuf, Region) {
        let p = dir.join("region.cache");
        let (r, _) = Region::open_or_create(
            &p,
            &CreateOptions {
                slots: 4,
                devices: vec![DeviceConfig {
                    uuid: "GPU-inspect-0".into(),
                    mem_limit: 1 << 30,
                    sm_limit: 0,
                }],
            },
        )
        .unwrap();
        (p, r)
    }

    #[test]
    fn shows_ceilings_and_each_containers_share_on_the_board() {
        let dir = TempDir::new();
        let (_p, r) = inspect_region(dir.path());
        let boards = dir.path().join("boards");
        std::fs::create_dir(&boards).unwrap();
        let now = vgpu_region::monotonic_ns();
        for (name, g, pace) in [("me", 300_000, 700_000), ("other", 300_000, 300_000)] {
            let mut w = vgpu_region::board::Writer::open(
                &vgpu_region::board::gpu_dir(&boards, "GPU-inspect-0"),
                name,
            )
            .unwrap();
            w.publish(&vgpu_region::board::Entry {
                guarantee_ppm: g,
                ceiling_ppm: 1_000_000,
                want_ppm: 1_000_000,
                used_ppm: pace,
                pace_ppm: pace,
                pid: 7,
                heartbeat_ns: now,
                seq: 0,
            })
            .unwrap();
        }
        let file = dir.path().join("limits");
        std::fs::write(
            &file,
            format!(
                "vgpu-limits 1\ndevice * sm=30\nsm-ceiling * 100\nboard {} me\n",
                boards.display()
            ),
        )
        .unwrap();
        let out = render_limits(&file, &limits::read_limits_file(&file), &r);
        for want in [
            "SM limit 30%  SM ceiling 100%",
            "(this container: me), 2 live entries:",
            "me (this)  guarantee 30.0%  ceiling 100.0%  wants 100.0%  used 70.0%  share now 70.0%",
            "other  guarantee 30.0%  ceiling 100.0%  wants 100.0%  used 30.0%  share now 30.0%",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }

    #[test]
    fn shows_the_limits_file_and_whether_the_header_agrees() {
        let dir = TempDir::new();
        let (p, r) = inspect_region(dir.path());
        let file = dir.path().join("limits");
        let none = render_limits(&file, &limits::read_limits_file(&file), &r);
        assert!(none.contains(": none (no operator file"), "{none}");
        std::fs::write(
            &file,
            "vgpu-limits 1\ndevice * memory=1073741824 sm=30\npriority 1\n",
        )
        .unwrap();
        let out = render_limits(&file, &limits::read_limits_file(&file), &r);
        for want in [
            "(the operator's file for this region by its path; it applies to a process that reads it",
            "the region does not record which file its processes read):",
            "[0] GPU-inspect-0  memory limit 1.0 GiB (1073741824)  SM limit 30%",
            "region copy DISAGREES: SM limit none in the header; a process reading the file enforces the file",
            "policy -, priority 1, suspended no",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        r.write_display_copy(&limits::read_limits_file(&file).unwrap())
            .unwrap();
        let out = render_limits(&file, &limits::read_limits_file(&file), &r);
        assert!(out.contains("(region copy agrees)"), "{out}");
        std::fs::write(&file, "vgpu-limits 7\n").unwrap();
        let out = render_limits(&file, &limits::read_limits_file(&file), &r);
        assert!(
            out.contains("UNUSABLE") && out.contains("version 7"),
            "{out}"
        );
        let lim = limits::read_limits_file(&file);
        let j = limits_json(&file, &lim, &r);
        assert_eq!(j["status"], "unusable");
        std::fs::write(&file, "vgpu-limits 1\ndevice GPU-inspect-0 memory=5\n").unwrap();
        let j = limits_json(&file, &limits::read_limits_file(&file), &r);
        assert_eq!(j["status"], "ok");
        assert_eq!(j["devices"][0]["applies"]["memory"], 5);
        assert_eq!(j["region_disagrees"][0]["field"], "memory limit");
        let _ = p;
    }

    #[test]
    fn a_fifo_at_the_region_path_is_refused_without_blocking() {
        let dir = TempDir::new();
        let p = dir.path().join("region.cache");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let pp = p.clone();
        std::thread::spawn(move || {
            let _ = tx.send(
                run(Args {
                    cache: Some(pp),
                    json: false,
                    limits: None,
                })
                .unwrap(),
            );
        });
        let code = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("vgpu inspect blocked on a FIFO");
        assert_eq!(code, ExitCode::from(1));
        // And a FIFO as the limits file next to a real region: shown as
        // unusable, not waited on.
        let dir = TempDir::new();
        let (p, r) = inspect_region(dir.path());
        let file = dir.path().join("limits");
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let out = render_limits(&file, &limits::read_limits_file(&file), &r);
        assert!(out.contains("UNUSABLE") && out.contains("FIFO"), "{out}");
        let _ = p;
    }
}
