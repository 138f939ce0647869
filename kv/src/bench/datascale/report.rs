//! `kv bench --data-scale`'s report: each system's run as a table, every metric as a named
//! number, the medians over the runs with the store ÷ etcd ratio, the targets and the JSON.

use serde_json::{json, Map, Value};

use crate::bench::datascale::phases::{is_restart, Phase};
use crate::bench::datascale::stats::median;

/// The store's name in the report.
pub const STORE: &str = "raft-lease";

/// etcd's name in the report.
pub const ETCD: &str = "etcd";

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// One system's measurements in one run.
#[derive(Debug, Clone)]
pub struct SystemRun {
    /// [`STORE`] or [`ETCD`].
    pub system: &'static str,
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Each member's peak resident memory over all phases, bytes (the largest of its
    /// processes').
    pub rss_peak_bytes: Vec<u64>,
    /// Each member's data dir at the end, bytes on disk.
    pub data_dir_bytes: Vec<u64>,
}

/// One run: each system's measurements.
#[derive(Debug, Clone)]
pub struct Run {
    /// 1, 2, ...
    pub index: usize,
    /// The store's, then etcd's (if it ran).
    pub systems: Vec<SystemRun>,
}

impl SystemRun {
    /// Elections outside the restart phases.
    pub fn elections_outside_restarts(&self) -> u64 {
        self.phases
            .iter()
            .filter(|p| !is_restart(p.name))
            .map(Phase::elections)
            .sum()
    }

    /// Every metric, named `<phase>.<what>` or `<what>`, units in the names, in a fixed order.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let mut m: Vec<(String, f64)> = Vec::new();
        for p in &self.phases {
            let n = p.name;
            m.push((format!("{n}.duration_ms"), p.duration_ms));
            let probe = [
                ("probe_p99_ms", p.probe.p99_ms),
                ("probe_max_ms", p.probe.max_ms),
            ];
            for (what, v) in probe {
                if let Some(v) = v {
                    m.push((format!("{n}.{what}"), v));
                }
            }
            m.push((format!("{n}.failed_requests"), p.failed_requests() as f64));
            if !is_restart(n) {
                m.push((format!("{n}.elections"), p.elections() as f64));
            }
            let extras = [
                ("keys_per_s", p.keys_per_s),
                ("time_to_serve_ms", p.time_to_serve_ms),
                ("time_to_every_key_ms", p.time_to_every_key_ms),
            ];
            for (what, v) in extras {
                if let Some(v) = v {
                    m.push((format!("{n}.{what}"), v));
                }
            }
            for r in &p.ranges {
                if let Some(took) = r.ms {
                    m.push((format!("{n}.{}.{}_ms", r.member, r.kind), took));
                    let bytes = r.answer_bytes as f64;
                    m.push((format!("{n}.{}.{}_bytes", r.member, r.kind), bytes));
                }
            }
        }
        m.push((
            "elections_outside_restarts".into(),
            self.elections_outside_restarts() as f64,
        ));
        for (what, v) in [
            ("rss_peak", &self.rss_peak_bytes),
            ("data_dir", &self.data_dir_bytes),
        ] {
            let max = v.iter().copied().max().unwrap_or(0);
            m.push((format!("{what}.max_member_bytes"), max as f64));
            for (slot, b) in v.iter().enumerate() {
                m.push((format!("{what}.m{slot}_bytes"), *b as f64));
            }
        }
        m
    }

    /// The run in JSON: every phase in full, and the metrics.
    pub fn to_json(&self) -> Value {
        let phases: Vec<Value> = self.phases.iter().map(phase_json).collect();
        json!({
            "system": self.system,
            "phases": phases,
            "elections_outside_restarts": self.elections_outside_restarts(),
            "rss_peak_bytes": self.rss_peak_bytes,
            "data_dir_bytes": self.data_dir_bytes,
            "metrics": metrics_json(&self.metrics()),
        })
    }

    /// The run as a table.
    pub fn print(&self, run: usize) {
        println!("\nrun {run}, {}:", self.system);
        println!(
            "  {:<17} {:>9} {:>7} {:>8} {:>8} {:>7} {:>6}  more (a probe latency of - : no put succeeded)",
            "phase", "time s", "puts", "p99 ms", "max ms", "failed", "elect"
        );
        for p in &self.phases {
            let elect = match is_restart(p.name) {
                true => "-".to_string(),
                false => p.elections().to_string(),
            };
            println!(
                "  {:<17} {:>9.1} {:>7} {:>8} {:>8} {:>7} {:>6}  {}",
                p.name,
                p.duration_ms / 1e3,
                p.probe.puts,
                opt_ms(p.probe.p99_ms),
                opt_ms(p.probe.max_ms),
                p.failed_requests(),
                elect,
                extra(p)
            );
            for r in &p.ranges {
                let took = r.ms.map_or("failed".into(), |t| format!("{t:.0} ms"));
                println!(
                    "    range on the {:<8} {:<10} {:>10}  {:>9.1} MiB  {} keys",
                    r.member,
                    r.kind,
                    took,
                    r.answer_bytes as f64 / MIB,
                    r.count
                );
            }
        }
        let mib = |v: &[u64]| {
            v.iter()
                .map(|b| format!("{:.0}", *b as f64 / MIB))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "  members: RSS peak {} MiB; data dir {} MiB",
            mib(&self.rss_peak_bytes),
            mib(&self.data_dir_bytes)
        );
    }
}

/// A latency in ms with one decimal, `-` for none.
fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// A phase's own extra measurement, as text.
fn extra(p: &Phase) -> String {
    let mut s = Vec::new();
    if let Some(k) = p.keys_per_s {
        s.push(format!("{k:.0} keys/s"));
    }
    if let Some(t) = p.time_to_serve_ms {
        s.push(format!("served after {t:.0} ms"));
    }
    if let Some(t) = p.time_to_every_key_ms {
        s.push(format!("every key after {t:.0} ms"));
    }
    if p.probe.rerouted > 0 {
        s.push(format!("{} probe puts rerouted", p.probe.rerouted));
    }
    let errors = p.probe.errors.iter().chain(&p.own_errors);
    if let Some(e) = errors.take(1).next() {
        s.push(format!("first failure: {e}"));
    }
    s.extend(p.notes.iter().cloned());
    s.join(", ")
}

/// One line on a phase, as it ends.
pub fn phase_line(p: &Phase) -> String {
    format!(
        "{} in {:.1} s, probe p99 {} ms, max {} ms, {} failed, term {} -> {}; {}",
        p.name,
        p.duration_ms / 1e3,
        opt_ms(p.probe.p99_ms),
        opt_ms(p.probe.max_ms),
        p.failed_requests(),
        p.before.term,
        p.after.term,
        extra(p)
    )
}

/// A phase in JSON.
fn phase_json(p: &Phase) -> Value {
    let ranges: Vec<Value> = p
        .ranges
        .iter()
        .map(|r| {
            json!({"member": r.member, "kind": r.kind, "ms": r.ms,
                   "answer_bytes": r.answer_bytes, "count": r.count})
        })
        .collect();
    json!({
        "name": p.name,
        "duration_ms": p.duration_ms,
        "probe": {"puts": p.probe.puts, "p99_ms": p.probe.p99_ms, "max_ms": p.probe.max_ms,
                  "failures": p.probe.failures, "errors": p.probe.errors,
                  "rerouted": p.probe.rerouted},
        "own_failures": p.own_failures,
        "own_errors": p.own_errors,
        "failed_requests": p.failed_requests(),
        "leader_before": p.before.leader_id,
        "term_before": p.before.term,
        "leader_after": p.after.leader_id,
        "term_after": p.after.term,
        "elections": p.elections(),
        "keys_per_s": p.keys_per_s,
        "time_to_serve_ms": p.time_to_serve_ms,
        "time_to_every_key_ms": p.time_to_every_key_ms,
        "ranges": ranges,
        "notes": p.notes,
    })
}

/// Metrics as a JSON object.
fn metrics_json(m: &[(String, f64)]) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<Map<_, _>>(),
    )
}

/// `system`'s runs.
fn of<'a>(runs: &'a [Run], system: &'a str) -> impl Iterator<Item = &'a SystemRun> + 'a {
    runs.iter()
        .flat_map(|r| r.systems.iter())
        .filter(move |s| s.system == system)
}

/// `system`'s median of every metric over `runs`, in the first run's order.
pub fn medians(runs: &[Run], system: &str) -> Vec<(String, f64)> {
    let all: Vec<Vec<(String, f64)>> = of(runs, system).map(SystemRun::metrics).collect();
    let Some(first) = all.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter_map(|(name, _)| {
            let values: Vec<f64> = all
                .iter()
                .filter_map(|m| m.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
                .collect();
            median(&values).map(|v| (name.clone(), v))
        })
        .collect()
}

/// `system`'s largest value of `metric` over `runs` (its worst run, for counts that must be 0).
fn worst(runs: &[Run], system: &str, metric: &str) -> Option<f64> {
    of(runs, system)
        .filter_map(|s| s.metrics().into_iter().find(|(n, _)| n == metric))
        .map(|(_, v)| v)
        .reduce(f64::max)
}

/// `metric` in a list of metrics.
fn get(m: &[(String, f64)], metric: &str) -> Option<f64> {
    m.iter().find(|(n, _)| n == metric).map(|(_, v)| *v)
}

/// The medians side by side, with the store ÷ etcd ratio.
pub fn print_medians(runs: &[Run]) {
    let (store, etcd) = (medians(runs, STORE), medians(runs, ETCD));
    println!("\nmedians over {} run(s):", runs.len());
    println!(
        "  {:<42} {:>16} {:>16} {:>12}",
        "metric", STORE, ETCD, "store÷etcd"
    );
    let show = |name: &str, v: f64| match name.ends_with("_bytes") {
        true => format!("{v:.0}"),
        false => format!("{v:.1}"),
    };
    for (name, s) in &store {
        let e = get(&etcd, name);
        let ratio = e.filter(|e| *e != 0.0).map(|e| s / e);
        println!(
            "  {:<42} {:>16} {:>16} {:>12}",
            name,
            show(name, *s),
            e.map_or("-".into(), |e| show(name, e)),
            ratio.map_or("-".into(), |r| format!("{r:.3}"))
        );
    }
}

/// The store ÷ etcd ratio of every median both have (and etcd's is not 0).
pub fn ratios(runs: &[Run]) -> Value {
    let etcd = medians(runs, ETCD);
    let pairs: Vec<(String, f64)> = medians(runs, STORE)
        .into_iter()
        .filter_map(|(n, s)| {
            let e = get(&etcd, &n).filter(|e| *e != 0.0)?;
            Some((n, s / e))
        })
        .collect();
    metrics_json(&pairs)
}

/// A target: what, the store's measure, its bound, whether met.
#[derive(Debug, Clone)]
pub struct Target {
    /// What is held.
    pub what: String,
    /// The store's value.
    pub measured: f64,
    /// The bound it must stay at or under.
    pub bound: f64,
}

impl Target {
    /// Whether the store stays at or under the bound.
    pub fn met(&self) -> bool {
        self.measured <= self.bound
    }

    /// The target in JSON.
    pub fn to_json(&self) -> Value {
        json!({"what": self.what, "measured": self.measured, "bound": self.bound,
               "met": self.met()})
    }
}

/// The targets: counts and the probe's maximum on the store's worst run; the comparisons with
/// etcd on the medians (only if etcd ran).
pub fn targets(runs: &[Run], phases: &[&str]) -> Vec<Target> {
    let mut t = Vec::new();
    let mut push = |what: String, measured: Option<f64>, bound: Option<f64>| {
        if let (Some(measured), Some(bound)) = (measured, bound) {
            t.push(Target {
                what,
                measured,
                bound,
            });
        }
    };
    for p in phases {
        let m = format!("{p}.failed_requests");
        push(
            format!("{m} (worst run) = 0"),
            worst(runs, STORE, &m),
            Some(0.0),
        );
    }
    let m = "elections_outside_restarts";
    push(
        format!("{m} (worst run) = 0"),
        worst(runs, STORE, m),
        Some(0.0),
    );
    for p in phases.iter().filter(|p| **p != "full_restart") {
        let m = format!("{p}.probe_max_ms");
        push(
            format!("{m} (worst run) ≤ 1000"),
            worst(runs, STORE, &m),
            Some(1000.0),
        );
    }
    let (store, etcd) = (medians(runs, STORE), medians(runs, ETCD));
    let mut versus = |m: &str, factor: f64, bound: &str| {
        let what = format!("{m} ≤ {bound}");
        push(what, get(&store, m), get(&etcd, m).map(|e| e * factor));
    };
    for p in phases {
        versus(&format!("{p}.probe_p99_ms"), 1.0, "etcd's");
    }
    versus("rss_peak.max_member_bytes", 0.5, "0.5× etcd's");
    for m in [
        "data_dir.max_member_bytes",
        "follower_restart.time_to_serve_ms",
        "full_restart.time_to_serve_ms",
        "member_replace.time_to_every_key_ms",
    ] {
        versus(m, 1.0, "etcd's");
    }
    t
}

/// The targets, printed.
pub fn print_targets(targets: &[Target]) {
    println!("\ntargets (the store):");
    for t in targets {
        let met = if t.met() { "met" } else { "MISSED" };
        println!(
            "  {:<58} {:>14.1} ≤ {:<14.1} {met}",
            t.what, t.measured, t.bound
        );
    }
}

/// Every run of every system in JSON, and the medians of each.
pub fn runs_json(runs: &[Run]) -> (Value, Value) {
    let per_run: Vec<Value> = runs
        .iter()
        .map(|r| {
            let systems: Vec<Value> = r.systems.iter().map(SystemRun::to_json).collect();
            json!({"run": r.index, "systems": systems})
        })
        .collect();
    let medians = json!({
        STORE: metrics_json(&medians(runs, STORE)),
        ETCD: metrics_json(&medians(runs, ETCD)),
    });
    (Value::Array(per_run), medians)
}
