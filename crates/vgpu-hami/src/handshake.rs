//! The node handshake (`hami.io/node-handshake`, HAMi
//! `pkg/device/devices.go` `CheckHealth`): the scheduler writes
//! `Requesting_<stamp>` in its local time (Go layout `time.DateTime`,
//! `2006-01-02 15:04:05`) whenever the value is not a request (missing,
//! `Reported_…`, `Deleted_…`), and leaves a standing request alone. HAMi
//! v2.10's device plugin never writes the key: `Reported_<stamp>` is what
//! earlier plugins answered (`docs/develop/protocol.md`) and is only read
//! here, so that an answer from such a plugin makes the scheduler ask
//! again; `Deleted_` likewise. The scheduler calls a node unhealthy only
//! when a `Requesting` stamp is over 60 s old and the node's allocatable
//! GPU count is 0 (then HAMi's scheduler removes the key and asks anew).
//!
//! Older writers used `2006.01.02 15:04:05`; both separators decode.

use std::fmt;
use std::time::Duration;

use jiff::civil::DateTime;

/// How old a `Requesting` stamp may get before HAMi looks at allocatable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Who wrote the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeState {
    /// The scheduler asks the node to show it is alive.
    Requesting,
    /// The node side answered.
    Reported,
    /// The node was cleaned up.
    Deleted,
}

impl HandshakeState {
    /// The value's prefix word.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeState::Requesting => "Requesting",
            HandshakeState::Reported => "Reported",
            HandshakeState::Deleted => "Deleted",
        }
    }
}

/// A decoded handshake value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The state word.
    pub state: HandshakeState,
    /// The writer's local civil time.
    pub stamp: DateTime,
}

/// Why a handshake value does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// No known `<State>_` prefix.
    #[error("handshake {0:?}: expected Requesting_, Reported_ or Deleted_ followed by a stamp")]
    Shape(String),
    /// The stamp is not `2006-01-02 15:04:05`.
    #[error("handshake stamp {0:?} is not YYYY-MM-DD HH:MM:SS")]
    Stamp(String),
}

fn parse_stamp(s: &str) -> Result<DateTime, HandshakeError> {
    let bad = || HandshakeError::Stamp(s.to_owned());
    let b = s.as_bytes();
    // Go accepts a fractional second after the seconds even when the layout
    // has none.
    let main = b.get(..19).ok_or_else(bad)?;
    let rest = &b[19..];
    if !(rest.is_empty()
        || (rest.len() >= 2 && rest[0] == b'.' && rest[1..].iter().all(u8::is_ascii_digit)))
    {
        return Err(bad());
    }
    let dsep = main[4];
    if !(dsep == b'-' || dsep == b'.')
        || main[7] != dsep
        || main[10] != b' '
        || main[13] != b':'
        || main[16] != b':'
    {
        return Err(bad());
    }
    let n = |at: usize, len: usize| -> Result<i64, HandshakeError> {
        let p = &main[at..at + len];
        if !p.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        Ok(p.iter().fold(0i64, |v, d| v * 10 + i64::from(d - b'0')))
    };
    DateTime::new(
        n(0, 4)? as i16,
        n(5, 2)? as i8,
        n(8, 2)? as i8,
        n(11, 2)? as i8,
        n(14, 2)? as i8,
        n(17, 2)? as i8,
        0,
    )
    .map_err(|_| bad())
}

impl Handshake {
    /// `Requesting_<now>`.
    pub fn requesting(now: DateTime) -> Handshake {
        Handshake {
            state: HandshakeState::Requesting,
            stamp: now,
        }
    }

    /// `Reported_<now>`.
    pub fn reported(now: DateTime) -> Handshake {
        Handshake {
            state: HandshakeState::Reported,
            stamp: now,
        }
    }

    /// Decodes a value.
    pub fn parse(s: &str) -> Result<Handshake, HandshakeError> {
        let (word, stamp) = s
            .split_once('_')
            .ok_or_else(|| HandshakeError::Shape(s.to_owned()))?;
        let state = match word {
            "Requesting" => HandshakeState::Requesting,
            "Reported" => HandshakeState::Reported,
            "Deleted" => HandshakeState::Deleted,
            _ => return Err(HandshakeError::Shape(s.to_owned())),
        };
        Ok(Handshake {
            state,
            stamp: parse_stamp(stamp)?,
        })
    }

    /// True for a `Requesting` value older than `timeout` at `now` (both in
    /// the same local civil time).
    pub fn request_expired(&self, now: DateTime, timeout: Duration) -> bool {
        if self.state != HandshakeState::Requesting {
            return false;
        }
        match now.duration_since(self.stamp).as_secs() {
            secs if secs < 0 => false,
            secs => secs as u64 > timeout.as_secs(),
        }
    }
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.stamp;
        write!(
            f,
            "{}_{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
            self.state.as_str(),
            d.year(),
            d.month(),
            d.day(),
            d.hour(),
            d.minute(),
            d.second()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_forms() {
        for s in [
            "Requesting_2025-03-04 05:06:07",
            "Reported_2025-12-31 23:59:59",
            "Deleted_2025-01-01 00:00:00",
        ] {
            assert_eq!(Handshake::parse(s).unwrap().to_string(), s);
        }
        let old = Handshake::parse("Requesting_2024.01.10 04:06:57").unwrap();
        assert_eq!(old.to_string(), "Requesting_2024-01-10 04:06:57");
        assert!(Handshake::parse("Requesting_2024-01-10 04:06:57.123").is_ok());
        for s in [
            "",
            "Requesting",
            "Requesting_",
            "Asking_2024-01-10 04:06:57",
            "Requesting_2024-01-10T04:06:57",
            "Requesting_2024-02-30 04:06:57",
            "Requesting_2024-01-10 04:06:57Z",
        ] {
            assert!(Handshake::parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn expiry() {
        let h = Handshake::parse("Requesting_2025-03-04 05:06:07").unwrap();
        let later = |s| h.stamp + jiff::SignedDuration::from_secs(s);
        assert!(!h.request_expired(later(60), REQUEST_TIMEOUT));
        assert!(h.request_expired(later(61), REQUEST_TIMEOUT));
        assert!(!Handshake::reported(h.stamp).request_expired(later(999), REQUEST_TIMEOUT));
    }
}
