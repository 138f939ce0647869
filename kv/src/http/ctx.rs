//! A request as the routes see it ([`Ctx`]), and the answers every route shares: 405, a bad name,
//! and the redirect to the leader (any node answers, see `routes`).

use hyper::http::request::Parts;
use hyper::Method;
use serde_json::json;

use crate::base::conns::Guard;
use crate::http::reply::{error, error_with, Reply};
use crate::node::app::App;
use crate::raft::shared::Shared;
use crate::state::keys::{self, NameError};
use crate::state::kv_state::KvState;

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

/// Refuse a parameter the route does not take, or one given twice: 400 `bad_query` naming it.
/// (A misspelt `?raed=lease` would otherwise read in the default mode, and of `?read=lease&read=
/// index` only the first would count, both silently.)
pub fn check_query(c: &Ctx<'_>, takes: &[&str]) -> Result<(), Reply> {
    for (i, (k, _)) in c.query.iter().enumerate() {
        let detail = if !takes.contains(&k.as_str()) {
            let takes = match takes {
                [] => "no parameters".to_string(),
                t => format!("only {}", t.join(", ")),
            };
            format!("unknown parameter {k:?}: this route takes {takes}")
        } else if c.query[..i].iter().any(|(p, _)| p == k) {
            format!("parameter {k:?} given more than once")
        } else {
            continue;
        };
        return Err(error_with(
            400,
            "bad_query",
            detail,
            json!({"parameter": k}),
        ));
    }
    Ok(())
}

/// Proceed on group 0's leader; elsewhere, the redirect to it (or 503 when no leader is known).
pub fn leader_only(c: &Ctx<'_>) -> Result<(), Reply> {
    leader_only_in(c, c.app.first())
}

/// Proceed on group `g`'s leader; elsewhere, the redirect to it (or 503 when no leader is known).
pub fn leader_only_in(c: &Ctx<'_>, g: &Shared<KvState>) -> Result<(), Reply> {
    match g.leadership.get() {
        (true, _) => Ok(()),
        (false, leader) => Err(not_leader(c, leader)),
    }
}

/// This node does not lead: 307 to the leader's address, or 503 when no leader is known, when
/// its address is not known here, or when this node has not heard from it lately (see
/// [`App::live_leader`]): a redirect never points at a node this one has lost touch with.
pub fn not_leader(c: &Ctx<'_>, leader: Option<u64>) -> Reply {
    let hint = LeaderHint::of(c, leader);
    let more = hint.json();
    let LeaderHint { heard, live, http } = hint;
    match (live, &http) {
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
        (None, _) => no_leader(leader, heard, more),
    }
}

/// The leader hint every answer that sends a client elsewhere carries: `leader_id` and
/// `leader_http` (both null unless this node heard from that leader lately, see
/// [`App::live_leader`](crate::node::app::App::live_leader)) and `last_heard_ms`.
pub fn leader_hint(c: &Ctx<'_>, leader: Option<u64>) -> serde_json::Value {
    LeaderHint::of(c, leader).json()
}

/// What this node knows of `leader`, read once for one answer.
struct LeaderHint {
    /// How long ago this node last heard from it.
    heard: Option<u64>,
    /// It, if heard from lately.
    live: Option<u64>,
    /// Its HTTP address, if live and known.
    http: Option<String>,
}

impl LeaderHint {
    fn of(c: &Ctx<'_>, leader: Option<u64>) -> LeaderHint {
        let heard = leader.and_then(|id| c.app.heard.ago_ms(id));
        let live = c.app.live_leader(leader);
        let http = live.and_then(|id| c.app.http_of(id));
        LeaderHint { heard, live, http }
    }

    fn json(&self) -> serde_json::Value {
        json!({"leader_id": self.live, "leader_http": self.http, "last_heard_ms": self.heard})
    }
}

/// 503 `no_leader`: none is known, or the one known has not been heard from lately.
fn no_leader(leader: Option<u64>, heard: Option<u64>, more: serde_json::Value) -> Reply {
    let detail = match (leader, heard) {
        (Some(id), Some(ms)) => format!(
            "node {id} led, but nothing came from it for {ms} ms: an election may be under way; \
             retry shortly"
        ),
        _ => "no leader is known yet; retry shortly".to_string(),
    };
    error_with(503, "no_leader", detail, more).with_header("retry-after", "1")
}
