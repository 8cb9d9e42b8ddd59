//! Hand-written SVG: latency CDF per mode (largest N), p99 against N per
//! mode, and stacked phase bars of the p50/p95/p99/max worker per mode.
use std::fmt::Write as _;

use crate::report::SweepReport;

const MODE_COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];
const SEG_COLORS: [(&str, &str); 13] = [
    ("dispatch", "#c7c7c7"),
    ("map region", "#17becf"),
    ("claim slot", "#9edae5"),
    ("pre-init", "#bcbd22"),
    ("driver cuInit", "#1f77b4"),
    ("to identity", "#ffbb78"),
    ("identity", "#ff7f0e"),
    ("post-init", "#d62728"),
    ("wrapper exit", "#e377c2"),
    ("return", "#7f7f7f"),
    ("then", "#2ca02c"),
    ("cuInit (unattributed)", "#aec7e8"),
    ("load", "#dddddd"),
];

fn seg_color(name: &str) -> &'static str {
    SEG_COLORS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
        .unwrap_or("#444444")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Log10 axis over [lo, hi] (ms), mapped to [a, b] pixels.
struct LogAxis {
    lo: f64,
    hi: f64,
    a: f64,
    b: f64,
}

impl LogAxis {
    fn new(min: f64, max: f64, a: f64, b: f64) -> LogAxis {
        let lo = 10f64.powf(min.max(1e-3).log10().floor());
        let mut hi = 10f64.powf(max.max(lo * 10.0).log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        LogAxis { lo, hi, a, b }
    }
    fn map(&self, v: f64) -> f64 {
        let t = (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10());
        self.a + t * (self.b - self.a)
    }
    fn decades(&self) -> Vec<f64> {
        let mut v = Vec::new();
        let mut x = self.lo;
        while x <= self.hi * 1.0001 {
            v.push(x);
            x *= 10.0;
        }
        v
    }
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}s", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}ms")
    } else {
        format!("{v}ms")
    }
}

/// The whole figure.
pub fn svg(rep: &SweepReport) -> String {
    let modes = rep.modes();
    let w = 1260.0;
    let bars_h = 40.0 + modes.len() as f64 * 110.0;
    let h = 380.0 + bars_h + 40.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="20" y="22" font-size="15" font-weight="bold">vgpu bench init — {}</text>"#,
        esc(&rep.header.driver)
    );
    let _ = writeln!(
        o,
        r##"<text x="20" y="40" fill="#555">{} · rev {} · {} CPUs</text>"##,
        esc(&rep.header.command.chars().take(150).collect::<String>()),
        esc(&rep.header.revision),
        rep.header.cpus
    );

    // All successful latencies, for the shared x range.
    let all: Vec<f64> = rep
        .runs
        .iter()
        .flat_map(|r| {
            r.result
                .workers
                .iter()
                .filter(|w| w.ok)
                .filter_map(|w| w.latency_ms)
        })
        .collect();
    let (mn, mx) = all
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));

    // Panel 1: CDF at the largest N of each mode.
    let (px, py, pw, ph) = (70.0, 70.0, 520.0, 260.0);
    let _ = writeln!(
        o,
        r#"<text x="{px}" y="{}" font-weight="bold">latency CDF at the largest N per mode (log x)</text>"#,
        py - 8.0
    );
    axes(&mut o, px, py, pw, ph);
    if !all.is_empty() {
        let ax = LogAxis::new(mn, mx, px, px + pw);
        for d in ax.decades() {
            let x = ax.map(d);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{py}" x2="{x:.1}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                py + ph,
                py + ph + 15.0,
                fmt_ms(d)
            );
        }
        for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let y = py + ph - q * ph;
            let _ = writeln!(
                o,
                r##"<line x1="{px}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{q}</text>"##,
                px + pw,
                px - 5.0,
                y + 4.0
            );
        }
        for (mi, mode) in modes.iter().enumerate() {
            let Some(run) = rep.representative(mode) else {
                continue;
            };
            let mut lat: Vec<f64> = run
                .result
                .workers
                .iter()
                .filter(|w| w.ok)
                .filter_map(|w| w.latency_ms)
                .collect();
            lat.sort_by(f64::total_cmp);
            if lat.is_empty() {
                continue;
            }
            let n = lat.len() as f64;
            let mut pts = format!("{:.1},{:.1}", ax.map(lat[0]), py + ph);
            for (i, v) in lat.iter().enumerate() {
                let x = ax.map(*v);
                let _ = write!(
                    pts,
                    " {x:.1},{:.1} {x:.1},{:.1}",
                    py + ph - (i as f64 / n) * ph,
                    py + ph - ((i + 1) as f64 / n) * ph
                );
            }
            let c = MODE_COLORS[mi % MODE_COLORS.len()];
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>"#
            );
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" fill="{c}">{} (N={}, ok {}, failed {})</text>"#,
                px + 10.0,
                py + 15.0 + mi as f64 * 15.0,
                esc(mode),
                run.result.summary.workers,
                run.result.summary.ok,
                run.result.summary.failed
            );
        }
    }

    // Panel 2: p99 against N.
    let (qx, qy, qw, qh) = (700.0, 70.0, 520.0, 260.0);
    let _ = writeln!(
        o,
        r#"<text x="{qx}" y="{}" font-weight="bold">p99 against workers N (log y; line: median of repeats; dashed: least-squares fit)</text>"#,
        qy - 8.0
    );
    axes(&mut o, qx, qy, qw, qh);
    let p99s: Vec<(String, f64, f64)> = rep
        .runs
        .iter()
        .filter_map(|r| {
            r.result.summary.p99_ms.map(|p| {
                (
                    r.result.summary.mode.clone(),
                    r.result.summary.workers as f64,
                    p,
                )
            })
        })
        .collect();
    if !p99s.is_empty() {
        let nmax = p99s.iter().map(|p| p.1).fold(1.0, f64::max);
        let (lo, hi) = p99s
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.2), b.max(p.2)));
        let ay = LogAxis::new(lo, hi, qy + qh, qy);
        let xm = |n: f64| qx + n / nmax * qw;
        for d in ay.decades() {
            let y = ay.map(d);
            let _ = writeln!(
                o,
                r##"<line x1="{qx}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                qx + qw,
                qx - 5.0,
                y + 4.0,
                fmt_ms(d)
            );
        }
        let mut ns: Vec<f64> = p99s.iter().map(|p| p.1).collect();
        ns.sort_by(f64::total_cmp);
        ns.dedup();
        // Tick labels from the right, skipping ones that would overlap.
        let mut last_x = f64::MAX;
        for n in ns.iter().rev() {
            let x = xm(*n);
            if last_x - x < 24.0 {
                continue;
            }
            last_x = x;
            let _ = writeln!(
                o,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle">{n}</text>"#,
                qy + qh + 15.0
            );
        }
        for (mi, mode) in modes.iter().enumerate() {
            let c = MODE_COLORS[mi % MODE_COLORS.len()];
            let mut pts: Vec<(f64, f64)> = p99s
                .iter()
                .filter(|p| &p.0 == mode)
                .map(|p| (p.1, p.2))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The line joins the median p99 of each N's repeats; every
            // repeat is a dot.
            let mut line: Vec<String> = Vec::new();
            let mut i = 0;
            while i < pts.len() {
                let n = pts[i].0;
                let mut at: Vec<f64> = pts[i..]
                    .iter()
                    .take_while(|p| p.0 == n)
                    .map(|p| p.1)
                    .collect();
                i += at.len();
                at.sort_by(f64::total_cmp);
                if let Some(m) = crate::stats::nearest_rank(&at, 50.0) {
                    line.push(format!("{:.1},{:.1}", xm(n), ay.map(m)));
                }
            }
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                line.join(" ")
            );
            for (n, p) in &pts {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                    xm(*n),
                    ay.map(*p)
                );
            }
            if let Some(fit) = rep.fits.iter().find(|f| &f.mode == mode) {
                let seg: Vec<String> = (0..=40)
                    .map(|i| {
                        let n = nmax * i as f64 / 40.0;
                        (n, fit.intercept_ms + fit.slope_ms_per_process * n)
                    })
                    .filter(|(_, y)| *y > 0.0)
                    .map(|(n, y)| format!("{:.1},{:.1}", xm(n), ay.map(y)))
                    .collect();
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{c}" stroke-dasharray="4 3" points="{}"/>"#,
                    seg.join(" ")
                );
                let _ = writeln!(
                    o,
                    r#"<text x="{}" y="{}" fill="{c}">{}: {:.3} ms/process, R² {:.3}</text>"#,
                    qx + 10.0,
                    qy + 15.0 + mi as f64 * 15.0,
                    esc(mode),
                    fit.slope_ms_per_process,
                    fit.r2
                );
            }
        }
    }

    // Panel 3: stacked phase bars, each mode on its own scale.
    let by = 380.0;
    let _ = writeln!(
        o,
        r#"<text x="20" y="{by}" font-weight="bold">phase composition of the p50 / p95 / p99 / max worker at the largest N (each mode on its own scale)</text>"#
    );
    let bx = 210.0;
    let bw = 850.0;
    for (mi, mode) in modes.iter().enumerate() {
        let Some(run) = rep.representative(mode) else {
            continue;
        };
        let top = by + 20.0 + mi as f64 * 110.0;
        let _ = writeln!(
            o,
            r#"<text x="20" y="{}" font-weight="bold" fill="{}">{} N={}</text>"#,
            top + 14.0,
            MODE_COLORS[mi % MODE_COLORS.len()],
            esc(mode),
            run.result.summary.workers
        );
        let scale = run
            .result
            .compositions
            .iter()
            .map(|c| c.latency_ms)
            .fold(0.0, f64::max);
        for (ci, c) in run.result.compositions.iter().enumerate() {
            let y = top + ci as f64 * 22.0 + 4.0;
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                bx - 6.0,
                y + 13.0,
                c.rank
            );
            let mut x = bx;
            for s in &c.segments {
                let sw = if scale > 0.0 { s.ms / scale * bw } else { 0.0 };
                if sw > 0.0 {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x:.2}" y="{y:.1}" width="{sw:.2}" height="16" fill="{}"><title>{}: {:.3} ms</title></rect>"#,
                        seg_color(&s.name),
                        esc(&s.name),
                        s.ms
                    );
                }
                x += sw;
            }
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{}">{:.3} ms (worker #{})</text>"#,
                x + 6.0,
                y + 13.0,
                c.latency_ms,
                c.index
            );
        }
    }
    // Segment legend.
    let ly = by + bars_h + 10.0;
    let mut lx = 20.0;
    for (name, color) in SEG_COLORS {
        let _ = writeln!(
            o,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            ly - 9.0,
            lx + 13.0,
            ly,
            esc(name)
        );
        lx += 20.0 + name.len() as f64 * 6.5;
    }
    let _ = writeln!(o, "</svg>");
    o
}

fn axes(o: &mut String, x: f64, y: f64, w: f64, h: f64) {
    let _ = writeln!(
        o,
        r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="#999"/>"##
    );
}
