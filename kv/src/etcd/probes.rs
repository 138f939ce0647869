//! The HTTP side of the etcd API's port, as etcd serves it beside gRPC: `GET /version`,
//! `GET /health` and `GET /metrics`, and etcd's answer to any other path. Load balancers,
//! Prometheus and etcd's own tools (`etcdctl check datascale` reads `/metrics`) read these.
//!
//! Requests reach these handlers by path: gRPC's paths (`/etcdserverpb.KV/Range`, …) never
//! collide with them, and a gRPC call to an unknown method still gets gRPC's `Unimplemented`.

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use etcd_client::proto::{PbKvService as _, PbRangeRequest};

use crate::etcd::api::EtcdApi;
use crate::state::alarms::{alarm_name, CORRUPT, NOSPACE};

/// The etcd server version the store answers with: the etcd API it speaks, as plain
/// `X.Y.Z` (clients such as Patroni parse every part as an integer).
pub const ETCD_SERVER_VERSION: &str = "3.4.0";

/// The etcd cluster version the store answers with (`X.Y.0`, as etcd's).
pub const ETCD_CLUSTER_VERSION: &str = "3.4.0";

/// The header naming the store and its own version on `/version`.
pub const SERVER_HEADER: &str = "x-raft-lease-kv-version";

/// How long `/health`'s quorum read may take before the member is reported unhealthy
/// (etcd 3.4's limit).
pub const HEALTH_READ_LIMIT: Duration = Duration::from_secs(1);

/// `GET /version`: `{"etcdserver":"3.4.0","etcdcluster":"3.4.0"}`, the store's own version in
/// [`SERVER_HEADER`].
pub fn version() -> Response<Body> {
    let body = format!(
        "{{\"etcdserver\":\"{ETCD_SERVER_VERSION}\",\"etcdcluster\":\"{ETCD_CLUSTER_VERSION}\"}}"
    );
    let mut r = json(StatusCode::OK, body);
    r.headers_mut().insert(
        SERVER_HEADER,
        HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
    );
    r
}

/// Why `/health` says false, or `None` when the member is healthy: it knows a live leader, no
/// alarm is raised (but those `exclude`d), and a quorum read answers within
/// [`HEALTH_READ_LIMIT`].
pub async fn unhealthy(api: &EtcdApi, exclude: &[i32]) -> Option<String> {
    let (leads, leader) = api.group().leadership.get();
    if !leads && api.app().live_leader(leader).is_none() {
        return Some("RAFT NO LEADER".into());
    }
    let alarms = match api.alarms() {
        Ok(a) => a,
        Err(e) => return Some(format!("ALARM UNREADABLE: {}", e.message())),
    };
    for alarm in [NOSPACE, CORRUPT] {
        if alarms.any(alarm) && !exclude.contains(&alarm) {
            return Some(format!("ALARM {}", alarm_name(alarm)));
        }
    }
    let read = PbRangeRequest {
        key: b"health".to_vec(),
        ..Default::default()
    };
    let asked = api.range(tonic::Request::new(read));
    match tokio::time::timeout(HEALTH_READ_LIMIT, asked).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!("QUORUM READ FAILED: {}", e.message())),
        Err(_) => Some("QUORUM READ TIMED OUT".into()),
    }
}

/// `GET /health[?exclude=NOSPACE]`: `{"health":"true"}` (200), or `"false"` with the reason
/// (503).
pub async fn health(api: &EtcdApi, query: Option<&str>) -> Response<Body> {
    let exclude = excluded_alarms(query.unwrap_or(""));
    match unhealthy(api, &exclude).await {
        None => json(
            StatusCode::OK,
            "{\"health\":\"true\",\"reason\":\"\"}".into(),
        ),
        Some(why) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"health": "false", "reason": why}).to_string(),
        ),
    }
}

/// The alarms named by `exclude=` parameters of `query` (unknown names are ignored, as etcd's).
fn excluded_alarms(query: &str) -> Vec<i32> {
    query
        .split('&')
        .filter_map(|p| p.strip_prefix("exclude="))
        .filter_map(|name| match name {
            "NOSPACE" => Some(NOSPACE),
            "CORRUPT" => Some(CORRUPT),
            _ => None,
        })
        .collect()
}

/// `GET /metrics`: the store's metrics, then the figures etcd publishes under etcd's names
/// where the store has them (`docs/etcd.md` lists them).
pub fn metrics(api: &EtcdApi) -> Response<Body> {
    let app = api.app();
    let s = app.status();
    let lease = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    let mut body = app
        .metrics
        .render(app.opts.id, lease, &s.counters, &app.inflight);
    let (leads, leader) = api.group().leadership.get();
    let has_leader = leads || app.live_leader(leader).is_some();
    let gauges = [
        (
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            u64::from(has_leader),
        ),
        (
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            u64::from(leads),
        ),
        (
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            api.keyspace().engine().file_bytes(),
        ),
        (
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes.",
            api.keyspace().bytes(),
        ),
        (
            "etcd_server_quota_backend_bytes",
            "Current backend storage quota size in bytes.",
            app.opts.quota_backend_bytes,
        ),
        ("etcd_server_id", "Server or member ID.", app.opts.id),
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            resident_bytes().unwrap_or(0),
        ),
        (
            "etcd_debugging_mvcc_current_revision",
            "The current revision of store.",
            u64::try_from(api.keyspace().rev()).unwrap_or(0),
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(
            body,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}"
        );
    }
    let counters = [
        (
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            s.commit,
        ),
        (
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            s.applied,
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            body,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}"
        );
    }
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// Any other request: gRPC's `Unimplemented` for a gRPC call (its method is unknown), etcd's
/// plain `404 page not found` otherwise.
pub fn other(req: &Request<Body>) -> Response<Body> {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let status = tonic::Status::unimplemented(format!("unknown method {}", req.uri().path()));
        let (parts, ()) = status.into_http::<()>().into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let mut r = Response::new(Body::from("404 page not found\n"));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A JSON answer.
fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusions_name_known_alarms_only() {
        assert_eq!(excluded_alarms("exclude=NOSPACE"), vec![NOSPACE]);
        assert_eq!(
            excluded_alarms("exclude=CORRUPT&x=1&exclude=NOSPACE"),
            vec![CORRUPT, NOSPACE]
        );
        assert!(excluded_alarms("exclude=nospace&exclude=").is_empty());
        assert!(excluded_alarms("").is_empty());
    }

    #[test]
    fn versions_are_plain_numbers() {
        for v in [ETCD_SERVER_VERSION, ETCD_CLUSTER_VERSION] {
            let parts: Vec<&str> = v.split('.').collect();
            assert_eq!(parts.len(), 3, "{v}");
            assert!(parts.iter().all(|p| p.parse::<u32>().is_ok()), "{v}");
        }
    }
}
