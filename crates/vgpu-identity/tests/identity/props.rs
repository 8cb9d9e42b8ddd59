//! Property tests replaying the fuzz targets' checks
//! (`vgpu_identity::fuzz_checks`, shared with `fuzz/fuzz_targets/identity_*`)
//! on stable, plus generated near-valid inputs.
use crate::common;

use proptest::prelude::*;
use vgpu_identity::codec::{self, FrameError, Response, Status};
use vgpu_identity::fuzz_checks;
use vgpu_identity::procfs::{parse_nstgid, ParseError, MAX_NS_LEVELS};

fn sep() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![Just('\t'), Just(' ')], 1..3)
        .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn frames_arbitrary(data in prop::collection::vec(any::<u8>(), 0..32)) {
        fuzz_checks::check_frames(&data);
    }

    #[test]
    fn frames_mutated_golden(idx in 0usize..13, pos in 0usize..13, byte in any::<u8>(), cut in 0usize..14) {
        let g = common::golden();
        let mut data = g[idx % g.len()].bytes.clone();
        if let Some(b) = data.get_mut(pos) {
            *b = byte;
        }
        data.truncate(cut.max(1));
        fuzz_checks::check_frames(&data);
    }

    #[test]
    fn response_roundtrip(pid in 1u32..=codec::PID_MAX, status in any::<u16>()) {
        let ok = codec::encode_response(Response::ok(pid));
        prop_assert_eq!(codec::decode_response(&ok), Ok(Response::ok(pid)));
        let r = Response { version: codec::VERSION, status: Status(status), pid };
        let dec = codec::decode_response(&codec::encode_response(r));
        prop_assert_eq!(dec, Ok(r));
    }

    #[test]
    fn request_one_bad_field_one_kind(version in any::<u16>(), command in any::<u16>()) {
        let mut f = codec::encode_request(codec::Request::GET_PID);
        f[4..6].copy_from_slice(&version.to_be_bytes());
        f[6..8].copy_from_slice(&command.to_be_bytes());
        let got = codec::decode_request(&f);
        if version != codec::VERSION {
            prop_assert_eq!(got, Err(FrameError::UnsupportedVersion(version)));
        } else if command != 1 {
            prop_assert_eq!(got, Err(FrameError::UnsupportedCommand(command)));
        } else {
            prop_assert!(got.is_ok());
        }
    }

    #[test]
    fn nstgid_arbitrary(data in prop::collection::vec(any::<u8>(), 0..128)) {
        fuzz_checks::check_nstgid(&data);
        let mut with_key = b"NStgid:".to_vec();
        with_key.extend_from_slice(&data);
        fuzz_checks::check_nstgid(&with_key);
    }

    #[test]
    fn nstgid_generated(
        pids in prop::collection::vec(1u32..=codec::PID_MAX, 1..=MAX_NS_LEVELS + 2),
        seps in prop::collection::vec(sep(), MAX_NS_LEVELS + 3),
        trailing in sep(),
    ) {
        let mut line = String::from("NStgid:");
        for (p, s) in pids.iter().zip(&seps) {
            line.push_str(s);
            line.push_str(&p.to_string());
        }
        line.push_str(&trailing);
        let status = format!("Name:\tw\nTgid:\t{}\n{line}\nNSpid:\t1\n", pids[0]);
        fuzz_checks::check_nstgid(status.as_bytes());
        let got = parse_nstgid(status.as_bytes());
        if pids.len() > MAX_NS_LEVELS {
            prop_assert_eq!(got, Err(ParseError::TooDeep));
        } else {
            let got = got.unwrap();
            prop_assert_eq!(got.as_slice(), pids.as_slice());
            prop_assert_eq!(got.outermost(), pids[0]);
        }
    }

    #[test]
    fn nstgid_junk_field_refused(
        pids in prop::collection::vec(1u32..1_000_000, 1..4),
        at in 0usize..4,
        junk in "[-+a-zA-Z0,.;\\r]{1,3}",
    ) {
        let mut fields: Vec<String> = pids.iter().map(u32::to_string).collect();
        let i = at % fields.len();
        fields[i] = format!("{}{junk}", fields[i]);
        let line = format!("NStgid:\t{}\n", fields.join("\t"));
        // Either the junk made a field non-decimal, or (a trailing '0') kept
        // it decimal: then it must parse to exactly that number or be out of
        // range.
        match parse_nstgid(line.as_bytes()) {
            Err(ParseError::NotDecimal { index, .. }) => prop_assert_eq!(index, i),
            Err(ParseError::OutOfRange { index }) => prop_assert_eq!(index, i),
            Ok(ns) => {
                prop_assert!(junk.bytes().all(|b| b == b'0'));
                prop_assert_eq!(ns.as_slice()[i].to_string(), fields[i].clone());
            }
            Err(e) => prop_assert!(false, "unexpected {e:?}"),
        }
    }
}

#[test]
fn golden_frames_pass_the_fuzz_checks() {
    for g in common::golden() {
        fuzz_checks::check_frames(&g.bytes);
    }
}
