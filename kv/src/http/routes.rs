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
use crate::http::app::App;
use crate::http::ctx::{leader_only, method_not_allowed, name, Ctx};
use crate::http::reply::{error, Reply};
use crate::http::{admin, ask, info, kv, sessions};
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
    let m = &c.parts.method;
    Ok(match (m, path) {
        (&Method::GET, "/status") => info::status(c.app),
        (&Method::GET, "/metrics") => info::metrics(c.app),
        (&Method::GET, "/members") => info::members(c.app),
        (_, p) if p.starts_with("/kv/") => {
            let key = name(&p[4..], "bad_key")?;
            match *m {
                Method::GET => kv::get(c, key).await?,
                Method::PUT => kv::put(c, key, body).await?,
                Method::DELETE => {
                    leader_only(c)?;
                    ask::write(c, Command::Delete { key }, Vec::new(), None).await?
                }
                _ => return Err(method_not_allowed(m, "/kv/<key>", "GET, PUT, DELETE")),
            }
        }
        (_, p) if p.starts_with("/session") || p.starts_with("/lock/") => {
            sessions::route(c, body).await?
        }
        (_, p) if p.starts_with("/admin/") => admin::route(c, body).await?,
        _ => error(404, "not_found", format!("no route for {m} {path}")),
    })
}
