//! Kubernetes quantities (`resource.Quantity`) as exact integers: parsing
//! the canonical and non-canonical forms (`81920Mi`, `8000Mi`, `30`, `1.5Gi`,
//! `500m`, `1e3`), the allocator's rounding of a request onto a
//! `validRange` (`roundUpRange` of k8s.io/dynamic-resource-allocation, the
//! integer form used before `DRAFractionalCapacityRange`), and the 1 Mi
//! rounding of device memory the slice publishes.

/// A quantity in nano-units (value × 10⁹), exact for everything the API
/// server accepts up to 2⁶³ units; finer fractions round up, as the API
/// server's own rounding to nano precision does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

/// 1 Mi in bytes.
pub const MI: u64 = 1 << 20;
const NANO: i128 = 1_000_000_000;

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a quantity at all.
    #[error("quantity {0:?}: expected a number with an optional suffix (Ki, Mi, Gi, m, k, M, G, e3, ...)")]
    Syntax(String),
    /// Too large for int64 units.
    #[error("quantity {0:?} is out of range")]
    Range(String),
    /// A value that must be a whole number of units is not.
    #[error("quantity {0:?} is not a whole number")]
    Fraction(String),
    /// A value that must not be negative is.
    #[error("quantity {0:?} is negative")]
    Negative(String),
}

impl Quantity {
    /// `n` whole units.
    pub fn from_units(n: i64) -> Quantity {
        Quantity(i128::from(n) * NANO)
    }

    /// Parses `s` as the API server does (`resource.ParseQuantity`).
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_owned());
        let range = || QuantityError::Range(s.to_owned());
        let t = s.trim();
        let (neg, body) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(num_end);
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(syntax());
        }
        // Digits as an integer and a power of ten; mantissas past 38
        // digits are out of any valid range anyway.
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 36 {
            return Err(range());
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| syntax())?
        };
        let mut exp10: i32 = -(frac.len() as i32);
        let mut mul2: u32 = 0;
        match suffix {
            "" => {}
            "Ki" => mul2 = 10,
            "Mi" => mul2 = 20,
            "Gi" => mul2 = 30,
            "Ti" => mul2 = 40,
            "Pi" => mul2 = 50,
            "Ei" => mul2 = 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            e if e.starts_with(['e', 'E']) => {
                let x: i32 = e[1..].parse().map_err(|_| syntax())?;
                exp10 = exp10.checked_add(x).ok_or_else(range)?;
            }
            _ => return Err(syntax()),
        }
        // value × 10⁹ = mantissa × 2^mul2 × 10^(exp10 + 9), rounded up.
        let e = exp10 + 9;
        let scaled = mantissa.checked_mul(1i128 << mul2).ok_or_else(range)?;
        let nano = if e >= 0 {
            if e > 30 && scaled != 0 {
                return Err(range());
            }
            scaled.checked_mul(10i128.pow(e as u32)).ok_or_else(range)?
        } else if -e > 38 {
            i128::from(scaled != 0)
        } else {
            let d = 10i128.pow((-e) as u32);
            scaled / d + i128::from(scaled % d != 0)
        };
        // int64 units at most (the API server's limit for Value()).
        if nano > i128::from(i64::MAX) * NANO {
            return Err(range());
        }
        Ok(Quantity(if neg { -nano } else { nano }))
    }

    /// Whole units rounded up (Go `Quantity.Value()`).
    pub fn value(self) -> i128 {
        self.0.div_euclid(NANO) + i128::from(self.0.rem_euclid(NANO) != 0)
    }

    /// Whole units, refusing a fraction or a negative number.
    pub fn whole_units(self, text: &str) -> Result<u64, QuantityError> {
        if self.0 < 0 {
            return Err(QuantityError::Negative(text.to_owned()));
        }
        if self.0 % NANO != 0 {
            return Err(QuantityError::Fraction(text.to_owned()));
        }
        u64::try_from(self.0 / NANO).map_err(|_| QuantityError::Range(text.to_owned()))
    }
}

/// Parses `s` as a whole, non-negative number of units (bytes, cores).
pub fn parse_units(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.whole_units(s)
}

/// The allocator's rounding of `requested` onto a range with `min` and an
/// optional `step`: below `min` gives `min`; without a step the request
/// stands; else `min + n·step` for the least `n` that reaches the request,
/// in whole units (Go's `Value()`, which rounds fractions up).
pub fn round_up_range(requested: Quantity, min: Quantity, step: Option<Quantity>) -> Quantity {
    if requested < min {
        return min;
    }
    let Some(step) = step else {
        return requested;
    };
    let (r, m, s) = (requested.value(), min.value(), step.value());
    if s <= 0 {
        return requested;
    }
    let added = r - m;
    let n = added / s + i128::from(added % s != 0);
    Quantity((m + s * n) * NANO)
}

/// `bytes` rounded down to a whole number of Mi.
pub fn round_down_mi(bytes: u64) -> u64 {
    bytes / MI * MI
}

/// `bytes` (a multiple of 1 Mi) as a quantity in Mi: `81920Mi`.
pub fn format_mi(bytes: u64) -> String {
    format!("{}Mi", bytes / MI)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(s: &str) -> i128 {
        Quantity::parse(s).unwrap().0
    }

    #[test]
    fn parse_table() {
        let table: &[(&str, i128)] = &[
            ("0", 0),
            ("1", NANO),
            ("30", 30 * NANO),
            ("1Mi", (1 << 20) * NANO),
            ("8000Mi", 8000 * (1 << 20) * NANO),
            ("81920Mi", 81920 * (1 << 20) * NANO),
            ("80Gi", (80i128 << 30) * NANO),
            ("1.5Gi", (3i128 << 29) * NANO),
            ("500m", NANO / 2),
            ("1k", 1000 * NANO),
            ("1e3", 1000 * NANO),
            ("1E3", 1000 * NANO),
            ("2M", 2_000_000 * NANO),
            ("1n", 1),
            ("0.1n", 1), // rounds up to nano precision
            ("+7", 7 * NANO),
            ("-7", -7 * NANO),
            (".5", NANO / 2),
            ("1Ei", (1i128 << 60) * NANO),
        ];
        for (s, want) in table {
            assert_eq!(units(s), *want, "{s}");
        }
        for bad in ["", "Mi", "1.2.3", "1X", "1 Mi", "1e", "abc", "--1"] {
            assert!(
                matches!(Quantity::parse(bad), Err(QuantityError::Syntax(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Quantity::parse("16Ei"),
            Err(QuantityError::Range(_))
        ));
        assert_eq!(parse_units("8000Mi").unwrap(), 8000 << 20);
        assert!(matches!(
            parse_units("1.5"),
            Err(QuantityError::Fraction(_))
        ));
        assert!(matches!(parse_units("-1"), Err(QuantityError::Negative(_))));
    }

    #[test]
    fn value_rounds_up_like_go() {
        assert_eq!(Quantity::parse("1.2").unwrap().value(), 2);
        assert_eq!(Quantity::parse("500m").unwrap().value(), 1);
        assert_eq!(Quantity::parse("2").unwrap().value(), 2);
        assert_eq!(Quantity::parse("-1.5").unwrap().value(), -1);
    }

    #[test]
    fn round_up_range_table() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        let mi = Some(q("1Mi"));
        // (requested, min, step, want)
        let table: &[(&str, &str, Option<Quantity>, &str)] = &[
            ("8000Mi", "1Mi", mi, "8000Mi"),
            ("8000.5Mi", "1Mi", mi, "8001Mi"),
            ("1", "1Mi", mi, "1Mi"), // below min
            ("1Mi", "1Mi", mi, "1Mi"),
            ("1000000", "1Mi", mi, "1Mi"), // 1e6 bytes < 1Mi
            ("1048577", "1Mi", mi, "2Mi"), // one byte over
            ("30", "1", Some(q("1")), "30"),
            ("0", "1", Some(q("1")), "1"),
            ("7", "2", Some(q("4")), "10"), // 2 + 2*4
            ("6", "2", Some(q("4")), "6"),
            ("3.5", "1", None, "3.5"), // no step: unchanged
            ("2.5", "1", Some(q("1")), "3"),
        ];
        for (r, m, s, want) in table {
            assert_eq!(
                round_up_range(q(r), q(m), *s),
                q(want),
                "{r} min {m} step {s:?}"
            );
        }
    }

    #[test]
    fn mi_rounding_and_format() {
        assert_eq!(round_down_mi(80 << 30), 80 << 30);
        assert_eq!(round_down_mi((80 << 30) + 12345), 80 << 30);
        assert_eq!(round_down_mi(MI - 1), 0);
        assert_eq!(format_mi(80 << 30), "81920Mi");
        assert_eq!(
            Quantity::parse(&format_mi(81920 << 20)).unwrap(),
            Quantity::parse("80Gi").unwrap()
        );
    }
}
