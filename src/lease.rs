//! The leader's lease: a pure state machine. Time comes in as arguments; no I/O, no clock.
//!
//! The leader captures `t0` before sending a round. When a quorum (itself included) has acknowledged
//! messages sent at or after `t0`, the lease runs to `t0 + L`. It never moves backwards, it belongs to
//! one term, and it is usable only once the leader has committed an entry in that term.

use crate::config::Derived;

/// How a lease stands at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Held, with more than the renew point left.
    Valid,
    /// Held, but renewal is due: at most the renew point is left. Reads are still served.
    Suspect,
    /// Not held: expired, never established, lost, or not usable yet in this term.
    Expired,
}

impl LeaseState {
    /// Whether lease reads may be served in this state.
    pub fn is_held(self) -> bool {
        matches!(self, LeaseState::Valid | LeaseState::Suspect)
    }

    /// Lower-case name: `valid`, `suspect` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Valid => "valid",
            LeaseState::Suspect => "suspect",
            LeaseState::Expired => "expired",
        }
    }
}

/// What a quorum acknowledgement did to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// The expiry moved later.
    Extended,
    /// The acknowledged round was no newer than one already counted.
    NotNewer,
    /// The round is of another term, or the lease is fenced, or the node is not leading.
    Ignored,
}

/// The lease of one leader, for one term at a time.
#[derive(Debug, Clone)]
pub struct LeaderLease {
    /// `L`, in nanoseconds. Positive.
    lease_ns: u64,
    /// Renewal is due once at most this much is left. Below `lease_ns`.
    renew_before_ns: u64,
    /// The term being led, or `None` when not leading. Acks of any other term are ignored.
    term: Option<u64>,
    /// The lease runs until this local instant, exclusive. Only ever moves later within a term.
    expiry_ns: Option<u64>,
    /// The leader has committed an entry of its own term; before that its commit index may be stale.
    committed_in_term: bool,
    /// `MsgTimeoutNow` may have left in this term: no lease again until the next term.
    fenced: bool,
    /// The highest term ever led; a new term must be above it.
    max_term_led: u64,
}

impl LeaderLease {
    /// A lease that is not held, with durations from a validated config.
    pub fn new(derived: &Derived) -> Self {
        assert!(derived.lease_ns > 0, "lease must be positive: {derived:?}");
        assert!(
            derived.renew_before_ns < derived.lease_ns,
            "renew point inside lease: {derived:?}"
        );
        LeaderLease {
            lease_ns: derived.lease_ns,
            renew_before_ns: derived.renew_before_ns,
            term: None,
            expiry_ns: None,
            committed_in_term: false,
            fenced: false,
            max_term_led: 0,
        }
    }

    /// This node became leader of `term`. Any earlier lease is gone.
    pub fn start_term(&mut self, term: u64) {
        assert!(
            term > self.max_term_led,
            "leader of term {term} after leading {}",
            self.max_term_led
        );
        *self = LeaderLease {
            term: Some(term),
            max_term_led: term,
            ..LeaderLease::not_held(self)
        };
    }

    /// Term change or step-down: the lease is lost at once.
    pub fn lose(&mut self) {
        *self = LeaderLease::not_held(self);
        debug_assert!(self.term.is_none() && self.expiry_ns.is_none());
    }

    fn not_held(&self) -> LeaderLease {
        LeaderLease {
            term: None,
            expiry_ns: None,
            committed_in_term: false,
            fenced: false,
            ..*self
        }
    }

    /// The leader has committed an entry of `term`.
    pub fn on_commit_in_term(&mut self, term: u64) {
        if self.term == Some(term) {
            self.committed_in_term = true;
        }
    }

    /// Before a leadership transfer: revoke the lease for the rest of this term.
    pub fn fence_for_transfer(&mut self) {
        self.fenced = true;
        self.expiry_ns = None;
    }

    /// raft gave up a transfer before `MsgTimeoutNow` left: no forced election can come of it,
    /// so the lease may be earned again in this term, by rounds sent from now on.
    pub fn lift_transfer_fence(&mut self) {
        assert!(self.fenced, "lifting a fence that is not there");
        debug_assert!(self.expiry_ns.is_none(), "a fenced lease has no expiry");
        self.fenced = false;
    }

    /// A membership change was applied: drop the lease until a quorum of the new configuration acks.
    pub fn reset_for_config_change(&mut self) {
        self.expiry_ns = None;
    }

    /// A quorum acknowledged a round of `term` sent at local instant `sent_at_ns`, and their
    /// promises back `lease_ns` past it (at most `L`: see [`Derived::lease_for_promise_ns`]).
    pub fn on_quorum_ack(&mut self, term: u64, sent_at_ns: u64, lease_ns: u64) -> AckOutcome {
        assert!(
            lease_ns <= self.lease_ns,
            "a quorum credited with {lease_ns} ns, past this leader's own L of {} ns",
            self.lease_ns
        );
        if self.term != Some(term) || self.fenced || lease_ns == 0 {
            return AckOutcome::Ignored;
        }
        let candidate_ns = sent_at_ns.saturating_add(lease_ns);
        match self.expiry_ns {
            Some(expiry_ns) if expiry_ns >= candidate_ns => AckOutcome::NotNewer,
            _ => {
                self.expiry_ns = Some(candidate_ns);
                AckOutcome::Extended
            }
        }
    }

    /// The instant the usable lease ends (exclusive), or `None` when it is not usable at all.
    pub fn usable_until_ns(&self) -> Option<u64> {
        if self.committed_in_term && !self.fenced {
            self.expiry_ns
        } else {
            None
        }
    }

    /// The lease's state at local instant `now_ns`. `t0 + L` itself is already expired.
    pub fn state(&self, now_ns: u64) -> LeaseState {
        match self.usable_until_ns() {
            Some(until_ns) if now_ns < until_ns => {
                if until_ns - now_ns > self.renew_before_ns {
                    LeaseState::Valid
                } else {
                    LeaseState::Suspect
                }
            }
            _ => LeaseState::Expired,
        }
    }

    /// Time left at `now_ns`, 0 when not held.
    pub fn remaining_ns(&self, now_ns: u64) -> u64 {
        self.usable_until_ns()
            .map_or(0, |until_ns| until_ns.saturating_sub(now_ns))
    }

    /// The term led, if any.
    pub fn term(&self) -> Option<u64> {
        self.term
    }

    /// Whether `MsgTimeoutNow` may have left in the current term.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: u64 = 1_000;

    fn lease() -> LeaderLease {
        let mut l = LeaderLease::new(&Derived {
            promise_ns: 1_100,
            boot_promise_ns: 1_100,
            lease_ns: L,
            drift_ppm: 0,
            margin_ns: 0,
            renew_before_ns: 300,
            campaign_jitter_ns: 0,
            max_grant_ns: None,
            max_lag_ns: None,
        });
        l.start_term(5);
        l.on_commit_in_term(5);
        l
    }

    #[test]
    fn lease_ends_exactly_at_t0_plus_l() {
        let mut l = lease();
        assert_eq!(l.on_quorum_ack(5, 100, L), AckOutcome::Extended);
        assert_eq!(l.state(100 + L - 1), LeaseState::Suspect);
        assert_eq!(
            l.state(100 + L),
            LeaseState::Expired,
            "t0 + L is not in the lease"
        );
        assert_eq!(l.state(100 + L - 301), LeaseState::Valid);
        assert_eq!(l.state(100 + L - 300), LeaseState::Suspect);
        assert_eq!(l.remaining_ns(100 + L - 1), 1);
        assert_eq!(l.remaining_ns(100 + L), 0);
    }

    #[test]
    fn lease_never_regresses() {
        let mut l = lease();
        l.on_quorum_ack(5, 500, L);
        assert_eq!(
            l.on_quorum_ack(5, 100, L),
            AckOutcome::NotNewer,
            "an older round"
        );
        assert_eq!(
            l.on_quorum_ack(5, 500, L),
            AckOutcome::NotNewer,
            "the same round twice"
        );
        assert_eq!(l.usable_until_ns(), Some(500 + L));
        assert_eq!(l.on_quorum_ack(5, 501, L), AckOutcome::Extended);
        assert_eq!(l.usable_until_ns(), Some(501 + L));
    }

    #[test]
    fn acks_of_another_term_are_ignored() {
        let mut l = lease();
        assert_eq!(l.on_quorum_ack(4, 100, L), AckOutcome::Ignored);
        assert_eq!(l.state(101), LeaseState::Expired);
    }

    #[test]
    fn no_lease_before_first_commit_in_term() {
        let mut l = LeaderLease::new(&Derived {
            promise_ns: 1_100,
            boot_promise_ns: 1_100,
            lease_ns: L,
            drift_ppm: 0,
            margin_ns: 0,
            renew_before_ns: 300,
            campaign_jitter_ns: 0,
            max_grant_ns: None,
            max_lag_ns: None,
        });
        l.start_term(7);
        l.on_quorum_ack(7, 100, L);
        assert_eq!(
            l.state(200),
            LeaseState::Expired,
            "commit index may be stale"
        );
        l.on_commit_in_term(6);
        assert_eq!(
            l.state(200),
            LeaseState::Expired,
            "a commit of another term does not count"
        );
        l.on_commit_in_term(7);
        assert_eq!(l.state(200), LeaseState::Valid);
    }

    #[test]
    fn step_down_transfer_and_config_change_drop_the_lease() {
        let mut l = lease();
        l.on_quorum_ack(5, 100, L);
        l.fence_for_transfer();
        assert_eq!(l.state(101), LeaseState::Expired);
        assert_eq!(
            l.on_quorum_ack(5, 200, L),
            AckOutcome::Ignored,
            "fenced for the rest of the term"
        );

        let mut l = lease();
        l.on_quorum_ack(5, 100, L);
        l.reset_for_config_change();
        assert_eq!(l.state(101), LeaseState::Expired);
        assert_eq!(
            l.on_quorum_ack(5, 90, L),
            AckOutcome::Extended,
            "re-established by a new quorum"
        );

        l.lose();
        assert_eq!(l.state(101), LeaseState::Expired);
        assert_eq!(l.on_quorum_ack(5, 200, L), AckOutcome::Ignored);
        l.start_term(6);
        assert!(!l.is_fenced());
    }

    #[test]
    fn a_lifted_fence_takes_acks_again_in_the_same_term() {
        let mut l = lease();
        l.on_quorum_ack(5, 100, L);
        l.fence_for_transfer();
        l.lift_transfer_fence();
        assert!(!l.is_fenced());
        assert_eq!(
            l.state(101),
            LeaseState::Expired,
            "lifting restores nothing"
        );
        assert_eq!(l.on_quorum_ack(5, 200, L), AckOutcome::Extended);
        assert_eq!(l.state(201), LeaseState::Valid);
    }

    #[test]
    #[should_panic(expected = "lifting a fence that is not there")]
    fn lifting_a_fence_that_is_not_there_is_a_programmer_error() {
        lease().lift_transfer_fence();
    }

    #[test]
    #[should_panic(expected = "after leading")]
    fn leading_an_older_term_is_a_bug() {
        let mut l = lease();
        l.start_term(4);
    }
}
