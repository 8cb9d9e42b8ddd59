//! The shape of libvgpu.so lasts: every module of `src/` imports only
//! modules of a lower layer (or itself). Layers, bottom up:
//!
//! sys < config < log < process < {driver, ledger} < attach
//!     < {memory, identity} < {views, limiter} < init < ffi
//!
//! Modules of one layer may not import each other (no cycles), and nothing
//! imports `ffi` (the exports). A new module must be given a layer here.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// (module, layer).
const LAYERS: &[(&str, u32)] = &[
    ("sys", 0),
    ("config", 1),
    ("log", 2),
    ("process", 3),
    ("driver", 4),
    ("ledger", 4),
    ("attach", 5),
    ("memory", 6),
    ("identity", 6),
    ("views", 7),
    ("limiter", 7),
    ("init", 8),
    ("ffi", 9),
];

/// Exported macros and the module that defines them.
const MACROS: &[(&str, &str)] = &[
    ("error", "log"),
    ("warn", "log"),
    ("info", "log"),
    ("debug", "log"),
    ("log_at", "log"),
    ("hooks", "ffi"),
];

fn layer(m: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l)
}

/// The crate modules a source file names through `crate::` paths (and
/// `$crate::` in macros, and the crate-root macros).
fn imports(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let code: String = src
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(after);
            if after[name.len()..].starts_with('!') {
                if let Some((_, m)) = MACROS.iter().find(|(mac, _)| *mac == name) {
                    out.insert(m.to_string());
                }
            } else if !name.is_empty() {
                out.insert(name);
            }
        }
        rest = after;
    }
    out
}

/// Upward (or sideways) imports of `module` given its source.
fn violations(module: &str, src: &str) -> Vec<String> {
    let Some(own) = layer(module) else {
        return vec![format!("module `{module}` has no layer in tests/layers.rs")];
    };
    imports(src)
        .into_iter()
        .filter(|m| m != module)
        .filter_map(|m| match layer(&m) {
            None => Some(format!("`{module}` names unknown crate module `{m}`")),
            Some(l) if l >= own => Some(format!(
                "`{module}` (layer {own}) imports `{m}` (layer {l})"
            )),
            Some(_) => None,
        })
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        // The crate root declares the modules; bin/ is a separate crate.
        if rel == Path::new("lib.rs") || first == "bin" {
            continue;
        }
        let module = first.trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(f).unwrap();
        for v in violations(&module, &text) {
            bad.push(format!("{}: {v}", rel.display()));
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} files checked");
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_upward_and_sideways_imports() {
    // Upward: the memory policy reaching into the exports.
    let v = violations("memory", "use crate::ffi::cuda;\nfn f() {}");
    assert_eq!(v, ["`memory` (layer 6) imports `ffi` (layer 9)"]);
    // Grouped, and a macro defined above.
    let v = violations(
        "driver",
        "use crate::{sys, attach::Proc};\ncrate::hooks! {}",
    );
    assert_eq!(v.len(), 2, "{v:?}");
    // Sideways within a layer (a cycle in the making).
    assert_eq!(
        violations("ledger", "crate::driver::table::ensure(x);").len(),
        1
    );
    // Downward is fine; comments do not count.
    assert!(violations(
        "memory",
        "use crate::ledger::Ledger; // crate::ffi\ncrate::warn!(\"x\");"
    )
    .is_empty());
    // A module nobody gave a layer fails too.
    assert_eq!(violations("gadget", "").len(), 1);
}
