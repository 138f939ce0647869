//! The checker, run at every step of real time.
//!
//! - **Exclusion.** No client believes it holds the lease (or lock `L`) while another client
//!   believes it too, or while the grantor has given it to another client (or session).
//! - **Bound.** On the grantor's own clock, no session expires later than a full TTL from now and
//!   the lease no later than a full longest term from now. A promise measured on another clock
//!   (a takeover that kept the old grantor's expiry) breaks it: a dead client's lock held for weeks.

use std::fmt;

use super::client::Client;
use super::grantor::{Grantor, LOCK};
use crate::clock::Clock;
use crate::grant::GrantConfig;
use ViolationKind::{LeaseBound, LeaseExclusion, LockExclusion, SessionBound};

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
    /// The grantor held the lease for longer than a full longest term from now, on its own clock.
    LeaseBound,
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
            self.check_bounds(at_ns, grantor, config);
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
        if let Some((c, expiry_ns)) = grantor.lease.holder(now_ns) {
            if expiry_ns > now_ns.saturating_add(config.boot_holdback_ns()) {
                self.fail(LeaseBound, at_ns, || {
                    format!("client {c}'s lease runs past the longest term")
                });
            }
        }
    }
}
