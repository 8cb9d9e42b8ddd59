//! Invariants checked on arbitrary input by the fuzz targets
//! (`fuzz/fuzz_targets/identity_*.rs`) and replayed on stable by this
//! crate's proptests. Each function panics when an invariant breaks.
use crate::codec;
use crate::procfs::{self, MAX_NS_LEVELS};

/// Decoders never panic; whatever decodes re-encodes to the same bytes, and
/// whatever is refused has a listed kind.
pub fn check_frames(data: &[u8]) {
    match codec::decode_request(data) {
        Ok(req) => {
            assert_eq!(codec::encode_request(req).as_slice(), data);
            assert_eq!(req, codec::Request::GET_PID);
        }
        Err(e) => {
            assert!(codec::FRAME_ERROR_KINDS.contains(&e.kind()));
            if data.len() == codec::REQUEST_LEN {
                assert!(!matches!(
                    e,
                    codec::FrameError::Truncated { .. } | codec::FrameError::TrailingBytes { .. }
                ));
            }
        }
    }
    match codec::decode_response(data) {
        Ok(resp) => {
            assert_eq!(codec::encode_response(resp).as_slice(), data);
            if resp.status == codec::Status::OK {
                assert!((1..=codec::PID_MAX).contains(&resp.pid));
            }
        }
        Err(e) => assert!(codec::FRAME_ERROR_KINDS.contains(&e.kind())),
    }
}

/// The `NStgid` parser never panics; what it accepts is in range, bounded
/// in depth, and round-trips through the kernel's formatting.
pub fn check_nstgid(data: &[u8]) {
    if let Ok(ns) = procfs::parse_nstgid(data) {
        assert!(ns.depth() >= 1 && ns.depth() <= MAX_NS_LEVELS);
        for &p in ns.as_slice() {
            assert!((1..=codec::PID_MAX).contains(&p));
        }
        assert_eq!(ns.outermost(), ns.as_slice()[0]);
        let line: Vec<String> = ns.as_slice().iter().map(u32::to_string).collect();
        let again = procfs::parse_nstgid(format!("NStgid:\t{}\n", line.join("\t")).as_bytes());
        assert_eq!(again.as_ref().map(|n| n.as_slice()), Ok(ns.as_slice()));
    }
}
