//! The answer to a write's outcome: its result, or the refusal as an error.

use serde_json::json;

use crate::http::reply::{error, error_with, reply, Reply};
use crate::state::command::{Outcome, Refusal};

/// The answer to a write's outcome.
pub fn outcome_reply(o: Outcome) -> Reply {
    match o {
        Outcome::Revision(r) => reply(200, json!({"revision": r})),
        Outcome::Session(id) => reply(200, json!({"id": id})),
        Outcome::Token(t) => reply(200, json!({"token": t})),
        Outcome::KeepAlive { refreshed, unknown } => {
            reply(200, json!({"refreshed": refreshed, "unknown": unknown}))
        }
        Outcome::Revoked => reply(200, json!({"revoked": true})),
        Outcome::Unlocked => reply(200, json!({"unlocked": true})),
        Outcome::Housekeeping => reply(200, json!({})),
        Outcome::Refused(r) => refusal_reply(r),
        // Proposed only by the etcd front end, which answers them itself.
        Outcome::Etcd(_) | Outcome::EtcdCompacted(_) | Outcome::Alarms(_) => {
            error(500, "internal", "an etcd API outcome reached the HTTP API")
        }
    }
}

fn refusal_reply(r: Refusal) -> Reply {
    match r {
        Refusal::NotFound => error(404, "not_found", "no such key"),
        Refusal::UnknownSession(id) => error_with(
            404,
            "unknown_session",
            format!("no live session {id}"),
            json!({"session": id}),
        ),
        Refusal::LockHeld { holder, token } => error_with(
            409,
            "lock_held",
            match token {
                Some(_) => format!("session {holder}, the asking one, holds the lock already: the token is not a grant; unlock with it and lock again"),
                None => format!("session {holder} holds the lock"),
            },
            json!({"holder": holder, "token": token, "granted": false}),
        ),
        Refusal::StaleFence { token, current } => error_with(
            409,
            "stale_fence",
            format!("token {token} is not the lock's current token {current}"),
            json!({"token": token, "current": current}),
        ),
        Refusal::LockNotHeld { lock } => error_with(
            409,
            "lock_not_held",
            "the lock is not held (by this session)",
            json!({"lock": lock}),
        ),
        Refusal::BadTtl { ttl_ms, max_ttl_ms } => error_with(
            400,
            "bad_ttl",
            format!("ttl_ms must be 1 to {max_ttl_ms}"),
            json!({"ttl_ms": ttl_ms, "max_ttl_ms": max_ttl_ms}),
        ),
        Refusal::NoSpace => error(
            507,
            "state_full",
            "etcd's NOSPACE alarm is raised: free space (delete, compact), then disarm it",
        ),
        Refusal::BadName(why) => error(400, "bad_key", why),
        Refusal::Undecodable(why) => error(400, "bad_command", why),
        Refusal::NotReady => error(
            503,
            "not_ready",
            "new leader; sessions not yet on its clock, retry",
        )
        .with_header("retry-after", "1"),
    }
}
