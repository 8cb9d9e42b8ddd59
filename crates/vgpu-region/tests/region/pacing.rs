//! The pacing section on a real mapped file: shared between mappings and
//! processes, cleared with its slot, read-only mappings never write, and
//! four processes drawing on one bucket at once get exactly the time it
//! earned (no interval credited twice, none lost).
use std::time::Duration;

use vgpu_region::pacing::Bounds;
use vgpu_region::{monotonic_ns, CreateOptions, DeviceConfig, Region};

fn create(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("r");
    let opts = CreateOptions {
        slots: 8,
        devices: vec![
            DeviceConfig {
                uuid: "GPU-pace-0".into(),
                mem_limit: 0,
                sm_limit: 30,
            },
            DeviceConfig {
                uuid: "GPU-pace-1".into(),
                mem_limit: 0,
                sm_limit: 0,
            },
        ],
    };
    Region::open_or_create(&p, &opts).unwrap();
    p
}

#[test]
fn buckets_are_shared_per_device_and_slots_start_clean() {
    let dir = tempfile::tempdir().unwrap();
    let p = create(dir.path());
    let a = Region::open(&p).unwrap();
    let b = Region::open(&p).unwrap();
    let bounds = Bounds::new(1_000, -1_000);
    a.bucket(0).unwrap().refill(10, 300_000, bounds);
    a.bucket(0).unwrap().take(400, bounds);
    a.bucket(0).unwrap().add_charged(400);
    assert_eq!(b.bucket(0).unwrap().credit(), 600);
    assert_eq!(b.bucket(1).unwrap().credit(), 0, "one bucket per device");
    assert!(a.bucket(2).is_none(), "no such device");

    let s = a.register().unwrap();
    let sp = a.slot_pacing(s);
    sp.set_state(vgpu_region::LimiterState::Active.code(), 0, 5);
    sp.add_measured(0, 123);
    sp.add_launches(0, 2, 50);
    sp.set_estimate(0, 61);
    let snap = b.snapshot();
    let me = snap.slots.iter().find(|x| x.index == s.0).unwrap();
    assert_eq!(me.limiter.state, "Active");
    assert_eq!(me.limiter.devices[0].measured_ns, 123);
    assert_eq!(me.limiter.devices[0].launches, 2);
    assert_eq!(me.limiter.devices[0].waited_ns, 50);
    assert_eq!(me.limiter.devices[0].estimate_ns, 61);
    assert_eq!(snap.devices[0].pacing.credit_ns, 600);
    assert_eq!(snap.devices[0].pacing.charged_ns, 400);

    // A slot's next owner starts from zero.
    a.unregister(s);
    let s2 = a.register().unwrap();
    assert_eq!(s2, s);
    assert_eq!(a.slot_pacing(s2).state(), (0, 0, 0));
    assert_eq!(a.slot_pacing(s2).counters(0), (0, 0, 0, 0));
}

#[test]
fn read_only_mappings_never_write_pacing_cells() {
    let dir = tempfile::tempdir().unwrap();
    let p = create(dir.path());
    let w = Region::open(&p).unwrap();
    let s = w.register().unwrap();
    let before = std::fs::read(&p).unwrap();
    let r = Region::open_read_only(&p).unwrap();
    assert!(r.bucket(0).is_none());
    let sp = r.slot_pacing(s);
    sp.set_state(2, 0, 1);
    sp.add_measured(0, 5);
    assert_eq!(sp.counters(0), (0, 0, 0, 0));
    let snap = r.snapshot();
    assert_eq!(snap.devices[0].pacing.mode, "NotStarted");
    assert_eq!(snap.devices[0].pacing.util_source, "None");
    assert_eq!(std::fs::read(&p).unwrap(), before);
}

/// Four forked processes spin on one bucket at 25 % for 300 ms each,
/// taking 10 µs of GPU time whenever credit is positive. Each process
/// refills with its own clock readings; the total taken must match what the
/// wall time earned (a double-credited interval would show as up to 4×).
#[test]
fn processes_racing_on_one_bucket_get_what_it_earned() {
    let dir = tempfile::tempdir().unwrap();
    let p = create(dir.path());
    let region = Region::open(&p).unwrap();
    const RATE: u32 = 250_000;
    const TAKE: u64 = 10_000;
    const RUN_NS: u64 = 300_000_000;
    let bounds = Bounds::new(2_000_000, -2_000_000);
    let t_start = monotonic_ns();
    let mut kids = Vec::new();
    for _ in 0..4 {
        let mut fds = [0; 2];
        // SAFETY: a valid two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only touches the already mapped region
        // (atomics), reads the clock and writes to a pipe: no allocation,
        // no lock another thread could hold.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let b = region.bucket(0).unwrap();
            let start = monotonic_ns();
            let mut n: u64 = 0;
            loop {
                let now = monotonic_ns();
                if now - start >= RUN_NS {
                    break;
                }
                if b.refill(now, RATE, bounds) > 0 {
                    b.take(TAKE, bounds);
                    n += 1;
                }
            }
            // SAFETY: writing 8 bytes from a live local to our pipe end.
            unsafe {
                libc::write(fds[1], (&n as *const u64).cast(), 8);
                libc::_exit(0)
            }
        }
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        kids.push((pid, fds[0]));
    }
    let mut total = 0u64;
    for (pid, fd) in kids {
        let mut n = 0u64;
        // SAFETY: reading 8 bytes into a live local from our read end.
        let got = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
        assert_eq!(got, 8, "a child died without reporting");
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        // SAFETY: closing our read end.
        unsafe { libc::close(fd) };
        total += n;
    }
    let elapsed = monotonic_ns() - t_start;
    let taken = total * TAKE;
    // Earned over at least the 300 ms every child ran, at most the whole
    // span the parent saw, plus the first refill's burst; racers can each
    // overshoot by one take.
    let low = vgpu_region::pacing::earned(RUN_NS, RATE) as u64 - bounds.cap_ns as u64;
    let high = vgpu_region::pacing::earned(elapsed, RATE) as u64 + bounds.cap_ns as u64 + 4 * TAKE;
    assert!(
        (low..=high).contains(&taken),
        "taken {taken} ns, expected {low}..={high} (elapsed {:?})",
        Duration::from_nanos(elapsed)
    );
}
