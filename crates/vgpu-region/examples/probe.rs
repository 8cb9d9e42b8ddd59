use std::time::Instant;
fn main() {
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(std::fs::read("/proc/self/stat").unwrap());
    }
    println!("read /proc/self/stat {:?}", t.elapsed() / n);
    let pid = std::process::id();
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(std::fs::read(format!("/proc/{pid}/stat")).unwrap());
    }
    println!("read /proc/PID/stat {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(rustix::fs::stat("/proc/self/ns/pid").unwrap());
    }
    println!("stat ns {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(std::fs::read_link("/proc/self/ns/pid").unwrap());
    }
    println!("readlink ns {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(rustix::fs::stat(format!("/proc/{pid}").as_str()).unwrap());
    }
    println!("stat /proc/PID {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(rustix::process::getpid());
    }
    println!("getpid {:?}", t.elapsed() / n);
}
