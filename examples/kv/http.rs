//! The HTTP API: routing, keys, and the answers every route shares. Lease reads are served on
//! the HTTP worker through the read handle; everything else goes to the raft thread over a
//! channel (see `raft_loop`). Sessions and locks are in `http_sessions`, `/admin` in `admin`.
//!
//! **Any node answers.** A request only the leader can serve, sent to another node, gets
//! `307 Temporary Redirect` with `Location` at the same path on the leader (307 keeps the method
//! and the body; `curl -L` follows it). Redirecting rather than forwarding keeps every limit and
//! budget on the node that does the work, never holds a body twice, and lets the client talk to
//! the leader directly from then on. With no leader known, the answer is 503 `no_leader`.
//!
//! Keys and lock names are decoded strictly (see `keys`); values are bytes. A GET answers
//! `{"value": text}` for a UTF-8 value and `{"value_base64": ...}` otherwise, or the raw value
//! with `Accept: application/octet-stream`.

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{HeaderMap, Method, Request as HttpRequest, Response};
use raft_lease::{ReadKind, ReadMode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::app::App;
use crate::budget::Ticket;
use crate::conns::{Guard, Phase};
use crate::keys::{self, NameError};
use crate::kv_machine::KvCommand;
use crate::limits::BODY_GRACE;
use crate::raft_loop::{ReadReply, Request, WriteReply};
use crate::reply::{error, error_with, reply, Reply};
use crate::state::{Command, Stored};

/// Largest JSON body (sessions, admin).
pub const MAX_JSON_BYTES: usize = 64 << 10;
/// How long a request waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);
/// What a write costs in the in-flight budget besides its value.
const WRITE_OVERHEAD_BYTES: u64 = 2048;

/// A query string, decoded.
pub type Query = Vec<(String, String)>;

/// A request, split for the routes.
pub struct Ctx<'a> {
    /// The node.
    pub app: &'a App,
    /// Method, path and headers.
    pub parts: Parts,
    /// The decoded query.
    pub query: Query,
    /// The connection (its phase, for the connection table).
    pub conn: &'a Guard,
}

/// Answer one request.
pub async fn handle(rq: HttpRequest<Incoming>, app: &App, conn: &Guard) -> Response<Full<Bytes>> {
    app.metrics.http_requests.inc();
    let (parts, body) = rq.into_parts();
    let r = match keys::parse_query(parts.uri.query().unwrap_or("")) {
        Ok(query) => {
            let ctx = Ctx {
                app,
                parts,
                query,
                conn,
            };
            route(&ctx, body).await.unwrap_or_else(|e| e)
        }
        Err(e) => error(400, "bad_query", e.to_string()),
    };
    if r.status >= 400 {
        app.metrics.http_errors.inc();
    }
    r.into_response()
}

async fn route(c: &Ctx<'_>, body: Incoming) -> Result<Reply, Reply> {
    let path = c.parts.uri.path();
    let m = &c.parts.method;
    Ok(match (m, path) {
        (&Method::GET, "/status") => status(c.app),
        (&Method::GET, "/metrics") => metrics(c.app),
        (&Method::GET, "/members") => members(c.app),
        (_, p) if p.starts_with("/kv/") => {
            let key = name(&p[4..], "bad_key")?;
            match *m {
                Method::GET => get(c, key).await?,
                Method::PUT => put(c, key, body).await?,
                Method::DELETE => {
                    leader_only(c)?;
                    write(c, Command::Delete { key }, Vec::new(), None).await?
                }
                _ => return Err(method_not_allowed(m, "/kv/<key>", "GET, PUT, DELETE")),
            }
        }
        (_, p) if p.starts_with("/session") || p.starts_with("/lock/") => {
            crate::http_sessions::route(c, body).await?
        }
        (_, p) if p.starts_with("/admin/") => crate::admin::route(c, body).await?,
        _ => error(404, "not_found", format!("no route for {m} {path}")),
    })
}

/// 405 with an `Allow` header.
pub fn method_not_allowed(m: &Method, route: &str, allow: &'static str) -> Reply {
    error(
        405,
        "method_not_allowed",
        format!("{m} on {route}: use {allow}"),
    )
    .with_header("allow", allow)
}

/// A key or lock name from the path.
pub fn name(raw: &str, what: &str) -> Result<String, Reply> {
    keys::name(raw).map_err(|e| match e {
        NameError::TooLong(_) => error(400, "key_too_long", e.to_string()),
        e => error(400, what, e.to_string()),
    })
}

/// A query parameter.
pub fn param<'a>(q: &'a Query, name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Read the whole body: at most `limit` bytes (413); no slower than the minimum rate after the
/// grace, and within the body timeout (408).
pub async fn read_body(mut body: Incoming, limit: usize, c: &Ctx<'_>) -> Result<Vec<u8>, Reply> {
    let limits = &c.app.limits;
    let too_large = || error(413, "too_large", format!("body over {limit} bytes"));
    let hint = hyper::body::Body::size_hint(&body);
    if hint.lower() > limit as u64 {
        return Err(too_large());
    }
    c.conn.set(Phase::Body);
    let start = tokio::time::Instant::now();
    let (hard, rate) = (
        start + limits.body_timeout(),
        limits.min_body_bytes_per_s as f64,
    );
    let mut buf = Vec::with_capacity((hint.lower() as usize).min(limit));
    loop {
        let due = BODY_GRACE.as_secs_f64() + (buf.len() + 1) as f64 / rate;
        let deadline = hard.min(start + Duration::from_secs_f64(due));
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                let detail = format!(
                    "the body arrived slower than {} bytes/s, or not within {} ms",
                    limits.min_body_bytes_per_s, limits.body_timeout_ms
                );
                return Err(error(408, "body_timeout", detail));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(error(400, "bad_body", e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
            c.conn.body_bytes(data.len() as u64);
        }
    }
    c.conn.set(Phase::Waiting);
    Ok(buf)
}

/// A JSON body of at most [`MAX_JSON_BYTES`].
pub async fn json_body(body: Incoming, c: &Ctx<'_>) -> Result<Value, Reply> {
    let b: Vec<u8> = read_body(body, MAX_JSON_BYTES.min(c.app.limits.max_body_bytes), c).await?;
    serde_json::from_slice(&b).map_err(|e| error(400, "bad_json", e.to_string()))
}

/// Proceed on the leader; elsewhere, the redirect to it (or 503 when no leader is known).
pub fn leader_only(c: &Ctx<'_>) -> Result<(), Reply> {
    match c.app.raft.leadership.get() {
        (true, _) => Ok(()),
        (false, leader) => Err(not_leader(c, leader)),
    }
}

/// This node does not lead: 307 to the leader's address, or 503.
pub fn not_leader(c: &Ctx<'_>, leader: Option<u64>) -> Reply {
    let http = leader.and_then(|id| c.app.http_of(id));
    let more = json!({"leader_id": leader, "leader_http": http});
    match (leader, &http) {
        (Some(id), Some(addr)) => {
            let target = c.parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let location = format!("{}://{addr}{target}", c.app.scheme);
            let detail = format!("node {id} leads: {location}");
            error_with(307, "not_leader", detail, more).with_header("location", location)
        }
        (Some(id), None) => {
            let detail = format!("node {id} leads, and its HTTP address is not known here");
            error_with(503, "not_leader", detail, more)
        }
        (None, _) => error_with(
            503,
            "no_leader",
            "no leader is known yet; retry shortly",
            more,
        )
        .with_header("retry-after", "1"),
    }
}

fn status(app: &App) -> Reply {
    let s = app.status();
    let (state, remaining_ns) = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    reply(
        200,
        json!({"id": app.opts.id, "pid": std::process::id(), "role": s.role, "term": s.term, "leader_id": s.leader_id,
               "commit": s.commit, "applied": s.applied, "last_index": s.last_index,
               "log_entries": s.log_entries, "insecure_peers": app.opts.insecure_peers,
               "member": crate::members::is_member(&s.conf, app.opts.id),
               "lease": {"state": state.as_str(), "remaining_ms": remaining_ns / 1_000_000},
               "promise": promise_json(app), "uptime_ms": app.promise.uptime_ms(&app.raft.clock)}),
    )
}

/// This run's lease promise `P`, the longest promise of an earlier run it boots with (0: none
/// known), and the data dir's record now, all in ms.
fn promise_json(app: &App) -> Value {
    let p = &app.promise;
    json!({"promise_ms": p.promise_ms, "prior_promise_ms": p.found.prior_ms(),
           "recorded_promise_ms": p.recorded_ms()})
}

fn members(app: &App) -> Reply {
    let s = app.status();
    let book = app.raft.members.read().clone();
    let mut body = s.conf_json();
    let list: Vec<Value> = book
        .addrs
        .iter()
        .filter(|(id, _)| crate::members::is_member(&s.conf, **id))
        .map(|(id, a)| {
            let role = if s.conf.learners.contains(id) {
                "learner"
            } else {
                "voter"
            };
            let mut m = json!({"id": id, "role": role, "peer": a.peer, "http": a.http});
            if let Some(p) = s.progress.get(id) {
                m["matched"] = p.matched.into();
                m["progress"] = p.state.into();
            }
            m
        })
        .collect();
    body["id"] = app.opts.id.into();
    body["leader_id"] = s.leader_id.into();
    body["members"] = list.into();
    reply(200, body)
}

fn metrics(app: &App) -> Reply {
    let s = app.status();
    let lease = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    app.metrics.http_open.set(app.conns.len() as u64);
    let body = app
        .metrics
        .render(app.opts.id, lease, &s.counters, &app.inflight);
    Reply::raw(200, "text/plain; version=0.0.4", body)
}

/// Send `req` to the raft thread and wait for its answer.
pub async fn ask<T>(
    app: &App,
    req: Request<crate::state::KvState>,
    rx: oneshot::Receiver<T>,
) -> Result<T, Reply> {
    match app.raft.requests.try_send(req) {
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

fn read_mode(q: &Query) -> Result<ReadMode, Reply> {
    match param(q, "read").unwrap_or("auto") {
        "lease" => Ok(ReadMode::Lease),
        "index" => Ok(ReadMode::ReadIndex),
        "auto" => Ok(ReadMode::Auto),
        other => Err(error(
            400,
            "bad_read_mode",
            format!("read={other}: use lease, index or auto"),
        )),
    }
}

async fn get(c: &Ctx<'_>, key: String) -> Result<Reply, Reply> {
    let app = c.app;
    let raw = accepts_raw(&c.parts.headers);
    let mode = read_mode(&c.query)?;
    let t = Instant::now();
    c.conn.set(Phase::Waiting);
    // Fast path: the lease, on this worker. raft-rs LeaseBased (unsafe mode) goes through raft.
    if mode != ReadMode::ReadIndex && !app.opts.unsafe_lease_based {
        // A clone per request: a handle counts its reads in itself and hands them to the node's
        // counters when dropped, so `raft_lease_reads_total` stays exact across worker threads.
        let handle = app.raft.handle.clone();
        let local = handle.read(|| app.raft.machine.read().kv.get(&key).cloned());
        if let Ok(stored) = local {
            app.metrics
                .lease_read_seconds
                .observe(t.elapsed().as_secs_f64());
            return Ok(value_reply(&key, stored, ReadKind::Lease, raw));
        }
        if mode == ReadMode::Lease {
            let (is_leader, leader) = app.raft.leadership.get();
            if !is_leader {
                return Err(not_leader(c, leader));
            }
            return Err(error(
                503,
                "lease_not_held",
                "no valid lease is held; try read=auto or read=index",
            ));
        }
    }
    leader_only(c)?;
    let (tx, rx) = oneshot::channel();
    let req = Request::Read {
        query: key.clone(),
        mode,
        reply: tx,
    };
    match ask(app, req, rx).await? {
        ReadReply::Value { answer, kind } => {
            let h = match kind {
                ReadKind::Lease => &app.metrics.lease_read_seconds,
                ReadKind::Index => &app.metrics.index_read_seconds,
            };
            h.observe(t.elapsed().as_secs_f64());
            Ok(value_reply(&key, answer, kind, raw))
        }
        ReadReply::NotLeader { leader } => Err(not_leader(c, leader)),
        ReadReply::LeaseNotHeld => Err(error(503, "lease_not_held", "no valid lease is held")),
        ReadReply::ShuttingDown => Err(error(503, "shutting_down", "the node is stopping")),
    }
}

fn accepts_raw(h: &HeaderMap) -> bool {
    h.get("accept")
        .is_some_and(|a| a.as_bytes().starts_with(b"application/octet-stream"))
}

fn value_reply(key: &str, stored: Option<Stored>, kind: ReadKind, raw: bool) -> Reply {
    let Some(s) = stored else {
        let more = json!({"key": key, "read": kind.as_str()});
        return error_with(404, "not_found", format!("no key {key:?}"), more);
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

/// Bytes for a write of a `len`-byte value, from the in-flight budget (503 when used up), and
/// room in the state for it (507 when full).
pub fn reserve(c: &Ctx<'_>, len: u64) -> Result<Ticket, Reply> {
    let app = c.app;
    let state = app.raft.machine.read().bytes;
    if len > 0 && state + app.inflight.used() + len > app.opts.max_state_bytes {
        let detail = format!(
            "the store holds {state} bytes of at most {}",
            app.opts.max_state_bytes
        );
        return Err(error(507, "state_full", detail));
    }
    app.inflight
        .take(len + WRITE_OVERHEAD_BYTES)
        .ok_or_else(|| {
            let detail = format!(
                "more than {} bytes of writes in flight; retry",
                app.inflight.limit()
            );
            error(503, "overloaded", detail).with_header("retry-after", "1")
        })
}

async fn put(c: &Ctx<'_>, key: String, body: Incoming) -> Result<Reply, Reply> {
    leader_only(c)?;
    let session = match param(&c.query, "session").map(str::parse::<u64>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(_)) => return Err(error(400, "bad_session", "session must be a number")),
    };
    let fence = match param(&c.query, "fence") {
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
    let limit = c.app.limits.max_body_bytes;
    let claimed = hyper::body::Body::size_hint(&body)
        .upper()
        .unwrap_or(limit as u64);
    let ticket = reserve(c, claimed.min(limit as u64) + key.len() as u64)?;
    let value = read_body(body, limit, c).await?;
    let cmd = Command::Put {
        key,
        session,
        fence,
        now_ns: 0,
    };
    write(c, cmd, value, Some(ticket)).await
}

/// Propose `cmd` with `value` and wait for it to apply.
pub async fn write(
    c: &Ctx<'_>,
    cmd: Command,
    value: Vec<u8>,
    ticket: Option<Ticket>,
) -> Result<Reply, Reply> {
    let ticket = match ticket {
        Some(t) => t,
        None => reserve(c, 0)?,
    };
    let t = Instant::now();
    c.conn.set(Phase::Waiting);
    let (tx, rx) = oneshot::channel();
    let req = Request::Propose {
        cmd: KvCommand { cmd, value },
        reply: tx,
        ticket: Some(ticket),
    };
    Ok(match ask(c.app, req, rx).await? {
        WriteReply::Done(outcome) => {
            c.app
                .metrics
                .write_seconds
                .observe(t.elapsed().as_secs_f64());
            crate::http_sessions::outcome_reply(outcome)
        }
        WriteReply::Refused(outcome) => crate::http_sessions::outcome_reply(outcome),
        WriteReply::NotLeader { leader } => not_leader(c, leader),
        WriteReply::NotApplied(why) => error(503, "not_applied", format!("{why}; safe to retry")),
        WriteReply::Unknown(why) => error(503, "outcome_unknown", why),
    })
}
