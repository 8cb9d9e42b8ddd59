//! `vgpu limit <cache> [--memory SIZE] [--sm PERCENT] [--device N]`: changes
//! a live region's limits. Every process sees the new memory limit at its
//! next allocation; nothing already allocated is revoked.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use vgpu_region::units::{parse_mem_size, parse_sm_percent};
use vgpu_region::{Limits, Region};

#[derive(clap::Args)]
pub struct Args {
    /// The region file.
    pub cache: PathBuf,
    /// New memory limit: bytes or with k/m/g suffix ("4096m", "8GiB"); 0 or
    /// "none" removes the limit.
    #[arg(long)]
    pub memory: Option<String>,
    /// New SM limit in percent (0 or 100 = none).
    #[arg(long)]
    pub sm: Option<String>,
    /// Only this device (default: every device of the region).
    #[arg(long)]
    pub device: Option<u32>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.memory.is_none() && args.sm.is_none() {
        anyhow::bail!("nothing to change: give --memory and/or --sm");
    }
    let mem = match args.memory.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(0),
        Some(s) => Some(parse_mem_size(s).context("--memory")?),
    };
    let sm = match args.sm.as_deref() {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => Some(0),
        Some(s) => Some(parse_sm_percent(s).context("--sm")?),
    };
    // RegionError names the file and what failed.
    let r = Region::open(&args.cache)?;
    let devices: Vec<u32> = match args.device {
        Some(d) if d < r.device_count() => vec![d],
        Some(d) => anyhow::bail!(
            "--device {d}: region {} has {} devices",
            args.cache.display(),
            r.device_count()
        ),
        None if r.device_count() == 0 => {
            anyhow::bail!("region {} has no devices", args.cache.display())
        }
        None => (0..r.device_count()).collect(),
    };
    for d in devices {
        let old = r.limits(d);
        let new = Limits {
            mem: mem.unwrap_or(old.mem),
            sm: sm.map(|s| if s >= 100 { 0 } else { s }).unwrap_or(old.sm),
        };
        r.try_set_limits(d, new)?;
        println!(
            "device {d} ({}): memory limit {} -> {}, SM limit {} -> {} (in use {})",
            r.device_uuid(d),
            old.mem,
            new.mem,
            old.sm,
            new.sm,
            r.device_used(d)
        );
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
    use vgpu_region::{CreateOptions, DeviceConfig, MemKind};

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
        }
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
}
