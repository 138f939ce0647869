//! Requests to the raft thread: send one and wait for its answer, and propose a write with its
//! bytes held in the in-flight budget.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::base::conns::Phase;
use crate::http::app::App;
use crate::http::ctx::{not_leader, Ctx};
use crate::http::outcome::outcome_reply;
use crate::http::reply::{error, Reply};
use crate::raft::requests::{Request, WriteReply};
use crate::state::command::Command;
use crate::state::kv_machine::KvCommand;
use crate::state::kv_state::KvState;

/// How long a request waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);

/// What a write costs in the in-flight budget besides its value.
const WRITE_OVERHEAD_BYTES: u64 = 2048;

/// Send `req` to the raft thread and wait for its answer.
pub async fn ask<T>(
    app: &App,
    req: Request<KvState>,
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
        sent_at: Instant::now(),
    };
    Ok(match ask(c.app, req, rx).await? {
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
