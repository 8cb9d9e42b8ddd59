//! HAMi contract decoders (device list, node registration, node lock,
//! handshake) over arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vgpu_hami::fuzz_checks::check_all(data);
});
