fn main() {
    // The simulated NVML answers to the real library's SONAME.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
