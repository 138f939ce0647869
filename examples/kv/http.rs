//! The HTTP API. Lease reads are served on the HTTP worker through the read handle; everything
//! else goes to the raft thread over a channel. Errors are JSON: `{"error": "...", ...}`.
//!
//! Keys and lock names are decoded strictly (see `keys`); values are bytes. A GET answers
//! `{"value": text}` for a UTF-8 value and `{"value_base64": ...}` otherwise, or the raw value
//! with `Accept: application/octet-stream`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request as HttpRequest, Response};
use raft_lease::{ReadKind, ReadMode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::keys::{self, NameError};
use crate::limits::HttpLimits;
use crate::reply::{error, reply, Reply};
use crate::server::{ReadReply, Request, Shared, WriteReply};
use crate::state::{Command, Outcome, Refusal, Stored};

/// Largest JSON body (sessions, admin).
const MAX_JSON_BYTES: usize = 64 << 10;
/// How long a request waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);

type Query = Vec<(String, String)>;

/// Answer one request.
pub async fn handle(
    rq: HttpRequest<Incoming>,
    shared: Arc<Shared>,
    limits: Arc<HttpLimits>,
) -> Response<Full<Bytes>> {
    shared.metrics.http_requests.inc();
    let r = route(rq, &shared, &limits).await.unwrap_or_else(|e| e);
    if r.status >= 400 {
        shared.metrics.http_errors.inc();
    }
    r.into_response()
}

async fn route(
    rq: HttpRequest<Incoming>,
    shared: &Shared,
    limits: &HttpLimits,
) -> Result<Reply, Reply> {
    let (parts, body) = rq.into_parts();
    let path = parts.uri.path();
    let query = keys::parse_query(parts.uri.query().unwrap_or(""))
        .map_err(|e| error(400, "bad_query", e.to_string()))?;
    let m = &parts.method;
    Ok(match (m, path) {
        (&Method::GET, "/status") => status(shared),
        (&Method::GET, "/metrics") => metrics(shared),
        (_, p) if p.starts_with("/kv/") => {
            let key = name(&p[4..], "bad_key")?;
            match *m {
                Method::GET => get(shared, key, &query, &parts.headers).await?,
                Method::PUT => {
                    let value = read_body(body, limits.max_body_bytes, limits).await?;
                    put(shared, key, &query, value).await?
                }
                Method::DELETE => write(shared, Command::Delete { req: 0, key }, Vec::new()).await,
                _ => return Err(error(405, "method_not_allowed", format!("{m} on /kv/"))),
            }
        }
        (&Method::POST, "/session") => {
            session_grant(shared, json_body(body, limits).await?).await?
        }
        (&Method::POST, "/session/keepalive") => {
            session_keepalive(shared, json_body(body, limits).await?).await?
        }
        (&Method::DELETE, p) if p.starts_with("/session/") => {
            session_revoke(shared, &p[9..]).await?
        }
        (&Method::POST, p) if p.starts_with("/lock/") => lock(shared, &p[6..], &query).await?,
        (&Method::POST, p) if p.starts_with("/admin/") => {
            crate::admin::authorize(shared, &parts.headers)?;
            let body = if p == "/admin/heal" {
                Value::Null
            } else {
                json_body(body, limits).await?
            };
            crate::admin::route(shared, &p[7..], body)?
        }
        _ => error(404, "not_found", format!("no route for {m} {path}")),
    })
}

fn name(raw: &str, what: &str) -> Result<String, Reply> {
    keys::name(raw).map_err(|e| match e {
        NameError::TooLong(_) => error(400, "key_too_long", e.to_string()),
        e => error(400, what, e.to_string()),
    })
}

fn param<'a>(q: &'a Query, name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Read the whole body: at most `limit` bytes (413), within the body timeout (408).
pub async fn read_body(
    body: Incoming,
    limit: usize,
    limits: &HttpLimits,
) -> Result<Vec<u8>, Reply> {
    let too_large = || error(413, "too_large", format!("body over {limit} bytes"));
    if hyper::body::Body::size_hint(&body)
        .exact()
        .is_some_and(|n| n > limit as u64)
    {
        return Err(too_large());
    }
    match tokio::time::timeout(limits.body_timeout(), Limited::new(body, limit).collect()).await {
        Err(_) => Err(error(
            408,
            "body_timeout",
            format!(
                "the body did not arrive within {} ms",
                limits.body_timeout_ms
            ),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(error(400, "bad_body", e.to_string())),
        Ok(Ok(c)) => Ok(c.to_bytes().to_vec()),
    }
}

async fn json_body(body: Incoming, limits: &HttpLimits) -> Result<Value, Reply> {
    let b = read_body(body, MAX_JSON_BYTES.min(limits.max_body_bytes), limits).await?;
    serde_json::from_slice(&b).map_err(|e| error(400, "bad_json", e.to_string()))
}

fn not_leader(shared: &Shared, leader: Option<u64>) -> Reply {
    let http = leader.and_then(|id| shared.opts.peer_http.get(&id).cloned());
    reply(
        503,
        json!({"error": "not_leader", "leader_id": leader, "leader_http": http}),
    )
}

fn status(shared: &Shared) -> Reply {
    let s = shared.status.read().clone();
    let (state, remaining_ns) = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    reply(
        200,
        json!({"id": shared.opts.id, "role": s.role, "term": s.term, "leader_id": s.leader_id,
               "commit": s.commit, "applied": s.applied, "last_index": s.last_index,
               "log_entries": s.log_entries, "insecure_peers": shared.opts.insecure_peers,
               "lease": {"state": state.as_str(), "remaining_ms": remaining_ns / 1_000_000}}),
    )
}

fn metrics(shared: &Shared) -> Reply {
    let s = shared.status.read().clone();
    let lease = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    let body = shared.metrics.render(shared.opts.id, lease, &s.counters);
    Reply::raw(200, "text/plain; version=0.0.4", body)
}

/// Send `req` to the raft thread and wait for its answer.
async fn ask<T>(shared: &Shared, req: Request, rx: oneshot::Receiver<T>) -> Result<T, Reply> {
    match shared.requests.try_send(req) {
        Ok(()) => {}
        Err(crossbeam_channel::TrySendError::Full(_)) => {
            return Err(error(
                503,
                "overloaded",
                "the raft thread's queue is full; retry",
            ))
        }
        Err(crossbeam_channel::TrySendError::Disconnected(_)) => {
            return Err(error(503, "shutting_down", "the node is stopping"))
        }
    }
    match tokio::time::timeout(WAIT, rx).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(error(503, "shutting_down", "the node is stopping")),
        Err(_) => Err(error(
            504,
            "timeout",
            "no answer in time; a write may or may not be applied",
        )),
    }
}

async fn get(shared: &Shared, key: String, q: &Query, headers: &HeaderMap) -> Result<Reply, Reply> {
    let raw = headers
        .get("accept")
        .is_some_and(|a| a.as_bytes().starts_with(b"application/octet-stream"));
    let mode = match param(q, "read").unwrap_or("auto") {
        "lease" => ReadMode::Lease,
        "index" => ReadMode::ReadIndex,
        "auto" => ReadMode::Auto,
        other => {
            return Err(error(
                400,
                "bad_read_mode",
                format!("read={other}: use lease, index or auto"),
            ))
        }
    };
    // Fast path: the lease, on this worker. raft-rs LeaseBased (unsafe mode) goes through raft.
    if mode != ReadMode::ReadIndex && !shared.opts.unsafe_lease_based {
        let local = shared
            .handle
            .read(|| shared.state.read().kv.get(&key).cloned());
        if let Ok(stored) = local {
            return Ok(value_reply(&key, stored, ReadKind::Lease, raw));
        }
        if mode == ReadMode::Lease {
            let s = shared.status.read().clone();
            return Ok(if s.is_leader {
                error(503, "lease_not_held", "no valid lease is held")
            } else {
                not_leader(shared, s.leader_id)
            });
        }
    }
    let (tx, rx) = oneshot::channel();
    let req = Request::Read {
        key: key.clone(),
        mode,
        reply: tx,
    };
    Ok(match ask(shared, req, rx).await? {
        ReadReply::Value { stored, kind } => value_reply(&key, stored, kind, raw),
        ReadReply::NotLeader { leader } => not_leader(shared, leader),
        ReadReply::LeaseNotHeld => error(503, "lease_not_held", "no valid lease is held"),
    })
}

fn value_reply(key: &str, stored: Option<Stored>, kind: ReadKind, raw: bool) -> Reply {
    let Some(s) = stored else {
        return reply(
            404,
            json!({"error": "not_found", "key": key, "read": kind.as_str()}),
        );
    };
    if raw {
        return Reply::raw(200, "application/octet-stream", s.value)
            .with_header("x-kv-revision", s.revision.to_string())
            .with_header("x-kv-read", kind.as_str());
    }
    let mut body = json!({"key": key, "revision": s.revision, "read": kind.as_str()});
    match std::str::from_utf8(&s.value) {
        Ok(text) => body["value"] = text.into(),
        Err(_) => {
            body["value_base64"] = base64::engine::general_purpose::STANDARD
                .encode(&s.value)
                .into()
        }
    }
    reply(200, body)
}

async fn put(shared: &Shared, key: String, q: &Query, value: Vec<u8>) -> Result<Reply, Reply> {
    let session = match param(q, "session").map(str::parse::<u64>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(_)) => return Err(error(400, "bad_session", "session must be a number")),
    };
    let fence = match param(q, "fence") {
        None => None,
        Some(f) => {
            let (n, t) = f
                .rsplit_once(':')
                .and_then(|(n, t)| Some((n, t.parse::<u64>().ok()?)))
                .ok_or_else(|| error(400, "bad_fence", "fence must be <lock name>:<token>"))?;
            keys::check_name(n).map_err(|e| error(400, "bad_fence", e.to_string()))?;
            Some((n.to_string(), t))
        }
    };
    let cmd = Command::Put {
        req: 0,
        key,
        session,
        fence,
    };
    Ok(write(shared, cmd, value).await)
}

async fn write(shared: &Shared, cmd: Command, value: Vec<u8>) -> Reply {
    let (tx, rx) = oneshot::channel();
    let req = Request::Write {
        cmd,
        value,
        reply: tx,
    };
    match ask(shared, req, rx).await {
        Ok(WriteReply::Done(outcome)) => outcome_reply(outcome),
        Ok(WriteReply::NotLeader { leader }) => not_leader(shared, leader),
        Ok(WriteReply::NotReady) => error(
            503,
            "not_ready",
            "new leader; sessions not yet on its clock, retry",
        ),
        Ok(WriteReply::Unknown(why)) => error(503, "outcome_unknown", why),
        Err(r) => r,
    }
}

fn outcome_reply(o: Outcome) -> Reply {
    match o {
        Outcome::Revision(r) => reply(200, json!({"revision": r})),
        Outcome::Session(id) => reply(200, json!({"id": id})),
        Outcome::Token(t) => reply(200, json!({"token": t})),
        Outcome::KeepAlive { refreshed, unknown } => {
            reply(200, json!({"refreshed": refreshed, "unknown": unknown}))
        }
        Outcome::Revoked => reply(200, json!({"revoked": true})),
        Outcome::Refused(r) => refusal_reply(r),
    }
}

fn refusal_reply(r: Refusal) -> Reply {
    match r {
        Refusal::NotFound => reply(404, json!({"error": "not_found"})),
        Refusal::UnknownSession(id) => {
            reply(404, json!({"error": "unknown_session", "session": id}))
        }
        Refusal::LockHeld { holder } => reply(409, json!({"error": "lock_held", "holder": holder})),
        Refusal::StaleFence { token, current } => reply(
            409,
            json!({"error": "stale_fence", "token": token, "current": current}),
        ),
        Refusal::LockNotHeld { lock } => reply(
            409,
            json!({"error": "lock_not_held", "detail": "a fence needs a lock that is held", "lock": lock}),
        ),
        Refusal::BadTtl { ttl_ms, max_ttl_ms } => reply(
            400,
            json!({"error": "bad_ttl", "ttl_ms": ttl_ms, "max_ttl_ms": max_ttl_ms}),
        ),
        Refusal::BadName(why) => error(400, "bad_key", why),
    }
}

async fn session_grant(shared: &Shared, body: Value) -> Result<Reply, Reply> {
    let ttl_ms = body
        .get("ttl_ms")
        .and_then(Value::as_u64)
        .ok_or_else(|| error(400, "bad_json", "expected {\"ttl_ms\": N}"))?;
    let cmd = Command::SessionGrant {
        req: 0,
        ttl_ms,
        now_ns: 0,
    };
    Ok(write(shared, cmd, Vec::new()).await)
}

async fn session_keepalive(shared: &Shared, body: Value) -> Result<Reply, Reply> {
    let ids: Vec<u64> = body
        .get("ids")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect())
        .ok_or_else(|| error(400, "bad_json", "expected {\"ids\": [N, ...]}"))?;
    let cmd = Command::SessionKeepalive {
        req: 0,
        ids,
        now_ns: 0,
    };
    Ok(write(shared, cmd, Vec::new()).await)
}

async fn session_revoke(shared: &Shared, id: &str) -> Result<Reply, Reply> {
    let id = id
        .parse()
        .map_err(|_| error(400, "bad_session", "session id must be a number"))?;
    Ok(write(shared, Command::SessionRevoke { req: 0, id }, Vec::new()).await)
}

async fn lock(shared: &Shared, raw_name: &str, q: &Query) -> Result<Reply, Reply> {
    let name = name(raw_name, "bad_lock")?;
    let session = param(q, "session")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| error(400, "bad_lock", "use POST /lock/<name>?session=<id>"))?;
    let cmd = Command::Lock {
        req: 0,
        name,
        session,
        now_ns: 0,
    };
    Ok(write(shared, cmd, Vec::new()).await)
}
