//! Fuzzes the shared-region header parser: first 8 bytes = claimed file
//! length (LE), the rest = header bytes. Seeds:
//! `cargo +nightly fuzz run region_header ../crates/vgpu-region/tests/data/header-seeds`
//! (the same seeds are replayed on stable by crates/vgpu-region/tests/format.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vgpu_region::layout::fuzz_header(data);
});
