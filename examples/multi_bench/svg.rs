//! The chart: idle messages/s and idle CPU ms/s per node against the number of groups, one
//! panel each, both axes log scale, a line per liveness mode. Hand-written SVG (plotting crates
//! need system fonts for text).

use std::fmt::Write as _;

use raft_lease::multi::LivenessMode;

use crate::report::{mode_name, Cell};

const PANEL_W: f64 = 420.0;
const H: f64 = 360.0;
const PAD_L: f64 = 70.0;
const PAD_R: f64 = 30.0;
const PAD_T: f64 = 50.0;
const PAD_B: f64 = 50.0;
const MODES: [(LivenessMode, &str); 2] = [
    (LivenessMode::PerGroup, "#d95f02"),
    (LivenessMode::Shared, "#1b9e77"),
];

/// Log-scale axis over the decades that hold `values`.
struct LogAxis {
    lo: i32,
    hi: i32,
}

impl LogAxis {
    fn over(values: impl Iterator<Item = f64>) -> LogAxis {
        let (mut lo, mut hi) = (f64::MAX, f64::MIN);
        for v in values.filter(|v| *v > 0.0) {
            lo = lo.min(v.log10());
            hi = hi.max(v.log10());
        }
        if lo > hi {
            (lo, hi) = (0.0, 1.0);
        }
        let (lo, hi) = (lo.floor() as i32, hi.ceil() as i32);
        LogAxis {
            lo,
            hi: hi.max(lo + 1),
        }
    }

    /// Where `v` falls, 0 at the bottom decade and 1 at the top.
    fn frac(&self, v: f64) -> f64 {
        (v.max(1e-9).log10() - self.lo as f64) / (self.hi - self.lo) as f64
    }
}

/// Both panels, side by side.
pub fn chart(cells: &[Cell]) -> String {
    let w = 2.0 * PANEL_W;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{H}\" fill=\"white\"/>\n"
    );
    panel(&mut s, cells, 0.0, "idle messages/s per node", |c| {
        c.idle.msgs_per_s
    });
    panel(&mut s, cells, PANEL_W, "idle CPU ms/s per node", |c| {
        c.idle.cpu_ms_per_s
    });
    for (i, (mode, color)) in MODES.iter().enumerate() {
        let x = PAD_L + 160.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{x}\" x2=\"{}\" y1=\"16\" y2=\"16\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"20\">{}</text>",
            x + 20.0, x + 26.0, mode_name(*mode)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, cells: &[Cell], x0: f64, title: &str, value: fn(&Cell) -> f64) {
    let xs = LogAxis::over(cells.iter().map(|c| c.groups as f64));
    let ys = LogAxis::over(cells.iter().map(value));
    let (left, right) = (x0 + PAD_L, x0 + PANEL_W - PAD_R);
    let (top, bottom) = (PAD_T, H - PAD_B);
    let px = |g: f64| left + (right - left) * xs.frac(g);
    let py = |v: f64| bottom - (bottom - top) * ys.frac(v);
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"{}\">{title} (log-log)</text>",
        top - 10.0
    );
    for e in ys.lo..=ys.hi {
        let y = py(10f64.powi(e));
        let _ = writeln!(s, "<line x1=\"{left}\" x2=\"{right}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">1e{e}</text>", left - 6.0, y + 4.0);
    }
    for e in xs.lo..=xs.hi {
        let x = px(10f64.powi(e));
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            bottom + 18.0,
            10u64.pow(e as u32)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">groups</text>",
        (left + right) / 2.0,
        bottom + 36.0
    );
    for (mode, color) in MODES {
        let pts: Vec<(f64, f64)> = cells
            .iter()
            .filter(|c| c.mode == mode)
            .map(|c| (px(c.groups as f64), py(value(c))))
            .collect();
        for (x, y) in &pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{color}\"/>"
            );
        }
        let pts: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
    }
}
