//! The strict `NStgid` parser over arbitrary status files.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vgpu_identity::fuzz_checks::check_nstgid(data);
});
