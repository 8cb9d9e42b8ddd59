//! Kubernetes resource quantities (`"3000"`, `"3k"`, `"2Gi"`, `"1500m"`,
//! `"1e3"`) read as exact integers, the way Go's `Quantity.AsInt64` does.
//!
//! Owns only the grammar of `k8s.io/apimachinery/pkg/api/resource`; it
//! never rounds: a value that is not a whole number, or does not fit an
//! `i64`, is an error. kube-scheduler re-serializes quantities in canonical
//! form, so a user's `nvidia.com/gpumem: 3000` reaches the extender as
//! `"3k"` and must read back as 3000.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error(
        "quantity {0:?} is not a number with an optional suffix (Ki, Mi, Gi, k, M, G, m, e3, ...)"
    )]
    Syntax(String),
    #[error("quantity {0:?} is not a whole number")]
    Fractional(String),
    #[error("quantity {0:?} is out of range")]
    Range(String),
}

/// The exact integer value of a quantity string.
pub fn parse_int(text: &str) -> Result<i64, QuantityError> {
    let syntax = || QuantityError::Syntax(text.to_owned());
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(syntax());
    }
    // Mantissa as an integer scaled by 10^-frac_len; 38 digits fit i128.
    if int_part.len() + frac_part.len() > 38 {
        return Err(QuantityError::Range(text.to_owned()));
    }
    let mut mantissa: i128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa * 10 + i128::from(b - b'0');
    }
    let mut dec_exp: i32 = -(frac_part.len() as i32);
    let mut bin_exp: u32 = 0;
    match suffix {
        "" => {}
        "Ki" => bin_exp = 10,
        "Mi" => bin_exp = 20,
        "Gi" => bin_exp = 30,
        "Ti" => bin_exp = 40,
        "Pi" => bin_exp = 50,
        "Ei" => bin_exp = 60,
        "n" => dec_exp -= 9,
        "u" => dec_exp -= 6,
        "m" => dec_exp -= 3,
        "k" => dec_exp += 3,
        "M" => dec_exp += 6,
        "G" => dec_exp += 9,
        "T" => dec_exp += 12,
        "P" => dec_exp += 15,
        "E" => dec_exp += 18,
        _ => {
            let exp = suffix
                .strip_prefix(['e', 'E'])
                .filter(|e| !e.is_empty())
                .ok_or_else(syntax)?;
            let exp: i32 = exp.parse().map_err(|_| syntax())?;
            if !(-40..=40).contains(&exp) {
                return Err(QuantityError::Range(text.to_owned()));
            }
            dec_exp += exp;
        }
    }
    let range = || QuantityError::Range(text.to_owned());
    let mut value = mantissa.checked_mul(1i128 << bin_exp).ok_or_else(range)?;
    if dec_exp >= 0 {
        let scale = 10i128.checked_pow(dec_exp as u32).ok_or_else(range)?;
        value = value.checked_mul(scale).ok_or_else(range)?;
    } else {
        let Some(scale) = 10i128.checked_pow(dec_exp.unsigned_abs()) else {
            // 10^39 and beyond: only zero divides evenly.
            return if value == 0 {
                Ok(0)
            } else {
                Err(QuantityError::Fractional(text.to_owned()))
            };
        };
        if value % scale != 0 {
            return Err(QuantityError::Fractional(text.to_owned()));
        }
        value /= scale;
    }
    if negative {
        value = -value;
    }
    i64::try_from(value).map_err(|_| range())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_read_back_exactly() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("3000", 3000),
            ("3k", 3000),
            ("2Gi", 2 << 30),
            ("1Ki", 1024),
            ("1000m", 1),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1.5k", 1500),
            ("+7", 7),
            ("-2", -2),
            ("100", 100),
            ("16M", 16_000_000),
            ("0.5Ki", 512),
            ("5000000000n", 5),
        ];
        for (text, want) in cases {
            assert_eq!(parse_int(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn junk_fractions_and_overflow_are_errors() {
        for bad in ["", "abc", "1x", "1.2.3", "e3", "1e", "1ee3", "1 k", "."] {
            assert!(
                matches!(parse_int(bad), Err(QuantityError::Syntax(_))),
                "{bad:?}"
            );
        }
        for frac in ["1.5", "100m", "1500m", "1e-1"] {
            assert!(
                matches!(parse_int(frac), Err(QuantityError::Fractional(_))),
                "{frac}"
            );
        }
        for big in [
            "10E",
            "9223372036854775808",
            "99999999999999999999999999999999999999999",
        ] {
            assert!(
                matches!(parse_int(big), Err(QuantityError::Range(_))),
                "{big}"
            );
        }
        assert_eq!(parse_int("9223372036854775807"), Ok(i64::MAX));
    }
}
