fn main() {
    // The simulated driver answers to the real driver's SONAME.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
