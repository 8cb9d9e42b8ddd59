//! Facts about host processes from the host's `/proc` (the agent runs with
//! `hostPID: true`): start time, PID namespace and the PID inside it. Used
//! to judge region slots of any namespace and to match a GPU process to its
//! slot. Reads only; a process that vanished reads as `None`.

use std::path::Path;

/// One process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Host PID.
    pub pid: u32,
    /// Start time, clock ticks since boot (`stat` field 22).
    pub start_time: u64,
    /// Inode of its PID namespace (`ns/pid`).
    pub pid_ns: Option<u64>,
    /// Its PID in that namespace (last `NSpid` value).
    pub ns_pid: Option<u32>,
}

/// `stat` field 22 from the text of `/proc/<pid>/stat` (the command name
/// may hold spaces and parentheses: fields are counted after the last `)`).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The last value of the `NSpid:` line of `/proc/<pid>/status`.
pub fn parse_ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The inode in a `pid:[4026531836]` link.
pub fn parse_ns_link(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// Start time of `pid`. Called for every GPU process at every scrape and
/// watchdog cycle, so one `read` into a stack buffer (a `stat` line is a few
/// hundred bytes) instead of `read_to_string`'s probing reads.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    use std::io::Read;
    let path = proc_root.join(format!("{pid}/stat"));
    let mut f = std::fs::File::open(&path).ok()?;
    let mut buf = [0u8; 2048];
    let n = f.read(&mut buf).ok()?;
    if n == buf.len() {
        // Longer than any stat line we know of: read it all.
        let mut rest = buf.to_vec();
        f.read_to_end(&mut rest).ok()?;
        return parse_start_time(&String::from_utf8_lossy(&rest));
    }
    parse_start_time(&String::from_utf8_lossy(&buf[..n]))
}

/// Everything known about `pid`.
pub fn info(proc_root: &Path, pid: u32) -> Option<ProcInfo> {
    let dir = proc_root.join(pid.to_string());
    let start_time = start_time(proc_root, pid)?;
    let pid_ns = std::fs::read_link(dir.join("ns/pid"))
        .ok()
        .and_then(|l| parse_ns_link(&l.to_string_lossy()));
    let ns_pid = std::fs::read_to_string(dir.join("status"))
        .ok()
        .and_then(|s| parse_ns_pid(&s));
    Some(ProcInfo {
        pid,
        start_time,
        pid_ns,
        ns_pid,
    })
}

/// Every numeric entry of `proc_root`.
pub fn list_pids(proc_root: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// True when `pid` runs and (if given) started at `start_time`.
pub fn alive(proc_root: &Path, pid: u32, start: Option<u64>) -> bool {
    match start_time(proc_root, pid) {
        None => false,
        Some(t) => start.is_none_or(|s| s == t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        let stat = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 12345 678";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_ns_pid("Name:\tx\nNSpid:\t4242\t7\t1\n"), Some(1));
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_ns_link("net:[1]"), None);
        let me = std::process::id();
        let i = info(Path::new("/proc"), me).unwrap();
        assert!(i.start_time > 0 && i.pid_ns.is_some());
        assert!(alive(Path::new("/proc"), me, Some(i.start_time)));
        assert!(!alive(Path::new("/proc"), me, Some(i.start_time + 1)));
        assert!(list_pids(Path::new("/proc")).contains(&me));
    }
}
