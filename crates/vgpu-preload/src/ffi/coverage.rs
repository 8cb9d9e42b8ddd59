//! The generated coverage table (`docs/hooks.md`, `vgpu hooks`).
use super as hooks;
use crate::driver::Lib;

/// One line per hook, tab-separated (see `vgpu_hook_table`).
pub fn tsv() -> String {
    let mut s = String::new();
    for h in hooks::all() {
        let lib = match h.lib() {
            Lib::Cuda => "cuda",
            Lib::Nvml => "nvml",
        };
        s.push_str(&format!(
            "{}\t{}\t{}\t{}\t{lib}\t{}\t{}\n",
            h.name, h.base, h.since, h.ptds as u8, h.family, h.policy
        ));
    }
    s
}

/// The line after which `docs/hooks.md` is written by hand (the audit of
/// allocating entry points): the test compares only what comes before it,
/// and a bless keeps what follows.
pub const HAND_WRITTEN: &str = "<!-- Written by hand below this line (VGPU_BLESS keeps it). -->\n";

/// The generated part of `docs/hooks.md`, from the hook declarations.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Hook coverage of libvgpu.so\n\n\
         Generated from the hook declarations in `crates/vgpu-preload/src/ffi/` \
         (`cargo test -p vgpu-preload` fails when this file is stale; \
         regenerate with `VGPU_BLESS=1 cargo test -p vgpu-preload coverage`). \
         `vgpu hooks` prints the same table from a built `libvgpu.so`.\n\n\
         Every hook is reachable three ways: a direct call (the export), a \
         `dlsym` pointer, and a `cuGetProcAddress`/`_v2` pointer. The `cudaVersion` \
         column is the lowest version whose request selects that ABI; the \
         driver picks the ABI and fills `symbolStatus`, and libvgpu.so \
         substitutes its hook only when the driver returned the very function \
         the hook wraps. Any other name, or a version selecting an ABI not \
         listed here, resolves to the driver untouched (graph construction \
         included: graph memory is charged where it is backed, at upload and \
         launch). Which allocating entry points are charged, and why the \
         others are not: [below](#allocating-entry-points).\n\n\
         | export | request name | cudaVersion | per-thread stream | library | family | policy |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for h in hooks::all() {
        let (lib, since) = match h.lib() {
            Lib::Cuda => ("libcuda.so.1", h.since.to_string()),
            Lib::Nvml => ("libnvidia-ml.so.1", "-".to_string()),
        };
        let ptds = if h.ptds { "yes" } else { "" };
        s.push_str(&format!(
            "| `{}` | `{}` | {since} | {ptds} | {lib} | {} | {} |\n",
            h.name, h.base, h.family, h.policy
        ));
    }
    s.push_str(&format!("\n{} hooks.\n", hooks::all().count()));
    s
}

#[cfg(test)]
mod tests {
    /// `docs/hooks.md`: (the generated part, the hand-written rest with
    /// its marker line, if any).
    fn split(text: &str) -> (&str, &str) {
        match text.find(super::HAND_WRITTEN) {
            Some(i) => text.split_at(i),
            None => (text, ""),
        }
    }

    #[test]
    fn coverage_doc_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/hooks.md");
        let want = super::markdown();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if std::env::var_os("VGPU_BLESS").is_some() {
            let (_, tail) = split(&text);
            let blank = if tail.is_empty() { "" } else { "\n" };
            std::fs::write(&path, format!("{want}{blank}{tail}")).expect("write docs/hooks.md");
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let (have, tail) = split(&text);
        assert!(
            have == want || (!tail.is_empty() && have.strip_suffix('\n') == Some(want.as_str())),
            "docs/hooks.md is stale; run VGPU_BLESS=1 cargo test -p vgpu-preload coverage"
        );
    }

    #[test]
    fn the_hand_written_part_survives_a_bless() {
        let doc = format!(
            "{}\n{}## Allocating entry points\n",
            super::markdown(),
            super::HAND_WRITTEN
        );
        let (have, tail) = split(&doc);
        assert_eq!(have.strip_suffix('\n'), Some(super::markdown().as_str()));
        assert!(tail.starts_with(super::HAND_WRITTEN) && tail.ends_with("points\n"));
    }

    #[test]
    fn tsv_has_a_line_per_hook() {
        let t = super::tsv();
        assert_eq!(t.lines().count(), crate::ffi::all().count());
        assert!(t.lines().all(|l| l.split('\t').count() == 7));
    }
}
