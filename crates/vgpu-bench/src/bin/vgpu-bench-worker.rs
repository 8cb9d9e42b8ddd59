//! One burst worker; started only by `vgpu bench init` (see `vgpu_bench::worker`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(vgpu_bench::worker::run(&args));
}
