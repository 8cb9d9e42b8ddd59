//! Phase vectors of `cuInit` (written by libvgpu.so into its region slot) and
//! their composition into named segments for the report.

/// Phase names in the order the interposer passes them
/// (docs/architecture.md, "Phase vector of cuInit").
pub const PHASE_NAMES: [&str; 10] = [
    "loader_ready",
    "wrapper_enter",
    "region_mapped",
    "slot_claimed",
    "real_init_enter",
    "real_init_exit",
    "identity_enter",
    "identity_exit",
    "post_init_exit",
    "wrapper_exit",
];

/// Name of the segment that *ends* at each phase (index as `PHASE_NAMES`).
const SEGMENT_ENDING_AT: [&str; 10] = [
    "load",
    "dispatch",
    "map region",
    "claim slot",
    "pre-init",
    "driver cuInit",
    "to identity",
    "identity",
    "post-init",
    "wrapper exit",
];

/// One worker's phase timestamps (CLOCK_MONOTONIC ns, 0 = not reached).
pub type PhaseVector = [u64; 10];

/// A named duration inside one worker's measured call.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Segment {
    pub name: String,
    pub ms: f64,
}

/// Split the worker's call `[t_entry, t_return]` into segments at every
/// non-zero phase timestamp inside it; without phases, one "cuInit
/// (unattributed)" segment. `t_init_return` separates the `--then` calls
/// (a "then" segment when `then` is set).
pub fn compose(
    t_entry: u64,
    t_init_return: u64,
    t_return: u64,
    phases: Option<&PhaseVector>,
    then: bool,
) -> Vec<Segment> {
    let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6;
    let mut out = Vec::new();
    let mut prev = t_entry;
    match phases {
        Some(p) if p[1] != 0 => {
            // loader_ready precedes the call (library load at exec time).
            for (i, &t) in p.iter().enumerate().skip(1) {
                if t == 0 {
                    continue;
                }
                out.push(Segment {
                    name: SEGMENT_ENDING_AT[i].to_string(),
                    ms: ms(prev, t),
                });
                prev = t;
            }
            out.push(Segment {
                name: "return".to_string(),
                ms: ms(prev, t_init_return),
            });
        }
        _ => out.push(Segment {
            name: "cuInit (unattributed)".to_string(),
            ms: ms(prev, t_init_return),
        }),
    }
    if then {
        out.push(Segment {
            name: "then".to_string(),
            ms: ms(t_init_return, t_return),
        });
    }
    out
}

/// True when every reached timestamp of the worker is in order:
/// ready <= released <= entry <= phases(wrapper_enter..wrapper_exit) <=
/// init return <= return, and loader_ready (when set) precedes entry.
pub fn monotonic(
    t_ready: u64,
    t_released: u64,
    t_entry: u64,
    t_init_return: u64,
    t_return: u64,
    phases: &PhaseVector,
) -> bool {
    let mut seq = vec![t_ready, t_released, t_entry];
    seq.extend(phases[1..].iter().copied().filter(|&t| t != 0));
    seq.push(t_init_return);
    seq.push(t_return);
    let ordered = seq.windows(2).all(|w| w[0] <= w[1]);
    let loader_ok = phases[0] == 0 || phases[0] <= t_entry;
    ordered && loader_ok && phases[1] != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_splits_at_nonzero_phases() {
        let p: PhaseVector = [5, 110, 120, 130, 140, 200, 0, 0, 210, 215];
        let s = compose(100, 220, 220, Some(&p), false);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "dispatch",
                "map region",
                "claim slot",
                "pre-init",
                "driver cuInit",
                "post-init",
                "wrapper exit",
                "return"
            ]
        );
        let total: f64 = s.iter().map(|s| s.ms).sum();
        assert!((total - 120e-6).abs() < 1e-12);
        assert_eq!(s[4].ms, 60e-6);
        assert!(monotonic(1, 2, 100, 220, 230, &p));
        let mut bad = p;
        bad[5] = 125; // driver exit before driver enter
        assert!(!monotonic(1, 2, 100, 220, 230, &bad));
        let none = compose(100, 300, 400, None, true);
        assert_eq!(none.len(), 2);
        assert_eq!(none[0].name, "cuInit (unattributed)");
        assert_eq!(none[1].name, "then");
    }
}
