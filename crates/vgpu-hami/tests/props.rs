//! Property tests: generated values round-trip through every codec, and
//! the fuzz target's invariants (`vgpu_hami::fuzz_checks`) hold on
//! arbitrary and mutated inputs.
use proptest::prelude::*;
use vgpu_hami::register::{self, NodeDevice};
use vgpu_hami::{fuzz_checks, ContainerDevice, Handshake, NodeLock, PodDevices};

fn uuid() -> impl Strategy<Value = String> {
    "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
}

fn device() -> impl Strategy<Value = ContainerDevice> {
    (uuid(), 0u32..=i32::MAX as u32, 0u32..=100)
        .prop_map(|(u, m, c)| ContainerDevice::nvidia(u, m, c))
}

fn pod() -> impl Strategy<Value = PodDevices> {
    prop::collection::vec(prop::collection::vec(device(), 0..4), 0..6)
        .prop_map(|containers| PodDevices { containers })
}

fn node_device() -> impl Strategy<Value = NodeDevice> {
    (
        uuid(),
        0u64..16,
        0i32..64,
        0i32..200_000,
        0i32..400,
        "[ -~]{0,24}",
        0i64..4,
        any::<bool>(),
    )
        .prop_map(
            |(id, index, count, devmem, devcore, device_type, numa, health)| NodeDevice {
                id,
                index,
                count,
                devmem,
                devcore,
                device_type,
                numa,
                mode: "hami-core".into(),
                mig_profiles: vec![],
                health,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn device_lists_round_trip(p in pod()) {
        let s = p.encode().unwrap();
        prop_assert_eq!(PodDevices::parse(&s).unwrap(), p);
    }

    #[test]
    fn popping_serves_every_container_once(p in pod()) {
        let mut q = p.clone();
        let mut served = vec![];
        while let Some((i, devs)) = q.pop_next() {
            prop_assert_eq!(&p.containers[i], &devs);
            served.push(i);
        }
        let want: Vec<usize> = (0..p.containers.len()).filter(|i| !p.containers[*i].is_empty()).collect();
        prop_assert_eq!(served, want);
        prop_assert!(q.all_served());
        // The emptied list keeps one entry per container.
        prop_assert_eq!(PodDevices::parse(&q.encode().unwrap()).unwrap().containers.len(), p.containers.len());
    }

    #[test]
    fn register_round_trips(d in prop::collection::vec(node_device(), 0..8)) {
        let s = register::encode(&d);
        prop_assert_eq!(register::decode(&s).unwrap(), d);
        prop_assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'));
    }

    #[test]
    fn lock_round_trips(secs in 0i64..4_000_000_000, off_min in -720i32..=840, ns in "[a-z0-9-]{1,20}", pod in "[a-z0-9.-]{1,40}") {
        let ts = jiff::Timestamp::from_second(secs).unwrap();
        let offset = jiff::tz::Offset::from_seconds(off_min * 60).unwrap();
        let l = NodeLock { offset, ..NodeLock::new(ts, &ns, &pod) };
        let again = NodeLock::parse(&l.to_string()).unwrap();
        prop_assert_eq!(again, l);
    }

    #[test]
    fn handshake_round_trips(secs in 0i64..4_000_000_000, req in any::<bool>()) {
        let dt = jiff::Timestamp::from_second(secs).unwrap().to_zoned(jiff::tz::TimeZone::UTC).datetime();
        let h = if req { Handshake::requesting(dt) } else { Handshake::reported(dt) };
        prop_assert_eq!(Handshake::parse(&h.to_string()).unwrap(), h);
    }

    #[test]
    fn arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..96)) {
        fuzz_checks::check_all(&data);
    }

    #[test]
    fn near_valid_text(s in "[GPU0-9a-f,:;NVIDIA\\-TZ_ .\\[\\]{}\"a-z]{0,80}") {
        fuzz_checks::check_all(s.as_bytes());
    }

    #[test]
    fn mutated_canonical(p in pod(), pos in 0usize..200, byte in prop::sample::select(vec![b',', b':', b';', b'-', b'0', b'x', b' '])) {
        let mut s = p.encode().unwrap().into_bytes();
        if let Some(b) = s.get_mut(pos) { *b = byte; }
        fuzz_checks::check_all(&s);
    }
}
