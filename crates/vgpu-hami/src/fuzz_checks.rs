//! Invariants checked on arbitrary input by the fuzz target
//! (`fuzz/fuzz_targets/hami_codecs.rs`) and replayed on stable by this
//! crate's proptests. Each function panics when an invariant breaks.

use crate::{register, Handshake, NodeLock, PodDevices};

/// Every decoder on the same bytes.
pub fn check_all(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    check_device_list(s);
    check_register(s);
    check_lock(s);
    check_handshake(s);
}

/// Decoding never panics; a decoded list re-encodes to a canonical value
/// that decodes to the same list and encodes to itself.
pub fn check_device_list(s: &str) {
    if let Ok(p) = PodDevices::parse(s) {
        let enc = p.encode().expect("a decoded list must re-encode");
        assert_eq!(PodDevices::parse(&enc).expect("canonical must decode"), p);
        assert_eq!(PodDevices::parse(&enc).unwrap().encode().unwrap(), enc);
        let served = p.containers.iter().filter(|c| c.is_empty()).count();
        assert!(served <= p.containers.len());
    }
}

/// JSON and legacy decoders never panic; JSON output decodes to the same
/// devices.
pub fn check_register(s: &str) {
    if let Ok(d) = register::decode(s) {
        let enc = register::encode(&d);
        assert_eq!(register::decode(&enc).expect("our JSON must decode"), d);
    }
    if let Ok(d) = register::decode_legacy(s) {
        let enc = register::encode(&d);
        assert_eq!(register::decode(&enc).expect("our JSON must decode"), d);
    }
}

/// A decoded lock formats to a value that decodes to the same instant,
/// offset and owner.
pub fn check_lock(s: &str) {
    if let Ok(l) = NodeLock::parse(s) {
        let again = NodeLock::parse(&l.to_string()).expect("formatted lock must decode");
        assert_eq!(again.offset, l.offset);
        assert_eq!(again.owner, l.owner);
        assert_eq!(again.time.as_second(), l.time.as_second());
    }
}

/// A decoded handshake formats to a value that decodes to itself.
pub fn check_handshake(s: &str) {
    if let Ok(h) = Handshake::parse(s) {
        let f = h.to_string();
        assert_eq!(
            Handshake::parse(&f).expect("formatted handshake must decode"),
            h
        );
    }
}
