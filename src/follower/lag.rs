//! The lagging-node policy: the leader stops granting read leases to a voter whose
//! acknowledgements come long after the entries they acknowledge were committed. A holder's
//! acknowledgement gates every write's exposure, so one slow holder slows every write; once its
//! last grant has run out, writes go at the pace of the quorum again, and it reads through the
//! leader until it keeps up. Pure: time comes in as arguments.

use std::collections::BTreeMap;

/// How long each voter has been behind the commit index, as the leader sees it.
#[derive(Debug, Clone)]
pub struct LagPolicy {
    /// A voter behind the commit index for longer than this is not granted.
    max_lag_ns: u64,
    /// A voter found lagging is left out for this long after its last lagging acknowledgement
    /// (`G`): an acknowledgement that happens to find it caught up between two writes (a
    /// heartbeat's) does not bring it back while writes keep leaving it behind.
    hold_ns: u64,
    /// Until when each voter found lagging is left out (absent: it is not).
    excluded_until_ns: BTreeMap<u64, u64>,
    /// Since when each voter has had a matched index below the commit index (absent: it has
    /// not, at the last observation).
    behind_since_ns: BTreeMap<u64, u64>,
}

impl LagPolicy {
    /// No grant to a voter behind the commit index for longer than `max_lag_ns`, nor for
    /// `hold_ns` after that was last found.
    pub fn new(max_lag_ns: u64, hold_ns: u64) -> Self {
        LagPolicy {
            max_lag_ns,
            hold_ns,
            excluded_until_ns: BTreeMap::new(),
            behind_since_ns: BTreeMap::new(),
        }
    }

    /// At `now_ns`, `voter` has matched up to `matched` and the commit index is `commit`.
    pub fn observe(&mut self, voter: u64, matched: u64, commit: u64, now_ns: u64) {
        match matched >= commit {
            true => drop(self.behind_since_ns.remove(&voter)),
            false => drop(*self.behind_since_ns.entry(voter).or_insert(now_ns)),
        }
        debug_assert_eq!(self.behind_since_ns.contains_key(&voter), matched < commit);
    }

    /// Whether `voter`, whose acknowledgement arrives at `now_ns`, is left out: it had been
    /// behind for longer than the bound before it (ask before observing what the
    /// acknowledgement matched), or was found so within the hold.
    pub fn lagging(&mut self, voter: u64, now_ns: u64) -> bool {
        let behind_long = (self.behind_since_ns.get(&voter))
            .is_some_and(|&since_ns| now_ns.saturating_sub(since_ns) > self.max_lag_ns);
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
    fn a_voter_behind_for_longer_than_the_bound_is_left_out_for_the_hold() {
        let mut p = LagPolicy::new(2_000, 10_000);
        p.observe(2, 10, 10, 0);
        assert!(!p.lagging(2, 10_000), "caught up");
        p.observe(2, 10, 11, 11_000);
        assert!(!p.lagging(2, 13_000), "behind for exactly the bound");
        p.observe(2, 10, 12, 12_000);
        assert!(p.lagging(2, 13_001), "behind since the first observation");
        p.observe(2, 12, 12, 13_001);
        assert!(p.lagging(2, 23_000), "caught up, but within the hold");
        assert!(!p.lagging(2, 23_001), "the hold is over");
        assert!(!p.lagging(3, 9_000), "never observed");
    }
}
