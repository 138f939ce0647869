//! A node's promise not to vote: a pure state machine. Time comes in as arguments.
//!
//! When a node accepts a message from the leader of its current term (append, heartbeat, snapshot),
//! it refuses `MsgRequestVote` and `MsgRequestPreVote` from every other candidate until its own clock
//! has advanced `P` from the moment of receipt. A node that boots refuses every vote for `P`.
//! The leader applies the same rule to itself from each round it sends.
//!
//! A node's own campaign is a vote for itself, so it waits for its promise to end as well. Nodes
//! that heard the same heartbeat would then all campaign at the same instant and split the vote;
//! [`CampaignJitter`] spreads them out with seeded jitter after the promise ends.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Whether a vote request may be considered by raft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteDecision {
    /// Pass the request to raft, which applies its own rules.
    Allow,
    /// Drop the request: the promise still holds.
    Refuse {
        /// How long the promise still holds, in nanoseconds. Positive.
        remaining_ns: u64,
        /// The leader the promise was made to (`None`: the promise made at boot).
        holder: Option<u64>,
    },
}

/// The promise one node has made.
#[derive(Debug, Clone)]
pub struct FollowerPromise {
    /// `P`, in nanoseconds.
    promise_ns: u64,
    /// The longest a promise made by this node or its previous run may last from now on: the
    /// boot promise (at least `P`). A promise to a leader heard during a longer boot promise
    /// ends where the boot promise does.
    longest_ns: u64,
    /// Votes for anyone but `holder` are refused before this local instant (exclusive).
    /// Only ever moves later.
    until_ns: u64,
    /// The leader promised to; its own vote requests are allowed.
    holder: Option<u64>,
}

impl FollowerPromise {
    /// The promise of a node that booted at local instant `boot_ns`: refuse every vote for
    /// `boot_promise_ns`, which covers every promise its previous run may have made (at least
    /// `P`; longer after a restart with a shorter `P`).
    pub fn at_boot(promise_ns: u64, boot_promise_ns: u64, boot_ns: u64) -> Self {
        assert!(promise_ns > 0, "the promise must be positive");
        assert!(
            boot_promise_ns >= promise_ns,
            "a boot promise of {boot_promise_ns} ns is shorter than P = {promise_ns} ns"
        );
        FollowerPromise {
            promise_ns,
            longest_ns: boot_promise_ns,
            until_ns: boot_ns.saturating_add(boot_promise_ns),
            holder: None,
        }
    }

    /// A promise that binds nothing, for nodes configured to skip the boot promise.
    pub fn none(promise_ns: u64) -> Self {
        FollowerPromise {
            promise_ns,
            longest_ns: promise_ns,
            until_ns: 0,
            holder: None,
        }
    }

    /// Accepted a message from `leader_id`, leader of the current term, read at `receipt_ns`.
    ///
    /// `receipt_ns` must be read at or after processing the message, never before.
    pub fn on_leader_message(&mut self, leader_id: u64, receipt_ns: u64) {
        assert_ne!(leader_id, 0, "raft uses 0 for no leader");
        self.until_ns = self
            .until_ns
            .max(receipt_ns.saturating_add(self.promise_ns));
        self.holder = Some(leader_id);
    }

    /// May a vote request from `candidate` at local instant `now_ns` go to raft?
    pub fn check_vote(&self, candidate: u64, now_ns: u64) -> VoteDecision {
        if now_ns >= self.until_ns || self.holder == Some(candidate) {
            return VoteDecision::Allow;
        }
        let remaining_ns = self.until_ns - now_ns;
        debug_assert!(remaining_ns > 0 && remaining_ns <= self.longest_ns || self.holder.is_none());
        VoteDecision::Refuse {
            remaining_ns,
            holder: self.holder,
        }
    }

    /// The instant the promise ends (exclusive).
    pub fn until_ns(&self) -> u64 {
        self.until_ns
    }

    /// Whether, at `now_ns`, the promise stops this node from voting for any candidate but
    /// `leader`: it is in force and made to `leader` (or made at boot, to nobody).
    pub fn backs(&self, leader: u64, now_ns: u64) -> bool {
        now_ns < self.until_ns && self.holder.is_none_or(|h| h == leader)
    }

    /// The leader promised to, if any (`None` also for the boot promise).
    pub fn holder(&self) -> Option<u64> {
        self.holder
    }
}

/// Seeded jitter for elections: for a campaign that a promise held back (once the promise ends,
/// it waits a further uniform `[0, max_ns]`, drawn once per promise end), and for raft's
/// randomized election timeout.
#[derive(Debug, Clone)]
pub struct CampaignJitter {
    rng: ChaCha8Rng,
    /// The largest jitter, in nanoseconds.
    max_ns: u64,
    /// The promise end the current draw belongs to (0: none drawn yet).
    drawn_for_ns: u64,
    /// The current draw, at most `max_ns`.
    jitter_ns: u64,
}

impl CampaignJitter {
    /// Jitter of at most `max_ns`, from a seeded generator.
    pub fn new(seed: u64, max_ns: u64) -> Self {
        CampaignJitter {
            rng: ChaCha8Rng::seed_from_u64(seed),
            max_ns,
            drawn_for_ns: 0,
            jitter_ns: 0,
        }
    }

    /// A seeded election timeout in `[min_ticks, max_ticks)`, for raft's randomized one (raft-rs
    /// draws it from an unseeded generator; the node overwrites every draw with this one).
    pub fn election_timeout_ticks(&mut self, min_ticks: usize, max_ticks: usize) -> usize {
        assert!(
            min_ticks < max_ticks,
            "empty election timeout range [{min_ticks}, {max_ticks})"
        );
        self.rng.gen_range(min_ticks..max_ticks)
    }

    /// The instant a campaign held back by a promise that ends at `promise_until_ns` may start.
    /// A node that never promised anything (`0`) need not wait.
    pub fn campaign_at_ns(&mut self, promise_until_ns: u64) -> u64 {
        if promise_until_ns == 0 {
            return 0;
        }
        if promise_until_ns != self.drawn_for_ns {
            self.drawn_for_ns = promise_until_ns;
            self.jitter_ns = self.rng.gen_range(0..=self.max_ns);
        }
        debug_assert!(self.jitter_ns <= self.max_ns);
        promise_until_ns.saturating_add(self.jitter_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 1_000;

    #[test]
    fn refuses_others_until_exactly_p_after_receipt() {
        let mut p = FollowerPromise::none(P);
        assert_eq!(
            p.check_vote(3, 0),
            VoteDecision::Allow,
            "no promise made yet"
        );
        p.on_leader_message(1, 500);
        assert_eq!(
            p.check_vote(3, 500 + P - 1),
            VoteDecision::Refuse {
                remaining_ns: 1,
                holder: Some(1)
            }
        );
        assert_eq!(
            p.check_vote(3, 500 + P),
            VoteDecision::Allow,
            "P has passed"
        );
        assert_eq!(
            p.check_vote(1, 600),
            VoteDecision::Allow,
            "the holder itself may campaign"
        );
    }

    #[test]
    fn refuses_for_p_after_boot() {
        let p = FollowerPromise::at_boot(P, P, 10_000);
        assert!(matches!(
            p.check_vote(2, 10_000),
            VoteDecision::Refuse {
                remaining_ns: P,
                holder: None
            }
        ));
        assert!(matches!(
            p.check_vote(1, 10_000 + P - 1),
            VoteDecision::Refuse { .. }
        ));
        assert_eq!(p.check_vote(1, 10_000 + P), VoteDecision::Allow);
    }

    #[test]
    fn a_boot_promise_covers_the_longer_promise_of_the_previous_run() {
        let p = FollowerPromise::at_boot(P, 3 * P, 0);
        assert!(matches!(
            p.check_vote(2, 3 * P - 1),
            VoteDecision::Refuse { .. }
        ));
        assert_eq!(p.check_vote(2, 3 * P), VoteDecision::Allow);
    }

    /// A leader heard during a boot promise longer than `P` (a restart with a shorter `P`)
    /// becomes the holder; votes for others stay refused until the boot promise ends.
    #[test]
    fn a_leader_heard_during_a_longer_boot_promise_holds_it_to_its_end() {
        let mut p = FollowerPromise::at_boot(P, 3 * P, 0);
        p.on_leader_message(1, 10);
        assert_eq!(
            p.check_vote(2, P + 10),
            VoteDecision::Refuse {
                remaining_ns: 2 * P - 10,
                holder: Some(1)
            }
        );
        assert_eq!(p.check_vote(1, P + 10), VoteDecision::Allow, "the holder");
        assert_eq!(p.check_vote(2, 3 * P), VoteDecision::Allow);
    }

    #[test]
    fn a_promise_backs_its_holder_until_it_ends() {
        let mut p = FollowerPromise::at_boot(P, P, 0);
        assert!(
            p.backs(1, P - 1) && p.backs(2, P - 1),
            "the boot promise backs anyone"
        );
        assert!(!p.backs(1, P), "ended");
        p.on_leader_message(1, 10);
        assert!(p.backs(1, 10 + P - 1));
        assert!(!p.backs(2, 10 + P - 1), "promised to 1, not 2");
        assert!(!p.backs(1, 10 + P));
    }

    #[test]
    fn jitter_is_drawn_once_per_promise_end_and_stays_in_range() {
        let mut j = CampaignJitter::new(7, 50);
        assert_eq!(j.campaign_at_ns(0), 0, "no promise, no wait");
        let first = j.campaign_at_ns(1_000);
        assert!((1_000..=1_050).contains(&first), "{first}");
        assert_eq!(
            j.campaign_at_ns(1_000),
            first,
            "the same promise end keeps its draw"
        );
        let draws: Vec<u64> = (1..200)
            .map(|i| j.campaign_at_ns(i * 10_000) - i * 10_000)
            .collect();
        assert!(draws.iter().all(|&d| d <= 50));
        assert!(draws.iter().any(|&d| d != draws[0]), "the jitter varies");
        let mut same_seed = CampaignJitter::new(7, 50);
        assert_eq!(
            same_seed.campaign_at_ns(1_000),
            first,
            "seeded: reproducible"
        );
        assert_eq!(
            CampaignJitter::new(1, 0).campaign_at_ns(5),
            5,
            "zero range: no jitter"
        );
    }

    #[test]
    fn an_older_receipt_never_shortens_the_promise() {
        let mut p = FollowerPromise::none(P);
        p.on_leader_message(1, 900);
        p.on_leader_message(1, 100);
        assert_eq!(p.until_ns(), 900 + P);
        p.on_leader_message(2, 950);
        assert_eq!(p.until_ns(), 950 + P);
        assert!(
            matches!(p.check_vote(1, 1_500), VoteDecision::Refuse { .. }),
            "the holder moved to 2"
        );
    }
}
