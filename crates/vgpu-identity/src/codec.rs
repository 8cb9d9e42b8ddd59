//! Broker wire protocol v1: the one codec both halves use.
//!
//! ```text
//! request  (8 bytes):  "HPID" | u16 version | u16 command
//! response (12 bytes): "HPID" | u16 version | u16 status | u32 pid
//! ```
//!
//! All integers are big-endian. The request carries no PID: the server
//! answers with the PID the kernel reports for the peer (`SO_PEERCRED`),
//! translated into the server's (host) PID namespace.
//!
//! Decoders take the whole frame and refuse anything that is not exactly one
//! well-formed frame, each kind of damage with its own [`FrameError`]
//! variant (the server counts them by [`FrameError::kind`]).

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"HPID";
/// The only protocol version this crate speaks.
pub const VERSION: u16 = 1;
/// Length of a request frame.
pub const REQUEST_LEN: usize = 8;
/// Length of a response frame.
pub const RESPONSE_LEN: usize = 12;
/// Largest PID a Linux kernel hands out (`PID_MAX_LIMIT` is 2^22, but
/// `pid_t` is an `int`; anything above `INT_MAX` is certainly not a PID).
pub const PID_MAX: u32 = i32::MAX as u32;

/// A request command code. A newtype, not an enum: a peer may send any u16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Command(pub u16);

impl Command {
    /// Ask for the caller's own host PID.
    pub const GET_PID: Command = Command(1);
}

/// A response status code. A newtype, not an enum: a newer server may send a
/// code this client does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Status(pub u16);

impl Status {
    /// The pid field holds the caller's host PID.
    pub const OK: Status = Status(0);
    /// The request did not start with `"HPID"`.
    pub const BAD_MAGIC: Status = Status(1);
    /// The request's version is not one the server speaks.
    pub const UNSUPPORTED_VERSION: Status = Status(2);
    /// The request's command is unknown.
    pub const UNSUPPORTED_COMMAND: Status = Status(3);
    /// The request was truncated or had trailing bytes.
    pub const MALFORMED: Status = Status(4);
    /// The server is at its concurrency bound; try again later.
    pub const BUSY: Status = Status(5);
    /// The kernel gave no usable peer credentials (e.g. the peer's PID is not
    /// visible in the server's namespace).
    pub const NO_PEER_PID: Status = Status(6);

    /// A stable lower-case name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Status::OK => "ok",
            Status::BAD_MAGIC => "bad_magic",
            Status::UNSUPPORTED_VERSION => "unsupported_version",
            Status::UNSUPPORTED_COMMAND => "unsupported_command",
            Status::MALFORMED => "malformed",
            Status::BUSY => "busy",
            Status::NO_PEER_PID => "no_peer_pid",
            _ => "unknown",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Protocol version (always [`VERSION`] after a successful decode).
    pub version: u16,
    /// The command (always a known one after a successful decode).
    pub command: Command,
}

impl Request {
    /// The one request v1 has.
    pub const GET_PID: Request = Request {
        version: VERSION,
        command: Command::GET_PID,
    };
}

/// A decoded response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// Protocol version of the server.
    pub version: u16,
    /// Outcome; only [`Status::OK`] carries a PID.
    pub status: Status,
    /// Host PID when `status` is OK, otherwise 0.
    pub pid: u32,
}

impl Response {
    /// A success carrying `pid`.
    pub fn ok(pid: u32) -> Response {
        Response {
            version: VERSION,
            status: Status::OK,
            pid,
        }
    }

    /// A failure with `status` (pid field 0).
    pub fn error(status: Status) -> Response {
        Response {
            version: VERSION,
            status,
            pid: 0,
        }
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame is shorter than a full frame.
    #[error("truncated frame: {got} of {want} bytes")]
    Truncated {
        /// Bytes present.
        got: usize,
        /// Bytes a frame needs.
        want: usize,
    },
    /// More bytes than one frame.
    #[error("trailing bytes: {got} bytes where a frame is {want}")]
    TrailingBytes {
        /// Bytes present.
        got: usize,
        /// Bytes a frame needs.
        want: usize,
    },
    /// The frame does not open with `"HPID"`.
    #[error("bad magic {0:02x?}, expected \"HPID\"")]
    BadMagic([u8; 4]),
    /// Version other than [`VERSION`].
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    UnsupportedVersion(u16),
    /// Unknown request command.
    #[error("unsupported command {0}")]
    UnsupportedCommand(u16),
    /// A success response whose pid is 0 (or above `INT_MAX`): never a PID.
    #[error("success response with impossible pid {0}")]
    BadPid(u32),
}

impl FrameError {
    /// A stable, finite name for metrics labels and test manifests.
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::Truncated { .. } => "truncated",
            FrameError::TrailingBytes { .. } => "trailing_bytes",
            FrameError::BadMagic(_) => "bad_magic",
            FrameError::UnsupportedVersion(_) => "unsupported_version",
            FrameError::UnsupportedCommand(_) => "unsupported_command",
            FrameError::BadPid(_) => "bad_pid",
        }
    }

    /// The status a server answers a request that failed this way.
    pub fn status(&self) -> Status {
        match self {
            FrameError::BadMagic(_) => Status::BAD_MAGIC,
            FrameError::UnsupportedVersion(_) => Status::UNSUPPORTED_VERSION,
            FrameError::UnsupportedCommand(_) => Status::UNSUPPORTED_COMMAND,
            _ => Status::MALFORMED,
        }
    }
}

/// Every [`FrameError::kind`] value, for pre-registering metric labels.
pub const FRAME_ERROR_KINDS: [&str; 6] = [
    "truncated",
    "trailing_bytes",
    "bad_magic",
    "unsupported_version",
    "unsupported_command",
    "bad_pid",
];

fn check_len(buf: &[u8], want: usize) -> Result<(), FrameError> {
    let got = buf.len();
    if got < want {
        Err(FrameError::Truncated { got, want })
    } else if got > want {
        Err(FrameError::TrailingBytes { got, want })
    } else {
        Ok(())
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    // Callers checked the length; `get` keeps this panic-free regardless.
    match b.get(at..at + 2) {
        Some(&[x, y]) => u16::from_be_bytes([x, y]),
        _ => 0,
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[w, x, y, z]) => u32::from_be_bytes([w, x, y, z]),
        _ => 0,
    }
}

fn check_magic(buf: &[u8]) -> Result<(), FrameError> {
    match buf.get(..4) {
        Some(&[a, b, c, d]) if [a, b, c, d] == MAGIC => Ok(()),
        Some(&[a, b, c, d]) => Err(FrameError::BadMagic([a, b, c, d])),
        _ => Err(FrameError::Truncated {
            got: buf.len(),
            want: 4,
        }),
    }
}

/// Encodes a request frame.
pub fn encode_request(req: Request) -> [u8; REQUEST_LEN] {
    let mut out = [0u8; REQUEST_LEN];
    let v = req.version.to_be_bytes();
    let c = req.command.0.to_be_bytes();
    out[..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&v);
    out[6..8].copy_from_slice(&c);
    out
}

/// Decodes exactly one request frame.
///
/// Checks run in a fixed order (length, magic, version, command) so each
/// damaged frame maps to one error kind.
pub fn decode_request(buf: &[u8]) -> Result<Request, FrameError> {
    check_len(buf, REQUEST_LEN)?;
    check_magic(buf)?;
    let version = be16(buf, 4);
    if version != VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let command = Command(be16(buf, 6));
    if command != Command::GET_PID {
        return Err(FrameError::UnsupportedCommand(command.0));
    }
    Ok(Request { version, command })
}

/// Encodes a response frame.
pub fn encode_response(resp: Response) -> [u8; RESPONSE_LEN] {
    let mut out = [0u8; RESPONSE_LEN];
    out[..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&resp.version.to_be_bytes());
    out[6..8].copy_from_slice(&resp.status.0.to_be_bytes());
    out[8..12].copy_from_slice(&resp.pid.to_be_bytes());
    out
}

/// Decodes exactly one response frame.
///
/// A success must carry a pid in `1..=INT_MAX`; a non-success status is
/// returned as a valid [`Response`] (the caller turns it into its own error).
pub fn decode_response(buf: &[u8]) -> Result<Response, FrameError> {
    check_len(buf, RESPONSE_LEN)?;
    check_magic(buf)?;
    let version = be16(buf, 4);
    if version != VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let status = Status(be16(buf, 6));
    let pid = be32(buf, 8);
    if status == Status::OK && (pid == 0 || pid > PID_MAX) {
        return Err(FrameError::BadPid(pid));
    }
    Ok(Response {
        version,
        status,
        pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip_and_layout() {
        let f = encode_request(Request::GET_PID);
        assert_eq!(&f, b"HPID\x00\x01\x00\x01");
        assert_eq!(decode_request(&f), Ok(Request::GET_PID));
    }

    #[test]
    fn response_roundtrip_and_layout() {
        let f = encode_response(Response::ok(0x0102_0304));
        assert_eq!(&f, b"HPID\x00\x01\x00\x00\x01\x02\x03\x04");
        assert_eq!(decode_response(&f), Ok(Response::ok(0x0102_0304)));
    }

    #[test]
    fn request_errors_by_kind() {
        assert_eq!(
            decode_request(b"HPID\x00\x01\x00"),
            Err(FrameError::Truncated { got: 7, want: 8 })
        );
        assert_eq!(
            decode_request(b"HPID\x00\x01\x00\x01\x00"),
            Err(FrameError::TrailingBytes { got: 9, want: 8 })
        );
        assert_eq!(
            decode_request(b"HPIX\x00\x01\x00\x01"),
            Err(FrameError::BadMagic(*b"HPIX"))
        );
        assert_eq!(
            decode_request(b"HPID\x00\x02\x00\x01"),
            Err(FrameError::UnsupportedVersion(2))
        );
        assert_eq!(
            decode_request(b"HPID\x00\x01\x00\x07"),
            Err(FrameError::UnsupportedCommand(7))
        );
        assert_eq!(
            decode_request(b""),
            Err(FrameError::Truncated { got: 0, want: 8 })
        );
    }

    #[test]
    fn response_refuses_impossible_pids_only_on_success() {
        let zero = encode_response(Response::ok(0));
        assert_eq!(decode_response(&zero), Err(FrameError::BadPid(0)));
        let huge = encode_response(Response::ok(u32::MAX));
        assert_eq!(decode_response(&huge), Err(FrameError::BadPid(u32::MAX)));
        let busy = encode_response(Response::error(Status::BUSY));
        assert_eq!(decode_response(&busy), Ok(Response::error(Status::BUSY)));
    }

    #[test]
    fn every_kind_is_listed() {
        let all = [
            FrameError::Truncated { got: 0, want: 8 },
            FrameError::TrailingBytes { got: 9, want: 8 },
            FrameError::BadMagic([0; 4]),
            FrameError::UnsupportedVersion(9),
            FrameError::UnsupportedCommand(9),
            FrameError::BadPid(0),
        ];
        for e in all {
            assert!(FRAME_ERROR_KINDS.contains(&e.kind()), "{}", e.kind());
        }
    }
}
