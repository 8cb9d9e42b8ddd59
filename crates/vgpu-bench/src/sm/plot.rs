//! Hand-written SVG of an SM bench report: one strip per row and engine,
//! share of the device (0–100 %) across; each tenant's target as a tick,
//! its per-second shares as dots, their mean as a diamond.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::report::SmReport;

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#7f7f7f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The plot.
pub fn svg(rep: &SmReport) -> String {
    let engines: Vec<String> = {
        let mut seen = BTreeSet::new();
        rep.rows
            .iter()
            .filter(|r| r.overhead.is_none() && seen.insert(r.engine.clone()))
            .map(|r| r.engine.clone())
            .collect()
    };
    let names: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for r in rep.rows.iter().filter(|r| r.overhead.is_none()) {
            if !v.contains(&r.name) {
                v.push(r.name.clone());
            }
        }
        v
    };
    let (left, col_w, gap, strip_h, top) = (130.0, 420.0, 30.0, 26.0, 60.0);
    let width = left + engines.len().max(1) as f64 * (col_w + gap) + 20.0;
    let height = top + names.len() as f64 * strip_h + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14">vgpu bench sm: share of the device per second (dots), mean (diamond), target (tick)</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34" fill="#555">{}</text>"##,
        esc(&format!(
            "{} · preload {} · {} s per row · revision {}",
            rep.header.driver, rep.header.preload, rep.header.seconds, rep.header.revision
        ))
    );
    for (ei, e) in engines.iter().enumerate() {
        let x0 = left + ei as f64 * (col_w + gap);
        let _ = writeln!(
            s,
            r#"<text x="{:.0}" y="{:.0}" font-weight="bold">{}</text>"#,
            x0,
            top - 8.0,
            esc(match e.as_str() {
                "sim" => "vgpu-sim (processes through libvgpu.so)",
                "gpu" => "real GPU (processes through libvgpu.so)",
                _ => "the law alone on vgpu-limiter's model",
            })
        );
        for pct in [0, 25, 50, 75, 100] {
            let x = x0 + col_w * pct as f64 / 100.0;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{top:.0}" x2="{x:.1}" y2="{:.0}" stroke="#eee"/><text x="{x:.1}" y="{:.0}" text-anchor="middle" fill="#555">{pct}%</text>"##,
                top + names.len() as f64 * strip_h,
                top + names.len() as f64 * strip_h + 14.0
            );
        }
        for (ri, name) in names.iter().enumerate() {
            let y = top + ri as f64 * strip_h + strip_h / 2.0;
            if ei == 0 {
                let _ = writeln!(s, r#"<text x="10" y="{:.1}">{}</text>"#, y + 4.0, esc(name));
            }
            let Some(r) = rep.rows.iter().find(|r| &r.name == name && &r.engine == e) else {
                continue;
            };
            let mark = if r.target_met { "✓" } else { "✗" };
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" fill="{}">{mark}</text>"#,
                x0 - 14.0,
                y + 4.0,
                if r.target_met { "#2ca02c" } else { "#d62728" }
            );
            for (ti, t) in r.tenants.iter().enumerate() {
                let c = COLORS[ti % COLORS.len()];
                let dy = (ti as f64 - (r.tenants.len() as f64 - 1.0) / 2.0) * 5.0;
                let mut targets: Vec<f64> = t.targets.iter().flatten().copied().collect();
                targets.dedup();
                for tg in targets {
                    let x = x0 + col_w * tg / 100.0;
                    let _ = writeln!(
                        s,
                        r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{c}" stroke-width="2"/>"#,
                        y + dy - 5.0,
                        y + dy + 5.0
                    );
                }
                for v in &t.per_second {
                    let x = x0 + col_w * v.clamp(0.0, 100.0) / 100.0;
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{x:.1}" cy="{:.1}" r="2" fill="{c}" fill-opacity="0.6"/>"#,
                        y + dy
                    );
                }
                let x = x0 + col_w * t.figures.achieved.clamp(0.0, 100.0) / 100.0;
                let yy = y + dy;
                let _ = writeln!(
                    s,
                    r#"<path d="M{:.1} {yy:.1} l4 -4 l4 4 l-4 4 z" fill="{c}"/>"#,
                    x - 4.0
                );
            }
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="10" y="{:.0}" fill="#555">✓ = every limited tenant within 5 points after settling, settled within 1 s (and a pair's ratio within 10 %)</text>"##,
        height - 14.0
    );
    s.push_str("</svg>\n");
    s
}
