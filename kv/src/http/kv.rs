//! `GET /kv/<key>` (a lease read on this worker, else through raft; with `read=local`, only from
//! this node's state under its lease or follower read lease) and `PUT /kv/<key>` (a write,
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
use crate::http::ctx::{leader_hint, leader_only_in, not_leader, param, Ctx, Query};
use crate::http::reply::{error, error_with, reply, Reply};
use crate::raft::requests::{ReadReply, Request};
use crate::raft::shared::Shared;
use crate::state::command::Command;
use crate::state::keys;
use crate::state::kv_state::{KvState, Stored};
use crate::state::mvcc::MvccError;

/// How a GET asks to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// One of the library's read modes (`lease`, `index`, `auto`).
    Mode(ReadMode),
    /// `local`: from this node's own state only, under its lease (on the leader) or its follower
    /// read lease (elsewhere), never through raft or a redirect.
    Local,
}

fn read_mode(q: &Query) -> Result<Asked, Reply> {
    match param(q, "read").unwrap_or("auto") {
        "lease" => Ok(Asked::Mode(ReadMode::Lease)),
        "index" => Ok(Asked::Mode(ReadMode::ReadIndex)),
        "auto" => Ok(Asked::Mode(ReadMode::Auto)),
        "local" => Ok(Asked::Local),
        other => Err(error(
            400,
            "bad_read_mode",
            format!("read={other}: use lease, index, auto or local"),
        )),
    }
}

/// A read of `key` from this node's state through the group's read handle: `None` unless the
/// lease (on the leader) or the follower read lease (elsewhere) makes it linearizable.
///
/// Without follower read leases only a leader reads here, and waits (spinning, on this worker)
/// for at most its own apply to catch up with its commit. A follower may wait about one round
/// for an entry to be exposed and applied: with follower read leases on, a read that must wait
/// does so with the worker handed over to the runtime's other tasks.
fn handle_read(g: &Shared<KvState>, key: &str, follower_leases: bool) -> Option<Found> {
    // A clone per request: a handle counts its reads in itself and hands them to the node's
    // counters when dropped, so `raft_lease_reads_total` stays exact across worker threads.
    let handle = g.handle.clone();
    let state = || crate::state::kv_machine::stored(&g.reader, key);
    if !follower_leases {
        return handle.read(state).ok();
    }
    if let Ok(stored) = handle.try_read(state) {
        return Some(stored);
    }
    if !handle.lease_held() {
        return None;
    }
    tokio::task::block_in_place(|| handle.read(state)).ok()
}

/// How a read served through the read handle was served: under the lease on the leader, under
/// a follower read lease elsewhere.
fn local_kind(g: &Shared<KvState>) -> ReadKind {
    match g.leadership.get().0 {
        true => ReadKind::Lease,
        false => ReadKind::FollowerLease,
    }
}

/// A read served on this worker through the read handle (`handle_read`), timed from `t`;
/// `None` when it cannot be.
fn read_here(c: &Ctx<'_>, g: &Shared<KvState>, key: &str, t: Instant, raw: bool) -> Option<Reply> {
    let follower_leases = c.app.opts.follower_leases_ms.is_some();
    let stored = handle_read(g, key, follower_leases)?;
    let seconds = t.elapsed().as_secs_f64();
    c.app.metrics.lease_read_seconds.observe(seconds);
    Some(value_reply(key, stored, local_kind(g), raw))
}

/// `read=local`: served here or refused here (503 `no_read_lease`, with the leader hint).
fn get_local(
    c: &Ctx<'_>,
    g: &Shared<KvState>,
    key: &str,
    t: Instant,
    raw: bool,
) -> Result<Reply, Reply> {
    if c.app.opts.follower_leases_ms.is_none() {
        let detail = "read=local needs follower read leases (start the nodes with \
                      --follower-leases-ms); use read=lease, auto or index";
        return Err(error(400, "follower_leases_off", detail));
    }
    read_here(c, g, key, t, raw).ok_or_else(|| {
        let detail = "this node holds no read lease now (or an entry it must show is not \
                      applied yet): read at the leader, or retry";
        let more = leader_hint(c, g.leadership.get().1);
        error_with(503, "no_read_lease", detail, more).with_header("retry-after", "1")
    })
}

pub async fn get(c: &Ctx<'_>, key: String) -> Result<Reply, Reply> {
    let app = c.app;
    let g = app.group_of(&key);
    let raw = accepts_raw(&c.parts.headers);
    let asked = read_mode(&c.query)?;
    let t = Instant::now();
    c.conn.set(Phase::Waiting);
    let mode = match asked {
        Asked::Local => return get_local(c, g, &key, t, raw),
        Asked::Mode(mode) => mode,
    };
    // Fast path: the lease, on this worker (with follower read leases, a follower's too).
    // raft-rs LeaseBased (unsafe mode) goes through raft.
    if mode != ReadMode::ReadIndex && !app.opts.unsafe_lease_based {
        if let Some(reply) = read_here(c, g, &key, t, raw) {
            return Ok(reply);
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

/// A key's value as read from the keyspace, or the engine's failure.
type Found = Result<Option<Stored>, MvccError>;

fn value_reply(key: &str, stored: Found, kind: ReadKind, raw: bool) -> Reply {
    let stored = match stored {
        Ok(s) => s,
        Err(e) => {
            return error(503, "storage_failed", e.to_string()).with_header("retry-after", "1")
        }
    };
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
