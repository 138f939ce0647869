//! Leaders spread over the nodes. Elections alone leave them uneven (at 10,000 groups on three
//! nodes, one node led over 5,000), and what a node spends idle grows with the groups it leads.
//! So, about once a second, a node that leads clearly more than its share of the groups (over
//! `⌈groups / voters⌉` by more than 2% of the groups, and at least one) hands some of them to the
//! node that leads the fewest (if below its share), by raft's leadership transfer, which fences the lease as any
//! transfer does. Each node only ever gives its own leaderships away, counted from what its
//! replicas know of every group's leader; it gives only to a voter of the group that is alive
//! (shared liveness: it supports this node now), so a transfer does not stall a group on a node
//! that is down, and never a group whose transfer is still under way.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use raft::Storage;
use raft_lease::multi::{GroupId, LivenessMode, MultiNode};
use raft_lease::Clock;

/// Time between two looks at the spread.
const EVERY: Duration = Duration::from_secs(1);

/// Leaderships a node gives away per look at most.
const MAX_PER_LOOK: usize = 200;

/// What the loop keeps about spreading leaders.
#[derive(Debug)]
pub struct Balance {
    /// Whether leaders are spread at all (`--balance-leaders`).
    enabled: bool,
    /// When the spread was last looked at.
    looked_at: Instant,
}

impl Balance {
    /// Spread leaders if `enabled`.
    pub fn new(enabled: bool) -> Balance {
        Balance {
            enabled,
            looked_at: Instant::now(),
        }
    }
}

/// The groups each node leads, as this node's replicas know it: group 0's voters only.
fn count_led<'a>(
    voters: &[u64],
    leaders: impl Iterator<Item = (GroupId, Option<u64>)> + 'a,
    me: u64,
) -> (BTreeMap<u64, usize>, Vec<GroupId>) {
    let mut led: BTreeMap<u64, usize> = voters.iter().map(|&v| (v, 0)).collect();
    let mut mine = Vec::new();
    for (gid, leader) in leaders {
        if let Some(n) = leader.and_then(|l| led.get_mut(&l)) {
            *n += 1;
        }
        if leader == Some(me) && gid != 0 {
            mine.push(gid); // group 0 keeps its leader: sessions and membership live there
        }
    }
    (led, mine)
}

/// A node's share of `groups` among `voters` nodes.
fn share(voters: usize, groups: usize) -> usize {
    groups.div_ceil(voters.max(1))
}

/// How many of its `mine` leaderships a node gives away, one of `voters` nodes with `groups`.
fn excess(voters: usize, mine: usize, groups: usize) -> usize {
    let share = share(voters, groups);
    let slack = (groups / 50).max(1);
    match mine > share + slack {
        true => (mine - share).min(MAX_PER_LOOK),
        false => 0,
    }
}

impl Balance {
    /// On a tick of a node hosting `groups` groups: give away leaderships above its share, once
    /// a second (the groups handed over go into `touched`).
    pub fn tick<S: Storage, C: Clock + Clone>(
        &mut self,
        multi: &mut MultiNode<S, C>,
        groups: usize,
        touched: &mut BTreeSet<GroupId>,
    ) {
        if !self.enabled || groups < 2 || self.looked_at.elapsed() < EVERY {
            return;
        }
        self.looked_at = Instant::now();
        let Some(first) = multi.group(0) else {
            return;
        };
        let voters = first.raw().raft.prs().conf().to_conf_state().voters;
        if excess(voters.len(), multi.groups_led(), groups) == 0 {
            return; // within its share: no need to look at every group's leader (10,000 of them)
        }
        let me = multi.id();
        let ids = multi.group_ids().into_iter();
        let leaders = ids.map(|g| (g, multi.group(g).and_then(|n| n.leader_id())));
        let (mut led, mut mine) = count_led(&voters, leaders, me);
        // Its count includes group 0, which it keeps: the excess comes from the others.
        let give = excess(voters.len(), led.get(&me).copied().unwrap_or(0), groups);
        let share = share(voters.len(), groups);
        for gid in mine.drain(..).rev().take(give) {
            // Only to a node below its share: two nodes over it (a third is down) never trade.
            let Some((&to, _)) = led
                .iter()
                .filter(|&(&id, &n)| id != me && n < share && may_take(multi, gid, id))
                .min_by_key(|&(_, &n)| n)
            else {
                continue;
            };
            multi.transfer_leader(gid, to);
            touched.insert(gid);
            *led.get_mut(&to).expect("a voter") += 1;
        }
    }
}

/// Whether `to` may take group `gid` from this replica (its leader): no transfer is under way,
/// and `to` is a voter of the group, alive (shared liveness: it supports this node now;
/// per-group: raft saw it active, which a quiescent group of shared liveness does not keep up to
/// date). Raft catches it up before it hands over.
fn may_take<S: Storage, C: Clock + Clone>(multi: &MultiNode<S, C>, gid: GroupId, to: u64) -> bool {
    let Some(node) = multi.group(gid) else {
        return false;
    };
    let raft = &node.raw().raft;
    let voter = raft.prs().conf().voters().contains(to);
    let alive = |p: &raft::Progress| match multi.liveness() {
        LivenessMode::Shared => multi.supported_by(to),
        LivenessMode::PerGroup => p.recent_active,
    };
    let progress = raft.prs().get(to);
    raft.lead_transferee.is_none() && voter && progress.is_some_and(alive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_over_its_share_gives_the_excess_and_one_near_it_gives_nothing() {
        let leaders = |of: &[u64]| {
            let v: Vec<(GroupId, Option<u64>)> = (0..).zip(of.iter().map(|&l| Some(l))).collect();
            v.into_iter()
        };
        let (led, mine) = count_led(&[1, 2, 3], leaders(&[1, 1, 1, 1, 1, 1, 2, 3, 9]), 1);
        assert_eq!(
            led,
            [(1, 6), (2, 1), (3, 1)].into(),
            "a non-voter's groups not counted"
        );
        assert_eq!(mine, vec![1, 2, 3, 4, 5], "group 0 stays");
        assert_eq!(
            excess(led.len(), mine.len(), 9),
            2,
            "share 3, slack 1: 5 gives 2"
        );
        assert_eq!(excess(3, 4, 9), 0, "within share + slack");
        assert_eq!(excess(3, 5_111, 10_000), MAX_PER_LOOK);
        assert_eq!(excess(3, 3_334 + 200, 10_000), 0, "share 3,334, slack 200");
        assert_eq!(excess(3, 3_334 + 201, 10_000), 201.min(MAX_PER_LOOK));
        assert_eq!(excess(3, 6, 9), 3, "down to its share");
    }
}
