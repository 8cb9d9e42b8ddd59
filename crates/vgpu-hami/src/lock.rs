//! The node lock value (`hami.io/mutex.lock`, HAMi
//! `pkg/util/nodelock/nodelock.go`): `<RFC3339>,<namespace>,<pod>` as
//! `GenerateNodeLockKeyByPod` writes it, or the legacy bare RFC 3339 stamp.
//! The scheduler sets it at bind (a merge patch guarded by the node's
//! resourceVersion); the device plugin releases it once the pod's devices
//! are handed out. A lock older than the expiry (default 5 min,
//! `HAMI_NODELOCK_EXPIRE`) or whose pod is gone may be broken.
//!
//! Stamps are parsed as Go's `time.Parse(time.RFC3339, ..)` accepts them
//! (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`) and formatted as
//! `time.Format(time.RFC3339)` does (no fraction, `Z` for UTC).

use std::fmt;
use std::time::Duration;

use jiff::civil::DateTime;
use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;

/// HAMi's default lock expiry.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// The pod holding a lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockOwner {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
}

/// A decoded lock value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLock {
    /// When it was taken.
    pub time: Timestamp,
    /// The UTC offset it was written with (kept so formatting round-trips).
    pub offset: Offset,
    /// The pod, absent in the legacy form.
    pub owner: Option<LockOwner>,
}

/// Why a lock value does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Not `stamp` or `stamp,namespace,pod`.
    #[error("node lock {0:?}: expected <RFC3339> or <RFC3339>,<namespace>,<pod>")]
    Shape(String),
    /// The stamp is not RFC 3339.
    #[error("node lock stamp {0:?} is not RFC 3339 (YYYY-MM-DDTHH:MM:SS[.f](Z|+HH:MM))")]
    Stamp(String),
}

fn digits(s: &[u8], at: usize, n: usize) -> Option<i64> {
    let part = s.get(at..at + n)?;
    if !part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(part.iter().fold(0i64, |v, b| v * 10 + i64::from(b - b'0')))
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.f](Z|±HH:MM)` (Go's RFC3339 layout).
pub fn parse_rfc3339(s: &str) -> Result<(Timestamp, Offset), LockError> {
    let bad = || LockError::Stamp(s.to_owned());
    let b = s.as_bytes();
    let sep_ok = b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':';
    if !sep_ok {
        return Err(bad());
    }
    let num = |at, n| digits(b, at, n).ok_or_else(bad);
    let (y, mo, d, h, mi, sec) = (
        num(0, 4)?,
        num(5, 2)?,
        num(8, 2)?,
        num(11, 2)?,
        num(14, 2)?,
        num(17, 2)?,
    );
    let mut i = 19;
    let mut nanos = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        if end == start || end - start > 9 {
            return Err(bad());
        }
        nanos = num(start, end - start)? * 10i64.pow(9 - (end - start) as u32);
        i = end;
    }
    let offset_secs = match &b[i..] {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let v = num(i + 1, 2)? * 3600 + num(i + 4, 2)? * 60;
            if num(i + 1, 2)? > 23 || num(i + 4, 2)? > 59 {
                return Err(bad());
            }
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return Err(bad()),
    };
    let dt = DateTime::new(
        y as i16,
        mo as i8,
        d as i8,
        h as i8,
        mi as i8,
        sec as i8,
        nanos as i32,
    )
    .map_err(|_| bad())?;
    let off = Offset::from_seconds(offset_secs as i32).map_err(|_| bad())?;
    let ts = off.to_timestamp(dt).map_err(|_| bad())?;
    Ok((ts, off))
}

/// Formats as Go's `Format(time.RFC3339)`: whole seconds, `Z` for a zero offset.
pub fn format_rfc3339(ts: Timestamp, off: Offset) -> String {
    let dt = ts.to_zoned(TimeZone::fixed(off)).datetime();
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    let secs = off.seconds();
    if secs == 0 {
        s.push('Z');
    } else {
        let a = secs.unsigned_abs();
        s.push_str(&format!(
            "{}{:02}:{:02}",
            if secs < 0 { '-' } else { '+' },
            a / 3600,
            (a % 3600) / 60
        ));
    }
    s
}

impl NodeLock {
    /// A lock taken now (`time`, written in UTC) by `namespace/pod`.
    pub fn new(time: Timestamp, namespace: &str, pod: &str) -> NodeLock {
        NodeLock {
            time,
            offset: Offset::UTC,
            owner: Some(LockOwner {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
            }),
        }
    }

    /// Decodes either form.
    pub fn parse(s: &str) -> Result<NodeLock, LockError> {
        let parts: Vec<&str> = s.split(',').collect();
        match parts.as_slice() {
            [stamp] => {
                let (time, offset) = parse_rfc3339(stamp)?;
                Ok(NodeLock {
                    time,
                    offset,
                    owner: None,
                })
            }
            [stamp, ns, pod] if !ns.is_empty() && !pod.is_empty() => {
                let (time, offset) = parse_rfc3339(stamp)?;
                Ok(NodeLock {
                    time,
                    offset,
                    owner: Some(LockOwner {
                        namespace: (*ns).to_owned(),
                        pod: (*pod).to_owned(),
                    }),
                })
            }
            _ => Err(LockError::Shape(s.to_owned())),
        }
    }

    /// True when older than `expiry` at `now`.
    pub fn is_expired(&self, now: Timestamp, expiry: Duration) -> bool {
        let age = now.as_nanosecond() - self.time.as_nanosecond();
        age > expiry.as_nanos() as i128
    }

    /// True when held by `namespace/pod` (a legacy lock names nobody).
    pub fn is_held_by(&self, namespace: &str, pod: &str) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.namespace == namespace && o.pod == pod)
    }
}

impl fmt::Display for NodeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_rfc3339(self.time, self.offset))?;
        if let Some(o) = &self.owner {
            write!(f, ",{},{}", o.namespace, o.pod)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let l = NodeLock::parse("2025-03-04T05:06:07Z,default,web-0").unwrap();
        assert!(l.is_held_by("default", "web-0"));
        assert_eq!(l.to_string(), "2025-03-04T05:06:07Z,default,web-0");
        let l = NodeLock::parse("2025-03-04T13:06:07+08:00").unwrap();
        assert_eq!(l.owner, None);
        assert_eq!(
            l.time.as_second(),
            NodeLock::parse("2025-03-04T05:06:07Z")
                .unwrap()
                .time
                .as_second()
        );
        assert_eq!(l.to_string(), "2025-03-04T13:06:07+08:00");
        let f = NodeLock::parse("2025-03-04T05:06:07.123456789-01:30").unwrap();
        assert_eq!(f.to_string(), "2025-03-04T05:06:07-01:30");
    }

    #[test]
    fn refused() {
        for s in [
            "",
            "2025-03-04 05:06:07Z",
            "2025-03-04T05:06:07",
            "2025-13-04T05:06:07Z",
            "2025-02-30T05:06:07Z",
            "2025-03-04T05:06:07Z,ns",
            "2025-03-04T05:06:07Z,ns,pod,x",
            "2025-03-04T05:06:07Z,,pod",
            "2025-03-04T05:06:07.Z",
            "2025-03-04T05:06:07+0800",
        ] {
            assert!(NodeLock::parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn expiry() {
        let l = NodeLock::parse("2025-03-04T05:06:07Z,a,b").unwrap();
        let now = l.time + jiff::SignedDuration::from_secs(301);
        assert!(l.is_expired(now, DEFAULT_EXPIRY));
        assert!(!l.is_expired(
            l.time + jiff::SignedDuration::from_secs(299),
            DEFAULT_EXPIRY
        ));
    }
}
