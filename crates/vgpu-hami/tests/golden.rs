//! Golden values in HAMi's exact formats (`testdata/golden/manifest.txt`
//! names the HAMi source of each): each decodes to the value below, and
//! what vgpu encodes from that value is the same bytes.
use std::path::PathBuf;

use vgpu_hami::register::{self, MigPlacement, MigProfile, NodeDevice};
use vgpu_hami::{ContainerDevice, Handshake, HandshakeState, NodeLock, PodDevices};

struct Golden {
    file: String,
    kind: String,
    source: String,
    value: String,
}

fn golden() -> Vec<Golden> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/golden");
    let manifest = std::fs::read_to_string(dir.join("manifest.txt")).unwrap();
    let out: Vec<Golden> = manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            let file = it.next().unwrap().to_owned();
            let kind = it.next().unwrap().to_owned();
            let source = it.collect::<Vec<_>>().join(" ");
            assert!(!source.is_empty(), "{file}: no HAMi source named");
            let value = std::fs::read_to_string(dir.join(&file)).unwrap();
            assert!(!value.ends_with('\n'), "{file}: trailing newline");
            Golden {
                file,
                kind,
                source,
                value,
            }
        })
        .collect();
    // Every file in the directory is listed.
    let listed: Vec<&str> = out.iter().map(|g| g.file.as_str()).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            name == "manifest.txt" || listed.contains(&name.as_str()),
            "{name} not in manifest"
        );
    }
    out
}

const A: &str = "GPU-5d1e3a9c-8f21-4c6b-9e02-7b4a1f6c3d88";

fn nv(uuid: &str, mem: u32, cores: u32) -> ContainerDevice {
    ContainerDevice::nvidia(uuid, mem, cores)
}

fn expected_devices(file: &str) -> PodDevices {
    let b = "GPU-0b2f6c1e-33aa-4d5e-8a90-1c2d3e4f5a6b";
    let c = "GPU-7e8f9a0b-1c2d-4e3f-9a5b-6c7d8e9f0a1b";
    let containers = match file {
        "device-list-two-containers.txt" => vec![vec![nv(A, 3000, 0)], vec![nv(A, 5000, 0)]],
        "device-list-init-multi-empty.txt" => {
            vec![vec![], vec![nv(b, 10240, 30), nv(c, 10240, 30)], vec![]]
        }
        "device-list-hami-after-first-allocate.txt" => vec![vec![], vec![nv(A, 5000, 0)], vec![]],
        "device-list-hami-all-served.txt" => vec![vec![]; 4],
        f => panic!("no expectation for {f}"),
    };
    PodDevices { containers }
}

fn a100(id: &str, index: u64, numa: i64) -> NodeDevice {
    NodeDevice {
        id: id.into(),
        index,
        count: 10,
        devmem: 81920,
        devcore: 100,
        device_type: "NVIDIA A100-SXM4-80GB".into(),
        numa,
        mode: "hami-core".into(),
        mig_profiles: vec![],
        health: true,
    }
}

fn expected_register(file: &str) -> Vec<NodeDevice> {
    let g0 = "GPU-4617e643-f070-4b90-b715-30c57f977a9a";
    match file {
        "node-register-two-gpus.json" => vec![
            a100(g0, 0, 0),
            a100("GPU-9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f", 1, 1),
        ],
        "node-register-scaled-unhealthy.json" => {
            // What HAMi's plugin computes for a 16 GiB "Tesla T4" at index 3
            // with split 4, memory scaling 1.5, core scaling 2, unhealthy.
            let d = NodeDevice::from_gpu(
                &register::GpuFacts {
                    uuid: "GPU-2b3c4d5e-6f70-4182-93a4-b5c6d7e8f901",
                    index: 3,
                    memory_bytes: 16 << 30,
                    model: "Tesla T4",
                    numa: 0,
                    healthy: false,
                },
                &register::RegisterScaling {
                    split_count: 4,
                    memory_scaling: 1.5,
                    core_scaling: 2.0,
                },
            );
            vec![d]
        }
        "node-register-mig.json" => vec![NodeDevice {
            count: 7,
            mode: "mig".into(),
            mig_profiles: vec![
                MigProfile {
                    name: "1g.10gb".into(),
                    memory_mb: 9728,
                    core: 15,
                    slice_count: 1,
                    placements: Some(vec![
                        MigPlacement { start: 0, size: 1 },
                        MigPlacement { start: 1, size: 1 },
                    ]),
                },
                MigProfile {
                    name: "7g.80gb".into(),
                    memory_mb: 81152,
                    core: 100,
                    slice_count: 8,
                    placements: None,
                },
            ],
            ..a100(g0, 0, 0)
        }],
        "node-register-legacy-7.txt" => {
            let v100 = |id: &str, numa, health| NodeDevice {
                id: id.into(),
                count: 10,
                devmem: 32768,
                devcore: 100,
                device_type: "NVIDIA-Tesla V100-PCIE-32GB".into(),
                numa,
                mode: "hami-core".into(),
                health,
                ..NodeDevice::default()
            };
            vec![
                v100("GPU-00aa11bb-22cc-33dd-44ee-55ff66778899", 0, true),
                v100("GPU-99887766-55ff-44ee-33dd-22cc11bb00aa", 1, false),
            ]
        }
        "node-register-legacy-9.txt" => vec![NodeDevice {
            id: "GPU-00aa11bb-22cc-33dd-44ee-55ff66778899".into(),
            index: 2,
            count: 10,
            devmem: 32768,
            devcore: 100,
            device_type: "NVIDIA-Tesla V100-PCIE-32GB".into(),
            mode: "hami-core".into(),
            health: true,
            ..NodeDevice::default()
        }],
        f => panic!("no expectation for {f}"),
    }
}

#[test]
fn every_golden_value_decodes_and_reencodes() {
    let all = golden();
    assert!(all.len() >= 14);
    for g in &all {
        let ctx = format!("{} ({})", g.file, g.source);
        match g.kind.as_str() {
            "device-list" => {
                let got = PodDevices::parse(&g.value).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(got, expected_devices(&g.file), "{ctx}");
                assert_eq!(got.encode().unwrap(), g.value, "{ctx}");
            }
            "register" => {
                let got = register::decode(&g.value).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(got, expected_register(&g.file), "{ctx}");
                assert_eq!(register::encode(&got), g.value, "{ctx}");
            }
            "register-legacy" => {
                let got =
                    register::decode_legacy(&g.value).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(got, expected_register(&g.file), "{ctx}");
                // The JSON form of the same devices is what vgpu writes.
                assert_eq!(
                    register::decode(&register::encode(&got)).unwrap(),
                    got,
                    "{ctx}"
                );
            }
            "lock" => {
                let l = NodeLock::parse(&g.value).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(l.to_string(), g.value, "{ctx}");
                assert_eq!(l.time.to_string(), "2025-06-01T08:30:00Z", "{ctx}");
                match g.file.as_str() {
                    "node-lock.txt" => assert!(l.is_held_by("gpu-jobs", "trainer-7")),
                    "node-lock-offset.txt" => {
                        assert!(l.is_held_by("default", "web-0"));
                        assert_eq!(l.offset.seconds(), 8 * 3600);
                    }
                    "node-lock-legacy.txt" => assert_eq!(l.owner, None),
                    f => panic!("no expectation for {f}"),
                }
            }
            "handshake" => {
                let h = Handshake::parse(&g.value).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(h.to_string(), g.value, "{ctx}");
                let want = match g.file.as_str() {
                    "handshake-requesting.txt" => (HandshakeState::Requesting, 0),
                    "handshake-reported.txt" => (HandshakeState::Reported, 5),
                    f => panic!("no expectation for {f}"),
                };
                assert_eq!((h.state, h.stamp.second() as i32), want, "{ctx}");
                assert_eq!((h.stamp.hour(), h.stamp.minute()), (8, 30), "{ctx}");
            }
            k => panic!("{ctx}: unknown kind {k}"),
        }
    }
}

#[test]
fn golden_values_pass_the_fuzz_invariants() {
    for g in golden() {
        vgpu_hami::fuzz_checks::check_all(g.value.as_bytes());
    }
}
