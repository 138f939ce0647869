//! The groups this node leads follow group 0's configuration (the rule and why it never moves a
//! group back are in `peer::follow`): on a tick, the leader of each group whose configuration is
//! not group 0's proposes the change that makes it so. Idle, this costs one look at group 0's
//! version per tick.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use raft_lease::multi::GroupId;
use slog::debug;

use super::RaftLoop;
use crate::peer::follow::{follow_change, Followed};
use crate::raft::machine::StateMachine;

/// Follow changes proposed per tick at most: a new configuration reaches thousands of groups
/// over a few ticks rather than in one huge round.
const MAX_PER_TICK: usize = 100;

/// What the loop keeps about following group 0.
#[derive(Debug, Default)]
pub(super) struct Following {
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
    pub(super) fn led(&mut self, gid: GroupId) {
        if gid != 0 {
            self.candidates.insert(gid);
        }
    }
}

impl<M: StateMachine> RaftLoop<M> {
    /// Move the groups led here towards group 0's configuration, and count those behind it.
    pub(super) fn follow_group_0(&mut self) {
        let Some(target) = self.groups[0].shared.members.read().conf.clone() else {
            return;
        };
        let me = self.multi.id();
        if !target.joint && !target.voters.contains(&me) && !target.learners.contains(&me) {
            self.following = Following::default(); // removed: nothing here follows any more
            self.shared.behind.store(0, Ordering::Relaxed);
            return;
        }
        let moved = target.version != self.following.seen;
        if moved {
            self.following.seen = target.version;
            let led = self.multi.group_ids().into_iter();
            let led = led.filter(|&g| g != 0 && self.node(g).is_leader());
            self.following.candidates = led.collect();
        }
        let mut proposed = 0;
        for gid in std::mem::take(&mut self.following.candidates) {
            let keep = proposed >= MAX_PER_TICK || self.follow(gid, &target, &mut proposed);
            if keep {
                self.following.candidates.insert(gid);
            }
        }
        if moved || self.following.behind > 0 {
            self.count_behind(&target);
        }
    }

    /// Groups hosted here that do not follow group 0's configuration yet, counted now (a
    /// membership change waits until there are none, so that changes reach every group one at
    /// a time).
    pub(super) fn groups_behind(&mut self) -> u64 {
        let target = self.groups[0].shared.members.read().conf.clone();
        target.map_or(0, |target| self.count_behind(&target))
    }

    /// Propose group `gid`'s follow change if it needs one and may take one now; whether to look
    /// at it again.
    fn follow(&mut self, gid: GroupId, target: &Followed, proposed: &mut usize) -> bool {
        let node = self.node(gid);
        if !node.is_leader() {
            return false; // its next leader looks at it
        }
        let raft = &node.raw().raft;
        let cs = raft.prs().conf().to_conf_state();
        let follows = self.groups[gid as usize].io.follows();
        if raft.has_pending_conf() || !cs.voters_outgoing.is_empty() {
            return true; // wait until the change in flight has applied, then look again
        }
        let me = self.multi.id();
        if !target.voters.contains(&me) {
            // Demoted: raft-rs keeps a leader that is no voter leading. Hand the group to the
            // voter of both configurations with the most of its log (raft catches it up), and let
            // that one follow.
            let both = cs
                .voters
                .iter()
                .filter(|&&v| v != me && target.voters.contains(&v));
            let matched = |v: &&u64| raft.prs().get(**v).map_or(0, |p| p.matched);
            if let Some(&to) = both.max_by_key(matched) {
                self.multi.transfer_leader(gid, to);
                self.touched.insert(gid);
            }
            return true;
        }
        let Some(cc) = follow_change(target, &cs, follows) else {
            return false; // followed already (or raft refused the change: nothing to redo)
        };
        *proposed += 1;
        if let Err(e) = self.multi.propose_conf_change(gid, cc) {
            debug!(self.logger, "follow change not proposed"; "group" => gid, "error" => %e);
        }
        self.touched.insert(gid);
        true
    }

    /// Count (and publish) the groups hosted here that do not have `target`'s configuration, or
    /// have not recorded its version, as applied here.
    fn count_behind(&mut self, target: &Followed) -> u64 {
        let behind = |g: GroupId| {
            let cs = self.node(g).raw().raft.prs().conf().to_conf_state();
            !target.matches(&cs) || self.groups[g as usize].io.follows() < target.version
        };
        let ids = self.multi.group_ids().into_iter();
        let n = ids.filter(|&g| g != 0 && behind(g)).count() as u64;
        self.following.behind = n;
        self.shared.behind.store(n, Ordering::Relaxed);
        n
    }
}
