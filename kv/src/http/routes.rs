//! The HTTP API's routing. Lease reads are served on the HTTP worker through the read handle;
//! everything else goes to the raft thread over a channel (see `raft::raft_loop`). The routes are
//! in `kv` (keys), `info` (status, members, metrics), `sessions` (sessions and locks) and `admin`;
//! what they share is in `ctx`, `body` and `ask`.
//!
//! **Any node answers.** A request only the leader can serve, sent to another node, gets
//! `307 Temporary Redirect` with `Location` at the same path on the leader (307 keeps the method
//! and the body; `curl -L` follows it). Redirecting rather than forwarding keeps every limit and
//! budget on the node that does the work, never holds a body twice, and lets the client talk to
//! the leader directly from then on. With no leader known, the answer is 503 `no_leader`.
//!
//! Keys and lock names are decoded strictly (see `state::keys`); values are bytes (see `kv`).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request as HttpRequest, Response};

use crate::base::conns::Guard;
use crate::http::ctx::{check_query, leader_only_in, method_not_allowed, name, Ctx};
use crate::http::reply::{error, Reply};
use crate::http::{admin, ask, info, kv, sessions};
use crate::node::app::App;
use crate::state::command::Command;
use crate::state::keys;

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
    Ok(match path {
        "/status" | "/metrics" | "/members" | "/groups" => info_route(c, path)?,
        p if p.starts_with("/kv/") => {
            let r = kv_route(c, &p[4..], body).await;
            in_group(c, &p[4..], r)?
        }
        p if p.starts_with("/session") || p.starts_with("/lock/") => {
            sessions::route(c, body).await?
        }
        p if p.starts_with("/admin/") => admin::route(c, body).await?,
        _ => {
            let m = &c.parts.method;
            error(404, "not_found", format!("no route for {m} {path}"))
        }
    })
}

/// With many groups, every answer about a key names the key's group (`x-kv-group`), a redirect
/// to that group's leader included.
fn in_group(c: &Ctx<'_>, raw: &str, r: Result<Reply, Reply>) -> Result<Reply, Reply> {
    let groups = c.app.groups.count();
    let Ok(key) = keys::name(raw) else {
        return r;
    };
    if groups == 1 {
        return r;
    }
    let g = crate::state::placement::group_of(&key, groups).to_string();
    match r {
        Ok(r) => Ok(r.with_header("x-kv-group", g)),
        Err(r) => Err(r.with_header("x-kv-group", g)),
    }
}

/// `GET /status`, `/metrics`, `/members`, `/groups`: no other method, no parameters.
fn info_route(c: &Ctx<'_>, path: &str) -> Result<Reply, Reply> {
    if c.parts.method != Method::GET {
        return Err(method_not_allowed(&c.parts.method, path, "GET"));
    }
    check_query(c, &[])?;
    Ok(match path {
        "/status" => info::status(c.app),
        "/metrics" => info::metrics(c.app),
        "/groups" => info::groups(c.app),
        _ => info::members(c.app),
    })
}

/// `GET`, `PUT`, `DELETE /kv/<key>`, `raw` the key as sent.
async fn kv_route(c: &Ctx<'_>, raw: &str, body: Incoming) -> Result<Reply, Reply> {
    let key = name(raw, "bad_key")?;
    let m = &c.parts.method;
    match *m {
        Method::GET => {
            check_query(c, &["read"])?;
            kv::get(c, key).await
        }
        Method::PUT => {
            check_query(c, &["session", "fence"])?;
            kv::put(c, key, body).await
        }
        Method::DELETE => {
            check_query(c, &[])?;
            let g = c.app.group_of(&key);
            leader_only_in(c, g)?;
            ask::write_in(c, g, Command::Delete { key }, Vec::new(), None).await
        }
        _ => Err(method_not_allowed(m, "/kv/<key>", "GET, PUT, DELETE")),
    }
}
