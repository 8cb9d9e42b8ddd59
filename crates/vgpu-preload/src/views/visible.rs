//! `CUDA_VISIBLE_DEVICES`: which physical (NVML) device each CUDA ordinal is
//! (pure parsing; the map over NVML is in `views::nvml`).
//!
//! Follows the driver's rules: a comma-separated list of indices or UUIDs
//! (`GPU-…`, a unique prefix is enough); parsing stops at the first invalid
//! or duplicate entry, and everything before it stays visible.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Index(u32),
    Uuid(String),
}

/// Parses the variable's entries up to the first one the driver would reject.
pub fn parse(v: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for raw in v.split(',') {
        let t = raw.trim();
        let e = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            match t.parse::<u32>() {
                Ok(i) => Entry::Index(i),
                Err(_) => break,
            }
        } else if t.len() > 4 && t[..4].eq_ignore_ascii_case("GPU-") {
            Entry::Uuid(t.to_ascii_lowercase())
        } else {
            break;
        };
        if out.contains(&e) {
            break;
        }
        out.push(e);
    }
    out
}

/// Maps the entries onto physical devices: `uuids[i]` is physical device
/// `i`'s UUID (`GPU-…`). Returns physical indices in CUDA ordinal order;
/// stops at the first entry naming no device (or an ambiguous prefix), as
/// the driver does. `None` input (variable unset) means all devices.
pub fn resolve(var: Option<&str>, uuids: &[String]) -> Vec<u32> {
    let Some(v) = var else {
        return (0..uuids.len() as u32).collect();
    };
    let mut out: Vec<u32> = Vec::new();
    for e in parse(v) {
        let idx = match e {
            Entry::Index(i) if (i as usize) < uuids.len() => i,
            Entry::Index(_) => break,
            Entry::Uuid(u) => {
                let mut hits = uuids
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.to_ascii_lowercase().starts_with(&u));
                match (hits.next(), hits.next()) {
                    (Some((i, _)), None) => i as u32,
                    _ => break,
                }
            }
        };
        if out.contains(&idx) {
            break;
        }
        out.push(idx);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uu() -> Vec<String> {
        vec![
            "GPU-aaaa-0000".into(),
            "GPU-bbbb-1111".into(),
            "GPU-abcd-2222".into(),
        ]
    }

    #[test]
    fn indices_and_order() {
        assert_eq!(resolve(None, &uu()), vec![0, 1, 2]);
        assert_eq!(resolve(Some("1"), &uu()), vec![1]);
        assert_eq!(resolve(Some("1,0"), &uu()), vec![1, 0]);
        assert_eq!(resolve(Some(""), &uu()), Vec::<u32>::new());
    }

    #[test]
    fn uuids_and_prefixes() {
        assert_eq!(resolve(Some("GPU-bbbb-1111"), &uu()), vec![1]);
        assert_eq!(resolve(Some("gpu-BBBB"), &uu()), vec![1]);
        assert_eq!(resolve(Some("GPU-abcd,0"), &uu()), vec![2, 0]);
        // Ambiguous prefix ("GPU-a" matches two) stops the list.
        assert_eq!(resolve(Some("1,GPU-a,0"), &uu()), vec![1]);
    }

    #[test]
    fn stops_at_first_invalid_or_duplicate() {
        assert_eq!(resolve(Some("0,7,1"), &uu()), vec![0]);
        assert_eq!(resolve(Some("1,x,0"), &uu()), vec![1]);
        assert_eq!(resolve(Some("1,1,0"), &uu()), vec![1]);
        assert_eq!(resolve(Some("2,GPU-abcd"), &uu()), vec![2]);
    }
}
