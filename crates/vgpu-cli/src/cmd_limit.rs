//! `vgpu limit <cache> [--memory SIZE] [--sm PERCENT] [--device N]
//! [--limits FILE]`: the operator's way to change a container's limits. It
//! rewrites the limits file (docs/limits.md; found next to the region by
//! `limits::path_for_region` unless `--limits` names it), then updates the
//! region header's display copy and bumps its `limits_generation` so every
//! process re-reads the file. Nothing already allocated is revoked.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use vgpu_region::limits::{self, Device, Limits as LimitsFile};
use vgpu_region::units::{parse_mem_size, parse_sm_percent};
use vgpu_region::{Region, Unusable};

#[derive(clap::Args)]
pub struct Args {
    /// The region file.
    pub cache: PathBuf,
    /// New memory limit: bytes or with k/m/g suffix ("4096m", "8GiB"); 0 or
    /// "none" removes the limit.
    #[arg(long)]
    pub memory: Option<String>,
    /// New SM limit in percent (0, 100 or "none" = no limit): the
    /// guarantee (docs/limiter.md, "Guarantees and ceilings").
    #[arg(long, visible_alias = "sm-guarantee")]
    pub sm: Option<String>,
    /// New SM ceiling in percent ("none" removes it: the guarantee is a
    /// fixed cap): the most the container may reach while the GPU's other
    /// containers leave time unused (lending needs a `board` line).
    #[arg(long)]
    pub sm_ceiling: Option<String>,
    /// Only this device (the region's index; default: every device).
    #[arg(long)]
    pub device: Option<u32>,
    /// Priority hold in percent ("none" removes it): while a busy
    /// high-priority container shares the device, a low-priority one
    /// (`priority 1`) paces at min(its limit, the hold). Container-wide.
    #[arg(long)]
    pub hold: Option<String>,
    /// The limits file (default: found from the region's path, see
    /// docs/limits.md).
    #[arg(long)]
    pub limits: Option<PathBuf>,
}

fn show(n: Option<u64>, unit: &str) -> String {
    n.map_or_else(|| "none".into(), |v| format!("{v}{unit}"))
}

/// The file's starting point when none exists yet: what the region's
/// header recorded, device by device (a region made before limits files).
fn seed_from(r: &Region) -> LimitsFile {
    let mut l = LimitsFile::default();
    for d in 0..r.device_count() {
        let uuid = r.device_uuid(d);
        if uuid.is_empty() || l.devices.iter().any(|x| x.device.as_str() == uuid) {
            continue;
        }
        let cur = limits::DeviceLimit::from_region(r.limits(d));
        l.devices.push(limits::DeviceLine {
            device: Device::Uuid(uuid),
            memory: cur.memory,
            sm: cur.sm,
        });
    }
    l
}

/// Reads the limits file at `path`; `Ok(None)` when there is none.
pub fn read_existing(path: &Path) -> anyhow::Result<Option<LimitsFile>> {
    match limits::read_limits_file(path) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e).context("the limits file cannot be used (fix or remove it first)"),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.memory.is_none()
        && args.sm.is_none()
        && args.hold.is_none()
        && args.sm_ceiling.is_none()
    {
        bail!("nothing to change: give --memory, --sm, --sm-ceiling and/or --hold");
    }
    let ceiling = match args.sm_ceiling.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(None),
        Some(s) => match s.trim().trim_end_matches('%').parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => Some(Some(n)),
            _ => bail!("--sm-ceiling: {s:?} is not a percent 1..=100 or none"),
        },
    };
    let hold = match args.hold.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(None),
        Some(s) => match s.trim().trim_end_matches('%').parse::<u32>() {
            Ok(n) if n <= 100 => Some(Some(n)),
            _ => bail!("--hold: {s:?} is not a percent 0..=100 or none"),
        },
    };
    let mem = match args.memory.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(None),
        Some(s) => Some(Some(parse_mem_size(s).context("--memory")?).filter(|&m| m != 0)),
    };
    let sm = match args.sm.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(None),
        Some(s) => Some(Some(parse_sm_percent(s).context("--sm")?).filter(|&p| p != 0 && p < 100)),
    };
    let file = args
        .limits
        .clone()
        .unwrap_or_else(|| limits::path_for_region(&args.cache));
    // The region is optional: a limit may be set before any process ran.
    let region = match Region::open(&args.cache) {
        Ok(r) => Some(r),
        Err(e) if e.unusable() == Unusable::Missing => None,
        // RegionError names the file and what failed.
        Err(e) => return Err(e).context("the region (give an existing region file)"),
    };
    let old = read_existing(&file)?;
    let mut l = match (&old, &region) {
        (Some(l), _) => l.clone(),
        (None, Some(r)) => seed_from(r),
        (None, None) => LimitsFile::default(),
    };
    let targets: Vec<Device> = match (args.device, &region) {
        (Some(d), Some(r)) if d < r.device_count() => {
            let uuid = r.device_uuid(d);
            if uuid.is_empty() {
                bail!("--device {d}: the region records no UUID for it");
            }
            vec![Device::Uuid(uuid)]
        }
        (Some(d), Some(r)) => bail!(
            "--device {d}: region {} has {} devices",
            args.cache.display(),
            r.device_count()
        ),
        (Some(d), None) => bail!(
            "--device {d}: no region at {} to name its devices",
            args.cache.display()
        ),
        // Every device: each line the file has, and `*` for the rest.
        (None, _) => {
            let mut v: Vec<Device> = l.devices.iter().map(|x| x.device.clone()).collect();
            if !v.contains(&Device::Any) {
                v.push(Device::Any);
            }
            v
        }
    };
    for t in &targets {
        let line = l.line_mut(t);
        if let Some(m) = mem {
            line.memory = m;
        }
        if let Some(s) = sm {
            line.sm = s;
        }
        if let Some(c) = ceiling {
            l.set_ceiling(t, c);
        }
    }
    if let Some(h) = hold {
        l.hold = h;
    }
    limits::write_limits_file_atomic(&file, &l)
        .with_context(|| format!("writing the limits file {}", file.display()))?;
    println!(
        "limits file {} {}",
        file.display(),
        if old.is_some() { "updated" } else { "created" }
    );
    for t in &targets {
        let before = old
            .as_ref()
            .and_then(|o| o.devices.iter().find(|x| x.device == *t).cloned());
        let after = l.devices.iter().find(|x| x.device == *t);
        let ceil = |f: &LimitsFile| {
            f.ceilings
                .iter()
                .find(|(d, _)| d == t)
                .map(|(_, c)| u64::from(*c))
        };
        println!(
            "  device {}: memory {} -> {}, SM {} -> {}, SM ceiling {} -> {}",
            t.as_str(),
            show(before.as_ref().and_then(|b| b.memory), ""),
            show(after.and_then(|a| a.memory), ""),
            show(before.as_ref().and_then(|b| b.sm).map(u64::from), "%"),
            show(after.and_then(|a| a.sm).map(u64::from), "%"),
            show(old.as_ref().and_then(ceil), "%"),
            show(ceil(&l), "%"),
        );
    }
    match region {
        Some(r) => {
            let changes = r
                .write_display_copy(&l)
                .context("updating the region's display copy")?;
            for (d, old, new) in changes {
                println!(
                    "region device {d} ({}): memory limit {} -> {}, SM limit {} -> {} (in use {})",
                    r.device_uuid(d),
                    old.mem,
                    new.mem,
                    old.sm,
                    new.sm,
                    r.device_used(d)
                );
            }
        }
        None => println!(
            "no region at {} yet: its processes read the file when they start",
            args.cache.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `vgpu suspend|resume <cache> [--limits FILE]`.
#[derive(clap::Args)]
pub struct SuspendArgs {
    /// The region file.
    pub cache: PathBuf,
    /// The limits file (default: found from the region's path, see
    /// docs/limits.md).
    #[arg(long)]
    pub limits: Option<PathBuf>,
}

/// Suspends (`on`) or resumes a container: the limits file's `suspended`
/// field, then the region's generation bump, so every process's limiter
/// sees it within a control period. A suspended process's new launches
/// wait; its queries, synchronizes and memory calls answer.
pub fn suspend(args: SuspendArgs, on: bool) -> anyhow::Result<ExitCode> {
    let file = args
        .limits
        .clone()
        .unwrap_or_else(|| limits::path_for_region(&args.cache));
    let region = match Region::open(&args.cache) {
        Ok(r) => Some(r),
        Err(e) if e.unusable() == Unusable::Missing => None,
        Err(e) => return Err(e).context("the region (give an existing region file)"),
    };
    let old = read_existing(&file)?;
    let mut l = match (&old, &region) {
        (Some(l), _) => l.clone(),
        (None, Some(r)) => seed_from(r),
        (None, None) => LimitsFile::default(),
    };
    l.suspended = on.then_some(true);
    limits::write_limits_file_atomic(&file, &l)
        .with_context(|| format!("writing the limits file {}", file.display()))?;
    let what = if on { "suspended" } else { "resumed" };
    match region {
        Some(r) => {
            r.write_display_copy(&l)
                .context("updating the region's display copy")?;
            println!(
                "{}: {what} (limits file {}; every process sees it within one control period)",
                args.cache.display(),
                file.display()
            );
        }
        None => println!(
            "{}: {what} in the limits file {} (no region yet: its processes read it when they start)",
            args.cache.display(),
            file.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
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
    use vgpu_region::{CreateOptions, DeviceConfig, Limits, MemKind};

    fn region(dir: &std::path::Path) -> (PathBuf, Region) {
        let p = dir.join("cache");
        let dev = |i: u32| DeviceConfig {
            uuid: format!("GPU-{i}"),
            mem_limit: 1 << 30,
            sm_limit: 0,
        };
        let (r, _) = Region::open_or_create(
            &p,
            &CreateOptions {
                slots: 4,
                devices: vec![dev(0), dev(1)],
            },
        )
        .unwrap();
        (p, r)
    }

    fn args(p: &std::path::Path, mem: Option<&str>, sm: Option<&str>, dev: Option<u32>) -> Args {
        Args {
            cache: p.to_owned(),
            memory: mem.map(str::to_owned),
            sm: sm.map(str::to_owned),
            device: dev,
            limits: None,
            hold: None,
            sm_ceiling: None,
        }
    }

    #[test]
    fn a_ceiling_is_set_and_removed_in_the_file() {
        let dir = TempDir::new();
        let (p, _r) = region(dir.path());
        let mut a = args(&p, None, Some("30"), None);
        a.sm_ceiling = Some("80".into());
        run(a).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert_eq!(f.ceiling_for("GPU-anything"), Some(80));
        assert_eq!(f.for_device("GPU-anything").sm, Some(30));
        let mut a = args(&p, None, None, None);
        a.sm_ceiling = Some("none".into());
        run(a).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert_eq!(f.ceiling_for("GPU-anything"), None);
        let mut a = args(&p, None, None, None);
        a.sm_ceiling = Some("0".into());
        assert!(run(a).unwrap_err().to_string().contains("--sm-ceiling"));
    }

    #[test]
    fn changes_apply_to_a_live_region_at_the_next_reservation() {
        let dir = TempDir::new();
        let (p, r) = region(dir.path());
        let s = r.register().unwrap();
        r.reserve(s, 1, MemKind::Data, 100 << 20).unwrap();
        run(args(&p, Some("64m"), None, Some(1))).unwrap();
        assert_eq!(
            r.limits(1),
            Limits {
                mem: 64 << 20,
                sm: 0
            }
        );
        assert_eq!(r.limits(0).mem, 1 << 30);
        // Over the new limit: the next reservation is refused, nothing revoked.
        assert!(r.reserve(s, 1, MemKind::Data, 1).is_err());
        assert_eq!(r.device_used(1), 100 << 20);
        run(args(&p, None, Some("25"), None)).unwrap();
        assert_eq!(r.limits(0).sm, 25);
        assert_eq!(
            r.limits(1),
            Limits {
                mem: 64 << 20,
                sm: 25
            }
        );
        run(args(&p, Some("none"), Some("100"), Some(1))).unwrap();
        assert_eq!(r.limits(1), Limits { mem: 0, sm: 0 });
        r.reserve(s, 1, MemKind::Data, 10 << 30).unwrap();
    }

    #[test]
    fn bad_values_are_named_and_change_nothing() {
        let dir = TempDir::new();
        let (p, r) = region(dir.path());
        let e = format!("{:#}", run(args(&p, Some("12q"), None, None)).unwrap_err());
        assert!(e.contains("12q"), "{e}");
        let e = format!("{:#}", run(args(&p, None, Some("150"), None)).unwrap_err());
        assert!(e.contains("150"), "{e}");
        let e = format!(
            "{:#}",
            run(args(&p, Some("1g"), None, Some(7))).unwrap_err()
        );
        assert!(e.contains("--device 7"), "{e}");
        assert!(run(args(&p, None, None, None)).is_err());
        assert_eq!(r.limits(0).mem, 1 << 30);
        assert_eq!(r.limits(1).mem, 1 << 30);
    }

    #[test]
    fn the_limits_file_is_what_changes_and_the_header_follows() {
        let dir = TempDir::new();
        let (p, r) = region(dir.path());
        let g = r.limits_generation();
        run(args(&p, Some("2g"), Some("30"), Some(0))).unwrap();
        // `vgpu run` layout: next to the region.
        let file = dir.path().join("limits");
        let l = limits::read_limits_file(&file).unwrap();
        assert_eq!(
            l.for_device("GPU-0"),
            limits::DeviceLimit {
                memory: Some(2 << 30),
                sm: Some(30)
            }
        );
        // Seeded from the header for the device left alone.
        assert_eq!(l.for_device("GPU-1").memory, Some(1 << 30));
        assert_eq!(
            r.limits(0),
            vgpu_region::Limits {
                mem: 2 << 30,
                sm: 30
            }
        );
        assert!(r.limits_generation() > g);
        assert!(r.display_mismatches(&l).is_empty());
        // A tenant lowering its header copy changes nothing in the file;
        // the next `vgpu limit` writes the file's values back.
        r.set_limits(0, vgpu_region::Limits { mem: 0, sm: 0 });
        assert_eq!(r.display_mismatches(&l).len(), 2);
        run(args(&p, None, Some("40"), Some(1))).unwrap();
        assert_eq!(
            r.limits(0),
            vgpu_region::Limits {
                mem: 2 << 30,
                sm: 30
            }
        );
        assert_eq!(r.limits(1).sm, 40);
        // Every device: the `*` line too, for devices without their own.
        run(args(&p, Some("none"), None, None)).unwrap();
        let l = limits::read_limits_file(&file).unwrap();
        assert_eq!(l.for_device("GPU-other").memory, None);
        assert_eq!(r.limits(0).mem, 0);
        assert_eq!(r.limits(1).mem, 0);
    }

    #[test]
    fn the_node_agent_layout_and_an_explicit_file() {
        let dir = TempDir::new();
        let ctr = dir.path().join("containers").join("pod1_main");
        std::fs::create_dir_all(&ctr).unwrap();
        std::fs::create_dir_all(dir.path().join("limits").join("pod1_main")).unwrap();
        let (p, r) = region(&ctr);
        run(args(&p, Some("512m"), None, None)).unwrap();
        let file = dir.path().join("limits/pod1_main/limits");
        let l = limits::read_limits_file(&file).unwrap();
        assert_eq!(l.for_device("GPU-1").memory, Some(512 << 20));
        assert!(!ctr.join("limits").exists());
        assert_eq!(r.limits(1).mem, 512 << 20);
        // --limits wins over the rule.
        let other = dir.path().join("elsewhere");
        let mut a = args(&p, Some("1m"), None, Some(1));
        a.limits = Some(other.clone());
        run(a).unwrap();
        assert_eq!(
            limits::read_limits_file(&other)
                .unwrap()
                .for_device("GPU-1")
                .memory,
            Some(1 << 20)
        );
        // The node agent's directory missing: a clear error, nothing written.
        let lone = dir.path().join("containers").join("pod2_main");
        std::fs::create_dir_all(&lone).unwrap();
        let (p2, _r2) = region(&lone);
        let e = format!("{:#}", run(args(&p2, Some("1g"), None, None)).unwrap_err());
        assert!(e.contains("limits/pod2_main/limits"), "{e}");
    }

    #[test]
    fn a_bad_or_hostile_limits_file_is_refused_untouched() {
        let dir = TempDir::new();
        let (p, r) = region(dir.path());
        let file = dir.path().join("limits");
        std::fs::write(&file, "vgpu-limits 1\ndevice * memory=lots\n").unwrap();
        let e = format!("{:#}", run(args(&p, Some("1g"), None, None)).unwrap_err());
        assert!(e.contains("line 2"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "vgpu-limits 1\ndevice * memory=lots\n"
        );
        assert_eq!(r.limits(0).mem, 1 << 30);
        // A FIFO planted there: refused at once, never blocked on.
        std::fs::remove_file(&file).unwrap();
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let pp = p.clone();
        std::thread::spawn(move || {
            let _ = tx.send(format!(
                "{:#}",
                run(args(&pp, Some("1g"), None, None)).unwrap_err()
            ));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("vgpu limit blocked on a FIFO");
        assert!(e.contains("FIFO"), "{e}");
        // A symlink there is not followed either.
        std::fs::remove_file(&file).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "x").unwrap();
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        assert!(run(args(&p, Some("1g"), None, None)).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "x");
    }

    #[test]
    fn before_any_process_the_file_alone_is_written() {
        let dir = TempDir::new();
        let p = dir.path().join("region.cache");
        run(args(&p, Some("3g"), Some("20"), None)).unwrap();
        let l = limits::read_limits_file(&dir.path().join("limits")).unwrap();
        assert_eq!(
            l.for_device("GPU-any"),
            limits::DeviceLimit {
                memory: Some(3 << 30),
                sm: Some(20)
            }
        );
        assert!(!p.exists(), "no region is made");
        assert!(run(args(&p, Some("3g"), None, Some(0))).is_err());
    }

    #[test]
    fn suspend_and_resume_write_the_file_and_bump_the_generation() {
        let dir = TempDir::new();
        let (p, r) = region(dir.path());
        let g0 = r.limits_generation();
        let a = |p: &std::path::Path| SuspendArgs {
            cache: p.to_owned(),
            limits: None,
        };
        suspend(a(&p), true).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert!(f.is_suspended());
        // The region's limits are kept in the seeded file.
        assert_eq!(f.for_device("GPU-0").memory, Some(1 << 30));
        assert!(r.limits_generation() > g0);
        let g1 = r.limits_generation();
        suspend(a(&p), false).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert!(!f.is_suspended());
        assert!(r.limits_generation() > g1);
    }

    #[test]
    fn a_hold_is_written_and_removed() {
        let dir = TempDir::new();
        let (p, _r) = region(dir.path());
        let mut a = args(&p, None, None, None);
        a.hold = Some("10".into());
        run(a).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert_eq!(f.hold, Some(10));
        let mut a = args(&p, None, None, None);
        a.hold = Some("none".into());
        run(a).unwrap();
        let f = limits::read_limits_file(&limits::path_for_region(&p)).unwrap();
        assert_eq!(f.hold, None);
        let mut a = args(&p, None, None, None);
        a.hold = Some("101".into());
        assert!(run(a).is_err());
    }
}
