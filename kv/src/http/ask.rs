//! Requests to the raft thread: send one and wait for its answer, and propose a write with its
//! bytes held in the in-flight budget.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::base::conns::Phase;
use crate::http::ctx::{not_leader, Ctx};
use crate::http::outcome::outcome_reply;
use crate::http::reply::{error, Reply};
use crate::raft::requests::{Request, WriteReply};
use crate::raft::shared::Shared;
use crate::state::command::Command;
use crate::state::kv_machine::KvCommand;
use crate::state::kv_state::KvState;

/// How long a request waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);

/// What a write costs in the in-flight budget besides its value.
const WRITE_OVERHEAD_BYTES: u64 = 2048;

/// Send `req` for group `g` to the raft thread and wait for its answer.
pub async fn ask<T>(
    g: &Shared<KvState>,
    req: Request<KvState>,
    rx: oneshot::Receiver<T>,
) -> Result<T, Reply> {
    match g.send(req) {
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

/// Bytes for a write of a `len`-byte value to group `g`, from the in-flight budget (503 when used
/// up), and room in the state for it (507 when full). Each group may hold an equal share of
/// `--quota-backend-bytes` (keys spread evenly over the groups; summing every group's size on every
/// write would cost a pass over all of them).
pub fn reserve(c: &Ctx<'_>, g: &Shared<KvState>, len: u64) -> Result<Ticket, Reply> {
    let app = c.app;
    // etcd's keyspace (its history included) shares the state's budget.
    let state = g.reader.bytes();
    let share = app.opts.quota_backend_bytes / u64::from(app.groups.count());
    if len > 0 && state + app.inflight.used() + len > share {
        let detail = match app.groups.count() {
            1 => format!("the store holds {state} bytes of at most {share}"),
            n => format!("the key's group holds {state} bytes of its share {share} (1/{n})"),
        };
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

/// Propose `cmd` with `value` in group 0 (sessions and locks) and wait for it to apply.
pub async fn write(
    c: &Ctx<'_>,
    cmd: Command,
    value: Vec<u8>,
    ticket: Option<Ticket>,
) -> Result<Reply, Reply> {
    write_in(c, c.app.first(), cmd, value, ticket).await
}

/// Propose `cmd` with `value` in group `g` and wait for it to apply.
pub async fn write_in(
    c: &Ctx<'_>,
    g: &Shared<KvState>,
    cmd: Command,
    value: Vec<u8>,
    ticket: Option<Ticket>,
) -> Result<Reply, Reply> {
    let ticket = match ticket {
        Some(t) => t,
        None => reserve(c, g, 0)?,
    };
    let t = Instant::now();
    c.conn.set(Phase::Waiting);
    let (tx, rx) = oneshot::channel();
    let req = Request::Propose {
        cmd: KvCommand { cmd, value },
        reply: tx,
        ticket: Some(ticket),
        sent_at: Instant::now(),
    };
    Ok(match ask(g, req, rx).await? {
        WriteReply::Done(outcome) => {
            c.app
                .metrics
                .write_seconds
                .observe(t.elapsed().as_secs_f64());
            outcome_reply(outcome)
        }
        WriteReply::Refused(outcome) => outcome_reply(outcome),
        WriteReply::NotLeader { leader } => not_leader(c, leader),
        WriteReply::NotApplied(why) => error(503, "not_applied", format!("{why}; safe to retry")),
        WriteReply::Unknown(why) => error(503, "outcome_unknown", why),
    })
}
