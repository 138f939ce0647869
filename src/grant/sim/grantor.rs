//! The simulated grantor: one lease ([`LeaseServer`]) and lock `L` under sessions ([`Sessions`]),
//! on a clock of its own. A restart comes back on a new clock (another process, or another
//! replica), from what was persisted or replicated.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::net::{Req, Resp};
use super::GrantSimControls;
use crate::clock::{Clock, SimClock};
use crate::grant::renewer::TransportError;
use crate::grant::server::{AcquireError, Grant, GrantorRecord, LeaseServer};
use crate::grant::session::{SessionId, Sessions, SessionsImage};
use crate::grant::GrantConfig;

/// A keep-alive, answered like a renewal: the session's id stands for its token, and an unknown
/// session is a refusal (the client's renewal core then loses it at once).
fn keepalive(
    s: &mut Sessions,
    sid: SessionId,
    ttl_ms: u64,
    now_ns: u64,
) -> Result<Grant, TransportError> {
    match s.keepalive(&[sid], now_ns).refreshed {
        1 => Ok(Grant {
            token: sid.0,
            term_ms: ttl_ms,
        }),
        _ => Err(TransportError::Refused(AcquireError::NotHolder {
            client: sid.0,
            token: sid.0,
        })),
    }
}

/// The one lock the clients contend for.
pub(super) const LOCK: &str = "L";

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
    /// What the crashed grantor had persisted (lease) and replicated (sessions).
    saved: (GrantorRecord, SessionsImage),
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
            clock,
            sessions: Sessions::new(config),
            down: false,
            saved: Default::default(),
            config,
            controls,
        }
    }

    /// Serve a request from client `client_id` now, on the grantor's clock.
    pub(super) fn handle(&mut self, client_id: u64, req: Req) -> Resp {
        let now_ns = self.clock.now_ns();
        let c = self.controls;
        let s = &mut self.sessions;
        match req {
            Req::Acquire { term_ms } => Resp::Grant(
                self.lease
                    .acquire(client_id, term_ms, now_ns)
                    .map_err(TransportError::Refused),
            ),
            Req::Renew { token, term_ms } => Resp::Grant(
                self.lease
                    .renew(client_id, token, term_ms, now_ns)
                    .map_err(TransportError::Refused),
            ),
            Req::Release { token } => {
                if c.release_naming_only_the_client {
                    self.lease.control_release_naming_only_the_client(client_id);
                } else {
                    self.lease.release(client_id, token);
                }
                Resp::Done
            }
            Req::Session { ttl_ms } => Resp::Session(s.grant(ttl_ms, now_ns)),
            Req::KeepAlive { sid, ttl_ms } => Resp::Grant(keepalive(s, sid, ttl_ms, now_ns)),
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
        }
    }

    /// End sessions whose TTL ran out (the grantor's housekeeping, every step).
    pub(super) fn expire(&mut self) {
        let now_ns = self.clock.now_ns();
        self.sessions.expire(now_ns);
    }

    /// Crash: keep only what was persisted (the lease's record) and replicated (the sessions).
    pub(super) fn crash(&mut self) {
        self.down = true;
        self.saved = (self.lease.record(), self.sessions.image());
    }

    /// Come back on a new clock: the lease by boot holdback or restore (chosen at random), the
    /// sessions from their image and a takeover.
    pub(super) fn restart(&mut self, rng: &mut ChaCha8Rng) -> String {
        let (record, image) = std::mem::take(&mut self.saved);
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
        let now_ns = self.clock.now_ns();
        if self.controls.takeover_keeps_old_expiry {
            self.sessions.control_takeover_keeping_old_expiry(now_ns);
        } else {
            self.sessions.takeover(now_ns);
        }
        self.down = false;
        how
    }
}
