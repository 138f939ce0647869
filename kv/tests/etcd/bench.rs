//! `kv bench --vs-etcd`: the store and a real etcd 3.4 side by side through one gRPC client; its
//! JSON holds both systems' cells, the fsync probe, the machine's load and the targets.

use std::process::Command;

/// The bench on two cells' worth of operations, one client, one second a cell.
#[test]
fn kv_bench_vs_etcd_measures_both_systems_through_the_same_client() {
    if !crate::reference::available() {
        return;
    }
    let _serial = crate::cluster::serial();
    // The store's ports (peers, HTTP, etcd API) and etcd's clients and peers.
    let offsets: Vec<u16> = (1..=3)
        .flat_map(|i| [i, 1000 + i, 2000 + i, 3000 + i, 3010 + i])
        .collect();
    let (base, _ports) = crate::ports::reserve_offsets(&offsets);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vs.json");
    let out = Command::new(crate::cluster::exe())
        .args(["bench", "--vs-etcd", "--seconds", "1", "--clients", "1"])
        .args(["--ops", "put,range_linearizable"])
        .args(["--base-port", &base.to_string(), "--json"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cells = doc["cells"].as_array().expect("cells");
    for system in ["raft-lease", "etcd"] {
        for op in ["put", "range_linearizable"] {
            let cell = cells
                .iter()
                .find(|c| c["system"] == system && c["op"] == op)
                .unwrap_or_else(|| panic!("no {system} {op} cell: {doc}"));
            assert!(
                cell["ops_per_s"].as_f64().is_some_and(|v| v > 0.0),
                "{cell}"
            );
            assert!(cell["p50_us"].as_f64().is_some_and(|v| v > 0.0), "{cell}");
            assert_eq!(cell["errors"], 0, "{cell}");
        }
    }
    assert!(doc["fdatasync_4k"]["p50_us"]
        .as_f64()
        .is_some_and(|v| v > 0.0));
    for k in ["uptime_before", "uptime_after"] {
        assert!(
            doc[k].as_str().is_some_and(|u| u.contains("load average")),
            "{k}: {doc}"
        );
    }
    let targets = doc["targets"].as_array().expect("targets");
    assert!(
        targets.iter().any(|t| t["target"]
            .as_str()
            .is_some_and(|s| s.starts_with("put p50"))),
        "{doc}"
    );
    assert!(
        stdout.contains("where a write's"),
        "the put cell's stages: {stdout}"
    );
}
