//! The limits file: the operator's statement of a container's limits
//! (docs/limits.md). Owns its text format (strict parse, round-tripping
//! render), reading it safely, writing it atomically, the per-UUID lookup
//! and the rules that find it (in a container and next to a region).
//!
//! Never: follow a symlink at the file, block opening it (a FIFO), read more
//! than `MAX_FILE_LEN` bytes, accept a line it does not understand, panic on
//! any content, or take a limit from the tenant-writable region.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

/// The one format version this build reads and writes.
pub const VERSION: u32 = 1;
/// The directive of the first non-comment line (`vgpu-limits 1`).
pub const HEADER: &str = "vgpu-limits";
/// Where a container sees its limits file (a read-only directory mount, so
/// an atomic rename on the host shows inside).
pub const DEFAULT_PATH: &str = "/etc/vgpu/limits";
/// Names another limits file (`vgpu run`, tests); the default path wins
/// whenever it exists.
pub const PATH_ENV: &str = "LIBVGPU_LIMITS_FILE";
/// Largest file a reader accepts.
pub const MAX_FILE_LEN: usize = 64 * 1024;
/// Mode of a written file: the operator writes, everyone reads.
pub const FILE_MODE: u32 = 0o644;
/// Longest device UUID (the region's UUID field holds 63 bytes).
pub const MAX_UUID_LEN: usize = 63;

/// Which device a `device` line is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Device {
    /// One physical device, by UUID (compared ignoring ASCII case).
    Uuid(String),
    /// `*`: every device without its own line.
    Any,
}

impl Device {
    /// As written in the file.
    pub fn as_str(&self) -> &str {
        match self {
            Device::Uuid(u) => u,
            Device::Any => "*",
        }
    }

    fn same(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Any, Device::Any) => true,
            (Device::Uuid(a), Device::Uuid(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        }
    }
}

/// One `device` line. A missing key means no limit of that kind (a line
/// with neither key makes its device unlimited, whatever `*` says).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceLine {
    /// The device.
    pub device: Device,
    /// Memory limit in bytes (> 0).
    pub memory: Option<u64>,
    /// SM limit in percent (1..=100; 100 means no SM limit).
    pub sm: Option<u32>,
}

/// `policy` (HAMi's `GPU_CORE_UTILIZATION_POLICY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Policy {
    /// Limit SM use to the configured share, a lone tenant included (as
    /// HAMi's `default`; see docs/limiter.md).
    Default,
    /// Always limit.
    Force,
    /// Never limit SM use.
    Disable,
}

impl Policy {
    /// The word in the file.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Default => "default",
            Policy::Force => "force",
            Policy::Disable => "disable",
        }
    }

    fn from_word(w: &str) -> Option<Policy> {
        match w {
            "default" => Some(Policy::Default),
            "force" => Some(Policy::Force),
            "disable" => Some(Policy::Disable),
            _ => None,
        }
    }
}

/// A whole limits file.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// `device` lines in file order (at most one per UUID, at most one `*`).
    pub devices: Vec<DeviceLine>,
    /// `policy`, when given.
    pub policy: Option<Policy>,
    /// `priority` (HAMi's `CUDA_TASK_PRIORITY`: 0 high, 1 low), when given.
    pub priority: Option<i32>,
    /// `suspended 0|1`, when given (absent = not suspended).
    pub suspended: Option<bool>,
    /// `hold N` (percent 0..=100): the node side's priority hold, written
    /// while a busy high-priority container shares the device; a
    /// low-priority container paces at `min(limit, hold)` (docs/limiter.md).
    pub hold: Option<u32>,
    /// `sm-ceiling <UUID|*> <percent>` lines in file order: the most SM
    /// time a device's container may reach while others leave time unused
    /// (its `sm=` is the guarantee; no ceiling = the guarantee, a fixed
    /// cap). Lending needs a `board` (docs/limiter.md).
    pub ceilings: Vec<(Device, u32)>,
    /// `board <dir> <name>`: the GPUs' lending boards and this container's
    /// entry name on them.
    pub board: Option<BoardRef>,
}

/// Where a container's lending boards are (`board <dir> <name>`): each
/// GPU's board is the directory `<dir>/<UUID>`, the container's entry the
/// file `<name>` in it (`crate::board`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BoardRef {
    /// An absolute directory.
    pub dir: PathBuf,
    /// The container's entry name.
    pub name: String,
}

/// What applies to one physical device: `None` = no limit of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceLimit {
    /// Memory limit, bytes.
    pub memory: Option<u64>,
    /// SM limit, percent 1..=99 (a file's 100 reads as `None`).
    pub sm: Option<u32>,
}

impl DeviceLimit {
    /// The region's encoding (0 = none), for its display copy.
    pub fn to_region(self) -> crate::telemetry::Limits {
        crate::telemetry::Limits {
            mem: self.memory.unwrap_or(0),
            sm: self.sm.unwrap_or(0),
        }
    }

    /// From the region's encoding (0 = none; SM 100 = none).
    pub fn from_region(l: crate::telemetry::Limits) -> DeviceLimit {
        DeviceLimit {
            memory: (l.mem != 0).then_some(l.mem),
            sm: (l.sm != 0 && l.sm < 100).then_some(l.sm),
        }
    }
}

/// The lower of two limits where `None` means unlimited.
fn lower<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The limit a process enforces on one device (CONTRACTS' trust rule): when
/// a limits file exists (`file` is `Some`), its values, lowered but never
/// raised by the process's environment; otherwise the environment's.
pub fn effective(file: Option<DeviceLimit>, env: DeviceLimit) -> DeviceLimit {
    match file {
        None => env,
        Some(f) => DeviceLimit {
            memory: lower(f.memory, env.memory),
            sm: lower(f.sm, env.sm),
        },
    }
}

/// What is wrong with one line of a limits file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseProblem {
    /// No `vgpu-limits 1` line before the end (an empty file is not "no
    /// limits": it is refused).
    #[error("no `{HEADER} {VERSION}` line: not a limits file")]
    MissingHeader,
    /// The first non-comment line is something else.
    #[error("expected `{HEADER} {VERSION}` first, found {found:?}")]
    BadHeader {
        /// The line's first token.
        found: String,
    },
    /// A version this build does not read (fail closed, never guess).
    #[error("limits file version {found}; this build reads version {VERSION} only")]
    UnsupportedVersion {
        /// The version written.
        found: String,
    },
    /// A directive this build does not know.
    #[error("unknown directive {found:?} (expected device, policy, priority, suspended, hold, sm-ceiling or board)")]
    UnknownDirective {
        /// The token.
        found: String,
    },
    /// A `key=value` with an unknown key, or not `key=value` at all.
    #[error("unknown setting {found:?} (expected memory=<bytes> or sm=<percent>)")]
    UnknownKey {
        /// The token.
        found: String,
    },
    /// A value out of range or not a number.
    #[error("{what}: {found:?} is not {expected}")]
    BadValue {
        /// Which value.
        what: &'static str,
        /// As written.
        found: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A device name that is neither `*` nor a UUID-like token.
    #[error("device {found:?} is not `*` or a UUID (1-{MAX_UUID_LEN} of A-Z a-z 0-9 - _ . : /)")]
    BadDevice {
        /// As written.
        found: String,
    },
    /// The directive needs an argument.
    #[error("{directive} needs {what}")]
    MissingArgument {
        /// The directive.
        directive: &'static str,
        /// What is missing.
        what: &'static str,
    },
    /// More tokens than the directive takes.
    #[error("unexpected {found:?} after {directive}")]
    ExtraArgument {
        /// The directive.
        directive: &'static str,
        /// The first extra token.
        found: String,
    },
    /// The same device, key or directive twice.
    #[error("{what} already given at line {first}")]
    Duplicate {
        /// What was repeated.
        what: String,
        /// Line of the first.
        first: usize,
    },
    /// Bytes that are not UTF-8.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// A control character (CR of a CRLF line end, NUL, ...); tabs are fine.
    #[error("control character {found:#04x} (only spaces, tabs and LF line ends are accepted)")]
    ControlCharacter {
        /// The byte.
        found: u8,
    },
}

/// Why a limits file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// The text is not a valid limits file.
    #[error("{}line {line}: {problem}", in_file(path))]
    Parse {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: ParseProblem,
    },
    /// A system call failed (`NotFound`: no file; see `is_not_found`).
    #[error("{op} {}", path.display())]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A symlink at the path: never followed.
    #[error("{}: a symbolic link (a limits file is never followed)", path.display())]
    Symlink {
        /// The file.
        path: PathBuf,
    },
    /// A FIFO, device, directory or socket at the path.
    #[error("{}: not a regular file ({kind})", path.display())]
    NotRegularFile {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Larger than `MAX_FILE_LEN`.
    #[error("{}: {len} bytes or more, a limits file holds at most {MAX_FILE_LEN}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length (at least).
        len: u64,
    },
    /// A `Limits` value that cannot be written (it would not read back).
    #[error("cannot write these limits: {what}")]
    Invalid {
        /// What is wrong.
        what: String,
    },
}

fn in_file(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map_or_else(String::new, |p| format!("{}: ", p.display()))
}

impl LimitsError {
    /// No file at the path (the one case that is not a reason to fail closed
    /// by itself: the contract falls back to the environment).
    pub fn is_not_found(&self) -> bool {
        matches!(self, LimitsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// The line a parse error is about.
    pub fn line(&self) -> Option<usize> {
        match self {
            LimitsError::Parse { line, .. } => Some(*line),
            _ => None,
        }
    }
}

fn perr(line: usize, problem: ParseProblem) -> LimitsError {
    LimitsError::Parse {
        path: None,
        line,
        problem,
    }
}

fn valid_uuid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_UUID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
}

/// Decimal digits only (no sign, no suffix), as u64.
fn digits_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_i32(s: &str) -> Option<i32> {
    let body = s.strip_prefix('-').unwrap_or(s);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Line numbers of what was seen, for duplicate reports.
#[derive(Default)]
struct Seen {
    header: Option<usize>,
    policy: Option<usize>,
    priority: Option<usize>,
    suspended: Option<usize>,
    hold: Option<usize>,
    board: Option<usize>,
    devices: Vec<usize>,
    ceilings: Vec<usize>,
}

fn once(slot: &mut Option<usize>, line: usize, what: &str) -> Result<(), LimitsError> {
    if let Some(first) = *slot {
        return Err(perr(
            line,
            ParseProblem::Duplicate {
                what: what.to_owned(),
                first,
            },
        ));
    }
    *slot = Some(line);
    Ok(())
}

/// The single argument of `directive`, or the matching error.
fn single<'a>(
    toks: &[&'a str],
    line: usize,
    directive: &'static str,
    what: &'static str,
) -> Result<&'a str, LimitsError> {
    match toks {
        [_, a] => Ok(a),
        [_] => Err(perr(
            line,
            ParseProblem::MissingArgument { directive, what },
        )),
        [_, _, extra, ..] => Err(perr(
            line,
            ParseProblem::ExtraArgument {
                directive,
                found: (*extra).to_owned(),
            },
        )),
        [] => Err(perr(
            line,
            ParseProblem::MissingArgument { directive, what },
        )),
    }
}

fn parse_device(toks: &[&str], line: usize) -> Result<DeviceLine, LimitsError> {
    let Some(name) = toks.get(1) else {
        return Err(perr(
            line,
            ParseProblem::MissingArgument {
                directive: "device",
                what: "a UUID or *",
            },
        ));
    };
    let device = if *name == "*" {
        Device::Any
    } else if valid_uuid(name) {
        Device::Uuid((*name).to_owned())
    } else {
        return Err(perr(
            line,
            ParseProblem::BadDevice {
                found: (*name).to_owned(),
            },
        ));
    };
    let mut d = DeviceLine {
        device,
        memory: None,
        sm: None,
    };
    for tok in &toks[2..] {
        let Some((key, val)) = tok.split_once('=') else {
            return Err(perr(
                line,
                ParseProblem::UnknownKey {
                    found: (*tok).to_owned(),
                },
            ));
        };
        let dup = |k: &str| {
            perr(
                line,
                ParseProblem::Duplicate {
                    what: format!("{k}= on this device line"),
                    first: line,
                },
            )
        };
        match key {
            "memory" => {
                if d.memory.is_some() {
                    return Err(dup("memory"));
                }
                match digits_u64(val) {
                    Some(n) if n > 0 => d.memory = Some(n),
                    _ => {
                        return Err(perr(
                            line,
                            ParseProblem::BadValue {
                                what: "memory",
                                found: val.to_owned(),
                                expected: "a decimal byte count from 1 to 2^64-1",
                            },
                        ))
                    }
                }
            }
            "sm" => {
                if d.sm.is_some() {
                    return Err(dup("sm"));
                }
                match digits_u64(val) {
                    Some(n @ 1..=100) => d.sm = Some(n as u32),
                    _ => {
                        return Err(perr(
                            line,
                            ParseProblem::BadValue {
                                what: "sm",
                                found: val.to_owned(),
                                expected: "a percent from 1 to 100",
                            },
                        ))
                    }
                }
            }
            _ => {
                return Err(perr(
                    line,
                    ParseProblem::UnknownKey {
                        found: (*tok).to_owned(),
                    },
                ))
            }
        }
    }
    Ok(d)
}

impl Limits {
    /// Parses the text of a limits file strictly: the first error, with its
    /// line number, and nothing half-read.
    pub fn parse(text: &str) -> Result<Limits, LimitsError> {
        let mut out = Limits::default();
        let mut seen = Seen::default();
        let mut last_line = 0;
        for (i, raw) in text.split('\n').enumerate() {
            let line = i + 1;
            last_line = line;
            if let Some(b) = raw.bytes().find(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(perr(line, ParseProblem::ControlCharacter { found: b }));
            }
            let content = raw.split('#').next().unwrap_or("");
            let toks: Vec<&str> = content.split_ascii_whitespace().collect();
            let Some(&first) = toks.first() else {
                continue;
            };
            if seen.header.is_none() {
                if first != HEADER {
                    return Err(perr(
                        line,
                        ParseProblem::BadHeader {
                            found: first.to_owned(),
                        },
                    ));
                }
                let v = single(&toks, line, HEADER, "a version number")?;
                match digits_u64(v) {
                    Some(n) if n == VERSION as u64 && v.len() == 1 => {}
                    Some(n) if n > VERSION as u64 => {
                        return Err(perr(
                            line,
                            ParseProblem::UnsupportedVersion {
                                found: v.to_owned(),
                            },
                        ))
                    }
                    // Digits too long for u64 are a version from the future too.
                    None if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                        return Err(perr(
                            line,
                            ParseProblem::UnsupportedVersion {
                                found: v.to_owned(),
                            },
                        ))
                    }
                    _ => {
                        return Err(perr(
                            line,
                            ParseProblem::BadValue {
                                what: "version",
                                found: v.to_owned(),
                                expected: "1",
                            },
                        ))
                    }
                }
                seen.header = Some(line);
                continue;
            }
            match first {
                HEADER => once(&mut seen.header, line, "the header line")?,
                "device" => {
                    let d = parse_device(&toks, line)?;
                    if let Some(k) = out.devices.iter().position(|o| o.device.same(&d.device)) {
                        return Err(perr(
                            line,
                            ParseProblem::Duplicate {
                                what: format!("device {}", d.device.as_str()),
                                first: seen.devices[k],
                            },
                        ));
                    }
                    seen.devices.push(line);
                    out.devices.push(d);
                }
                "policy" => {
                    once(&mut seen.policy, line, "policy")?;
                    let w = single(&toks, line, "policy", "default, force or disable")?;
                    out.policy = Some(Policy::from_word(w).ok_or_else(|| {
                        perr(
                            line,
                            ParseProblem::BadValue {
                                what: "policy",
                                found: w.to_owned(),
                                expected: "default, force or disable",
                            },
                        )
                    })?);
                }
                "priority" => {
                    once(&mut seen.priority, line, "priority")?;
                    let w = single(&toks, line, "priority", "an integer")?;
                    out.priority = Some(parse_i32(w).ok_or_else(|| {
                        perr(
                            line,
                            ParseProblem::BadValue {
                                what: "priority",
                                found: w.to_owned(),
                                expected: "a 32-bit integer",
                            },
                        )
                    })?);
                }
                "suspended" => {
                    once(&mut seen.suspended, line, "suspended")?;
                    let w = single(&toks, line, "suspended", "0 or 1")?;
                    out.suspended = Some(match w {
                        "0" => false,
                        "1" => true,
                        _ => {
                            return Err(perr(
                                line,
                                ParseProblem::BadValue {
                                    what: "suspended",
                                    found: w.to_owned(),
                                    expected: "0 or 1",
                                },
                            ))
                        }
                    });
                }
                "hold" => {
                    once(&mut seen.hold, line, "hold")?;
                    let w = single(&toks, line, "hold", "a percent 0..=100")?;
                    out.hold = Some(
                        digits_u64(w)
                            .filter(|&n| n <= 100 && (w.len() == 1 || !w.starts_with('0')))
                            .map(|n| n as u32)
                            .ok_or_else(|| {
                                perr(
                                    line,
                                    ParseProblem::BadValue {
                                        what: "hold",
                                        found: w.to_owned(),
                                        expected: "a percent 0..=100",
                                    },
                                )
                            })?,
                    );
                }
                "sm-ceiling" => {
                    let (dev, pct) = match &toks[1..] {
                        [d, p] => (*d, *p),
                        [] | [_] => {
                            return Err(perr(
                                line,
                                ParseProblem::MissingArgument {
                                    directive: "sm-ceiling",
                                    what: "a UUID or * and a percent",
                                },
                            ))
                        }
                        [_, _, extra, ..] => {
                            return Err(perr(
                                line,
                                ParseProblem::ExtraArgument {
                                    directive: "sm-ceiling",
                                    found: (*extra).to_owned(),
                                },
                            ))
                        }
                    };
                    let device = if dev == "*" {
                        Device::Any
                    } else if valid_uuid(dev) {
                        Device::Uuid(dev.to_owned())
                    } else {
                        return Err(perr(
                            line,
                            ParseProblem::BadDevice {
                                found: dev.to_owned(),
                            },
                        ));
                    };
                    if let Some(k) = out.ceilings.iter().position(|o| o.0.same(&device)) {
                        return Err(perr(
                            line,
                            ParseProblem::Duplicate {
                                what: format!("sm-ceiling {}", device.as_str()),
                                first: seen.ceilings[k],
                            },
                        ));
                    }
                    let n = digits_u64(pct)
                        .filter(|n| (1..=100).contains(n) && !pct.starts_with('0'))
                        .ok_or_else(|| {
                            perr(
                                line,
                                ParseProblem::BadValue {
                                    what: "sm-ceiling",
                                    found: pct.to_owned(),
                                    expected: "a percent from 1 to 100",
                                },
                            )
                        })?;
                    seen.ceilings.push(line);
                    out.ceilings.push((device, n as u32));
                }
                "board" => {
                    once(&mut seen.board, line, "board")?;
                    let (dir, name) = match &toks[1..] {
                        [d, n] => (*d, *n),
                        [] | [_] => {
                            return Err(perr(
                                line,
                                ParseProblem::MissingArgument {
                                    directive: "board",
                                    what: "a directory and an entry name",
                                },
                            ))
                        }
                        [_, _, extra, ..] => {
                            return Err(perr(
                                line,
                                ParseProblem::ExtraArgument {
                                    directive: "board",
                                    found: (*extra).to_owned(),
                                },
                            ))
                        }
                    };
                    if !dir.starts_with('/') {
                        return Err(perr(
                            line,
                            ParseProblem::BadValue {
                                what: "board directory",
                                found: dir.to_owned(),
                                expected: "an absolute path",
                            },
                        ));
                    }
                    if !crate::board::valid_name(name) {
                        return Err(perr(
                            line,
                            ParseProblem::BadValue {
                                what: "board entry name",
                                found: name.to_owned(),
                                expected: "1-63 of A-Z a-z 0-9 . _ - (not starting with '.')",
                            },
                        ));
                    }
                    out.board = Some(BoardRef {
                        dir: PathBuf::from(dir),
                        name: name.to_owned(),
                    });
                }
                other => {
                    return Err(perr(
                        line,
                        ParseProblem::UnknownDirective {
                            found: other.to_owned(),
                        },
                    ))
                }
            }
        }
        if seen.header.is_none() {
            return Err(perr(last_line.max(1), ParseProblem::MissingHeader));
        }
        Ok(out)
    }

    /// Parses bytes (a file's content): UTF-8 errors name their line.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Limits, LimitsError> {
        match std::str::from_utf8(bytes) {
            Ok(t) => Limits::parse(t),
            Err(e) => {
                let good = &bytes[..e.valid_up_to()];
                let line = 1 + good.iter().filter(|&&b| b == b'\n').count();
                // The whole lines before the bad byte may hold an earlier
                // error, which is the one to report.
                let whole = good.iter().rposition(|&b| b == b'\n').unwrap_or(0);
                if let Ok(head) = std::str::from_utf8(&good[..whole]) {
                    match Limits::parse(head) {
                        Err(LimitsError::Parse {
                            problem: ParseProblem::MissingHeader,
                            ..
                        })
                        | Ok(_) => {}
                        Err(err) => return Err(err),
                    }
                }
                Err(perr(line, ParseProblem::NotUtf8))
            }
        }
    }

    /// The file's text: `parse(render(x)) == x` for every valid `x` (see
    /// `validate`); the text of `parse(t)` is canonical.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut o = format!("{HEADER} {VERSION}\n");
        for d in &self.devices {
            let _ = write!(o, "device {}", d.device.as_str());
            if let Some(m) = d.memory {
                let _ = write!(o, " memory={m}");
            }
            if let Some(s) = d.sm {
                let _ = write!(o, " sm={s}");
            }
            o.push('\n');
        }
        if let Some(p) = self.policy {
            let _ = writeln!(o, "policy {}", p.name());
        }
        if let Some(p) = self.priority {
            let _ = writeln!(o, "priority {p}");
        }
        if let Some(s) = self.suspended {
            let _ = writeln!(o, "suspended {}", u8::from(s));
        }
        if let Some(h) = self.hold {
            let _ = writeln!(o, "hold {h}");
        }
        for (d, c) in &self.ceilings {
            let _ = writeln!(o, "sm-ceiling {} {c}", d.as_str());
        }
        if let Some(b) = &self.board {
            let _ = writeln!(o, "board {} {}", b.dir.display(), b.name);
        }
        o
    }

    /// Whether `render` reads back as this value (valid UUIDs, memory > 0,
    /// SM 1..=100, each device once).
    pub fn validate(&self) -> Result<(), LimitsError> {
        let bad = |what: String| Err(LimitsError::Invalid { what });
        if let Some(h) = self.hold.filter(|&h| h > 100) {
            return bad(format!("hold {h} (0..=100)"));
        }
        for (i, (d, c)) in self.ceilings.iter().enumerate() {
            if let Device::Uuid(u) = d {
                if !valid_uuid(u) {
                    return bad(format!("sm-ceiling {u:?} is not a UUID-like token"));
                }
            }
            if !(1..=100).contains(c) {
                return bad(format!("sm-ceiling {} {c} (1..=100)", d.as_str()));
            }
            if self.ceilings[..i].iter().any(|o| o.0.same(d)) {
                return bad(format!("sm-ceiling {} appears twice", d.as_str()));
            }
        }
        if let Some(b) = &self.board {
            let ok = b.dir.is_absolute()
                && b.dir.to_str().is_some_and(|s| {
                    !s.is_empty()
                        && !s.contains(|c: char| c.is_whitespace() || c == '#' || c.is_control())
                });
            if !ok || !crate::board::valid_name(&b.name) {
                return bad(format!(
                    "board {} {:?} (an absolute path without spaces or '#', and an entry name)",
                    b.dir.display(),
                    b.name
                ));
            }
        }
        for (i, d) in self.devices.iter().enumerate() {
            if let Device::Uuid(u) = &d.device {
                if !valid_uuid(u) {
                    return bad(format!("device {u:?} is not a UUID-like token"));
                }
            }
            if d.memory == Some(0) {
                return bad(format!(
                    "device {}: memory=0 (omit the key for no limit)",
                    d.device.as_str()
                ));
            }
            if let Some(s) = d.sm.filter(|s| !(1..=100).contains(s)) {
                return bad(format!(
                    "device {}: sm={s} (1..=100; omit the key for no limit)",
                    d.device.as_str()
                ));
            }
            if self.devices[..i].iter().any(|o| o.device.same(&d.device)) {
                return bad(format!("device {} appears twice", d.device.as_str()));
            }
        }
        Ok(())
    }

    /// The line for `uuid` (ignoring ASCII case), else the `*` line.
    pub fn line_for(&self, uuid: &str) -> Option<&DeviceLine> {
        self.devices
            .iter()
            .find(|d| matches!(&d.device, Device::Uuid(u) if u.eq_ignore_ascii_case(uuid)))
            .or_else(|| self.devices.iter().find(|d| d.device == Device::Any))
    }

    /// What applies to the device `uuid`: its own line, else `*`, else no
    /// limit. SM 100 reads as no SM limit.
    pub fn for_device(&self, uuid: &str) -> DeviceLimit {
        self.line_for(uuid)
            .map_or_else(DeviceLimit::default, |d| DeviceLimit {
                memory: d.memory,
                sm: d.sm.filter(|&s| s < 100),
            })
    }

    /// The line of exactly `device` (no `*` fallback), added when absent
    /// with the values that applied to it so far (so changing one field
    /// keeps the others).
    pub fn line_mut(&mut self, device: &Device) -> &mut DeviceLine {
        let idx = match self.devices.iter().position(|d| d.device.same(device)) {
            Some(i) => i,
            None => {
                let inherited = match device {
                    Device::Uuid(u) => self.line_for(u).map(|l| (l.memory, l.sm)),
                    Device::Any => None,
                };
                let (memory, sm) = inherited.unwrap_or((None, None));
                self.devices.push(DeviceLine {
                    device: device.clone(),
                    memory,
                    sm,
                });
                self.devices.len() - 1
            }
        };
        &mut self.devices[idx]
    }

    /// The SM ceiling of device `uuid` (its own `sm-ceiling` line, else
    /// `*`'s), percent; `None`: the guarantee is the ceiling.
    pub fn ceiling_for(&self, uuid: &str) -> Option<u32> {
        self.ceilings
            .iter()
            .find(|(d, _)| matches!(d, Device::Uuid(u) if u.eq_ignore_ascii_case(uuid)))
            .or_else(|| self.ceilings.iter().find(|(d, _)| *d == Device::Any))
            .map(|(_, c)| *c)
    }

    /// Sets (`Some`) or removes (`None`) the ceiling line of exactly
    /// `device`.
    pub fn set_ceiling(&mut self, device: &Device, pct: Option<u32>) {
        let at = self.ceilings.iter().position(|(d, _)| d.same(device));
        match (at, pct) {
            (Some(i), Some(p)) => self.ceilings[i].1 = p,
            (Some(i), None) => {
                self.ceilings.remove(i);
            }
            (None, Some(p)) => self.ceilings.push((device.clone(), p)),
            (None, None) => {}
        }
    }

    /// `suspended`, absent = false.
    pub fn is_suspended(&self) -> bool {
        self.suspended.unwrap_or(false)
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> LimitsError + 'a {
    move |e| LimitsError::Io {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// The name of a non-regular file type, for messages.
pub(crate) fn file_kind(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        _ => "unknown file type",
    }
}

/// Reads and parses a limits file: `O_NOFOLLOW | O_NONBLOCK`, a regular file
/// only, at most `MAX_FILE_LEN` bytes. A missing file is
/// `LimitsError::Io` with `NotFound` (`is_not_found`).
pub fn read_limits_file(path: &Path) -> Result<Limits, LimitsError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::LOOP => LimitsError::Symlink {
            path: path.to_owned(),
        },
        e => io("open", path)(e),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(io("stat", path))?;
    let ft = FileType::from_raw_mode(st.st_mode);
    if ft != FileType::RegularFile {
        return Err(LimitsError::NotRegularFile {
            path: path.to_owned(),
            kind: file_kind(ft),
        });
    }
    let too_large = |len: u64| LimitsError::TooLarge {
        path: path.to_owned(),
        len,
    };
    if st.st_size as u64 > MAX_FILE_LEN as u64 {
        return Err(too_large(st.st_size as u64));
    }
    // One byte more than allowed: a file that grew after the fstat is seen.
    let mut buf = Vec::with_capacity(st.st_size.max(0) as usize + 1);
    std::fs::File::from(fd)
        .take(MAX_FILE_LEN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| LimitsError::Io {
            op: "read",
            path: path.to_owned(),
            source,
        })?;
    if buf.len() > MAX_FILE_LEN {
        return Err(too_large(buf.len() as u64));
    }
    Limits::parse_bytes(&buf).map_err(|e| match e {
        LimitsError::Parse { line, problem, .. } => LimitsError::Parse {
            path: Some(path.to_owned()),
            line,
            problem,
        },
        e => e,
    })
}

/// Writes `limits` to `path` atomically: a temporary file in the same
/// directory (created exclusively, never through a symlink), mode set to
/// `FILE_MODE` explicitly, fsync, rename over `path` (which replaces a
/// symlink there rather than following it), fsync of the directory. A
/// reader sees the old file or the new one, never a mix.
pub fn write_limits_file_atomic(path: &Path, limits: &Limits) -> Result<(), LimitsError> {
    limits.validate()?;
    let text = limits.render();
    if Limits::parse(&text).ok().as_ref() != Some(limits) {
        return Err(LimitsError::Invalid {
            what: "the rendered text does not read back as the same limits".into(),
        });
    }
    let name = path.file_name().ok_or_else(|| LimitsError::Invalid {
        what: format!("{} names no file", path.display()),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dirfd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open directory", dir))?;
    let tmp = format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        rustix::process::getpid().as_raw_nonzero(),
        crate::clock::monotonic_ns()
    );
    let fd = rustix::fs::openat(
        &dirfd,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(io("create a temporary file in", dir))?;
    let written = (|| {
        let mut rest = text.as_bytes();
        while !rest.is_empty() {
            match rustix::io::write(&fd, rest) {
                Ok(0) => return Err(io("write", path)(Errno::IO)),
                Ok(n) => rest = &rest[n..],
                Err(Errno::INTR) => continue,
                Err(e) => return Err(io("write", path)(e)),
            }
        }
        // Explicit: the umask is not a policy.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE)).map_err(io("chmod", path))?;
        rustix::fs::fsync(&fd).map_err(io("fsync", path))?;
        rustix::fs::renameat(&dirfd, tmp.as_str(), &dirfd, name).map_err(io("rename onto", path))
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dirfd, tmp.as_str(), rustix::fs::AtFlags::empty());
        return written;
    }
    // The rename is durable once the directory is.
    let _ = rustix::fs::fsync(&dirfd);
    Ok(())
}

/// Where a limits file was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// `DEFAULT_PATH` (the node agent's read-only mount).
    Default,
    /// `PATH_ENV` named it.
    Env,
}

/// The limits file a process in a container must read, by the contract:
/// `DEFAULT_PATH` whenever anything is there (even something unreadable:
/// the caller then fails closed), else the file `PATH_ENV` names (its
/// value passed as `env`), else none (limits come from the environment).
pub fn locate(env: Option<&OsStr>) -> Option<(PathBuf, Source)> {
    locate_with(Path::new(DEFAULT_PATH), env)
}

/// `locate` with another default path (tests).
pub fn locate_with(default: &Path, env: Option<&OsStr>) -> Option<(PathBuf, Source)> {
    match rustix::fs::lstat(default) {
        Err(Errno::NOENT) | Err(Errno::NOTDIR) => {}
        // Present, or present but hidden from us: it wins either way.
        _ => return Some((default.to_owned(), Source::Default)),
    }
    env.filter(|v| !v.is_empty())
        .map(|v| (PathBuf::from(v), Source::Env))
}

/// Whether the directory of `default` (the operator's limits path) is a
/// directory, not followed through a symlink: the deployment's sign that
/// the limits file is required. One `lstat` (std's metadata first probes
/// `statx` with a null path in every process).
pub fn default_dir_present(default: &Path) -> bool {
    default
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .and_then(|d| rustix::fs::lstat(d).ok())
        .is_some_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
}

/// The host-side limits file of the region at `region` (the `vgpu limit`
/// rule): with the region in `D`, `D/../../limits/<name of D>/limits` when
/// D's parent is named `containers` (the node agent's layout), else
/// `D/limits` (the `vgpu run` layout). Lexical: nothing is resolved.
pub fn path_for_region(region: &Path) -> PathBuf {
    let d = match region.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let (Some(name), Some(parent)) = (d.file_name(), d.parent()) {
        if parent.file_name() == Some(OsStr::new("containers")) {
            let root = match parent.parent() {
                Some(r) if !r.as_os_str().is_empty() => r,
                _ => Path::new("."),
            };
            return root.join("limits").join(name).join("limits");
        }
    }
    d.join("limits")
}

/// The fuzz target's body (`fuzz/fuzz_targets/limits_file.rs`, replayed
/// by `tests/limits.rs`): parsing never panics, and whatever parses renders
/// to text that parses back to the same value and renders identically.
pub fn fuzz_limits(data: &[u8]) {
    if let Ok(l) = Limits::parse_bytes(data) {
        assert!(l.validate().is_ok(), "parsed limits fail validation: {l:?}");
        let text = l.render();
        let back = Limits::parse(&text).expect("rendered limits parse");
        assert_eq!(back, l);
        assert_eq!(back.render(), text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# written by the node agent
vgpu-limits 1
device GPU-4617e643-f070-4b90-b715-30c57f977a9a memory=1073741824 sm=30
device * memory=2147483648   # everything else
policy default
priority 1
";

    fn problem(text: &str) -> (usize, ParseProblem) {
        match Limits::parse(text) {
            Err(LimitsError::Parse { line, problem, .. }) => (line, problem),
            other => panic!("expected a parse error for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn ceilings_and_the_board() {
        let l = Limits::parse(
            "vgpu-limits 1\ndevice * sm=30\nsm-ceiling * 60\nsm-ceiling GPU-a 100\nboard /run/vgpu/boards pod_ctr\n",
        )
        .unwrap();
        assert_eq!(l.ceiling_for("gpu-A"), Some(100));
        assert_eq!(l.ceiling_for("GPU-b"), Some(60));
        let b = l.board.clone().unwrap();
        assert_eq!(b.dir, PathBuf::from("/run/vgpu/boards"));
        assert_eq!(b.name, "pod_ctr");
        assert_eq!(Limits::parse(&l.render()).unwrap(), l);
        let mut m = l.clone();
        m.set_ceiling(&Device::Any, None);
        assert_eq!(m.ceiling_for("GPU-b"), None);
        m.set_ceiling(&Device::Any, Some(70));
        assert_eq!(m.ceiling_for("GPU-b"), Some(70));
        for (bad, what) in [
            ("sm-ceiling * 0", "sm-ceiling"),
            ("sm-ceiling * 101", "sm-ceiling"),
            ("sm-ceiling *", "needs"),
            ("sm-ceiling * 5 6", "unexpected"),
            ("sm-ceiling * 5\nsm-ceiling * 6", "already"),
            ("board rel/dir x", "absolute"),
            ("board /d .x", "entry name"),
            ("board /d", "needs"),
            ("board /d x\nboard /e y", "already"),
        ] {
            let e = Limits::parse(&format!("vgpu-limits 1\n{bad}\n")).unwrap_err();
            assert!(e.to_string().contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn the_contract_sample_parses_and_looks_up_by_uuid() {
        let l = Limits::parse(SAMPLE).unwrap();
        assert_eq!(l.devices.len(), 2);
        assert_eq!(l.policy, Some(Policy::Default));
        assert_eq!(l.priority, Some(1));
        assert!(!l.is_suspended());
        let own = l.for_device("GPU-4617E643-F070-4B90-B715-30C57F977A9A");
        assert_eq!(
            own,
            DeviceLimit {
                memory: Some(1 << 30),
                sm: Some(30)
            }
        );
        assert_eq!(
            l.for_device("GPU-other"),
            DeviceLimit {
                memory: Some(2 << 30),
                sm: None
            }
        );
        let none = Limits::parse("vgpu-limits 1\n").unwrap();
        assert_eq!(none.for_device("GPU-x"), DeviceLimit::default());
        // A device line without keys makes that device unlimited.
        let l = Limits::parse("vgpu-limits 1\ndevice * memory=5\ndevice GPU-a\n").unwrap();
        assert_eq!(l.for_device("GPU-a"), DeviceLimit::default());
        assert_eq!(l.for_device("GPU-b").memory, Some(5));
        // sm=100 is no SM limit.
        let l = Limits::parse("vgpu-limits 1\ndevice * sm=100\n").unwrap();
        assert_eq!(l.for_device("x").sm, None);
        assert_eq!(l.devices[0].sm, Some(100));
    }

    #[test]
    fn render_is_canonical_and_round_trips() {
        let l = Limits::parse(SAMPLE).unwrap();
        let text = l.render();
        assert_eq!(
            text,
            "vgpu-limits 1\n\
             device GPU-4617e643-f070-4b90-b715-30c57f977a9a memory=1073741824 sm=30\n\
             device * memory=2147483648\n\
             policy default\n\
             priority 1\n"
        );
        assert_eq!(Limits::parse(&text).unwrap(), l);
        let s = Limits::parse("vgpu-limits 1\nsuspended 0\n").unwrap();
        assert_eq!(s.suspended, Some(false));
        assert_eq!(s.render(), "vgpu-limits 1\nsuspended 0\n");
    }

    #[test]
    fn every_error_names_its_line() {
        type Case = (&'static str, usize, fn(&ParseProblem) -> bool);
        let cases: &[Case] = &[
            ("", 1, |p| *p == ParseProblem::MissingHeader),
            ("# only\n\n", 3, |p| *p == ParseProblem::MissingHeader),
            ("device * memory=1\n", 1, |p| {
                matches!(p, ParseProblem::BadHeader { .. })
            }),
            (
                "vgpu-limits 2\n",
                1,
                |p| matches!(p, ParseProblem::UnsupportedVersion { found } if found == "2"),
            ),
            ("vgpu-limits 99999999999999999999999\n", 1, |p| {
                matches!(p, ParseProblem::UnsupportedVersion { .. })
            }),
            ("vgpu-limits one\n", 1, |p| {
                matches!(p, ParseProblem::BadValue { .. })
            }),
            ("vgpu-limits 01\n", 1, |p| {
                matches!(p, ParseProblem::BadValue { .. })
            }),
            ("vgpu-limits\n", 1, |p| {
                matches!(p, ParseProblem::MissingArgument { .. })
            }),
            ("vgpu-limits 1 x\n", 1, |p| {
                matches!(p, ParseProblem::ExtraArgument { .. })
            }),
            ("vgpu-limits 1\n\nvgpu-limits 1\n", 3, |p| {
                matches!(p, ParseProblem::Duplicate { first: 1, .. })
            }),
            ("vgpu-limits 1\nlimit 5\n", 2, |p| {
                matches!(p, ParseProblem::UnknownDirective { .. })
            }),
            ("vgpu-limits 1\ndevice\n", 2, |p| {
                matches!(p, ParseProblem::MissingArgument { .. })
            }),
            ("vgpu-limits 1\ndevice GPU=1\n", 2, |p| {
                matches!(p, ParseProblem::BadDevice { .. })
            }),
            ("vgpu-limits 1\ndevice * mem=5\n", 2, |p| {
                matches!(p, ParseProblem::UnknownKey { .. })
            }),
            ("vgpu-limits 1\ndevice * 5\n", 2, |p| {
                matches!(p, ParseProblem::UnknownKey { .. })
            }),
            ("vgpu-limits 1\ndevice * memory=0\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "memory", .. })
            }),
            ("vgpu-limits 1\ndevice * memory=1g\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "memory", .. })
            }),
            ("vgpu-limits 1\ndevice * memory=+5\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "memory", .. })
            }),
            (
                "vgpu-limits 1\ndevice * memory=18446744073709551616\n",
                2,
                |p| matches!(p, ParseProblem::BadValue { what: "memory", .. }),
            ),
            ("vgpu-limits 1\ndevice * sm=0\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "sm", .. })
            }),
            ("vgpu-limits 1\ndevice * sm=101\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "sm", .. })
            }),
            ("vgpu-limits 1\ndevice * sm=5 sm=6\n", 2, |p| {
                matches!(p, ParseProblem::Duplicate { .. })
            }),
            (
                "vgpu-limits 1\ndevice GPU-a\n\ndevice gpu-A sm=5\n",
                4,
                |p| matches!(p, ParseProblem::Duplicate { first: 2, .. }),
            ),
            ("vgpu-limits 1\ndevice *\ndevice *\n", 3, |p| {
                matches!(p, ParseProblem::Duplicate { first: 2, .. })
            }),
            ("vgpu-limits 1\npolicy fast\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { what: "policy", .. })
            }),
            ("vgpu-limits 1\npolicy force\npolicy force\n", 3, |p| {
                matches!(p, ParseProblem::Duplicate { .. })
            }),
            ("vgpu-limits 1\npolicy\n", 2, |p| {
                matches!(p, ParseProblem::MissingArgument { .. })
            }),
            ("vgpu-limits 1\npriority 1 2\n", 2, |p| {
                matches!(p, ParseProblem::ExtraArgument { .. })
            }),
            ("vgpu-limits 1\npriority high\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { .. })
            }),
            ("vgpu-limits 1\npriority 99999999999\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { .. })
            }),
            ("vgpu-limits 1\nsuspended yes\n", 2, |p| {
                matches!(p, ParseProblem::BadValue { .. })
            }),
            ("vgpu-limits 1\r\n", 1, |p| {
                *p == ParseProblem::ControlCharacter { found: b'\r' }
            }),
            ("vgpu-limits 1\ndevice *\0\n", 2, |p| {
                matches!(p, ParseProblem::ControlCharacter { found: 0 })
            }),
        ];
        for (text, want_line, check) in cases {
            let (line, p) = problem(text);
            assert_eq!(line, *want_line, "{text:?}: {p}");
            assert!(check(&p), "{text:?}: unexpected {p:?}");
            // The message names the line.
            let msg = Limits::parse(text).unwrap_err().to_string();
            assert!(msg.starts_with(&format!("line {want_line}: ")), "{msg}");
        }
        // Tabs, trailing comments, negative priority, blank lines: fine.
        let l = Limits::parse("\t# c\nvgpu-limits\t1 # v\n\n priority -3\n").unwrap();
        assert_eq!(l.priority, Some(-3));
    }

    #[test]
    fn bytes_that_are_not_utf8_name_their_line() {
        let e = Limits::parse_bytes(b"vgpu-limits 1\ndevice \xff\n").unwrap_err();
        assert_eq!(e.line(), Some(2));
        assert!(matches!(
            e,
            LimitsError::Parse {
                problem: ParseProblem::NotUtf8,
                ..
            }
        ));
        // An earlier error wins over a later encoding error.
        let e = Limits::parse_bytes(b"vgpu-limits 1\nbogus\n\xff\n").unwrap_err();
        assert_eq!(e.line(), Some(2), "{e}");
        let e = Limits::parse_bytes(b"\xffvgpu-limits 1\n").unwrap_err();
        assert_eq!(e.line(), Some(1));
    }

    #[test]
    fn validate_refuses_what_would_not_read_back() {
        let mut l = Limits::default();
        l.devices.push(DeviceLine {
            device: Device::Uuid("GPU a".into()),
            memory: None,
            sm: None,
        });
        assert!(matches!(l.validate(), Err(LimitsError::Invalid { .. })));
        l.devices[0].device = Device::Uuid("GPU-a".into());
        l.devices[0].memory = Some(0);
        assert!(l.validate().is_err());
        l.devices[0].memory = Some(1);
        l.devices[0].sm = Some(0);
        assert!(l.validate().is_err());
        l.devices[0].sm = Some(100);
        assert!(l.validate().is_ok());
        l.devices.push(DeviceLine {
            device: Device::Uuid("gpu-A".into()),
            memory: None,
            sm: None,
        });
        assert!(l.validate().is_err());
    }

    #[test]
    fn line_mut_inherits_what_applied() {
        let mut l = Limits::parse("vgpu-limits 1\ndevice * memory=100 sm=50\n").unwrap();
        l.line_mut(&Device::Uuid("GPU-a".into())).memory = Some(7);
        assert_eq!(
            l.for_device("GPU-a"),
            DeviceLimit {
                memory: Some(7),
                sm: Some(50)
            }
        );
        assert_eq!(l.for_device("GPU-b").memory, Some(100));
        l.line_mut(&Device::Any).sm = None;
        assert_eq!(l.for_device("GPU-b").sm, None);
        assert_eq!(l.devices.len(), 2);
    }

    #[test]
    fn effective_follows_the_trust_rule() {
        let file = DeviceLimit {
            memory: Some(1 << 30),
            sm: None,
        };
        let higher = DeviceLimit {
            memory: Some(8 << 30),
            sm: Some(50),
        };
        let lower = DeviceLimit {
            memory: Some(1 << 20),
            sm: None,
        };
        // The environment never raises a limit the file sets...
        assert_eq!(
            effective(Some(file), higher),
            DeviceLimit {
                memory: Some(1 << 30),
                sm: Some(50)
            }
        );
        // ...may lower it...
        assert_eq!(effective(Some(file), lower).memory, Some(1 << 20));
        // ...and applies alone without a file.
        assert_eq!(effective(None, higher), higher);
        assert_eq!(
            effective(None, DeviceLimit::default()),
            DeviceLimit::default()
        );
        assert_eq!(
            DeviceLimit::from_region(crate::telemetry::Limits { mem: 0, sm: 100 }),
            DeviceLimit::default()
        );
        assert_eq!(
            DeviceLimit::from_region(file.to_region()),
            file,
            "display copy round trip"
        );
    }

    #[test]
    fn path_rules() {
        assert_eq!(
            path_for_region(Path::new(
                "/usr/local/vgpu/containers/pod1_ctr/region.cache"
            )),
            Path::new("/usr/local/vgpu/limits/pod1_ctr/limits")
        );
        assert_eq!(
            path_for_region(Path::new("/tmp/vgpu-run-1/region.cache")),
            Path::new("/tmp/vgpu-run-1/limits")
        );
        assert_eq!(
            path_for_region(Path::new("region.cache")),
            Path::new("./limits")
        );
        assert_eq!(
            path_for_region(Path::new("containers/p_c/x.cache")),
            Path::new("./limits/p_c/limits")
        );
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("etc-limits");
        let env = OsStr::new("/elsewhere/limits");
        assert_eq!(
            locate_with(&default, Some(env)),
            Some((PathBuf::from(env), Source::Env))
        );
        assert_eq!(locate_with(&default, Some(OsStr::new(""))), None);
        assert_eq!(locate_with(&default, None), None);
        // Anything at the default path wins, even a dangling symlink.
        std::os::unix::fs::symlink("/nonexistent", &default).unwrap();
        assert_eq!(
            locate_with(&default, Some(env)),
            Some((default.clone(), Source::Default))
        );
    }
}
