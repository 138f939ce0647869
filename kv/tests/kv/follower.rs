//! Follower read leases on real processes (`--follower-leases-ms`): `GET /kv/<key>?read=local`
//! at every follower serves an acknowledged write from the follower's own state, and says so
//! (`"read": "follower_lease"`); with the setting off, no follower serves a read locally.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{exe, http, json, others, put, Cluster};

/// `G`, for the test clusters' timing (heartbeat 40 ms, election timeout 400 ms).
const MAX_GRANT_MS: &str = "120";

fn read_local(port: u16, key: &str) -> (u16, Value) {
    let (code, body) = http(port, "GET", &format!("/kv/{key}?read=local"), b"").expect("an answer");
    (code, json(&body))
}

/// Poll `read=local` at `port` until it is served (the follower's read lease held), with a
/// deadline; every refusal on the way must be 503 `no_read_lease` with a leader hint.
fn served_locally(port: u16, key: &str, leader: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, v) = read_local(port, key);
        if code == 200 {
            return v;
        }
        assert_eq!(
            (code, v["error"].as_str()),
            (503, Some("no_read_lease")),
            "{v}"
        );
        if let Some(hint) = v["leader_id"].as_u64() {
            assert_eq!(hint, leader, "{v}");
        }
        assert!(
            Instant::now() < deadline,
            "no read lease at port {port} within 15 s: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_follower_serves_acknowledged_writes_locally_under_its_read_lease() {
    let c = Cluster::start(3, &["--follower-leases-ms", MAX_GRANT_MS]);
    let l = c.leader(&[1, 2, 3], 15);
    let rev = put(c.port(l), "near", "v1");
    for f in others(l) {
        let v = served_locally(c.port(f), "near", l);
        assert_eq!(v["value"].as_str(), Some("v1"), "node {f}: {v}");
        assert_eq!(v["revision"].as_u64(), Some(rev), "node {f}: {v}");
        assert_eq!(v["read"].as_str(), Some("follower_lease"), "node {f}: {v}");
    }
    // Once a write is acknowledged, every local read at a follower shows it (or is refused).
    for round in 0..20 {
        let value = format!("v{}", round + 2);
        let rev = put(c.port(l), "near", &value);
        for f in others(l) {
            let v = served_locally(c.port(f), "near", l);
            assert_eq!(
                (v["value"].as_str(), v["revision"].as_u64()),
                (Some(value.as_str()), Some(rev)),
                "node {f} after the write of {value} was acknowledged: {v}"
            );
        }
    }
    let (code, v) = read_local(c.port(l), "near");
    assert_eq!((code, v["read"].as_str()), (200, Some("lease")), "{v}");
    let (code, v) = read_local(c.port(others(l)[0]), "absent");
    assert_eq!(
        (code, v["error"].as_str(), v["read"].as_str()),
        (404, Some("not_found"), Some("follower_lease")),
        "{v}"
    );
}

#[test]
fn with_follower_leases_off_no_follower_serves_a_local_read() {
    let c = Cluster::start(3, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    put(c.port(l), "near", "v1");
    for f in others(l) {
        let (code, v) = read_local(c.port(f), "near");
        assert_eq!(
            (code, v["error"].as_str()),
            (400, Some("follower_leases_off")),
            "{v}"
        );
        let (code, _) = http(c.port(f), "GET", "/kv/near?read=lease", b"").unwrap();
        assert_eq!(code, 307, "a follower's lease read goes to the leader");
    }
}

#[test]
fn a_follower_lease_outside_its_bounds_or_the_control_alone_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node1");
    let node = |extra: &[&str]| {
        let out = Command::new(exe())
            .args(["node", "--id", "1", "--peers", "1=127.0.0.1:1", "--http"])
            .args(["127.0.0.1:0", "--cluster-id", "c", "--insecure-peers"])
            .args(["--election-ms", "400", "--heartbeat-ms", "40", "--data-dir"])
            .arg(&data)
            .args(extra)
            .output()
            .expect("run kv node");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for g in ["200", "40"] {
        let (code, err) = node(&["--follower-leases-ms", g]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("--follower-leases-ms"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, err) = node(&["--unsafe-apply-to-commit"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--follower-leases-ms"), "{err}");
    assert!(
        !data.exists(),
        "nothing is made before the options are checked"
    );
}
