//! The simulated grantor: one lease ([`LeaseServer`]) and lock `L` under sessions ([`Sessions`]),
//! on a clock of its own. A restart comes back on a new clock (another process, or another
//! replica), from what was persisted or replicated.
//!
//! The lease's [`GrantorRecord`] is persisted exactly as its docs allow and no more: written
//! before the answer of a grant or renewal that changed it leaves, never for a release (so a
//! restart may find a holder that had released), and now and then at a random moment. The
//! sessions are replicated (their image at the crash, as a raft log would hold them), with the
//! remaining durations of the last checkpoint, taken every 500 ms on the grantor's clock.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::net::{Req, Resp};
use super::GrantSimControls;
use crate::clock::{Clock, SimClock};
use crate::grant::event::TransportError;
use crate::grant::server::{AcquireError, Grant, GrantorRecord, LeaseServer};
use crate::grant::session::{Sessions, SessionsCheckpoint, SessionsImage};
use crate::grant::GrantConfig;

/// The one lock the clients contend for.
pub(super) const LOCK: &str = "L";

/// How often the grantor checkpoints its sessions, on its own clock.
pub(super) const CHECKPOINT_NS: u64 = 500_000_000;

/// The largest clock reading a simulated clock starts at: 60 days.
pub(super) const MAX_START_NS: u64 = 60 * 86_400 * 1_000_000_000;

/// A clock reading anything up to 60 days, with a rate within `1 ± ρ`.
pub(super) fn random_clock(rng: &mut ChaCha8Rng, drift_ppm: u64) -> SimClock {
    let rho = drift_ppm as i64;
    SimClock::new(rng.gen_range(0..=MAX_START_NS), rng.gen_range(-rho..=rho))
}

pub(super) struct Grantor {
    pub(super) clock: SimClock,
    pub(super) lease: LeaseServer<SimClock>,
    pub(super) sessions: Sessions,
    /// Down (crashed, not yet restarted).
    pub(super) down: bool,
    /// The lease record on disk: what the last write left there.
    persisted: GrantorRecord,
    /// When the next session checkpoint is due, on the grantor's clock.
    checkpoint_at_ns: u64,
    /// What the crashed grantor had replicated: the sessions and their last checkpoint.
    saved: (SessionsImage, SessionsCheckpoint),
    config: GrantConfig,
    controls: GrantSimControls,
}

impl Grantor {
    pub(super) fn new(
        rng: &mut ChaCha8Rng,
        config: GrantConfig,
        controls: GrantSimControls,
    ) -> Self {
        let clock = random_clock(rng, config.drift_ppm);
        Grantor {
            lease: LeaseServer::restore(clock.clone(), config, GrantorRecord::default()),
            checkpoint_at_ns: clock.now_ns().saturating_add(CHECKPOINT_NS),
            clock,
            sessions: Sessions::new(config),
            down: false,
            persisted: GrantorRecord::default(),
            saved: Default::default(),
            config,
            controls,
        }
    }

    /// Serve a request from client `client_id` now, on the grantor's clock.
    pub(super) fn handle(&mut self, client_id: u64, req: Req) -> Resp {
        let now_ns = self.clock.now_ns();
        let c = self.controls;
        match req {
            Req::Acquire { term_ms } => {
                let grant = self.lease.acquire(client_id, term_ms, now_ns);
                self.answer_grant(grant)
            }
            Req::Renew { token, term_ms } => {
                let lease = &mut self.lease;
                let grant = if c.renewal_adds_to_the_old_expiry {
                    lease.control_renew_adding_to_the_old_expiry(client_id, token, term_ms, now_ns)
                } else {
                    lease.renew(client_id, token, term_ms, now_ns)
                };
                self.answer_grant(grant)
            }
            Req::Release { token } => {
                if c.release_naming_only_the_client {
                    self.lease.control_release_naming_only_the_client(client_id);
                } else {
                    self.lease.release(client_id, token);
                }
                Resp::Done // not persisted: a release need not be
            }
            req => self.handle_session(req, now_ns),
        }
    }

    /// A grant or renewal's answer; a changed record is written before it leaves.
    fn answer_grant(&mut self, grant: Result<Grant, AcquireError>) -> Resp {
        if grant.is_ok() && self.lease.record() != self.persisted {
            self.persisted = self.lease.record();
        }
        Resp::Grant(grant.map_err(TransportError::Refused))
    }

    fn handle_session(&mut self, req: Req, now_ns: u64) -> Resp {
        let c = self.controls;
        let s = &mut self.sessions;
        match req {
            Req::Session { ttl_ms } => Resp::Session(s.grant(ttl_ms, now_ns)),
            Req::KeepAlive { sid, ttl_ms } => {
                let refreshed = if c.keepalive_keeping_the_checkpoint {
                    s.control_keepalive_keeping_the_checkpoint(&[sid], now_ns)
                } else {
                    s.keepalive(&[sid], now_ns)
                };
                Resp::Grant(match refreshed.refreshed {
                    1 => Ok(Grant {
                        token: sid.0,
                        term_ms: ttl_ms,
                    }),
                    // Unknown: a refusal, so the client's renewal core loses it at once.
                    _ => Err(TransportError::Refused(AcquireError::NotHolder {
                        client: sid.0,
                        token: sid.0,
                    })),
                })
            }
            Req::Lock { sid } if c.lock_granting_the_holder_again => {
                Resp::Lock(s.control_lock_granting_the_holder_again(LOCK, sid, now_ns))
            }
            Req::Lock { sid } => Resp::Lock(s.lock(LOCK, sid, now_ns)),
            Req::Unlock { sid, token } => {
                if c.unlock_naming_only_the_session {
                    s.control_unlock_naming_only_the_session(LOCK, sid);
                } else {
                    s.unlock(LOCK, sid, token);
                }
                Resp::Done
            }
            Req::Acquire { .. } | Req::Renew { .. } | Req::Release { .. } => {
                unreachable!("lease requests are handled above")
            }
        }
    }

    /// Housekeeping, every step: end sessions whose TTL ran out, checkpoint when due, and now
    /// and then write the lease record at a random moment (any moment's record is safe).
    pub(super) fn tick(&mut self, rng: &mut ChaCha8Rng) {
        let now_ns = self.clock.now_ns();
        self.sessions.expire(now_ns);
        if now_ns >= self.checkpoint_at_ns {
            self.sessions.checkpoint(now_ns);
            self.checkpoint_at_ns = now_ns.saturating_add(CHECKPOINT_NS);
        }
        if rng.gen_ratio(1, 2_000) {
            self.persisted = self.lease.record();
        }
    }

    /// Crash: keep only what was persisted (the lease's record, as last written) and replicated
    /// (the sessions and their last checkpoint). Returns whether the record on disk is stale
    /// (differs from the grantor's record at the crash: a release, or a renewal, not written).
    pub(super) fn crash(&mut self) -> bool {
        self.down = true;
        self.saved = (self.sessions.image(), self.sessions.last_checkpoint());
        self.persisted != self.lease.record()
    }

    /// Come back on a new clock: the lease by boot holdback or restore (chosen at random), the
    /// sessions from their image and checkpoint, and a takeover.
    pub(super) fn restart(&mut self, rng: &mut ChaCha8Rng) -> String {
        let record = self.persisted;
        let (image, checkpoint) = std::mem::take(&mut self.saved);
        self.clock = random_clock(rng, self.config.drift_ppm);
        let (clock, config) = (self.clock.clone(), self.config);
        let how = format!("{record:?}, clock {} ns", clock.now_ns());
        self.lease = if self.controls.restart_forgets_holder {
            LeaseServer::control_restart_forgetting_holder(clock, config, record.last_token)
        } else if rng.gen_bool(0.5) {
            LeaseServer::boot(clock, config, record.last_token)
        } else {
            LeaseServer::restore(clock, config, record)
        };
        let how = match self.lease.holdback_remaining_ns(self.clock.now_ns()) {
            0 => format!("restore from {how}"),
            _ => format!("boot with a holdback, from {how}"),
        };
        self.sessions = Sessions::from_image(config, image);
        self.sessions.restore_checkpoint(&checkpoint);
        let now_ns = self.clock.now_ns();
        let c = self.controls;
        if c.takeover_keeps_old_expiry {
            self.sessions.control_takeover_keeping_old_expiry(now_ns);
        } else if c.takeover_ignoring_checkpoints {
            self.sessions.control_takeover_ignoring_checkpoints(now_ns);
        } else {
            self.sessions.takeover(now_ns);
        }
        self.checkpoint_at_ns = now_ns.saturating_add(CHECKPOINT_NS);
        self.down = false;
        how
    }
}
