//! Role and term tracking, and what is published for read handles.

use super::*;

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// Notice role and term changes, a transfer under way, the first commit of a term, and
    /// publish for read handles.
    pub(super) fn sync(&mut self) {
        self.end_abandoned_transfer();
        let (role, term) = (self.raw.raft.state, self.raw.raft.term);
        if (role, term) != self.seen {
            if self.seen.0 == StateRole::Leader {
                self.lose_lease(Loss::SteppedDown);
                let err = self.not_leader();
                self.reads.fail_all(&err);
            }
            if role == StateRole::Leader {
                self.lose_lease(Loss::NewTerm(term));
            }
            self.seen = (role, term);
            self.reseed_election_timeout();
        }
        if role == StateRole::Leader {
            if self.raw.raft.lead_transferee.is_some() {
                self.fence_for_transfer("raft started a leadership transfer");
            }
            if self.raw.raft.commit_to_current_term() {
                self.lease.on_commit_in_term(term);
                self.issue_index_round();
            }
        }
        self.publish();
    }

    /// raft-rs re-draws its election timeout from an unseeded generator at every role or term
    /// change; overwrite the draw with a seeded one before the next tick can use it.
    pub(super) fn reseed_election_timeout(&mut self) {
        let (min, max) = self.election_ticks;
        if max > min + 1 {
            let ticks = self.jitter.election_timeout_ticks(min, max);
            self.raw.raft.set_randomized_election_timeout(ticks);
        }
    }

    pub(super) fn publish(&mut self) {
        let now_ns = self.clock.now_ns();
        self.publish_at(now_ns);
    }

    /// [`Self::publish`] with the clock read at `now_ns` (no later than the lease was computed
    /// at, so a lease held then is held at it).
    pub(super) fn publish_at(&mut self, now_ns: u64) {
        let held = self.lease_held_at(now_ns);
        let until_ns = match self.lease.usable_until_ns() {
            Some(until_ns) if held => until_ns,
            _ => 0,
        };
        assert!(
            until_ns <= now_ns.saturating_add(self.derived.lease_ns),
            "lease published to {until_ns} ns, past now {now_ns} ns + L"
        );
        assert!(
            until_ns == 0 || until_ns > now_ns,
            "an expired lease published as held"
        );
        let log = &self.raw.raft.raft_log;
        let (commit, applied) = (log.committed, log.applied);
        match self.follower_publication(now_ns) {
            Some((barrier, applied, read_until_ns)) => {
                self.shared.publish(barrier, applied, read_until_ns)
            }
            None => self.shared.publish(commit, applied, until_ns),
        }
        if self.lease_was_held && !held {
            Counters::bump(&self.shared.counters.expirations);
            debug!(self.logger, "lease no longer held"; "now_ns" => now_ns);
        }
        self.lease_was_held = held;
    }
}
