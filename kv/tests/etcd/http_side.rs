//! The HTTP side of the client port, as etcd's users reach it with `curl`: `/version`,
//! `/health` and `/metrics` beside gRPC on one port, etcd's 404 elsewhere, and `/health`
//! turning false when the member has no leader. Run against this store and etcd 3.4.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::target::Target;

/// `curl` of `url` with `args`: the status code and the body.
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Whether curl is installed; under CI (`CI` set) it must be.
pub fn available() -> bool {
    if Command::new("curl").arg("--version").output().is_ok() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI must install curl");
    eprintln!("SKIPPED: no curl");
    false
}

/// `{"etcdserver": "X.Y.Z", "etcdcluster": "X.Y.0"}`: plain numbers a client can parse part by
/// part (Patroni does), an API version of 3.4.
fn check_version(t: &Target, ep: &str, body: &str) {
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{}: /version on {ep} is not JSON ({e}): {body}", t.name()));
    for field in ["etcdserver", "etcdcluster"] {
        let s = v[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} in {body}"));
        let parts: Vec<u32> = s
            .split('.')
            .map(|p| {
                p.parse()
                    .unwrap_or_else(|_| panic!("{}: {field} {s:?}", t.name()))
            })
            .collect();
        assert_eq!(parts.len(), 3, "{}: {field} {s:?}", t.name());
        assert_eq!(parts[..2], [3, 4], "{}: {field} {s:?}", t.name());
    }
}

/// Every member answers `/version` (GET, also with a `{}` body as some clients send; POST is
/// 405),
/// `/health` true, `/metrics` with etcd's names, and 404 on an unknown path; gRPC still works
/// on the same port.
pub async fn version_health_metrics(t: &Target) {
    for ep in t.endpoints() {
        let base = format!("http://{ep}");
        let (code, body) = curl(&format!("{base}/version"), &[]);
        assert_eq!(code, 200, "{}: /version on {ep}: {body}", t.name());
        check_version(t, &ep, &body);
        let (code, body) = curl(&format!("{base}/version"), &["-X", "GET", "-d", "{}"]);
        assert_eq!(
            code,
            200,
            "{}: GET /version with a body on {ep}: {body}",
            t.name()
        );
        check_version(t, &ep, &body);
        let (code, _) = curl(&format!("{base}/version"), &["-X", "POST", "-d", "{}"]);
        assert_eq!(code, 405, "{}: POST /version on {ep}", t.name());
        let (code, body) = curl(&format!("{base}/health"), &[]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(
            (code, v["health"].as_str()),
            (200, Some("true")),
            "{}: {body}",
            t.name()
        );
        let (code, body) = curl(&format!("{base}/metrics"), &[]);
        assert_eq!(code, 200, "{}: /metrics on {ep}", t.name());
        for name in [
            "etcd_server_has_leader 1",
            "etcd_mvcc_db_total_size_in_bytes ",
            "process_resident_memory_bytes ",
        ] {
            assert!(
                body.lines().any(|l| l.starts_with(name)),
                "{}: /metrics on {ep} lacks {name:?}",
                t.name()
            );
        }
        let (code, _) = curl(&format!("{base}/no/such/path"), &[]);
        assert_eq!(code, 404, "{}: an unknown path on {ep}", t.name());
        let mut c = etcd_client::Client::connect([ep.as_str()], None)
            .await
            .unwrap();
        c.put("http-side", "still gRPC", None).await.unwrap();
    }
}

/// With two of three members killed, the last one's `/health` turns false with 503 (no leader),
/// and `/version` still answers.
pub fn health_false_without_a_leader(t: &mut Target) {
    let rt = crate::compat::runtime();
    t.kill_leader(&rt);
    t.kill_leader(&rt);
    let last = t.live_endpoints();
    assert_eq!(last.len(), 1, "{}: {last:?}", t.name());
    let base = format!("http://{}", last[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = curl(&format!("{base}/health"), &[]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 503 && v["health"].as_str() == Some("false") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: /health of a member with no quorum: {code} {body}",
            t.name()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = curl(&format!("{base}/version"), &[]);
    assert_eq!(code, 200, "{}: /version without a leader: {body}", t.name());
}
