//! `GET /kv/<key>` (a lease read on this worker, else through raft) and `PUT /kv/<key>` (a write,
//! optionally in a session and fenced by a lock's token). Values are bytes: a GET answers
//! `{"value": text}` for a UTF-8 value and `{"value_base64": ...}` otherwise, or the raw value with
//! `Accept: application/octet-stream`.

use std::time::Instant;

use base64::Engine as _;
use hyper::body::Incoming;
use hyper::HeaderMap;
use raft_lease::{ReadKind, ReadMode};
use serde_json::json;
use tokio::sync::oneshot;

use crate::base::conns::Phase;
use crate::http::ask::{ask, reserve, write_in};
use crate::http::body::read_body;
use crate::http::ctx::{leader_only_in, not_leader, param, Ctx, Query};
use crate::http::reply::{error, error_with, reply, Reply};
use crate::raft::requests::{ReadReply, Request};
use crate::state::command::Command;
use crate::state::keys;
use crate::state::kv_state::Stored;

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

pub async fn get(c: &Ctx<'_>, key: String) -> Result<Reply, Reply> {
    let app = c.app;
    let g = app.group_of(&key);
    let raw = accepts_raw(&c.parts.headers);
    let mode = read_mode(&c.query)?;
    let t = Instant::now();
    c.conn.set(Phase::Waiting);
    // Fast path: the lease, on this worker. raft-rs LeaseBased (unsafe mode) goes through raft.
    if mode != ReadMode::ReadIndex && !app.opts.unsafe_lease_based {
        // A clone per request: a handle counts its reads in itself and hands them to the node's
        // counters when dropped, so `raft_lease_reads_total` stays exact across worker threads.
        let handle = g.handle.clone();
        let local = handle.read(|| g.machine.read().kv.get(&key).cloned());
        if let Ok(stored) = local {
            app.metrics
                .lease_read_seconds
                .observe(t.elapsed().as_secs_f64());
            return Ok(value_reply(&key, stored, ReadKind::Lease, raw));
        }
        if mode == ReadMode::Lease {
            let (is_leader, leader) = g.leadership.get();
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
    leader_only_in(c, g)?;
    let (tx, rx) = oneshot::channel();
    let req = Request::Read {
        query: key.clone(),
        mode,
        reply: tx,
    };
    match ask(g, req, rx).await? {
        ReadReply::Value { answer, kind } => {
            let h = match kind {
                ReadKind::Lease | ReadKind::FollowerLease => &app.metrics.lease_read_seconds,
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

pub async fn put(c: &Ctx<'_>, key: String, body: Incoming) -> Result<Reply, Reply> {
    let g = c.app.group_of(&key);
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
    if (session.is_some() || fence.is_some()) && g.group != 0 {
        let detail = format!(
            "key {key:?} is in group {} of {}: sessions and locks live in group 0, so a write \
             bound to a session or fenced by a lock is taken only for keys of group 0",
            g.group,
            c.app.groups.count()
        );
        let more = json!({"key": key, "group": g.group});
        return Err(error_with(400, "not_in_group_0", detail, more));
    }
    leader_only_in(c, g)?;
    let ticket = reserve(c, g, claimed.min(limit as u64) + key.len() as u64)?;
    let value = read_body(body, limit, c).await?;
    let cmd = Command::Put {
        key,
        session,
        fence,
        now_ns: 0,
    };
    write_in(c, g, cmd, value, Some(ticket)).await
}
