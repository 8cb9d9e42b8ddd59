//! Fuzzes the dynamic-symbol lookup the benchmarks use to find the
//! driver's own entry points (`vgpu_cuda_abi::elf`): any bytes, never a
//! panic. The same property is checked on stable by the module's test
//! over mutated copies of a real ELF image.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vgpu_cuda_abi::elf::dynsym_value(data, "cuLaunchKernel");
});
