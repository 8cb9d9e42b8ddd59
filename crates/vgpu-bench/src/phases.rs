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

const LOADER_READY: usize = 0;
const WRAPPER_ENTER: usize = 1;
const REGION_MAPPED: usize = 2;
const SLOT_CLAIMED: usize = 3;
const REAL_INIT_ENTER: usize = 4;
const REAL_INIT_EXIT: usize = 5;
const IDENTITY_ENTER: usize = 6;
const IDENTITY_EXIT: usize = 7;
const POST_INIT_EXIT: usize = 8;
const WRAPPER_EXIT: usize = 9;

/// One worker's phase timestamps (CLOCK_MONOTONIC ns, 0 = not reached).
pub type PhaseVector = [u64; 10];

/// A named duration inside one worker's measured call.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Segment {
    pub name: String,
    pub ms: f64,
}

/// Split the worker's call `[t_entry, t_init_return]` into segments at every
/// phase timestamp inside it, **in time order** (the interposer may map the
/// region after the real `cuInit`, e.g. when it must count devices to create
/// it); each segment is named by the event that ends it. Without phases, one
/// "cuInit (unattributed)" segment. A "then" segment covers the `--then`
/// calls when `then` is set.
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
        Some(p) if p[WRAPPER_ENTER] != 0 => {
            let mut events: Vec<(u64, usize)> = p
                .iter()
                .enumerate()
                // loader_ready before entry is library setup outside the call.
                .filter(|&(i, &t)| t != 0 && (i != LOADER_READY || t >= t_entry))
                .map(|(i, &t)| (t, i))
                .collect();
            events.sort();
            for (t, i) in events {
                out.push(Segment {
                    name: SEGMENT_ENDING_AT[i].to_string(),
                    ms: ms(prev, t),
                });
                prev = prev.max(t);
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

/// True when the worker's timestamps are consistent with one timeline:
/// ready <= released <= entry <= wrapper_enter; every reached phase lies in
/// [wrapper_enter, wrapper_exit]; wrapper_exit <= init return <= return; and
/// each begin precedes its end (loader_ready <= wrapper_enter, region mapped
/// <= slot claimed, real init enter <= exit <= post-init exit, identity
/// enter <= exit). wrapper_enter and wrapper_exit must be present.
pub fn monotonic(
    t_ready: u64,
    t_released: u64,
    t_entry: u64,
    t_init_return: u64,
    t_return: u64,
    p: &PhaseVector,
) -> bool {
    let (we, wx) = (p[WRAPPER_ENTER], p[WRAPPER_EXIT]);
    if we == 0 || wx == 0 {
        return false;
    }
    let chain = [
        t_ready,
        t_released,
        t_entry,
        we,
        wx,
        t_init_return,
        t_return,
    ];
    let inside = p[REGION_MAPPED..WRAPPER_EXIT]
        .iter()
        .all(|&t| t == 0 || (we <= t && t <= wx));
    // (a, b): when both are reached, a <= b.
    let pairs = [
        (LOADER_READY, WRAPPER_ENTER),
        (REGION_MAPPED, SLOT_CLAIMED),
        (REAL_INIT_ENTER, REAL_INIT_EXIT),
        (REAL_INIT_EXIT, POST_INIT_EXIT),
        (IDENTITY_ENTER, IDENTITY_EXIT),
    ];
    let ordered = pairs
        .iter()
        .all(|&(a, b)| p[a] == 0 || p[b] == 0 || p[a] <= p[b]);
    chain.windows(2).all(|w| w[0] <= w[1]) && inside && ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_splits_in_time_order() {
        // The region is mapped after the real cuInit (creator path).
        let p: PhaseVector = [5, 110, 205, 207, 140, 200, 0, 0, 210, 215];
        let s = compose(100, 220, 220, Some(&p), false);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "dispatch",
                "pre-init",
                "driver cuInit",
                "map region",
                "claim slot",
                "post-init",
                "wrapper exit",
                "return"
            ]
        );
        let total: f64 = s.iter().map(|s| s.ms).sum();
        assert!((total - 120e-6).abs() < 1e-12);
        assert_eq!(s[2].ms, 60e-6);
        assert!(monotonic(1, 2, 100, 220, 230, &p));
        let mut bad = p;
        bad[5] = 125; // driver exit before driver enter
        assert!(!monotonic(1, 2, 100, 220, 230, &bad));
        let mut bad = p;
        bad[3] = 300; // slot claimed after the wrapper returned
        assert!(!monotonic(1, 2, 100, 220, 230, &bad));
        let mut bad = p;
        bad[9] = 0; // wrapper exit missing
        assert!(!monotonic(1, 2, 100, 220, 230, &bad));
        assert!(
            !monotonic(1, 2, 100, 90, 230, &p),
            "init return before the wrapper exit"
        );
        // loader_ready inside the call is a segment of its own.
        let mut q = p;
        q[0] = 105;
        assert_eq!(compose(100, 220, 220, Some(&q), false)[0].name, "load");
        let none = compose(100, 300, 400, None, true);
        assert_eq!(none.len(), 2);
        assert_eq!(none[0].name, "cuInit (unattributed)");
        assert_eq!(none[1].name, "then");
    }
}
