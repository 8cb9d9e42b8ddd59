//! Size and percent parsing shared by the env contract (docs/design.md section 4)
//! and the CLI.

/// A size or percent that does not parse. The message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Empty string.
    #[error("empty size")]
    Empty,
    /// Not a number with an optional binary suffix.
    #[error("invalid size {0:?}: expected bytes or a number with k/m/g (KiB/MiB/GiB) suffix")]
    Invalid(String),
    /// Does not fit in 64 bits.
    #[error("size {0:?} is too large")]
    Overflow(String),
    /// Not an integer percent.
    #[error("invalid SM percent {0:?}: expected an integer 0-100")]
    InvalidPercent(String),
    /// Percent above 100.
    #[error("SM percent {0:?} is above 100")]
    PercentRange(String),
}

/// Parses bytes: a plain number, or a number with a binary suffix k/m/g/t
/// (also K/M/G/T, KB/MB/GB, KiB/MiB/GiB/TiB; case-insensitive):
/// `"4096m"` = 4096 MiB, as HAMi's device plugin writes it.
pub fn parse_mem_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(SizeError::Invalid(s.to_owned()));
    }
    let shift = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SizeError::Invalid(s.to_owned())),
    };
    let n: u64 = num.parse().map_err(|_| SizeError::Overflow(s.to_owned()))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(s.to_owned()))
}

/// Parses an SM percent 0–100 (an optional trailing `%` is accepted).
/// Callers treat 0 and 100 as "no limit".
pub fn parse_sm_percent(s: &str) -> Result<u32, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let t = t.strip_suffix('%').unwrap_or(t);
    let n: u32 = t
        .parse()
        .map_err(|_| SizeError::InvalidPercent(s.to_owned()))?;
    if n > 100 {
        return Err(SizeError::PercentRange(s.to_owned()));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_mem_size("4096m"), Ok(4096 << 20));
        assert_eq!(parse_mem_size("4096M"), Ok(4096 << 20));
        assert_eq!(parse_mem_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_mem_size("2 gib"), Ok(2 << 30));
        assert_eq!(parse_mem_size("1k"), Ok(1024));
        assert_eq!(parse_mem_size("123"), Ok(123));
        assert_eq!(parse_mem_size("0"), Ok(0));
        assert_eq!(parse_mem_size(""), Err(SizeError::Empty));
        assert_eq!(parse_mem_size("12x"), Err(SizeError::Invalid("12x".into())));
        assert_eq!(parse_mem_size("m"), Err(SizeError::Invalid("m".into())));
        assert_eq!(parse_mem_size("-1"), Err(SizeError::Invalid("-1".into())));
        assert!(matches!(
            parse_mem_size("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_mem_size("17179869184g"),
            Err(SizeError::Overflow(_))
        ));
        let e = parse_mem_size("4096q").unwrap_err().to_string();
        assert!(e.contains("4096q"), "{e}");
    }

    #[test]
    fn percents() {
        assert_eq!(parse_sm_percent("50"), Ok(50));
        assert_eq!(parse_sm_percent("50%"), Ok(50));
        assert_eq!(parse_sm_percent("0"), Ok(0));
        assert!(matches!(
            parse_sm_percent("101"),
            Err(SizeError::PercentRange(_))
        ));
        assert!(matches!(
            parse_sm_percent("fast"),
            Err(SizeError::InvalidPercent(_))
        ));
    }
}
