//! The lagging-node policy: the leader stops granting read leases to a voter that lacks entries
//! committed long ago. A holder's acknowledgement gates every write's exposure, so one slow
//! holder slows every write; once its last grant has run out, writes go at the pace of the
//! quorum again, and it reads through the leader until it keeps up. Pure: time comes in as
//! arguments.
//!
//! A voter is judged by how long ago the first entry it lacks was committed, not by whether it
//! is ever caught up: under pipelined writes a follower one batch behind the fastest is never
//! seen at the commit index, yet it lacks only entries committed a moment ago.

use std::collections::BTreeMap;

/// The commit index's history and each voter's matched index, as the leader sees them.
#[derive(Debug, Clone)]
pub struct LagPolicy {
    /// A voter that lacks an entry committed longer ago than this is not granted.
    max_lag_ns: u64,
    /// A voter found lagging is left out for this long after its last lagging acknowledgement
    /// (`G`): an acknowledgement that happens to find it caught up between two writes (a
    /// heartbeat's) does not bring it back while writes keep leaving it behind.
    hold_ns: u64,
    /// Until when each voter found lagging is left out (absent: it is not).
    excluded_until_ns: BTreeMap<u64, u64>,
    /// The highest matched index observed of each current voter in `term` (raft's matched
    /// index only grows within a term; a later leader may have truncated what an earlier one
    /// saw matched).
    matched: BTreeMap<u64, u64>,
    /// The term the matched indexes were observed in.
    term: u64,
    /// Each commit index observed, with the instant it was first observed; entries older than
    /// twice the bound are dropped (never the newest).
    committed_at_ns: BTreeMap<u64, u64>,
    /// The largest commit index dropped from `committed_at_ns`: a voter below it lacks an entry
    /// committed more than twice the bound ago.
    dropped_through: u64,
}

impl LagPolicy {
    /// No grant to a voter that lacks an entry committed more than `max_lag_ns` ago, nor for
    /// `hold_ns` after that was last found.
    pub fn new(max_lag_ns: u64, hold_ns: u64) -> Self {
        LagPolicy {
            max_lag_ns,
            hold_ns,
            excluded_until_ns: BTreeMap::new(),
            matched: BTreeMap::new(),
            term: 0,
            committed_at_ns: BTreeMap::new(),
            dropped_through: 0,
        }
    }

    /// As the leader of `term`, whose voters are `voters`: matched indexes of an earlier term,
    /// and of nodes no longer voters, are forgotten.
    pub fn enter(&mut self, term: u64, voters: &[u64]) {
        if term != self.term {
            self.matched.clear();
            self.excluded_until_ns.clear();
            self.term = term;
        }
        self.matched.retain(|v, _| voters.contains(v));
        self.excluded_until_ns.retain(|v, _| voters.contains(v));
        debug_assert!(self.matched.keys().all(|v| voters.contains(v)));
    }

    /// The term the matched indexes are of.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// At `now_ns`, `voter` has matched up to `matched` and the commit index is `commit`.
    pub fn observe(&mut self, voter: u64, matched: u64, commit: u64, now_ns: u64) {
        let newest = self.committed_at_ns.last_key_value().map_or(0, |(&c, _)| c);
        if commit > newest.max(self.dropped_through) {
            self.committed_at_ns.insert(commit, now_ns);
        }
        let m = self.matched.entry(voter).or_insert(matched);
        *m = (*m).max(matched);
        self.forget_before(now_ns.saturating_sub(self.max_lag_ns.saturating_mul(2)));
    }

    /// Drop the commit instants before `cutoff_ns`, all but the newest.
    fn forget_before(&mut self, cutoff_ns: u64) {
        while self.committed_at_ns.len() > 1 {
            let (&index, &at_ns) = self.committed_at_ns.first_key_value().expect("two or more");
            if at_ns >= cutoff_ns {
                break;
            }
            self.committed_at_ns.pop_first();
            self.dropped_through = index;
        }
        debug_assert!(!self.committed_at_ns.is_empty() || self.dropped_through == 0);
    }

    /// How long before `now_ns` the first entry `voter` lacks was committed (0: it lacks none
    /// the leader has seen committed, or was never observed).
    pub fn lag_ns(&self, voter: u64, now_ns: u64) -> u64 {
        let Some(&m) = self.matched.get(&voter) else {
            return 0;
        };
        if m < self.dropped_through {
            return u64::MAX; // it lacks an entry whose instant was dropped as too old
        }
        let first_lacking = self.committed_at_ns.range(m + 1..).next();
        first_lacking.map_or(0, |(_, &at_ns)| now_ns.saturating_sub(at_ns))
    }

    /// Whether `voter`, whose acknowledgement arrives at `now_ns` (observed first), is left
    /// out: it lacks an entry committed longer ago than the bound, or was found so within the
    /// hold.
    pub fn lagging(&mut self, voter: u64, now_ns: u64) -> bool {
        let behind_long = self.lag_ns(voter, now_ns) > self.max_lag_ns;
        if behind_long {
            let until_ns = now_ns.saturating_add(self.hold_ns);
            self.excluded_until_ns.insert(voter, until_ns);
        }
        let held = self
            .excluded_until_ns
            .get(&voter)
            .is_some_and(|&t| now_ns < t);
        debug_assert!(held || !behind_long);
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voter_lacking_an_entry_committed_longer_ago_than_the_bound_is_left_out_for_the_hold() {
        let mut p = LagPolicy::new(2_000, 10_000);
        p.observe(2, 10, 10, 0);
        assert!(!p.lagging(2, 10_000), "caught up");
        p.observe(2, 10, 11, 11_000); // 11 committed at 11,000
        p.observe(2, 10, 12, 12_000);
        assert!(
            !p.lagging(2, 13_000),
            "it lacks 11, committed exactly the bound ago"
        );
        assert!(p.lagging(2, 13_001), "committed longer ago");
        p.observe(2, 12, 12, 13_001);
        assert!(p.lagging(2, 23_000), "caught up, but within the hold");
        assert!(!p.lagging(2, 23_001), "the hold is over");
        assert!(!p.lagging(3, 9_000), "never observed");
    }

    /// Under pipelined writes: a batch commits every 500 µs, and one follower acknowledges
    /// each batch 300 µs after the other, so it is never at the commit index; another is 5 ms
    /// behind. The first keeps its grant, the second loses it.
    #[test]
    fn a_follower_one_batch_behind_keeps_its_grant_and_a_slow_one_loses_it() {
        let mut p = LagPolicy::new(3_000_000, 100_000_000);
        let (mut one_batch, mut slow) = (false, false);
        for batch in 1..=100u64 {
            let at_ns = batch * 500_000;
            p.observe(2, batch, batch, at_ns); // the fast follower commits the batch
            p.observe(3, batch - 1, batch, at_ns + 300_000);
            one_batch |= p.lagging(3, at_ns + 300_000);
            let behind = batch.saturating_sub(10); // 5 ms of batches
            p.observe(4, behind, batch, at_ns + 300_000);
            slow |= p.lagging(4, at_ns + 300_000);
        }
        assert!(!one_batch, "a follower one batch behind was left out");
        assert!(slow, "a follower 5 ms behind kept its grant");
        assert!(p.lag_ns(3, 50_300_000) < 1_000_000);
    }

    /// A later leader may have truncated what this one saw matched in an earlier term, and a
    /// voter removed and added back may come with a wiped log: neither keeps an old matched.
    #[test]
    fn matched_indexes_of_an_earlier_term_or_a_removed_voter_are_forgotten() {
        let mut p = LagPolicy::new(1_000, 1_000);
        p.enter(1, &[2, 3]);
        p.observe(2, 20, 20, 0);
        p.observe(3, 20, 20, 0);
        p.enter(1, &[2]);
        assert!(!p.matched.contains_key(&3), "removed");
        p.enter(2, &[2, 3]);
        assert!(p.matched.is_empty(), "a new term");
        p.observe(2, 10, 25, 10_000); // truncated back to 10 in term 2
        assert!(
            p.lag_ns(2, 20_000) > 1_000,
            "it lacks 11..=25, committed at 10,000 or before"
        );
    }

    #[test]
    fn old_commit_instants_are_dropped_and_a_voter_below_them_is_lagging() {
        let mut p = LagPolicy::new(1_000, 1_000);
        p.observe(3, 1, 1, 0);
        for i in 2..=100u64 {
            p.observe(2, i, i, i * 1_000);
        }
        assert!(p.committed_at_ns.len() <= 3, "{:?}", p.committed_at_ns);
        assert_eq!(
            p.lag_ns(3, 100_000),
            u64::MAX,
            "it lacks entries long dropped"
        );
        assert!(p.lagging(3, 100_000));
        assert_eq!(p.lag_ns(2, 100_000), 0);
    }
}
