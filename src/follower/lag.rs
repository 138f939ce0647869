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
    /// Since when each voter has had a matched index below the commit index (absent: it has
    /// not, at the last observation).
    behind_since_ns: BTreeMap<u64, u64>,
}

impl LagPolicy {
    /// No grant to a voter behind the commit index for longer than `max_lag_ns`.
    pub fn new(max_lag_ns: u64) -> Self {
        LagPolicy {
            max_lag_ns,
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

    /// Whether `voter`, whose acknowledgement arrives at `now_ns`, had been behind for longer
    /// than the bound before it (ask before observing what the acknowledgement matched).
    pub fn lagging(&self, voter: u64, now_ns: u64) -> bool {
        self.behind_since_ns
            .get(&voter)
            .is_some_and(|&since_ns| now_ns.saturating_sub(since_ns) > self.max_lag_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voter_behind_for_longer_than_the_bound_is_lagging_until_it_catches_up() {
        let mut p = LagPolicy::new(2_000);
        p.observe(2, 10, 10, 0);
        assert!(!p.lagging(2, 10_000), "caught up");
        p.observe(2, 10, 11, 1_000);
        assert!(!p.lagging(2, 3_000), "behind for exactly the bound");
        assert!(p.lagging(2, 3_001));
        p.observe(2, 10, 12, 2_000);
        assert!(p.lagging(2, 3_001), "behind since the first observation");
        p.observe(2, 12, 12, 3_500);
        assert!(!p.lagging(2, 9_000), "caught up again");
        assert!(!p.lagging(3, 9_000), "never observed");
    }
}
