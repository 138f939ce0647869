//! The nemesis's report: a line on the console, and JSON with the required keys (`stale_reads`,
//! `lost_writes`, `lease_violations`, `faults`, `operations`, `seed`, `timeline`), read
//! availability after every fault, and the evidence of every anomaly.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::checker::{Anomaly, Verdict};
use super::faults::Event;
use super::ops::{Call, Op, Ret};

/// Completion times (ns) of lease reads that returned an answer, sorted.
fn lease_read_times(ops: &[Op]) -> Vec<u64> {
    let mut t: Vec<u64> = ops
        .iter()
        .filter(|o| matches!(o.ret(), Some(Ret::Read { served, .. }) if served == "lease"))
        .map(Op::complete_ns)
        .collect();
    t.sort_unstable();
    t
}

/// How long after `end_ms` the first lease read was answered (None: never).
fn lease_again_ms(times: &[u64], end_ms: u64) -> Option<u64> {
    let end_ns = end_ms * 1_000_000;
    let i = times.partition_point(|&t| t < end_ns);
    times.get(i).map(|t| (t - end_ns) / 1_000_000)
}

/// The longest time without an answered lease read, from `start_ms` until the first lease read
/// after `end_ms` (None: none after it): how long lease reads were unavailable around the fault.
fn lease_gap_ms(times: &[u64], start_ms: u64, end_ms: u64) -> Option<u64> {
    let (start_ns, end_ns) = (start_ms * 1_000_000, end_ms * 1_000_000);
    let from = times.partition_point(|&t| t < start_ns);
    let to = times.partition_point(|&t| t < end_ns);
    let mut prev = start_ns;
    let mut gap = 0;
    for &t in times.get(from..=to)? {
        gap = gap.max(t - prev);
        prev = t;
    }
    Some(gap / 1_000_000)
}

fn counts<'a>(it: impl Iterator<Item = &'a str>) -> BTreeMap<&'a str, u64> {
    let mut m = BTreeMap::new();
    for k in it {
        *m.entry(k).or_default() += 1;
    }
    m
}

fn call_kind(o: &Op) -> &'static str {
    match &o.call {
        Call::Put { fence: Some(_), .. } => "fenced_put",
        Call::Put { .. } => "put",
        Call::Cas { .. } => "cas",
        Call::Get {
            mode,
            final_read: false,
            ..
        } if mode == "serializable" => "serializable_get",
        Call::Get {
            final_read: true, ..
        } => "final_get",
        Call::Get { .. } => "get",
        Call::Session => "session",
        Call::KeepAlive { .. } => "keepalive",
        Call::Lock { .. } => "lock",
        Call::Unlock { .. } => "unlock",
    }
}

fn first(list: &[Anomaly], ops: &[Op]) -> Vec<Value> {
    list.iter()
        .take(20)
        .map(|a| json!({"op": ops.get(a.op), "against": ops.get(a.against), "detail": a.detail}))
        .collect()
}

/// What the run was, for the report.
pub struct RunInfo<'a> {
    /// The seed.
    pub seed: u64,
    /// Founding nodes.
    pub nodes: u64,
    /// Seconds the run lasted.
    pub duration_s: f64,
    /// The command that reruns it.
    pub rerun: String,
    /// Members that exited on their own.
    pub node_exits: &'a [u64],
    /// Whether the nodes ran raft-rs `LeaseBased`.
    pub unsafe_lease_based: bool,
    /// The control clock rate, if any.
    pub clock_rate: Option<f64>,
    /// `G` of follower read leases, if on.
    pub follower_leases_ms: Option<u64>,
    /// Whether the nodes ran the follower-read control (apply up to commit).
    pub unsafe_apply_to_commit: bool,
}

/// `read=local` reads asked for, and of those: served here by a follower, served here by the
/// leader, refused (503 `no_read_lease`).
fn local_reads(ops: &[Op]) -> Value {
    let local = ops
        .iter()
        .filter(|o| matches!(&o.call, Call::Get { mode, .. } if mode == "local"));
    let (mut asked, mut follower, mut leader, mut refused) = (0, 0, 0, 0);
    for o in local {
        asked += 1;
        match o.ret() {
            Some(Ret::Read { served, .. }) if served == "follower_lease" => follower += 1,
            Some(Ret::Read { .. }) => leader += 1,
            Some(Ret::Failed { why }) if why.contains("no_read_lease") => refused += 1,
            _ => {}
        }
    }
    json!({"asked": asked, "served_by_follower": follower, "served_by_leader": leader,
           "refused_no_read_lease": refused})
}

/// The JSON report.
pub fn json(info: &RunInfo, v: &Verdict, ops: &[Op], timeline: &[Event]) -> Value {
    let times = lease_read_times(ops);
    let timeline: Vec<Value> = timeline
        .iter()
        .map(|e| {
            let mut j = serde_json::to_value(e).expect("an event serializes");
            j["lease_reads_again_ms"] = lease_again_ms(&times, e.end_ms).into();
            j["lease_read_gap_ms"] = lease_gap_ms(&times, e.start_ms, e.end_ms).into();
            j
        })
        .collect();
    let unknown = ops
        .iter()
        .filter(|o| matches!(o.ret(), None | Some(Ret::Unknown { .. })))
        .count();
    json!({
        "seed": info.seed,
        "nodes": info.nodes,
        "duration_s": info.duration_s,
        "unsafe_lease_based": info.unsafe_lease_based,
        "clock_rate_control": info.clock_rate,
        "follower_leases_ms": info.follower_leases_ms,
        "unsafe_apply_to_commit": info.unsafe_apply_to_commit,
        "local_reads": local_reads(ops),
        "stale_reads": v.stale_reads.len(),
        "lost_writes": v.lost_writes.len(),
        "lease_violations": v.lease_violations.len(),
        "bogus_reads": v.bogus_reads.len(),
        "reordered_writes": v.reordered_writes.len(),
        "watch_anomalies": v.watch_anomalies.len(),
        "watch_events_checked": v.watch_events_checked,
        "anomalies": v.anomalies(),
        "node_exits": info.node_exits,
        "faults": timeline.len(),
        "faults_by_kind": counts(timeline.iter().filter_map(|e| e["kind"].as_str())),
        "operations": ops.len(),
        "operations_by_kind": counts(ops.iter().map(call_kind)),
        "operations_unknown": unknown,
        "reads_checked": v.reads_checked,
        "lease_reads_checked": v.lease_reads_checked,
        "follower_reads_checked": v.follower_reads_checked,
        "writes_acked": v.writes_acked,
        "writes_unknown": v.writes_unknown,
        "lock_ops_checked": v.lock_ops_checked,
        "rerun": info.rerun,
        "timeline": timeline,
        "evidence": {
            "stale_reads": first(&v.stale_reads, ops),
            "lost_writes": first(&v.lost_writes, ops),
            "lease_violations": first(&v.lease_violations, ops),
            "bogus_reads": first(&v.bogus_reads, ops),
            "reordered_writes": first(&v.reordered_writes, ops),
            "watch_anomalies": first(&v.watch_anomalies, ops),
        },
    })
}

/// The console summary.
pub fn print(r: &Value) {
    println!(
        "\n== nemesis: seed {}, {} nodes, {:.0} s",
        r["seed"],
        r["nodes"],
        r["duration_s"].as_f64().unwrap_or(0.0)
    );
    println!("faults: {} {}", r["faults"], r["faults_by_kind"]);
    println!(
        "operations: {} ({} unknown outcome) {}",
        r["operations"], r["operations_unknown"], r["operations_by_kind"]
    );
    println!(
        "checked: {} reads ({} lease, {} follower_lease), {} acknowledged writes ({} unknown), {} lock/fence ops",
        r["reads_checked"],
        r["lease_reads_checked"],
        r["follower_reads_checked"],
        r["writes_acked"],
        r["writes_unknown"],
        r["lock_ops_checked"]
    );
    if !r["follower_leases_ms"].is_null() {
        println!("read=local: {}", r["local_reads"]);
    }
    let again: Vec<String> = r["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{}:{}",
                e["kind"].as_str().unwrap_or("?"),
                e["lease_read_gap_ms"]
            )
        })
        .collect();
    println!(
        "longest gap in lease reads from each fault's start until served again (ms): {}",
        again.join(" ")
    );
    println!(
        "stale_reads {}  lost_writes {}  lease_violations {}  bogus_reads {}  reordered_writes {}  watch_anomalies {} ({} events checked)  node_exits {}",
        r["stale_reads"], r["lost_writes"], r["lease_violations"], r["bogus_reads"], r["reordered_writes"],
        r["watch_anomalies"], r["watch_events_checked"], r["node_exits"]
    );
    for kind in [
        "stale_reads",
        "lost_writes",
        "lease_violations",
        "bogus_reads",
        "reordered_writes",
        "watch_anomalies",
    ] {
        if let Some(first) = r["evidence"][kind].as_array().and_then(|a| a.first()) {
            println!("first of {kind}: {}", first["detail"]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_is_the_longest_gap_until_the_first_lease_read_after_the_fault() {
        let ms = |v: &[u64]| v.iter().map(|t| t * 1_000_000).collect::<Vec<u64>>();
        let times = ms(&[5, 10, 12, 400, 410, 900]);
        assert_eq!(lease_gap_ms(&times, 11, 300), Some(388), "12 -> 400");
        assert_eq!(lease_again_ms(&times, 300), Some(100));
        assert_eq!(
            lease_gap_ms(&times, 405, 600),
            Some(490),
            "410 -> 900, the first after the end"
        );
        assert_eq!(lease_gap_ms(&times, 100, 950), None, "never served again");
        assert_eq!(lease_again_ms(&times, 950), None);
    }
}
