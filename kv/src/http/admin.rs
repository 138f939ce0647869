//! `/admin`: membership (`/admin/members`) and leadership (`/admin/transfer`) for a request that
//! carries the node's admin token (`Authorization: Bearer <token>`), and fault injection
//! (`/admin/partition`, `/admin/heal`, `/admin/clock`, `/admin/delay`, `/admin/stall-disk`) only
//! with `--fault-injection` as well. `/admin/stall-disk {"stalled": true}` holds the raft log's
//! syncs until `{"stalled": false}` (see `base::disk_stall`). `/admin/partition {"peers": [N, ...], "direction": "both" | "out" |
//! "in"}` drops this node's messages to and from those peers, only to them, or only from them.

use hyper::body::Incoming;
use hyper::Method;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::http::ask::ask;
use crate::http::body::json_body;
use crate::http::ctx::{check_query, leader_only, method_not_allowed, not_leader, Ctx};
use crate::http::reply::{error, reply, Reply};
use crate::peer::dial::{dial, DialError};
use crate::peer::members::{is_member, Change, Op};
use crate::raft::requests::{MembersReply, Request};
use crate::raft::status::Status;

/// The request must carry the node's admin token (`Authorization: Bearer <token>`, the scheme
/// name in any case, as RFC 7235 says). With `faults`, fault injection must be on as well.
pub fn authorize(c: &Ctx<'_>, faults: bool) -> Result<(), Reply> {
    let opts = &c.app.opts;
    let Some(token) = opts.admin_token.as_ref() else {
        return Err(error(
            404,
            "admin_disabled",
            "start the node with --admin-token-file to use /admin",
        ));
    };
    if faults && !opts.fault_injection {
        return Err(error(
            404,
            "fault_injection_disabled",
            "start the node with --fault-injection and --admin-token-file",
        ));
    }
    let presented = c
        .parts
        .headers
        .get("authorization")
        .map(|v| v.as_bytes())
        .and_then(|v| v.split_at_checked(7))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|(_, t)| t);
    if presented.is_some_and(|p| token.matches(p)) {
        return Ok(());
    }
    c.app.metrics.admin_denied.inc();
    Err(error(
        401,
        "unauthorized",
        "/admin needs Authorization: Bearer <token>",
    )
    .with_header("www-authenticate", "Bearer"))
}

/// `/admin/<what>`: membership and leadership (the token), faults (the token and
/// `--fault-injection`).
pub async fn route(c: &Ctx<'_>, body: Incoming) -> Result<Reply, Reply> {
    let what = &c.parts.uri.path()[7..];
    if c.parts.method != Method::POST {
        return Err(method_not_allowed(&c.parts.method, "/admin/*", "POST"));
    }
    check_query(c, &[])?;
    match what {
        "members" => {
            authorize(c, false)?;
            leader_only(c)?;
            let expected = "{\"changes\": [{\"op\", \"id\", \"peer\", \"http\"}, ...]}";
            members(c, json_body(body, c, expected).await?).await
        }
        "transfer" => {
            authorize(c, false)?;
            leader_only(c)?;
            let to = json_body(body, c, "{\"to\": N}")
                .await?
                .get("to")
                .and_then(Value::as_u64)
                .ok_or_else(|| error(400, "bad_json", "expected {\"to\": N}"))?;
            transfer(c, to)
        }
        "partition" | "heal" | "clock" | "delay" | "stall-disk" | "crash-after-cut" => {
            authorize(c, true)?;
            let body = if what == "heal" {
                Value::Null
            } else {
                json_body(body, c, "a JSON object").await?
            };
            faults(c, what, body)
        }
        _ => Err(error(404, "not_found", format!("no admin action {what}"))),
    }
}

/// `POST /admin/transfer {"to": N}`: 202 once asked of raft, if `N` is a voter of group 0's
/// configuration other than this node; 200 if this node is `N` (it leads already); 409
/// `transfer_refused` for a node that is not a voter (raft-rs ignores a transfer to a learner
/// or a stranger, so a 202 would promise what never happens).
fn transfer(c: &Ctx<'_>, to: u64) -> Result<Reply, Reply> {
    let voters = c.app.status().conf.voters;
    if to == c.app.opts.id {
        return Ok(reply(
            200,
            json!({"transfer_to": to, "already_leader": true}),
        ));
    }
    if !voters.contains(&to) {
        let detail = format!("node {to} is not a voter of this cluster (voters: {voters:?})");
        return Err(error(409, "transfer_refused", detail));
    }
    c.app
        .first()
        .send(Request::Transfer { to })
        .map_err(|_| error(503, "overloaded", "the raft thread's queue is full"))?;
    Ok(reply(202, json!({"transfer_to": to})))
}

/// `POST /admin/members {"changes": [{"op": "add_voter" | "add_learner" | "remove", "id": N,
/// "peer": "host:port", "http": "host:port", "etcd": "host:port"}, ...]}` (`etcd`: the node's
/// etcd API address, if it serves one).
async fn members(c: &Ctx<'_>, body: Value) -> Result<Reply, Reply> {
    let changes: Vec<Change> = body
        .get("changes")
        .cloned()
        .ok_or_else(|| error(400, "bad_json", "expected {\"changes\": [...]}"))
        .and_then(|v| {
            serde_json::from_value(v).map_err(|e| error(400, "bad_change", e.to_string()))
        })?;
    check_new_nodes(c, &changes).await?;
    let (tx, rx) = oneshot::channel();
    let req = Request::Members { changes, reply: tx };
    Ok(match ask(c.app.first(), req, rx).await? {
        MembersReply::Done { conf, index } => {
            let s = Status {
                conf,
                ..Status::default()
            };
            let mut body = s.conf_json();
            body["index"] = index.into();
            // Group 0 has the change; every other group's leader moves it there next.
            body["groups"] = c.app.groups.count().into();
            reply(200, body)
        }
        MembersReply::Invalid(e) => error(400, "bad_change", e.to_string()),
        MembersReply::Refused(why) => error(409, "change_refused", why),
        MembersReply::NotLeader { leader } => not_leader(c, leader),
        MembersReply::Unknown(why) => error(503, "outcome_unknown", why),
    })
}

/// Dial every node the changes add that is not a member yet, at the peer address given: one
/// that answers with a certificate this node does not trust (another CA, another id) is refused
/// with 409 `peer_untrusted`, before raft hears of it. One that does not answer is added all
/// the same (a node may be added before it starts), as is every node with `--insecure-peers`.
async fn check_new_nodes(c: &Ctx<'_>, changes: &[Change]) -> Result<(), Reply> {
    let Some(tls) = c.app.peer_tls.as_ref() else {
        return Ok(());
    };
    let conf = c.app.status().conf;
    let adds = changes.iter().filter(|ch| ch.op != Op::Remove);
    for ch in adds.filter(|ch| !is_member(&conf, ch.id)) {
        let Some(addr) = &ch.peer else { continue };
        if let Err(e @ DialError::Untrusted(_)) = dial(ch.id, addr, Some(tls)).await {
            let detail = format!("node {} at {addr}: {}", ch.id, e.explain());
            return Err(error(409, "peer_untrusted", detail));
        }
    }
    Ok(())
}

fn faults(c: &Ctx<'_>, what: &str, body: Value) -> Result<Reply, Reply> {
    let app = c.app;
    Ok(match what {
        "partition" => {
            let peers = body
                .get("peers")
                .and_then(Value::as_array)
                .ok_or_else(|| error(400, "bad_json", "expected {\"peers\": [N, ...]}"))?;
            let flag = match body.get("direction").and_then(Value::as_str) {
                None | Some("both") => 0,
                Some("out") => crate::peer::transport::ONLY_OUT,
                Some("in") => crate::peer::transport::ONLY_IN,
                Some(d) => {
                    return Err(error(
                        400,
                        "bad_json",
                        format!("direction {d:?}: use both, out or in"),
                    ))
                }
            };
            let ids = peers
                .iter()
                .filter_map(Value::as_u64)
                .filter(|&id| id < flag.max(1 << 60));
            app.blocked.write().extend(ids.map(|id| id | flag));
            reply(200, json!({"blocked": *app.blocked.read()}))
        }
        "heal" => {
            app.blocked.write().clear();
            reply(200, json!({"blocked": []}))
        }
        "crash-after-cut" => {
            app.disk_stall.arm_crash_after_cut();
            reply(200, json!({"crash_after_cut": true}))
        }
        "stall-disk" => {
            let stalled = body
                .get("stalled")
                .and_then(Value::as_bool)
                .ok_or_else(|| error(400, "bad_json", "expected {\"stalled\": true|false}"))?;
            app.disk_stall.set(stalled);
            reply(200, json!({"disk_stalled": stalled}))
        }
        "delay" => {
            let ms = body
                .get("ms")
                .and_then(Value::as_u64)
                .filter(|&ms| ms <= 60_000)
                .ok_or_else(|| error(400, "bad_json", "expected {\"ms\": N}, N at most 60000"))?;
            let (delay, name) = match body.get("direction").and_then(Value::as_str) {
                None | Some("out") => (&app.peer_delay_ms, "peer_delay_ms"),
                Some("in") => (&app.peer_delay_in_ms, "peer_delay_in_ms"),
                Some(d) => {
                    let detail = format!("direction {d:?}: use out (the default) or in");
                    return Err(error(400, "bad_json", detail));
                }
            };
            delay.store(ms, std::sync::atomic::Ordering::Relaxed);
            reply(200, json!({ name: ms }))
        }
        _ => {
            let rate = body
                .get("rate")
                .and_then(Value::as_f64)
                .ok_or_else(|| error(400, "bad_json", "expected {\"rate\": F}"))?;
            app.first()
                .clock
                .set_rate(rate)
                .map_err(|e| error(400, "bad_rate", e))?;
            reply(200, json!({"rate": rate}))
        }
    })
}
