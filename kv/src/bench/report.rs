//! `kv bench`'s cells: what each measured, how they print, their JSON, and the comparison of the
//! log engines and of the write cells against the machine's limits.

use serde_json::json;

use crate::bench::cpu::CpuCost;
use crate::bench::stages::Stages;

/// One measured cell.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The log engine the cluster ran on.
    pub engine: &'static str,
    /// `put`, `get_lease` or `get_index`.
    pub op: &'static str,
    /// Concurrent keep-alive clients.
    pub clients: usize,
    /// Operations answered 200 per second.
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Answers other than 200.
    pub errors: u64,
    /// How long the cell ran, s.
    pub seconds: f64,
    /// CPU per operation and the machine's busy share, if `/proc` could be read.
    pub cpu: Option<CpuCost>,
    /// Where a write's time went (write cells), from the nodes' histograms.
    pub stages: Option<Stages>,
}

/// The machine's CPUs.
pub fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

impl Cell {
    /// The Little's-law floor of the mean latency, µs: with `clients` requests always in
    /// flight, each costing this much CPU (nodes and clients), the machine's cores cannot
    /// answer them faster on average.
    pub fn floor_us(&self) -> Option<f64> {
        let c = self.cpu?;
        Some(self.clients as f64 * (c.nodes_us_per_op + c.bench_us_per_op) / cores())
    }

    /// One line of the table.
    pub fn row(&self, batch: &str) -> String {
        let cpu = self.cpu.map(|c| {
            let (nodes, bench) = (c.nodes_us_per_op, c.bench_us_per_op);
            format!("{nodes:.1}+{bench:.1} ({:.0}%)", c.machine_busy_pct)
        });
        let floor = self.floor_us().map(|f| format!("{f:.0}"));
        format!(
            "{:<12} {:<10} {:>7} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>6} {:>20} {:>24}",
            self.engine,
            self.op,
            self.clients,
            self.ops_per_s,
            self.p50_us,
            self.p99_us,
            self.mean_us,
            floor.unwrap_or_default(),
            self.errors,
            batch,
            cpu.unwrap_or_default()
        )
    }
}

/// The table's header.
pub fn header() -> String {
    format!(
        "{:<12} {:<10} {:>7} {:>10} {:>9} {:>9} {:>9} {:>8} {:>6} {:>20} {:>24}",
        "engine",
        "op",
        "clients",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "mean µs",
        "floor µs",
        "errors",
        "writes/fsync (fsync)",
        "CPU µs/op nodes+bench"
    )
}

/// The cells and the fsync probe as a JSON array, one object per line. Each cell has `op`,
/// `clients`, `ops_per_s`, `p50_us`, `p99_us` first, then `engine`, `mean_us`,
/// `node_cpu_us_per_op`, `client_cpu_us_per_op` and `floor_us`; then a write cell's stages,
/// `{"op": "write_stages", ...}` (see [`Stages::to_json`]); the last object is
/// `{"op": "fdatasync", "p50_us", "p99_us"}`.
pub fn to_json(cells: &[Cell], fdatasync_us: (f64, f64)) -> String {
    let num = |v: f64| json!((v * 10.0).round() / 10.0);
    let opt = |v: Option<f64>| v.map_or(json!(null), num);
    let mut lines: Vec<String> = cells
        .iter()
        .map(|c| {
            format!(
                "{{\"op\": {}, \"clients\": {}, \"ops_per_s\": {}, \"p50_us\": {}, \"p99_us\": {}, \
                 \"engine\": {}, \"mean_us\": {}, \"node_cpu_us_per_op\": {}, \
                 \"client_cpu_us_per_op\": {}, \"floor_us\": {}}}",
                json!(c.op),
                c.clients,
                json!(c.ops_per_s.round()),
                num(c.p50_us),
                num(c.p99_us),
                json!(c.engine),
                num(c.mean_us),
                opt(c.cpu.map(|x| x.nodes_us_per_op)),
                opt(c.cpu.map(|x| x.bench_us_per_op)),
                opt(c.floor_us()),
            )
        })
        .collect();
    let stages = cells.iter().filter_map(|c| {
        let s = c.stages?.to_json(c.engine, c.clients);
        Some(round_numbers(s).to_string())
    });
    lines.extend(stages);
    lines.push(format!(
        "{{\"op\": \"fdatasync\", \"p50_us\": {}, \"p99_us\": {}}}",
        num(fdatasync_us.0),
        num(fdatasync_us.1)
    ));
    format!("[\n{}\n]\n", lines.join(",\n"))
}

/// `v` with every float rounded to a tenth.
fn round_numbers(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => m
            .into_iter()
            .map(|(k, v)| match v.as_f64() {
                Some(f) if v.is_f64() => (k, json!((f * 10.0).round() / 10.0)),
                _ => (k, v),
            })
            .collect(),
        other => other,
    }
}

/// The write cells against the 1-client one, against the machine's limits, and the engines
/// against each other, as printed lines.
pub fn summary(cells: &[Cell], fdatasync_us: (f64, f64)) -> Vec<String> {
    let put = |engine: &str, clients: usize| {
        let found = cells.iter().find(|c| c.op == "put" && c.engine == engine);
        found.and_then(|_| {
            cells
                .iter()
                .find(|c| c.op == "put" && c.engine == engine && c.clients == clients)
        })
    };
    let engines: Vec<&str> = {
        let mut e: Vec<&str> = cells.iter().map(|c| c.engine).collect();
        e.dedup();
        e
    };
    let mut out = Vec::new();
    for &e in &engines {
        if let Some(one) = put(e, 1) {
            out.push(format!(
                "{e}: 1-client write p50 {:.0} µs = {:.2}x one fdatasync ({:.0} µs)",
                one.p50_us,
                one.p50_us / fdatasync_us.0,
                fdatasync_us.0
            ));
        }
        let many = cells.iter().filter(|c| c.op == "put" && c.engine == e);
        for c in many.filter(|c| c.clients > 1) {
            let floor = c.floor_us().map_or(String::new(), |f| {
                format!(
                    ", mean {:.0} µs = {:.2}x the floor {f:.0} µs",
                    c.mean_us,
                    c.mean_us / f
                )
            });
            out.push(format!("{e}: writes at {} clients{floor}", c.clients));
        }
    }
    if let [a, b] = engines[..] {
        out.extend(compare(a, b, &put));
    }
    out
}

/// `a` against `b` on writes: node CPU per write and throughput at the most clients, 1-client
/// p50.
fn compare<'a>(a: &str, b: &str, put: &dyn Fn(&str, usize) -> Option<&'a Cell>) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(x), Some(y)) = (put(a, 1), put(b, 1)) {
        out.push(format!(
            "{a}/{b}: 1-client write p50 {:.2}x",
            x.p50_us / y.p50_us
        ));
    }
    for clients in [16, 64] {
        let (Some(x), Some(y)) = (put(a, clients), put(b, clients)) else {
            continue;
        };
        let cpu = match (x.cpu, y.cpu) {
            (Some(cx), Some(cy)) => format!(
                "node CPU per write {:.2}x, ",
                cx.nodes_us_per_op / cy.nodes_us_per_op
            ),
            _ => String::new(),
        };
        out.push(format!(
            "{a}/{b} at {clients} clients: {cpu}throughput {:.2}x",
            x.ops_per_s / y.ops_per_s
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(engine: &'static str, op: &'static str, clients: usize) -> Cell {
        Cell {
            engine,
            op,
            clients,
            ops_per_s: 1234.4,
            p50_us: 812.345,
            p99_us: 2000.0,
            mean_us: 900.0,
            errors: 0,
            seconds: 3.0,
            cpu: Some(CpuCost {
                nodes_us_per_op: 60.0,
                bench_us_per_op: 20.0,
                machine_busy_pct: 50.0,
            }),
            stages: None,
        }
    }

    #[test]
    fn cells_are_written_one_per_line_with_the_old_keys_first() {
        let text = to_json(
            &[cell("raft-engine", "put", 1), cell("redb", "get_lease", 64)],
            (250.0, 330.0),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            lines[1].starts_with(
                r#"{"op": "put", "clients": 1, "ops_per_s": 1234.0, "p50_us": 812.3, "p99_us": 2000.0, "engine": "raft-engine""#
            ),
            "{}",
            lines[1]
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[1]["clients"], 64);
        assert_eq!(v[1]["node_cpu_us_per_op"], 60.0);
        assert_eq!(v[1]["client_cpu_us_per_op"], 20.0);
        let floor = 64.0 * 80.0 / cores();
        assert_eq!(v[1]["floor_us"], (floor * 10.0).round() / 10.0);
        assert_eq!(v[2]["op"], "fdatasync");
        assert_eq!(
            (v[2]["p50_us"].clone(), v[2]["p99_us"].clone()),
            (250.0.into(), 330.0.into())
        );
    }

    #[test]
    fn the_summary_compares_the_engines_cell_by_cell() {
        let mut fast = cell("raft-engine", "put", 64);
        fast.ops_per_s *= 2.0;
        let cells = [
            cell("raft-engine", "put", 1),
            fast,
            cell("redb", "put", 1),
            cell("redb", "put", 64),
        ];
        let lines = summary(&cells, (250.0, 330.0));
        assert!(
            lines.iter().any(|l| l
                == "raft-engine/redb at 64 clients: node CPU per write 1.00x, throughput 2.00x"),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("redb: 1-client write p50 812 µs = 3.25x")),
            "{lines:#?}"
        );
    }
}
