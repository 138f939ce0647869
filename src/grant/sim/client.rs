//! A simulated client: contends for the lease and for lock `L` (under a session), renews both
//! through the [`Renewal`] core, and believes in each only until that core says it is lost.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::net::{Req, Resp};
use crate::clock::{Clock, SimClock};
use crate::grant::event::{LeaseEvent, TransportError};
use crate::grant::holder::LeaseHolder;
use crate::grant::renewal::{RenewStep, Renewal};
use crate::grant::server::Grant;
use crate::grant::session::{SessionError, SessionId};
use crate::grant::GrantConfig;

const MS: u64 = 1_000_000;
/// A client gives up on an acquisition, a session or a lock request unanswered for this long.
const GIVE_UP_NS: u64 = 500 * MS;
/// It waits less for the answer to a release or an unlock: it stopped using the lease before
/// asking, and it may soon want it again.
const GIVE_UP_RELEASE_NS: u64 = 100 * MS;

/// A held lease or session, renewed by the [`Renewal`] core through the simulated transport.
struct Renewing {
    renewal: Renewal,
    /// The attempt in flight: (request id, deadline on the client's clock).
    attempt: Option<(u64, u64)>,
}

fn is_lost(e: &LeaseEvent) -> bool {
    matches!(e, LeaseEvent::Lost { .. })
}

impl Renewing {
    /// Drive the core at `now_ns`, queueing requests in `out`. False once the owner learns of a loss.
    fn drive(
        &mut self,
        now_ns: u64,
        honors_deadlines: bool,
        ids: &mut u64,
        req: impl Fn(u64, u64) -> Req,
        out: &mut Vec<(u64, Req)>,
    ) -> bool {
        loop {
            if let Some((_, deadline_ns)) = self.attempt {
                if honors_deadlines && now_ns >= deadline_ns {
                    self.attempt = None; // the transport gave up at its deadline
                    let gave_up = Err(TransportError::DeadlineMissed);
                    if is_lost(&self.renewal.on_answer(gave_up, now_ns)) {
                        return false;
                    }
                }
            }
            match self.renewal.poll(now_ns) {
                RenewStep::Send {
                    token,
                    term_ms,
                    deadline_ns,
                } => {
                    *ids += 1;
                    self.attempt = Some((*ids, deadline_ns));
                    out.push((*ids, req(token, term_ms)));
                }
                RenewStep::Event(e) if is_lost(&e) => return false,
                RenewStep::Event(_) => {}
                RenewStep::Wait { .. } => return true,
            }
        }
    }

    /// An answer to request `req_id`; stale answers are dropped. False once the lease is lost.
    fn answer(&mut self, req_id: u64, result: Result<Grant, TransportError>, now_ns: u64) -> bool {
        if self.attempt.map(|a| a.0) != Some(req_id) {
            return true;
        }
        self.attempt = None;
        !is_lost(&self.renewal.on_answer(result, now_ns))
    }
}

/// A request awaiting its answer.
#[derive(Debug, Clone, Copy)]
struct Ask {
    req_id: u64,
    /// Read before the request left.
    sent_at_ns: u64,
    /// The term or TTL asked for (0 when none).
    term_ms: u64,
    /// How long the client waits for the answer.
    give_up_ns: u64,
}

impl Ask {
    /// Queue `req` under a fresh request id.
    fn send(ids: &mut u64, now_ns: u64, term_ms: u64, req: Req, out: &mut Vec<(u64, Req)>) -> Ask {
        let give_up_ns = match req {
            Req::Release { .. } | Req::Unlock { .. } => GIVE_UP_RELEASE_NS,
            _ => GIVE_UP_NS,
        };
        *ids += 1;
        out.push((*ids, req));
        Ask {
            req_id: *ids,
            sent_at_ns: now_ns,
            term_ms,
            give_up_ns,
        }
    }

    /// The client stops waiting for the answer.
    fn timed_out(&self, now_ns: u64) -> bool {
        now_ns >= self.sent_at_ns + self.give_up_ns
    }

    fn answers(&self, req_id: u64) -> bool {
        self.req_id == req_id
    }
}

enum LeaseSide {
    Idle {
        next_try_ns: u64,
    },
    Acquiring(Ask),
    Held(Renewing),
    /// A release went out (naming the holding's token); wait a while for its answer.
    Releasing(Ask),
}

enum LockSide {
    Free {
        next_try_ns: u64,
    },
    Asking(Ask),
    /// Held under this token.
    Held(u64),
    /// An unlock went out (naming the token); wait a while for its answer.
    Unlocking(Ask),
}

enum SessionSide {
    Idle {
        next_try_ns: u64,
    },
    Starting(Ask),
    Live {
        sid: SessionId,
        ttl_ms: u64,
        renewing: Renewing,
        lock: LockSide,
    },
}

/// One client. Its beliefs are what its owner acts on.
pub(super) struct Client {
    /// Its index among the clients.
    index: u64,
    /// Bumped by a crash: each incarnation asks under a [`ClientId`](crate::grant::ClientId) of
    /// its own. (A release that went unanswered needs none: it names its holding's token.)
    incarnation: u64,
    pub(super) clock: SimClock,
    lease: LeaseSide,
    session: SessionSide,
    /// The last request id used; never reused, even across a crash.
    next_req: u64,
    /// Requests decided while handling an answer, sent at the next step.
    outbox: Vec<(u64, Req)>,
    /// Times the owner was told its lease or session was lost.
    pub(super) losses: u64,
    /// Whether its transport gives up at the deadline (otherwise it waits for the answer).
    honors_deadlines: bool,
    /// It gives back a held lease or lock with a chance of one in this many per ms: short
    /// critical sections (300) or long ones (5,000).
    release_one_in: u32,
    config: GrantConfig,
    /// NEGATIVE CONTROL: renewals decide the loss only when the transport returns.
    loss_only_when_the_transport_returns: bool,
}

fn backoff(rng: &mut ChaCha8Rng, now_ns: u64) -> u64 {
    now_ns + rng.gen_range(10..=400) * MS
}

impl Client {
    pub(super) fn new(
        index: u64,
        clock: SimClock,
        honors_deadlines: bool,
        release_one_in: u32,
        config: GrantConfig,
        loss_only_when_the_transport_returns: bool,
    ) -> Self {
        Client {
            index,
            incarnation: 0,
            clock,
            lease: LeaseSide::Idle { next_try_ns: 0 },
            session: SessionSide::Idle { next_try_ns: 0 },
            next_req: 0,
            outbox: Vec::new(),
            losses: 0,
            honors_deadlines,
            release_one_in,
            config,
            loss_only_when_the_transport_returns,
        }
    }

    fn renewing(&self, holder: LeaseHolder, term_ms: u64) -> Renewing {
        let mut renewal = Renewal::new(holder, term_ms).expect("terms of 300 ms or more");
        if self.loss_only_when_the_transport_returns {
            renewal = renewal.control_loss_only_when_the_transport_returns();
        }
        Renewing {
            renewal,
            attempt: None,
        }
    }

    /// Its [`ClientId`](crate::grant::ClientId) now: a new one per incarnation.
    pub(super) fn id(&self) -> u64 {
        self.incarnation * 1_000 + self.index + 1
    }

    /// Whether the owner believes it holds the lease now.
    pub(super) fn believes_lease(&self) -> bool {
        matches!(self.lease, LeaseSide::Held(_))
    }

    /// The session the owner believes is live now.
    pub(super) fn believed_session(&self) -> Option<SessionId> {
        match &self.session {
            SessionSide::Live { sid, .. } => Some(*sid),
            _ => None,
        }
    }

    /// The session under which the owner believes it holds lock `L` now.
    pub(super) fn believed_lock(&self) -> Option<SessionId> {
        match &self.session {
            SessionSide::Live {
                sid,
                lock: LockSide::Held(_),
                ..
            } => Some(*sid),
            _ => None,
        }
    }

    /// Crash and come back after `down_ns` of local time, remembering nothing.
    pub(super) fn crash(&mut self, down_ns: u64) {
        let next_try_ns = self.clock.now_ns() + down_ns;
        self.incarnation += 1;
        self.outbox.clear();
        self.lease = LeaseSide::Idle { next_try_ns };
        self.session = SessionSide::Idle { next_try_ns };
    }

    /// One step: renew, give up, or start something. Returns the requests to send.
    pub(super) fn step(&mut self, rng: &mut ChaCha8Rng) -> Vec<(u64, Req)> {
        let mut out = std::mem::take(&mut self.outbox);
        self.step_lease(rng, &mut out);
        self.step_session(rng, &mut out);
        out
    }

    fn step_lease(&mut self, rng: &mut ChaCha8Rng, out: &mut Vec<(u64, Req)>) {
        let now_ns = self.clock.now_ns();
        match &mut self.lease {
            LeaseSide::Idle { next_try_ns } if now_ns >= *next_try_ns => {
                let term_ms = rng.gen_range(300..=self.config.max_term_ms);
                let req = Req::Acquire { term_ms };
                let ask = Ask::send(&mut self.next_req, now_ns, term_ms, req, out);
                self.lease = LeaseSide::Acquiring(ask);
            }
            LeaseSide::Acquiring(ask) if ask.timed_out(now_ns) => {
                self.lease = LeaseSide::Idle {
                    next_try_ns: backoff(rng, now_ns),
                };
            }
            LeaseSide::Held(r) if rng.gen_ratio(1, self.release_one_in) => {
                // Release: stop believing first, then tell the grantor which holding.
                let token = r.renewal.holder().held_token().expect("held");
                let req = Req::Release { token };
                let ask = Ask::send(&mut self.next_req, now_ns, 0, req, out);
                self.lease = LeaseSide::Releasing(ask);
            }
            LeaseSide::Releasing(ask) if ask.timed_out(now_ns) => {
                // Unanswered: it may still arrive, late or twice, but it names this holding only.
                self.lease = LeaseSide::Idle {
                    next_try_ns: backoff(rng, now_ns),
                };
            }
            LeaseSide::Held(r) => {
                let renew = |token, term_ms| Req::Renew { token, term_ms };
                let held = r.drive(
                    now_ns,
                    self.honors_deadlines,
                    &mut self.next_req,
                    renew,
                    out,
                );
                self.lose_lease_unless(held, now_ns, rng);
            }
            _ => {}
        }
    }

    fn step_session(&mut self, rng: &mut ChaCha8Rng, out: &mut Vec<(u64, Req)>) {
        let now_ns = self.clock.now_ns();
        match &mut self.session {
            SessionSide::Idle { next_try_ns } if now_ns >= *next_try_ns => {
                let ttl_ms = rng.gen_range(300..=self.config.max_term_ms);
                let req = Req::Session { ttl_ms };
                let ask = Ask::send(&mut self.next_req, now_ns, ttl_ms, req, out);
                self.session = SessionSide::Starting(ask);
            }
            SessionSide::Starting(ask) if ask.timed_out(now_ns) => {
                self.session = SessionSide::Idle {
                    next_try_ns: backoff(rng, now_ns),
                };
            }
            SessionSide::Live {
                sid,
                ttl_ms,
                renewing,
                lock,
            } => {
                let (sid, ttl_ms, honors) = (*sid, *ttl_ms, self.honors_deadlines);
                let keepalive = |_, _| Req::KeepAlive { sid, ttl_ms };
                if !renewing.drive(now_ns, honors, &mut self.next_req, keepalive, out) {
                    self.losses += 1;
                    self.session = SessionSide::Idle {
                        next_try_ns: backoff(rng, now_ns),
                    };
                    return;
                }
                let release_one_in = self.release_one_in;
                step_lock(
                    lock,
                    sid,
                    now_ns,
                    rng,
                    release_one_in,
                    &mut self.next_req,
                    out,
                );
            }
            _ => {}
        }
    }

    /// The grantor's answer to request `req_id`.
    pub(super) fn on_resp(&mut self, req_id: u64, resp: Resp, rng: &mut ChaCha8Rng) {
        let now_ns = self.clock.now_ns();
        match resp {
            Resp::Grant(result) => {
                self.on_lease_answer(req_id, result.clone(), now_ns, rng);
                self.on_keepalive_answer(req_id, result, now_ns, rng);
            }
            Resp::Session(result) => self.on_session_answer(req_id, result, now_ns, rng),
            Resp::Lock(result) => self.on_lock_answer(req_id, result, now_ns, rng),
            Resp::Done => self.on_done(req_id, now_ns, rng),
        }
    }

    fn on_lock_answer(
        &mut self,
        req_id: u64,
        result: Result<u64, SessionError>,
        now_ns: u64,
        rng: &mut ChaCha8Rng,
    ) {
        let SessionSide::Live { sid, lock, .. } = &mut self.session else {
            return;
        };
        if !matches!(lock, LockSide::Asking(ask) if ask.answers(req_id)) {
            return;
        }
        *lock = match result {
            Ok(token) => LockSide::Held(token),
            // Our session holds it (a lost answer, or a late copy): not ours to use; unlock it.
            Err(SessionError::LockHeld {
                token: Some(token), ..
            }) => {
                let req = Req::Unlock { sid: *sid, token };
                LockSide::Unlocking(Ask::send(
                    &mut self.next_req,
                    now_ns,
                    0,
                    req,
                    &mut self.outbox,
                ))
            }
            Err(_) => LockSide::Free {
                next_try_ns: backoff(rng, now_ns),
            },
        };
    }

    /// A release or unlock was answered. A client that gave something back often wants it again
    /// soon (the next job): it asks again within 50 ms, before the others' backoff ends.
    fn on_done(&mut self, req_id: u64, now_ns: u64, rng: &mut ChaCha8Rng) {
        let next_try_ns = now_ns + rng.gen_range(0..=50) * MS;
        if matches!(&self.lease, LeaseSide::Releasing(ask) if ask.answers(req_id)) {
            self.lease = LeaseSide::Idle { next_try_ns };
        }
        if let SessionSide::Live { lock, .. } = &mut self.session {
            if matches!(lock, LockSide::Unlocking(ask) if ask.answers(req_id)) {
                *lock = LockSide::Free { next_try_ns };
            }
        }
    }

    fn on_lease_answer(
        &mut self,
        req_id: u64,
        result: Result<Grant, TransportError>,
        now_ns: u64,
        rng: &mut ChaCha8Rng,
    ) {
        match &mut self.lease {
            LeaseSide::Acquiring(ask) if ask.answers(req_id) => {
                let ask = *ask;
                self.lease = match result {
                    Ok(grant) => {
                        let mut holder = LeaseHolder::new(self.config);
                        holder.on_grant(ask.sent_at_ns, grant);
                        LeaseSide::Held(self.renewing(holder, ask.term_ms))
                    }
                    Err(_) => LeaseSide::Idle {
                        next_try_ns: backoff(rng, now_ns),
                    },
                };
            }
            LeaseSide::Held(r) => {
                let held = r.answer(req_id, result, now_ns);
                self.lose_lease_unless(held, now_ns, rng);
            }
            _ => {}
        }
    }

    /// The owner learned its lease is lost (unless `held`): back to idle.
    fn lose_lease_unless(&mut self, held: bool, now_ns: u64, rng: &mut ChaCha8Rng) {
        if !held {
            self.losses += 1;
            self.lease = LeaseSide::Idle {
                next_try_ns: backoff(rng, now_ns),
            };
        }
    }

    fn on_keepalive_answer(
        &mut self,
        req_id: u64,
        result: Result<Grant, TransportError>,
        now_ns: u64,
        rng: &mut ChaCha8Rng,
    ) {
        if let SessionSide::Live { renewing, .. } = &mut self.session {
            if !renewing.answer(req_id, result, now_ns) {
                self.losses += 1;
                self.session = SessionSide::Idle {
                    next_try_ns: backoff(rng, now_ns),
                };
            }
        }
    }

    fn on_session_answer(
        &mut self,
        req_id: u64,
        result: Result<SessionId, SessionError>,
        now_ns: u64,
        rng: &mut ChaCha8Rng,
    ) {
        let SessionSide::Starting(ask) = self.session else {
            return;
        };
        if !ask.answers(req_id) {
            return;
        }
        let (sent_at_ns, ttl_ms) = (ask.sent_at_ns, ask.term_ms);
        self.session = match result {
            Ok(sid) => {
                let mut holder = LeaseHolder::new(self.config);
                let grant = Grant {
                    token: sid.0,
                    term_ms: ttl_ms,
                };
                holder.on_grant(sent_at_ns, grant);
                SessionSide::Live {
                    sid,
                    ttl_ms,
                    renewing: self.renewing(holder, ttl_ms),
                    lock: LockSide::Free {
                        next_try_ns: backoff(rng, now_ns),
                    },
                }
            }
            Err(_) => SessionSide::Idle {
                next_try_ns: backoff(rng, now_ns),
            },
        };
    }
}

/// Lock `L` under a live session: ask, give up, or release at random.
fn step_lock(
    lock: &mut LockSide,
    sid: SessionId,
    now_ns: u64,
    rng: &mut ChaCha8Rng,
    release_one_in: u32,
    ids: &mut u64,
    out: &mut Vec<(u64, Req)>,
) {
    match lock {
        LockSide::Free { next_try_ns } if now_ns >= *next_try_ns => {
            *lock = LockSide::Asking(Ask::send(ids, now_ns, 0, Req::Lock { sid }, out));
        }
        LockSide::Asking(ask) | LockSide::Unlocking(ask) if ask.timed_out(now_ns) => {
            // An unanswered unlock may still arrive, late or twice: it names this lock's token only.
            *lock = LockSide::Free {
                next_try_ns: backoff(rng, now_ns),
            };
        }
        LockSide::Held(token) if rng.gen_ratio(1, release_one_in) => {
            // Unlock: stop believing first, then tell the grantor which lock.
            let req = Req::Unlock { sid, token: *token };
            *lock = LockSide::Unlocking(Ask::send(ids, now_ns, 0, req, out));
        }
        _ => {}
    }
}
