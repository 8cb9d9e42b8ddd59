//! The golden frames of `testdata/golden/` drive both halves: the codec,
//! the real server over a real socket, and the real client against a server
//! that replays each response.
use crate::common;

use std::io::Write;
use std::time::Duration;

use common::{Expect, RunningBroker};
use vgpu_identity::client::{BrokerError, ClientOptions};
use vgpu_identity::codec::{self, Request, Response, Status};

fn status_for_kind(kind: &str) -> Status {
    match kind {
        "bad_magic" => Status::BAD_MAGIC,
        "unsupported_version" => Status::UNSUPPORTED_VERSION,
        "unsupported_command" => Status::UNSUPPORTED_COMMAND,
        "truncated" | "trailing_bytes" => Status::MALFORMED,
        other => panic!("no request status for {other}"),
    }
}

#[test]
fn codec_matches_manifest() {
    for g in common::golden() {
        if g.is_request {
            let got = codec::decode_request(&g.bytes);
            match &g.expect {
                Expect::Ok(cmd) => {
                    assert_eq!(cmd, "get_pid", "{}", g.file);
                    assert_eq!(got, Ok(Request::GET_PID), "{}", g.file);
                    assert_eq!(
                        codec::encode_request(Request::GET_PID).as_slice(),
                        g.bytes,
                        "{}",
                        g.file
                    );
                }
                Expect::Error(kind) => {
                    assert_eq!(got.map_err(|e| e.kind()), Err(kind.as_str()), "{}", g.file)
                }
                Expect::Status(_) => panic!("{}: requests have no status", g.file),
            }
        } else {
            let got = codec::decode_response(&g.bytes);
            match &g.expect {
                Expect::Ok(pid) => {
                    let pid: u32 = pid.parse().unwrap();
                    assert_eq!(got, Ok(Response::ok(pid)), "{}", g.file);
                    assert_eq!(
                        codec::encode_response(Response::ok(pid)).as_slice(),
                        g.bytes,
                        "{}",
                        g.file
                    );
                }
                Expect::Status(s) => {
                    assert_eq!(got, Ok(Response::error(Status(*s))), "{}", g.file);
                    assert_eq!(
                        codec::encode_response(Response::error(Status(*s))).as_slice(),
                        g.bytes
                    );
                }
                Expect::Error(kind) => {
                    assert_eq!(got.map_err(|e| e.kind()), Err(kind.as_str()), "{}", g.file)
                }
            }
        }
    }
}

#[test]
fn server_answers_each_golden_request() {
    let dir = common::sock_dir();
    let broker = RunningBroker::at(dir.path());
    let mut expected_bad = 0;
    for g in common::golden().into_iter().filter(|g| g.is_request) {
        // Truncated frames are only complete once the peer closes its side.
        let answer = common::raw_exchange(&broker.path, &g.bytes, g.file.contains("truncated"));
        let resp = codec::decode_response(&answer).unwrap_or_else(|e| panic!("{}: {e}", g.file));
        match &g.expect {
            Expect::Ok(_) => assert_eq!(resp, Response::ok(std::process::id()), "{}", g.file),
            Expect::Error(kind) => {
                expected_bad += 1;
                assert_eq!(resp, Response::error(status_for_kind(kind)), "{}", g.file);
                let kind: &'static str = codec::FRAME_ERROR_KINDS
                    .iter()
                    .find(|k| *k == kind)
                    .unwrap();
                assert_eq!(broker.metrics.bad_frames_of(kind), 1, "{}", g.file);
            }
            Expect::Status(_) => unreachable!(),
        }
    }
    let snap = broker.metrics.snapshot();
    assert_eq!(snap.ok, 1);
    assert_eq!(snap.bad_frames, expected_bad);
    assert_eq!(snap.accepted, 1 + expected_bad);
}

#[test]
fn client_handles_each_golden_response() {
    let valid_request = common::golden_file("request_valid.bin");
    for g in common::golden().into_iter().filter(|g| !g.is_request) {
        let dir = common::sock_dir();
        let path = dir.path().join("fake.sock");
        let bytes = g.bytes.clone();
        let want_req = valid_request.clone();
        let (_l, t) = common::fake_server(&path, move |mut s| {
            assert_eq!(common::read_request(&mut s).as_slice(), want_req);
            s.write_all(&bytes).unwrap();
            // Closing after the frame makes a short frame end in EOF.
        });
        // One answer per frame: no retry on BUSY here.
        let opts = ClientOptions {
            deadline: Duration::from_millis(500),
            retry_busy: false,
            ..ClientOptions::default()
        };
        let got = vgpu_identity::client::query_broker_with(&path, &opts);
        t.join().unwrap();
        match (&g.expect, got) {
            (Expect::Ok(pid), Ok(p)) => assert_eq!(p.to_string(), *pid, "{}", g.file),
            (Expect::Status(s), Err(BrokerError::Status(st))) => {
                assert_eq!(st, Status(*s), "{}", g.file)
            }
            (Expect::Error(kind), Err(BrokerError::Frame(e))) => {
                assert_eq!(e.kind(), kind, "{}", g.file)
            }
            (want, got) => panic!("{}: expected {want:?}, got {got:?}", g.file),
        }
    }
}
