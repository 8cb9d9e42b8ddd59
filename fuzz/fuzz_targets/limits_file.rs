//! Fuzzes the limits-file parser: any bytes; whatever parses must render to
//! text that parses back to the same value. Seeds:
//! `cargo +nightly fuzz run limits_file ../crates/vgpu-region/tests/data/limits-seeds`
//! (the same seeds are replayed on stable by crates/vgpu-region/tests/limits.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vgpu_region::limits::fuzz_limits(data);
});
