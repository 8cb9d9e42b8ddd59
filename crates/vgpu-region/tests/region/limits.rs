//! The limits file on real files: strict reads that never follow a symlink,
//! never block on a FIFO and never read unbounded input; atomic writes with
//! an explicit mode; a property-tested round trip; the fuzz seeds.
use crate::common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use vgpu_region::limits::*;

const TEXT: &str =
    "vgpu-limits 1\ndevice GPU-a memory=1073741824 sm=30\ndevice * memory=2147483648\n";

#[test]
fn reads_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("limits");
    std::fs::write(&p, TEXT).unwrap();
    let l = read_limits_file(&p).unwrap();
    assert_eq!(l.for_device("GPU-a").sm, Some(30));
    assert_eq!(l.for_device("GPU-b").memory, Some(2 << 30));
    // A parse error names the file and the line.
    std::fs::write(&p, "vgpu-limits 1\n\ndevice * memory=lots\n").unwrap();
    let e = read_limits_file(&p).unwrap_err();
    assert_eq!(e.line(), Some(3));
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{}: line 3:", p.display())) && msg.contains("lots"),
        "{msg}"
    );
    std::fs::write(&p, "vgpu-limits 2\ndevice * memory=1\n").unwrap();
    assert!(matches!(
        read_limits_file(&p),
        Err(LimitsError::Parse {
            line: 1,
            problem: ParseProblem::UnsupportedVersion { .. },
            ..
        })
    ));
    assert!(read_limits_file(&dir.path().join("none"))
        .unwrap_err()
        .is_not_found());
}

#[test]
fn never_follows_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, TEXT).unwrap();
    let p = dir.path().join("limits");
    std::os::unix::fs::symlink(&target, &p).unwrap();
    assert!(matches!(
        read_limits_file(&p),
        Err(LimitsError::Symlink { .. })
    ));
}

#[test]
fn a_fifo_or_directory_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    common::mkfifo(&fifo);
    let f = fifo.clone();
    let r = common::within(20, move || read_limits_file(&f));
    assert!(
        matches!(&r, Err(LimitsError::NotRegularFile { kind: "FIFO", .. })),
        "{r:?}"
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let d = dir.path().to_owned();
    assert!(matches!(
        common::within(20, move || read_limits_file(&d)),
        Err(LimitsError::NotRegularFile {
            kind: "directory",
            ..
        })
    ));
    // A character device that never ends: refused before any read.
    assert!(matches!(
        common::within(20, || read_limits_file(Path::new("/dev/zero"))),
        Err(LimitsError::NotRegularFile { .. })
    ));
}

#[test]
fn at_most_64_kib() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("limits");
    let mut text = TEXT.to_owned();
    let pad = "# padding to the limit\n";
    while text.len() + pad.len() <= MAX_FILE_LEN {
        text.push_str(pad);
    }
    text.push_str(&"#".repeat(MAX_FILE_LEN - text.len()));
    assert_eq!(text.len(), MAX_FILE_LEN);
    std::fs::write(&p, &text).unwrap();
    assert!(read_limits_file(&p).is_ok(), "exactly 64 KiB is accepted");
    text.push('#');
    std::fs::write(&p, &text).unwrap();
    assert!(matches!(
        read_limits_file(&p),
        Err(LimitsError::TooLarge { .. })
    ));
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn writes_atomically_with_mode_0644_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("limits");
    // A restrictive umask in a separate process (the umask is process-wide).
    let out = Command::new("sh")
        .arg("-c")
        .arg("umask 077 && exec \"$0\" limits-write \"$1\" \"$2\"")
        .arg(common::WORKER)
        .arg(&p)
        .arg(TEXT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, FILE_MODE, "mode {mode:o}");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), TEXT);
    assert_eq!(entries(dir.path()), ["limits"], "no temporary left");
    // Rewriting replaces the file (a new inode), contents whole.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
    let mut l = read_limits_file(&p).unwrap();
    l.suspended = Some(true);
    write_limits_file_atomic(&p, &l).unwrap();
    assert_eq!(read_limits_file(&p).unwrap(), l);
    assert_ne!(
        ino,
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap())
    );
}

#[test]
fn a_symlink_at_the_path_is_replaced_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"untouched").unwrap();
    let p = dir.path().join("limits");
    std::os::unix::fs::symlink(&victim, &p).unwrap();
    write_limits_file_atomic(&p, &Limits::parse(TEXT).unwrap()).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");
    assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file());
    assert_eq!(std::fs::read_to_string(&p).unwrap(), TEXT);
}

#[test]
fn an_invalid_value_is_refused_and_the_old_file_stays() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("limits");
    std::fs::write(&p, TEXT).unwrap();
    let mut l = Limits::parse(TEXT).unwrap();
    l.devices[0].memory = Some(0);
    assert!(matches!(
        write_limits_file_atomic(&p, &l),
        Err(LimitsError::Invalid { .. })
    ));
    l.devices[0].memory = Some(1);
    l.devices[0].device = Device::Uuid("has space".into());
    assert!(write_limits_file_atomic(&p, &l).is_err());
    assert_eq!(std::fs::read_to_string(&p).unwrap(), TEXT);
    assert_eq!(entries(dir.path()), ["limits"]);
    // A missing directory is an I/O error naming it.
    let e = write_limits_file_atomic(&dir.path().join("no/limits"), &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no"), "{e}");
}

/// A reader racing a writer sees one whole file or the other, never a mix.
#[test]
fn readers_see_whole_files_while_the_operator_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let p: PathBuf = dir.path().join("limits");
    let many = |mem: u64| {
        let mut l = Limits::default();
        for i in 0..200 {
            l.devices.push(DeviceLine {
                device: Device::Uuid(format!("GPU-{i:04}")),
                memory: Some(mem),
                sm: Some(50),
            });
        }
        l
    };
    let (a, b) = (many(111), many(222));
    write_limits_file_atomic(&p, &a).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (p, a, b, stop) = (p.clone(), a.clone(), b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 50 {
                let l = read_limits_file(&p).expect("every read parses");
                assert!(l == a || l == b, "a torn read");
                reads += 1;
            }
            reads
        })
    };
    for i in 0..200 {
        write_limits_file_atomic(&p, if i % 2 == 0 { &b } else { &a }).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() >= 50);
}

/// Seeds of `fuzz/fuzz_targets/limits_file.rs`, replayed on stable.
#[test]
fn fuzz_seeds_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/limits-seeds");
    let mut n = 0;
    let mut parsed = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        fuzz_limits(&data);
        parsed += usize::from(Limits::parse_bytes(&data).is_ok());
        n += 1;
    }
    assert!(n >= 5, "seed corpus missing from {}", dir.display());
    assert!(
        parsed >= 2 && parsed < n,
        "seeds cover accepted and refused"
    );
}

fn device() -> impl Strategy<Value = Device> {
    prop_oneof![
        1 => Just(Device::Any),
        4 => "[A-Za-z0-9_.:/-]{1,63}".prop_map(Device::Uuid),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    let line = (
        device(),
        proptest::option::of(1..=u64::MAX),
        proptest::option::of(1u32..=100),
    )
        .prop_map(|(device, memory, sm)| DeviceLine { device, memory, sm });
    let policy = proptest::option::of(prop_oneof![
        Just(Policy::Default),
        Just(Policy::Force),
        Just(Policy::Disable)
    ]);
    (
        proptest::collection::vec(line, 0..8),
        policy,
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(0u32..=100),
        proptest::collection::vec((device(), 1u32..=100), 0..4),
        proptest::option::of(("/[a-z0-9/_.-]{0,20}", "[a-z0-9_-][a-z0-9_.-]{0,20}")),
    )
        .prop_map(
            |(mut devices, policy, priority, suspended, hold, mut ceilings, board)| {
                // One line per device (UUIDs compare ignoring ASCII case).
                let mut seen: Vec<String> = Vec::new();
                devices.retain(|d| {
                    let k = d.device.as_str().to_ascii_lowercase();
                    let fresh = !seen.contains(&k);
                    seen.push(k);
                    fresh
                });
                let mut seen: Vec<String> = Vec::new();
                ceilings.retain(|(d, _)| {
                    let k = d.as_str().to_ascii_lowercase();
                    let fresh = !seen.contains(&k);
                    seen.push(k);
                    fresh
                });
                Limits {
                    devices,
                    policy,
                    priority,
                    suspended,
                    hold,
                    ceilings,
                    board: board.map(|(dir, name)| vgpu_region::limits::BoardRef {
                        dir: dir.into(),
                        name,
                    }),
                }
            },
        )
}

/// Text built from the grammar's own pieces, mangled: reaches deeper than
/// random bytes.
fn near_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("vgpu-limits 1\n".to_owned()),
        Just("vgpu-limits 2\n".to_owned()),
        Just("device ".to_owned()),
        Just("* ".to_owned()),
        Just("GPU-x ".to_owned()),
        Just("memory=".to_owned()),
        Just("sm=".to_owned()),
        Just("sm-ceiling * 60\n".to_owned()),
        Just("board /b ctr\n".to_owned()),
        Just("policy force".to_owned()),
        Just("priority -1".to_owned()),
        Just("suspended 1".to_owned()),
        Just("hold 10".to_owned()),
        Just("# c".to_owned()),
        Just("\n".to_owned()),
        Just("\t".to_owned()),
        "[0-9]{1,21}",
        "\\PC{0,3}",
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn render_parse_round_trip(l in limits()) {
        prop_assert!(l.validate().is_ok());
        let text = l.render();
        let back = Limits::parse(&text).unwrap();
        prop_assert_eq!(&back, &l);
        prop_assert_eq!(back.render(), text);
        // Lookup agrees with the lines.
        for d in &l.devices {
            if let Device::Uuid(u) = &d.device {
                let got = l.for_device(&u.to_ascii_uppercase());
                prop_assert_eq!(got.memory, d.memory);
                prop_assert_eq!(got.sm, d.sm.filter(|&s| s < 100));
            }
        }
    }

    #[test]
    fn parsing_never_panics_and_what_parses_round_trips(t in near_text()) {
        fuzz_limits(t.as_bytes());
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        fuzz_limits(&data);
    }
}

#[test]
fn a_priority_hold_parses_renders_and_is_bounded() {
    let l = Limits::parse("vgpu-limits 1\npriority 1\nhold 10\n").unwrap();
    assert_eq!(l.hold, Some(10));
    assert_eq!(Limits::parse(&l.render()).unwrap(), l);
    assert!(l.render().contains("hold 10\n"));
    for bad in ["hold 101", "hold -1", "hold x", "hold 010", "hold 1 2"] {
        let t = format!("vgpu-limits 1\n{bad}\n");
        assert!(Limits::parse(&t).is_err(), "{bad:?} accepted");
    }
    assert!(
        Limits::parse("vgpu-limits 1\nhold 0\nhold 5\n").is_err(),
        "twice"
    );
    let mut v = l.clone();
    v.hold = Some(200);
    assert!(v.validate().is_err());
}
