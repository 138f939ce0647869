//! The HTTP API. Lease reads are served on the HTTP thread through the read handle; everything
//! else goes to the raft thread over a channel. Errors are JSON: `{"error": "...", ...}`.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::bounded;
use raft_lease::{ReadKind, ReadMode};
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request as HttpRequest, Response};

use crate::server::{ReadReply, Request, Shared, WriteReply};
use crate::state::{Command, Outcome, Refusal, Stored};

pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// How long an HTTP thread waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);

/// A response: status and JSON body (or plain text for metrics).
pub struct Reply {
    status: u16,
    body: String,
    json: bool,
}

fn reply(status: u16, body: Value) -> Reply {
    Reply {
        status,
        body: body.to_string(),
        json: true,
    }
}

fn error(status: u16, what: &str, detail: impl Into<String>) -> Reply {
    reply(status, json!({"error": what, "detail": detail.into()}))
}

/// Serve requests until the server is unblocked.
pub fn serve(server: Arc<tiny_http::Server>, shared: Arc<Shared>) {
    for mut rq in server.incoming_requests() {
        shared.metrics.http_requests.inc();
        let r = route(&mut rq, &shared);
        if r.status >= 400 {
            shared.metrics.http_errors.inc();
        }
        let ctype = if r.json {
            "application/json"
        } else {
            "text/plain; version=0.0.4"
        };
        let header =
            Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes()).expect("valid header");
        let _ = rq.respond(
            Response::from_string(r.body)
                .with_status_code(r.status)
                .with_header(header),
        );
    }
}

fn route(rq: &mut HttpRequest, shared: &Shared) -> Reply {
    let url = rq.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let query = parse_query(query);
    let method = rq.method().clone();
    match (method, path) {
        (Method::Get, "/status") => status(shared),
        (Method::Get, "/metrics") => metrics(shared),
        (m, p) if p.starts_with("/kv/") => kv(rq, shared, &m, &p[4..], &query),
        (Method::Post, "/session") => session_grant(rq, shared),
        (Method::Post, "/session/keepalive") => session_keepalive(rq, shared),
        (Method::Delete, p) if p.starts_with("/session/") => session_revoke(shared, &p[9..]),
        (Method::Post, p) if p.starts_with("/lock/") => lock(shared, &p[6..], &query),
        (Method::Post, p) if p.starts_with("/admin/") => admin(rq, shared, &p[7..]),
        _ => error(
            404,
            "not_found",
            format!("no route for {} {path}", rq.method()),
        ),
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Decode `%XX` escapes; a malformed escape is kept as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Read the body, refusing more than `limit` bytes.
fn body(rq: &mut HttpRequest, limit: usize) -> Result<Vec<u8>, Reply> {
    if rq.body_length().is_some_and(|n| n > limit) {
        return Err(error(413, "too_large", format!("body over {limit} bytes")));
    }
    let mut buf = Vec::new();
    let n = rq.as_reader().take(limit as u64 + 1).read_to_end(&mut buf);
    match n {
        Err(e) => Err(error(400, "bad_body", e.to_string())),
        Ok(_) if buf.len() > limit => {
            Err(error(413, "too_large", format!("body over {limit} bytes")))
        }
        Ok(_) => Ok(buf),
    }
}

fn json_body(rq: &mut HttpRequest) -> Result<Value, Reply> {
    let b = body(rq, 64 << 10)?;
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
               "commit": s.commit, "applied": s.applied, "log_entries": s.log_entries,
               "lease": {"state": state.as_str(), "remaining_ms": remaining_ns / 1_000_000}}),
    )
}

fn metrics(shared: &Shared) -> Reply {
    let s = shared.status.read().clone();
    let lease = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    Reply {
        status: 200,
        body: shared.metrics.render(shared.opts.id, lease, &s.counters),
        json: false,
    }
}

fn kv(
    rq: &mut HttpRequest,
    shared: &Shared,
    method: &Method,
    raw_key: &str,
    q: &[(String, String)],
) -> Reply {
    let key = percent_decode(raw_key);
    if key.is_empty() {
        return error(400, "bad_key", "empty key");
    }
    if key.len() > MAX_KEY_BYTES {
        return error(
            400,
            "key_too_long",
            format!("key of {} bytes exceeds {MAX_KEY_BYTES}", key.len()),
        );
    }
    match method {
        Method::Get => get(shared, key, q),
        Method::Put => put(rq, shared, key, q),
        Method::Delete => write(shared, Command::Delete { req: 0, key }, Vec::new()),
        m => error(405, "method_not_allowed", format!("{m} on /kv/")),
    }
}

fn get(shared: &Shared, key: String, q: &[(String, String)]) -> Reply {
    let mode = match param(q, "read").unwrap_or("auto") {
        "lease" => ReadMode::Lease,
        "index" => ReadMode::ReadIndex,
        "auto" => ReadMode::Auto,
        other => {
            return error(
                400,
                "bad_read_mode",
                format!("read={other}: use lease, index or auto"),
            )
        }
    };
    // Fast path: the lease on this thread. raft-rs LeaseBased (unsafe mode) goes through raft.
    if mode != ReadMode::ReadIndex && !shared.opts.unsafe_lease_based {
        let local = shared
            .handle
            .read(|| shared.state.read().kv.get(&key).cloned());
        if let Ok(stored) = local {
            return value_reply(&key, stored, ReadKind::Lease);
        }
        if mode == ReadMode::Lease {
            let s = shared.status.read().clone();
            return if s.is_leader {
                error(503, "lease_not_held", "no valid lease is held")
            } else {
                not_leader(shared, s.leader_id)
            };
        }
    }
    let (tx, rx) = bounded(1);
    if shared
        .requests
        .send(Request::Read {
            key: key.clone(),
            mode,
            reply: tx,
        })
        .is_err()
    {
        return error(503, "shutting_down", "the node is stopping");
    }
    match rx.recv_timeout(WAIT) {
        Ok(ReadReply::Value { stored, kind }) => value_reply(&key, stored, kind),
        Ok(ReadReply::NotLeader { leader }) => not_leader(shared, leader),
        Ok(ReadReply::LeaseNotHeld) => error(503, "lease_not_held", "no valid lease is held"),
        Err(_) => error(504, "timeout", "the read did not complete in time"),
    }
}

fn value_reply(key: &str, stored: Option<Stored>, kind: ReadKind) -> Reply {
    match stored {
        None => reply(
            404,
            json!({"error": "not_found", "key": key, "read": kind.as_str()}),
        ),
        Some(s) => {
            let value = String::from_utf8_lossy(&s.value);
            reply(
                200,
                json!({"key": key, "value": value, "revision": s.revision, "read": kind.as_str()}),
            )
        }
    }
}

fn put(rq: &mut HttpRequest, shared: &Shared, key: String, q: &[(String, String)]) -> Reply {
    let session = match param(q, "session").map(str::parse::<u64>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(_)) => return error(400, "bad_session", "session must be a number"),
    };
    let fence = match param(q, "fence") {
        None => None,
        Some(f) => match f
            .rsplit_once(':')
            .and_then(|(n, t)| Some((n.to_string(), t.parse::<u64>().ok()?)))
        {
            Some(f) => Some(f),
            None => return error(400, "bad_fence", "fence must be <lock name>:<token>"),
        },
    };
    let value = match body(rq, MAX_VALUE_BYTES) {
        Ok(v) => v,
        Err(r) => return r,
    };
    write(
        shared,
        Command::Put {
            req: 0,
            key,
            session,
            fence,
        },
        value,
    )
}

fn write(shared: &Shared, cmd: Command, value: Vec<u8>) -> Reply {
    let (tx, rx) = bounded(1);
    if shared
        .requests
        .send(Request::Write {
            cmd,
            value,
            reply: tx,
        })
        .is_err()
    {
        return error(503, "shutting_down", "the node is stopping");
    }
    match rx.recv_timeout(WAIT) {
        Ok(WriteReply::Done(outcome)) => outcome_reply(outcome),
        Ok(WriteReply::NotLeader { leader }) => not_leader(shared, leader),
        Ok(WriteReply::NotReady) => error(
            503,
            "not_ready",
            "new leader; sessions not yet on its clock, retry",
        ),
        Ok(WriteReply::Unknown(why)) => error(503, "outcome_unknown", why),
        Err(_) => error(
            504,
            "timeout",
            "no answer in time; the write may or may not be applied",
        ),
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
        Outcome::Refused(Refusal::NotFound) => reply(404, json!({"error": "not_found"})),
        Outcome::Refused(Refusal::UnknownSession(id)) => {
            reply(404, json!({"error": "unknown_session", "session": id}))
        }
        Outcome::Refused(Refusal::LockHeld { holder }) => {
            reply(409, json!({"error": "lock_held", "holder": holder}))
        }
        Outcome::Refused(Refusal::StaleFence { token, highest }) => reply(
            409,
            json!({"error": "stale_fence", "token": token, "highest": highest}),
        ),
        Outcome::Refused(Refusal::BadTtl { ttl_ms, max_ttl_ms }) => reply(
            400,
            json!({"error": "bad_ttl", "ttl_ms": ttl_ms, "max_ttl_ms": max_ttl_ms}),
        ),
    }
}

fn session_grant(rq: &mut HttpRequest, shared: &Shared) -> Reply {
    let ttl_ms = match json_body(rq).map(|v| v.get("ttl_ms").and_then(Value::as_u64)) {
        Ok(Some(t)) => t,
        Ok(None) => return error(400, "bad_json", "expected {\"ttl_ms\": N}"),
        Err(r) => return r,
    };
    write(
        shared,
        Command::SessionGrant {
            req: 0,
            ttl_ms,
            now_ns: 0,
        },
        Vec::new(),
    )
}

fn session_keepalive(rq: &mut HttpRequest, shared: &Shared) -> Reply {
    let ids: Option<Vec<u64>> = match json_body(rq) {
        Ok(v) => v
            .get("ids")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect()),
        Err(r) => return r,
    };
    match ids {
        Some(ids) => write(
            shared,
            Command::SessionKeepalive {
                req: 0,
                ids,
                now_ns: 0,
            },
            Vec::new(),
        ),
        None => error(400, "bad_json", "expected {\"ids\": [N, ...]}"),
    }
}

fn session_revoke(shared: &Shared, id: &str) -> Reply {
    match id.parse() {
        Ok(id) => write(shared, Command::SessionRevoke { req: 0, id }, Vec::new()),
        Err(_) => error(400, "bad_session", "session id must be a number"),
    }
}

fn lock(shared: &Shared, name: &str, q: &[(String, String)]) -> Reply {
    let name = percent_decode(name);
    match param(q, "session").map(str::parse::<u64>) {
        Some(Ok(session)) if !name.is_empty() => write(
            shared,
            Command::Lock {
                req: 0,
                name,
                session,
                now_ns: 0,
            },
            Vec::new(),
        ),
        _ => error(400, "bad_lock", "use POST /lock/<name>?session=<id>"),
    }
}

fn admin(rq: &mut HttpRequest, shared: &Shared, what: &str) -> Reply {
    if !shared.opts.fault_injection {
        return error(
            404,
            "fault_injection_disabled",
            "start the node with --fault-injection",
        );
    }
    let body = if what == "heal" {
        Value::Null
    } else {
        json_body(rq).unwrap_or(Value::Null)
    };
    match what {
        "partition" => match body.get("peers").and_then(Value::as_array) {
            Some(peers) => {
                shared
                    .blocked
                    .write()
                    .extend(peers.iter().filter_map(Value::as_u64));
                reply(200, json!({"blocked": *shared.blocked.read()}))
            }
            None => error(400, "bad_json", "expected {\"peers\": [N, ...]}"),
        },
        "heal" => {
            shared.blocked.write().clear();
            reply(200, json!({"blocked": []}))
        }
        "clock" => match body
            .get("rate")
            .and_then(Value::as_f64)
            .map(|r| shared.clock.set_rate(r))
        {
            Some(Ok(())) => reply(200, json!({"rate": body["rate"]})),
            Some(Err(e)) => error(400, "bad_rate", e),
            None => error(400, "bad_json", "expected {\"rate\": F}"),
        },
        "transfer" => match body.get("to").and_then(Value::as_u64) {
            Some(to) => {
                let _ = shared.requests.send(Request::Transfer { to });
                reply(200, json!({"transfer_to": to}))
            }
            None => error(400, "bad_json", "expected {\"to\": N}"),
        },
        _ => error(404, "not_found", format!("no admin action {what}")),
    }
}
