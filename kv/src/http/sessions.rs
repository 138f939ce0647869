//! Sessions and locks over HTTP, and the answers to every write's outcome. Keep-alives are
//! answered from the leader's memory under its lease (see `state::sessions_local`); everything else is a
//! raft entry.

use hyper::body::Incoming;
use hyper::Method;
use raft_lease::Clock;
use serde_json::{json, Value};

use crate::base::conns::Phase;
use crate::http::ask::write;
use crate::http::body::json_body;
use crate::http::ctx::{check_query, leader_only, method_not_allowed, name, param, Ctx};
use crate::http::outcome::outcome_reply;
use crate::http::reply::{error, reply, Reply};
use crate::state::command::{Command, Outcome};
use crate::state::sessions_local::LocalKeepAlive;

/// `/session`, `/session/keepalive`, `/session/<id>`, `/lock/<name>`.
pub async fn route(c: &Ctx<'_>, body: Incoming) -> Result<Reply, Reply> {
    let path = c.parts.uri.path();
    let m = &c.parts.method;
    match (m, path) {
        (&Method::POST, "/session") => {
            check_query(c, &[])?;
            leader_only(c)?;
            let body = json_body(body, c, "{\"ttl_ms\": N}").await?;
            let ttl_ms = body
                .get("ttl_ms")
                .and_then(Value::as_u64)
                .ok_or_else(|| error(400, "bad_json", "expected {\"ttl_ms\": N}"))?;
            let cmd = Command::SessionGrant { ttl_ms, now_ns: 0 };
            write(c, cmd, Vec::new(), None).await
        }
        (&Method::POST, "/session/keepalive") => {
            check_query(c, &[])?;
            leader_only(c)?;
            let body = json_body(body, c, "{\"ids\": [N, ...]}").await?;
            let ids: Vec<u64> = body
                .get("ids")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .ok_or_else(|| error(400, "bad_json", "expected {\"ids\": [N, ...]}"))?;
            keepalive(c, &ids).await
        }
        (&Method::DELETE, p) if p.starts_with("/session/") => {
            let id = p[9..]
                .parse()
                .map_err(|_| error(400, "bad_session", "session id must be a number"))?;
            check_query(c, &[])?;
            leader_only(c)?;
            write(c, Command::SessionRevoke { id }, Vec::new(), None).await
        }
        (_, p) if p.starts_with("/lock/") => lock(c, &p[6..]).await,
        (_, "/session" | "/session/keepalive") => Err(method_not_allowed(m, path, "POST")),
        (_, p) if p.starts_with("/session/") => Err(method_not_allowed(m, path, "DELETE")),
        _ => Err(error(404, "not_found", format!("no route for {m} {path}"))),
    }
}

/// `POST /session/keepalive {"ids": [...]}`: refresh in the leader's memory, then answer only
/// if the lease is still valid (read first, validate second). Sessions a checkpoint names are
/// answered once a replicated keep-alive has cleared it. `"via"` says which: `lease` or `raft`.
async fn keepalive(c: &Ctx<'_>, ids: &[u64]) -> Result<Reply, Reply> {
    let raft = c.app.first();
    let term = raft.leadership.term();
    c.conn.set(Phase::Waiting);
    let refresh = || {
        let now_ns = raft.clock.now_ns();
        raft.machine.write().keepalive_local(ids, term, now_ns)
    };
    let local = match c.app.opts.unsafe_keepalive_without_lease {
        true => refresh(), // the control: no lease check
        false => raft.handle.clone().read(refresh).map_err(|_| {
            let detail = "no valid leader lease: keep-alives are answered only under it; retry";
            error(503, "lease_not_held", detail).with_header("retry-after", "1")
        })?,
    };
    let ka = local.map_err(|r| outcome_reply(Outcome::Refused(r)))?;
    if ka.via_raft.is_empty() {
        return Ok(keepalive_reply(&ka, "lease"));
    }
    let cmd = Command::SessionKeepalive {
        ids: ka.via_raft.clone(),
        now_ns: 0,
    };
    let r = write(c, cmd, Vec::new(), None).await?;
    match r.status {
        200 => Ok(keepalive_reply(&ka, "raft")),
        _ => Err(r),
    }
}

fn keepalive_reply(ka: &LocalKeepAlive, via: &str) -> Reply {
    let body = json!({"refreshed": ka.refreshed, "unknown": ka.unknown, "via": via});
    reply(200, body)
}

/// `POST /lock/<name>?session=S` takes the lock; `DELETE /lock/<name>?session=S[&token=T]`
/// releases it (with its token, safe to retry).
async fn lock(c: &Ctx<'_>, raw_name: &str) -> Result<Reply, Reply> {
    let name = name(raw_name, "bad_lock")?;
    match c.parts.method {
        Method::POST => check_query(c, &["session"])?,
        Method::DELETE => check_query(c, &["session", "token"])?,
        _ => {}
    }
    let usage = "use POST or DELETE /lock/<name>?session=<id>";
    let session = param(&c.query, "session")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| error(400, "bad_lock", usage))?;
    let cmd = match c.parts.method {
        Method::POST => Command::Lock {
            name,
            session,
            now_ns: 0,
        },
        Method::DELETE => {
            let token = match param(&c.query, "token").map(str::parse::<u64>) {
                None => None,
                Some(Ok(t)) => Some(t),
                Some(Err(_)) => return Err(error(400, "bad_lock", "token must be a number")),
            };
            Command::Unlock {
                name,
                session,
                token,
            }
        }
        _ => {
            return Err(method_not_allowed(
                &c.parts.method,
                "/lock/<name>",
                "POST, DELETE",
            ))
        }
    };
    leader_only(c)?;
    write(c, cmd, Vec::new(), None).await
}
