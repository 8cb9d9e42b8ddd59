//! One SM-bench tenant; started only by `vgpu bench sm` (see `vgpu_bench::sm::tenant`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(vgpu_bench::sm::tenant::main(&args));
}
