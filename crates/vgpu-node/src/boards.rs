//! The node side of lending (docs/limiter.md, "Guarantees and ceilings"):
//! every entry on the GPUs' lending boards checked against the operator's
//! limits file of the container it names. A tenant writes its own entry
//! (the board is how containers of one GPU see each other), so an entry
//! may lie; the law never paces anyone below its own guarantee whatever
//! the board says, so a lie can only take lent time, and this is where
//! the node catches it (`vgpu_board_audit_violations`, a warning).
//!
//! Reads only: never writes a board entry or a limits file.

use std::path::Path;

use vgpu_limiter::policy::Settings;
use vgpu_region::board::{self, Entry};
use vgpu_region::limits::Limits;

use crate::layout::Layout;

/// One entry that does not match its container's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The entry's name: the container key (`<podUID>_<container>`).
    pub key: String,
    /// The GPU's UUID (the board directory).
    pub uuid: String,
    /// What is wrong, in words.
    pub why: String,
}

/// (guarantee, ceiling) in ppm that the operator's limits give container
/// `limits` on GPU `uuid`: the rule the interposer publishes by.
pub fn expected(limits: &Limits, uuid: &str) -> (u32, u32) {
    let s = Settings {
        sm_limit: limits.for_device(uuid).sm,
        sm_ceiling: limits.ceiling_for(uuid),
        ..Settings::default()
    };
    s.guarantee_and_ceiling()
}

/// The decision for one entry, pure: `None` when it follows the protocol.
/// An entry whose container has no readable limits file is a violation
/// too (nothing the operator wrote stands behind it).
pub fn check(key: &str, uuid: &str, e: &Entry, limits: Option<&Limits>) -> Option<Violation> {
    let why = match limits {
        None => Some("no limits file of the operator names this container".to_owned()),
        Some(l) => {
            let (g, c) = expected(l, uuid);
            board::audit(e, g, c)
        }
    }?;
    Some(Violation {
        key: key.to_owned(),
        uuid: uuid.to_owned(),
        why,
    })
}

/// Every fresh entry of every GPU's board under `layout`, checked
/// (stale entries are containers that stopped: nobody reads them).
pub fn audit_all(layout: &Layout, now_ns: u64) -> Vec<Violation> {
    let mut out = Vec::new();
    let Ok(gpus) = std::fs::read_dir(layout.boards_dir()) else {
        return out;
    };
    let mut entries = Vec::new();
    for gpu in gpus.filter_map(|e| e.ok()) {
        let Ok(uuid) = gpu.file_name().into_string() else {
            continue;
        };
        entries.clear();
        if board::read(&gpu.path(), now_ns, &mut entries).is_err() {
            continue;
        }
        for (key, e) in &entries {
            let limits = read_limits(&layout.limits_file(key));
            if let Some(v) = check(key, &uuid, e, limits.as_ref()) {
                out.push(v);
            }
        }
    }
    out.sort_by(|a, b| (&a.key, &a.uuid).cmp(&(&b.key, &b.uuid)));
    out
}

fn read_limits(path: &Path) -> Option<Limits> {
    Limits::parse(&std::fs::read_to_string(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_region::limits::Device;

    fn entry(g: u32, c: u32, pace: u32) -> Entry {
        Entry {
            guarantee_ppm: g,
            ceiling_ppm: c,
            pace_ppm: pace,
            ..Entry::default()
        }
    }

    fn limits(text: &str) -> Limits {
        Limits::parse(text).unwrap()
    }

    #[test]
    fn the_rule_matches_the_interposers() {
        let l = limits("vgpu-limits 1\ndevice GPU-a sm=30\n");
        assert_eq!(expected(&l, "GPU-a"), (300_000, 300_000));
        let mut l2 = l.clone();
        l2.set_ceiling(&Device::Any, Some(60));
        assert_eq!(expected(&l2, "GPU-a"), (300_000, 600_000));
        // No SM line: best effort, ceiling the whole device.
        let be = limits("vgpu-limits 1\ndevice GPU-a memory=1048576\n");
        assert_eq!(expected(&be, "GPU-a"), (0, 1_000_000));
    }

    #[test]
    fn honest_entries_pass_and_each_lie_is_named() {
        let mut l = limits("vgpu-limits 1\ndevice GPU-a sm=30\n");
        l.set_ceiling(&Device::Any, Some(60));
        let ok = entry(300_000, 600_000, 550_000);
        assert_eq!(check("p_c", "GPU-a", &ok, Some(&l)), None);
        let more = check("p_c", "GPU-a", &entry(900_000, 600_000, 0), Some(&l)).unwrap();
        assert!(more.why.contains("guarantee"), "{more:?}");
        let higher = check("p_c", "GPU-a", &entry(300_000, 1_000_000, 0), Some(&l)).unwrap();
        assert!(higher.why.contains("ceiling"), "{higher:?}");
        let fast = check("p_c", "GPU-a", &entry(300_000, 600_000, 800_000), Some(&l)).unwrap();
        assert!(fast.why.contains("paces"), "{fast:?}");
        let orphan = check("p_c", "GPU-a", &ok, None).unwrap();
        assert!(orphan.why.contains("limits file"), "{orphan:?}");
    }

    #[test]
    fn audit_all_reads_the_boards_and_the_limits_files() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        let now = vgpu_region::monotonic_ns();
        for (key, text) in [
            ("good_main", "vgpu-limits 1\ndevice GPU-a sm=30\n"),
            ("liar_main", "vgpu-limits 1\ndevice GPU-a sm=20\n"),
        ] {
            let f = l.limits_file(key);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, text).unwrap();
        }
        // The operator's board directory exists (the agent makes it).
        std::fs::create_dir_all(l.boards_dir()).unwrap();
        let dir = board::gpu_dir(&l.boards_dir(), "GPU-a");
        for (key, g) in [
            ("good_main", 300_000),
            ("liar_main", 500_000),
            ("nofile_main", 100_000),
        ] {
            let mut w = board::Writer::open(&dir, key).unwrap();
            let mut e = entry(g, g, g);
            e.heartbeat_ns = now;
            w.publish(&e).unwrap();
        }
        let v = audit_all(&l, now);
        let keys: Vec<&str> = v.iter().map(|v| v.key.as_str()).collect();
        assert_eq!(keys, ["liar_main", "nofile_main"], "{v:?}");
        assert!(v[0].why.contains("guarantee"), "{v:?}");
        assert_eq!(v[0].uuid, "GPU-a");
        // Long after: every entry is stale, nobody reads them, nothing to say.
        assert!(audit_all(&l, now + 10 * board::FRESH_NS).is_empty());
    }
}
