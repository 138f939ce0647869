//! `read_bench --quick --json` writes every mode and cell with sane values. No timing is asserted.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn quick_json_carries_every_mode_and_cell() {
    let exe = common::example("read_bench");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cells.json");
    let svg = dir.path().join("chart.svg");
    let out = Command::new(&exe)
        .args(["--quick", "--cell-ms", "40", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .expect("run read_bench");
    assert!(
        out.status.success(),
        "read_bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let modes = [
        "local",
        "lease_handle",
        "lease_node",
        "read_index",
        "raftrs_read_index",
        "raftrs_lease_based",
        "follower_lease",
    ];
    let (writes, cells): (Vec<_>, Vec<_>) =
        cells.into_iter().partition(|c| c.get("reads").is_none());
    check_writes(&writes);
    let (scaled, cells): (Vec<_>, Vec<_>) = cells.into_iter().partition(|c| c["scaling"] == true);
    let mut threads_seen = BTreeSet::new();
    for c in &scaled {
        let (mode, _, threads) = check_cell(c, &modes[..2]);
        assert!(
            threads_seen.insert((mode, threads)),
            "duplicate scaling cell"
        );
    }
    assert_eq!(
        threads_seen.len(),
        8,
        "local and lease_handle on 1, 2, 4, 8 threads"
    );
    let mut seen = BTreeSet::new();
    for c in &cells {
        let key = check_cell(c, &modes);
        assert!(seen.insert(key.clone()), "duplicate cell {key:?}");
    }
    for mode in modes {
        for delay in [0, 100, 1_000, 5_000] {
            for outstanding in [1, 64] {
                assert!(
                    seen.contains(&(mode.to_string(), delay, outstanding)),
                    "missing {mode} {delay} {outstanding}"
                );
            }
        }
    }
    assert_eq!(cells.len(), 56);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && modes.iter().all(|m| chart.contains(m)),
        "svg lacks a mode"
    );
}

/// The write cells: follower leases on and off at each delay, the slow follower off, on, and on
/// with the lagging-node policy, and the stall after a holder is killed, beside its bound.
fn check_writes(cells: &[serde_json::Value]) {
    let mut seen = BTreeSet::new();
    for c in cells.iter().filter(|c| c["mode"] != "holder_killed_stall") {
        let (p50, p99) = (c["p50_ns"].as_u64(), c["p99_ns"].as_u64());
        assert!(p50.is_some_and(|p| p > 0) && p50 <= p99, "{c}");
        assert!(c["writes"].as_u64().is_some_and(|n| n > 0), "{c}");
        let policy = c.get("lag_policy").map(|p| p == true);
        let key = (
            c["mode"].as_str().expect("mode").to_string(),
            c["one_way_delay_us"].as_u64(),
            policy,
        );
        assert!(seen.insert(key), "duplicate write cell {c}");
    }
    for mode in ["write_leases_on", "write_leases_off"] {
        for delay in [0, 100, 1_000, 5_000] {
            assert!(
                seen.contains(&(mode.to_string(), Some(delay), None)),
                "missing {mode} {delay}"
            );
        }
    }
    let slow = |mode: &str, policy| seen.contains(&(mode.to_string(), Some(1_000), Some(policy)));
    assert!(slow("write_slow_follower_off", false) && slow("write_slow_follower_on", false));
    assert!(
        slow("write_slow_follower_on", true),
        "the lagging-node policy cell"
    );
    let stall: Vec<_> = cells
        .iter()
        .filter(|c| c["mode"] == "holder_killed_stall")
        .collect();
    assert_eq!(stall.len(), 1);
    for field in ["stall_ms", "bound_ms"] {
        assert!(
            stall[0][field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {}",
            stall[0]
        );
    }
    assert_eq!(seen.len() + 1, cells.len(), "an unknown write cell");
}

/// Checks one cell's fields; returns its (mode, delay, outstanding).
fn check_cell(c: &serde_json::Value, modes: &[&str]) -> (String, u64, u64) {
    let mode = c["mode"].as_str().expect("mode");
    let key = (
        mode.to_string(),
        c["one_way_delay_us"].as_u64().unwrap(),
        c["outstanding"].as_u64().unwrap(),
    );
    assert!(modes.contains(&mode), "unknown mode {mode}");
    for field in ["p50_ns", "p99_ns", "p999_ns"] {
        assert!(
            c[field].as_u64().is_some_and(|v| v > 0),
            "{key:?}: {field} = {}",
            c[field]
        );
    }
    let ordered = c["p50_ns"].as_u64() <= c["p99_ns"].as_u64()
        && c["p99_ns"].as_u64() <= c["p999_ns"].as_u64();
    assert!(ordered, "{key:?}: percentiles out of order");
    assert!(
        c["reads"].as_u64().is_some_and(|n| n > 0),
        "{key:?}: no reads"
    );
    assert!(
        c["reads_per_sec"].as_f64().is_some_and(|r| r > 0.0),
        "{key:?}"
    );
    assert!(
        c["msgs_per_read"]
            .as_f64()
            .is_some_and(|m| m.is_finite() && m >= 0.0),
        "{key:?}"
    );
    check_failures(c, &key);
    key
}

/// A cell's failures add up by reason, and its refusal rate is theirs.
fn check_failures(c: &serde_json::Value, key: &(String, u64, u64)) {
    let failed = c["failed"].as_u64().expect("failed");
    let by = c["failed_by"].as_object().expect("failed_by");
    let known = ["no_lease", "not_leader", "refused", "no_answer"];
    assert!(
        by.keys().all(|k| known.contains(&k.as_str())),
        "{key:?}: {by:?}"
    );
    let sum: u64 = by.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(sum, failed, "{key:?}: reasons {by:?}");
    let reads = c["reads"].as_u64().unwrap();
    let rate = c["refusal_rate"].as_f64().expect("refusal_rate");
    let want = failed as f64 / (reads + failed) as f64;
    assert!((rate - want).abs() < 1e-9, "{key:?}: {rate} against {want}");
    assert!(
        c["refusal_runs"].as_u64().is_some_and(|r| r <= failed),
        "{key:?}"
    );
}
