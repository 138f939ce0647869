//! The checker, run at every step of real time. Each check has a negative control that breaks it
//! (see [`GrantSimControls`](super::GrantSimControls) and `tests/grant.rs`).
//!
//! - **Exclusion** (lease, lock). No client believes it holds the lease (or lock `L`) while
//!   another client believes it too, or while the grantor has given it to another client (or
//!   session).
//! - **Session view.** No client believes in a session the grantor no longer has live: a takeover
//!   never ends a session before its client's view.
//! - **Bound** (session, lease). On the grantor's own clock, no session expires later than a full
//!   TTL from now and the lease no later than a full term (the holding's longest) from now. A
//!   promise measured on another clock (a takeover that kept the old grantor's expiry), or a
//!   renewal added to the old expiry, breaks it.
//! - **Session liveness.** In real time, no session outlives its last keep-alive by more than
//!   its TTL (at the slowest clock rate) plus, per takeover since, one checkpoint interval, the
//!   longest outage and the drift over the time it had left. Takeovers that ignore the
//!   checkpoints break it: a dead client's lock held as long as the grantor keeps failing over.

use std::collections::BTreeMap;
use std::fmt;

use super::client::Client;
use super::grantor::{Grantor, CHECKPOINT_NS, LOCK};
use super::MAX_OUTAGE_NS;
use crate::clock::Clock;
use crate::grant::session::SessionId;
use crate::grant::GrantConfig;
use ViolationKind::{
    LeaseBound, LeaseExclusion, LockExclusion, SessionBound, SessionLiveness, SessionView,
};

/// Which check broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// A client believed it held the lease while another client did too, or while the grantor
    /// had given it to another.
    LeaseExclusion,
    /// A client believed its session held lock `L` while another did too, or while the grantor
    /// had given it to another session.
    LockExclusion,
    /// The grantor promised a session for longer than a full TTL from now, on its own clock.
    SessionBound,
    /// The grantor held the lease for longer than a full term from now, on its own clock.
    LeaseBound,
    /// A client believed in a session that the grantor no longer had live.
    SessionView,
    /// A session outlived its last keep-alive by more than its TTL and the takeovers' slack.
    SessionLiveness,
}

/// A broken check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which check.
    pub kind: ViolationKind,
    /// Real simulated time, in ns from the start.
    pub at_ns: u64,
    /// What was seen.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at_ms = self.at_ns as f64 / 1e6;
        write!(f, "{:?} at {at_ms:.3} ms: {}", self.kind, self.what)
    }
}

#[derive(Debug, Default)]
pub(super) struct Checker {
    /// Checks evaluated.
    pub(super) checks: u64,
    /// Checks that failed.
    pub(super) violations: u64,
    /// The first failure of each kind, in the order they happened.
    pub(super) firsts: Vec<Violation>,
    /// Per session: the real time of its last grant or keep-alive, and the takeovers before it.
    refreshed: BTreeMap<SessionId, (u64, u64)>,
    /// Takeovers (grantor restarts) so far.
    takeovers: u64,
}

impl Checker {
    pub(super) fn check(
        &mut self,
        at_ns: u64,
        clients: &[Client],
        grantor: &Grantor,
        config: &GrantConfig,
    ) {
        self.check_lease(at_ns, clients, grantor);
        self.check_lock(at_ns, clients, grantor);
        if !grantor.down {
            self.check_sessions(at_ns, clients, grantor);
            self.check_bounds(at_ns, grantor, config);
            self.check_liveness(at_ns, grantor, config);
        }
    }

    /// The grantor granted or refreshed session `sid` at real time `at_ns`.
    pub(super) fn refreshed(&mut self, sid: SessionId, at_ns: u64) {
        self.refreshed.insert(sid, (at_ns, self.takeovers));
    }

    /// A new grantor took over.
    pub(super) fn took_over(&mut self) {
        self.takeovers += 1;
    }

    fn check_sessions(&mut self, at_ns: u64, clients: &[Client], grantor: &Grantor) {
        let now_ns = grantor.clock.now_ns();
        for c in clients {
            let Some(sid) = c.believed_session() else {
                continue;
            };
            self.checks += 1;
            if !grantor.sessions.is_live(sid, now_ns) {
                self.fail(SessionView, at_ns, || {
                    format!(
                        "client {} believes in session {} the grantor has ended",
                        c.id(),
                        sid.0
                    )
                });
            }
        }
    }

    fn check_liveness(&mut self, at_ns: u64, grantor: &Grantor, config: &GrantConfig) {
        let rho = config.drift_ppm as u128;
        let slow = |ns: u64| (ns as u128 * 1_000_000).div_ceil(1_000_000 - rho);
        let live: Vec<(SessionId, u64)> = grantor
            .sessions
            .expiries()
            .map(|(sid, ttl_ms, _)| (sid, ttl_ms))
            .collect();
        self.refreshed
            .retain(|sid, _| live.iter().any(|(s, _)| s == sid));
        for (sid, ttl_ms) in live {
            let Some(&(refreshed_ns, takeovers)) = self.refreshed.get(&sid) else {
                continue;
            };
            self.checks += 1;
            let hold_ns = config.grantor_hold_ns(ttl_ms);
            let drift_ns = (2 * rho * hold_ns as u128).div_ceil(1_000_000 - rho);
            let per_takeover = slow(CHECKPOINT_NS) + MAX_OUTAGE_NS as u128 + drift_ns + 2_000_000;
            let n = (self.takeovers - takeovers) as u128;
            let bound_ns = slow(hold_ns) + n * per_takeover + 2_000_000;
            let age_ns = (at_ns - refreshed_ns) as u128;
            if age_ns > bound_ns {
                self.fail(SessionLiveness, at_ns, || {
                    format!(
                        "session {} ({ttl_ms} ms TTL) outlived its last keep-alive by {:.1} ms, \
                         {n} takeovers since: bound {:.1} ms",
                        sid.0,
                        age_ns as f64 / 1e6,
                        bound_ns as f64 / 1e6
                    )
                });
            }
        }
    }

    fn fail(&mut self, kind: ViolationKind, at_ns: u64, what: impl FnOnce() -> String) {
        self.violations += 1;
        if self.firsts.iter().all(|v| v.kind != kind) {
            let what = what();
            self.firsts.push(Violation { kind, at_ns, what });
        }
    }

    fn check_lease(&mut self, at_ns: u64, clients: &[Client], grantor: &Grantor) {
        self.checks += 1;
        let believers: Vec<u64> = clients
            .iter()
            .filter(|c| c.believes_lease())
            .map(|c| c.id())
            .collect();
        let holder = (!grantor.down)
            .then(|| grantor.lease.holder(grantor.clock.now_ns()))
            .flatten()
            .map(|(h, _)| h);
        match (believers.as_slice(), holder) {
            ([_, _, ..], _) => self.fail(LeaseExclusion, at_ns, || {
                format!("clients {believers:?} all believe they hold the lease")
            }),
            ([b], Some(h)) if *b != h => self.fail(LeaseExclusion, at_ns, || {
                format!("client {b} believes it holds the lease the grantor gave to client {h}")
            }),
            _ => {}
        }
    }

    fn check_lock(&mut self, at_ns: u64, clients: &[Client], grantor: &Grantor) {
        self.checks += 1;
        let believers: Vec<(u64, u64)> = clients
            .iter()
            .filter_map(|c| c.believed_lock().map(|sid| (c.id(), sid.0)))
            .collect();
        let holder = (!grantor.down)
            .then(|| grantor.sessions.lock_holder(LOCK))
            .flatten()
            .map(|(sid, _)| sid.0);
        match (believers.as_slice(), holder) {
            ([_, _, ..], _) => self.fail(LockExclusion, at_ns, || {
                format!("(client, session) {believers:?} all believe they hold lock {LOCK}")
            }),
            ([(c, sid)], Some(h)) if *sid != h => self.fail(LockExclusion, at_ns, || {
                format!("client {c} believes session {sid} holds lock {LOCK}; the grantor gave it to session {h}")
            }),
            _ => {}
        }
    }

    fn check_bounds(&mut self, at_ns: u64, grantor: &Grantor, config: &GrantConfig) {
        let now_ns = grantor.clock.now_ns();
        for (sid, ttl_ms, expiry_ns) in grantor.sessions.expiries() {
            self.checks += 1;
            let bound_ns = now_ns.saturating_add(config.grantor_hold_ns(ttl_ms));
            if expiry_ns > bound_ns {
                self.fail(SessionBound, at_ns, || {
                    format!(
                        "session {} ({ttl_ms} ms TTL) expires {:.1} h past a full TTL on the grantor's clock",
                        sid.0,
                        (expiry_ns - bound_ns) as f64 / 3.6e12
                    )
                });
            }
        }
        self.checks += 1;
        // The longest term granted in this holding (the record's), held from now at most.
        let term_ms = grantor.lease.record().holder.map(|(_, term_ms)| term_ms);
        if let (Some((c, expiry_ns)), Some(term_ms)) = (grantor.lease.holder(now_ns), term_ms) {
            if expiry_ns > now_ns.saturating_add(config.grantor_hold_ns(term_ms)) {
                self.fail(LeaseBound, at_ns, || {
                    format!("client {c}'s lease ({term_ms} ms term) runs past a full term from now")
                });
            }
        }
    }
}
