//! `kv bench --vs-etcd`'s cells, their table, the side-by-side ratios and the targets they are
//! held to.

use serde_json::{json, Value};

/// One measured cell: one system, one operation, one number of clients.
#[derive(Debug, Clone)]
pub struct Cell {
    /// `raft-lease` or `etcd`.
    pub system: &'static str,
    /// The operation's name (`ops::Op::name`).
    pub op: &'static str,
    /// Concurrent clients, each with its own connection and one request in flight.
    pub clients: usize,
    /// Operations that succeeded, per second.
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// CPU of the system's three processes per operation, µs (`None`: `/proc` unreadable).
    pub cpu_us_per_op: Option<f64>,
    /// Operations that failed.
    pub errors: u64,
}

impl Cell {
    /// The cell in the committed JSON's form.
    pub fn to_json(&self) -> Value {
        json!({
            "system": self.system,
            "op": self.op,
            "clients": self.clients,
            "ops_per_s": self.ops_per_s.round(),
            "p50_us": (self.p50_us * 10.0).round() / 10.0,
            "p99_us": (self.p99_us * 10.0).round() / 10.0,
            "cpu_us_per_op": self.cpu_us_per_op.map(|c| (c * 10.0).round() / 10.0),
            "errors": self.errors,
        })
    }

    /// One line of the table.
    pub fn row(&self) -> String {
        let cpu = self.cpu_us_per_op.map(|c| format!("{c:.1}"));
        format!(
            "{:<10} {:<19} {:>7} {:>10.0} {:>9.1} {:>9.1} {:>9} {:>6}",
            self.system,
            self.op,
            self.clients,
            self.ops_per_s,
            self.p50_us,
            self.p99_us,
            cpu.unwrap_or_default(),
            self.errors
        )
    }
}

/// The table's header.
pub fn header() -> String {
    format!(
        "{:<10} {:<19} {:>7} {:>10} {:>9} {:>9} {:>9} {:>6}",
        "system", "op", "clients", "ops/s", "p50 µs", "p99 µs", "CPU µs/op", "errors"
    )
}

/// The store's cell and etcd's for `op` at `clients`, if both ran.
fn pair<'a>(cells: &'a [Cell], op: &str, clients: usize) -> Option<(&'a Cell, &'a Cell)> {
    let find = |system: &str| {
        cells
            .iter()
            .find(|c| c.system == system && c.op == op && c.clients == clients)
    };
    Some((find("raft-lease")?, find("etcd")?))
}

/// The store over etcd, cell by cell: throughput, median and CPU ratios.
pub fn ratios(cells: &[Cell]) -> Vec<String> {
    let mut out = vec![format!(
        "{:<19} {:>7} {:>12} {:>12} {:>12}",
        "op", "clients", "ops/s ×", "p50 ×", "CPU/op ×"
    )];
    for c in cells.iter().filter(|c| c.system == "raft-lease") {
        let Some((s, e)) = pair(cells, c.op, c.clients) else {
            continue;
        };
        let cpu = s
            .cpu_us_per_op
            .zip(e.cpu_us_per_op)
            .map(|(s, e)| format!("{:.2}", s / e.max(f64::MIN_POSITIVE)));
        out.push(format!(
            "{:<19} {:>7} {:>12.2} {:>12.2} {:>12}",
            c.op,
            c.clients,
            s.ops_per_s / e.ops_per_s.max(f64::MIN_POSITIVE),
            s.p50_us / e.p50_us.max(f64::MIN_POSITIVE),
            cpu.unwrap_or_default()
        ));
    }
    out
}

/// One target and how the run did against it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// What is asked, in words.
    pub what: String,
    /// The measured ratio.
    pub measured: f64,
    /// The bound on the ratio.
    pub bound: f64,
    /// Whether `measured` must be at most (`true`) or at least (`false`) `bound`.
    pub at_most: bool,
}

impl Target {
    /// Whether the run met it.
    pub fn met(&self) -> bool {
        match self.at_most {
            true => self.measured <= self.bound,
            false => self.measured >= self.bound,
        }
    }

    /// The target in the JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "target": self.what,
            "measured": (self.measured * 1000.0).round() / 1000.0,
            "bound": self.bound,
            "met": self.met(),
        })
    }
}

/// The targets the store is held to against etcd and the disk (`fdatasync_p50_us`), for the
/// cells that ran.
pub fn targets(cells: &[Cell], fdatasync_p50_us: f64) -> Vec<Target> {
    let mut t = Vec::new();
    let mut ratio = |what: String, op: &str, n: usize, p50: bool, bound: f64, at_most: bool| {
        if let Some((s, e)) = pair(cells, op, n) {
            let measured = match p50 {
                true => s.p50_us / e.p50_us.max(f64::MIN_POSITIVE),
                false => s.ops_per_s / e.ops_per_s.max(f64::MIN_POSITIVE),
            };
            t.push(Target {
                what,
                measured,
                bound,
                at_most,
            });
        }
    };
    ratio(
        "put p50 ÷ etcd's, 1 client".into(),
        "put",
        1,
        true,
        0.5,
        true,
    );
    for n in [16, 64] {
        ratio(
            format!("put ops/s ÷ etcd's, {n} clients"),
            "put",
            n,
            false,
            2.0,
            false,
        );
    }
    let lin = "range_linearizable";
    ratio(
        "linearizable range p50 ÷ etcd's, 1 client".into(),
        lin,
        1,
        true,
        0.25,
        true,
    );
    ratio(
        "linearizable range ops/s ÷ etcd's, 64 clients".into(),
        lin,
        64,
        false,
        3.0,
        false,
    );
    let mut counts: Vec<usize> = cells.iter().map(|c| c.clients).collect();
    counts.sort_unstable();
    counts.dedup();
    for &n in &counts {
        let what = format!("serializable range ops/s ÷ etcd's, {n} clients");
        ratio(what, "range_serializable", n, false, 1.0, false);
    }
    let put1 = cells
        .iter()
        .find(|c| c.system == "raft-lease" && c.op == "put" && c.clients == 1);
    if let Some(put1) = put1.filter(|_| fdatasync_p50_us > 0.0) {
        t.push(Target {
            what: "put p50 ÷ one fdatasync's p50, 1 client".into(),
            measured: put1.p50_us / fdatasync_p50_us,
            bound: 3.5,
            at_most: true,
        });
    }
    t.extend(behind(cells));
    t
}

/// "No cell of the store behind etcd's": the worst throughput ratio and the worst median ratio
/// over every cell.
fn behind(cells: &[Cell]) -> Vec<Target> {
    let pairs: Vec<_> = cells
        .iter()
        .filter(|c| c.system == "raft-lease")
        .filter_map(|c| pair(cells, c.op, c.clients))
        .collect();
    if pairs.is_empty() {
        return Vec::new();
    }
    let worst_ops = pairs
        .iter()
        .map(|(s, e)| s.ops_per_s / e.ops_per_s.max(f64::MIN_POSITIVE))
        .fold(f64::INFINITY, f64::min);
    let worst_p50 = pairs
        .iter()
        .map(|(s, e)| s.p50_us / e.p50_us.max(f64::MIN_POSITIVE))
        .fold(0.0, f64::max);
    vec![
        Target {
            what: "every cell: ops/s ÷ etcd's, the lowest".into(),
            measured: worst_ops,
            bound: 1.0,
            at_most: false,
        },
        Target {
            what: "every cell: p50 ÷ etcd's, the highest".into(),
            measured: worst_p50,
            bound: 1.0,
            at_most: true,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(system: &'static str, op: &'static str, clients: usize, ops: f64, p50: f64) -> Cell {
        Cell {
            system,
            op,
            clients,
            ops_per_s: ops,
            p50_us: p50,
            p99_us: p50 * 2.0,
            mean_us: p50,
            cpu_us_per_op: Some(10.0),
            errors: 0,
        }
    }

    #[test]
    fn a_store_twice_as_fast_meets_the_put_targets_and_a_slower_one_does_not() {
        let fast = [
            cell("raft-lease", "put", 1, 2000.0, 200.0),
            cell("etcd", "put", 1, 1000.0, 500.0),
        ];
        let t = targets(&fast, 100.0);
        let put = t
            .iter()
            .find(|t| t.what.starts_with("put p50 ÷ etcd"))
            .unwrap();
        assert!(put.met(), "{put:?}");
        assert!(t.iter().all(Target::met), "{t:?}");
        let slow = [
            cell("raft-lease", "put", 1, 900.0, 300.0),
            cell("etcd", "put", 1, 1000.0, 500.0),
        ];
        let t = targets(&slow, 100.0);
        let put = t
            .iter()
            .find(|t| t.what.starts_with("put p50 ÷ etcd"))
            .unwrap();
        assert!(!put.met(), "0.6 is over 0.5: {put:?}");
        let floor = t.iter().find(|t| t.what.contains("fdatasync")).unwrap();
        assert!(floor.met(), "300 ≤ 3.5 × 100: {floor:?}");
        let worst = t.iter().find(|t| t.what.contains("lowest")).unwrap();
        assert!(
            !worst.met(),
            "the store's 900 ops/s is behind 1000: {worst:?}"
        );
    }

    #[test]
    fn a_cell_etcd_did_not_run_gives_no_target() {
        let only = [cell("raft-lease", "put", 16, 5000.0, 100.0)];
        let t = targets(&only, 0.0);
        assert!(t.is_empty(), "{t:?}");
        assert_eq!(ratios(&only).len(), 1, "the header alone");
    }
}
