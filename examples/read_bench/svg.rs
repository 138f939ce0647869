//! A small SVG chart: p50 latency against one-way delay per mode, log scale, 1 outstanding read.
//! Written by hand: plotting crates need system fonts or an embedded font file for text.

use std::fmt::Write as _;

use crate::measure::{Cell, Mode};

const W: f64 = 760.0;
const H: f64 = 440.0;
const L: f64 = 80.0;
const R: f64 = 200.0;
const T: f64 = 30.0;
const B: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#444444", "#1b9e77", "#66a61e", "#7570b3", "#d95f02", "#e7298a",
];

pub fn chart(cells: &[Cell]) -> String {
    let delays: Vec<u64> = {
        let mut d: Vec<u64> = cells.iter().map(|c| c.one_way_delay_us).collect();
        d.sort_unstable();
        d.dedup();
        d
    };
    let lat: Vec<f64> = cells
        .iter()
        .filter(|c| c.outstanding == 1 && c.p50_ns > 0)
        .map(|c| c.p50_ns as f64)
        .collect();
    let (lo, hi) = lat
        .iter()
        .fold((f64::MAX, 1.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let (lo, hi) = (
        (lo.max(1.0)).log10().floor(),
        hi.log10().ceil().max(lo.log10() + 1.0),
    );
    let x = |i: usize| L + (W - L - R) * i as f64 / (delays.len().max(2) - 1) as f64;
    let y = |ns: f64| T + (H - T - B) * (1.0 - (ns.max(1.0).log10() - lo) / (hi - lo));
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    let _ = writeln!(s, "<rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"{L}\" y=\"18\">p50 read latency vs one-way delay (1 outstanding read, log scale)</text>");
    for e in lo as i32..=hi as i32 {
        let yy = y(10f64.powi(e));
        let _ = writeln!(s, "<line x1=\"{L}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{e} ns</text>", W - R, L - 6.0, yy + 4.0);
    }
    for (i, d) in delays.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{d} µs</text>",
            x(i),
            H - B + 18.0
        );
    }
    for (m, mode) in Mode::ALL.iter().enumerate() {
        let pts: Vec<String> = delays
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                cells
                    .iter()
                    .find(|c| {
                        c.mode == *mode
                            && c.outstanding == 1
                            && c.one_way_delay_us == *d
                            && c.p50_ns > 0
                    })
                    .map(|c| format!("{:.1},{:.1}", x(i), y(c.p50_ns as f64)))
            })
            .collect();
        let color = COLORS[m % COLORS.len()];
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        let ly = T + 18.0 * m as f64;
        let _ = writeln!(s, "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text>", W - R + 10.0, W - R + 30.0, W - R + 36.0, ly + 4.0, mode.name());
    }
    s.push_str("</svg>\n");
    s
}
