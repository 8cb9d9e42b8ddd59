//! The shape of libvgpu.so lasts: every module of `src/` imports only
//! modules of a lower layer (or itself). Layers, bottom up:
//!
//! sys < config < log < process < {driver, ledger, limits_source} < attach
//!     < {memory, identity} < {views, limiter} < init < ffi
//!
//! Modules of one layer may not import each other (no cycles), and nothing
//! imports `ffi` (the exports). A new module must be given a layer here.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// (module, layer).
const LAYERS: &[(&str, u32)] = &[
    ("sys", 0),
    ("clock", 0),
    ("config", 1),
    ("log", 2),
    ("process", 3),
    ("driver", 4),
    ("ledger", 4),
    ("limits_source", 4),
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

/// Every `.rs` file below `dir` (also the signature scan's walker).
pub(crate) fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
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

// ---------------------------------------------------------------------
// Docs that state the architecture are checked against the code.

/// The backticked paths of `docs/interposer.md`'s "`unsafe` lives in"
/// item, up to "nowhere else": files (`x.rs`) or directories (`x/`) of
/// `src/`.
fn documented_unsafe_places(doc: &str) -> Vec<String> {
    let start = doc
        .find("- `unsafe` lives in")
        .expect("docs/interposer.md states where `unsafe` lives");
    let item = &doc[start + 2..];
    let end = item.find("\n- ").unwrap_or(item.len());
    // What follows "nowhere else" says who checks the list, not where.
    let end = item[..end].find("nowhere else").unwrap_or(end);
    item[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") || t.ends_with('/'))
        .map(str::to_owned)
        .collect()
}

/// Files (relative to `src/`, `/`-separated) that `place` covers.
fn covers(place: &str, file: &str) -> bool {
    if place.ends_with('/') {
        file.starts_with(place)
    } else {
        file == place
    }
}

/// Differences between the documented places and the files with
/// `unsafe` code (comments excluded).
fn unsafe_doc_mismatches(places: &[String], files: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    for f in files {
        if !places.iter().any(|p| covers(p, f)) {
            bad.push(format!(
                "{f} has `unsafe` but docs/interposer.md does not list it"
            ));
        }
    }
    for p in places {
        if !files.iter().any(|f| covers(p, f)) {
            bad.push(format!(
                "docs/interposer.md lists `{p}`, which has no `unsafe`"
            ));
        }
    }
    bad
}

fn has_unsafe(src: &str) -> bool {
    src.lines().any(|l| {
        let code = l.find("//").map_or(l, |i| &l[..i]);
        code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == "unsafe")
    })
}

#[test]
fn the_unsafe_list_in_the_docs_is_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("../../docs/interposer.md")).unwrap();
    let places = documented_unsafe_places(&doc);
    let src = root.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut with_unsafe: Vec<String> = files
        .iter()
        .filter(|f| has_unsafe(&std::fs::read_to_string(f).unwrap()))
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap();
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    with_unsafe.sort();
    assert!(with_unsafe.len() >= 10, "{with_unsafe:?}");
    let bad = unsafe_doc_mismatches(&places, &with_unsafe);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_unsafe_list_check_catches_both_directions() {
    let doc = "x\n- `unsafe` lives in `sys.rs`, `ffi/` and `gone.rs`\n  and nowhere else (`t.rs`).\n- next `b.rs`";
    let places = documented_unsafe_places(doc);
    assert_eq!(places, ["sys.rs", "ffi/", "gone.rs"]);
    let files = [
        "ffi/cuda.rs".to_owned(),
        "sys.rs".to_owned(),
        "limiter/mod.rs".to_owned(),
    ];
    let bad = unsafe_doc_mismatches(&places, &files);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("limiter/mod.rs"));
    assert!(bad[1].contains("gone.rs"));
    assert!(has_unsafe("let x = unsafe { f() };"));
    assert!(!has_unsafe(
        "// SAFETY: unsafe in a comment\nfn unsafe_ish() {}"
    ));
}

/// The crate names of `docs/architecture.md`'s crate table.
fn documented_crates(doc: &str) -> BTreeSet<String> {
    let start = doc.find("## Crates").expect("a ## Crates section");
    let section = &doc[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_crate_table_lists_every_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let documented = documented_crates(&doc);
    let mut actual = BTreeSet::new();
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        let manifest = e.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = \""))
            .and_then(|n| n.split('"').next())
            .unwrap_or_else(|| panic!("{} has no name", manifest.display()));
        actual.insert(name.to_owned());
    }
    assert!(actual.len() >= 15, "{actual:?}");
    let missing: Vec<_> = actual.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's crate table: missing {missing:?}, no such crate {stale:?}"
    );
    // The parser itself: a table row is read, prose is not.
    let t = documented_crates("## Crates\n| `a` | rlib |\ntext `b`\n## Next\n| `c` |");
    assert_eq!(t.into_iter().collect::<Vec<_>>(), ["a"]);
}
