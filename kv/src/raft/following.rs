//! The groups this node leads follow group 0's configuration (the rule and why it never moves a
//! group back are in `peer::follow`): on a tick, the leader of each group whose configuration is
//! not group 0's proposes the change that makes it so. Idle, this costs one look at group 0's
//! version per tick. The raft loop calls it with its `MultiNode` and each group's followed
//! version (`follows`).

use std::collections::BTreeSet;

use raft::Storage;
use raft_lease::multi::{GroupId, MultiNode};
use raft_lease::Clock;
use slog::{debug, Logger};

use crate::peer::follow::{follow_change, Followed};

/// Follow changes proposed per tick at most: a new configuration reaches thousands of groups
/// over a few ticks rather than in one huge round.
const MAX_PER_TICK: usize = 100;

/// What the loop keeps about following group 0.
#[derive(Debug, Default)]
pub struct Following {
    /// The version of group 0's configuration last seen; a newer one makes every group led here
    /// a candidate.
    seen: u64,
    /// Groups led here whose configuration may not be group 0's yet.
    candidates: BTreeSet<GroupId>,
    /// Groups hosted here whose configuration (as this replica applied it) was not group 0's at
    /// the last count; counted every tick while above 0.
    behind: u64,
}

impl Following {
    /// Group `gid` is now led here: it may have to follow.
    pub fn led(&mut self, gid: GroupId) {
        if gid != 0 {
            self.candidates.insert(gid);
        }
    }

    /// On a tick, with group 0's configuration `target`: move the groups led here towards it
    /// (the groups it proposed in or handed over go into `touched`), and count those behind it.
    /// The count, when it was taken.
    pub fn tick<S: Storage, C: Clock + Clone>(
        &mut self,
        multi: &mut MultiNode<S, C>,
        target: &Followed,
        follows: &dyn Fn(GroupId) -> u64,
        touched: &mut BTreeSet<GroupId>,
        logger: &Logger,
    ) -> Option<u64> {
        let me = multi.id();
        if !target.joint && !target.voters.contains(&me) && !target.learners.contains(&me) {
            *self = Following::default(); // removed: nothing here follows any more
            return Some(0);
        }
        let moved = target.version != self.seen;
        if moved {
            self.seen = target.version;
            let led = multi.group_ids().into_iter();
            let led = led.filter(|&g| g != 0 && multi.group(g).is_some_and(|n| n.is_leader()));
            self.candidates = led.collect();
        }
        let mut proposed = 0;
        for gid in std::mem::take(&mut self.candidates) {
            let keep = proposed >= MAX_PER_TICK
                || follow(
                    multi,
                    gid,
                    target,
                    follows(gid),
                    touched,
                    logger,
                    &mut proposed,
                );
            if keep {
                self.candidates.insert(gid);
            }
        }
        (moved || self.behind > 0).then(|| self.count_behind(multi, target, follows))
    }

    /// Count the groups hosted here that have not followed `target`'s version, as applied here.
    pub fn count_behind<S: Storage, C: Clock + Clone>(
        &mut self,
        multi: &MultiNode<S, C>,
        target: &Followed,
        follows: &dyn Fn(GroupId) -> u64,
    ) -> u64 {
        // By version only: a follow change raft refused leaves the group's configuration as it
        // was with the version recorded, and must not hold every later change back.
        let behind = |g: GroupId| multi.group(g).is_some() && follows(g) < target.version;
        let ids = multi.group_ids().into_iter();
        self.behind = ids.filter(|&g| g != 0 && behind(g)).count() as u64;
        self.behind
    }
}

/// Propose group `gid`'s follow change (it last followed version `follows`) if it needs one and
/// may take one now; whether to look at it again.
fn follow<S: Storage, C: Clock + Clone>(
    multi: &mut MultiNode<S, C>,
    gid: GroupId,
    target: &Followed,
    follows: u64,
    touched: &mut BTreeSet<GroupId>,
    logger: &Logger,
    proposed: &mut usize,
) -> bool {
    let Some(node) = multi.group(gid).filter(|n| n.is_leader()) else {
        return false; // its next leader looks at it
    };
    let raft = &node.raw().raft;
    let cs = raft.prs().conf().to_conf_state();
    if raft.has_pending_conf() || !cs.voters_outgoing.is_empty() {
        return true; // wait until the change in flight has applied, then look again
    }
    let me = multi.id();
    if !target.voters.contains(&me) {
        // Demoted: raft-rs keeps a leader that is no voter leading. Hand the group to the voter
        // of both configurations with the most of its log (raft catches it up), and let that one
        // follow.
        let both = cs.voters.iter();
        let both = both.filter(|&&v| v != me && target.voters.contains(&v));
        let matched = |v: &&u64| raft.prs().get(**v).map_or(0, |p| p.matched);
        if let Some(&to) = both.max_by_key(matched) {
            multi.transfer_leader(gid, to);
            touched.insert(gid);
            *proposed += 1; // a hand-off counts as a proposal against the bound per tick
        }
        return true;
    }
    let Some(cc) = follow_change(target, &cs, follows) else {
        return false; // followed already (a change raft refused is recorded as followed too)
    };
    *proposed += 1;
    if let Err(e) = multi.propose_conf_change(gid, cc) {
        debug!(logger, "follow change not proposed"; "group" => gid, "error" => %e);
    }
    touched.insert(gid);
    true
}
