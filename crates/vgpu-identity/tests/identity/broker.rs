//! Client and server over real Unix sockets: the happy path, every refusal
//! the client must make, and the server's bounds, stale-socket handling,
//! shutdown and metrics.
use crate::common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use common::RunningBroker;
use vgpu_identity::client::{self, BrokerError, ClientOptions, Stage, UnsafeEndpoint};
use vgpu_identity::codec::{self, FrameError, Response, Status};
use vgpu_identity::server::{Broker, BrokerConfig, MetricsServer, ServerError};
use vgpu_identity::{query_broker, FailureCode};

const D: Duration = Duration::from_millis(500);

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), None).unwrap();
}

#[test]
fn client_gets_its_own_pid() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    assert_eq!(query_broker(&b.path, D).unwrap(), std::process::id());
    common::eventually("ok == 1", || b.metrics.snapshot().ok == 1);
}

#[test]
fn many_threads_all_get_their_pid() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    let path = b.path.clone();
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let p = path.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    assert_eq!(query_broker(&p, D).unwrap(), std::process::id());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    common::eventually("ok == 640", || b.metrics.snapshot().ok == 640);
    let s = b.metrics.snapshot();
    assert_eq!(s.accepted, 640);
    assert_eq!(s.rejected_load + s.timeouts + s.bad_frames + s.io_errors, 0);
}

#[test]
fn missing_socket_falls_through() {
    let dir = common::sock_dir();
    let err = query_broker(&dir.path().join("absent.sock"), D).unwrap_err();
    assert!(matches!(err, BrokerError::Missing), "{err:?}");
    assert_eq!(err.failure_code(), FailureCode::BROKER_MISSING);
    let err = query_broker(Path::new("/nonexistent-dir/x/hostpid.sock"), D).unwrap_err();
    assert!(matches!(err, BrokerError::Missing), "{err:?}");
}

#[test]
fn symlinked_endpoint_is_refused() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&b.path, &link).unwrap();
    let err = query_broker(&link, D).unwrap_err();
    assert!(
        matches!(err, BrokerError::Unsafe(UnsafeEndpoint::Symlink)),
        "{err:?}"
    );
    assert_eq!(
        b.metrics.snapshot().accepted,
        0,
        "refused before connecting"
    );
}

#[test]
fn writable_parent_is_refused() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    for mode in [0o777, 0o775, 0o1777, 0o757] {
        chmod(dir.path(), mode);
        let err = query_broker(&b.path, D).unwrap_err();
        assert!(
            matches!(
                err,
                BrokerError::Unsafe(UnsafeEndpoint::ParentWritable { .. })
            ),
            "mode {mode:o}: {err:?}"
        );
    }
    chmod(dir.path(), 0o755);
    assert_eq!(query_broker(&b.path, D).unwrap(), std::process::id());
    assert_eq!(b.metrics.snapshot().accepted, 1);
}

#[test]
fn non_root_owned_socket_or_parent_is_refused() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    chown(&b.path, 65534);
    let err = query_broker(&b.path, D).unwrap_err();
    assert!(
        matches!(
            err,
            BrokerError::Unsafe(UnsafeEndpoint::SocketOwner {
                uid: 65534,
                trusted: 0
            })
        ),
        "{err:?}"
    );
    chown(&b.path, 0);
    chown(dir.path(), 65534);
    let err = query_broker(&b.path, D).unwrap_err();
    assert!(
        matches!(
            err,
            BrokerError::Unsafe(UnsafeEndpoint::ParentOwner { uid: 65534, .. })
        ),
        "{err:?}"
    );
    chown(dir.path(), 0);
    // A caller may trust another uid explicitly.
    let opts = ClientOptions {
        trusted_uid: 65534,
        ..ClientOptions::default()
    };
    assert!(matches!(
        client::query_broker_with(&b.path, &opts),
        Err(BrokerError::Unsafe(UnsafeEndpoint::SocketOwner {
            uid: 0,
            trusted: 65534
        }))
    ));
    assert_eq!(b.metrics.snapshot().accepted, 0);
}

#[test]
fn non_socket_files_are_refused() {
    let dir = common::sock_dir();
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"").unwrap();
    let err = query_broker(&file, D).unwrap_err();
    assert!(
        matches!(err, BrokerError::Unsafe(UnsafeEndpoint::NotSocket { .. })),
        "{err:?}"
    );
    let sub = dir.path().join("dir.sock");
    std::fs::create_dir(&sub).unwrap();
    let err = query_broker(&sub, D).unwrap_err();
    assert!(
        matches!(err, BrokerError::Unsafe(UnsafeEndpoint::NotSocket { .. })),
        "{err:?}"
    );
    // The file is untouched.
    assert!(file.exists());
}

#[test]
fn server_answering_pid_zero_is_refused() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    let (_l, t) = common::fake_server(&path, |mut s| {
        common::read_request(&mut s);
        s.write_all(&codec::encode_response(Response::ok(0)))
            .unwrap();
    });
    let err = query_broker(&path, D).unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(err, BrokerError::Frame(FrameError::BadPid(0))),
        "{err:?}"
    );
    assert_eq!(err.failure_code(), FailureCode::BROKER_BAD_FRAME);
}

#[test]
fn wrong_version_is_refused() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    let (_l, t) = common::fake_server(&path, |mut s| {
        common::read_request(&mut s);
        s.write_all(b"HPID\x00\x02\x00\x00\x00\x00\x1f\x4b")
            .unwrap();
    });
    let err = query_broker(&path, D).unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(err, BrokerError::Frame(FrameError::UnsupportedVersion(2))),
        "{err:?}"
    );
}

#[test]
fn partial_frame_then_eof_is_refused() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    let (_l, t) = common::fake_server(&path, |mut s| {
        common::read_request(&mut s);
        // A short write in two pieces, then close.
        s.write_all(b"HPI").unwrap();
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        s.write_all(b"D\x00").unwrap();
    });
    let err = query_broker(&path, D).unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(
            err,
            BrokerError::Frame(FrameError::Truncated { got: 5, want: 12 })
        ),
        "{err:?}"
    );
}

#[test]
fn split_response_is_reassembled() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    let (_l, t) = common::fake_server(&path, |mut s| {
        common::read_request(&mut s);
        let f = codec::encode_response(Response::ok(4242));
        for b in f {
            s.write_all(&[b]).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    assert_eq!(query_broker(&path, D).unwrap(), 4242);
    t.join().unwrap();
}

#[test]
fn server_closing_without_answer_is_refused() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    let (_l, t) = common::fake_server(&path, drop);
    let err = query_broker(&path, D).unwrap_err();
    t.join().unwrap();
    // The write hit the closed peer, or the read saw EOF at 0 bytes or a
    // reset (the peer closed with our request unread).
    assert!(
        matches!(
            err,
            BrokerError::Frame(FrameError::Truncated { got: 0, .. })
                | BrokerError::Os {
                    stage: Stage::Write | Stage::Read,
                    ..
                }
        ),
        "{err:?}"
    );
}

#[test]
fn server_that_never_answers_hits_the_deadline() {
    let dir = common::sock_dir();
    let path = dir.path().join("s.sock");
    // Accepts, reads the request, and holds the connection open.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (_l, t) = common::fake_server(&path, move |mut s| {
        common::read_request(&mut s);
        let _ = rx.recv();
    });
    let err = query_broker(&path, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(err, BrokerError::Timeout { stage: Stage::Read }),
        "{err:?}"
    );
    assert_eq!(err.failure_code(), FailureCode::BROKER_TIMEOUT);
    tx.send(()).unwrap();
    t.join().unwrap();

    // A listener that never accepts: connect succeeds into the backlog, the
    // read still ends at the deadline. A 10 s deadline is clamped to 500 ms.
    let path2 = dir.path().join("never.sock");
    let _l2 = UnixListener::bind(&path2).unwrap();
    let err = query_broker(&path2, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, BrokerError::Timeout { .. }), "{err:?}");
}

#[test]
fn refused_connection_is_an_error() {
    let dir = common::sock_dir();
    let path = dir.path().join("dead.sock");
    drop(UnixListener::bind(&path).unwrap());
    let err = query_broker(&path, D).unwrap_err();
    assert!(
        matches!(
            err,
            BrokerError::Os {
                stage: Stage::Connect,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.failure_code(), FailureCode::BROKER_CONNECT);
}

#[test]
fn busy_answer_past_the_bound() {
    let dir = common::sock_dir();
    let b = RunningBroker::start(BrokerConfig {
        socket: dir.path().join("b.sock"),
        max_concurrent: 1,
        deadline: Duration::from_secs(5),
        ..BrokerConfig::default()
    });
    // The first silent connection occupies the only handler.
    let mut first = UnixStream::connect(&b.path).unwrap();
    while b.metrics.snapshot().accepted < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The second is silent too and finds the bound reached.
    let mut second = UnixStream::connect(&b.path).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut resp = vec![];
    second.read_to_end(&mut resp).unwrap();
    assert_eq!(
        codec::decode_response(&resp),
        Ok(Response::error(Status::BUSY))
    );
    assert_eq!(b.metrics.snapshot().rejected_load, 1);
    // The first still gets its answer.
    first
        .write_all(&codec::encode_request(codec::Request::GET_PID))
        .unwrap();
    let mut resp = [0u8; 12];
    first.read_exact(&mut resp).unwrap();
    assert_eq!(
        codec::decode_response(&resp),
        Ok(Response::ok(std::process::id()))
    );
    // A client seeing BUSY reports the status.
    assert_eq!(
        BrokerError::Status(Status::BUSY).failure_code(),
        FailureCode::BROKER_STATUS
    );
}

/// A server answering BUSY `busy` times, then OK with `pid`.
fn busy_then_ok(path: &Path, busy: usize, pid: u32) -> std::thread::JoinHandle<usize> {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut served = 0;
        for (i, s) in l.incoming().enumerate() {
            let mut s = s.unwrap();
            common::read_request(&mut s);
            let r = if i < busy {
                Response::error(Status::BUSY)
            } else {
                Response::ok(pid)
            };
            s.write_all(&codec::encode_response(r)).unwrap();
            served += 1;
            if i >= busy {
                break;
            }
        }
        served
    })
}

#[test]
fn busy_is_retried_within_the_deadline() {
    let dir = common::sock_dir();
    let path = dir.path().join("busy.sock");
    let t = busy_then_ok(&path, 3, 777);
    assert_eq!(query_broker(&path, D).unwrap(), 777);
    assert_eq!(t.join().unwrap(), 4, "three BUSY answers, then one OK");

    // Without retry the first BUSY is the answer.
    let path2 = dir.path().join("busy2.sock");
    let t = busy_then_ok(&path2, 1, 778);
    let opts = ClientOptions {
        retry_busy: false,
        ..ClientOptions::default()
    };
    let err = client::query_broker_with(&path2, &opts).unwrap_err();
    assert!(matches!(err, BrokerError::Status(Status::BUSY)), "{err:?}");
    assert_eq!(query_broker(&path2, D).unwrap(), 778);
    t.join().unwrap();
}

#[test]
fn always_busy_ends_in_busy_not_a_hang() {
    let dir = common::sock_dir();
    let path = dir.path().join("busy.sock");
    let l = UnixListener::bind(&path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = std::thread::spawn(move || {
        l.set_nonblocking(true).unwrap();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    common::read_request(&mut s);
                    let _ = s.write_all(&codec::encode_response(Response::error(Status::BUSY)));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    let err = query_broker(&path, Duration::from_millis(100)).unwrap_err();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    t.join().unwrap();
    assert!(matches!(err, BrokerError::Status(Status::BUSY)), "{err:?}");
}

#[test]
fn split_request_is_reassembled_by_a_handler() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    let mut s = UnixStream::connect(&b.path).unwrap();
    let req = codec::encode_request(codec::Request::GET_PID);
    s.write_all(&req[..3]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(&req[3..]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = vec![];
    s.read_to_end(&mut out).unwrap();
    assert_eq!(
        codec::decode_response(&out),
        Ok(Response::ok(std::process::id()))
    );
    assert_eq!(b.metrics.snapshot().ok, 1);
}

#[test]
fn silent_client_is_cut_at_the_deadline() {
    let dir = common::sock_dir();
    let b = RunningBroker::start(BrokerConfig {
        socket: dir.path().join("b.sock"),
        deadline: Duration::from_millis(50),
        ..BrokerConfig::default()
    });
    let mut s = UnixStream::connect(&b.path).unwrap();
    s.write_all(b"HPI").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = vec![];
    s.read_to_end(&mut out).unwrap();
    assert!(
        out.is_empty(),
        "no answer to an incomplete request: {out:?}"
    );
    assert_eq!(b.metrics.snapshot().timeouts, 1);
    assert_eq!(b.metrics.snapshot().ok, 0);
}

#[test]
fn shutdown_removes_the_socket_and_stale_one_is_replaced() {
    let dir = common::sock_dir();
    let path = dir.path().join("run/vgpu/hostpid.sock");
    // A stale socket left by a dead broker (same owner, nobody listening).
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    chmod(path.parent().unwrap(), 0o755);
    drop(UnixListener::bind(&path).unwrap());
    let b = RunningBroker::start(BrokerConfig {
        socket: path.clone(),
        ..BrokerConfig::default()
    });
    assert_eq!(query_broker(&path, D).unwrap(), std::process::id());
    let mode = std::fs::symlink_metadata(&path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666, "clients of any uid can connect");
    b.stop();
    assert!(!path.exists(), "socket removed on shutdown");
}

#[test]
fn creates_a_protected_directory() {
    let dir = common::sock_dir();
    let path = dir.path().join("a/b/hostpid.sock");
    let b = RunningBroker::start(BrokerConfig {
        socket: path.clone(),
        ..BrokerConfig::default()
    });
    let mode = std::fs::metadata(path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(query_broker(&path, D).unwrap(), std::process::id());
    drop(b);
}

#[test]
fn bind_refuses_what_it_must_not_touch() {
    let dir = common::sock_dir();
    let cfg = |p: &Path| BrokerConfig {
        socket: p.to_owned(),
        ..BrokerConfig::default()
    };
    // A regular file is not removed.
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"keep me").unwrap();
    let err = Broker::bind(cfg(&file)).unwrap_err();
    assert!(matches!(err, ServerError::NotSocket { .. }), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    // A socket owned by someone else is not removed.
    let foreign = dir.path().join("foreign.sock");
    drop(UnixListener::bind(&foreign).unwrap());
    chown(&foreign, 65534);
    let err = Broker::bind(cfg(&foreign)).unwrap_err();
    assert!(
        matches!(err, ServerError::ForeignSocket { uid: 65534, .. }),
        "{err}"
    );
    assert!(foreign.exists());
    // A live broker is not displaced.
    let live = RunningBroker::at(dir.path());
    let err = Broker::bind(cfg(&live.path)).unwrap_err();
    assert!(matches!(err, ServerError::AlreadyServing(_)), "{err}");
    assert_eq!(query_broker(&live.path, D).unwrap(), std::process::id());
    // A world-writable directory is refused (clients would refuse it too).
    let ww = dir.path().join("ww");
    std::fs::create_dir(&ww).unwrap();
    chmod(&ww, 0o777);
    let err = Broker::bind(cfg(&ww.join("s.sock"))).unwrap_err();
    assert!(matches!(err, ServerError::DirWritable { .. }), "{err}");
    // Nonsense settings.
    let err = Broker::bind(BrokerConfig {
        max_concurrent: 0,
        ..cfg(&dir.path().join("x.sock"))
    })
    .unwrap_err();
    assert!(matches!(err, ServerError::Config(_)), "{err}");
}

#[test]
fn metrics_endpoint_serves_counters() {
    let dir = common::sock_dir();
    let b = RunningBroker::at(dir.path());
    assert_eq!(query_broker(&b.path, D).unwrap(), std::process::id());
    common::raw_exchange(&b.path, b"XXXX\x00\x01\x00\x01", false);
    common::eventually("both answered", || {
        let s = b.metrics.snapshot();
        s.ok == 1 && s.bad_frames == 1
    });
    let m = MetricsServer::start("127.0.0.1:0".parse().unwrap(), b.metrics.clone()).unwrap();
    let mut s = std::net::TcpStream::connect(m.local_addr()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for want in [
        "vgpu_broker_accepted_total 2",
        "vgpu_broker_ok_total 1",
        "vgpu_broker_bad_frames_total{kind=\"bad_magic\"} 1",
        "vgpu_broker_bad_frames_total{kind=\"truncated\"} 0",
        "vgpu_broker_rejected_load_total 0",
        "vgpu_broker_timeouts_total 0",
        "vgpu_broker_peercred_failures_total 0",
        "vgpu_broker_request_duration_seconds_count 2",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    let mut s = std::net::TcpStream::connect(m.local_addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
}
